//! The fair-share scheduler: state plus `now` in, [`Decisions`] out.
//!
//! The shell feeds it inputs (`submit`, `cancel`, `lease_ended`, `set_node_state`,
//! `set_gpu_health`) and calls [`Scheduler::schedule`] after each batch; it carries out
//! the returned actions and calls again no later than `next_wakeup`. Nothing here
//! reads a clock, touches a file or a socket, or depends on hash order.

use crate::cluster::{lowest_bits, Cluster, ClusterError, Node, NodeId, NodeSpec, NodeState};
use crate::config::PolicyConfig;
use crate::decision::{Action, Blocked, Decisions, Explanation, StartWhy};
use crate::ledger::{Channel, Ledger};
use crate::queue::{Aging, ProjectQueue, Shape};
use crate::ratios::Ratios;
use crate::time::Time;
use crate::tree::{GroupId, OrgTree};
use crate::workload::{
    Lease, LeaseId, NodeGpus, Revocation, RevokeWhy, Workload, WorkloadId, WorkloadSpec,
    WorkloadState,
};
use std::collections::{BTreeMap, BTreeSet};

/// How a lease ended, as the shell saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
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

/// The static-priority policy allot replaces, kept for before/after comparisons:
/// one global order by priority then submit time, a concurrent-GPU cap per team for
/// protected work, protected work never preempted, and preemptible (`min_runtime = 0`)
/// work allowed past the cap on idle GPUs.
#[derive(Debug, Clone)]
pub struct Baseline {
    /// Cap per group index; only teams (children of the root) are read.
    pub team_caps: Vec<u64>,
}

/// Longest min runtime or time limit accepted: a year.
pub const MAX_CONTRACT: u64 = 365 * 86_400;

/// The policy core.
#[derive(Debug, Clone)]
pub struct Scheduler {
    cfg: PolicyConfig,
    tree: OrgTree,
    queues: Vec<ProjectQueue>,
    st: State,
    baseline: Option<Baseline>,
}

#[derive(Debug, Clone)]
struct State {
    cluster: Cluster,
    ledger: Ledger,
    workloads: BTreeMap<WorkloadId, Workload>,
    leases: BTreeMap<LeaseId, Lease>,
    node_leases: Vec<Vec<LeaseId>>,
    claims: BTreeMap<WorkloadId, Claim>,
    protected: BTreeSet<(Time, LeaseId)>,
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
}

impl Scheduler {
    /// A scheduler for `tree` over `nodes`, all ready and healthy.
    pub fn new(cfg: PolicyConfig, tree: OrgTree, nodes: Vec<NodeSpec>) -> Result<Self, CoreError> {
        cfg.validate().map_err(CoreError::Config)?;
        let cluster = Cluster::new(nodes)?;
        let n = tree.len();
        Ok(Scheduler {
            st: State {
                node_leases: vec![Vec::new(); cluster.len()],
                cluster,
                ledger: Ledger::new(cfg.usage(), n),
                workloads: BTreeMap::new(),
                leases: BTreeMap::new(),
                claims: BTreeMap::new(),
                protected: BTreeSet::new(),
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
            },
            baseline: None,
            queues: vec![ProjectQueue::default(); n],
            tree,
            cfg,
        })
    }

    /// Turns this scheduler into the static-priority baseline (no fair share, no
    /// aging, no reservations, protected work never preempted).
    pub fn into_baseline(mut self, b: Baseline) -> Self {
        self.cfg.aging_per_hour = 0;
        self.cfg.max_reservations = 0;
        self.st.protect_forever = true;
        self.baseline = Some(b);
        self
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
        self.st.workloads.get(&id)
    }

    /// A lease by id.
    pub fn lease(&self, id: LeaseId) -> Option<&Lease> {
        self.st.leases.get(&id)
    }

    /// All live leases in id order.
    pub fn leases(&self) -> impl Iterator<Item = &Lease> {
        self.st.leases.values()
    }

    /// Claims (preemption and reservation) in workload order.
    pub fn claims(&self) -> &BTreeMap<WorkloadId, Claim> {
        &self.st.claims
    }

    /// Number of pending workloads.
    pub fn pending_len(&self) -> usize {
        self.st.pending
    }

    /// GPUs wanted by each project's pending and running work, indexed by group.
    pub fn demand(&self) -> &[u64] {
        &self.st.demand
    }

    /// Forgets finished workloads so long runs keep constant memory; returns how many.
    pub fn forget_finished(&mut self) -> usize {
        let before = self.st.workloads.len();
        self.st.workloads.retain(|_, w| !w.state.is_final());
        before - self.st.workloads.len()
    }

    /// Accepts a workload; it is pending from `now`.
    pub fn submit(&mut self, now: Time, spec: WorkloadSpec) -> Result<WorkloadId, CoreError> {
        let now = self.clock(now);
        let project = self
            .tree
            .find(&spec.project)
            .filter(|&g| self.tree.is_project(g))
            .ok_or_else(|| CoreError::UnknownProject(spec.project.clone()))?;
        self.check_fits(&spec)?;
        let id = WorkloadId(self.st.next_workload);
        self.st.next_workload += 1;
        self.st.demand[project.idx()] += u64::from(spec.total_gpus());
        let w = Workload {
            id,
            spec,
            project,
            submit: now,
            state: WorkloadState::Pending,
            lease: None,
            first_start: None,
            preemptions: 0,
            last_preempted: None,
            blocked: None,
        };
        self.enqueue(&w);
        self.st.workloads.insert(id, w);
        Ok(id)
    }

    fn check_fits(&self, spec: &WorkloadSpec) -> Result<(), CoreError> {
        for (field, v) in [
            ("min_runtime", Some(spec.min_runtime)),
            ("time_limit", spec.time_limit),
        ] {
            if let Some(v) = v.filter(|&v| v > MAX_CONTRACT) {
                return Err(CoreError::Impossible {
                    field,
                    value: v,
                    why: format!(
                        "longer than {} days; ask for at most 365d",
                        MAX_CONTRACT / 86_400
                    ),
                });
            }
        }
        let c = &self.st.cluster;
        let max_gpus = c.nodes().map(|(_, n)| n.spec.gpus).max().unwrap_or(0);
        if spec.gpus_per_node == 0 || spec.gpus_per_node > max_gpus {
            return Err(CoreError::Impossible {
                field: "gpus_per_node",
                value: u64::from(spec.gpus_per_node),
                why: format!(
                    "ask for 1 to {max_gpus} GPUs per node (the largest node has {max_gpus}); more GPUs take more nodes (a gang of whole nodes)"
                ),
            });
        }
        // Name the resource no single node can hold, with the largest that has it.
        let with_gpus = || {
            c.nodes()
                .map(|(_, n)| n)
                .filter(|n| n.spec.gpus >= spec.gpus_per_node)
        };
        let max_cpu = with_gpus().map(|n| n.spec.cpu).max().unwrap_or(0);
        if spec.cpu_per_node > max_cpu {
            return Err(CoreError::Impossible {
                field: "cpu_per_node",
                value: u64::from(spec.cpu_per_node),
                why: format!(
                    "the largest node with {} GPUs has {max_cpu} CPUs; ask for at most {max_cpu} CPUs per node",
                    spec.gpus_per_node
                ),
            });
        }
        let max_mem = with_gpus()
            .filter(|n| n.spec.cpu >= spec.cpu_per_node)
            .map(|n| n.spec.memory_gb)
            .max()
            .unwrap_or(0);
        if spec.mem_per_node_gb > max_mem {
            return Err(CoreError::Impossible {
                field: "mem_per_node_gb",
                value: u64::from(spec.mem_per_node_gb),
                why: format!(
                    "GB of memory per node: the largest node that fits the rest has {max_mem} GB; ask for at most {max_mem} GB per node"
                ),
            });
        }
        let mut per_cluster = vec![0u64; c.cluster_names().len()];
        for (_, n) in c.nodes() {
            if n.spec.gpus >= spec.gpus_per_node
                && n.spec.cpu >= spec.cpu_per_node
                && n.spec.memory_gb >= spec.mem_per_node_gb
            {
                per_cluster[n.cluster as usize] += 1;
            }
        }
        let most = per_cluster.into_iter().max().unwrap_or(0);
        if spec.nodes == 0 || u64::from(spec.nodes) > most {
            return Err(CoreError::Impossible {
                field: "nodes",
                value: u64::from(spec.nodes),
                why: format!(
                    "ask for 1 to {most}: at most {most} nodes of one cluster can hold {} GPUs, {} CPUs and {} GB of memory each (a gang takes whole nodes of one cluster)",
                    spec.gpus_per_node, spec.cpu_per_node, spec.mem_per_node_gb
                ),
            });
        }
        Ok(())
    }

    fn enqueue(&mut self, w: &Workload) {
        self.queues[w.project.idx()].insert(Shape::of(&w.spec), w.spec.priority, w.submit, w.id);
        self.st.pending += 1;
        if w.spec.nodes > 1 && w.spec.min_runtime > 0 {
            self.st.pending_gangs += 1;
        }
    }

    fn dequeue(&mut self, id: WorkloadId) {
        let Some(w) = self.st.workloads.get(&id) else {
            return;
        };
        if self.queues[w.project.idx()].remove(Shape::of(&w.spec), w.spec.priority, w.submit, id) {
            self.st.pending -= 1;
            if w.spec.nodes > 1 && w.spec.min_runtime > 0 {
                self.st.pending_gangs -= 1;
            }
        }
    }

    /// Cancels a workload: pending ones end now, running ones are revoked at once.
    pub fn cancel(&mut self, now: Time, id: WorkloadId) -> Result<(), CoreError> {
        let now = self.clock(now);
        let w = self
            .st
            .workloads
            .get(&id)
            .ok_or(CoreError::UnknownWorkload(id.0))?;
        match (w.state, w.lease) {
            (WorkloadState::Pending, _) => {
                self.dequeue(id);
                self.st.drop_claim(id);
                self.st.finish(id, WorkloadState::Cancelled);
                Ok(())
            }
            (WorkloadState::Running, Some(lease)) => {
                self.st.revoke_at(lease, now, RevokeWhy::Cancelled);
                Ok(())
            }
            _ => Err(CoreError::AlreadyEnded(id.0)),
        }
    }

    /// A node refused to start a lease: the work waits again, and that node (only)
    /// is not offered work of that size until it changes.
    pub fn lease_refused(
        &mut self,
        now: Time,
        lease: LeaseId,
        node: NodeId,
    ) -> Result<WorkloadState, CoreError> {
        self.end_lease(now, lease, LeaseEnd::Refused, Some(node))
    }

    /// The shell reports that a lease is over; returns the workload's new state.
    pub fn lease_ended(
        &mut self,
        now: Time,
        lease: LeaseId,
        end: LeaseEnd,
    ) -> Result<WorkloadState, CoreError> {
        self.end_lease(now, lease, end, None)
    }

    fn end_lease(
        &mut self,
        now: Time,
        lease: LeaseId,
        end: LeaseEnd,
        refusing: Option<NodeId>,
    ) -> Result<WorkloadState, CoreError> {
        let now = self.clock(now);
        let l = self
            .st
            .release(now, lease)
            .ok_or(CoreError::UnknownLease(lease.0))?;
        let wid = l.workload;
        let requeue = self
            .st
            .workloads
            .get(&wid)
            .is_some_and(|w| !w.spec.no_requeue);
        let cancelled = matches!(
            l.revoke,
            Some(Revocation {
                why: RevokeWhy::Cancelled,
                ..
            })
        );
        if end == LeaseEnd::Refused {
            // Not offered there again (at this size or larger) until the node changes:
            // the node that refused when the shell knows it, else every node of it.
            for p in l
                .placement
                .iter()
                .filter(|p| refusing.is_none_or(|n| n == p.node))
            {
                let gpus = p.gpus.count_ones();
                self.st
                    .cluster
                    .update(p.node, |n| n.refused_from = n.refused_from.min(gpus));
            }
        }
        // Revoked or lost work waits again, from its checkpoint when it can resume and
        // from the beginning otherwise, unless its user asked for no requeue.
        let next = match end {
            LeaseEnd::Completed => WorkloadState::Completed,
            LeaseEnd::Failed => WorkloadState::Failed,
            LeaseEnd::TimeLimit => WorkloadState::TimedOut,
            _ if cancelled => WorkloadState::Cancelled,
            LeaseEnd::Refused => WorkloadState::Pending,
            LeaseEnd::Revoked | LeaseEnd::NodeLost if requeue => WorkloadState::Pending,
            LeaseEnd::Revoked => WorkloadState::Preempted,
            LeaseEnd::NodeLost => WorkloadState::Failed,
        };
        let preempted = matches!(
            l.revoke,
            Some(Revocation {
                why: RevokeWhy::Preempted { .. } | RevokeWhy::Reservation { .. },
                ..
            })
        ) && end == LeaseEnd::Revoked;
        if preempted {
            if let Some(w) = self.st.workloads.get_mut(&wid) {
                w.preemptions += 1;
            }
        }
        if next == WorkloadState::Pending {
            let w = self
                .st
                .workloads
                .get_mut(&wid)
                .ok_or(CoreError::UnknownWorkload(wid.0))?;
            w.state = WorkloadState::Pending;
            w.lease = None;
            w.blocked = None;
            if preempted {
                w.last_preempted = Some(now);
            }
            let w = w.clone();
            self.enqueue(&w);
        } else {
            self.st.finish(wid, next);
        }
        Ok(next)
    }

    /// A node joins (an agent registered a host the scheduler did not know); it is
    /// ready and healthy.
    pub fn add_node(&mut self, now: Time, spec: NodeSpec) -> Result<NodeId, CoreError> {
        self.clock(now);
        let id = self.st.cluster.add(spec)?;
        self.st.node_leases.push(Vec::new());
        Ok(id)
    }

    /// Changes a group's weight among its siblings (a manager's act).
    pub fn set_weight(&mut self, group: &str, weight: f64) -> Result<(), CoreError> {
        let g = self
            .tree
            .find(group)
            .ok_or_else(|| CoreError::UnknownGroup(group.to_string()))?;
        self.tree
            .set_weight(g, weight)
            .map_err(|e| CoreError::Config(e.to_string()))
    }

    /// Changes a node's scheduling state. `Draining` revokes its leases at their
    /// min-runtime lapse, `DrainNow` and `Down` at once.
    pub fn set_node_state(
        &mut self,
        now: Time,
        node: NodeId,
        state: NodeState,
    ) -> Result<(), CoreError> {
        let now = self.clock(now);
        if node.idx() >= self.st.cluster.len() {
            return Err(CoreError::UnknownNode(node.0));
        }
        self.st.cluster.update(node, |n| {
            n.state = state;
            n.forget_refusals();
        });
        if state == NodeState::Ready {
            self.withdraw_drain_revocations(now, node);
        }
        if state != NodeState::Ready {
            for lid in self.st.node_leases[node.idx()].clone() {
                let Some(l) = self.st.leases.get(&lid) else {
                    continue;
                };
                let (not_before, why) = match state {
                    NodeState::Draining => (l.protected_until.max(now), RevokeWhy::Drain { node }),
                    _ => (now, RevokeWhy::DrainNow { node }),
                };
                let earlier = l.revoke.as_ref().is_none_or(|r| r.not_before > not_before);
                if earlier {
                    self.st.revoke_at(lid, not_before, why);
                }
            }
            self.st.drop_claims_on(node);
        }
        Ok(())
    }

    /// The drain of `node` ended: the drain revocations of its leases are withdrawn
    /// (they run on under their contracts), unless another node of the lease still
    /// drains.
    fn withdraw_drain_revocations(&mut self, now: Time, node: NodeId) {
        for lid in self.st.node_leases[node.idx()].clone() {
            let Some(l) = self.st.leases.get(&lid) else {
                continue;
            };
            // Whichever drained node asked (a gang's nodes may drain one after the
            // other), and whether or not its lapse has passed here: the agent
            // withdraws only what its ladder has not begun, and reports the rest ended.
            let drained = l.revoke.as_ref().is_some_and(|r| {
                matches!(r.why, RevokeWhy::Drain { .. } | RevokeWhy::DrainNow { .. })
            });
            let elsewhere = l
                .placement
                .iter()
                .any(|p| self.st.cluster.node(p.node).state != NodeState::Ready);
            if drained && !elsewhere {
                self.st.withdraw(now, lid);
            }
        }
    }

    /// Something about a node changed that the core does not model (its agent's
    /// drains or health report): it is offered every size of work again.
    pub fn node_changed(&mut self, node: NodeId) {
        if node.idx() < self.st.cluster.len() {
            self.st.cluster.update(node, Node::forget_refusals);
        }
    }

    /// Marks one GPU healthy or not (a failed GPU takes no new leases).
    pub fn set_gpu_health(
        &mut self,
        node: NodeId,
        gpu: u32,
        healthy: bool,
    ) -> Result<(), CoreError> {
        if node.idx() >= self.st.cluster.len() || gpu >= self.st.cluster.node(node).spec.gpus {
            return Err(CoreError::UnknownNode(node.0));
        }
        let bit = 1u64 << gpu;
        self.st.cluster.update(node, |n| {
            n.forget_refusals();
            if healthy {
                n.healthy |= bit
            } else {
                n.healthy &= !bit
            }
        });
        if !healthy {
            self.st.drop_claims_holding(node, bit);
        }
        Ok(())
    }

    /// GPU-seconds `group` consumed over the lookback as of `now` (decayed for the
    /// half-life model): what `allot share` reports as received.
    pub fn usage_gpu_secs(&self, group: GroupId, now: Time) -> f64 {
        // The ledger charges projects; a team's usage is its projects'.
        self.tree
            .projects()
            .iter()
            .filter(|p| {
                group == GroupId::ROOT || **p == group || self.tree.group(**p).path.contains(&group)
            })
            .map(|p| self.st.ledger.usage(*p, now)[0])
            .sum()
    }

    /// Served ratio of every group as of `now` (usage plus current allocation over
    /// entitlement), indexed by group.
    pub fn group_ratios(&self, now: Time) -> Vec<f64> {
        let r = self.ratios_at(now);
        (0..self.tree.len())
            .map(|i| r.ratio(GroupId(i as u32)))
            .collect()
    }

    /// Ratios from usage and live leases alone (no pass in progress).
    fn ratios_at(&self, now: Time) -> Ratios {
        Ratios::compute(
            &self.cfg,
            &self.tree,
            &self.st.ledger,
            &self.st.cluster,
            now,
            &[],
        )
    }

    /// Whether `project`'s budget for the lookback is spent (new work runs unfunded).
    pub fn budget_spent(&self, project: GroupId, now: Time) -> bool {
        self.st.budget_spent(&self.tree, project, now)
    }

    /// Every pending workload with its reasons, best-ranked project first.
    pub fn explain(&self, now: Time) -> Vec<Explanation> {
        let r = self.ratios_at(now);
        let mut projects: Vec<GroupId> = self.tree.projects().to_vec();
        projects.sort_by(|a, b| r.ratio(*a).total_cmp(&r.ratio(*b)).then(a.cmp(b)));
        let next_lapse = self
            .st
            .protected
            .range((now + 1, LeaseId(0))..)
            .next()
            .map(|x| x.0);
        let protected = self.st.protected.range((now + 1, LeaseId(0))..).count() as u32;
        let mut out = Vec::new();
        for p in projects {
            let team = self.tree.team_of(p);
            let mut cur = self.queues[p.idx()].cursor(now, self.aging());
            while let Some((id, _)) = cur.next(|_| false) {
                let Some(w) = self.st.workloads.get(&id) else {
                    continue;
                };
                let blocked = w
                    .blocked
                    .clone()
                    .unwrap_or_else(|| self.st.present_obstacle(w));
                let mut e = Explanation {
                    workload: id,
                    project: self.tree.group(p).name.clone(),
                    project_ratio: r.ratio(p),
                    team: self.tree.group(team).name.clone(),
                    team_ratio: r.ratio(team),
                    text: String::new(),
                    blocked,
                    protected_leases: protected,
                    next_lapse,
                };
                e.text = e.render(now);
                out.push(e);
            }
        }
        out
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
        }
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
            .process_claims(now, &self.tree, cooldown, &mut d.actions);
        // Ratios look ahead: preemption claimants count as started, leases being
        // revoked as gone. A reservation is not allocation: others still run there.
        let mut claimed_alloc: Vec<(GroupId, [f64; 3])> = self
            .st
            .claims
            .iter()
            .filter(|(_, c)| c.kind == ClaimKind::Preemption)
            .filter_map(|(id, _)| self.st.workloads.get(id))
            .map(|w| (w.project, w.spec.alloc()))
            .collect();
        claimed_alloc.extend(
            self.st
                .leases
                .values()
                .filter(|l| l.revoke.is_some())
                .map(|l| (l.project, neg(l.alloc()))),
        );
        let mut r = Ratios::compute(
            &self.cfg,
            &self.tree,
            &self.st.ledger,
            &self.st.cluster,
            now,
            &claimed_alloc,
        );

        let aging = self.aging();
        let mut pass = Pass::new(&self.cfg, &self.tree, &self.st, now, self.baseline.as_ref());
        pass.run(&self.queues, &mut self.st, &mut r, aging, &mut d);
        let more = pass.cut_short;
        for id in std::mem::take(&mut self.st.dequeue) {
            self.dequeue(id);
        }
        d.next_wakeup = self.st.next_wakeup(now, more);
        d.actions.append(&mut self.st.outbox);
        d
    }
}

/// How long a lease of `w` may not be taken for rebalancing: its min runtime when
/// funded, at least the cooldown if it was preempted (or displaced others) before;
/// unfunded work is always preemptible.
fn protection(w: &Workload, funded: bool, cooldown: u64) -> u64 {
    if !funded {
        return 0;
    }
    let cool = if w.last_preempted.is_some() {
        cooldown
    } else {
        0
    };
    w.spec.min_runtime.max(cool)
}

/// The negation of an allocation.
pub(crate) fn neg(x: [f64; 3]) -> [f64; 3] {
    [-x[0], -x[1], -x[2]]
}

impl State {
    fn finish(&mut self, id: WorkloadId, state: WorkloadState) {
        if let Some(w) = self.workloads.get_mut(&id) {
            w.state = state;
            w.lease = None;
            let g = u64::from(w.spec.total_gpus());
            self.demand[w.project.idx()] -= g.min(self.demand[w.project.idx()]);
        }
    }

    /// Why a workload no pass has looked at yet cannot start, from the cluster as it is.
    fn present_obstacle(&self, w: &Workload) -> Blocked {
        let s = &w.spec;
        if s.nodes > 1 && self.cluster.most_whole_free() < s.nodes {
            Blocked::NoWholeNodes {
                need: s.nodes,
                free: self.cluster.most_whole_free(),
            }
        } else if s.nodes == 1 && self.cluster.largest_free_block() < s.gpus_per_node {
            Blocked::NoFit {
                need: s.gpus_per_node,
                largest_free: self.cluster.largest_free_block(),
            }
        } else {
            Blocked::NotReached
        }
    }

    fn budget_spent(&self, tree: &OrgTree, project: GroupId, now: Time) -> bool {
        let used = self.ledger.usage(project, now)[Channel::FundedGpu as usize];
        let budget = tree.group(project).share
            * self.cluster.total_gpus() as f64
            * self.ledger.model().effective_secs();
        used >= budget
    }

    /// Funded leases whose protection lapsed become preemption candidates.
    fn lapse_protection(&mut self, now: Time) {
        while let Some(&(t, lid)) = self.protected.first() {
            if t > now {
                break;
            }
            self.protected.pop_first();
            if let Some(l) = self.leases.get(&lid) {
                if l.revoke.is_none() {
                    for p in l.placement.clone() {
                        self.cluster.update(p.node, |n| n.soft |= p.gpus);
                    }
                }
            }
        }
    }

    fn next_wakeup(&self, now: Time, more: bool) -> Option<Time> {
        if self.pending == 0 {
            return None;
        }
        let mut t = self
            .protected
            .range((now + 1, LeaseId(0))..)
            .next()
            .map(|x| x.0);
        for c in self.claims.values() {
            if let ClaimKind::Reservation { start } = c.kind {
                if start > now {
                    t = Some(t.map_or(start, |x| x.min(start)));
                }
            }
        }
        if more {
            t = Some(now + 1);
        }
        t
    }

    #[allow(clippy::too_many_arguments)]
    fn start_lease(
        &mut self,
        now: Time,
        cooldown: u64,
        id: WorkloadId,
        placement: Vec<NodeGpus>,
        funded: bool,
        backfill_for: Option<WorkloadId>,
        why: StartWhy,
    ) -> Action {
        let lid = LeaseId(self.next_lease);
        self.next_lease += 1;
        let w = self
            .workloads
            .get_mut(&id)
            .expect("started workloads exist");
        let s = &w.spec;
        let hold = protection(w, funded, cooldown);
        let preemptible_at = if funded && self.protect_forever {
            Time::MAX
        } else {
            now.saturating_add(hold)
        };
        let gpus: u32 = placement.iter().map(|p| p.gpus.count_ones()).sum();
        let (cpu, mem) = (s.cpu_per_node, s.mem_per_node_gb);
        for p in &placement {
            let soft = if preemptible_at <= now { p.gpus } else { 0 };
            self.cluster.update(p.node, |n| {
                n.used |= p.gpus;
                n.soft |= soft;
                n.cpu_used += cpu;
                n.mem_used += mem;
            });
            self.node_leases[p.node.idx()].push(lid);
        }
        let nodes = placement.len() as i64;
        self.ledger.add_rate(
            w.project,
            now,
            [
                i64::from(gpus),
                i64::from(cpu) * nodes,
                i64::from(mem) * nodes,
                if funded { i64::from(gpus) } else { 0 },
            ],
        );
        if preemptible_at > now && preemptible_at != Time::MAX {
            self.protected.insert((preemptible_at, lid));
        }
        w.state = WorkloadState::Running;
        w.lease = Some(lid);
        w.first_start.get_or_insert(now);
        w.blocked = None;
        self.dequeue.push(id);
        let lease = Lease {
            id: lid,
            workload: id,
            project: w.project,
            placement: placement.clone(),
            gpus,
            cpu_per_node: cpu,
            mem_per_node: mem,
            start: now,
            protected_until: now.saturating_add(s.min_runtime),
            preemptible_at,
            funded,
            revoke: None,
            backfill_for,
        };
        self.leases.insert(lid, lease);
        Action::Start {
            lease: lid,
            workload: id,
            placement,
            funded,
            why,
        }
    }

    fn release(&mut self, now: Time, lid: LeaseId) -> Option<Lease> {
        let l = self.leases.remove(&lid)?;
        let nodes = l.placement.len() as u32;
        for p in &l.placement {
            self.cluster.update(p.node, |n| {
                n.used &= !p.gpus;
                n.soft &= !p.gpus;
                n.cpu_used -= l.cpu_per_node.min(n.cpu_used);
                n.mem_used -= l.mem_per_node.min(n.mem_used);
                n.forget_refusals();
            });
            self.node_leases[p.node.idx()].retain(|x| *x != lid);
        }
        self.ledger.add_rate(
            l.project,
            now,
            [
                -i64::from(l.gpus),
                -i64::from(l.cpu_per_node * nodes),
                -i64::from(l.mem_per_node * nodes),
                if l.funded { -i64::from(l.gpus) } else { 0 },
            ],
        );
        self.protected.remove(&(l.preemptible_at, lid));
        Some(l)
    }

    /// Takes back a revocation that has not come due: the lease is preemptible again
    /// only if its protection has lapsed.
    fn withdraw(&mut self, now: Time, lid: LeaseId) {
        let Some(l) = self.leases.get_mut(&lid) else {
            return;
        };
        l.revoke = None;
        let (workload, placement, lapsed) =
            (l.workload, l.placement.clone(), l.preemptible_at <= now);
        if lapsed {
            for p in placement {
                self.cluster.update(p.node, |n| n.soft |= p.gpus);
            }
        }
        self.outbox.push(Action::Withdraw {
            lease: lid,
            workload,
        });
    }

    fn revoke_at(&mut self, lid: LeaseId, not_before: Time, why: RevokeWhy) {
        let Some(l) = self.leases.get_mut(&lid) else {
            return;
        };
        l.revoke = Some(Revocation {
            not_before,
            why: why.clone(),
        });
        let (workload, placement) = (l.workload, l.placement.clone());
        for p in placement {
            self.cluster.update(p.node, |n| n.soft &= !p.gpus);
        }
        self.outbox.push(Action::Revoke {
            lease: lid,
            workload,
            not_before,
            why,
        });
    }

    /// True while a lease holding some of the claim's GPUs is still being revoked.
    fn victims_pending(&self, claim: &Claim) -> bool {
        claim.nodes.iter().any(|p| {
            self.node_leases[p.node.idx()].iter().any(|lid| {
                self.leases.get(lid).is_some_and(|l| {
                    l.revoke.is_some()
                        && l.placement
                            .iter()
                            .any(|x| x.node == p.node && x.gpus & p.gpus != 0)
                })
            })
        })
    }

    fn drop_claim(&mut self, id: WorkloadId) {
        if let Some(c) = self.claims.remove(&id) {
            for p in c.nodes {
                self.cluster.update(p.node, |n| {
                    n.claimed &= !p.gpus;
                    n.claimed_cpu -= c.cpu_per_node.min(n.claimed_cpu);
                    n.claimed_mem -= c.mem_per_node.min(n.claimed_mem);
                });
            }
        }
    }

    fn drop_claims_on(&mut self, node: NodeId) {
        self.drop_claims_holding(node, u64::MAX);
    }

    /// Drops the claims that hold any of `gpus` on `node`.
    fn drop_claims_holding(&mut self, node: NodeId, gpus: u64) {
        let ids: Vec<WorkloadId> = self
            .claims
            .iter()
            .filter(|(_, c)| c.nodes.iter().any(|p| p.node == node && p.gpus & gpus != 0))
            .map(|(id, _)| *id)
            .collect();
        for id in ids {
            self.drop_claim(id);
        }
    }

    fn add_claim(&mut self, id: WorkloadId, claim: Claim) {
        for p in &claim.nodes {
            self.cluster.update(p.node, |n| {
                n.claimed |= p.gpus;
                n.claimed_cpu += claim.cpu_per_node;
                n.claimed_mem += claim.mem_per_node;
            });
        }
        self.claims.insert(id, claim);
    }

    /// Starts claimants whose GPUs are free; a reservation whose start has come
    /// reclaims its nodes.
    fn process_claims(&mut self, now: Time, tree: &OrgTree, cooldown: u64, out: &mut Vec<Action>) {
        let ids: Vec<WorkloadId> = self.claims.keys().copied().collect();
        for id in ids {
            let Some(claim) = self.claims.get(&id).cloned() else {
                continue;
            };
            let Some(w) = self.workloads.get(&id) else {
                self.drop_claim(id);
                continue;
            };
            if w.state != WorkloadState::Pending {
                self.drop_claim(id);
                continue;
            }
            let (g, cpu, mem) = (
                w.spec.gpus_per_node,
                w.spec.cpu_per_node,
                w.spec.mem_per_node_gb,
            );
            let project = w.project;
            let funded = w.spec.min_runtime > 0
                && (self.protect_forever || !self.budget_spent(tree, project, now));
            let usable = claim.nodes.iter().all(|p| {
                let n = self.cluster.node(p.node);
                n.state == NodeState::Ready && (p.gpus & n.healthy).count_ones() >= g && n.offers(g)
            });
            if !usable {
                self.drop_claim(id);
                continue;
            }
            let ready = claim.nodes.iter().all(|p| {
                let n = self.cluster.node(p.node);
                // Its own claim already sets its host share aside.
                (p.gpus & n.healthy & !n.used).count_ones() >= g
                    && n.fits_host(
                        cpu.saturating_sub(claim.cpu_per_node),
                        mem.saturating_sub(claim.mem_per_node),
                    )
            });
            if ready {
                let placement: Vec<NodeGpus> = claim
                    .nodes
                    .iter()
                    .map(|p| {
                        let n = self.cluster.node(p.node);
                        NodeGpus {
                            node: p.node,
                            gpus: lowest_bits(p.gpus & n.healthy & !n.used, g),
                        }
                    })
                    .collect();
                self.drop_claim(id);
                let why = match claim.kind {
                    ClaimKind::Preemption => StartWhy::AfterPreemption,
                    ClaimKind::Reservation { .. } => StartWhy::Reservation,
                };
                if claim.kind == ClaimKind::Preemption {
                    // It displaced work: protect it for the cooldown as well, so the
                    // victim cannot take the GPUs straight back.
                    if let Some(w) = self.workloads.get_mut(&id) {
                        w.last_preempted.get_or_insert(now);
                    }
                }
                out.push(self.start_lease(now, cooldown, id, placement, funded, None, why));
                continue;
            }
            if claim.kind == ClaimKind::Preemption && !self.victims_pending(&claim) {
                // Victims are gone yet the claim cannot start (host room taken, say):
                // give the GPUs back and let the next pass plan afresh.
                self.drop_claim(id);
                continue;
            }
            if let ClaimKind::Reservation { start } = claim.kind {
                if now >= start {
                    for p in &claim.nodes {
                        for lid in self.node_leases[p.node.idx()].clone() {
                            let Some(l) = self.leases.get(&lid) else {
                                continue;
                            };
                            let soft = l.placement.iter().any(|x| {
                                x.node == p.node && self.cluster.node(x.node).soft & x.gpus != 0
                            });
                            if l.revoke.is_none() && (soft || l.backfill_for == Some(id)) {
                                self.revoke_at(lid, now, RevokeWhy::Reservation { by: id });
                            }
                        }
                    }
                }
            }
        }
    }
}

/// One ranking pass: pick the best-ranked project, its best workload, try to start
/// it (free GPUs, then backfill, then preemption, then a reservation), repeat.
struct Pass<'c> {
    baseline: Option<&'c Baseline>,
    team_protected: Vec<u64>,
    cap_dead: BTreeSet<(GroupId, Shape)>,
    cfg: &'c PolicyConfig,
    tree: &'c OrgTree,
    now: Time,
    active_children: Vec<u32>,
    project_active: Vec<bool>,
    budget_ok: Vec<Option<bool>>,
    free_dead: BTreeSet<Shape>,
    preempt_dead: BTreeSet<(GroupId, Shape)>,
    reserve_dead: BTreeSet<(GroupId, Shape)>,
    backfill_dead: BTreeSet<(GroupId, Shape)>,
    plans_left: u32,
    examined: u32,
    cut_short: bool,
}

impl<'c> Pass<'c> {
    fn new(
        cfg: &'c PolicyConfig,
        tree: &'c OrgTree,
        st: &State,
        now: Time,
        baseline: Option<&'c Baseline>,
    ) -> Self {
        let mut team_protected = vec![0; tree.len()];
        if baseline.is_some() {
            for &p in tree.projects() {
                team_protected[tree.team_of(p).idx()] +=
                    st.ledger.rate(p)[Channel::FundedGpu as usize];
            }
        }
        Pass {
            baseline,
            team_protected,
            cap_dead: BTreeSet::new(),
            cfg,
            tree,
            now,
            active_children: vec![0; tree.len()],
            project_active: vec![false; tree.len()],
            budget_ok: vec![None; tree.len()],
            free_dead: BTreeSet::new(),
            preempt_dead: BTreeSet::new(),
            reserve_dead: BTreeSet::new(),
            backfill_dead: BTreeSet::new(),
            plans_left: cfg.max_preemption_plans,
            examined: 0,
            cut_short: false,
        }
    }

    fn activate(&mut self, p: GroupId) {
        self.project_active[p.idx()] = true;
        let mut g = p;
        while let Some(parent) = self.tree.group(g).parent {
            self.active_children[parent.idx()] += 1;
            if self.active_children[parent.idx()] > 1 {
                break;
            }
            g = parent;
        }
    }

    fn deactivate(&mut self, p: GroupId) {
        self.project_active[p.idx()] = false;
        let mut g = p;
        while let Some(parent) = self.tree.group(g).parent {
            self.active_children[parent.idx()] -= 1;
            if self.active_children[parent.idx()] > 0 {
                break;
            }
            g = parent;
        }
    }

    fn is_active(&self, g: GroupId) -> bool {
        if self.tree.is_project(g) {
            self.project_active[g.idx()]
        } else {
            self.active_children[g.idx()] > 0
        }
    }

    /// Descends from the root to the lowest-ratio project with work left.
    fn pick(&self, r: &Ratios) -> Option<GroupId> {
        let mut g = GroupId::ROOT;
        while !self.tree.is_project(g) {
            let best = self
                .tree
                .group(g)
                .children
                .iter()
                .copied()
                .filter(|&c| self.is_active(c))
                .min_by(|a, b| r.ratio(*a).total_cmp(&r.ratio(*b)).then(a.cmp(b)))?;
            g = best;
        }
        Some(g)
    }

    /// Starts a lease for `id` (of project `p`) and charges it within the pass.
    #[allow(clippy::too_many_arguments)]
    fn launch(
        &mut self,
        st: &mut State,
        r: &mut Ratios,
        d: &mut Decisions,
        (id, p, funded): (WorkloadId, GroupId, bool),
        placement: Vec<NodeGpus>,
        backfill_for: Option<WorkloadId>,
        why: StartWhy,
    ) {
        let alloc = st
            .workloads
            .get(&id)
            .map(|w| w.spec.alloc())
            .unwrap_or_default();
        let lease = st.start_lease(
            self.now,
            self.cfg.cooldown,
            id,
            placement,
            funded,
            backfill_for,
            why,
        );
        d.actions.push(lease);
        self.charge(r, p, funded, &alloc);
    }

    /// Counts work placed (or claimed) in this pass: in the ratios at once, and
    /// against the team's cap under the baseline.
    fn charge(&mut self, r: &mut Ratios, p: GroupId, funded: bool, alloc: &[f64; 3]) {
        r.add(self.tree, p, *alloc);
        if funded {
            self.team_protected[self.tree.team_of(p).idx()] += alloc[0] as u64;
        }
    }

    /// Baseline order: the project whose best workload has the highest priority, then
    /// the earliest submit time, across the whole cluster.
    fn pick_by_priority<'q>(
        &self,
        cursors: &mut [Option<crate::queue::Cursor<'q>>],
        queues: &'q [ProjectQueue],
        aging: Aging,
    ) -> Option<GroupId> {
        type Key = (i64, std::cmp::Reverse<Time>, std::cmp::Reverse<WorkloadId>);
        let mut best: Option<(Key, GroupId)> = None;
        for &p in self.tree.projects() {
            if !self.project_active[p.idx()] {
                continue;
            }
            let c = cursors[p.idx()].get_or_insert_with(|| queues[p.idx()].cursor(self.now, aging));
            let key = match c.peek() {
                Some((eff, submit, id)) => (eff, std::cmp::Reverse(submit), std::cmp::Reverse(id)),
                None => (
                    i64::MIN,
                    std::cmp::Reverse(0),
                    std::cmp::Reverse(WorkloadId(0)),
                ),
            };
            if best.as_ref().is_none_or(|b| key > b.0) {
                best = Some((key, p));
            }
        }
        best.map(|b| b.1)
    }

    fn funded(&mut self, st: &State, p: GroupId, shape: &Shape) -> bool {
        if !shape.protected {
            return false;
        }
        if self.baseline.is_some() {
            return true;
        }
        let now = self.now;
        let tree = self.tree;
        !*self.budget_ok[p.idx()].get_or_insert_with(|| st.budget_spent(tree, p, now))
    }

    fn run(
        &mut self,
        queues: &[ProjectQueue],
        st: &mut State,
        r: &mut Ratios,
        aging: Aging,
        d: &mut Decisions,
    ) {
        let mut cursors: Vec<Option<crate::queue::Cursor<'_>>> =
            (0..self.tree.len()).map(|_| None).collect();
        for &p in self.tree.projects() {
            if !queues[p.idx()].is_empty() {
                self.activate(p);
            }
        }
        let reservations_before = st
            .claims
            .values()
            .filter(|c| matches!(c.kind, ClaimKind::Reservation { .. }))
            .count() as u32;
        let mut reservations = reservations_before;
        let mut backfill_cap = backfill_capacity(st, self.now);
        loop {
            let can_reserve = reservations < self.cfg.max_reservations
                && st.pending_gangs > reservations as usize;
            let can_preempt = self.plans_left > 0 && st.cluster.largest_clearable_block() > 0;
            if st.cluster.free_total() == 0 && !can_preempt && backfill_cap == 0 && !can_reserve {
                break;
            }
            let picked = if self.baseline.is_some() {
                self.pick_by_priority(&mut cursors, queues, aging)
            } else {
                self.pick(r)
            };
            let Some(p) = picked else { break };
            let cursor =
                cursors[p.idx()].get_or_insert_with(|| queues[p.idx()].cursor(self.now, aging));
            let largest_free = st.cluster.largest_free_block();
            let most_whole = st.cluster.most_whole_free();
            let dead = |s: &Shape| {
                let no_free = self.free_dead.contains(s)
                    || (s.nodes == 1 && s.gpus > largest_free)
                    || (s.nodes > 1 && s.nodes > most_whole);
                let no_backfill =
                    s.nodes > 1 || s.gpus > backfill_cap || self.backfill_dead.contains(&(p, *s));
                let no_preempt = !s.protected
                    || !can_preempt
                    || self.preempt_dead.contains(&(p, *s))
                    || self.budget_ok[p.idx()] == Some(true);
                let no_reserve = s.nodes == 1
                    || !s.protected
                    || !can_reserve
                    || self.reserve_dead.contains(&(p, *s));
                self.cap_dead.contains(&(p, *s))
                    || (no_free && no_backfill && no_preempt && no_reserve)
            };
            let Some((id, shape)) = cursor.next(dead) else {
                self.deactivate(p);
                continue;
            };
            if self.examined >= self.cfg.max_examined {
                self.cut_short = true;
                break;
            }
            self.examined += 1;
            let Some(w) = st.workloads.get(&id) else {
                continue;
            };
            if w.state != WorkloadState::Pending {
                continue;
            }
            let reserved = match st.claims.get(&id).map(|c| c.kind) {
                Some(ClaimKind::Preemption) => {
                    if let Some(w) = st.workloads.get_mut(&id) {
                        w.blocked = Some(Blocked::WaitingForVictims);
                    }
                    continue;
                }
                Some(ClaimKind::Reservation { start }) => Some(start),
                None => None,
            };
            let funded = self.funded(st, p, &shape);
            let spec_alloc = w.spec.alloc();
            let ratio_before = r.ratio(p);
            let team = self.tree.team_of(p);
            if let (Some(b), true) = (self.baseline, funded) {
                let cap = b.team_caps.get(team.idx()).copied().unwrap_or(0);
                if self.team_protected[team.idx()] + u64::from(w.spec.total_gpus()) > cap {
                    self.cap_dead.insert((p, shape));
                    if let Some(w) = st.workloads.get_mut(&id) {
                        w.blocked = Some(Blocked::OverCap { cap });
                    }
                    continue;
                }
            }

            // 1. Free GPUs (for a gang holding a reservation too: whole nodes may
            // have come free elsewhere before it starts).
            if !self.free_dead.contains(&shape) {
                if let Some(placement) = free_placement(&st.cluster, &shape) {
                    if reserved.is_some() {
                        st.drop_claim(id);
                        reservations = reservations.saturating_sub(1);
                        backfill_cap = backfill_capacity(st, self.now);
                    }
                    let why = StartWhy::Free {
                        rank: self.examined,
                        ratio: ratio_before,
                    };
                    self.launch(st, r, d, (id, p, funded), placement, None, why);
                    continue;
                }
                self.free_dead.insert(shape);
            }
            if let Some(start) = reserved {
                if let Some(w) = st.workloads.get_mut(&id) {
                    w.blocked = Some(Blocked::Reserved { start });
                }
                continue;
            }
            // 2. Backfill on reserved nodes, if it will be out of the way in time.
            if shape.nodes == 1 && shape.gpus <= backfill_cap {
                if let Some((holder, start, placement)) =
                    backfill_placement(st, &shape, id, funded, self.now, self.cfg.cooldown)
                {
                    let why = StartWhy::Backfill {
                        reservation_of: holder,
                        starts: start,
                    };
                    self.launch(st, r, d, (id, p, funded), placement, Some(holder), why);
                    backfill_cap = backfill_capacity(st, self.now);
                    continue;
                }
            }
            if shape.nodes == 1 && shape.gpus <= backfill_cap {
                // Same shape and contract, same project: later ones leave no sooner,
                // so stop trying them this pass.
                self.backfill_dead.insert((p, shape));
            }
            // 3. Preemption.
            let mut blocked = if !funded && shape.protected {
                Blocked::Unfunded
            } else if shape.nodes > 1 {
                Blocked::NoWholeNodes {
                    need: shape.nodes,
                    free: st.cluster.most_whole_free(),
                }
            } else {
                Blocked::NoFit {
                    need: shape.gpus,
                    largest_free: st.cluster.largest_free_block(),
                }
            };
            if funded && self.plans_left > 0 && !self.preempt_dead.contains(&(p, shape)) {
                self.plans_left -= 1;
                match crate::preempt::plan(st, self.tree, r, self.cfg, self.now, id, p, &shape) {
                    Some(plan) => {
                        for v in &plan.victims {
                            if let Some(l) = st.leases.get(&v.lease) {
                                r.add(self.tree, l.project, neg(l.alloc()));
                                if let (true, Some((gr, gv))) =
                                    (l.funded, self.tree.diverging(p, l.project))
                                {
                                    st.recent.push((self.now, gr, gv));
                                }
                            }
                            st.revoke_at(v.lease, self.now, v.why.clone());
                        }
                        st.add_claim(
                            id,
                            Claim {
                                kind: ClaimKind::Preemption,
                                nodes: plan.claim,
                                cpu_per_node: shape.cpu,
                                mem_per_node: shape.mem,
                            },
                        );
                        self.charge(r, p, funded, &spec_alloc);
                        if let Some(w) = st.workloads.get_mut(&id) {
                            w.blocked = Some(Blocked::WaitingForVictims);
                        }
                        continue;
                    }
                    None => {
                        self.preempt_dead.insert((p, shape));
                        blocked = Blocked::NothingPreemptible;
                    }
                }
            } else if funded && self.plans_left == 0 {
                self.cut_short = true;
            }
            // 4. Reservation for a gang that cannot start.
            if shape.nodes > 1
                && funded
                && reservations < self.cfg.max_reservations
                && !self.reserve_dead.contains(&(p, shape))
            {
                match crate::preempt::reserve(st, self.now, &shape) {
                    Some((nodes, start)) => {
                        let claim_nodes: Vec<NodeGpus> = nodes
                            .iter()
                            .map(|&n| NodeGpus {
                                node: n,
                                gpus: st.cluster.node(n).all(),
                            })
                            .collect();
                        st.add_claim(
                            id,
                            Claim {
                                kind: ClaimKind::Reservation { start },
                                nodes: claim_nodes,
                                cpu_per_node: 0,
                                mem_per_node: 0,
                            },
                        );
                        reservations += 1;
                        backfill_cap = backfill_capacity(st, self.now);
                        d.actions.push(Action::Reserve {
                            workload: id,
                            nodes,
                            start,
                        });
                        blocked = Blocked::Reserved { start };
                    }
                    None => {
                        self.reserve_dead.insert((p, shape));
                    }
                }
            }
            if let Some(w) = st.workloads.get_mut(&id) {
                w.blocked = Some(blocked);
            }
        }
        d.examined = self.examined;
    }
}

/// Where `shape` fits on free GPUs: best fit for one node, whole nodes for a gang.
fn free_placement(c: &Cluster, s: &Shape) -> Option<Vec<NodeGpus>> {
    if s.nodes == 1 {
        if s.gpus > c.largest_free_block() {
            return None;
        }
        let n = c.best_fit(s.gpus, s.cpu, s.mem)?;
        Some(vec![NodeGpus {
            node: n,
            gpus: lowest_bits(c.node(n).free(), s.gpus),
        }])
    } else {
        let nodes = c.whole_nodes(s.nodes, s.gpus, s.cpu, s.mem)?;
        Some(
            nodes
                .into_iter()
                .map(|n| NodeGpus {
                    node: n,
                    gpus: lowest_bits(c.node(n).free(), s.gpus),
                })
                .collect(),
        )
    }
}

/// The most GPUs free on one reserved node whose reservation has not started.
fn backfill_capacity(st: &State, now: Time) -> u32 {
    st.claims
        .values()
        .filter(|c| matches!(c.kind, ClaimKind::Reservation { start } if start > now))
        .flat_map(|c| c.nodes.iter())
        .map(|p| {
            let n = st.cluster.node(p.node);
            if n.state == NodeState::Ready {
                (n.healthy & !n.used).count_ones()
            } else {
                0
            }
        })
        .max()
        .unwrap_or(0)
}

/// A reserved node that `id` can use and leave (finish or become preemptible)
/// before the reservation starts; best fit among them.
fn backfill_placement(
    st: &State,
    s: &Shape,
    id: WorkloadId,
    funded: bool,
    now: Time,
    cooldown: u64,
) -> Option<(WorkloadId, Time, Vec<NodeGpus>)> {
    let w = st.workloads.get(&id)?;
    let hold = protection(w, funded, cooldown);
    let mut best: Option<(u32, WorkloadId, Time, NodeId)> = None;
    for (holder, c) in &st.claims {
        let ClaimKind::Reservation { start } = c.kind else {
            continue;
        };
        let leaves_in_time = now.saturating_add(hold) <= start
            || w.spec
                .time_limit
                .is_some_and(|tl| now.saturating_add(tl) <= start);
        if start <= now || !leaves_in_time {
            continue;
        }
        for p in &c.nodes {
            let n = st.cluster.node(p.node);
            let avail = if n.state == NodeState::Ready {
                (n.healthy & !n.used).count_ones()
            } else {
                0
            };
            if avail >= s.gpus && n.takes(s.gpus, s.cpu, s.mem) && best.is_none_or(|b| avail < b.0)
            {
                best = Some((avail, *holder, start, p.node));
            }
        }
    }
    let (_, holder, start, node) = best?;
    let n = st.cluster.node(node);
    Some((
        holder,
        start,
        vec![NodeGpus {
            node,
            gpus: lowest_bits(n.healthy & !n.used, s.gpus),
        }],
    ))
}

// Accessors the planner needs without exposing the state type.
pub(crate) mod access {
    use super::*;

    /// Read-only view for the preemption planner.
    pub(crate) trait View {
        fn cluster(&self) -> &Cluster;
        fn lease(&self, id: LeaseId) -> Option<&Lease>;
        fn node_leases(&self, n: NodeId) -> &[LeaseId];
        fn recent_preemptions(&self) -> &[(Time, GroupId, GroupId)];
    }
}

impl access::View for State {
    fn cluster(&self) -> &Cluster {
        &self.cluster
    }
    fn lease(&self, id: LeaseId) -> Option<&Lease> {
        self.leases.get(&id)
    }
    fn node_leases(&self, n: NodeId) -> &[LeaseId] {
        &self.node_leases[n.idx()]
    }
    fn recent_preemptions(&self) -> &[(Time, GroupId, GroupId)] {
        &self.recent
    }
}
