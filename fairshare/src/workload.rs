//! Workloads (what users submit) and leases (what runs on GPUs).

use crate::cluster::{GpuMask, NodeId};
use crate::time::{Secs, Time};
use crate::tree::GroupId;
use serde::{Deserialize, Serialize};

/// Identifies a workload for its whole life, across requeues.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct WorkloadId(pub u64);

/// Identifies one lease: one run of a workload on a set of GPUs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct LeaseId(pub u64);

/// What a user asks for.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct WorkloadSpec {
    /// Project (a leaf of the org tree) the work is charged to.
    pub project: String,
    /// Who submitted it.
    pub user: String,
    /// Free-text class label: `debug`, `training`, `interactive`, `batch` …
    #[serde(default)]
    pub class: String,
    /// GPUs on each node.
    pub gpus_per_node: u32,
    /// Nodes; more than one makes a gang that starts all at once on whole nodes.
    pub nodes: u32,
    /// CPU cores on each node.
    #[serde(default)]
    pub cpu_per_node: u32,
    /// Memory on each node, GB.
    #[serde(default)]
    pub mem_per_node_gb: u32,
    /// Protected time after start; 0 means unfunded, always preemptible.
    #[serde(default)]
    pub min_runtime: Secs,
    /// Hard limit on one run, if any.
    #[serde(default)]
    pub time_limit: Option<Secs>,
    /// Whether it can checkpoint and resume (resume from its checkpoint when requeued;
    /// work that cannot resume restarts from the beginning).
    #[serde(default)]
    pub resumable: bool,
    /// Order inside its project (higher first), before aging.
    #[serde(default)]
    pub priority: i32,
    /// End as preempted instead of waiting again when preempted or its node is lost
    /// (the user asked for no requeue; Slurm's `--no-requeue`).
    #[serde(default)]
    pub no_requeue: bool,
    /// GPU types, node features and a cluster it asks for (none: any node of its size).
    #[serde(default, skip_serializing_if = "crate::select::Select::is_any")]
    pub select: crate::select::Select,
}

/// The workload classes (`--class`, `[classes.NAME]`): what a workload is, for its
/// contract's defaults and for people.
pub const CLASSES: [&str; 4] = ["batch", "debug", "interactive", "training"];

/// The class of a submission that names none.
pub const DEFAULT_CLASS: &str = "batch";

/// A submission allot could never run, whatever the cluster; each names the field
/// and the fix.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SpecError {
    /// Not one of [`CLASSES`].
    #[error(
        "class: {0:?} is not a workload class; use one of batch, debug, interactive, training"
    )]
    UnknownClass(String),
    /// A contract longer than [`crate::time::MAX_CONTRACT`].
    #[error("{field} = {value}: longer than 365 days; ask for at most 365d")]
    TooLong {
        /// `min_runtime` or `time_limit`.
        field: &'static str,
        /// Seconds asked.
        value: u64,
    },
    /// Protected past its own time limit.
    #[error("min_runtime = {min_runtime}: longer than time_limit ({time_limit} s): the work would be stopped before its protection ends; ask for a min runtime no longer than the time limit")]
    ProtectedPastLimit {
        /// Seconds protected.
        min_runtime: u64,
        /// Seconds it may run.
        time_limit: u64,
    },
}

impl WorkloadSpec {
    /// Whether allot could ever run this, whatever the cluster (what fits this
    /// cluster is the scheduler's to say at submit). Checked where a submission
    /// comes in, never on replay: a journal keeps what was accepted.
    pub fn check(&self) -> Result<(), SpecError> {
        if !CLASSES.contains(&self.class.as_str()) {
            return Err(SpecError::UnknownClass(self.class.clone()));
        }
        self.check_contract_length()?;
        match self.time_limit {
            Some(time_limit) if self.min_runtime > time_limit => {
                Err(SpecError::ProtectedPastLimit {
                    min_runtime: self.min_runtime,
                    time_limit,
                })
            }
            _ => Ok(()),
        }
    }

    /// Min runtime and time limit within [`crate::time::MAX_CONTRACT`].
    pub fn check_contract_length(&self) -> Result<(), SpecError> {
        for (field, v) in [
            ("min_runtime", Some(self.min_runtime)),
            ("time_limit", self.time_limit),
        ] {
            if let Some(value) = v.filter(|&v| v > crate::time::MAX_CONTRACT) {
                return Err(SpecError::TooLong { field, value });
            }
        }
        Ok(())
    }

    /// Total GPUs across all nodes.
    pub fn total_gpus(&self) -> u32 {
        self.gpus_per_node * self.nodes
    }

    /// GPUs, CPU cores and GB of memory across all nodes.
    pub fn alloc(&self) -> [f64; 3] {
        let n = f64::from(self.nodes);
        [
            f64::from(self.gpus_per_node) * n,
            f64::from(self.cpu_per_node) * n,
            f64::from(self.mem_per_node_gb) * n,
        ]
    }
}

/// Where a workload is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum WorkloadState {
    /// Waiting in its project's queue.
    Pending,
    /// Holding a lease.
    Running,
    /// Finished on its own.
    Completed,
    /// Failed on its own, or lost with its node and not resumable.
    Failed,
    /// Cancelled by a user.
    Cancelled,
    /// Preempted and not resumable.
    Preempted,
    /// Reached its time limit.
    TimedOut,
}

impl WorkloadState {
    /// Its name as people read it (`timed-out`), in views, history and notices.
    pub fn as_str(self) -> &'static str {
        match self {
            WorkloadState::Pending => "pending",
            WorkloadState::Running => "running",
            WorkloadState::Completed => "completed",
            WorkloadState::Failed => "failed",
            WorkloadState::Cancelled => "cancelled",
            WorkloadState::Preempted => "preempted",
            WorkloadState::TimedOut => "timed-out",
        }
    }

    /// True once nothing more will happen to it.
    pub fn is_final(self) -> bool {
        !matches!(self, WorkloadState::Pending | WorkloadState::Running)
    }
}

/// A workload as the core tracks it.
#[derive(Debug, Clone)]
pub struct Workload {
    /// Its id.
    pub id: WorkloadId,
    /// What was asked.
    pub spec: WorkloadSpec,
    /// The project as a tree node.
    pub project: GroupId,
    /// Original submit time; requeues keep it, so work keeps its place.
    pub submit: Time,
    /// Life-cycle state.
    pub state: WorkloadState,
    /// The current lease while running.
    pub lease: Option<LeaseId>,
    /// When it first started, if ever.
    pub first_start: Option<Time>,
    /// How often it was preempted.
    pub preemptions: u32,
    /// When it was last preempted.
    pub last_preempted: Option<Time>,
    /// What stopped it in the last pass that examined it.
    pub blocked: Option<Blocked>,
    /// Kept out of its queue by the shell (a hold, a dependency, an array's limit, a
    /// begin time): pending, but neither considered nor counted as demand.
    pub held: bool,
    /// `spec.select` as the cluster's bits.
    pub sel: crate::select::Selector,
}

/// Why a pending workload is not running.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "kebab-case", tag = "kind")]
pub enum Blocked {
    /// No node has enough free GPUs for it.
    NoFit {
        /// GPUs needed on one node.
        need: u32,
        /// The most any node has free.
        largest_free: u32,
    },
    /// Not enough wholly free nodes in one cluster for the gang.
    NoWholeNodes {
        /// Nodes needed.
        need: u32,
        /// Most wholly free nodes in a cluster.
        free: u32,
    },
    /// Victims were asked to checkpoint; it starts when they are gone.
    WaitingForVictims,
    /// Nodes are reserved for it from `start`.
    Reserved {
        /// Expected start.
        start: Time,
    },
    /// Its project's budget is spent and unfunded work cannot preempt.
    Unfunded,
    /// Nothing it may preempt would make room (protected, or better-served groups).
    NothingPreemptible,
    /// Preemption could make room, but would throw away more of others' work than
    /// `max_loss_per_gpu` allows for its GPUs.
    PreemptionTooDear {
        /// GPU-seconds the cheapest way would throw away.
        lost_gpu_s: u64,
        /// GPU-seconds it may throw away.
        most_gpu_s: u64,
    },
    /// Free occupancy waits: the GPUs free are kept for protected work
    /// (`protected_headroom`), or go first to occupancy ranked ahead of it.
    Headroom {
        /// GPUs free now.
        free: u64,
        /// GPUs kept free for protected work.
        kept: u64,
    },
    /// Baseline policy only: its team is at its concurrent-GPU cap.
    OverCap {
        /// The team's cap.
        cap: u64,
    },
    /// The pass ended before reaching it (others ranked ahead took the capacity).
    NotReached,
    /// Its previous run has parts still ending on these nodes (being stopped, or a
    /// lost node's run that came back): it does not run twice at once.
    PreviousRunEnding {
        /// The nodes, by name.
        nodes: Vec<String>,
    },
}

/// Why a lease is being taken back.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", tag = "kind")]
pub enum RevokeWhy {
    /// Preempted so that a better-ranked workload can run.
    Preempted {
        /// The workload that needs the GPUs.
        by: WorkloadId,
        /// The victim ran unfunded (free occupancy).
        unfunded: bool,
        /// Requester's group served ratio after it starts (funded victims only).
        requester_ratio_after: Option<f64>,
        /// Victim's group served ratio after the victim stops (funded victims only).
        victim_ratio_after: Option<f64>,
    },
    /// Freed for a reservation whose start has come (backfill ends).
    Reservation {
        /// The gang holding the reservation.
        by: WorkloadId,
    },
    /// The node drains: revoked at the min-runtime lapse.
    Drain {
        /// The node.
        node: NodeId,
    },
    /// The node must be emptied at once.
    DrainNow {
        /// The node.
        node: NodeId,
    },
    /// A user cancelled the workload.
    Cancelled,
    /// Its owner or an operator asked for it to run again from the queue
    /// (`allot requeue`): it waits again even when it asked for no requeue.
    Requeued,
}

/// A revocation in progress.
#[derive(Debug, Clone, PartialEq)]
pub struct Revocation {
    /// Nothing happens before this (the min-runtime lapse unless drain-now).
    pub not_before: Time,
    /// Why.
    pub why: RevokeWhy,
}

/// How a lease is used, as its agent last reported (leases of a class protected by
/// use, `policy.protect_by_use`; see [`crate::Scheduler::lease_use`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum LeaseUse {
    /// Terminal input lately, or its GPUs busy: protected.
    InUse,
    /// No input and idle GPUs since then: protected for the class's idle grace
    /// after it (and never before its min runtime lapses).
    IdleSince(Time),
}

/// GPUs on one node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeGpus {
    /// The node.
    pub node: NodeId,
    /// Which of its GPUs.
    pub gpus: GpuMask,
}

/// One run of a workload on GPUs.
#[derive(Debug, Clone)]
pub struct Lease {
    /// Its id.
    pub id: LeaseId,
    /// The workload it runs.
    pub workload: WorkloadId,
    /// The project charged.
    pub project: GroupId,
    /// Where.
    pub placement: Vec<NodeGpus>,
    /// GPUs in all.
    pub gpus: u32,
    /// Its GPUs weighted by type (`gpu_hour_weight`) as they were at its start, in
    /// thousandths: what it charges while it runs.
    pub weighted: u64,
    /// CPU cores per node.
    pub cpu_per_node: u32,
    /// Memory per node, GB.
    pub mem_per_node: u32,
    /// Start time.
    pub start: Time,
    /// End of the contract's protection (`start + min_runtime`).
    pub protected_until: Time,
    /// When preemption for rebalancing may take it (protection and cooldown).
    pub preemptible_at: Time,
    /// Charged to the project's budget.
    pub funded: bool,
    /// Set while it is being taken back.
    pub revoke: Option<Revocation>,
    /// Started on a node reserved for this gang, so the gang may reclaim it.
    pub backfill_for: Option<WorkloadId>,
    /// Its workload resumes from a checkpoint: revoking it loses at most the work
    /// since the last one, not the whole run.
    pub resumable: bool,
    /// When its time limit ends it, if it has one.
    pub ends_by: Option<Time>,
    /// Funded by its user's allowance, not the project's budget (which it does not
    /// charge): the user, to give the GPUs back to.
    pub allowance: Option<String>,
    /// Its use as last reported, for a class protected by use (`None`: not
    /// reported, or not such a class; its min runtime protects it).
    pub used: Option<LeaseUse>,
}

/// GPU-seconds a lease of `gpus` started at `start` loses if revoked at `now` (see
/// [`Lease::loss_at`]).
pub(crate) fn work_lost(
    gpus: u32,
    start: Time,
    resumable: bool,
    now: Time,
    checkpoint_loss: Option<Secs>,
) -> u64 {
    let ran = now.saturating_sub(start);
    let lost = match checkpoint_loss {
        Some(cap) if resumable => cap,
        _ => ran,
    };
    u64::from(gpus) * lost
}

impl Lease {
    /// GPU-seconds of work revoking it at `now` would throw away: everything since
    /// its start, or for resumable work `checkpoint_loss` (the core does not know when
    /// it last checkpointed, so it charges every resumable lease the same, which also
    /// keeps freshly restarted work from being the cheapest victim again). Without
    /// `checkpoint_loss` (the rules of 0.4, see [`crate::PolicyConfig::victim_loss`])
    /// every lease counts its GPU-time since its start.
    pub fn loss_at(&self, now: Time, checkpoint_loss: Option<Secs>) -> u64 {
        work_lost(self.gpus, self.start, self.resumable, now, checkpoint_loss)
    }

    /// Weighted GPUs (see `weighted`), CPU cores and GB of memory it holds across
    /// all nodes: what served ratios count.
    pub fn alloc(&self) -> [f64; 3] {
        let n = self.placement.len() as f64;
        [
            self.weighted as f64 / crate::config::MILLI as f64,
            f64::from(self.cpu_per_node) * n,
            f64::from(self.mem_per_node) * n,
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(class: &str, min_runtime: u64, time_limit: Option<u64>) -> WorkloadSpec {
        WorkloadSpec {
            project: "p".into(),
            user: "u".into(),
            class: class.into(),
            gpus_per_node: 1,
            nodes: 1,
            cpu_per_node: 0,
            mem_per_node_gb: 0,
            min_runtime,
            time_limit,
            resumable: false,
            priority: 0,
            no_requeue: false,
            ..Default::default()
        }
    }

    #[test]
    fn a_spec_names_what_could_never_run_and_the_fix() {
        assert_eq!(spec(DEFAULT_CLASS, 0, None).check(), Ok(()));
        assert_eq!(spec("training", 3_600, Some(3_600)).check(), Ok(()));
        let e = spec("gpu", 0, None).check().expect_err("unknown class");
        assert!(CLASSES.iter().all(|c| e.to_string().contains(c)), "{e}");
        assert!(e.to_string().starts_with("class: \"gpu\""), "{e}");
        assert_eq!(
            spec("batch", 7_200, Some(3_600)).check(),
            Err(SpecError::ProtectedPastLimit {
                min_runtime: 7_200,
                time_limit: 3_600
            })
        );
        let year = crate::time::MAX_CONTRACT;
        assert_eq!(
            spec("batch", 0, Some(year + 1)).check(),
            Err(SpecError::TooLong {
                field: "time_limit",
                value: year + 1
            })
        );
        assert!(spec("batch", year, Some(year)).check().is_ok());
    }
}
