//! The driver: how the shell plays the agents, applies operations, advances time and
//! runs each scheduling pass.

use super::generate::{node_specs, policy_config, tree_specs, Op, Setup, Sub};
use super::{Ev, Job, Prop, Shell, Stats};
use allot_fairshare::time::{Secs, Time};
use allot_fairshare::{
    Action, CoreError, LeaseEnd, LeaseId, NodeId, NodeSpec, NodeState, OrgTree, PolicyConfig,
    RevokeWhy, Scheduler, WorkloadId, WorkloadSpec, WorkloadState,
};
use std::collections::{BTreeMap, BTreeSet};

/// Passes honoured for bare wake-ups within one `advance`: a pass cut short asks for
/// `now + 1`, which an honest shell would follow second by second for hours.
const MAX_WAKE_PASSES: u32 = 64;

impl Shell {
    pub(crate) fn new(cfg: PolicyConfig, tree: OrgTree, nodes: Vec<NodeSpec>, save: Secs) -> Self {
        Shell {
            cooldown: cfg.cooldown,
            hysteresis: cfg.hysteresis,
            plan_loss: BTreeMap::new(),
            sch: Scheduler::new(cfg, tree, nodes).expect("valid scheduler"),
            save,
            now: 0,
            seq: 0,
            events: BTreeMap::new(),
            wakes: BTreeSet::new(),
            live: BTreeMap::new(),
            leaving: BTreeMap::new(),
            down: BTreeMap::new(),
            seen: BTreeMap::new(),
            jobs: BTreeMap::new(),
            ids: Vec::new(),
            finals: BTreeMap::new(),
            held: BTreeSet::new(),
            last_revoke: BTreeMap::new(),
            revoked_at: BTreeMap::new(),
            log: Vec::new(),
            bad: Vec::new(),
            edges_at: 0,
            edges: BTreeSet::new(),
            funded_preemptions: Vec::new(),
            served: Vec::new(),
            stats: Stats::default(),
            books: true,
        }
    }

    pub(super) fn for_setup(s: &Setup) -> Self {
        let tree = OrgTree::new(&tree_specs(s.tree, s.weights)).expect("valid tree");
        Shell::new(policy_config(&s.policy), tree, node_specs(s), s.save)
    }

    pub(super) fn fail(&mut self, p: Prop, msg: String) {
        // The first few say it all; a broken rule repeats on every pass after.
        if self.bad.iter().filter(|b| b.0 == p).count() < 8 {
            self.bad.push((p, format!("t={}: {msg}", self.now)));
        }
    }

    pub(crate) fn violations(&self, p: Prop) -> Vec<&str> {
        self.bad
            .iter()
            .filter(|b| b.0 == p)
            .map(|b| b.1.as_str())
            .collect()
    }

    /// The core hears something besides a revoked lease's end: ratios may move, so
    /// preemptions before it no longer bound the ones after it.
    fn news(&mut self) {
        self.edges.clear();
    }

    pub(super) fn push(&mut self, t: Time, ev: Ev) {
        self.seq += 1;
        self.events.insert((t, self.seq), ev);
    }

    pub(super) fn apply(&mut self, op: &Op) {
        match op {
            Op::Submit(s) => self.submit(s),
            Op::Burst(s, n) => {
                for _ in 0..*n {
                    self.submit(s);
                }
            }
            Op::Advance(dt) => self.advance(*dt),
            Op::Cancel(i) => self.cancel(*i),
            Op::Hold(i, hold) => self.hold(*i, *hold),
            Op::Requeue(i) => self.requeue(*i),
            Op::Node(n, state) => self.node(*n, *state),
            Op::Gpu {
                node,
                gpu,
                healthy,
                kill,
            } => self.gpu(*node, *gpu, *healthy, *kill),
        }
    }

    fn submit(&mut self, s: &Sub) {
        let projects = self.sch.tree().projects();
        let p = projects[s.project % projects.len()];
        let spec = WorkloadSpec {
            project: self.sch.tree().group(p).name.clone(),
            // Two users, so the allowance is counted per user.
            user: format!("u{}", s.priority.rem_euclid(2)),
            class: "batch".into(),
            gpus_per_node: s.gpus,
            nodes: s.nodes,
            cpu_per_node: s.gpus * s.cpu_per_gpu,
            mem_per_node_gb: s.gpus * 16,
            min_runtime: s.min_runtime,
            time_limit: s.time_limit,
            resumable: s.resumable,
            priority: s.priority,
            no_requeue: s.no_requeue,
            select: allot_fairshare::select::Select {
                gpu_types: s.gpu_type.into_iter().map(String::from).collect(),
                exclude: s.exclude.into_iter().map(String::from).collect(),
                ..Default::default()
            },
        };
        self.submit_spec(
            spec,
            Job {
                run: s.run,
                time_limit: s.time_limit,
                fails: s.fails,
            },
        );
        self.pass();
    }

    pub(crate) fn submit_spec(&mut self, spec: WorkloadSpec, job: Job) -> Option<WorkloadId> {
        self.news();
        // Refused only when no cluster has enough nodes that could ever hold it.
        let c = self.sch.cluster();
        let fits = c.cluster_names().iter().enumerate().any(|(ci, _)| {
            let holders = c
                .nodes()
                .filter(|(_, n)| {
                    usize::from(n.cluster) == ci
                        && n.spec.gpus >= spec.gpus_per_node
                        && n.spec.cpu >= spec.cpu_per_node
                        && n.spec.memory_gb >= spec.mem_per_node_gb
                        && (spec.select.gpu_types.is_empty()
                            || spec.select.gpu_types.contains(&n.spec.gpu_type))
                        && !spec.select.exclude.contains(&n.spec.name)
                })
                .count();
            holders >= spec.nodes as usize
        });
        match self.sch.submit(self.now, spec.clone()) {
            Ok(id) => {
                if !fits {
                    self.fail(Prop::Books, format!("accepted {spec:?}, which never fits"));
                }
                self.ids.push(id);
                self.jobs.insert(id, job);
                Some(id)
            }
            Err(CoreError::Impossible { .. } | CoreError::Unplaceable { .. }) if !fits => None,
            Err(e) => {
                self.fail(Prop::Books, format!("refused {spec:?}: {e}"));
                None
            }
        }
    }

    fn cancel(&mut self, i: usize) {
        self.news();
        if self.ids.is_empty() {
            return;
        }
        let id = self.ids[i % self.ids.len()];
        let running = self.live.values().any(|l| l.workload == id);
        let ended = self.finals.contains_key(&id);
        match self.sch.cancel(self.now, id) {
            Ok(()) if ended => self.fail(Prop::Books, format!("cancelled {id:?} after it ended")),
            Ok(()) => {
                if !running {
                    self.finals.insert(id, WorkloadState::Cancelled);
                }
            }
            Err(CoreError::AlreadyEnded(_)) if ended => {}
            Err(e) => self.fail(Prop::Books, format!("cancel {id:?}: {e}")),
        }
        self.pass();
    }

    /// Holds or releases one workload: only pending work can be either, and held
    /// work must never start (checked at each start).
    fn hold(&mut self, i: usize, hold: bool) {
        self.news();
        if self.ids.is_empty() {
            return;
        }
        let id = self.ids[i % self.ids.len()];
        let r = if hold {
            self.sch.hold(self.now, id)
        } else {
            self.sch.release(self.now, id)
        };
        match r {
            Ok(_) => {
                if hold {
                    self.held.insert(id);
                } else {
                    self.held.remove(&id);
                }
            }
            Err(CoreError::Running(_) | CoreError::AlreadyEnded(_)) => {}
            Err(e) => self.fail(Prop::Books, format!("hold {id:?} ({hold}): {e}")),
        }
        self.pass();
    }

    /// Requeues one workload if it runs: its lease is revoked now and it waits again.
    fn requeue(&mut self, i: usize) {
        self.news();
        if self.ids.is_empty() {
            return;
        }
        let id = self.ids[i % self.ids.len()];
        match self.sch.requeue(self.now, id) {
            Ok(()) | Err(CoreError::NotRunning(_) | CoreError::AlreadyEnded(_)) => {}
            Err(e) => self.fail(Prop::Books, format!("requeue {id:?}: {e}")),
        }
        self.pass();
    }

    fn node(&mut self, n: usize, state: NodeState) {
        self.news();
        let node = NodeId((n % self.sch.cluster().len()) as u32);
        if let Err(e) = self.sch.set_node_state(self.now, node, state) {
            self.fail(Prop::Books, format!("set_node_state {node:?}: {e}"));
        }
        if state == NodeState::Down && !self.down.contains_key(&node) {
            let mut there = Vec::new();
            let lost: Vec<LeaseId> = self
                .live
                .iter()
                .filter(|(_, l)| l.placement.iter().any(|p| p.node == node))
                .map(|(id, _)| *id)
                .collect();
            for lid in lost {
                if let Some(l) = self.live.get(&lid) {
                    let mask = l
                        .placement
                        .iter()
                        .filter(|p| p.node == node)
                        .fold(0, |m, p| m | p.gpus);
                    there.push((lid, l.workload, mask));
                }
                self.end_lease(lid, LeaseEnd::NodeLost);
            }
            // Parts being stopped there are gone with it, as far as the shell knows.
            let parts: Vec<LeaseId> = self
                .leaving
                .iter()
                .filter(|(_, l)| l.placement.iter().any(|p| p.node == node))
                .map(|(id, _)| *id)
                .collect();
            for lid in parts {
                self.part_left(lid, node);
            }
            self.down.insert(node, there);
        } else if state != NodeState::Down {
            // Back: its agent still runs what the node ran when it went down, which the
            // core ended; held until each is stopped.
            for (lid, wid, mask) in self.down.remove(&node).unwrap_or_default() {
                match self.sch.hold_stray(self.now, lid, wid, node, mask) {
                    Ok(None) => {}
                    Ok(Some(held)) => {
                        self.stats.strays += 1;
                        let project = self
                            .sch
                            .workload(wid)
                            .map_or(allot_fairshare::GroupId(0), |w| w.project);
                        let part = allot_fairshare::workload::NodeGpus { node, gpus: held };
                        self.leaving
                            .entry(lid)
                            .or_insert(super::Live {
                                workload: wid,
                                project,
                                start: self.now,
                                placement: Vec::new(),
                                gpus: 0,
                            })
                            .placement
                            .push(part);
                        self.push(self.now + self.save.max(1), Ev::PartLeft(lid, node));
                    }
                    Err(e) => {
                        self.fail(Prop::Books, format!("hold_stray {lid:?} on {node:?}: {e}"))
                    }
                }
            }
        }
        self.pass();
    }

    /// A host reports its part of an ended lease gone.
    fn part_left(&mut self, lid: LeaseId, node: NodeId) {
        let Some(l) = self.leaving.get_mut(&lid) else {
            return;
        };
        if !l.placement.iter().any(|p| p.node == node) {
            return;
        }
        l.placement.retain(|p| p.node != node);
        if l.placement.is_empty() {
            self.leaving.remove(&lid);
        }
        self.stats.parts_left += 1;
        if let Err(e) = self.sch.part_left(self.now, lid, node) {
            self.fail(
                Prop::Books,
                format!("the agents held a part of {lid:?} on {node:?} but the core refused its end: {e}"),
            );
        }
    }

    fn gpu(&mut self, n: usize, gpu: u32, healthy: bool, kill: bool) {
        self.news();
        let node = NodeId((n % self.sch.cluster().len()) as u32);
        let gpu = gpu % self.sch.cluster().node(node).spec.gpus;
        if let Err(e) = self.sch.set_gpu_health(node, gpu, healthy) {
            self.fail(Prop::Books, format!("set_gpu_health {node:?}/{gpu}: {e}"));
        }
        if !healthy && kill {
            let hit: Vec<LeaseId> = self
                .live
                .iter()
                .filter(|(_, l)| {
                    l.placement
                        .iter()
                        .any(|p| p.node == node && p.gpus & (1 << gpu) != 0)
                })
                .map(|(id, _)| *id)
                .collect();
            for lid in hit {
                self.end_lease(lid, LeaseEnd::NodeLost);
            }
        }
        self.pass();
    }

    /// Moves the clock to `now + dt`, ending leases and honouring wake-ups on the way.
    pub(crate) fn advance(&mut self, dt: Secs) {
        let target = self.now + dt;
        let mut wake_passes = 0;
        while let Some((&(t, _), _)) = self.events.first_key_value() {
            if t > target {
                break;
            }
            self.now = t;
            let mut ended = false;
            while let Some(e) = self.events.first_entry() {
                if e.key().0 != t {
                    break;
                }
                match e.remove() {
                    Ev::End(lid, end) => {
                        ended |= self.live.contains_key(&lid);
                        self.end_lease(lid, end);
                    }
                    Ev::PartLeft(lid, node) => {
                        ended = true;
                        self.part_left(lid, node);
                    }
                    Ev::Wake => {
                        self.wakes.remove(&t);
                    }
                }
            }
            if !ended {
                wake_passes += 1;
            }
            if ended || wake_passes <= MAX_WAKE_PASSES {
                self.pass();
            }
        }
        self.now = target;
        self.pass();
    }

    fn end_lease(&mut self, lid: LeaseId, end: LeaseEnd) {
        let Some(l) = self.live.remove(&lid) else {
            return; // ended already: a revoke and the exit raced, the first one won
        };
        self.served.push((l.project, l.start, self.now, l.gpus));
        if end != LeaseEnd::Revoked {
            self.news();
        }
        let requeue = self
            .sch
            .workload(l.workload)
            .is_some_and(|w| !w.spec.no_requeue)
            || matches!(self.last_revoke.get(&lid), Some(RevokeWhy::Requeued));
        let cancelled = matches!(self.last_revoke.get(&lid), Some(RevokeWhy::Cancelled));
        // A gang's parts end one by one: the first (or the lost ones) now, the others
        // on their hosts' next report; the core holds them meanwhile.
        let gone: Vec<NodeId> = match end {
            LeaseEnd::NodeLost => l
                .placement
                .iter()
                .map(|p| p.node)
                .filter(|n| {
                    self.down.contains_key(n)
                        || self.sch.cluster().node(*n).state == NodeState::Down
                })
                .collect(),
            _ => l.placement.iter().take(1).map(|p| p.node).collect(),
        };
        let gone = if gone.is_empty() {
            l.placement.iter().take(1).map(|p| p.node).collect()
        } else {
            gone
        };
        let still: Vec<NodeId> = l
            .placement
            .iter()
            .map(|p| p.node)
            .filter(|n| !gone.contains(n))
            .collect();
        let expect = match end {
            LeaseEnd::Completed => WorkloadState::Completed,
            LeaseEnd::Failed => WorkloadState::Failed,
            LeaseEnd::TimeLimit => WorkloadState::TimedOut,
            LeaseEnd::Revoked | LeaseEnd::NodeLost | LeaseEnd::Refused if cancelled => {
                WorkloadState::Cancelled
            }
            LeaseEnd::Refused => WorkloadState::Pending,
            LeaseEnd::Revoked | LeaseEnd::NodeLost if requeue => WorkloadState::Pending,
            LeaseEnd::Revoked => WorkloadState::Preempted,
            LeaseEnd::NodeLost => WorkloadState::Failed,
        };
        if end == LeaseEnd::NodeLost {
            self.stats.node_lost += 1;
        }
        if !still.is_empty() {
            let mut part = l.clone();
            part.placement.retain(|p| still.contains(&p.node));
            self.leaving.insert(lid, part);
            for (i, n) in still.iter().enumerate() {
                let at = self.now + 1 + (i as u64 + self.seq) % self.save.max(1);
                self.push(at, Ev::PartLeft(lid, *n));
            }
        }
        match self
            .sch
            .lease_ended_leaving(self.now, lid, end, None, &still)
        {
            Ok(s) => {
                if s != expect {
                    self.fail(
                        Prop::Books,
                        format!(
                            "{lid:?} of {:?} ended {end:?} (last revoke {:?}): core says {s:?}, \
                             expected {expect:?}",
                            l.workload,
                            self.last_revoke.get(&lid)
                        ),
                    );
                }
                if s == WorkloadState::Pending {
                    self.stats.requeues += 1;
                }
                if s.is_final() {
                    self.finals.insert(l.workload, s);
                }
            }
            Err(e) => self.fail(
                Prop::Books,
                format!("the agents held {lid:?} but the core refused its end: {e}"),
            ),
        }
    }

    /// One scheduling pass, carried out and checked.
    pub(super) fn pass(&mut self) {
        let d = self.sch.schedule(self.now);
        self.plan_loss.clear();
        for a in &d.actions {
            match a {
                Action::Start {
                    lease,
                    workload,
                    placement,
                    funded,
                    why,
                } => self.on_start(*lease, *workload, placement, *funded, why),
                Action::Revoke {
                    lease,
                    workload,
                    not_before,
                    why,
                } => self.on_revoke(*lease, *workload, *not_before, why),
                Action::Reserve {
                    workload,
                    nodes,
                    start,
                } => self.on_reserve(*workload, nodes, *start),
                Action::Withdraw { lease, .. } => self.on_withdraw(*lease),
            }
        }
        if let Some(w) = d.next_wakeup {
            if w > self.now && self.wakes.insert(w) {
                self.push(w, Ev::Wake);
            }
        }
        self.check_exclusive();
        self.check_claims();
        if self.books {
            self.check_books();
        }
        self.log.push((self.now, d));
    }
}
