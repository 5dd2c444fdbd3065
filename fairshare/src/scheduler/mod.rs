//! The fair-share scheduler: state plus `now` in, [`Decisions`] out.
//!
//! The shell feeds it inputs (`submit`, `cancel`, `lease_ended`, `lease_use`,
//! `set_node_state`, `set_gpu_health`) and calls [`Scheduler::schedule`] after each batch; it carries out
//! the returned actions and calls again no later than `next_wakeup`. Nothing here
//! reads a clock, touches a file or a socket, or depends on hash order.
//!
//! Layout: this file holds the public types, the state, the queries and the pass's
//! entry point; `inputs` the shell's reports (submissions, cancels, lease ends, node
//! and GPU changes); `bookkeeping` what starting, ending, revoking and claiming does
//! to the state; `pass` one ranking pass; `placement` where a shape fits; `baseline`
//! the static-priority policy kept for comparison; `easy` FIFO with EASY backfill,
//! the reference a Slurm site runs; `forecast` when pending work will start
//! (clones run forward).

mod baseline;
mod bookkeeping;
mod easy;
mod facts;
mod forecast;
mod gates;
mod inputs;
mod leaving;
mod pass;
mod placement;

use crate::cluster::{lowest_bits, Cluster, ClusterError, Node, NodeId, NodeSpec, NodeState};
use crate::config::PolicyConfig;
use crate::decision::{Action, Decisions, Explanation, StartWhy};
use crate::ledger::{Channel, Ledger};
use crate::preempt::NodeLease;
use crate::queue::{Aging, ProjectQueue, Shape};
use crate::ratios::{neg, Ratios};
use crate::time::Time;
use crate::tree::{GroupId, OrgTree};
use crate::workload::Blocked;
use crate::workload::{
    Lease, LeaseId, LeaseUse, NodeGpus, Revocation, RevokeWhy, Workload, WorkloadId, WorkloadSpec,
    WorkloadState,
};
use std::collections::{BTreeMap, BTreeSet};

pub use baseline::Baseline;
use bookkeeping::protection;
pub use facts::{Facts, LeaseFacts, NodeFacts, WorkloadFacts};
pub use forecast::{Calibration, Forecast, ForecastOptions, RunHistory};
use inputs::QueueKey;
pub use leaving::{Leaving, LeavingPart};
use pass::Pass;

/// How a lease ended, as the shell saw it (journaled by allotd by these names).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum LeaseEnd {
    /// The workload exited successfully on its own.
    Completed,
    /// The workload failed on its own.
    Failed,
    /// The lease was revoked and the checkpoint ladder finished.
    Revoked,
    /// The time limit was reached.
    TimeLimit,
    /// The node or GPU went away under it.
    NodeLost,
    /// The node refused to start it (drained, GPU taken, unhealthy): a fact about the
    /// node, not the work. The work waits again and that node is not offered the
    /// same size again until its state changes.
    Refused,
}

impl LeaseEnd {
    /// The name people read (`allot status` end reasons), as journaled.
    pub fn as_str(self) -> &'static str {
        match self {
            LeaseEnd::Completed => "completed",
            LeaseEnd::Failed => "failed",
            LeaseEnd::Revoked => "revoked",
            LeaseEnd::TimeLimit => "time-limit",
            LeaseEnd::NodeLost => "node-lost",
            LeaseEnd::Refused => "refused",
        }
    }
}

/// Errors from the core's entry points; each names what was wrong.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum CoreError {
    /// Unknown project, or a team rather than a project.
    #[error(
        "project {0:?} is not a project of the org tree (a leaf); see `allot share` for the tree"
    )]
    UnknownProject(String),
    /// A request that can never be satisfied by this cluster.
    #[error("{field} = {value}: {why}")]
    Impossible {
        /// The field.
        field: &'static str,
        /// Its value.
        value: u64,
        /// Why and what would fit.
        why: String,
    },
    /// No such group of the org tree.
    #[error("group {0:?} is not in the org tree; see `allot share` for the tree")]
    UnknownGroup(String),
    /// No such workload.
    #[error("workload {0} does not exist")]
    UnknownWorkload(u64),
    /// No such lease.
    #[error("lease {0} does not exist (already ended?)")]
    UnknownLease(u64),
    /// No such node.
    #[error("node {0} does not exist")]
    UnknownNode(u32),
    /// The workload is already finished.
    #[error("workload {0} has already ended")]
    AlreadyEnded(u64),
    /// Only running work can be asked to run again.
    #[error("workload {0} is not running; only running work is requeued")]
    NotRunning(u64),
    /// Only pending work can be held or changed.
    #[error("workload {0} is running; only pending work is held or changed (`allot requeue` sends it back to the queue first)")]
    Running(u64),
    /// What it asks of its nodes (GPU type, features, cluster) no node has.
    #[error("{field}: {why}")]
    Unplaceable {
        /// The field.
        field: &'static str,
        /// What no node has, and what nodes have.
        why: String,
    },
    /// A changed request allot could never run.
    #[error(transparent)]
    Spec(#[from] crate::workload::SpecError),
    /// Bad node list.
    #[error(transparent)]
    Cluster(#[from] ClusterError),
    /// Bad policy settings.
    #[error("policy: {0}")]
    Config(String),
}

/// GPUs set aside for one pending workload.
#[derive(Debug, Clone, PartialEq)]
pub struct Claim {
    /// What kind.
    pub kind: ClaimKind,
    /// Claimed GPUs per node.
    pub nodes: Vec<NodeGpus>,
    /// CPU cores set aside on each node (preemption claims; reservations set none,
    /// since backfill leaves before they start).
    pub cpu_per_node: u32,
    /// Memory set aside on each node, GB.
    pub mem_per_node: u32,
    /// Made for work funded by its user's allowance.
    pub allowance: bool,
    /// Made for funded work. A reservation for an unfunded gang (its project's
    /// budget is spent) takes back only free occupancy when it starts, and waits for
    /// funded leases to end by their time limits.
    pub funded: bool,
}

/// Why GPUs are claimed.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum ClaimKind {
    /// Victims were revoked for this workload; it starts when they are gone.
    Preemption,
    /// Whole nodes reserved for a gang from `start`.
    Reservation {
        /// Expected start.
        start: Time,
    },
}

pub use allot_units::MAX_CONTRACT;

/// The policy core.
#[derive(Debug, Clone)]
pub struct Scheduler {
    cfg: PolicyConfig,
    tree: OrgTree,
    queues: Vec<ProjectQueue>,
    st: State,
    baseline: Option<Baseline>,
    /// FIFO with EASY backfill's queue, when this scheduler is that baseline.
    fifo: Option<easy::Fifo>,
}

#[derive(Debug, Clone)]
struct State {
    cluster: Cluster,
    ledger: Ledger,
    /// The ranking's own ledger when `ranking_lookback` differs from the lookback
    /// (see [`State::ranking_ledger`]).
    ranking: Option<Ledger>,
    /// Boxed: 2M pending at 100,000 GPUs, and a B-tree moves its values on every
    /// insert and remove.
    workloads: BTreeMap<WorkloadId, Box<Workload>>,
    leases: BTreeMap<LeaseId, Box<Lease>>,
    node_leases: Vec<Vec<NodeLease>>,
    claims: BTreeMap<WorkloadId, Claim>,
    protected: BTreeSet<(Time, LeaseId)>,
    /// Leases being revoked: the pass reads them as gone without scanning every lease.
    revoking: BTreeSet<LeaseId>,
    /// Workloads that ended since they were last forgotten.
    finished: Vec<WorkloadId>,
    outbox: Vec<Action>,
    dequeue: Vec<WorkloadId>,
    demand: Vec<u64>,
    pending: usize,
    pending_gangs: usize,
    next_workload: u64,
    next_lease: u64,
    protect_forever: bool,
    last_now: Time,
    /// Funded preemptions within the cooldown, as (when, requester side, victim side)
    /// at the level where their paths diverge.
    recent: Vec<(Time, GroupId, GroupId)>,
    /// What gang preemption plans learnt about emptying nodes, until each changes.
    whole_keys: crate::preempt::WholeKeys,
    /// GPUs each user runs on the allowance (leases only; claims are counted apart).
    allowance: BTreeMap<String, u32>,
    /// Ended leases' parts still running on their hosts (`leaving.rs`).
    leaving: BTreeMap<LeaseId, Leaving>,
    /// How long runs last, by user and class, from those that ended on their own.
    run_lengths: crate::runlength::RunLengths,
}

impl Scheduler {
    /// A scheduler for `tree` over `nodes`, all ready and healthy.
    pub fn new(cfg: PolicyConfig, tree: OrgTree, nodes: Vec<NodeSpec>) -> Result<Self, CoreError> {
        cfg.validate().map_err(CoreError::Config)?;
        let mut cluster = Cluster::new(nodes)?;
        cluster.set_gpu_weights(cfg.gpu_weights_milli());
        let n = tree.len();
        Ok(Scheduler {
            st: State {
                node_leases: vec![Vec::new(); cluster.len()],
                cluster,
                ledger: Ledger::new(cfg.usage(), n),
                ranking: cfg.ranking_usage().map(|m| Ledger::new(m, n)),
                workloads: BTreeMap::new(),
                leases: BTreeMap::new(),
                claims: BTreeMap::new(),
                protected: BTreeSet::new(),
                revoking: BTreeSet::new(),
                finished: Vec::new(),
                outbox: Vec::new(),
                dequeue: Vec::new(),
                demand: vec![0; n],
                pending: 0,
                pending_gangs: 0,
                next_workload: 1,
                next_lease: 1,
                protect_forever: false,
                last_now: 0,
                recent: Vec::new(),
                whole_keys: Default::default(),
                allowance: BTreeMap::new(),
                leaving: BTreeMap::new(),
                run_lengths: Default::default(),
            },
            baseline: None,
            fifo: None,
            queues: vec![ProjectQueue::default(); n],
            tree,
            cfg,
        })
    }

    /// The settings in force.
    pub fn config(&self) -> &PolicyConfig {
        &self.cfg
    }

    /// The org tree.
    pub fn tree(&self) -> &OrgTree {
        &self.tree
    }

    /// The nodes.
    pub fn cluster(&self) -> &Cluster {
        &self.st.cluster
    }

    /// A workload by id.
    pub fn workload(&self, id: WorkloadId) -> Option<&Workload> {
        self.st.workloads.get(&id).map(|w| &**w)
    }

    /// A lease by id.
    pub fn lease(&self, id: LeaseId) -> Option<&Lease> {
        self.st.leases.get(&id).map(|l| &**l)
    }

    /// All live leases in id order.
    pub fn leases(&self) -> impl Iterator<Item = &Lease> {
        self.st.leases.values().map(|l| &**l)
    }

    /// Claims (preemption and reservation) in workload order.
    pub fn claims(&self) -> &BTreeMap<WorkloadId, Claim> {
        &self.st.claims
    }

    /// Number of pending workloads.
    pub fn pending_len(&self) -> usize {
        self.st.pending
    }

    /// The ids the next workload and the next lease get.
    pub fn next_ids(&self) -> (u64, u64) {
        (self.st.next_workload, self.st.next_lease)
    }

    /// Makes new ids start at or above these (never lowers them): ids issued by a
    /// state this one was restored from a backup of, or seen on a host, are never
    /// given again.
    pub fn raise_ids(&mut self, next_workload: u64, next_lease: u64) {
        self.st.next_workload = self.st.next_workload.max(next_workload);
        self.st.next_lease = self.st.next_lease.max(next_lease);
    }

    /// GPUs wanted by each project's pending and running work, indexed by group.
    pub fn demand(&self) -> &[u64] {
        &self.st.demand
    }

    /// Forgets finished workloads so long runs keep constant memory; returns how many.
    pub fn forget_finished(&mut self) -> usize {
        let before = self.st.workloads.len();
        for id in std::mem::take(&mut self.st.finished) {
            if self
                .st
                .workloads
                .get(&id)
                .is_some_and(|w| w.state.is_final())
            {
                self.st.workloads.remove(&id);
            }
        }
        before - self.st.workloads.len()
    }

    /// Where the indexes the core derives from its leases and workloads (per-node
    /// leases, leases being revoked, workloads ended) disagree with them: empty when
    /// sound. Property tests call it after every pass.
    pub fn index_errors(&self) -> Vec<String> {
        let st = &self.st;
        let mut bad = Vec::new();
        let revoking: BTreeSet<LeaseId> = st
            .leases
            .values()
            .filter(|l| l.revoke.is_some())
            .map(|l| l.id)
            .collect();
        if revoking != st.revoking {
            bad.push(format!(
                "leases being revoked {revoking:?}, the index says {:?}",
                st.revoking
            ));
        }
        let mut want: Vec<Vec<NodeLease>> = vec![Vec::new(); st.node_leases.len()];
        for l in st.leases.values() {
            for p in &l.placement {
                want[p.node.idx()].push(NodeLease::of(l, p.gpus));
            }
        }
        for (i, (have, mut want)) in st.node_leases.iter().zip(want).enumerate() {
            let mut have = have.clone();
            have.sort_by_key(|e| e.id);
            want.sort_by_key(|e| e.id);
            if have != want {
                bad.push(format!("node {i}: index {have:?}, leases {want:?}"));
            }
        }
        let unlisted = st
            .workloads
            .values()
            .filter(|w| w.state.is_final() && !st.finished.contains(&w.id))
            .count();
        if unlisted > 0 {
            bad.push(format!(
                "{unlisted} ended workloads that forget_finished would keep"
            ));
        }
        bad
    }

    /// GPU-seconds `group` consumed over the lookback as of `now` (decayed for the
    /// half-life model), weighted by type: what `allot share` reports as received.
    pub fn usage_gpu_secs(&self, group: GroupId, now: Time) -> f64 {
        // The ledger charges projects; a team's usage is its projects'.
        self.tree
            .projects()
            .iter()
            .filter(|p| {
                group == GroupId::ROOT || **p == group || self.tree.group(**p).path.contains(&group)
            })
            .map(|p| {
                self.st.ledger.usage(*p, now)[Channel::WeightedGpu as usize]
                    / crate::config::MILLI as f64
            })
            .sum()
    }

    /// Served ratio of every group as of `now` (usage plus current allocation over
    /// entitlement, over the ranking's memory: `ranking_lookback` when set), indexed
    /// by group.
    pub fn group_ratios(&self, now: Time) -> Vec<f64> {
        let r = self.ratios_at(now);
        (0..self.tree.len())
            .map(|i| r.ratio(GroupId(i as u32)))
            .collect()
    }

    /// Each group's ratio as its two sides (see [`Ratios::parts`]), in GPU-seconds,
    /// with the covered part of the window they were taken over, in seconds: what
    /// `allot share` shows so that a ratio can be recomputed from its row.
    pub fn group_ratio_parts(&self, now: Time) -> (Vec<(f64, f64)>, f64) {
        let r = self.ratios_at(now);
        let covered = self.st.ranking_ledger(&self.cfg).covered_secs(now);
        (
            (0..self.tree.len())
                .map(|i| r.parts(GroupId(i as u32)))
                .collect(),
            covered,
        )
    }

    /// Ratios people read: from usage and live leases alone (no pass in progress),
    /// over the covered part of the window.
    fn ratios_at(&self, now: Time) -> Ratios {
        let ranking = self.st.ranking_ledger(&self.cfg);
        Ratios::compute(
            &self.cfg,
            &self.tree,
            ranking,
            &self.st.cluster,
            (now, ranking.covered_secs(now)),
            &[],
        )
    }

    /// Whether `project`'s budget for the lookback is spent (new work runs unfunded).
    pub fn budget_spent(&self, project: GroupId, now: Time) -> bool {
        self.st.budget_spent(&self.tree, project, now)
    }

    /// Every pending workload with its reasons, best-ranked project first. Costs the
    /// whole queue (a rendered line per workload): for one workload, or a page of
    /// them, ask [`Scheduler::explain_workload`].
    pub fn explain(&self, now: Time) -> Vec<Explanation> {
        let ctx = self.explain_context(now);
        let mut projects: Vec<GroupId> = self.tree.projects().to_vec();
        projects.sort_by(|a, b| {
            ctx.ratios
                .ratio(*a)
                .total_cmp(&ctx.ratios.ratio(*b))
                .then(a.cmp(b))
        });
        let mut out = Vec::new();
        for p in projects {
            let mut cur = self.queues[p.idx()].cursor(now, self.aging());
            while let Some((id, _)) = cur.next(|_| false) {
                if let Some(w) = self.st.workloads.get(&id) {
                    out.push(self.explanation(now, &ctx, w));
                }
            }
        }
        out
    }

    /// Why one pending workload waits: the line [`Scheduler::explain`] gives it, at
    /// the cost of one workload (and the ratios), whatever the length of the queue.
    /// `None` unless it is pending.
    pub fn explain_workload(&self, now: Time, id: WorkloadId) -> Option<Explanation> {
        let w = self
            .st
            .workloads
            .get(&id)
            .filter(|w| w.state == WorkloadState::Pending)?;
        let ctx = self.explain_context(now);
        Some(self.explanation(now, &ctx, w))
    }

    /// What every explanation at `now` shares: ratios, and the leases not yet
    /// preemptible, told apart by why (a min-runtime contract or the cooldown).
    fn explain_context(&self, now: Time) -> ExplainContext {
        let mut refusals: Vec<(u32, String)> = self
            .st
            .cluster
            .nodes()
            .filter(|(_, n)| n.refused_from != u32::MAX)
            .map(|(_, n)| (n.refused_from, n.spec.name.clone()))
            .collect();
        refusals.sort();
        let mut cx = ExplainContext {
            ratios: self.ratios_at(now),
            protected: 0,
            next_lapse: None,
            cooling: 0,
            next_cool: None,
            refusals,
        };
        for &(t, lid) in self.st.protected.range((now + 1, LeaseId(0))..) {
            match self
                .st
                .leases
                .get(&lid)
                .map(|l| (l.protected_until, l.used))
            {
                Some((until, _)) if until > now => {
                    cx.protected += 1;
                    cx.next_lapse = Some(cx.next_lapse.map_or(until, |x| x.min(until)));
                }
                // A session protected by use (`lease_use`): protection, not cooldown.
                Some((_, Some(_))) => {
                    cx.protected += 1;
                    cx.next_lapse = Some(cx.next_lapse.map_or(t, |x| x.min(t)));
                }
                _ => {
                    cx.cooling += 1;
                    // The set is ordered by this time: the first seen is the earliest.
                    cx.next_cool.get_or_insert(t);
                }
            }
        }
        cx
    }

    fn explanation(&self, now: Time, cx: &ExplainContext, w: &Workload) -> Explanation {
        let r = &cx.ratios;
        let p = w.project;
        let team = self.tree.team_of(p);
        let blocked = w
            .blocked
            .clone()
            .unwrap_or_else(|| self.st.present_obstacle(w));
        let mut e = Explanation {
            workload: w.id,
            project: self.tree.group(p).name.clone(),
            project_ratio: r.ratio(p),
            team: self.tree.group(team).name.clone(),
            team_ratio: r.ratio(team),
            text: String::new(),
            blocked,
            protected_leases: cx.protected,
            next_lapse: cx.next_lapse,
            cooling_leases: cx.cooling,
            next_cool: cx.next_cool,
            refused_by: cx
                .refusals
                .iter()
                .take_while(|(from, _)| *from <= w.spec.gpus_per_node)
                .map(|(_, name)| name.clone())
                .collect(),
        };
        e.text = e.render(now);
        e
    }

    /// Time never runs backwards inside the core: an earlier `now` is taken as the
    /// latest seen, so usage breakpoints stay ordered.
    fn clock(&mut self, now: Time) -> Time {
        self.st.last_now = self.st.last_now.max(now);
        self.st.last_now
    }

    fn aging(&self) -> Aging {
        Aging {
            per_hour: self.cfg.aging_per_hour,
            cap: self.cfg.aging_cap,
            band: self.cfg.aging_band(),
        }
    }

    /// Runs one pass at `now` by the rules of 0.4 and earlier: what replaying a
    /// `Schedule` entry those releases journaled must do to decide what they decided.
    pub fn schedule_by_0_4_rules(&mut self, now: Time) -> Decisions {
        let then = self.cfg.as_of_0_4();
        let today = std::mem::replace(&mut self.cfg, then);
        let d = self.schedule(now);
        self.cfg = today;
        d
    }

    /// Runs one scheduling pass at `now`.
    pub fn schedule(&mut self, now: Time) -> Decisions {
        let now = self.clock(now);
        let mut d = Decisions {
            actions: std::mem::take(&mut self.st.outbox),
            ..Decisions::default()
        };
        self.st.lapse_protection(now);
        let cooldown = self.cfg.cooldown;
        self.st
            .recent
            .retain(|e| e.0.saturating_add(cooldown) >= now);
        self.st
            .process_claims(now, &self.tree, &self.cfg, &mut d.actions);
        if self.fifo.is_some() {
            self.fifo_pass(now, &mut d);
            for id in std::mem::take(&mut self.st.dequeue) {
                self.dequeue(id);
            }
            d.next_wakeup = self.st.next_wakeup(now, false);
            d.actions.append(&mut self.st.outbox);
            return d;
        }
        // Ratios look ahead: preemption claimants count as started, leases being
        // revoked as gone. A reservation is not allocation: others still run there.
        let mut claimed_alloc: Vec<(GroupId, [f64; 3])> = self
            .st
            .claims
            .iter()
            .filter(|(_, c)| c.kind == ClaimKind::Preemption)
            .filter_map(|(id, _)| self.st.workloads.get(id))
            .map(|w| (w.project, self.st.request_alloc(w)))
            .collect();
        claimed_alloc.extend(
            self.st
                .revoking
                .iter()
                .filter_map(|lid| self.st.leases.get(lid))
                .map(|l| (l.project, neg(l.alloc()))),
        );
        let ranking = self.st.ranking_ledger(&self.cfg);
        let mut r = Ratios::compute(
            &self.cfg,
            &self.tree,
            ranking,
            &self.st.cluster,
            (now, ranking.model().effective_secs()),
            &claimed_alloc,
        );

        let aging = self.aging();
        let mut pass = Pass::new(&self.cfg, &self.tree, &self.st, now, self.baseline.as_ref());
        pass.whole_keys = std::mem::take(&mut self.st.whole_keys);
        pass.run(&self.queues, &mut self.st, &mut r, aging, &mut d);
        self.st.whole_keys = std::mem::take(&mut pass.whole_keys);
        let more = pass.cut_short;
        for id in std::mem::take(&mut self.st.dequeue) {
            self.dequeue(id);
        }
        d.next_wakeup = self.st.next_wakeup(now, more);
        d.actions.append(&mut self.st.outbox);
        d
    }
}

/// What every explanation at one instant shares.
struct ExplainContext {
    ratios: Ratios,
    protected: u32,
    next_lapse: Option<Time>,
    cooling: u32,
    next_cool: Option<Time>,
    /// Nodes that remember a refusal: (the size refused, name), smallest first.
    refusals: Vec<(u32, String)>,
}

impl crate::preempt::View for State {
    fn cluster(&self) -> &Cluster {
        &self.cluster
    }
    fn lease(&self, id: LeaseId) -> Option<&Lease> {
        self.leases.get(&id).map(|l| &**l)
    }
    fn node_leases(&self, n: NodeId) -> &[NodeLease] {
        &self.node_leases[n.idx()]
    }
    fn revoking(&self, id: LeaseId) -> bool {
        self.revoking.contains(&id)
    }
    fn recent_preemptions(&self) -> &[(Time, GroupId, GroupId)] {
        &self.recent
    }
}
