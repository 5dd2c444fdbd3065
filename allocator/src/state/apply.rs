//! [`Allocator::apply`]: every rule of the state machine.

use super::audit::{revoke_text, start_text};
use super::input::Input;
use super::out::{lease_wire, Applied, Command};
use super::{start_command, Allocator, WorkRec};
use allot_fairshare::LeaseEnd;
use allot_fairshare::{Action, CoreError, LeaseId, Time, WorkloadId, WorkloadState};

impl Allocator {
    /// Applies one input at time `at`. Rejected inputs change nothing.
    pub fn apply(&mut self, at: Time, input: &Input) -> Result<Applied, CoreError> {
        let mut a = Applied {
            changed: true,
            ..Applied::default()
        };
        match input {
            Input::AddNode { spec, gpu_uuids } => self.add_node(at, spec, gpu_uuids)?,
            Input::Submit { spec, argv, hook } => {
                let id = self.core.submit(at, spec.clone())?;
                self.work.insert(
                    id.0,
                    WorkRec {
                        id: id.0,
                        spec: spec.clone(),
                        argv: argv.clone(),
                        hook: hook.clone(),
                        submit: at,
                        state: WorkloadState::Pending,
                        start: 0,
                        end: 0,
                        end_reason: String::new(),
                        leases: Vec::new(),
                        nodes: Vec::new(),
                        preemptions: 0,
                        funded: false,
                        runs: Vec::new(),
                    },
                );
                a.id = Some(id.0);
            }
            Input::Cancel { id, by } => {
                self.core.cancel(at, WorkloadId(*id))?;
                self.sync(at, *id, "cancelled");
                if !by.is_empty() {
                    a.audit(*id, 0, format!("cancelled by {by}"));
                }
            }
            Input::LeaseEnded {
                lease,
                end,
                reason,
                node,
            } => {
                let wid = self
                    .core
                    .lease(LeaseId(*lease))
                    .map(|l| l.workload.0)
                    .ok_or(CoreError::UnknownLease(*lease))?;
                // A node reports its own leases only: another node's is not its to end.
                if !node.is_empty()
                    && !self
                        .lease_hosts
                        .get(lease)
                        .is_some_and(|h| h.iter().any(|(n, _)| n == node))
                {
                    return Err(CoreError::UnknownLease(*lease));
                }
                match self.nodes.get(node) {
                    Some(n) if *end == LeaseEnd::Refused => {
                        self.core.lease_refused(at, LeaseId(*lease), n.id)?
                    }
                    _ => self.core.lease_ended(at, LeaseId(*lease), *end)?,
                };
                // The other hosts of a gang stop too.
                for (node, _) in self.lease_hosts.remove(lease).unwrap_or_default() {
                    a.send(
                        &node,
                        Command::Revoke {
                            lease: *lease,
                            not_before: at,
                            why: "another part of the gang ended".into(),
                        },
                    );
                }
                let how = end.as_str();
                self.sync(at, wid, how);
                a.audit(
                    wid,
                    *lease,
                    format!("lease {} ended: {how} ({reason})", lease_wire(*lease)),
                );
            }
            Input::NodeState {
                node,
                state,
                reason,
                by,
                author,
            } => {
                a.changed = self.node_state(at, node, *state, reason, by, author, &mut a)?;
            }
            Input::NodeChanged { node } => {
                let id = self
                    .nodes
                    .get(node)
                    .map(|n| n.id)
                    .ok_or_else(|| CoreError::Config(format!("no node {node:?}")))?;
                self.core.node_changed(id);
            }
            Input::GpuHealth { node, gpu, healthy } => {
                let id = self
                    .nodes
                    .get(node)
                    .map(|n| n.id)
                    .ok_or_else(|| CoreError::Config(format!("no node {node:?}")))?;
                self.core.set_gpu_health(id, *gpu, *healthy)?;
            }
            Input::SetWeight { group, weight, by } => {
                self.core.set_weight(group, *weight)?;
                let by = if by.is_empty() {
                    String::new()
                } else {
                    format!(" by {by}")
                };
                a.audit(0, 0, format!("weight of {group} set to {weight}{by}"));
            }
            Input::TokenCreated { .. }
            | Input::TokenRevoked { .. }
            | Input::NodeOffered { .. }
            | Input::NodeCertified { .. }
            | Input::NodeRevoked { .. } => self.apply_creds(at, input, &mut a)?,
            Input::Register {
                spec,
                gpu_uuids,
                gpus,
                running,
                drains,
            } => self.register(at, spec, gpu_uuids, gpus, running, drains, &mut a)?,
            Input::Health {
                node,
                verdict,
                gpus,
                reasons,
                drains,
            } => a.changed = self.health(at, node, *verdict, gpus, reasons, drains, &mut a)?,
            Input::RecheckHeld { node } => a.changed = self.recheck_held(at, node, &mut a)?,
            Input::Schedule => {
                let d = self.core.schedule(at);
                // Claims and reservations are plans the next pass makes again: only
                // decisions are facts to keep.
                a.changed = !d.actions.is_empty();
                a.next_wakeup = d.next_wakeup;
                if a.changed {
                    a.record = Some(Input::Decided {
                        actions: d.actions.clone(),
                    });
                }
                for act in d.actions {
                    self.act(at, act, &mut a);
                }
            }
            Input::Decided { actions } => {
                self.core.replay(at, actions)?;
                for act in actions {
                    self.act(at, act.clone(), &mut a);
                }
            }
        }
        Ok(a)
    }

    /// Why workload `id` waits, if it does, as of `at` (the core renders the text
    /// of one workload on read: no pass explains the whole queue).
    pub fn explanation(&self, at: Time, id: u64) -> String {
        self.core
            .explain_workload(at, WorkloadId(id))
            .map(|e| e.text)
            .unwrap_or_default()
    }

    fn act(&mut self, at: Time, act: Action, a: &mut Applied) {
        match act {
            Action::Start {
                lease,
                workload,
                placement,
                funded,
                why,
            } => {
                let mut hosts = Vec::new();
                for p in &placement {
                    let Some(name) = self.names.get(p.node.idx()).cloned() else {
                        continue;
                    };
                    let uuids: Vec<String> = self
                        .nodes
                        .get(&name)
                        .map(|n| {
                            (0..n.spec.gpus)
                                .filter(|b| p.gpus & (1u64 << b) != 0)
                                .filter_map(|b| n.gpu_uuids.get(b as usize).cloned())
                                .collect()
                        })
                        .unwrap_or_default();
                    hosts.push((name, uuids));
                }
                let Some(w) = self.work.get_mut(&workload.0) else {
                    return;
                };
                w.state = WorkloadState::Running;
                w.start = at;
                w.funded = funded;
                w.leases.push(lease.0);
                w.nodes = hosts.iter().map(|(n, _)| n.clone()).collect();
                w.runs.push(super::RunRec {
                    lease: lease.0,
                    nodes: w.nodes.clone(),
                });
                // A new run: how the last one ended stays in the history.
                w.end_reason.clear();
                self.counters
                    .waits
                    .entry(w.spec.class.clone())
                    .or_default()
                    .add(at.saturating_sub(w.submit));
                let w = w.clone();
                for (node, gpus) in &hosts {
                    a.send(node, start_command(lease.0, &w, at, gpus.clone()));
                }
                a.audit(
                    workload.0,
                    lease.0,
                    format!(
                        "start {} on {} ({}): {}",
                        lease_wire(lease.0),
                        w.nodes.join(","),
                        if funded { "funded" } else { "unfunded" },
                        start_text(&why)
                    ),
                );
                self.lease_hosts.insert(lease.0, hosts);
            }
            Action::Revoke {
                lease,
                workload,
                not_before,
                why,
            } => {
                let (kind, text) = revoke_text(&why, &self.names);
                *self.counters.revocations.entry(kind).or_default() += 1;
                for (node, _) in self.lease_hosts.get(&lease.0).cloned().unwrap_or_default() {
                    a.send(
                        &node,
                        Command::Revoke {
                            lease: lease.0,
                            not_before,
                            why: text.clone(),
                        },
                    );
                }
                a.audit(
                    workload.0,
                    lease.0,
                    format!(
                        "revoke {} not before {not_before}: {text}",
                        lease_wire(lease.0)
                    ),
                );
            }
            Action::Withdraw { lease, workload } => {
                for (node, _) in self.lease_hosts.get(&lease.0).cloned().unwrap_or_default() {
                    a.send(
                        &node,
                        Command::Withdraw {
                            lease: lease.0,
                            why: "the drain ended".into(),
                        },
                    );
                }
                a.audit(
                    workload.0,
                    lease.0,
                    format!(
                        "revocation of {} withdrawn: the drain that asked for it ended",
                        lease_wire(lease.0)
                    ),
                );
            }
            Action::Reserve {
                workload,
                nodes,
                start,
            } => {
                let names: Vec<String> = nodes
                    .iter()
                    .filter_map(|n| self.names.get(n.idx()).cloned())
                    .collect();
                a.audit(
                    workload.0,
                    0,
                    format!(
                        "reserve {} for the gang, expected free at {start}",
                        names.join(",")
                    ),
                );
            }
        }
    }

    /// Copies the core's view of a workload after a change.
    fn sync(&mut self, at: Time, id: u64, how: &str) {
        let Some(cw) = self.core.workload(WorkloadId(id)) else {
            return;
        };
        let (state, preemptions) = (cw.state, cw.preemptions);
        if let Some(w) = self.work.get_mut(&id) {
            w.state = state;
            w.preemptions = preemptions;
            w.end_reason = how.to_string();
            if state != WorkloadState::Running {
                w.nodes.clear();
            }
            if state.is_final() {
                w.end = at;
            }
        }
    }
}
