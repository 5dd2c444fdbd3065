//! Convergence (property 7): saturated demand settles at the groups' weights.

use crate::harness::{project, team, Job, Shell};
use allot_fairshare::time::{Secs, Time, DAY, MINUTE};
use allot_fairshare::{GroupId, GroupSpec, NodeSpec, OrgTree, PolicyConfig, WorkloadSpec};
use std::collections::BTreeMap;

/// SplitMix64: job lengths for the convergence runs, the same on every machine.
struct Mix(u64);

impl Mix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next() % (hi - lo + 1)
    }
}

/// Runs saturated 1-GPU demand from every project for `days` on two 8-GPU nodes and
/// returns each group's share of capacity served over the second half, beside its
/// weight share.
fn long_run_shares(
    specs: &[GroupSpec],
    min_runtime: Secs,
    days: u64,
    seed: u64,
) -> BTreeMap<String, (f64, f64)> {
    let tree = OrgTree::new(specs).expect("valid tree");
    let nodes = (0..2)
        .map(|i| NodeSpec {
            name: format!("n{i}"),
            cluster: "c".into(),
            gpus: 8,
            cpu: 64,
            memory_gb: 512,
            ..Default::default()
        })
        .collect();
    let mut sh = Shell::new(PolicyConfig::default(), tree.clone(), nodes, 30);
    sh.books = false;
    let capacity = sh.sch.cluster().total_gpus();
    let projects: Vec<GroupId> = tree.projects().to_vec();
    let mut rng = Mix(seed);
    let end = days * DAY;
    while sh.now < end {
        // Keep every project's queue well past what the cluster can run.
        for &p in &projects {
            while sh.sch.demand()[p.idx()] < 2 * capacity + 8 {
                let run = rng.range(20 * MINUTE, 40 * MINUTE);
                let spec = WorkloadSpec {
                    project: tree.group(p).name.clone(),
                    user: "u".into(),
                    class: "batch".into(),
                    gpus_per_node: 1,
                    nodes: 1,
                    cpu_per_node: 1,
                    mem_per_node_gb: 1,
                    min_runtime,
                    time_limit: None,
                    resumable: true,
                    priority: 0,
                    no_requeue: false,
                    ..Default::default()
                };
                let job = Job {
                    run,
                    time_limit: None,
                    fails: false,
                };
                sh.submit_spec(spec, job).expect("accepted");
            }
        }
        sh.advance(10 * MINUTE);
    }
    assert!(
        sh.bad.is_empty(),
        "invariants broken on the way: {:#?}",
        sh.bad
    );
    let from = end / 2;
    let mut got = vec![0.0; tree.len()];
    let still: Vec<(GroupId, Time, Time, u64)> = sh
        .live
        .values()
        .map(|l| (l.project, l.start, end, l.gpus))
        .collect();
    for (project, s, e, g) in sh.served.iter().chain(&still) {
        let overlap = (*e.min(&end)).saturating_sub(*s.max(&from));
        // Charged to the project and every group above it.
        for &a in &tree.group(*project).path {
            got[a.idx()] += (overlap * g) as f64;
        }
    }
    let window = (capacity * (end - from)) as f64;
    tree.groups()
        .skip(1)
        .map(|(g, group)| (group.name.clone(), (got[g.idx()] / window, group.share)))
        .collect()
}

fn assert_converges(specs: &[GroupSpec], min_runtime: Secs, seed: u64) {
    // Under 7 days, so that no budget (share × capacity × lookback) runs out while
    // every group gets its share; a skewed split would spend some and blur the result.
    let shares = long_run_shares(specs, min_runtime, 4, seed);
    for (name, (got, want)) in &shares {
        assert!(
            (got - want).abs() <= 0.02,
            "{name} got {got:.4} of capacity, its weight share is {want:.4}: {shares:?}"
        );
    }
}

/// Property 7: saturated unfunded demand at 3:1 settles at 3:1 of capacity.
#[test]
fn unfunded_demand_converges_to_weights_three_to_one() {
    assert_converges(&[team("a", 3.0), team("b", 1.0)], 0, 1);
}

/// Property 7: saturated funded demand (10-minute contracts) at 1:1:2 settles at
/// 1:1:2, and the 2 splits 1:3 between its two projects.
#[test]
fn funded_demand_converges_to_weights_one_one_two() {
    assert_converges(
        &[
            team("a", 1.0),
            team("b", 1.0),
            team("c", 2.0),
            project("c1", "c", 1.0),
            project("c2", "c", 3.0),
        ],
        10 * MINUTE,
        2,
    );
}
