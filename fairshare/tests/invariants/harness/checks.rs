//! The whole-state checks run after every pass.

use super::{Prop, Shell};
use allot_fairshare::scheduler::ClaimKind;
use allot_fairshare::{LeaseId, NodeId, NodeState, WorkloadState};
use std::collections::{BTreeMap, BTreeSet};

impl Shell {
    /// After every pass: the core's leases are disjoint, fit their nodes' host room,
    /// and are exactly the ones the agents hold.
    pub(super) fn check_exclusive(&mut self) {
        let c = self.sch.cluster();
        let mut used: BTreeMap<NodeId, (u64, u32, u32)> = BTreeMap::new();
        let mut bad = Vec::new();
        for l in self.sch.leases() {
            for p in &l.placement {
                let e = used.entry(p.node).or_default();
                if e.0 & p.gpus != 0 {
                    bad.push(format!(
                        "{:?} GPUs {:#b} leased twice",
                        p.node,
                        e.0 & p.gpus
                    ));
                }
                e.0 |= p.gpus;
                e.1 += l.cpu_per_node;
                e.2 += l.mem_per_node;
            }
        }
        // Parts of ended leases still running hold their GPUs too.
        for (lid, l) in self.sch.leaving() {
            for p in &l.parts {
                let e = used.entry(p.node).or_default();
                if e.0 & p.gpus != 0 {
                    bad.push(format!(
                        "{:?} GPUs {:#b} held by {lid:?}'s leaving part and another",
                        p.node,
                        e.0 & p.gpus
                    ));
                }
                e.0 |= p.gpus;
                e.1 += p.cpu;
                e.2 += p.mem;
            }
        }
        for (node, (gpus, _, _)) in &used {
            let n = c.node(*node);
            if n.used != *gpus {
                bad.push(format!(
                    "{node:?} marks GPUs {:#b} used, its leases and parts hold {gpus:#b}",
                    n.used
                ));
            }
        }
        for (node, (_, cpu, mem)) in &used {
            let n = c.node(*node);
            if *cpu > n.spec.cpu || *mem > n.spec.memory_gb {
                bad.push(format!(
                    "{node:?} holds {cpu} cores / {mem} GB of {:?}",
                    n.spec
                ));
            }
        }
        let core: BTreeSet<LeaseId> = self.sch.leases().map(|l| l.id).collect();
        let agents: BTreeSet<LeaseId> = self.live.keys().copied().collect();
        if core != agents {
            bad.push(format!("core leases {core:?}, agents hold {agents:?}"));
        }
        let core_parts: BTreeSet<(LeaseId, NodeId)> = self
            .sch
            .leaving()
            .iter()
            .flat_map(|(id, l)| l.parts.iter().map(move |p| (*id, p.node)))
            .collect();
        let agent_parts: BTreeSet<(LeaseId, NodeId)> = self
            .leaving
            .iter()
            .flat_map(|(id, l)| l.placement.iter().map(move |p| (*id, p.node)))
            .collect();
        if core_parts != agent_parts {
            bad.push(format!(
                "core holds leaving parts {core_parts:?}, agents run {agent_parts:?}"
            ));
        }
        // No workload runs twice: one live lease at most (a start beside a part of an
        // earlier run still being stopped is checked at the start, `on_start`).
        let mut runs: BTreeMap<allot_fairshare::WorkloadId, Vec<LeaseId>> = BTreeMap::new();
        for (id, l) in self.live.iter() {
            runs.entry(l.workload).or_default().push(*id);
        }
        for (w, ids) in &runs {
            if ids.len() > 1 {
                bad.push(format!("{w:?} runs twice: {ids:?}"));
            }
        }
        for b in bad {
            self.fail(Prop::Exclusive, b);
        }
    }

    /// After every pass: each claim holds GPUs for one pending workload, on ready
    /// nodes and healthy GPUs no other claim holds, shaped like the workload; the GPUs
    /// of a preemption claim are free or held by leases being revoked.
    pub(super) fn check_claims(&mut self) {
        let c = self.sch.cluster();
        let mut bad = Vec::new();
        let mut held: BTreeMap<NodeId, u64> = BTreeMap::new();
        for (id, claim) in self.sch.claims() {
            let Some(w) = self.sch.workload(*id) else {
                bad.push(format!("claim for unknown {id:?}"));
                continue;
            };
            if w.state != WorkloadState::Pending {
                bad.push(format!("claim for {id:?}, which is {:?}", w.state));
            }
            let nodes: BTreeSet<NodeId> = claim.nodes.iter().map(|p| p.node).collect();
            if claim.nodes.len() != w.spec.nodes as usize || nodes.len() != claim.nodes.len() {
                bad.push(format!(
                    "claim of {id:?} on {:?} for {} nodes",
                    claim.nodes, w.spec.nodes
                ));
            }
            let preemption = claim.kind == ClaimKind::Preemption;
            for p in &claim.nodes {
                let n = c.node(p.node);
                if n.state != NodeState::Ready || p.gpus & !n.healthy != 0 {
                    bad.push(format!(
                        "claim of {id:?} holds {:?} GPUs {:#b}; node {:?}, healthy {:#b}",
                        p.node, p.gpus, n.state, n.healthy
                    ));
                }
                // A single-node claim takes exactly what it needs; a gang's, whole nodes.
                let want = if w.spec.nodes == 1 {
                    p.gpus.count_ones() == w.spec.gpus_per_node
                } else {
                    p.gpus == n.all()
                };
                if !want {
                    bad.push(format!(
                        "claim of {id:?} holds {:#b} on {:?} for {}×{} GPUs",
                        p.gpus, p.node, w.spec.nodes, w.spec.gpus_per_node
                    ));
                }
                let e = held.entry(p.node).or_default();
                if *e & p.gpus != 0 {
                    bad.push(format!(
                        "{:?} GPUs {:#b} claimed twice",
                        p.node,
                        *e & p.gpus
                    ));
                }
                *e |= p.gpus;
                if preemption {
                    for l in self.sch.leases() {
                        let overlap = l
                            .placement
                            .iter()
                            .any(|q| q.node == p.node && q.gpus & p.gpus != 0);
                        if overlap && l.revoke.is_none() {
                            bad.push(format!(
                                "claim of {id:?} on {:?} overlaps {:?}, which is not revoked",
                                p.node, l.id
                            ));
                        }
                    }
                }
            }
        }
        for b in bad {
            self.fail(Prop::Claims, b);
        }
    }

    /// After every pass: every submitted workload is known, in a state its history
    /// implies, and the counts add up.
    pub(super) fn check_books(&mut self) {
        let mut bad = Vec::new();
        let (mut pending, mut held_back, mut running, mut ended) = (0usize, 0usize, 0usize, 0usize);
        let mut demand = vec![0u64; self.sch.tree().len()];
        for &id in &self.ids {
            let Some(w) = self.sch.workload(id) else {
                bad.push(format!("{id:?} disappeared"));
                continue;
            };
            match w.state {
                WorkloadState::Pending => {
                    // One that waits for its earlier run's parts to leave, or is
                    // held, is out of its queue until then.
                    if w.held != self.held.contains(&id) {
                        bad.push(format!("{id:?} held {} in the core", w.held));
                    }
                    if w.held || self.leaving.values().any(|l| l.workload == id) {
                        held_back += 1;
                    } else {
                        pending += 1;
                    }
                    if w.lease.is_some() {
                        bad.push(format!("pending {id:?} holds {:?}", w.lease));
                    }
                }
                WorkloadState::Running => {
                    running += 1;
                    let ok = w
                        .lease
                        .and_then(|l| self.sch.lease(l))
                        .is_some_and(|l| l.workload == id);
                    if !ok {
                        bad.push(format!("running {id:?} has lease {:?}", w.lease));
                    }
                }
                _ => ended += 1,
            }
            if !w.state.is_final() && !w.held {
                demand[w.project.idx()] += u64::from(w.spec.total_gpus());
            }
            match self.finals.get(&id) {
                Some(f) if *f != w.state => {
                    bad.push(format!("{id:?} ended {f:?} but is now {:?}", w.state));
                }
                None if w.state.is_final() => {
                    bad.push(format!("{id:?} is {:?} though nothing ended it", w.state));
                }
                _ => {}
            }
        }
        if pending != self.sch.pending_len() {
            bad.push(format!(
                "{pending} workloads pending, pending_len says {}",
                self.sch.pending_len()
            ));
        }
        let leases = self.sch.leases().count();
        if running != leases || running != self.live.len() {
            bad.push(format!(
                "{running} running, {leases} core leases, {} held by agents",
                self.live.len()
            ));
        }
        if pending + held_back + running + ended != self.ids.len() {
            bad.push(format!(
                "{pending} + {held_back} + {running} + {ended} != {} submitted",
                self.ids.len()
            ));
        }
        for &p in self.sch.tree().projects() {
            if self.sch.demand()[p.idx()] != demand[p.idx()] {
                bad.push(format!(
                    "demand of {} is {}, its live work wants {}",
                    self.sch.tree().group(p).name,
                    self.sch.demand()[p.idx()],
                    demand[p.idx()]
                ));
            }
        }
        // Each lease charges its GPUs at its nodes' weights, and capacity is every
        // node's GPUs at its weight.
        let c = self.sch.cluster();
        for l in self.sch.leases() {
            if c.weighted(&l.placement) != l.weighted {
                bad.push(format!(
                    "{:?} charges {} weighted, its GPUs weigh {}",
                    l.id,
                    l.weighted,
                    c.weighted(&l.placement)
                ));
            }
        }
        let capacity: u64 = c
            .nodes()
            .filter(|(_, n)| !n.removed)
            .map(|(_, n)| u64::from(n.spec.gpus) * u64::from(n.weight))
            .sum();
        if capacity != c.total_weighted() {
            bad.push(format!(
                "weighted capacity {} but the nodes weigh {capacity}",
                c.total_weighted()
            ));
        }
        bad.extend(self.sch.index_errors());
        for b in bad {
            self.fail(Prop::Books, b);
        }
    }

    /// At each start: an allowance lease is funded, of an allowance shape, started
    /// while its project's budget is spent; its user's allowance leases stay within
    /// `allowance_gpus`. Backfill that cannot resume ends before its reservation.
    pub(super) fn check_allowance_start(
        &mut self,
        w: &allot_fairshare::Workload,
        lease: &allot_fairshare::Lease,
        funded: bool,
        why: &allot_fairshare::StartWhy,
    ) {
        let cfg = self.sch.config().clone();
        if let allot_fairshare::StartWhy::Backfill { starts, .. } = why {
            let ends = w.spec.time_limit.map(|tl| self.now + tl);
            if !w.spec.resumable && ends.is_none_or(|e| e > *starts) {
                self.fail(
                    Prop::Backfill,
                    format!(
                        "{:?} cannot resume, backfills until {ends:?} a reservation starting at {starts}",
                        w.id
                    ),
                );
            }
        }
        let Some(user) = &lease.allowance else {
            return;
        };
        self.stats.allowance_starts += 1;
        let shape = allot_fairshare::queue::Shape::of(&w.spec, w.sel);
        let mut bad = Vec::new();
        if !funded || !cfg.allowance_shape(&shape) || user != &w.spec.user {
            bad.push(format!(
                "{:?} on the allowance: funded {funded}, shape {shape:?}, user {user}",
                w.id
            ));
        }
        if !self.sch.budget_spent(w.project, self.now) {
            bad.push(format!(
                "{:?} on the allowance while its project's budget is not spent",
                w.id
            ));
        }
        let held: u32 = self
            .sch
            .leases()
            .filter(|l| l.allowance.as_deref() == Some(user.as_str()))
            .map(|l| l.gpus)
            .sum();
        if held > cfg.allowance_gpus {
            bad.push(format!(
                "{user} holds {held} allowance GPUs, more than allowance_gpus = {}",
                cfg.allowance_gpus
            ));
        }
        for b in bad {
            self.fail(Prop::Allowance, b);
        }
    }
}
