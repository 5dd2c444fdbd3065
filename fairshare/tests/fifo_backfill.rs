//! FIFO with EASY backfill (`Scheduler::into_fifo_backfill`), the baseline the
//! simulator's suite measures allot against: fixed cases and its defining property,
//! that backfill never delays the head of the queue.

mod common;

use allot_fairshare::decision::{Action, StartWhy};
use allot_fairshare::scheduler::LeaseEnd;
use allot_fairshare::{LeaseId, Scheduler, WorkloadId, WorkloadSpec};
use common::{gang, job, nodes, sched, tree};
use proptest::prelude::*;
use std::collections::BTreeMap;

fn limited(mut spec: WorkloadSpec, limit: u64) -> WorkloadSpec {
    spec.time_limit = Some(limit);
    spec.min_runtime = spec.min_runtime.min(limit);
    spec
}

fn fifo(n_nodes: u32, gpus: u32) -> Scheduler {
    sched(
        tree(&[("p", None, 1.0), ("q", None, 1.0)]),
        nodes("c", n_nodes, gpus),
    )
    .into_fifo_backfill()
}

/// Starts of a pass: workload → why.
fn started(s: &mut Scheduler, now: u64) -> BTreeMap<WorkloadId, (LeaseId, StartWhy)> {
    s.schedule(now)
        .actions
        .into_iter()
        .filter_map(|a| match a {
            Action::Start {
                workload,
                lease,
                why,
                ..
            } => Some((workload, (lease, why))),
            _ => None,
        })
        .collect()
}

#[test]
fn short_work_backfills_before_the_head_and_long_work_keeps_off_its_nodes() {
    // Two nodes of 8. A 6-GPU job runs on each for 100 s; the head is a gang of both
    // nodes whole, so it starts at 100 s. A 2-GPU job of 50 s fits before then; a
    // 2-GPU job of 500 s would hold a node the gang needs, so it waits.
    let mut s = fifo(2, 8);
    let a = s.submit(0, limited(job("p", 6, 60), 100)).expect("a");
    let b = s.submit(0, limited(job("p", 6, 60), 100)).expect("b");
    let first = started(&mut s, 0);
    assert!(first.contains_key(&a) && first.contains_key(&b));
    let head = s
        .submit(1, limited(gang("q", 2, 8, 60), 1_000))
        .expect("head");
    let long = s.submit(2, limited(job("p", 2, 60), 500)).expect("long");
    let short = s.submit(3, limited(job("q", 2, 60), 50)).expect("short");
    let pass = started(&mut s, 3);
    assert!(!pass.contains_key(&head), "the gang does not fit yet");
    assert!(
        !pass.contains_key(&long),
        "500 s would outlast the gang's start at 100 s"
    );
    match pass.get(&short) {
        Some((
            _,
            StartWhy::Backfill {
                reservation_of,
                starts,
            },
        )) => {
            assert_eq!((*reservation_of, *starts), (head, 100));
        }
        other => panic!("the 50 s job backfills before the gang: {other:?}"),
    }
    // At 100 s the 6-GPU jobs end (the short one ended at 53 s): the gang starts
    // before the long job submitted after it.
    let (short_lease, _) = pass[&short];
    s.lease_ended(53, short_lease, LeaseEnd::Completed)
        .expect("short ends");
    for (w, (l, _)) in &first {
        assert!([a, b].contains(w));
        s.lease_ended(100, *l, LeaseEnd::Completed).expect("ends");
    }
    let at_100 = started(&mut s, 100);
    assert!(at_100.contains_key(&head), "{at_100:?}");
    assert!(!at_100.contains_key(&long), "the gang holds both nodes");
}

#[test]
fn the_queue_is_served_in_submit_order_across_projects() {
    let mut s = fifo(1, 8);
    let blocker = s.submit(0, limited(job("p", 8, 60), 100)).expect("blocker");
    assert!(started(&mut s, 0).contains_key(&blocker));
    let first = s.submit(1, limited(job("q", 8, 60), 100)).expect("first");
    let second = s.submit(2, limited(job("p", 8, 60), 100)).expect("second");
    assert!(started(&mut s, 2).is_empty());
    let lease = s.leases().next().map(|l| l.id).expect("one lease");
    s.lease_ended(100, lease, LeaseEnd::Completed)
        .expect("ends");
    let next = started(&mut s, 100);
    assert!(next.contains_key(&first) && !next.contains_key(&second));
}

/// Jobs: (submit offset, nodes, GPUs per node, duration).
fn jobs() -> impl Strategy<Value = Vec<(u64, u32, u32, u64)>> {
    prop::collection::vec(
        (
            0u64..400,
            prop_oneof![3 => Just(1u32), 1 => 2u32..=3],
            1u32..=4,
            1u64..600,
        ),
        1..40,
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    /// With exact time limits, every workload starts no later than the first
    /// shadow time announced for it as the head (backfill never delays it), no
    /// workload that fits on free GPUs is left waiting after a pass while nothing
    /// ahead of it waits, and every job runs once.
    #[test]
    fn backfill_never_delays_the_head(js in jobs()) {
        let mut s = fifo(3, 4);
        let mut arrivals: Vec<(u64, u32, u32, u64)> = js.clone();
        arrivals.sort_by_key(|j| j.0);
        let mut ends: BTreeMap<(u64, LeaseId), ()> = BTreeMap::new();
        let mut promised: BTreeMap<WorkloadId, u64> = BTreeMap::new();
        let mut start_of: BTreeMap<WorkloadId, u64> = BTreeMap::new();
        let mut next = 0;
        let mut submitted: Vec<(WorkloadId, u32, u32)> = Vec::new();
        loop {
            let t_arrive = arrivals.get(next).map(|j| j.0);
            let t_end = ends.keys().next().map(|k| k.0);
            let now = match (t_arrive, t_end) {
                (None, None) => break,
                (Some(a), None) => a,
                (None, Some(e)) => e,
                (Some(a), Some(e)) => a.min(e),
            };
            while let Some(&(t, l)) = ends.keys().next() {
                if t != now { break; }
                ends.remove(&(t, l));
                s.lease_ended(now, l, LeaseEnd::Completed).expect("lease ends");
            }
            while let Some(&(t, n, g, d)) = arrivals.get(next) {
                if t != now { break; }
                let spec = limited(gang(if next % 2 == 0 { "p" } else { "q" }, n, g, 1), d);
                submitted.push((s.submit(now, spec).expect("submitted"), n, g));
                next += 1;
            }
            for (w, (l, why)) in started(&mut s, now) {
                prop_assert!(start_of.insert(w, now).is_none(), "{w:?} started twice");
                let limit = s.workload(w).and_then(|x| x.spec.time_limit).expect("limited");
                ends.insert((now + limit, l), ());
                if let StartWhy::Backfill { reservation_of, starts } = why {
                    promised.entry(reservation_of).or_insert(starts);
                }
            }
            // The oldest waiting workload does not fit on what the pass left free.
            if let Some(&(w, n, g)) = submitted.iter().find(|x| !start_of.contains_key(&x.0)) {
                let free: Vec<u32> = s.cluster().nodes().map(|(_, x)| x.free().count_ones()).collect();
                let fits = if n == 1 {
                    free.iter().any(|&f| f >= g)
                } else {
                    free.iter().filter(|&&f| f == 4).count() >= n as usize
                };
                prop_assert!(!fits, "{w:?} at the head fits on {free:?} but waits");
            }
        }
        prop_assert_eq!(start_of.len(), js.len(), "every job ran");
        for (head, at) in &promised {
            let started_at = start_of[head];
            prop_assert!(started_at <= *at, "{head:?} was promised {at} and started {started_at}");
        }
    }
}
