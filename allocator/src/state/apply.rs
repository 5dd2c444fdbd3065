//! [`Allocator::apply`]: every rule of the state machine.

use super::audit::{revoke_text, revoke_when, start_text};
use super::input::Input;
use super::out::Level;
use super::out::{lease_wire, Applied, Command, Out};
use super::{Allocator, ArrayPos, HoldRec, RunRec, WorkRec};
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
            Input::Submit {
                spec,
                argv,
                hook,
                cwd,
                env,
                output,
                error,
                warn,
                name,
                gates,
                array,
                script,
                notify,
                pty,
            } => {
                let indices: Vec<Option<u32>> = match array {
                    Some(arr) => arr.indices.iter().map(|i| Some(*i)).collect(),
                    None => vec![None],
                };
                // Gated work waits held from the start; settling lets it go.
                let held = !gates.is_open() || array.is_some();
                let mut ids = Vec::with_capacity(indices.len());
                for index in indices {
                    let id = if held {
                        self.core.submit_held(at, spec.clone())?
                    } else {
                        self.core.submit(at, spec.clone())?
                    };
                    let first = *ids.first().unwrap_or(&id.0);
                    ids.push(id.0);
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
                            cwd: cwd.clone(),
                            env: env.clone(),
                            output: output.clone(),
                            error: error.clone(),
                            runs: Vec::new(),
                            warn: warn.clone(),
                            name: name.clone(),
                            exit_code: None,
                            signal: None,
                            gates: gates.clone(),
                            array: index.map(|index| ArrayPos {
                                id: first,
                                index,
                                limit: array.as_ref().map_or(0, |a| a.limit),
                            }),
                            script: script.clone(),
                            notify: notify.clone(),
                            pty: *pty,
                        },
                    );
                    self.index_gate(id.0);
                }
                a.id = ids.first().copied();
                if held {
                    self.settle(at, ids, &mut a);
                }
            }
            Input::Cancel { id, by } => {
                self.core.cancel(at, WorkloadId(*id))?;
                self.sync(at, *id, "cancelled");
                self.ended_unrun(at, *id, &mut a);
                if !by.is_empty() {
                    a.audit(*id, 0, format!("cancelled by {by}"));
                }
                self.changed(at, *id, &mut a);
            }
            Input::Hold { id, by, operator } => {
                let w = self
                    .work
                    .get_mut(id)
                    .ok_or(CoreError::UnknownWorkload(*id))?;
                if w.state != WorkloadState::Pending {
                    return Err(if w.state == WorkloadState::Running {
                        CoreError::Running(*id)
                    } else {
                        CoreError::AlreadyEnded(*id)
                    });
                }
                // An operator's hold stays an operator's: the owner's own hold on top
                // of it must not let the owner release it.
                if w.gates
                    .hold
                    .as_ref()
                    .is_some_and(|h| h.operator && !*operator)
                {
                    a.changed = false;
                    return Ok(a);
                }
                w.gates.hold = Some(HoldRec {
                    by: by.clone(),
                    operator: *operator,
                });
                a.audit(*id, 0, format!("held by {by}"));
                self.changed(at, *id, &mut a);
            }
            Input::Release { id, by } => {
                let w = self
                    .work
                    .get_mut(id)
                    .ok_or(CoreError::UnknownWorkload(*id))?;
                if w.gates.hold.take().is_none() {
                    a.changed = false;
                    return Ok(a);
                }
                a.audit(*id, 0, format!("released by {by}"));
                self.changed(at, *id, &mut a);
            }
            Input::Requeue {
                id,
                by,
                hold,
                operator,
            } => {
                self.core.requeue(at, WorkloadId(*id))?;
                let w = self
                    .work
                    .get_mut(id)
                    .ok_or(CoreError::UnknownWorkload(*id))?;
                if *hold
                    && !w
                        .gates
                        .hold
                        .as_ref()
                        .is_some_and(|h| h.operator && !*operator)
                {
                    w.gates.hold = Some(HoldRec {
                        by: by.clone(),
                        operator: *operator,
                    });
                }
                let held = if *hold { ", held once back" } else { "" };
                a.audit(*id, 0, format!("requeue asked by {by}{held}"));
            }
            Input::Update {
                id,
                by,
                time_limit,
                priority,
                begin,
            } => {
                self.core
                    .update(at, WorkloadId(*id), *time_limit, *priority)?;
                let cw = self.core.workload(WorkloadId(*id)).map(|c| c.spec.clone());
                let w = self
                    .work
                    .get_mut(id)
                    .ok_or(CoreError::UnknownWorkload(*id))?;
                if let Some(spec) = cw {
                    w.spec = spec;
                }
                let mut what = Vec::new();
                if let Some(t) = time_limit {
                    what.push(format!(
                        "time limit {}",
                        allot_fairshare::time::format_duration(*t)
                    ));
                }
                if let Some(p) = priority {
                    what.push(format!("priority {p}"));
                }
                if let Some(b) = begin {
                    w.gates.begin = *b;
                    what.push(if *b == 0 {
                        "begin now".to_string()
                    } else {
                        format!("begin {} UTC", allot_common::utc::format_time(*b as i64))
                    });
                    self.index_gate(*id);
                }
                a.audit(*id, 0, format!("updated by {by}: {}", what.join(", ")));
                self.changed(at, *id, &mut a);
            }
            Input::LeaseEnded {
                lease,
                end,
                reason,
                node,
                exit_code,
                signal,
                part,
                leaving,
            } => self.lease_ended(
                at,
                *lease,
                *end,
                reason,
                node,
                (*exit_code, *signal),
                (*part, *leaving),
                &mut a,
            )?,
            Input::LeaseUse {
                lease,
                node,
                idle_since,
                gpu_util,
            } => {
                a.changed = self.lease_use(at, *lease, node, *idle_since, *gpu_util, &mut a);
            }
            Input::Typed { lease } => a.changed = self.lease_input(at, *lease, &mut a),
            Input::SessionIdle { lease } => a.changed = self.session_idle(at, *lease, &mut a),
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
            Input::NodeRemoved { node, by } => self.remove_node(at, node, by, &mut a)?,
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
                addr,
                highest_workload,
                highest_lease,
                end_strays,
                fence_s,
            } => {
                let seen = super::hosts::Seen {
                    gpus,
                    running,
                    drains,
                    end_strays: *end_strays,
                    fence_s: *fence_s,
                };
                self.register(at, spec, gpu_uuids, &seen, addr, &mut a)?;
                self.ids_seen_on(&spec.name, *highest_workload, *highest_lease, &mut a);
            }
            Input::IdsAbove {
                next_workload,
                next_lease,
                why,
            } => {
                let before = self.core.next_ids();
                self.core.raise_ids(*next_workload, *next_lease);
                let (w, l) = self.core.next_ids();
                a.changed = (w, l) != before;
                a.audit(
                    0,
                    0,
                    format!(
                        "new ids continue at workload {w} and lease {}: {why}",
                        lease_wire(l)
                    ),
                );
            }
            Input::Health {
                node,
                verdict,
                gpus,
                reasons,
                drains,
            } => a.changed = self.health(at, node, *verdict, gpus, reasons, drains, &mut a)?,
            Input::RecheckHeld { node } => a.changed = self.recheck_held(at, node, &mut a)?,
            Input::Schedule => {
                // Only journals of 0.4 and earlier hold passes as `Schedule`: re-run
                // by their rules, they decide again what was decided then.
                let settled = self.settle(at, Vec::new(), &mut a);
                let d = self.core.schedule_by_0_4_rules(at);
                // Claims and reservations are plans the next pass makes again: only
                // decisions are facts to keep.
                a.changed = settled || !d.actions.is_empty();
                a.next_wakeup = match (d.next_wakeup, self.next_begin(at)) {
                    (Some(x), Some(y)) => Some(x.min(y)),
                    (x, y) => x.or(y),
                };
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
                self.settle(at, Vec::new(), &mut a);
                self.core.replay(at, actions)?;
                for act in actions {
                    self.act(at, act.clone(), &mut a);
                }
            }
        }
        Ok(a)
    }

    /// Why workload `id` waits, if it does, as of `at` (the core renders the text
    /// of one workload on read: no pass explains the whole queue), with the gate that keeps it out of the
    /// queue (`held`, `dependency`, ...; empty when the policy alone decides).
    pub fn why(&self, at: Time, id: u64) -> (String, &'static str) {
        if let Some(g) = self.gated(at, id) {
            return (g.text(), g.kind());
        }
        let text = self
            .core
            .explain_workload(at, WorkloadId(id))
            .map(|e| e.text)
            .unwrap_or_default();
        (text, "")
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
                // A new run: how the last one ended stays in the history.
                w.end_reason.clear();
                self.counters
                    .waits
                    .entry(w.spec.class.clone())
                    .or_default()
                    .add(at.saturating_sub(w.submit));
                let wid = w.id;
                // The rendezvous port, on rank 0's host (the first of the placement):
                // chosen here, in the state machine, so replay chooses the same.
                let rank0 = hosts.first().map(|(n, _)| n.clone()).unwrap_or_default();
                let port = self.pick_port(&rank0, lease.0);
                if let Some(p) = port {
                    self.ports
                        .entry(rank0.clone())
                        .or_default()
                        .insert(p, lease.0);
                } else {
                    let (lo, hi) = self.master_ports;
                    let text = format!(
                        "no rendezvous port free on {rank0}: live leases there hold all of {lo}-{hi}; {} starts without MASTER_PORT (widen [server] master_ports in allotd.toml)",
                        lease_wire(lease.0)
                    );
                    a.notice(Level::Warn, &rank0, text.clone());
                    a.audit(workload.0, lease.0, text);
                }
                let Some(w) = self.work.get_mut(&wid) else {
                    return;
                };
                w.runs.push(RunRec {
                    lease: lease.0,
                    nodes: hosts.iter().map(|(n, _)| n.clone()).collect(),
                    master_port: port.unwrap_or(0),
                    start: at,
                    gpus: u32::try_from(hosts.iter().map(|(_, g)| g.len()).sum::<usize>())
                        .unwrap_or(u32::MAX),
                    funded,
                    // A session is in use as it starts: protected by use (its
                    // class's grace) from here, not left to its min runtime alone.
                    input_at: if w.pty { at } else { 0 },
                    ..RunRec::default()
                });
                if w.pty {
                    let _ = self.core.lease_use(at, lease, Some(at));
                }
                let w = w.clone();
                self.lease_hosts.insert(lease.0, hosts.clone());
                self.changed(at, wid, a);
                // Every part in one go: a gang's start is one action with all its
                // hosts, so no part starts before every part is placed.
                for (node, gpus) in &hosts {
                    a.send(node, self.start_for(lease.0, &w, at, node, gpus.clone()));
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
            }
            Action::Revoke {
                lease,
                workload,
                not_before,
                why,
            } => {
                let (kind, text) = revoke_text(&why, &self.names);
                if let Some(r) = self
                    .work
                    .get_mut(&workload.0)
                    .and_then(|w| w.runs.iter_mut().rev().find(|r| r.lease == lease.0))
                {
                    r.revoked = kind.clone();
                }
                let cause = self.drain_cause(&why);
                *self
                    .counters
                    .revocations
                    .entry(if cause.is_empty() {
                        kind
                    } else {
                        format!("{kind}:{cause}")
                    })
                    .or_default() += 1;
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
                        "revoke {} {}: {text}",
                        lease_wire(lease.0),
                        revoke_when(at, not_before)
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

    /// A lease (or one part of a gang's lease) ended. A part that completed while
    /// others run leaves the gang (its host is done) and the lease goes on; any other
    /// end, or the last part's, ends the lease, and the parts still running are
    /// revoked with the reason: which part ended and how. With `leaving`, those
    /// parts' GPUs stay held until each host reports its part gone (`part_left`).
    #[allow(clippy::too_many_arguments)]
    fn lease_ended(
        &mut self,
        at: Time,
        lease: u64,
        end: LeaseEnd,
        reason: &str,
        node: &str,
        (exit_code, signal): (Option<i32>, Option<i32>),
        (part, leaving): (bool, bool),
        a: &mut Applied,
    ) -> Result<(), CoreError> {
        let Some(wid) = self.core.lease(LeaseId(lease)).map(|l| l.workload.0) else {
            return self.part_left(at, lease, end, node, exit_code, a);
        };
        // A node reports its own leases only: another node's is not its to end.
        let hosts = self.lease_hosts.get(&lease);
        if !node.is_empty() && !hosts.is_some_and(|h| h.iter().any(|(n, _)| n == node)) {
            return Err(CoreError::UnknownLease(lease));
        }
        let rank = self
            .work
            .get(&wid)
            .and_then(|w| w.runs.iter().rev().find(|r| r.lease == lease))
            .and_then(|r| r.nodes.iter().position(|n| n == node));
        let how = end.as_str();
        let exit = match exit_code {
            Some(c) => format!(", exit {c}"),
            None => String::new(),
        };
        if part && end == LeaseEnd::Completed && hosts.is_some_and(|h| h.len() > 1) {
            if let Some(h) = self.lease_hosts.get_mut(&lease) {
                h.retain(|(n, _)| n != node);
            }
            a.audit(
                wid,
                lease,
                format!(
                    "{} part on {node}{} completed; waiting for the other parts",
                    lease_wire(lease),
                    rank.map_or(String::new(), |r| format!(" (rank {r})")),
                ),
            );
            return Ok(());
        }
        let refusing = self
            .nodes
            .get(node)
            .filter(|_| end == LeaseEnd::Refused)
            .map(|n| n.id);
        if leaving {
            let still: Vec<_> = hosts
                .into_iter()
                .flatten()
                .filter(|(n, _)| n != node)
                .filter_map(|(n, _)| self.nodes.get(n).map(|r| r.id))
                .collect();
            self.core
                .lease_ended_leaving(at, LeaseId(lease), end, refusing, &still)?;
        } else {
            match refusing {
                Some(n) => self.core.lease_refused(at, LeaseId(lease), n)?,
                None => self.core.lease_ended(at, LeaseId(lease), end)?,
            };
        }
        self.release_port(wid, lease);
        if let Some(w) = self.work.get_mut(&wid) {
            if let Some(r) = w.runs.iter_mut().rev().find(|r| r.lease == lease) {
                r.end = at;
                r.end_reason = how.to_string();
                r.exit_code = exit_code;
                r.signal = signal;
                r.detail = reason.to_string();
            }
            w.exit_code = exit_code;
            w.signal = signal;
        }
        // The other hosts of a gang stop too, told which part ended and how.
        let why = if node.is_empty() {
            format!("another part of the gang ended: {how} ({reason})")
        } else {
            format!(
                "part on {node}{} ended: {how}{exit}",
                rank.map_or(String::new(), |r| format!(" (rank {r})"))
            )
        };
        self.sync(at, wid, how);
        self.run_ended(wid, lease, a);
        self.notify(at, wid, a);
        a.audit(
            wid,
            lease,
            format!("lease {} ended: {how}{exit} ({reason})", lease_wire(lease)),
        );
        self.changed(at, wid, a);
        let others: Vec<String> = self
            .lease_hosts
            .remove(&lease)
            .unwrap_or_default()
            .into_iter()
            .map(|(n, _)| n)
            .filter(|n| n != node)
            .collect();
        for other in &others {
            a.send(
                other,
                Command::Revoke {
                    lease,
                    not_before: 0, // now, whatever the host's clock says: its lease has ended
                    why: why.clone(),
                },
            );
        }
        if !others.is_empty() {
            a.audit(
                wid,
                lease,
                format!(
                    "revoke {} on {}: {why}",
                    lease_wire(lease),
                    others.join(",")
                ),
            );
        }
        Ok(())
    }

    /// A host reports its part of a lease that had already ended (a gang's other
    /// part, or a lost node's lease that came back): its GPUs are free again, and the
    /// workload may start once no part of its earlier run is left.
    fn part_left(
        &mut self,
        at: Time,
        lease: u64,
        end: LeaseEnd,
        node: &str,
        exit_code: Option<i32>,
        a: &mut Applied,
    ) -> Result<(), CoreError> {
        let id = self
            .nodes
            .get(node)
            .map(|n| n.id)
            .ok_or(CoreError::UnknownLease(lease))?;
        let wid = self
            .core
            .leaving()
            .get(&LeaseId(lease))
            .map(|l| l.workload.0)
            .ok_or(CoreError::UnknownLease(lease))?;
        self.core.part_left(at, LeaseId(lease), id)?;
        let exit = exit_code.map_or(String::new(), |c| format!(", exit {c}"));
        let next = if self.core.leaving().values().any(|l| l.workload.0 == wid) {
            ""
        } else {
            "; no part of that run is left"
        };
        a.audit(
            wid,
            lease,
            format!(
                "{} part on {node} ended: {}{exit}; its GPUs are free{next}",
                lease_wire(lease),
                end.as_str()
            ),
        );
        Ok(())
    }

    /// A host holds ids of allotd's above those it would issue next: allotd's state
    /// is older than its hosts' (restored from a backup, a lost write-ahead log).
    /// New ids continue above them, so no workload or lease id is given twice.
    fn ids_seen_on(&mut self, node: &str, workload: u64, lease: u64, a: &mut Applied) {
        let (w, l) = self.core.next_ids();
        if workload < w && lease < l {
            return;
        }
        self.core.raise_ids(workload + 1, lease + 1);
        let (w2, l2) = self.core.next_ids();
        let text = format!(
            "node {node} holds workload {workload} and lease {}, beyond what this allotd issued (next: workload {w}, lease {}): its state is older than its hosts' (restored from a backup?); new ids continue at workload {w2} and lease {}",
            lease_wire(lease),
            lease_wire(l),
            lease_wire(l2)
        );
        a.notice(Level::Warn, node, text.clone());
        a.audit(0, 0, text);
    }

    /// A running lease's GPUs found idle (`idle_since` > 0) or busy again: kept on
    /// its run for `allot status`, in its history, and told to operators. Returns
    /// whether anything changed (a repeat of what is known changes nothing).
    fn lease_use(
        &mut self,
        at: Time,
        lease: u64,
        node: &str,
        idle_since: Time,
        gpu_util: u32,
        a: &mut Applied,
    ) -> bool {
        // Only a host the lease runs on speaks for it.
        let on_node = self
            .lease_hosts
            .get(&lease)
            .is_some_and(|h| h.iter().any(|(n, _)| n == node));
        let Some((wid, run)) = self.live_run(lease).filter(|_| on_node) else {
            return false;
        };
        // The policy hears it too: a class protected by use keeps a lease in use
        // and lets an idle one go (`policy.protect_by_use`); others ignore it. The
        // first report always changes the run (its level was unknown), so the core
        // and the run never disagree about a repeat. The lease was found in the core
        // above, so the core cannot refuse it.
        if run.idle_since == idle_since {
            // The level alone moved (the host says so at most every few minutes):
            // kept for `allot share`, no news for the audit.
            let moved = run.gpu_util != Some(gpu_util);
            run.gpu_util = Some(gpu_util);
            if moved {
                let used = run.used().flatten();
                let _ = self.core.lease_use(at, LeaseId(lease), used);
            }
            return moved;
        }
        run.idle_since = idle_since;
        run.gpu_util = Some(gpu_util);
        let used = run.used().flatten();
        let busy = used.is_none();
        let warned = run.idle_warned;
        run.idle_warned = warned && !busy;
        let _ = self.core.lease_use(at, LeaseId(lease), used);
        if warned && busy {
            a.audit(
                wid,
                lease,
                format!(
                    "{} in use again (its GPUs at {gpu_util}%): protected while used",
                    lease_wire(lease)
                ),
            );
        }
        let text = if idle_since == 0 {
            format!(
                "{} busy again on {node}: its GPUs at {gpu_util}%",
                lease_wire(lease)
            )
        } else {
            format!(
                "{} idle for {} on {node}: its GPUs at {gpu_util}%",
                lease_wire(lease),
                allot_fairshare::time::format_duration(at.saturating_sub(idle_since))
            )
        };
        a.audit(wid, lease, text.clone());
        if idle_since != 0 {
            a.notice(Level::Warn, node, format!("workload {wid}: {text}"));
            // Its owner, when they asked (`--notify idle`).
            if let Some(w) = self
                .work
                .get(&wid)
                .filter(|w| w.notify.iter().any(|n| n == "idle"))
            {
                a.outs.push(Out::Notify(Box::new(crate::notify::Notice {
                    workload: wid,
                    name: w.name.clone(),
                    user: w.spec.user.clone(),
                    project: w.spec.project.clone(),
                    events: vec!["idle".into()],
                    state: w.state.as_str().to_string(),
                    reason: text,
                    exit_code: None,
                    at,
                })));
            }
        }
        true
    }

    /// The running run of `lease`, and its workload's id.
    fn live_run(&mut self, lease: u64) -> Option<(u64, &mut super::RunRec)> {
        let wid = self.core.lease(LeaseId(lease))?.workload.0;
        let run = self
            .work
            .get_mut(&wid)?
            .runs
            .iter_mut()
            .rev()
            .find(|r| r.lease == lease && r.end == 0)?;
        Some((wid, run))
    }

    /// A session was typed into: in use until now, idle from now (the policy
    /// protects it for its class's grace from here); a warned session is in use
    /// again.
    fn lease_input(&mut self, at: Time, lease: u64, a: &mut Applied) -> bool {
        let Some((wid, run)) = self.live_run(lease) else {
            return false;
        };
        run.input_at = at;
        let warned = std::mem::take(&mut run.idle_warned);
        let used = run.used().flatten();
        let _ = self.core.lease_use(at, LeaseId(lease), used);
        if warned {
            a.audit(
                wid,
                lease,
                format!(
                    "{} in use again (typed into): protected while used",
                    lease_wire(lease)
                ),
            );
        }
        true
    }

    /// Sessions of a class protected by use whose protection has lapsed while
    /// idle and that were not yet told: the leases for [`Input::SessionIdle`].
    pub fn idle_sessions(&self, at: Time) -> Vec<u64> {
        let mut out = Vec::new();
        for w in self.work.values() {
            if !w.pty || w.state != WorkloadState::Running {
                continue;
            }
            let Some(run) = w.runs.last().filter(|r| r.end == 0 && !r.idle_warned) else {
                continue;
            };
            let lapsed = self
                .core
                .lease(LeaseId(run.lease))
                .is_some_and(|l| l.funded && l.preemptible_at <= at && l.revoke.is_none());
            let used = run.used();
            if lapsed
                && used != Some(None)
                && self.core.config().idle_grace(&w.spec.class).is_some()
            {
                out.push(run.lease);
            }
        }
        out
    }

    /// Tells an idle session, on its terminal and in the audit log, that it is no
    /// longer protected: "idle for 31m: no input for 31m, GPUs at 0%".
    fn session_idle(&mut self, at: Time, lease: u64, a: &mut Applied) -> bool {
        let node = self
            .lease_hosts
            .get(&lease)
            .and_then(|h| h.first())
            .map(|(n, _)| n.clone())
            .unwrap_or_default();
        let Some((wid, run)) = self.live_run(lease) else {
            return false;
        };
        if run.idle_warned {
            return false;
        }
        run.idle_warned = true;
        let since = run.idle_since.max(run.input_at).max(run.start);
        let ago = |t: Time| allot_fairshare::time::format_duration(at.saturating_sub(t));
        let input = if run.input_at <= run.start {
            "no input since it started".to_string()
        } else {
            format!("no input for {}", ago(run.input_at))
        };
        let gpus = match run.gpu_util {
            Some(u) => format!("GPUs at {u}%"),
            None => "GPUs not yet sampled".to_string(),
        };
        let text = format!("idle for {}: {input}, {gpus}", ago(since));
        a.audit(
            wid,
            lease,
            format!(
                "{} {text}: no longer protected; may be reclaimed when others wait",
                lease_wire(lease)
            ),
        );
        a.send(
            &node,
            Command::Notice {
                lease,
                text: format!(
                    "this session is {text}. It is no longer protected and may be reclaimed when others wait for GPUs; type anything to keep it."
                ),
            },
        );
        true
    }

    /// Whose drain a drain's revocation carries out, for `/metrics`: `health` (a GPU
    /// fault, XID 79 among them), `lost`, `operator`; empty for other revocations.
    fn drain_cause(&self, why: &allot_fairshare::RevokeWhy) -> &'static str {
        use allot_fairshare::RevokeWhy;
        let (RevokeWhy::Drain { node } | RevokeWhy::DrainNow { node }) = why else {
            return "";
        };
        let drains = self
            .names
            .get(node.idx())
            .and_then(|n| self.nodes.get(n))
            .map(|n| &n.drains);
        let has = |k: &str| drains.is_some_and(|d| d.contains_key(k));
        if has("health") {
            "health"
        } else if has("lost") {
            "lost"
        } else if has("cluster-operator") || has("local-operator") || has("operator") {
            "operator"
        } else {
            "other"
        }
    }

    /// Keeps run `lease` of workload `wid` for history and counts its GPU-seconds.
    fn run_ended(&mut self, wid: u64, lease: u64, a: &mut Applied) {
        let Some(w) = self.work.get(&wid) else {
            return;
        };
        let Some(i) = w.runs.iter().rposition(|r| r.lease == lease) else {
            return;
        };
        let row = crate::history::row_of(w, i);
        let secs = row.gpu_secs_within(0, row.end);
        let slot = self
            .counters
            .gpu_seconds
            .entry(row.project.clone())
            .or_default();
        slot[usize::from(!row.funded)] += secs;
        a.outs.push(Out::Run(Box::new(row)));
    }

    /// GPU-seconds per project, [funded, unfunded]: ended runs (counted as they end)
    /// and running ones up to `at`, so the sum only grows.
    pub fn gpu_seconds(&self, at: Time) -> std::collections::BTreeMap<String, [u64; 2]> {
        let mut out = self.counters.gpu_seconds.clone();
        for w in self
            .work
            .values()
            .filter(|w| w.state == WorkloadState::Running)
        {
            if let Some(r) = w.runs.last().filter(|r| r.end == 0) {
                let slot = out.entry(w.spec.project.clone()).or_default();
                slot[usize::from(!r.funded)] += u64::from(r.gpus) * at.saturating_sub(r.start);
            }
        }
        out
    }

    /// Keeps a workload that ended without a run for history (and tells its user,
    /// if they asked).
    pub(super) fn ended_unrun(&mut self, at: Time, id: u64, a: &mut Applied) {
        if let Some(w) = self
            .work
            .get(&id)
            .filter(|w| w.runs.is_empty() && w.state.is_final())
        {
            a.outs
                .push(Out::Run(Box::new(crate::history::unrun_row(w))));
        }
        self.notify(at, id, a);
    }

    /// What workload `id`'s user asked to hear of its last change (`--notify`): its
    /// end, a failure (failed, timed out), its time limit, a preemption of its run.
    fn notify(&self, at: Time, id: u64, a: &mut Applied) {
        let Some(w) = self.work.get(&id).filter(|w| !w.notify.is_empty()) else {
            return;
        };
        let last = w.runs.last().filter(|r| r.end == at);
        let mut events = Vec::new();
        if w.state.is_final() {
            events.push("end");
        }
        if matches!(w.state, WorkloadState::Failed | WorkloadState::TimedOut) {
            events.push("fail");
        }
        if w.state == WorkloadState::TimedOut {
            events.push("time-limit");
        }
        if last.is_some_and(|r| matches!(r.revoked.as_str(), "preempted" | "reservation")) {
            events.push("preempt");
        }
        let events: Vec<String> = events
            .into_iter()
            .filter(|e| w.notify.iter().any(|n| n == e))
            .map(String::from)
            .collect();
        if events.is_empty() {
            return;
        }
        a.outs.push(Out::Notify(Box::new(crate::notify::Notice {
            workload: id,
            name: w.name.clone(),
            user: w.spec.user.clone(),
            project: w.spec.project.clone(),
            events,
            state: w.state.as_str().to_string(),
            reason: last
                .filter(|r| !r.detail.is_empty())
                .map_or_else(|| w.end_reason.clone(), |r| r.detail.clone()),
            exit_code: w.exit_code,
            at,
        })));
    }

    /// Copies the core's view of a workload after a change.
    pub(super) fn sync(&mut self, at: Time, id: u64, how: &str) {
        let Some(cw) = self.core.workload(WorkloadId(id)) else {
            return;
        };
        let (state, preemptions) = (cw.state, cw.preemptions);
        if let Some(w) = self.work.get_mut(&id) {
            if state.is_final() && !w.state.is_final() {
                *self
                    .counters
                    .finished
                    .entry(state.as_str().to_string())
                    .or_default() += 1;
            }
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
