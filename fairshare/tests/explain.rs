//! `explain_workload` tells one pending workload what `explain` tells it among all.

mod common;
use common::*;

#[test]
fn one_workloads_explanation_is_its_line_in_the_full_list() {
    let t = tree(&[
        ("a", None, 1.0),
        ("a1", Some("a"), 1.0),
        ("a2", Some("a"), 1.0),
        ("b", None, 1.0),
    ]);
    let mut s = sched(t, nodes("c", 2, 8));
    let hour = 3_600;
    for k in 0..6u64 {
        s.submit(k, job("a1", 4, hour)).expect("fits");
        s.submit(k, job("b", 8, 0)).expect("fits");
        s.submit(k, gang("a2", 2, 8, hour)).expect("fits");
    }
    s.schedule(10);
    s.submit(20, job("a2", 1, 0)).expect("fits"); // not yet looked at by a pass
    let all = s.explain(30);
    assert!(all.len() > 10, "{} pending", all.len());
    for e in &all {
        assert_eq!(s.explain_workload(30, e.workload).as_ref(), Some(e));
    }
    // A running workload has no explanation.
    let running = s.leases().next().expect("something runs").workload;
    assert_eq!(s.explain_workload(30, running), None);
}
