//! What starting, ending, revoking and claiming does to the state: GPU and host
//! bits, the ledger's rates, protection, claims and the outbox.

use super::*;

/// How long a lease of `w` may not be taken for rebalancing: its min runtime when
/// funded, at least the cooldown if it was preempted (or displaced others) before;
/// unfunded work is always preemptible.
pub(super) fn protection(w: &Workload, funded: bool, cooldown: u64) -> u64 {
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

/// Changes what `project` holds from `now` by `delta`, in the budget's ledger and the
/// ranking's (when it keeps its own). Free-standing: callers hold a workload borrowed.
fn add_usage_rate(
    (ledger, ranking): (&mut Ledger, &mut Option<Ledger>),
    project: GroupId,
    now: Time,
    delta: crate::ledger::Rates,
) {
    ledger.add_rate(project, now, delta);
    if let Some(r) = ranking {
        r.add_rate(project, now, delta);
    }
}

/// What a lease of `gpus` (`weighted` in thousandths) with `cpu` and `mem` on each
/// of `nodes` adds to its project's ledger rates; `charged`: funded by the budget.
fn rates(
    gpus: u32,
    cpu: u32,
    mem: u32,
    nodes: i64,
    weighted: u64,
    charged: bool,
) -> crate::ledger::Rates {
    let (gpus, weighted) = (i64::from(gpus), i64::try_from(weighted).unwrap_or(i64::MAX));
    let funded = |x: i64| if charged { x } else { 0 };
    [
        gpus,
        i64::from(cpu) * nodes,
        i64::from(mem) * nodes,
        funded(gpus),
        weighted,
        funded(weighted),
    ]
}

impl State {
    /// What pending `w` would hold, for the ratios: its GPUs at the weight of the
    /// lightest type it may land on, its CPU cores and memory.
    pub(super) fn request_alloc(&self, w: &Workload) -> [f64; 3] {
        let [gpus, cpu, mem] = w.spec.alloc();
        let weight = f64::from(self.cluster.request_weight(&w.sel)) / crate::config::MILLI as f64;
        [gpus * weight, cpu, mem]
    }

    /// GPUs `user` holds or has claimed on the allowance.
    pub(super) fn allowance_held(&self, user: &str) -> u32 {
        let claimed: u32 = self
            .claims
            .iter()
            .filter(|(_, c)| c.allowance)
            .filter_map(|(id, _)| self.workloads.get(id))
            .filter(|w| w.spec.user == user)
            .map(|w| w.spec.total_gpus())
            .sum();
        self.allowance.get(user).copied().unwrap_or(0) + claimed
    }

    /// Whether workload `w`, whose project's budget is spent, may run funded on its
    /// user's allowance (`claimed`: it already holds an allowance claim).
    pub(super) fn allowance_fits(&self, cfg: &PolicyConfig, w: &Workload, claimed: bool) -> bool {
        let s = Shape::of(&w.spec, w.sel);
        if !cfg.allowance_shape(&s) {
            return false;
        }
        let mine = if claimed { s.gpus } else { 0 };
        let others = self.allowance_held(&w.spec.user).saturating_sub(mine);
        others + s.gpus <= cfg.allowance_gpus
    }

    /// Ends workload `id` in `state` and takes it out of its project's demand.
    pub(super) fn finish(&mut self, id: WorkloadId, state: WorkloadState) {
        if let Some(w) = self.workloads.get_mut(&id) {
            w.state = state;
            w.lease = None;
            self.finished.push(id);
            if !std::mem::take(&mut w.held) {
                let g = u64::from(w.spec.total_gpus());
                self.demand[w.project.idx()] -= g.min(self.demand[w.project.idx()]);
            }
        }
    }

    /// Why a workload no pass has looked at yet cannot start, from the cluster as it is.
    pub(super) fn present_obstacle(&self, w: &Workload) -> Blocked {
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

    /// Whether `project` used its funded GPU budget over the lookback.
    pub(super) fn budget_spent(&self, tree: &OrgTree, project: GroupId, now: Time) -> bool {
        // Both sides in weighted thousandths: an hour of a heavy type spends more.
        let used = self.ledger.usage(project, now)[Channel::WeightedFundedGpu as usize];
        let budget = tree.group(project).share
            * self.cluster.total_weighted() as f64
            * self.ledger.model().effective_secs();
        used >= budget
    }

    /// The ledger the served ratios read: the ranking's own under `cfg`'s
    /// `ranking_lookback`, else the budget's (and always under the rules of 0.4).
    pub(super) fn ranking_ledger(&self, cfg: &PolicyConfig) -> &Ledger {
        match &self.ranking {
            Some(r) if cfg.ranking_usage().is_some() => r,
            _ => &self.ledger,
        }
    }

    /// Enters `lease` in the per-node index of every node it holds.
    pub(super) fn index_lease(&mut self, lease: &Lease) {
        for p in &lease.placement {
            self.node_leases[p.node.idx()].push(NodeLease::of(lease, p.gpus));
        }
    }

    /// The leases on `node`, as a list the caller may hold while it changes them.
    pub(super) fn lease_ids_on(&self, node: NodeId) -> Vec<LeaseId> {
        self.node_leases[node.idx()].iter().map(|e| e.id).collect()
    }

    /// Funded leases whose protection lapsed become preemption candidates.
    pub(super) fn lapse_protection(&mut self, now: Time) {
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

    /// Makes lease `lid` preemptible for rebalancing from `at` (`Time::MAX`: not
    /// while it runs): its place in the protected set, its GPUs' preemptibility and
    /// its entries in the per-node index.
    pub(super) fn set_preemptible_at(&mut self, now: Time, lid: LeaseId, at: Time) {
        let Some(l) = self.leases.get_mut(&lid) else {
            return;
        };
        let old = std::mem::replace(&mut l.preemptible_at, at);
        let soft = l.revoke.is_none() && at <= now;
        let placement = l.placement.clone();
        self.protected.remove(&(old, lid));
        if at > now && at != Time::MAX {
            self.protected.insert((at, lid));
        }
        for p in placement {
            for e in self.node_leases[p.node.idx()]
                .iter_mut()
                .filter(|e| e.id == lid)
            {
                e.preemptible_at = at;
            }
            // Through `update` even when the bits stay: the node's stamp tells plans
            // that its leases changed.
            self.cluster.update(p.node, |n| {
                if soft {
                    n.soft |= p.gpus;
                } else {
                    n.soft &= !p.gpus;
                }
            });
        }
    }

    /// When the shell must call again while work waits: the next protection lapse or
    /// reservation start, or at once (`more`) when the pass was cut short.
    pub(super) fn next_wakeup(&self, now: Time, more: bool) -> Option<Time> {
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

    /// Starts a lease for `id` on `placement`: marks its GPUs and host share, charges
    /// the ledger, and protects it for its contract; returns the `Start` action.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn start_lease(
        &mut self,
        now: Time,
        cooldown: u64,
        id: WorkloadId,
        placement: Vec<NodeGpus>,
        (funded, allowance): (bool, bool),
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
        }
        let nodes = placement.len() as i64;
        let weighted = self.cluster.weighted(&placement);
        let charged = funded && !allowance;
        add_usage_rate(
            (&mut self.ledger, &mut self.ranking),
            w.project,
            now,
            rates(gpus, cpu, mem, nodes, weighted, charged),
        );
        let allowance = (funded && allowance).then(|| s.user.clone());
        if let Some(user) = &allowance {
            *self.allowance.entry(user.clone()).or_default() += gpus;
        }
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
            weighted,
            cpu_per_node: cpu,
            mem_per_node: mem,
            start: now,
            protected_until: now.saturating_add(s.min_runtime),
            preemptible_at,
            funded,
            revoke: None,
            backfill_for,
            resumable: s.resumable,
            ends_by: s.time_limit.map(|tl| now.saturating_add(tl)),
            allowance,
            used: None,
        };
        self.index_lease(&lease);
        self.leases.insert(lid, Box::new(lease));
        Action::Start {
            lease: lid,
            workload: id,
            placement,
            funded,
            why,
        }
    }

    /// Removes a lease and gives its GPUs, host share and ledger rate back.
    pub(super) fn release(&mut self, now: Time, lid: LeaseId) -> Option<Lease> {
        let l = self.leases.remove(&lid)?;
        self.revoking.remove(&lid);
        let nodes = l.placement.len() as u32;
        for p in &l.placement {
            self.cluster.update(p.node, |n| {
                n.used &= !p.gpus;
                n.soft &= !p.gpus;
                n.cpu_used -= l.cpu_per_node.min(n.cpu_used);
                n.mem_used -= l.mem_per_node.min(n.mem_used);
                n.forget_refusals();
            });
            self.node_leases[p.node.idx()].retain(|x| x.id != lid);
        }
        let held = rates(
            l.gpus,
            l.cpu_per_node,
            l.mem_per_node,
            i64::from(nodes),
            l.weighted,
            l.funded && l.allowance.is_none(),
        );
        add_usage_rate(
            (&mut self.ledger, &mut self.ranking),
            l.project,
            now,
            held.map(|r| -r),
        );
        if let Some(user) = &l.allowance {
            if let Some(held) = self.allowance.get_mut(user) {
                *held -= l.gpus.min(*held);
                if *held == 0 {
                    self.allowance.remove(user);
                }
            }
        }
        self.protected.remove(&(l.preemptible_at, lid));
        Some(*l)
    }

    /// Takes back a revocation that has not come due: the lease is preemptible again
    /// only if its protection has lapsed.
    pub(super) fn withdraw(&mut self, now: Time, lid: LeaseId) {
        let Some(l) = self.leases.get_mut(&lid) else {
            return;
        };
        l.revoke = None;
        self.revoking.remove(&lid);
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

    /// Asks for a lease back from `not_before`; its GPUs are no longer preemptible.
    pub(super) fn revoke_at(&mut self, lid: LeaseId, not_before: Time, why: RevokeWhy) {
        let Some(l) = self.leases.get_mut(&lid) else {
            return;
        };
        l.revoke = Some(Revocation {
            not_before,
            why: why.clone(),
        });
        self.revoking.insert(lid);
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
            self.node_leases[p.node.idx()]
                .iter()
                .any(|e| e.gpus & p.gpus != 0 && self.revoking.contains(&e.id))
        })
    }

    /// Drops `id`'s claim and frees what it set aside.
    pub(super) fn drop_claim(&mut self, id: WorkloadId) {
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

    /// Drops every claim on `node`.
    pub(super) fn drop_claims_on(&mut self, node: NodeId) {
        self.drop_claims_holding(node, u64::MAX);
    }

    /// Drops the claims that hold any of `gpus` on `node`.
    pub(super) fn drop_claims_holding(&mut self, node: NodeId, gpus: u64) {
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

    /// Sets GPUs and host share aside for `id`.
    pub(super) fn add_claim(&mut self, id: WorkloadId, claim: Claim) {
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
    pub(super) fn process_claims(
        &mut self,
        now: Time,
        tree: &OrgTree,
        cfg: &PolicyConfig,
        out: &mut Vec<Action>,
    ) {
        let cooldown = cfg.cooldown;
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
            let within_budget = self.protect_forever || !self.budget_spent(tree, project, now);
            let allowance = !within_budget && claim.allowance && self.allowance_fits(cfg, w, true);
            let funded = w.spec.min_runtime > 0 && (within_budget || allowance);
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
                out.push(self.start_lease(
                    now,
                    cooldown,
                    id,
                    placement,
                    (funded, allowance),
                    None,
                    why,
                ));
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
                        for lid in self.lease_ids_on(p.node) {
                            let Some(l) = self.leases.get(&lid) else {
                                continue;
                            };
                            let soft = l.placement.iter().any(|x| {
                                x.node == p.node && self.cluster.node(x.node).soft & x.gpus != 0
                            });
                            // A gang unfunded now takes back only free occupancy.
                            let may = soft && (funded || !l.funded);
                            if l.revoke.is_none() && (may || l.backfill_for == Some(id)) {
                                self.revoke_at(lid, now, RevokeWhy::Reservation { by: id });
                            }
                        }
                    }
                }
            }
        }
    }
}
