//! What a snapshot keeps of the core: facts only (workloads, leases, the usage
//! ledger, node states, weights, recent preemptions, the id counters), never the
//! structures derived from them, so that a change to those never breaks an
//! upgrade. [`Scheduler::from_facts`] rebuilds queues, fit indexes and protection
//! from the facts; claims and reservations are not kept and the next pass plans
//! them afresh. [`Scheduler::replay`] applies decisions a pass made (as journaled)
//! without running the policy again, so a journal written by one release means the
//! same leases to the next.

use super::*;
use crate::cluster::GpuMask;
use crate::ledger::ProjectLedger;
use serde::{Deserialize, Serialize};

/// The core's state as facts (serde defaults throughout: an older snapshot reads).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Facts {
    /// Every group's weight in force, by name (a manager may have changed it).
    pub weights: Vec<(String, f64)>,
    /// Nodes in id order.
    pub nodes: Vec<NodeFacts>,
    /// Workloads in id order.
    pub workloads: Vec<WorkloadFacts>,
    /// Live leases in id order.
    pub leases: Vec<LeaseFacts>,
    /// The usage ledger, by group name.
    pub usage: Vec<(String, ProjectLedger)>,
    /// The ranking's own ledger (`ranking_lookback`), by group name; empty when the
    /// ratios read `usage`.
    pub ranking_usage: Vec<(String, ProjectLedger)>,
    /// Funded preemptions within the cooldown: (when, requester side, victim side).
    pub recent: Vec<(Time, String, String)>,
    /// The next workload id.
    pub next_workload: u64,
    /// The next lease id.
    pub next_lease: u64,
    /// The latest time the core has seen.
    pub last_now: Time,
    /// When the ledger first recorded usage (the covered part of the window starts
    /// there); absent from older snapshots, read then as "the whole window".
    pub usage_since: Option<Time>,
    /// Ended leases' parts still running on their hosts (absent from older
    /// snapshots: none).
    pub leaving: Vec<(LeaseId, Leaving)>,
    /// The last run lengths of each user and class (absent from older snapshots:
    /// none learnt; the journal after the snapshot teaches them again).
    pub run_lengths: Vec<crate::runlength::RunLengthFacts>,
}

impl Default for Facts {
    fn default() -> Self {
        Facts {
            weights: Vec::new(),
            nodes: Vec::new(),
            workloads: Vec::new(),
            leases: Vec::new(),
            usage: Vec::new(),
            ranking_usage: Vec::new(),
            recent: Vec::new(),
            next_workload: 1,
            next_lease: 1,
            last_now: 0,
            usage_since: None,
            leaving: Vec::new(),
            run_lengths: Vec::new(),
        }
    }
}

/// One node: its spec and what the core decides by.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NodeFacts {
    /// Its spec.
    pub spec: NodeSpec,
    /// Scheduling state.
    pub state: NodeState,
    /// Healthy GPUs.
    pub healthy: GpuMask,
    /// Removed by an operator: its id is kept, it counts nowhere (absent from older
    /// snapshots: none was).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub removed: bool,
}

/// One workload.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WorkloadFacts {
    /// Id.
    pub id: WorkloadId,
    /// The request.
    pub spec: WorkloadSpec,
    /// Submitted.
    pub submit: Time,
    /// Where it is in its life.
    pub state: WorkloadState,
    /// First start, if any.
    #[serde(default)]
    pub first_start: Option<Time>,
    /// Times preempted.
    #[serde(default)]
    pub preemptions: u32,
    /// Last preempted (or last displaced others).
    #[serde(default)]
    pub last_preempted: Option<Time>,
    /// Kept out of its queue by the shell (absent from older snapshots: none was).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub held: bool,
}

/// One live lease.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LeaseFacts {
    /// Id.
    pub id: LeaseId,
    /// Its workload.
    pub workload: WorkloadId,
    /// Where.
    pub placement: Vec<NodeGpus>,
    /// Started.
    pub start: Time,
    /// Min-runtime lapse.
    pub protected_until: Time,
    /// When it may be taken for rebalancing.
    pub preemptible_at: Time,
    /// Charged to the budget.
    pub funded: bool,
    /// A revocation in progress: not before, why.
    #[serde(default)]
    pub revoke: Option<(Time, RevokeWhy)>,
    /// The reservation it backfills.
    #[serde(default)]
    pub backfill_for: Option<WorkloadId>,
    /// Funded by its user's allowance rather than the project's budget.
    #[serde(default)]
    pub allowance: bool,
    /// Its weighted GPUs in thousandths (absent from snapshots before GPU weights:
    /// its GPUs at weight 1, as the ledger it charged counted them).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weighted: Option<u64>,
    /// Its use as last reported, for a class protected by use (absent from older
    /// snapshots: none reported). `preemptible_at` already holds what it decided.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub used: Option<LeaseUse>,
}

/// Puts `records` back into `ledger`, dropping groups `tree` no longer has.
fn restore_records(tree: &OrgTree, ledger: &mut Ledger, records: &[(String, ProjectLedger)]) {
    for (name, p) in records {
        if let Some(g) = tree.find(name) {
            ledger.restore(g, p.clone());
        }
    }
}

impl Scheduler {
    /// The core's facts, for a snapshot.
    pub fn facts(&self) -> Facts {
        let name = |g: GroupId| self.tree.group(g).name.clone();
        Facts {
            weights: self
                .tree
                .groups()
                .filter(|(g, _)| g.idx() != 0)
                .map(|(_, grp)| (grp.name.clone(), grp.weight))
                .collect(),
            nodes: self
                .st
                .cluster
                .nodes()
                .map(|(_, n)| NodeFacts {
                    spec: n.spec.clone(),
                    state: n.state,
                    healthy: n.healthy,
                    removed: n.removed,
                })
                .collect(),
            workloads: self
                .st
                .workloads
                .values()
                .map(|w| WorkloadFacts {
                    id: w.id,
                    spec: w.spec.clone(),
                    submit: w.submit,
                    state: w.state,
                    first_start: w.first_start,
                    preemptions: w.preemptions,
                    last_preempted: w.last_preempted,
                    held: w.held,
                })
                .collect(),
            leases: self
                .st
                .leases
                .values()
                .map(|l| LeaseFacts {
                    id: l.id,
                    workload: l.workload,
                    placement: l.placement.clone(),
                    start: l.start,
                    protected_until: l.protected_until,
                    preemptible_at: l.preemptible_at,
                    funded: l.funded,
                    revoke: l.revoke.as_ref().map(|r| (r.not_before, r.why.clone())),
                    backfill_for: l.backfill_for,
                    allowance: l.allowance.is_some(),
                    weighted: Some(l.weighted),
                    used: l.used,
                })
                .collect(),
            usage: self.usage_records(&self.st.ledger),
            ranking_usage: self
                .st
                .ranking
                .as_ref()
                .map(|l| self.usage_records(l))
                .unwrap_or_default(),
            recent: self
                .st
                .recent
                .iter()
                .map(|(t, a, b)| (*t, name(*a), name(*b)))
                .collect(),
            next_workload: self.st.next_workload,
            next_lease: self.st.next_lease,
            last_now: self.st.last_now,
            usage_since: self.st.ledger.since(),
            leaving: self
                .st
                .leaving
                .iter()
                .map(|(id, l)| (*id, l.clone()))
                .collect(),
            run_lengths: self.st.run_lengths.facts(),
        }
    }

    /// A ledger's non-empty records by group name.
    fn usage_records(&self, ledger: &Ledger) -> Vec<(String, ProjectLedger)> {
        self.tree
            .groups()
            .map(|(g, grp)| (grp.name.clone(), ledger.project(g).clone()))
            .filter(|(_, p)| *p != ProjectLedger::default())
            .collect()
    }

    /// Rebuilds a scheduler from its facts under `cfg` and `tree` (today's config):
    /// queues, fit indexes, host shares and protection are derived again. Weights,
    /// usage and preemption edges of groups the tree no longer has are dropped, as
    /// are finished workloads of removed projects; a live workload of a removed
    /// project is refused, naming it.
    pub fn from_facts(cfg: PolicyConfig, tree: OrgTree, f: &Facts) -> Result<Self, CoreError> {
        let mut s = Scheduler::new(cfg, tree, Vec::new())?;
        for (i, n) in f.nodes.iter().enumerate() {
            // One at a time, so that a removed node's name may be taken by a later one.
            let id = s.st.cluster.add(n.spec.clone())?;
            s.st.node_leases.push(Vec::new());
            if n.removed {
                s.st.cluster.remove(id)?;
            }
            debug_assert_eq!(id.idx(), i);
        }
        for (name, w) in &f.weights {
            if s.tree.find(name).is_some() {
                s.set_weight(name, *w)?;
            }
        }
        for (i, n) in f.nodes.iter().enumerate().filter(|(_, n)| !n.removed) {
            let (state, healthy) = (n.state, n.healthy);
            s.st.cluster.update(NodeId(i as u32), |x| {
                x.state = state;
                x.healthy = healthy & x.all();
            });
        }
        restore_records(&s.tree, &mut s.st.ledger, &f.usage);
        // An older snapshot with usage does not say since when: the whole window.
        let since = f.usage_since.or((!f.usage.is_empty()).then_some(0));
        s.st.ledger.set_since(since);
        if let Some(ranking) = &mut s.st.ranking {
            // A snapshot kept without the ranking's ledger (the setting is new, or was
            // off): its memory starts from the budget's.
            let records = if f.ranking_usage.is_empty() {
                &f.usage
            } else {
                &f.ranking_usage
            };
            restore_records(&s.tree, ranking, records);
            ranking.set_since(since);
        }
        for w in &f.workloads {
            let project = s
                .tree
                .find(&w.spec.project)
                .filter(|&g| s.tree.is_project(g));
            let Some(project) = project else {
                if w.state.is_final() {
                    continue;
                }
                return Err(CoreError::UnknownProject(w.spec.project.clone()));
            };
            let work = Workload {
                id: w.id,
                spec: w.spec.clone(),
                project,
                submit: w.submit,
                state: w.state,
                lease: None,
                first_start: w.first_start,
                preemptions: w.preemptions,
                last_preempted: w.last_preempted,
                blocked: None,
                held: w.held && w.state == WorkloadState::Pending,
                // The registry is rebuilt from the same nodes in the same order (removed
                // ones keep their place), so the bits mean what they meant.
                sel: s.st.cluster.selector(&w.spec.select).unwrap_or_default(),
            };
            if w.state.is_final() {
                s.st.finished.push(w.id);
            } else if !work.held {
                s.st.demand[project.idx()] += u64::from(w.spec.total_gpus());
            }
            if w.state == WorkloadState::Pending && !work.held {
                s.enqueue(QueueKey::of(&work));
            }
            s.st.workloads.insert(w.id, Box::new(work));
        }
        let now = f.last_now;
        for l in &f.leases {
            let w =
                s.st.workloads
                    .get_mut(&l.workload)
                    .ok_or(CoreError::UnknownWorkload(l.workload.0))?;
            w.lease = Some(l.id);
            let project = w.project;
            let (cpu, mem) = (w.spec.cpu_per_node, w.spec.mem_per_node_gb);
            let resumable = w.spec.resumable;
            let ends_by = w.spec.time_limit.map(|tl| l.start.saturating_add(tl));
            let allowance = (l.funded && l.allowance).then(|| w.spec.user.clone());
            if let Some(user) = &allowance {
                *s.st.allowance.entry(user.clone()).or_default() +=
                    l.placement.iter().map(|p| p.gpus.count_ones()).sum::<u32>();
            }
            let soft = l.revoke.is_none() && l.preemptible_at <= now;
            for p in &l.placement {
                if p.node.idx() >= s.st.cluster.len() {
                    return Err(CoreError::UnknownNode(p.node.0));
                }
                s.st.cluster.update(p.node, |n| {
                    n.used |= p.gpus;
                    if soft {
                        n.soft |= p.gpus;
                    }
                    n.cpu_used += cpu;
                    n.mem_used += mem;
                });
            }
            if l.preemptible_at > now && l.preemptible_at != Time::MAX {
                s.st.protected.insert((l.preemptible_at, l.id));
            }
            if l.revoke.is_some() {
                s.st.revoking.insert(l.id);
            }
            let gpus: u32 = l.placement.iter().map(|p| p.gpus.count_ones()).sum();
            let lease = Lease {
                id: l.id,
                workload: l.workload,
                project,
                placement: l.placement.clone(),
                gpus,
                weighted: l.weighted.unwrap_or(u64::from(gpus) * crate::config::MILLI),
                cpu_per_node: cpu,
                mem_per_node: mem,
                start: l.start,
                protected_until: l.protected_until,
                preemptible_at: l.preemptible_at,
                funded: l.funded,
                revoke: l.revoke.as_ref().map(|(t, why)| Revocation {
                    not_before: *t,
                    why: why.clone(),
                }),
                backfill_for: l.backfill_for,
                resumable,
                ends_by,
                allowance,
                used: l.used,
            };
            s.st.index_lease(&lease);
            s.st.leases.insert(l.id, Box::new(lease));
        }
        s.st.recent = f
            .recent
            .iter()
            .filter_map(|(t, a, b)| Some((*t, s.tree.find(a)?, s.tree.find(b)?)))
            .collect();
        for (id, l) in &f.leaving {
            if l.parts.iter().any(|p| p.node.idx() >= s.st.cluster.len()) {
                return Err(CoreError::UnknownNode(l.parts[0].node.0));
            }
            for p in &l.parts {
                s.st.hold_part(p);
            }
            s.st.leaving.insert(*id, l.clone());
        }
        s.st.run_lengths = crate::runlength::RunLengths::from_facts(&f.run_lengths);
        let held: Vec<WorkloadId> = f.leaving.iter().map(|(_, l)| l.workload).collect();
        for w in held {
            if s.st
                .workloads
                .get(&w)
                .is_some_and(|w| w.state == WorkloadState::Pending)
            {
                s.hold_back(w);
            }
        }
        s.st.next_workload = f.next_workload.max(1);
        s.st.next_lease = f.next_lease.max(1);
        s.st.last_now = now;
        Ok(s)
    }

    /// Applies decisions a pass made at `now` (as the journal keeps them) without
    /// running the policy: starts with their recorded lease ids and places,
    /// revocations, withdrawals. Reservations are plans, not facts: skipped. What
    /// inputs since the last pass queued for it (a drain's revocations) is in the
    /// record, so it is not sent twice.
    pub fn replay(&mut self, now: Time, actions: &[Action]) -> Result<(), CoreError> {
        let now = self.clock(now);
        self.st.lapse_protection(now);
        let cooldown = self.cfg.cooldown;
        for a in actions {
            match a {
                Action::Start {
                    lease,
                    workload,
                    placement,
                    funded,
                    why,
                } => {
                    let w = self
                        .st
                        .workloads
                        .get_mut(workload)
                        .ok_or(CoreError::UnknownWorkload(workload.0))?;
                    if w.state != WorkloadState::Pending {
                        return Err(CoreError::AlreadyEnded(workload.0));
                    }
                    if placement
                        .iter()
                        .any(|p| p.node.idx() >= self.st.cluster.len())
                    {
                        return Err(CoreError::UnknownNode(
                            placement.first().map_or(0, |p| p.node.0),
                        ));
                    }
                    if *why == StartWhy::AfterPreemption {
                        w.last_preempted.get_or_insert(now);
                    }
                    let backfill_for = match why {
                        StartWhy::Backfill { reservation_of, .. } => Some(*reservation_of),
                        _ => None,
                    };
                    // A funded start while the project's budget was spent ran on the
                    // allowance: the ledger replayed so far says so, as it told the
                    // pass (budgets are read at the pass's instant, before its starts).
                    let project = w.project;
                    let allowance = *funded
                        && !self.st.protect_forever
                        && self.st.budget_spent(&self.tree, project, now);
                    self.st.drop_claim(*workload);
                    self.st.next_lease = lease.0;
                    self.st.start_lease(
                        now,
                        cooldown,
                        *workload,
                        placement.clone(),
                        (*funded, allowance),
                        backfill_for,
                        why.clone(),
                    );
                    for id in std::mem::take(&mut self.st.dequeue) {
                        self.dequeue(id);
                    }
                }
                Action::Revoke {
                    lease,
                    not_before,
                    why,
                    ..
                } => {
                    if let RevokeWhy::Preempted {
                        by,
                        unfunded: false,
                        ..
                    } = why
                    {
                        let sides = self.st.workloads.get(by).zip(self.st.leases.get(lease));
                        if let Some((g, v)) = sides.and_then(|(w, l)| {
                            l.funded
                                .then(|| self.tree.diverging(w.project, l.project))
                                .flatten()
                        }) {
                            self.st.recent.push((now, g, v));
                        }
                    }
                    self.st.revoke_at(*lease, *not_before, why.clone());
                }
                Action::Withdraw { lease, .. } => self.st.withdraw(now, *lease),
                Action::Reserve { .. } => {}
            }
        }
        self.st.outbox.clear();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tree::GroupSpec;

    fn sched() -> Scheduler {
        let groups = vec![
            GroupSpec {
                name: "a".into(),
                parent: None,
                weight: 3.0,
            },
            GroupSpec {
                name: "b".into(),
                parent: None,
                weight: 1.0,
            },
        ];
        let nodes = (0..4)
            .map(|i| NodeSpec {
                name: format!("n{i}"),
                cluster: "c".into(),
                gpus: 8,
                cpu: 64,
                memory_gb: 512,
                ..Default::default()
            })
            .collect();
        Scheduler::new(
            PolicyConfig::default(),
            OrgTree::new(&groups).expect("tree"),
            nodes,
        )
        .expect("scheduler")
    }

    fn spec(project: &str, gpus: u32, nodes: u32, min_runtime: u64) -> WorkloadSpec {
        WorkloadSpec {
            project: project.into(),
            user: "u".into(),
            class: "batch".into(),
            gpus_per_node: gpus,
            nodes,
            cpu_per_node: gpus,
            mem_per_node_gb: gpus * 10,
            min_runtime,
            time_limit: None,
            resumable: true,
            priority: 0,
            no_requeue: false,
            ..Default::default()
        }
    }

    /// A busy state: funded and free work, a gang, a drain, ends and preemptions.
    fn busy() -> (Scheduler, Vec<Vec<Action>>) {
        let mut s = sched();
        let mut passes = Vec::new();
        for k in 0..6u64 {
            let t = k * 600;
            s.submit(t, spec("b", 4, 1, 0)).expect("fits");
            s.submit(t, spec("a", 2, 1, 3_600)).expect("fits");
            s.submit(t, spec("a", 8, 2, 3_600)).expect("fits");
            passes.push(s.schedule(t).actions);
        }
        s.set_node_state(3_700, NodeId(1), NodeState::Draining)
            .expect("node");
        let ended: Vec<LeaseId> = s.leases().take(2).map(|l| l.id).collect();
        for l in ended {
            s.lease_ended(3_700, l, LeaseEnd::Completed).expect("lease");
        }
        passes.push(s.schedule(3_800).actions);
        s.set_weight("b", 2.0).expect("group");
        (s, passes)
    }

    #[test]
    fn facts_rebuild_the_same_facts_through_json() {
        let (s, _) = busy();
        let f = s.facts();
        assert!(!f.leases.is_empty() && f.workloads.len() > f.leases.len());
        // The completed runs taught how long a run of theirs lasts; a snapshot keeps it.
        assert_eq!(f.run_lengths.len(), 1, "{:?}", f.run_lengths);
        let json = serde_json::to_string(&f).expect("encodes");
        let back: Facts = serde_json::from_str(&json).expect("decodes");
        let r =
            Scheduler::from_facts(s.config().clone(), s.tree().clone(), &back).expect("rebuilds");
        assert_eq!(r.facts(), f);
        assert_eq!(r.pending_len(), s.pending_len());
        assert_eq!(r.demand(), s.demand());
        assert_eq!(r.cluster().free_total(), s.cluster().free_total());
        for (id, n) in s.cluster().nodes() {
            let m = r.cluster().node(id);
            assert_eq!(
                (n.used, n.cpu_used, n.mem_used),
                (m.used, m.cpu_used, m.mem_used)
            );
        }
    }

    #[test]
    fn replayed_decisions_make_the_same_leases_without_a_pass() {
        let mut s = sched();
        let mut r = sched();
        for k in 0..5u64 {
            let t = k * 900;
            for sp in [
                spec("b", 8, 1, 0),
                spec("a", 4, 1, 3_600),
                spec("a", 8, 2, 600),
            ] {
                s.submit(t, sp.clone()).expect("fits");
                r.submit(t, sp).expect("fits");
            }
            let d = s.schedule(t);
            r.replay(t, &d.actions).expect("replays");
        }
        assert_eq!(r.facts().leases, s.facts().leases);
        assert_eq!(r.facts().workloads, s.facts().workloads);
        assert_eq!(r.facts().usage, s.facts().usage);
        assert_eq!(r.pending_len(), s.pending_len());
    }

    #[test]
    fn a_live_workload_of_a_removed_project_is_refused_by_name() {
        let (s, _) = busy();
        let f = s.facts();
        let tree = OrgTree::new(&[GroupSpec {
            name: "a".into(),
            parent: None,
            weight: 1.0,
        }])
        .expect("tree");
        let e = Scheduler::from_facts(s.config().clone(), tree, &f).expect_err("refused");
        assert!(e.to_string().contains("\"b\""), "{e}");
    }
}
