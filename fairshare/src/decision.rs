//! What the core tells its shell to do, and why.

use crate::time::{format_duration, Time};
use crate::workload::{Blocked, LeaseId, NodeGpus, RevokeWhy, WorkloadId};
use serde::{Deserialize, Serialize};

/// One thing for the shell to carry out.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", tag = "action")]
pub enum Action {
    /// Start a lease now.
    Start {
        /// New lease id.
        lease: LeaseId,
        /// The workload it runs.
        workload: WorkloadId,
        /// Where.
        placement: Vec<NodeGpus>,
        /// Charged to the project's budget (otherwise free, always preemptible).
        funded: bool,
        /// Why it starts now.
        why: StartWhy,
    },
    /// Take a lease back: checkpoint ladder no earlier than `not_before`.
    Revoke {
        /// The lease.
        lease: LeaseId,
        /// Its workload.
        workload: WorkloadId,
        /// The contract's min-runtime lapse (or now).
        not_before: Time,
        /// Why.
        why: RevokeWhy,
    },
    /// A revocation not yet due is taken back (the drain that asked for it ended).
    Withdraw {
        /// The lease.
        lease: LeaseId,
        /// Its workload.
        workload: WorkloadId,
    },
    /// Nodes are set aside for a gang that cannot fit yet.
    Reserve {
        /// The gang.
        workload: WorkloadId,
        /// The nodes.
        nodes: Vec<crate::cluster::NodeId>,
        /// When they are expected to be free.
        start: Time,
    },
}

/// Why a lease starts.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", tag = "kind")]
pub enum StartWhy {
    /// Ranked `rank` in this pass and fitted on free GPUs; its project's served ratio.
    Free {
        /// Position among workloads examined this pass (1 = first).
        rank: u32,
        /// Project's served ratio before it started.
        ratio: f64,
    },
    /// Its claim is satisfied: the victims it preempted have gone.
    AfterPreemption,
    /// Its reservation's nodes are free.
    Reservation,
    /// Backfilled on nodes reserved for another gang, ending before that starts.
    Backfill {
        /// The gang holding the reservation.
        reservation_of: WorkloadId,
        /// When the reservation starts.
        starts: Time,
    },
}

/// A pending workload's explanation, ranked reasons first.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Explanation {
    /// The workload.
    pub workload: WorkloadId,
    /// Its project.
    pub project: String,
    /// The project's served ratio (usage over entitlement).
    pub project_ratio: f64,
    /// Its team.
    pub team: String,
    /// The team's served ratio.
    pub team_ratio: f64,
    /// What stops it, as of the last pass that examined it.
    pub blocked: Blocked,
    /// Leases inside their min runtime (their contract protects them).
    pub protected_leases: u32,
    /// When the first of those contracts lapses.
    pub next_lapse: Option<Time>,
    /// Leases past their min runtime but in the preemption cooldown (they displaced
    /// work, or were displaced, a short while ago): not preemptible yet either.
    pub cooling_leases: u32,
    /// When the first cooldown ends.
    pub next_cool: Option<Time>,
    /// Nodes that refused a start of its size (or smaller) and are not offered it
    /// until something about them changes (`allot nodes` shows them).
    pub refused_by: Vec<String>,
    /// The same, for people.
    pub text: String,
}

impl Explanation {
    /// Renders the line users read in `allot status`.
    pub fn render(&self, now: Time) -> String {
        let mut s = format!(
            "project {} is served {:.2}× its share",
            self.project, self.project_ratio
        );
        if self.team != self.project {
            s += &format!(" (team {} {:.2}×)", self.team, self.team_ratio);
        }
        s += "; ";
        s += &match &self.blocked {
            Blocked::NoFit { need, largest_free } => {
                format!("needs {need} GPUs on one node, the most free is {largest_free}")
            }
            Blocked::NoWholeNodes { need, free } => {
                format!("needs {need} whole nodes, {free} are free in one cluster")
            }
            Blocked::WaitingForVictims => "preempted work is checkpointing to make room".into(),
            Blocked::Reserved { start } => format!(
                "nodes reserved, starting in {}",
                format_duration(start.saturating_sub(now))
            ),
            Blocked::Unfunded => "budget spent: runs unfunded, only on idle GPUs".into(),
            Blocked::NothingPreemptible => "nothing may be preempted for it yet".into(),
            Blocked::PreemptionTooDear {
                lost_gpu_s,
                most_gpu_s,
            } => format!(
                "preempting for it would throw away {:.1} GPU-hours of others' work, more \
                 than the {:.1} allowed for its size (policy.max_loss_per_gpu)",
                *lost_gpu_s as f64 / 3_600.0,
                *most_gpu_s as f64 / 3_600.0
            ),
            Blocked::Headroom { free, kept } => format!(
                "{free} GPUs are free, but {kept} are kept for protected work \
                 (policy.protected_headroom) and min-runtime-0 work takes the rest in \
                 rank order"
            ),
            Blocked::OverCap { cap } => format!("team is at its cap of {cap} GPUs"),
            Blocked::NotReached => "work ranked ahead took the free capacity".into(),
            Blocked::PreviousRunEnding { nodes } => format!(
                "its previous run is still ending on {} (its parts are being stopped); \
                 it starts again once they have, never beside them",
                nodes.join(", ")
            ),
        };
        if !self.refused_by.is_empty() {
            let (n, names) = (self.refused_by.len(), self.refused_by.join(", "));
            s += &format!(
                "; {names} refused a start of its size and {} not offered it until {} \
                 changes (a drain, a health report, a reconnect)",
                if n == 1 { "is" } else { "are" },
                if n == 1 { "it" } else { "each" }
            );
        }
        if let Some(t) = self.next_lapse.filter(|_| self.protected_leases > 0) {
            s += &not_yet(
                self.protected_leases,
                "within its min runtime, which lapses",
                "within their min runtime, the first lapses",
                t.saturating_sub(now),
            );
        }
        if let Some(t) = self.next_cool.filter(|_| self.cooling_leases > 0) {
            s += &not_yet(
                self.cooling_leases,
                "in the preemption cooldown, which ends",
                "in the preemption cooldown, the first ends",
                t.saturating_sub(now),
            );
        }
        s
    }
}

/// "; 1 lease is …, which lapses in 5m" or "; 3 leases are …, the first lapses in 5m".
fn not_yet(n: u32, one: &str, many: &str, left: u64) -> String {
    let left = format_duration(left);
    if n == 1 {
        format!("; 1 lease is {one} in {left}")
    } else {
        format!("; {n} leases are {many} in {left}")
    }
}

/// Everything one call to [`crate::Scheduler::schedule`] decided.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Decisions {
    /// Actions in the order to carry them out.
    pub actions: Vec<Action>,
    /// When the core next needs to run even if nothing else happens.
    pub next_wakeup: Option<Time>,
    /// Workloads examined this pass.
    pub examined: u32,
}
