//! The harness: the shell that plays the agents around one `Scheduler`, the
//! invariants it checks (`Prop`), and what the tests call to run a case or build a tree.
//!
//! The generated inputs are in `generate`, the driver in `shell`, how each action of
//! a pass is carried out and checked in `actions`, and the whole-state checks after
//! every pass in `checks`.

use allot_fairshare::time::{Secs, Time};
use allot_fairshare::workload::NodeGpus;
use allot_fairshare::{
    Decisions, GroupId, GroupSpec, Lease, LeaseEnd, LeaseId, RevokeWhy, Scheduler, WorkloadId,
    WorkloadState,
};
use proptest::prelude::*;
use std::collections::{BTreeMap, BTreeSet};

mod actions;
mod checks;
mod generate;
mod shell;

pub(crate) use generate::{any_case, config, untied_single_node_case, Op, Policy, Setup, Sub};

/// Which invariant a violation breaks; each property test looks at one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Prop {
    /// No GPU held twice; starts only on ready nodes, healthy GPUs, within host room.
    Exclusive,
    /// Protected leases are only taken back the ways the contract allows.
    Protection,
    /// Restarted preempted work gets its cooldown.
    Cooldown,
    /// Gangs start whole, on one cluster.
    Gang,
    /// Funded preemptions form no cycle between two pieces of news and keep the
    /// hysteresis.
    Cycle,
    /// No workload takes GPUs back from the one that took them, within the cooldown.
    Bounce,
    /// Claims set aside usable GPUs for one pending workload each.
    Claims,
    /// A lease is revoked again only to make it sooner, or to cancel it.
    Revokes,
    /// Every workload is accounted for, in the state its history implies.
    Books,
    /// Allowance leases: small, short, funded, within each user's GPUs, and only
    /// while the project's budget is spent.
    Allowance,
    /// Backfill of work that cannot resume ends before its reservation starts.
    Backfill,
    /// One requester's preemption loses at most `max_loss_per_gpu` per GPU it asks.
    Loss,
}

#[derive(Debug, Clone, Copy)]
enum Ev {
    End(LeaseId, LeaseEnd),
    /// A host stops its part of an ended lease (a gang's other part, a lost node's
    /// lease that came back) and says so.
    PartLeft(LeaseId, allot_fairshare::NodeId),
    Wake,
}

/// A lease as the agents hold it.
#[derive(Debug, Clone)]
pub(crate) struct Live {
    pub(crate) workload: WorkloadId,
    pub(crate) project: GroupId,
    pub(crate) start: Time,
    pub(crate) placement: Vec<NodeGpus>,
    pub(crate) gpus: u64,
}

#[derive(Debug, Clone)]
pub(crate) struct Job {
    pub(crate) run: Secs,
    pub(crate) time_limit: Option<Secs>,
    pub(crate) fails: bool,
}

/// What the generated cases exercised, so that the properties are not vacuous.
#[derive(Debug, Clone, Default)]
pub(crate) struct Stats {
    pub(crate) starts_free: u64,
    pub(crate) starts_after_preemption: u64,
    pub(crate) starts_reservation: u64,
    pub(crate) starts_backfill: u64,
    pub(crate) gang_starts: u64,
    pub(crate) funded_preemptions: u64,
    pub(crate) unfunded_preemptions: u64,
    pub(crate) reservation_revokes: u64,
    pub(crate) drain_revokes: u64,
    pub(crate) drain_now_revokes: u64,
    pub(crate) cancel_revokes: u64,
    pub(crate) reserves: u64,
    pub(crate) requeues: u64,
    pub(crate) node_lost: u64,
    pub(crate) allowance_starts: u64,
    /// Parts of ended gangs that left after their lease ended.
    pub(crate) parts_left: u64,
    /// Leases of lost nodes that came back running and were held until they left.
    pub(crate) strays: u64,
}

impl Stats {
    pub(crate) fn add(&mut self, o: &Stats) {
        self.starts_free += o.starts_free;
        self.starts_after_preemption += o.starts_after_preemption;
        self.starts_reservation += o.starts_reservation;
        self.starts_backfill += o.starts_backfill;
        self.gang_starts += o.gang_starts;
        self.funded_preemptions += o.funded_preemptions;
        self.unfunded_preemptions += o.unfunded_preemptions;
        self.reservation_revokes += o.reservation_revokes;
        self.drain_revokes += o.drain_revokes;
        self.drain_now_revokes += o.drain_now_revokes;
        self.cancel_revokes += o.cancel_revokes;
        self.reserves += o.reserves;
        self.requeues += o.requeues;
        self.node_lost += o.node_lost;
        self.allowance_starts += o.allowance_starts;
        self.parts_left += o.parts_left;
        self.strays += o.strays;
    }
}

pub(crate) struct Shell {
    pub(crate) sch: Scheduler,
    cooldown: Secs,
    hysteresis: f64,
    /// Work lost so far to each requester's plan in the current pass (a requester
    /// whose claim was lost plans afresh in a later pass, within the same budget).
    plan_loss: BTreeMap<WorkloadId, u64>,
    save: Secs,
    pub(crate) now: Time,
    seq: u64,
    events: BTreeMap<(Time, u64), Ev>,
    wakes: BTreeSet<Time>,
    pub(crate) live: BTreeMap<LeaseId, Live>,
    /// Parts of ended leases the agents still run (a gang's other parts being
    /// stopped, a lost node's lease that came back), by lease: what they hold.
    pub(crate) leaving: BTreeMap<LeaseId, Live>,
    /// Nodes taken down, with the leases that were running there (their agents may
    /// come back still running them).
    down: BTreeMap<allot_fairshare::NodeId, Vec<(LeaseId, WorkloadId, u64)>>,
    /// Every lease ever started, as the core described it right after the start.
    seen: BTreeMap<LeaseId, Lease>,
    jobs: BTreeMap<WorkloadId, Job>,
    ids: Vec<WorkloadId>,
    finals: BTreeMap<WorkloadId, WorkloadState>,
    /// Workloads held and not released: none of them may start.
    held: BTreeSet<WorkloadId>,
    last_revoke: BTreeMap<LeaseId, RevokeWhy>,
    /// Earliest `not_before` each revoked lease was given.
    revoked_at: BTreeMap<LeaseId, Time>,
    pub(crate) log: Vec<(Time, Decisions)>,
    pub(crate) bad: Vec<(Prop, String)>,
    /// Funded preemption edges (requester group → victim group) since the core last
    /// heard anything but a revoked lease's end at this instant.
    edges: BTreeSet<(GroupId, GroupId)>,
    edges_at: Time,
    /// (when, requester, victim) of every funded preemption.
    funded_preemptions: Vec<(Time, WorkloadId, WorkloadId)>,
    /// (project, start, end, GPUs) of every ended lease.
    pub(crate) served: Vec<(GroupId, Time, Time, u64)>,
    pub(crate) stats: Stats,
    /// Whole-book checks after every pass; the long convergence run skips them.
    pub(crate) books: bool,
}

pub(crate) fn run(setup: &Setup, ops: &[Op]) -> Shell {
    let mut sh = Shell::for_setup(setup);
    sh.pass();
    for op in ops {
        sh.apply(op);
    }
    sh
}

pub(crate) fn assert_clean(sh: &Shell, p: Prop) -> Result<(), TestCaseError> {
    let v = sh.violations(p);
    prop_assert!(v.is_empty(), "{p:?} violated:\n{}", v.join("\n"));
    Ok(())
}

pub(crate) fn team(name: &str, weight: f64) -> GroupSpec {
    GroupSpec {
        name: name.into(),
        parent: None,
        weight,
    }
}

pub(crate) fn project(name: &str, parent: &str, weight: f64) -> GroupSpec {
    GroupSpec {
        name: name.into(),
        parent: Some(parent.into()),
        weight,
    }
}
