//! The rules about hosts: registration and reconciliation, drains by author kind,
//! health reports through the circuit breaker.

use super::audit::revoke_text;
use super::audit::state_name;
use super::input::{drain_kind, GpuCondition, GpuSeen, HostDrain, Input, Verdict};
use super::out::{lease_wire, Applied, Command, Level, Out};
use super::{effective, Allocator, DrainRec, NodeRec};
use allot_common::drain::DrainAuthor;
use allot_fairshare::{
    CoreError, LeaseId, NodeId, NodeSpec, NodeState, Time, WorkloadId, WorkloadState,
};
use std::collections::{BTreeMap, BTreeSet};

/// What a registering host says it has.
#[derive(Clone, Copy)]
pub(super) struct Seen<'a> {
    /// Its GPUs.
    pub gpus: &'a [GpuSeen],
    /// allotd's leases it runs.
    pub running: &'a [u64],
    /// Its drains.
    pub drains: &'a [HostDrain],
    /// Whether leases allotd ended are held and ended (`Input::Register`).
    pub end_strays: bool,
    /// How soon after its last word from allotd the host has stopped its leases
    /// (`Input::Register`); 0: it does not.
    pub fence_s: u64,
}

/// How long past a lost host's `fence_s` allotd still waits before it takes the
/// host's leases to be over: the fence is checked every 2 s on the host, and two
/// clocks never run at quite the same rate.
pub const FENCE_MARGIN: u64 = 10;

fn no_node(node: &str) -> CoreError {
    CoreError::Config(format!("no node {node:?}; `allot nodes` lists them"))
}

fn failed(g: &GpuSeen) -> bool {
    g.state == GpuCondition::Failed
}

impl Allocator {
    /// A host joins for the first time.
    pub(super) fn add_node(
        &mut self,
        at: Time,
        spec: &NodeSpec,
        gpu_uuids: &[String],
    ) -> Result<(), CoreError> {
        let id = self.core.add_node(at, spec.clone())?;
        self.names.push(spec.name.clone());
        self.nodes.insert(
            spec.name.clone(),
            NodeRec {
                id,
                spec: spec.clone(),
                gpu_uuids: gpu_uuids.to_vec(),
                state: NodeState::Ready,
                drains: BTreeMap::new(),
                held: None,
                connected: false,
                last_seen: at,
                last_heard: at,
                verdict: Verdict::Ok,
                seen: Vec::new(),
                gpus: Vec::new(),
                addr: String::new(),
                fence_s: 0,
            },
        );
        Ok(())
    }

    /// An admin removes a host for good: out of the core (its GPUs stop counting
    /// in capacity), out of the node table, and its credential revoked so that only
    /// a new enrollment brings it back, as a new node. Refused while work is there.
    pub(super) fn remove_node(
        &mut self,
        at: Time,
        node: &str,
        by: &str,
        a: &mut Applied,
    ) -> Result<(), CoreError> {
        if !self.nodes.contains_key(node) && !self.creds.nodes.contains_key(node) {
            return Err(no_node(node));
        }
        // Enrolled but never registered: only its credential goes.
        let gpus = match self.nodes.get(node) {
            Some(n) => {
                let gpus = n.spec.gpus;
                self.core.remove_node(at, n.id)?;
                self.nodes.remove(node);
                gpus
            }
            None => 0,
        };
        if let Some(c) = self.creds.nodes.get_mut(node) {
            c.revoked = true;
            c.removed = true;
            c.offer = None;
            c.certs.clear();
            c.by = by.to_string();
        }
        a.audit(
            0,
            0,
            format!(
                "node {node} removed by {by}: its {gpus} GPUs no longer count; capacity is {} GPUs",
                self.core.cluster().total_gpus()
            ),
        );
        Ok(())
    }

    /// A drain of one author kind put in force or (with `Ready`) lifted; returns
    /// whether anything changed (lifting what is not there is no change).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn node_state(
        &mut self,
        at: Time,
        node: &str,
        state: NodeState,
        reason: &str,
        by: &str,
        author: &str,
        a: &mut Applied,
    ) -> Result<bool, CoreError> {
        let n = self.nodes.get_mut(node).ok_or_else(|| no_node(node))?;
        let kind = drain_kind(by).to_string();
        let lifted = state == NodeState::Ready;
        if lifted && by == "operator" {
            // 0.1.0 had one drain per node, and its operator undrain lifted it
            // whoever had drained: replayed, it means the same.
            n.drains.clear();
        } else if lifted {
            if n.drains.remove(&kind).is_none() {
                // Nothing of that author to lift: the journal keeps no no-ops.
                return Ok(false);
            }
        } else {
            n.drains.insert(
                kind.clone(),
                DrainRec {
                    state,
                    reason: reason.to_string(),
                    since: at,
                    author: author.to_string(),
                },
            );
            *self.counters.drains.entry(kind.clone()).or_default() += 1;
            if kind == DrainAuthor::Health.as_str() {
                self.auto_drains.push_back((at, node.to_string()));
                n.held = None;
            }
        }
        let eff = effective(&n.drains);
        if eff != n.state || !lifted {
            // A new drain revokes again (its own lapse rule); a lifted one
            // withdraws what it queued when the node is ready again.
            self.core.set_node_state(at, n.id, eff)?;
            n.state = eff;
        }
        if kind == DrainAuthor::ClusterOperator.as_str() || kind == DrainAuthor::Health.as_str() {
            // The agent refuses starts and revokes too, and shows who asked.
            a.send(
                node,
                Command::Drain {
                    drain: !lifted,
                    now: state == NodeState::DrainNow,
                    reason: reason.to_string(),
                    by: kind.clone(),
                },
            );
        }
        a.audit(
            0,
            0,
            if lifted {
                format!(
                    "node {node}: {kind} drain lifted ({reason}); now {}",
                    state_name(eff)
                )
            } else {
                format!("node {node}: {} by {kind}: {reason}", state_name(state))
            },
        );
        Ok(true)
    }

    /// The host operator's own drain as its agent reports it: a fact allotd shows and
    /// schedules by (no work is sent to a host its operator drained). Returns
    /// whether it changed.
    fn sync_local_drain(
        &mut self,
        at: Time,
        node: &str,
        drains: &[HostDrain],
        a: &mut Applied,
    ) -> bool {
        let theirs = drains
            .iter()
            .find(|d| d.by == DrainAuthor::LocalOperator.as_str() && !d.held);
        let ours = self
            .nodes
            .get(node)
            .and_then(|n| n.drains.get(DrainAuthor::LocalOperator.as_str()));
        let want = theirs.map(|d| {
            (
                if d.now {
                    NodeState::DrainNow
                } else {
                    NodeState::Draining
                },
                d.reason.clone(),
                d.author.clone(),
            )
        });
        let have = ours.map(|d| (d.state, d.reason.clone(), d.author.clone()));
        if want == have {
            return false;
        }
        let (state, reason, author) = want.unwrap_or((
            NodeState::Ready,
            "undrained on the host".into(),
            String::new(),
        ));
        match self.node_state(
            at,
            node,
            state,
            &reason,
            DrainAuthor::LocalOperator.as_str(),
            &author,
            a,
        ) {
            Ok(changed) => changed,
            Err(e) => {
                a.notice(
                    Level::Warn,
                    node,
                    format!("the host's drain not recorded: {e}"),
                );
                false
            }
        }
    }

    /// A host (re)registers: added if new, back to ready if it was lost, its own
    /// drain recorded; then reconciled: a lease allotd placed there that the host
    /// does not run is started again (it never arrived, or the host will answer that
    /// it ended), a lease the host runs that allotd does not hold is left running and
    /// reported, and allotd's drains are put in force there (one the host holds that
    /// allotd lifted meanwhile is lifted).
    pub(super) fn register(
        &mut self,
        at: Time,
        spec: &NodeSpec,
        gpu_uuids: &[String],
        seen: &Seen<'_>,
        addr: &str,
        a: &mut Applied,
    ) -> Result<(), CoreError> {
        let Seen {
            gpus,
            running,
            drains,
            end_strays,
            fence_s,
        } = *seen;
        let name = spec.name.as_str();
        match self
            .nodes
            .get(name)
            .map(|n| (n.id, n.drains.contains_key(DrainAuthor::Lost.as_str())))
        {
            None => self.add_node(at, spec, gpu_uuids)?,
            Some((id, lost)) => {
                if lost {
                    self.node_state(
                        at,
                        name,
                        NodeState::Ready,
                        "agent back",
                        DrainAuthor::Lost.as_str(),
                        "",
                        a,
                    )?;
                }
                // Its GPU type and features as it says them now (a node known from
                // before types existed, or a changed agent config).
                self.core
                    .relabel(id, &spec.gpu_type, &spec.features)
                    .map_err(CoreError::Cluster)?;
                if let Some(n) = self.nodes.get_mut(name) {
                    n.spec.gpu_type.clone_from(&spec.gpu_type);
                    n.spec.features.clone_from(&spec.features);
                }
                // A host that comes back may take what it refused before.
                self.core.node_changed(id);
            }
        }
        self.sync_local_drain(at, name, drains, a);
        if let Some(id) = self.nodes.get(name).map(|n| n.id) {
            // A GPU that failed, or was cleared, while the host was away is as it
            // says now: the registration is a report like any other.
            if self.sync_gpu_health(id, gpus) {
                self.core.node_changed(id);
            }
        }
        if let Some(n) = self.nodes.get_mut(name) {
            n.seen = gpus.to_vec();
            n.fence_s = fence_s;
            // An agent that sends no address keeps the last one known.
            if !addr.is_empty() {
                n.addr = addr.to_string();
            }
        }
        let running: BTreeSet<u64> = running.iter().copied().collect();
        let ours: BTreeSet<u64> = self.leases_on(name).into_iter().map(|(l, _)| l).collect();
        for lease in ours.difference(&running) {
            if let Some(cmd) = self.start_command(*lease, name) {
                a.send(name, cmd);
            }
        }
        // Parts of ended leases allotd held here that the host no longer runs: gone.
        for lease in self.leaving_on(name) {
            if !running.contains(&lease) {
                self.part_gone(at, lease, name, a);
            }
        }
        // What allotd wants stopped here, whatever was sent before: a revocation
        // sent while the host was away reached nobody.
        for out in self.wanted_stops(Some(name)) {
            if let Out::Send { node, cmd } = out {
                a.send(&node, cmd);
            }
        }
        for lease in running.difference(&ours) {
            let known = self
                .work
                .values()
                .find(|w| w.leases.contains(lease))
                .map(|w| w.id);
            match known {
                Some(wid) if end_strays && self.core.lease(LeaseId(*lease)).is_none() => {
                    self.stray(at, *lease, wid, name, gpus, a);
                }
                _ => {
                    // Not allotd's to end: reported, not killed.
                    a.notice(
                        Level::Warn,
                        name,
                        format!(
                            "agent runs {} which {}; left running",
                            lease_wire(*lease),
                            if known.is_some() {
                                "allotd holds as live elsewhere"
                            } else {
                                "allotd never placed"
                            }
                        ),
                    );
                }
            }
        }
        if let Some(n) = self.nodes.get(name) {
            for kind in [
                DrainAuthor::ClusterOperator.as_str(),
                DrainAuthor::Health.as_str(),
            ] {
                let ours = n.drains.get(kind);
                let theirs = drains.iter().find(|d| d.by == kind && !d.held);
                if ours.is_none() && theirs.is_none() {
                    continue;
                }
                a.send(
                    name,
                    Command::Drain {
                        drain: ours.is_some(),
                        now: ours.is_some_and(|d| d.state == NodeState::DrainNow),
                        reason: ours.map_or(String::new(), |d| d.reason.clone()),
                        by: kind.into(),
                    },
                );
            }
        }
        Ok(())
    }

    /// What allotd wants stopped, as commands to the hosts (all, or `node`'s): each
    /// live lease's revocation in force (its `not_before` and reason, as the core
    /// keeps them), and each part of an ended lease still held on its host, now.
    /// This is state, not a message: it is sent on every registration and every
    /// periodic resync, and an agent takes a repeat as a no-op.
    pub fn wanted_stops(&self, node: Option<&str>) -> Vec<Out> {
        let mut out = Vec::new();
        let ours = |n: &str| node.is_none_or(|want| want == n);
        for l in self.core.leases() {
            let Some(r) = &l.revoke else { continue };
            let why = revoke_text(&r.why, &self.names).1;
            for (host, _) in self.lease_hosts.get(&l.id.0).into_iter().flatten() {
                if ours(host) {
                    out.push(Out::Send {
                        node: host.clone(),
                        cmd: Command::Revoke {
                            lease: l.id.0,
                            not_before: r.not_before,
                            why: why.clone(),
                        },
                    });
                }
            }
        }
        for (lease, l) in self.core.leaving() {
            for p in &l.parts {
                let Some(host) = self.names.get(p.node.idx()).filter(|h| ours(h)) else {
                    continue;
                };
                out.push(Out::Send {
                    node: host.clone(),
                    cmd: Command::Revoke {
                        lease: lease.0,
                        not_before: 0, // now, whatever the host's clock says
                        why: "its lease has ended; stop what is left of it".into(),
                    },
                });
            }
        }
        out
    }

    /// A host came back running `lease` of workload `wid`, which allotd ended while
    /// it was away (the node was declared lost, and the work may run again
    /// elsewhere): the lease is ended through its ladder, its GPUs stay held until
    /// the host reports it gone, and a workload waiting to run again waits for that,
    /// so the work never runs twice. The choice and its reason go in the history.
    fn stray(
        &mut self,
        at: Time,
        lease: u64,
        wid: u64,
        name: &str,
        gpus: &[GpuSeen],
        a: &mut Applied,
    ) {
        let Some(node) = self.nodes.get(name).map(|n| n.id) else {
            return;
        };
        let wire = lease_wire(lease);
        let already = self
            .core
            .leaving()
            .get(&LeaseId(lease))
            .is_some_and(|l| l.parts.iter().any(|p| p.node == node));
        let why = format!(
            "allotd had ended {wire} (its node was declared lost) and its work may run again elsewhere; ended so that it never runs twice"
        );
        a.send(
            name,
            Command::Revoke {
                lease,
                not_before: 0, // now, whatever the host's clock says
                why: why.clone(),
            },
        );
        if already {
            return;
        }
        let mask = gpus
            .iter()
            .filter(|g| g.lease == wire && g.index < 64)
            .fold(0u64, |m, g| m | (1u64 << g.index));
        // A workload the core no longer remembers has long ended: nothing waits.
        let held = self
            .core
            .hold_stray(at, LeaseId(lease), WorkloadId(wid), node, mask)
            .ok()
            .flatten()
            .unwrap_or(0);
        let now = match self.work.get(&wid) {
            Some(w) if w.state == WorkloadState::Pending => {
                "the work waits for it to end, then starts again".to_string()
            }
            Some(w) if w.state == WorkloadState::Running => format!(
                "the work already runs again as {}",
                w.leases.last().map_or(String::new(), |l| lease_wire(*l))
            ),
            Some(w) => format!("the workload has ended ({})", w.end_reason),
            None => "the workload has ended".into(),
        };
        a.audit(
            wid,
            lease,
            format!(
                "node {name} came back running {wire} ({} GPUs), which allotd had ended (the node was declared lost): it is revoked now so that the work never runs twice; {now}",
                held.count_ones()
            ),
        );
    }

    /// A host's registration shows a part of an ended lease allotd held there gone.
    fn part_gone(&mut self, at: Time, lease: u64, name: &str, a: &mut Applied) {
        let Some(node) = self.nodes.get(name).map(|n| n.id) else {
            return;
        };
        let wid = self
            .core
            .leaving()
            .get(&LeaseId(lease))
            .map(|l| l.workload.0);
        if self.core.part_left(at, LeaseId(lease), node).is_ok() {
            a.audit(
                wid.unwrap_or(0),
                lease,
                format!(
                    "{} part on {name}: not running when the host registered; its GPUs are free",
                    lease_wire(lease)
                ),
            );
        }
    }

    /// A host's health report; returns whether anything the journal keeps changed.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn health(
        &mut self,
        at: Time,
        node: &str,
        verdict: Verdict,
        gpus: &[GpuSeen],
        reasons: &str,
        drains: &[HostDrain],
        a: &mut Applied,
    ) -> Result<bool, CoreError> {
        let n = self.nodes.get_mut(node).ok_or_else(|| no_node(node))?;
        let id = n.id;
        let prev = std::mem::replace(&mut n.seen, gpus.to_vec());
        let prev_verdict = std::mem::replace(&mut n.verdict, verdict);
        let health_drained = n.drains.contains_key(DrainAuthor::Health.as_str());
        let mut changed = prev != gpus || prev_verdict != verdict;
        // Whether the host changed in a way that may let it take what it refused.
        let mut node_changed = prev_verdict != verdict;
        for g in gpus {
            let before = prev.iter().find(|p| p.index == g.index);
            node_changed |= before.is_none_or(|p| p.state != g.state || p.lease != g.lease);
        }
        node_changed |= self.sync_gpu_health(id, gpus);
        changed |= self.sync_local_drain(at, node, drains, a);
        if node_changed {
            self.core.node_changed(id);
        }
        match verdict {
            Verdict::Drain | Verdict::DrainNow if !health_drained => {
                // A drain-now caused by a failed GPU ends only that GPU's lease (the
                // agent killed it); the others keep their protection.
                let now_ = verdict == Verdict::DrainNow && !gpus.iter().any(failed);
                changed |= self.health_drain(at, node, reasons, now_, a)?;
            }
            Verdict::Ok => {
                if let Some(n) = self.nodes.get_mut(node) {
                    changed |= n.held.take().is_some();
                }
                if health_drained {
                    changed |= self.node_state(
                        at,
                        node,
                        NodeState::Ready,
                        "health verdict ok",
                        DrainAuthor::Health.as_str(),
                        "",
                        a,
                    )?;
                }
            }
            _ => {}
        }
        Ok(changed)
    }

    /// The core's pool of node `id` set to the host's word: a GPU is in it exactly
    /// when the report does not say it failed. Compared with the pool itself, not
    /// with the last report, so no path (a registration, a restart) can leave the
    /// two apart. Returns whether the pool changed.
    fn sync_gpu_health(&mut self, id: NodeId, gpus: &[GpuSeen]) -> bool {
        let mut changed = false;
        for g in gpus {
            let in_pool = g.index < 64
                && self.core.cluster().len() > id.idx()
                && self.core.cluster().node(id).healthy & (1u64 << g.index) != 0;
            if in_pool == failed(g) {
                // An index the host does not have is refused by the core; the report
                // is still taken.
                changed |= self.core.set_gpu_health(id, g.index, !failed(g)).is_ok();
            }
        }
        changed
    }

    /// A health drain through the circuit breaker, or held (and the host told to
    /// hold it too, so it keeps serving its healthy GPUs); returns whether anything
    /// the journal keeps changed.
    fn health_drain(
        &mut self,
        at: Time,
        node: &str,
        reasons: &str,
        now_: bool,
        a: &mut Applied,
    ) -> Result<bool, CoreError> {
        let ok = self.breaker_allows(at, node);
        let n = self.nodes.get_mut(node).ok_or_else(|| no_node(node))?;
        let first = n.held.is_none();
        let held = (!ok).then(|| (reasons.to_string(), now_));
        let changed = n.held != held;
        n.held = held;
        if !ok {
            if first {
                self.counters.breaker_held += 1;
                a.notice(
                    Level::Error,
                    node,
                    format!("automatic drain HELD by the circuit breaker: too many nodes drained recently; drain by hand if it is real ({reasons})"),
                );
            }
            a.send(
                node,
                Command::Hold {
                    now: now_,
                    reasons: reasons.to_string(),
                },
            );
            return Ok(changed);
        }
        let state = if now_ {
            NodeState::DrainNow
        } else {
            NodeState::Draining
        };
        Ok(self.node_state(
            at,
            node,
            state,
            reasons,
            DrainAuthor::Health.as_str(),
            "",
            a,
        )? || changed)
    }

    /// A held health drain looked at again: through once the breaker has room.
    pub(super) fn recheck_held(
        &mut self,
        at: Time,
        node: &str,
        a: &mut Applied,
    ) -> Result<bool, CoreError> {
        let n = self.nodes.get(node).ok_or_else(|| no_node(node))?;
        let Some((reasons, now_)) = n.held.clone() else {
            return Ok(false);
        };
        if n.drains.contains_key(DrainAuthor::Health.as_str()) || !self.breaker_allows(at, node) {
            return Ok(false);
        }
        self.health_drain(at, node, &reasons, now_, a)
    }
}

impl Allocator {
    /// Nodes whose agent has been silent for more than `grace` seconds, counted from
    /// `since` at the earliest (the serving process's start, so a restart loses no
    /// node at once): not connected, not already down.
    pub fn silent_nodes(&self, now: Time, since: Time, grace: u64) -> Vec<String> {
        self.nodes
            .values()
            .filter(|n| {
                !n.connected
                    && n.state != NodeState::Down
                    && now.saturating_sub(n.last_seen.max(since)) > grace
            })
            .map(|n| n.spec.name.clone())
            .collect()
    }

    /// What marks a silent node lost: down by the `lost` author, so it takes no
    /// work until its agent returns.
    pub fn lost_input(node: &str, grace: u64) -> Input {
        Input::NodeState {
            node: node.to_string(),
            state: NodeState::Down,
            reason: format!("agent silent for more than {grace}s"),
            by: DrainAuthor::Lost.as_str().into(),
            author: String::new(),
        }
    }

    /// Lost nodes whose work is known to be over, so that it may run elsewhere:
    /// their agent fences, and its `fence_s` and [`FENCE_MARGIN`] have passed since
    /// it was last heard (counted from `since` at the earliest: allotd's start).
    /// A node whose agent does not fence is never one: its leases are held until
    /// the host reports, for a workload must never run twice at once.
    pub fn fenced_nodes(&self, now: Time, since: Time) -> Vec<String> {
        self.nodes
            .values()
            .filter(|n| {
                let name = n.spec.name.as_str();
                !n.connected
                    && n.drains.contains_key(DrainAuthor::Lost.as_str())
                    && n.fence_s > 0
                    && now.saturating_sub(n.last_heard.max(since))
                        >= n.fence_s.saturating_add(FENCE_MARGIN)
                    && (!self.leases_on(name).is_empty() || !self.leaving_on(name).is_empty())
            })
            .map(|n| n.spec.name.clone())
            .collect()
    }

    /// For a node of [`Allocator::fenced_nodes`]: the ends of its parts, as
    /// node-lost (work that may be requeued is). Should the node come back running
    /// them, they are held again and ended then; the parts of its gangs elsewhere
    /// are told to stop and stay held until they have.
    pub fn lost_parts(&self, node: &str) -> Vec<Input> {
        let fence = self.nodes.get(node).map_or(0, |n| n.fence_s);
        let leases = self.leases_on(node).into_iter().map(|(l, _)| l);
        leases
            .chain(self.leaving_on(node))
            .map(|lease| Input::LeaseEnded {
                lease,
                end: allot_fairshare::LeaseEnd::NodeLost,
                reason: format!(
                    "node {node} lost: its host stops its work within {fence}s of losing allotd, and that has passed"
                ),
                node: node.to_string(),
                exit_code: None,
                signal: None,
                part: true,
                leaving: true,
            })
            .collect()
    }
}
