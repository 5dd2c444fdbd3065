//! Golden tests: small hand-computed trees with their entitlement tables and ranking
//! order, in the spirit of Slurm's Fair Tree tests. Each case is data: a tree, a
//! state, the expected table.

mod common;

use allot_fairshare::entitlement::water_fill;
use allot_fairshare::time::{DAY, HOUR};
use allot_fairshare::{LeaseEnd, OrgTree, PolicyConfig, Scheduler};
use common::{job, nodes, starts, tree};

/// Water-fills `demand` (by name) over `t` and compares every group's allocation.
fn check_entitlement(t: &OrgTree, capacity: f64, demand: &[(&str, f64)], expect: &[(&str, f64)]) {
    let mut d = vec![0.0; t.len()];
    for (name, v) in demand {
        d[t.find(name).expect("known group").idx()] = *v;
    }
    let got = water_fill(t, capacity, &d);
    for (name, v) in expect {
        let g = if *name == "root" {
            allot_fairshare::GroupId::ROOT
        } else {
            t.find(name).expect("known group")
        };
        assert!(
            (got[g.idx()] - v).abs() < 1e-9,
            "{name}: got {}, want {v} (demand {demand:?})",
            got[g.idx()]
        );
    }
}

fn eng_sci_ops() -> OrgTree {
    tree(&[
        ("eng", None, 2.0),
        ("sci", None, 1.0),
        ("ops", None, 1.0),
        ("eng-a", Some("eng"), 1.0),
        ("eng-b", Some("eng"), 3.0),
        ("sci-x", Some("sci"), 1.0),
    ])
}

#[test]
fn shares_table() {
    let t = eng_sci_ops();
    for (name, share) in [
        ("eng", 0.5),
        ("eng-a", 0.125),
        ("eng-b", 0.375),
        ("sci", 0.25),
        ("sci-x", 0.25),
        ("ops", 0.25),
    ] {
        let g = t.group(t.find(name).expect("known"));
        assert!((g.share - share).abs() < 1e-12, "{name}: {}", g.share);
    }
}

#[test]
fn entitlement_tables() {
    let t = eng_sci_ops();
    // Everyone over-demands: shares, hierarchically.
    check_entitlement(
        &t,
        100.0,
        &[
            ("eng-a", 100.0),
            ("eng-b", 100.0),
            ("sci-x", 100.0),
            ("ops", 100.0),
        ],
        &[
            ("eng", 50.0),
            ("eng-a", 12.5),
            ("eng-b", 37.5),
            ("sci-x", 25.0),
            ("ops", 25.0),
        ],
    );
    // eng-a wants little: eng-b takes the rest of eng's half; nothing leaks out of eng
    // while eng-b still wants more.
    check_entitlement(
        &t,
        100.0,
        &[
            ("eng-a", 5.0),
            ("eng-b", 100.0),
            ("sci-x", 100.0),
            ("ops", 100.0),
        ],
        &[
            ("eng", 50.0),
            ("eng-a", 5.0),
            ("eng-b", 45.0),
            ("sci-x", 25.0),
            ("ops", 25.0),
        ],
    );
    // ops wants 10: its surplus 15 is split 2:1 between eng and sci.
    check_entitlement(
        &t,
        100.0,
        &[
            ("eng-a", 100.0),
            ("eng-b", 100.0),
            ("sci-x", 100.0),
            ("ops", 10.0),
        ],
        &[
            ("eng", 60.0),
            ("eng-a", 15.0),
            ("eng-b", 45.0),
            ("sci-x", 30.0),
            ("ops", 10.0),
        ],
    );
    // A group without demand is entitled to nothing; total demand below capacity is
    // entitled in full.
    check_entitlement(
        &t,
        100.0,
        &[("eng-a", 20.0), ("sci-x", 30.0)],
        &[
            ("eng", 20.0),
            ("eng-b", 0.0),
            ("sci-x", 30.0),
            ("ops", 0.0),
            ("root", 50.0),
        ],
    );
    // Cascading caps: capped children release capacity in rounds.
    check_entitlement(
        &t,
        100.0,
        &[
            ("eng-a", 100.0),
            ("eng-b", 1.0),
            ("sci-x", 10.0),
            ("ops", 100.0),
        ],
        &[
            ("eng-a", 59.0),
            ("eng-b", 1.0),
            ("eng", 60.0),
            ("sci-x", 10.0),
            ("ops", 30.0),
        ],
    );
}

/// Gives each project `hours` of 1-GPU usage, then submits one 1-GPU probe per
/// project and returns the projects in the order the pass started them.
fn ranking(t: OrgTree, usage: &[(&str, u64)]) -> Vec<String> {
    let cfg = PolicyConfig {
        // Rank on history alone so the order is the table's, not the pass's charges.
        allocation_horizon: 1,
        ..PolicyConfig::default()
    };
    let mut s = Scheduler::new(cfg, t, nodes("c", 8, 8)).expect("valid");
    let mut runs = Vec::new();
    for (p, hours) in usage {
        let id = s.submit(0, job(p, 1, HOUR)).expect("submits");
        runs.push((id, *hours));
    }
    let d = s.schedule(0);
    assert_eq!(starts(&d).len(), usage.len(), "all usage jobs start");
    let end = usage.iter().map(|u| u.1).max().unwrap_or(0) * HOUR;
    runs.sort_by_key(|r| r.1); // report ends in time order, as a shell would
    for (id, hours) in runs {
        let lease = s.workload(id).and_then(|w| w.lease).expect("running");
        s.lease_ended(hours * HOUR, lease, LeaseEnd::Completed)
            .expect("ends");
    }
    let probes: Vec<_> = usage
        .iter()
        .map(|(p, _)| {
            (
                s.submit(end, job(p, 1, HOUR)).expect("submits"),
                p.to_string(),
            )
        })
        .collect();
    let d = s.schedule(end);
    starts(&d)
        .into_iter()
        .map(|(w, _, _)| probes.iter().find(|p| p.0 == w).expect("a probe").1.clone())
        .collect()
}

#[test]
fn ranking_descends_the_tree() {
    // Ratios (usage / share): eng = (30+1)/0.5 = 62, sci = 4/0.25 = 16,
    // ops = 6/0.25 = 24; inside eng: eng-b = 1/0.375 = 2.7, eng-a = 30/0.125 = 240.
    // A flat sort by project ratio would put eng-b first; the tree puts sci first.
    let order = ranking(
        eng_sci_ops(),
        &[("eng-a", 30), ("eng-b", 1), ("sci-x", 4), ("ops", 6)],
    );
    assert_eq!(order, ["sci-x", "ops", "eng-b", "eng-a"]);
}

#[test]
fn ranking_ties_break_by_tree_order() {
    // Equal ratios everywhere (8 per unit share): configuration order decides, so eng
    // and then eng-a go first. Starting eng-a charges eng within the pass, which
    // lifts it just above sci and ops: they go next, and eng-b last.
    let order = ranking(
        eng_sci_ops(),
        &[("eng-a", 1), ("eng-b", 3), ("sci-x", 2), ("ops", 2)],
    );
    assert_eq!(order, ["eng-a", "sci-x", "ops", "eng-b"]);
}

#[test]
fn served_ratio_formula() {
    // ratio = (usage + allocation × H) / (share × capacity × (covered window + H)),
    // the covered window being the part of the lookback since usage began.
    let t = tree(&[("a", None, 1.0), ("b", None, 1.0)]);
    let mut s = Scheduler::new(PolicyConfig::default(), t, nodes("c", 1, 8)).expect("valid");
    let a = s.submit(0, job("a", 4, HOUR)).expect("submits");
    s.schedule(0);
    let r = s.group_ratios(HOUR);
    let ga = s.tree().find("a").expect("a").idx();
    let den = 0.5 * 8.0 * (HOUR as f64 + DAY as f64);
    let want = (4.0 * HOUR as f64 + 4.0 * DAY as f64) / den;
    assert!((r[ga] - want).abs() < 1e-12, "{} vs {want}", r[ga]);
    // Receiving exactly its share (4 of 8 GPUs at a half share) reads 1.0 from the
    // first hour, not an eighth of it.
    assert!((r[ga] - 1.0).abs() < 1e-12, "{}", r[ga]);
    let lease = s.workload(a).and_then(|w| w.lease).expect("running");
    s.lease_ended(HOUR, lease, LeaseEnd::Completed)
        .expect("ends");
    let r = s.group_ratios(HOUR);
    assert!((r[ga] - 4.0 * HOUR as f64 / den).abs() < 1e-12);
    // Once the window is covered, it is the whole lookback.
    let den = 0.5 * 8.0 * (7.0 * DAY as f64 + DAY as f64);
    let r = s.group_ratios(7 * DAY + HOUR / 2);
    assert!(
        (r[ga] - 4.0 * (HOUR / 2) as f64 / den).abs() < 1e-12,
        "{}",
        r[ga]
    );
    // Eight days later the window has forgotten it.
    assert_eq!(s.group_ratios(9 * DAY)[ga], 0.0);
}
