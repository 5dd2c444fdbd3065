//! Builders shared by the core's integration tests.
#![allow(dead_code)]

use allot_fairshare::{
    Action, Decisions, GroupSpec, LeaseId, NodeSpec, OrgTree, PolicyConfig, Scheduler, WorkloadId,
    WorkloadSpec,
};

/// `(name, parent, weight)` triples to a tree.
pub fn tree(spec: &[(&str, Option<&str>, f64)]) -> OrgTree {
    let specs: Vec<GroupSpec> = spec
        .iter()
        .map(|(n, p, w)| GroupSpec {
            name: n.to_string(),
            parent: p.map(str::to_string),
            weight: *w,
        })
        .collect();
    OrgTree::new(&specs).expect("valid tree")
}

/// `n` nodes of `gpus` GPUs in cluster `cluster`.
pub fn nodes(cluster: &str, n: u32, gpus: u32) -> Vec<NodeSpec> {
    (0..n)
        .map(|i| NodeSpec {
            name: format!("{cluster}-{i}"),
            cluster: cluster.into(),
            gpus,
            cpu: 128,
            memory_gb: 2048,
            ..Default::default()
        })
        .collect()
}

/// A scheduler with default policy.
pub fn sched(t: OrgTree, n: Vec<NodeSpec>) -> Scheduler {
    Scheduler::new(PolicyConfig::default(), t, n).expect("valid scheduler")
}

/// A single-node job.
pub fn job(project: &str, gpus: u32, min_runtime: u64) -> WorkloadSpec {
    WorkloadSpec {
        project: project.into(),
        user: "u".into(),
        class: "test".into(),
        gpus_per_node: gpus,
        nodes: 1,
        cpu_per_node: 0,
        mem_per_node_gb: 0,
        min_runtime,
        time_limit: None,
        resumable: true,
        priority: 0,
        no_requeue: false,
        ..Default::default()
    }
}

/// A gang of `nodes` × `gpus`.
pub fn gang(project: &str, nodes: u32, gpus: u32, min_runtime: u64) -> WorkloadSpec {
    WorkloadSpec {
        nodes,
        ..job(project, gpus, min_runtime)
    }
}

/// Starts in a decision list: (workload, lease, funded).
pub fn starts(d: &Decisions) -> Vec<(WorkloadId, LeaseId, bool)> {
    d.actions
        .iter()
        .filter_map(|a| match a {
            Action::Start {
                workload,
                lease,
                funded,
                ..
            } => Some((*workload, *lease, *funded)),
            _ => None,
        })
        .collect()
}

/// Revocations in a decision list: (lease, not_before).
pub fn revokes(d: &Decisions) -> Vec<(LeaseId, u64)> {
    d.actions
        .iter()
        .filter_map(|a| match a {
            Action::Revoke {
                lease, not_before, ..
            } => Some((*lease, *not_before)),
            _ => None,
        })
        .collect()
}

/// Reservations in a decision list: (gang, start).
pub fn reserves(d: &Decisions) -> Vec<(WorkloadId, u64)> {
    d.actions
        .iter()
        .filter_map(|a| match a {
            Action::Reserve {
                workload, start, ..
            } => Some((*workload, *start)),
            _ => None,
        })
        .collect()
}
