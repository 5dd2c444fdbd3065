//! What the agents do with each action of a pass (start, revoke, withdraw, reserve),
//! and the checks each action must pass as it is carried out.

use super::{Ev, Live, Prop, Shell};
use allot_fairshare::queue::Shape;
use allot_fairshare::time::Time;
use allot_fairshare::workload::NodeGpus;
use allot_fairshare::{
    GroupId, Lease, LeaseEnd, LeaseId, NodeId, NodeState, RevokeWhy, StartWhy, WorkloadId,
};
use std::collections::BTreeSet;

impl Shell {
    pub(super) fn on_start(
        &mut self,
        lid: LeaseId,
        wid: WorkloadId,
        placement: &[NodeGpus],
        funded: bool,
        why: &StartWhy,
    ) {
        let now = self.now;
        if self.held.contains(&wid) {
            self.fail(Prop::Books, format!("{wid:?} starts while held"));
        }
        match why {
            StartWhy::Free { .. } => self.stats.starts_free += 1,
            StartWhy::AfterPreemption => self.stats.starts_after_preemption += 1,
            StartWhy::Reservation => self.stats.starts_reservation += 1,
            StartWhy::Backfill { .. } => self.stats.starts_backfill += 1,
        }
        let Some(w) = self.sch.workload(wid).cloned() else {
            self.fail(Prop::Books, format!("{lid:?} starts unknown {wid:?}"));
            return;
        };
        let Some(lease) = self.sch.lease(lid).cloned() else {
            self.fail(
                Prop::Books,
                format!("{lid:?} started but the core has no such lease"),
            );
            return;
        };
        let spec = &w.spec;
        self.check_allowance_start(&w, &lease, funded, why);

        // Gang shape: k distinct nodes of one cluster, exactly gpus_per_node on each.
        if spec.nodes > 1 {
            self.stats.gang_starts += 1;
        }
        // Only on nodes of a GPU type it asked for, and none it excluded.
        let wrong = placement.iter().find_map(|p| {
            let n = &self.sch.cluster().node(p.node).spec;
            let t = &n.gpu_type;
            ((!spec.select.gpu_types.is_empty() && !spec.select.gpu_types.contains(t))
                || spec.select.exclude.contains(&n.name))
            .then(|| (p.node, format!("{t} named {}", n.name)))
        });
        if let Some((node, t)) = wrong {
            self.fail(
                Prop::Exclusive,
                format!(
                    "{lid:?} of {wid:?} asks for {:?} but not {:?}, and starts on {node:?}, a {t}",
                    spec.select.gpu_types, spec.select.exclude
                ),
            );
        }
        let c = self.sch.cluster();
        let nodes: BTreeSet<NodeId> = placement.iter().map(|p| p.node).collect();
        let clusters: BTreeSet<u16> = placement.iter().map(|p| c.node(p.node).cluster).collect();
        let per_node_ok = placement
            .iter()
            .all(|p| p.gpus.count_ones() == spec.gpus_per_node);
        if placement.len() != spec.nodes as usize
            || nodes.len() != placement.len()
            || clusters.len() != 1
            || !per_node_ok
        {
            self.fail(
                Prop::Gang,
                format!(
                    "{wid:?} asks {}×{} GPUs, {why:?} placed it on {placement:?}",
                    spec.nodes, spec.gpus_per_node
                ),
            );
        }

        // Only ready nodes, healthy GPUs the node has, and none an agent still holds.
        let c = self.sch.cluster();
        let mut bad = Vec::new();
        for p in placement {
            let n = c.node(p.node);
            if n.state != NodeState::Ready {
                bad.push(format!("{:?} is {:?}", p.node, n.state));
            }
            if p.gpus & !n.all() != 0 || p.gpus & !n.healthy != 0 {
                bad.push(format!(
                    "{:?} GPUs {:#b} outside healthy {:#b}",
                    p.node, p.gpus, n.healthy
                ));
            }
            for (other, l) in &self.live {
                let clash = l
                    .placement
                    .iter()
                    .any(|q| q.node == p.node && q.gpus & p.gpus != 0);
                if clash {
                    bad.push(format!(
                        "{:?} GPUs {:#b} still held by {other:?} of {:?}",
                        p.node, p.gpus, l.workload
                    ));
                }
            }
        }
        for (other, l) in &self.leaving {
            let clash = l.placement.iter().any(|q| {
                placement
                    .iter()
                    .any(|p| q.node == p.node && q.gpus & p.gpus != 0)
            });
            if clash {
                bad.push(format!("GPUs still held by {other:?}'s part being stopped"));
            }
        }
        if let Some((other, _)) = self.live.iter().find(|(_, l)| l.workload == wid) {
            bad.push(format!("{wid:?} already runs as {other:?}"));
        }
        if let Some((other, _)) = self.leaving.iter().find(|(_, l)| l.workload == wid) {
            bad.push(format!(
                "{wid:?} starts again while a part of its earlier run {other:?} still runs"
            ));
        }
        for b in bad {
            self.fail(
                Prop::Exclusive,
                format!("start {lid:?} of {wid:?} ({why:?}): {b}"),
            );
        }

        // Funding is the contract: only work that asks for protection gets it.
        if funded != lease.funded || (funded && spec.min_runtime == 0) {
            self.fail(
                Prop::Protection,
                format!(
                    "{lid:?} of {wid:?} started funded={funded} (lease says {}) with \
                     min_runtime {}",
                    lease.funded, spec.min_runtime
                ),
            );
        }
        if funded && lease.preemptible_at < now + spec.min_runtime {
            self.fail(
                Prop::Protection,
                format!(
                    "{lid:?} protected only until {} though min_runtime is {}",
                    lease.preemptible_at, spec.min_runtime
                ),
            );
        }
        if funded && w.last_preempted.is_some() && lease.preemptible_at < now + self.cooldown {
            self.fail(
                Prop::Cooldown,
                format!(
                    "{wid:?} was preempted at {:?} and restarts ({why:?}) as {lid:?} \
                     preemptible at {}, before the cooldown of {}s ends at {}",
                    w.last_preempted,
                    lease.preemptible_at,
                    self.cooldown,
                    now + self.cooldown
                ),
            );
        }

        let job = self
            .jobs
            .get(&wid)
            .cloned()
            .expect("submitted through the shell");
        let (len, end) = match job.time_limit {
            Some(tl) if tl < job.run => (tl, LeaseEnd::TimeLimit),
            _ if job.fails => (job.run, LeaseEnd::Failed),
            _ => (job.run, LeaseEnd::Completed),
        };
        self.push(now + len.max(1), Ev::End(lid, end));
        self.live.insert(
            lid,
            Live {
                workload: wid,
                project: w.project,
                start: now,
                placement: placement.to_vec(),
                gpus: placement
                    .iter()
                    .map(|p| u64::from(p.gpus.count_ones()))
                    .sum(),
            },
        );
        self.seen.insert(lid, lease);
    }

    pub(super) fn on_revoke(
        &mut self,
        lid: LeaseId,
        wid: WorkloadId,
        not_before: Time,
        why: &RevokeWhy,
    ) {
        let now = self.now;
        let Some(l) = self.sch.lease(lid).or_else(|| self.seen.get(&lid)).cloned() else {
            self.fail(Prop::Books, format!("revoke of {lid:?}, never started"));
            return;
        };
        if l.workload != wid {
            self.fail(Prop::Books, format!("revoke of {lid:?} names {wid:?}"));
        }
        let prior = self.revoked_at.get(&lid).copied();
        let news = prior.is_none_or(|p| not_before < p)
            || matches!(why, RevokeWhy::Cancelled | RevokeWhy::Requeued);
        if !news {
            self.fail(
                Prop::Revokes,
                format!(
                    "{lid:?} of {wid:?} revoked again ({why:?}, from {not_before}) though \
                     already revoked from {prior:?}"
                ),
            );
        }
        self.revoked_at
            .insert(lid, prior.map_or(not_before, |p| p.min(not_before)));
        let protected = l.funded && l.preemptible_at > now;
        match why {
            RevokeWhy::Preempted {
                by,
                unfunded,
                requester_ratio_after,
                victim_ratio_after,
            } => {
                if *unfunded {
                    self.stats.unfunded_preemptions += 1;
                } else {
                    self.stats.funded_preemptions += 1;
                }
                if protected || *unfunded == l.funded {
                    self.fail(
                        Prop::Protection,
                        format!(
                            "{lid:?} (funded={}, preemptible at {}) preempted by {by:?} \
                             (unfunded={unfunded})",
                            l.funded, l.preemptible_at
                        ),
                    );
                }
                let requester_funded = self
                    .sch
                    .workload(*by)
                    .is_some_and(|w| w.spec.min_runtime > 0);
                if !requester_funded {
                    self.fail(
                        Prop::Protection,
                        format!("{by:?} asks for no protection yet preempted {lid:?}"),
                    );
                }
                self.preemption_loss(*by, &l);
                if !*unfunded {
                    self.funded_preemption(
                        *by,
                        &l,
                        requester_ratio_after.unwrap_or(f64::NAN),
                        victim_ratio_after.unwrap_or(f64::NAN),
                    );
                }
            }
            RevokeWhy::Reservation { by } => {
                self.stats.reservation_revokes += 1;
                if protected {
                    self.fail(
                        Prop::Protection,
                        format!(
                            "{lid:?} protected until {} revoked for the reservation of {by:?}",
                            l.preemptible_at
                        ),
                    );
                }
                // Free occupancy never takes funded work: an unfunded gang's
                // reservation (its budget spent) revokes only unfunded leases and its
                // own backfill.
                let holder_unfunded = self
                    .sch
                    .workload(*by)
                    .is_some_and(|w| self.sch.budget_spent(w.project, now));
                if holder_unfunded && l.funded && l.backfill_for != Some(*by) {
                    self.fail(
                        Prop::Protection,
                        format!("funded {lid:?} revoked for the unfunded reservation of {by:?}"),
                    );
                }
            }
            RevokeWhy::Drain { .. } => {
                self.stats.drain_revokes += 1;
                if not_before < l.protected_until {
                    self.fail(
                        Prop::Protection,
                        format!(
                            "drain revokes {lid:?} from {not_before}, inside its min-runtime \
                             (until {})",
                            l.protected_until
                        ),
                    );
                }
            }
            RevokeWhy::DrainNow { .. } => self.stats.drain_now_revokes += 1,
            RevokeWhy::Cancelled | RevokeWhy::Requeued => self.stats.cancel_revokes += 1,
        }
        if self.live.contains_key(&lid) {
            self.last_revoke.insert(lid, why.clone());
            self.push(
                not_before.max(now) + self.save,
                Ev::End(lid, LeaseEnd::Revoked),
            );
        }
    }

    /// A drain ended: its revocation is taken back and the lease runs on.
    pub(super) fn on_withdraw(&mut self, lid: LeaseId) {
        let now = self.now;
        // Only a drain's revocation, and only once every node of the lease is ready.
        let ready = self.sch.lease(lid).is_some_and(|l| {
            l.placement
                .iter()
                .all(|p| self.sch.cluster().node(p.node).state == NodeState::Ready)
        });
        let ok = ready
            && matches!(
                self.last_revoke.get(&lid),
                Some(RevokeWhy::Drain { .. } | RevokeWhy::DrainNow { .. })
            );
        if !ok {
            self.fail(
                Prop::Revokes,
                format!(
                    "{lid:?} withdrawn at {now}, but its revocation was {:?} from {:?}",
                    self.last_revoke.get(&lid),
                    self.revoked_at.get(&lid)
                ),
            );
        }
        self.events
            .retain(|_, e| !matches!(e, Ev::End(l, LeaseEnd::Revoked) if *l == lid));
        self.revoked_at.remove(&lid);
        self.last_revoke.remove(&lid);
    }

    /// Adds what revoking `victim` throws away to `by`'s plan in this pass, and
    /// fails once the plan loses more than `max_loss_per_gpu` per GPU `by` asks.
    fn preemption_loss(&mut self, by: WorkloadId, victim: &Lease) {
        let cfg = self.sch.config();
        let Some(budget) = self
            .sch
            .workload(by)
            .map(|w| cfg.plan_loss_budget(&Shape::of(&w.spec, w.sel)))
        else {
            self.fail(Prop::Loss, format!("preempted by unknown {by:?}"));
            return;
        };
        let loss = victim.loss_at(self.now, cfg.victim_loss());
        let lost = self.plan_loss.entry(by).or_default();
        *lost += loss;
        let lost = *lost;
        if lost > budget {
            self.fail(
                Prop::Loss,
                format!(
                    "{by:?} preempts {:?}: its plan loses {lost} GPU-s, more than its \
                     budget of {budget}",
                    victim.id
                ),
            );
        }
    }

    fn funded_preemption(
        &mut self,
        by: WorkloadId,
        victim: &Lease,
        req_after: f64,
        vic_after: f64,
    ) {
        let now = self.now;
        let tree = self.sch.tree();
        let Some(req_project) = self.sch.workload(by).map(|w| w.project) else {
            self.fail(Prop::Cycle, format!("preempted by unknown {by:?}"));
            return;
        };
        // Where the two paths diverge is where the fair-share rule compares them; the
        // same project on both ends is a self-loop.
        let (gr, gv) = tree
            .diverging(req_project, victim.project)
            .unwrap_or((req_project, req_project));
        let names = (tree.group(gr).name.clone(), tree.group(gv).name.clone());
        if self.edges_at != now {
            self.edges.clear();
            self.edges_at = now;
        }
        if gr == gv || reaches(&self.edges, gv, gr) {
            self.fail(
                Prop::Cycle,
                format!(
                    "{by:?} in {} preempts {:?} in {}, closing a cycle over {:?}",
                    names.0, victim.workload, names.1, self.edges
                ),
            );
        }
        self.edges.insert((gr, gv));
        // Written so that a NaN ratio fails too.
        let apart = req_after + self.hysteresis <= vic_after + 1e-12;
        if !apart {
            self.fail(
                Prop::Cycle,
                format!(
                    "{by:?} preempts {:?} with requester ratio after {req_after} and victim \
                     ratio after {vic_after}, inside hysteresis {}",
                    victim.workload, self.hysteresis
                ),
            );
        }
        let bounced = self
            .funded_preemptions
            .iter()
            .find(|(t, a, b)| *a == victim.workload && *b == by && now < t + self.cooldown)
            .copied();
        if let Some((t, _, _)) = bounced {
            self.fail(
                Prop::Bounce,
                format!(
                    "{by:?} preempts {:?}, which preempted it at {t}, within the cooldown of {}s",
                    victim.workload, self.cooldown
                ),
            );
        }
        self.funded_preemptions.push((now, by, victim.workload));
    }

    pub(super) fn on_reserve(&mut self, wid: WorkloadId, nodes: &[NodeId], start: Time) {
        self.stats.reserves += 1;
        let Some(w) = self.sch.workload(wid) else {
            self.fail(Prop::Books, format!("reservation for unknown {wid:?}"));
            return;
        };
        let c = self.sch.cluster();
        let distinct: BTreeSet<NodeId> = nodes.iter().copied().collect();
        let clusters: BTreeSet<u16> = nodes.iter().map(|&n| c.node(n).cluster).collect();
        let fit = nodes.iter().all(|&n| {
            let n = c.node(n);
            n.state == NodeState::Ready && n.spec.gpus >= w.spec.gpus_per_node
        });
        if nodes.len() != w.spec.nodes as usize
            || distinct.len() != nodes.len()
            || clusters.len() != 1
            || !fit
            || start <= self.now
        {
            let nodes_wanted = w.spec.nodes;
            self.fail(
                Prop::Gang,
                format!("reservation for {wid:?} ({nodes_wanted} nodes) on {nodes:?} at {start}"),
            );
        }
    }
}

/// True when `to` is reachable from `from` over `edges`.
fn reaches(edges: &BTreeSet<(GroupId, GroupId)>, from: GroupId, to: GroupId) -> bool {
    let mut stack = vec![from];
    let mut seen = BTreeSet::new();
    while let Some(g) = stack.pop() {
        if g == to {
            return true;
        }
        if seen.insert(g) {
            stack.extend(
                edges
                    .range((g, GroupId(0))..)
                    .take_while(|e| e.0 == g)
                    .map(|e| e.1),
            );
        }
    }
    false
}
