//! What the shell reports: submissions, cancels, lease ends, node and GPU changes.

use super::*;
use crate::select::Selector;
use crate::workload::SpecError;

impl Scheduler {
    /// Accepts a workload; it is pending from `now`.
    pub fn submit(&mut self, now: Time, spec: WorkloadSpec) -> Result<WorkloadId, CoreError> {
        self.submit_as(now, spec, false)
    }

    /// Accepts a workload that waits held ([`Scheduler::release`] queues it): one
    /// element of an array past its limit, work behind a dependency or a begin time.
    pub fn submit_held(&mut self, now: Time, spec: WorkloadSpec) -> Result<WorkloadId, CoreError> {
        self.submit_as(now, spec, true)
    }

    fn submit_as(
        &mut self,
        now: Time,
        spec: WorkloadSpec,
        held: bool,
    ) -> Result<WorkloadId, CoreError> {
        let now = self.clock(now);
        let project = self
            .tree
            .find(&spec.project)
            .filter(|&g| self.tree.is_project(g))
            .ok_or_else(|| CoreError::UnknownProject(spec.project.clone()))?;
        let sel = self.check_fits(&spec)?;
        let id = WorkloadId(self.st.next_workload);
        self.st.next_workload += 1;
        if !held {
            self.st.demand[project.idx()] += u64::from(spec.total_gpus());
        }
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
            held,
            sel,
        };
        if !held {
            self.enqueue(QueueKey::of(&w));
        }
        self.st.workloads.insert(id, Box::new(w));
        Ok(id)
    }

    /// Whether some nodes of this cluster could ever hold `spec`; its selector.
    fn check_fits(&mut self, spec: &WorkloadSpec) -> Result<Selector, CoreError> {
        if let Err(SpecError::TooLong { field, value }) = spec.check_contract_length() {
            return Err(CoreError::Impossible {
                field,
                value,
                why: format!(
                    "longer than {} days; ask for at most 365d",
                    MAX_CONTRACT / 86_400
                ),
            });
        }
        // Over node kinds (cluster, size, type and features, with counts), not nodes:
        // the same answer as a scan of every node, at a cost that does not grow with
        // the cluster.
        let sel = self
            .st
            .cluster
            .selector(&spec.select)
            .map_err(|(field, why)| CoreError::Unplaceable { field, why })?;
        let c = &self.st.cluster;
        let admitted = c.kinds_admitted(&sel);
        let kinds = || admitted.iter().map(|(k, n)| (k, *n));
        if kinds().next().is_none() {
            let s = &spec.select;
            // Each part asked, named by its field; the error names the first.
            let asked = [
                (
                    "gpu_types",
                    !s.gpu_types.is_empty(),
                    format!("GPU type {}", s.gpu_types.join(" or ")),
                ),
                (
                    "constraint",
                    !s.features.is_empty(),
                    format!("features {}", s.features.join(" and ")),
                ),
                (
                    "cluster",
                    !s.cluster.is_empty(),
                    format!("cluster {}", s.cluster),
                ),
                (
                    "nodelist",
                    !s.nodelist.is_empty(),
                    format!("a name in {}", s.nodelist.join(",")),
                ),
                (
                    "exclude",
                    !s.exclude.is_empty(),
                    format!("a name outside {}", s.exclude.join(",")),
                ),
            ];
            let mut what = asked.iter().filter(|a| a.1);
            let field = what.clone().next().map_or("gpu_types", |a| a.0);
            let what: Vec<&str> = what.by_ref().map(|a| a.2.as_str()).collect();
            let why = if what.is_empty() {
                // Nothing was asked of a node: there is none.
                "the cluster has no nodes yet; start an agent on an enrolled host (`allot nodes` lists them), then submit".to_string()
            } else {
                format!(
                    "no node has {} together; `allot nodes` shows each node's type and features",
                    what.join(", ")
                )
            };
            return Err(CoreError::Unplaceable { field, why });
        }
        let max_gpus = kinds().map(|(k, _)| k.gpus).max().unwrap_or(0);
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
            kinds()
                .map(|(k, _)| k)
                .filter(|k| k.gpus >= spec.gpus_per_node)
        };
        let max_cpu = with_gpus().map(|k| k.cpu).max().unwrap_or(0);
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
            .filter(|k| k.cpu >= spec.cpu_per_node)
            .map(|k| k.memory_gb)
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
        for (k, count) in kinds() {
            if k.gpus >= spec.gpus_per_node
                && k.cpu >= spec.cpu_per_node
                && k.memory_gb >= spec.mem_per_node_gb
            {
                per_cluster[k.cluster as usize] += u64::from(count);
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
        Ok(sel)
    }

    /// Queues work at its place (taken by key, so a requeue need not copy the workload).
    pub(super) fn enqueue(&mut self, k: QueueKey) {
        self.queues[k.project.idx()].insert(k.shape, k.priority, k.submit, k.id);
        if let Some(f) = &mut self.fifo {
            f.queue.insert((k.submit, k.id));
        }
        self.st.pending += 1;
        if k.is_gang() {
            self.st.pending_gangs += 1;
        }
    }

    pub(super) fn dequeue(&mut self, id: WorkloadId) {
        let Some(k) = self.st.workloads.get(&id).map(|w| QueueKey::of(w)) else {
            return;
        };
        if let Some(f) = &mut self.fifo {
            f.queue.remove(&(k.submit, k.id));
        }
        if self.queues[k.project.idx()].remove(k.shape, k.priority, k.submit, k.id) {
            self.st.pending -= 1;
            if k.is_gang() {
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

    /// The shell reports how a lease is used (allotd's `Input::LeaseUse`, from its
    /// agent): `Some(t)`, idle since `t` (no terminal input and its GPUs idle);
    /// `None`, in use. Heeded for funded leases of a class protected by use
    /// (`policy.protect_by_use`), ignored for others: in use, such a lease is not
    /// taken for rebalancing, however long it has run; idle, it is protected until
    /// `t + idle_grace` or until its min runtime (and cooldown) lapses, whichever is
    /// later, then taken like any lapsed lease; used again, it is protected again. A
    /// revocation already under way goes on. Before the first report its min runtime
    /// protects it, as for any class.
    pub fn lease_use(
        &mut self,
        now: Time,
        lease: LeaseId,
        idle_since: Option<Time>,
    ) -> Result<(), CoreError> {
        let now = self.clock(now);
        let l = self
            .st
            .leases
            .get(&lease)
            .ok_or(CoreError::UnknownLease(lease.0))?;
        let w = self
            .st
            .workloads
            .get(&l.workload)
            .ok_or(CoreError::UnknownWorkload(l.workload.0))?;
        let Some(grace) = self.cfg.idle_grace(&w.spec.class) else {
            return Ok(());
        };
        let used = match idle_since {
            None => LeaseUse::InUse,
            Some(t) => LeaseUse::IdleSince(t.min(now)),
        };
        let at = if !l.funded || self.st.protect_forever {
            l.preemptible_at
        } else {
            match used {
                // Not before it ends: its time limit, when it has one, which tells
                // reservations when its GPUs free at the latest.
                LeaseUse::InUse => l.ends_by.unwrap_or(Time::MAX),
                LeaseUse::IdleSince(t) => {
                    // The clock's protection as at its start (see `start_lease`).
                    let clock = l
                        .start
                        .saturating_add(protection(w, l.funded, self.cfg.cooldown));
                    clock.max(t.saturating_add(grace))
                }
            }
        };
        if let Some(l) = self.st.leases.get_mut(&lease) {
            l.used = Some(used);
        }
        self.st.set_preemptible_at(now, lease, at);
        Ok(())
    }

    pub(super) fn end_lease(
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
        let asked = matches!(
            l.revoke,
            Some(Revocation {
                why: RevokeWhy::Requeued,
                ..
            })
        );
        let requeue = asked
            || self
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
        if matches!(
            end,
            LeaseEnd::Completed | LeaseEnd::Failed | LeaseEnd::TimeLimit
        ) {
            // Ended on its own: how long such a run lasts (`runlength.rs`).
            if let Some(w) = self.st.workloads.get(&wid) {
                self.st.run_lengths.record(
                    &w.spec.user,
                    &w.spec.class,
                    now.saturating_sub(l.start).max(1),
                );
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
            let key = QueueKey::of(w);
            if w.held {
                // Held while it ran its last stretch (`allot requeue --hold`): it
                // waits out of its queue until released.
            } else if self.st.held_back(wid) {
                // An earlier run of it still ends somewhere (a lost node's lease that
                // came back): it waits for that, out of its queue.
                self.hold_back(wid);
            } else {
                self.enqueue(key);
            }
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

    /// Takes a node out of the cluster for good (an operator retired it): it stops
    /// counting in capacity, so in every entitlement, and its name may join again as a
    /// new node. Refused while any lease, part of an ended lease or claim is there.
    pub fn remove_node(&mut self, now: Time, node: NodeId) -> Result<(), CoreError> {
        self.clock(now);
        if node.idx() >= self.st.cluster.len() {
            return Err(CoreError::UnknownNode(node.0));
        }
        let name = || self.st.cluster.node(node).spec.name.clone();
        let leaving = self
            .st
            .leaving
            .values()
            .any(|l| l.parts.iter().any(|p| p.node == node));
        if !self.st.node_leases[node.idx()].is_empty() || leaving {
            return Err(ClusterError::Busy(name()).into());
        }
        self.st.cluster.remove(node)?;
        Ok(())
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

    /// Changes a node's scheduling state. `Draining` revokes its resumable leases at
    /// their min-runtime lapse and the others `drain_grace` later (unless they end
    /// first), `DrainNow` and `Down` at once.
    pub fn set_node_state(
        &mut self,
        now: Time,
        node: NodeId,
        state: NodeState,
    ) -> Result<(), CoreError> {
        let now = self.clock(now);
        if node.idx() >= self.st.cluster.len() || self.st.cluster.node(node).removed {
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
            for lid in self.st.lease_ids_on(node) {
                let Some(l) = self.st.leases.get(&lid) else {
                    continue;
                };
                let (not_before, why) = match state {
                    NodeState::Draining => {
                        let grace = if l.resumable { 0 } else { self.cfg.drain_grace };
                        let at = now.saturating_add(grace);
                        (l.protected_until.max(at), RevokeWhy::Drain { node })
                    }
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
        for lid in self.st.lease_ids_on(node) {
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

    /// A node's GPU type and features as its agent now says them.
    pub fn relabel(
        &mut self,
        node: NodeId,
        gpu_type: &str,
        features: &[String],
    ) -> Result<(), crate::cluster::ClusterError> {
        if node.idx() < self.st.cluster.len() {
            self.st.cluster.relabel(node, gpu_type, features)?;
        }
        Ok(())
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
        if node.idx() >= self.st.cluster.len()
            || gpu >= self.st.cluster.node(node).spec.gpus
            || self.st.cluster.node(node).removed
        {
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
}

/// Where a pending workload waits: its project's queue, at its shape and priority, in
/// submit order.
#[derive(Debug, Clone, Copy)]
pub(super) struct QueueKey {
    project: GroupId,
    shape: Shape,
    priority: i32,
    submit: Time,
    id: WorkloadId,
}

impl QueueKey {
    /// The place of `w`.
    pub(super) fn of(w: &Workload) -> Self {
        QueueKey {
            project: w.project,
            shape: Shape::of(&w.spec, w.sel),
            priority: w.spec.priority,
            submit: w.submit,
            id: w.id,
        }
    }

    /// A protected gang: what reservations are for (`State::pending_gangs`).
    fn is_gang(&self) -> bool {
        self.shape.nodes > 1 && self.shape.protected
    }
}
