//! The allocator's state machine: the fair-share core plus what the service knows
//! besides (nodes with their GPU UUIDs, workload commands, lease placement on hosts,
//! counters). Sans-IO like the core: inputs and times in, messages for agents and
//! audit lines out. Every accepted [`Input`] is journaled; replaying the journal
//! through [`Allocator::apply`] rebuilds this state exactly (the core is
//! deterministic), usage window included.

use crate::config::ServerConfig;
use allot_fairshare::{
    Action, CoreError, LeaseEnd, LeaseId, NodeId, NodeSpec, NodeState, OrgTree, RevokeWhy,
    Scheduler, StartWhy, Time, WorkloadId, WorkloadSpec, WorkloadState,
};
use allot_proto::v1 as pb;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, VecDeque};

/// How a lease ended, as an agent reported it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum EndKind {
    /// Exited 0.
    Completed,
    /// Exited non-zero or could not start.
    Failed,
    /// The revocation's ladder finished.
    Revoked,
    /// Its time limit.
    TimeLimit,
    /// The node or a GPU went away.
    NodeLost,
    /// The node refused to start it (drained, GPU taken): the work waits again.
    Refused,
}

impl EndKind {
    fn core(self) -> LeaseEnd {
        match self {
            EndKind::Completed => LeaseEnd::Completed,
            EndKind::Failed => LeaseEnd::Failed,
            EndKind::Revoked => LeaseEnd::Revoked,
            EndKind::TimeLimit => LeaseEnd::TimeLimit,
            EndKind::NodeLost => LeaseEnd::NodeLost,
            EndKind::Refused => LeaseEnd::Refused,
        }
    }

    /// The name people read (`allot status` end reasons).
    pub fn as_str(self) -> &'static str {
        match self {
            EndKind::Completed => "completed",
            EndKind::Failed => "failed",
            EndKind::Revoked => "revoked",
            EndKind::TimeLimit => "time-limit",
            EndKind::NodeLost => "node-lost",
            EndKind::Refused => "refused",
        }
    }

    /// From an agent's lease record.
    pub fn from_agent(end_reason: &str, exit_code: Option<i32>) -> EndKind {
        match end_reason {
            "exited" if exit_code == Some(0) => EndKind::Completed,
            "revoked" => EndKind::Revoked,
            "time-limit" => EndKind::TimeLimit,
            // The host could not take it (drained, GPU taken): a fact about the node;
            // the work waits again and that node is not offered it until it changes.
            "refused" => EndKind::Refused,
            "gpu-lost" | "vanished" => EndKind::NodeLost,
            _ => EndKind::Failed,
        }
    }
}

/// One accepted input: what the journal holds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", tag = "kind")]
pub enum Input {
    /// A host registered for the first time.
    AddNode {
        /// What the core needs.
        spec: NodeSpec,
        /// GPU UUIDs by index.
        gpu_uuids: Vec<String>,
    },
    /// A user submitted work.
    Submit {
        /// The request.
        spec: WorkloadSpec,
        /// The command.
        argv: Vec<String>,
        /// Checkpoint hook spec.
        hook: String,
    },
    /// A user cancelled work.
    Cancel {
        /// Workload.
        id: u64,
    },
    /// An agent reported a lease over.
    LeaseEnded {
        /// Lease.
        lease: u64,
        /// How.
        end: EndKind,
        /// The agent's words.
        reason: String,
        /// The node that reported it (a refusal marks that node only); empty in
        /// journals before 0.2 and for ends allotd decides itself.
        #[serde(default, skip_serializing_if = "String::is_empty")]
        node: String,
    },
    /// A node's scheduling state changed (operator, health, or lost).
    NodeState {
        /// Node name.
        node: String,
        /// New state.
        state: NodeState,
        /// Why.
        reason: String,
        /// The drain's author kind: `cluster-operator` (journals before 0.2 say
        /// `operator`), `local-operator` (reported by the agent), `health`, `lost`;
        /// `agent` lifts `lost`. Each kind is a drain of its own; the node's state is
        /// the most severe of those in force.
        by: String,
        /// Who, where known (the host operator's user name).
        #[serde(default, skip_serializing_if = "String::is_empty")]
        author: String,
    },
    /// Something about a node changed that the core does not model (its agent
    /// reconnected, its health report or drains changed): refusals are forgotten.
    NodeChanged {
        /// Node name.
        node: String,
    },
    /// One GPU's health.
    GpuHealth {
        /// Node name.
        node: String,
        /// GPU index.
        gpu: u32,
        /// Usable.
        healthy: bool,
    },
    /// A manager changed a weight.
    SetWeight {
        /// Group.
        group: String,
        /// Weight.
        weight: f64,
    },
    /// A scheduling pass.
    Schedule,
}

impl Input {
    /// Reads one journal entry, upgrading what older releases wrote: a submission
    /// from before `no_requeue` existed kept 0.1.0's rule (work that cannot resume
    /// was not requeued), so replaying it decides as it did then.
    pub fn decode(text: &str) -> serde_json::Result<Input> {
        let mut v: serde_json::Value = serde_json::from_str(text)?;
        if v["kind"] == "submit" {
            if let Some(spec) = v.get_mut("spec").and_then(|s| s.as_object_mut()) {
                if !spec.contains_key("no_requeue") {
                    let resumable = spec
                        .get("resumable")
                        .and_then(serde_json::Value::as_bool)
                        .unwrap_or(false);
                    spec.insert("no_requeue".into(), (!resumable).into());
                }
            }
        }
        serde_json::from_value(v)
    }
}

/// Something for the service shell to carry out.
#[derive(Debug, Clone, PartialEq)]
pub enum Out {
    /// Send to a node's agent.
    Send {
        /// Node name.
        node: String,
        /// Message (boxed: a start command is large beside an audit line).
        msg: Box<pb::AllocatorMessage>,
    },
    /// Record in the audit log.
    Audit {
        /// Workload, 0 if none.
        workload: u64,
        /// Lease, 0 if none.
        lease: u64,
        /// Why.
        text: String,
    },
}

/// What [`Allocator::apply`] produced.
#[derive(Debug, Default)]
pub struct Applied {
    /// Messages and audit lines.
    pub outs: Vec<Out>,
    /// A new workload's id (for `Submit`).
    pub id: Option<u64>,
    /// Whether the core's state changed in a way the journal must keep (passes that
    /// decide nothing need not be journaled; see `serve.rs`).
    pub changed: bool,
    /// After a pass: when the core next needs one.
    pub next_wakeup: Option<Time>,
}

/// A node as the allocator knows it.
#[derive(Debug, Clone)]
pub struct NodeRec {
    /// Core id.
    pub id: NodeId,
    /// Spec.
    pub spec: NodeSpec,
    /// GPU UUIDs by index.
    pub gpu_uuids: Vec<String>,
    /// Scheduling state: the most severe of `drains`.
    pub state: NodeState,
    /// Every drain in force, by author kind (`cluster-operator`, `local-operator`,
    /// `health`, `lost`).
    pub drains: BTreeMap<String, DrainRec>,
    /// A health drain the circuit breaker holds: its reasons and whether it asked
    /// for drain-now (not journaled; re-checked by the scheduling loop).
    pub held: Option<(String, bool)>,
    /// Its agent's stream is up (not journaled).
    pub connected: bool,
    /// Last message from its agent, Unix s (not journaled).
    pub last_seen: Time,
    /// The agent's last health verdict (not journaled).
    pub verdict: pb::HostVerdict,
    /// The agent's GPUs as last reported (not journaled).
    pub gpus: Vec<pb::Gpu>,
}

/// One drain of a node.
#[derive(Debug, Clone, PartialEq)]
pub struct DrainRec {
    /// `Draining` or `DrainNow` (or `Down` for a lost node).
    pub state: NodeState,
    /// Why.
    pub reason: String,
    /// Since, Unix s.
    pub since: Time,
    /// Who, where known.
    pub author: String,
}

/// Drain author kinds as journals of every release name them.
pub fn drain_kind(by: &str) -> &str {
    match by {
        "operator" => "cluster-operator",
        "agent" => "lost",
        k => k,
    }
}

/// The node state a set of drains makes: the most severe (`NodeState` is ordered
/// by severity).
fn effective(drains: &BTreeMap<String, DrainRec>) -> NodeState {
    drains
        .values()
        .map(|d| d.state)
        .max()
        .unwrap_or(NodeState::Ready)
}

/// A drain command for an agent: `by` is the drain's author kind (`cluster-operator`,
/// or `health` for a drain the breaker let through or holds).
pub fn drain_msg(drain: bool, now: bool, reason: &str, by: &str) -> pb::AllocatorMessage {
    pb::AllocatorMessage {
        body: Some(pb::allocator_message::Body::Drain(pb::DrainCommand {
            drain,
            now,
            reason: reason.to_string(),
            by: by.to_string(),
            author: "allotd".into(),
        })),
    }
}

/// A workload as the service shows it.
#[derive(Debug, Clone)]
pub struct WorkRec {
    /// Id.
    pub id: u64,
    /// Request.
    pub spec: WorkloadSpec,
    /// Command.
    pub argv: Vec<String>,
    /// Checkpoint hook.
    pub hook: String,
    /// Submitted, Unix s.
    pub submit: Time,
    /// State.
    pub state: WorkloadState,
    /// Current or last run's start.
    pub start: Time,
    /// End once final.
    pub end: Time,
    /// How the last run ended.
    pub end_reason: String,
    /// Every lease it held.
    pub leases: Vec<u64>,
    /// Nodes of the current run.
    pub nodes: Vec<String>,
    /// Preemptions.
    pub preemptions: u32,
    /// Current run funded.
    pub funded: bool,
    /// Why it waits.
    pub explanation: String,
}

/// Counters for `/metrics` (rebuilt by replay like everything else).
#[derive(Debug, Clone, Default)]
pub struct Counters {
    /// Revocations by reason kind.
    pub revocations: BTreeMap<String, u64>,
    /// Node drains by who.
    pub drains: BTreeMap<String, u64>,
    /// Queue waits per class, as the histogram `/metrics` shows.
    pub waits: BTreeMap<String, WaitHistogram>,
    /// Automatic drains the breaker held.
    pub breaker_held: u64,
}

/// Queue-wait histogram buckets, seconds: a minute to a week.
pub const WAIT_BUCKETS: [u64; 9] = [
    60, 300, 900, 3_600, 14_400, 43_200, 86_400, 259_200, 604_800,
];

/// Submit-to-start waits of one class: cumulative bucket counts, sum and count.
#[derive(Debug, Clone, Default)]
pub struct WaitHistogram {
    /// Waits at or under each of [`WAIT_BUCKETS`].
    pub buckets: [u64; WAIT_BUCKETS.len()],
    /// Sum of the waits, seconds.
    pub sum: u64,
    /// Number of waits.
    pub count: u64,
}

impl WaitHistogram {
    fn add(&mut self, wait: u64) {
        for (b, n) in WAIT_BUCKETS.iter().zip(&mut self.buckets) {
            if wait <= *b {
                *n += 1;
            }
        }
        self.sum += wait;
        self.count += 1;
    }
}

/// The allocator.
pub struct Allocator {
    /// The fair-share core.
    pub core: Scheduler,
    nodes: BTreeMap<String, NodeRec>,
    names: Vec<String>,
    work: BTreeMap<u64, WorkRec>,
    /// Live leases: where they run (node, GPU UUIDs).
    lease_hosts: BTreeMap<u64, Vec<(String, Vec<String>)>>,
    /// Counters.
    pub counters: Counters,
    /// Recent automatic drains (time, node), for the breaker.
    auto_drains: VecDeque<(Time, String)>,
    /// Passes refresh the explanations; off while replaying the journal, where only
    /// the last pass's would survive (see `Server::open`).
    pub explaining: bool,
}

/// The wire id of a lease.
pub fn lease_wire(id: u64) -> String {
    format!("A-{id}")
}

/// A wire lease id back to the core's (None for local agent leases).
pub fn lease_from_wire(id: &str) -> Option<u64> {
    id.strip_prefix("A-")?.parse().ok()
}

fn revoke_text(why: &RevokeWhy, names: &[String]) -> (String, String) {
    let node = |n: &NodeId| names.get(n.idx()).cloned().unwrap_or_default();
    match why {
        RevokeWhy::Preempted {
            by,
            unfunded,
            requester_ratio_after,
            victim_ratio_after,
        } => (
            "preempted".into(),
            if *unfunded {
                format!(
                    "preempted for workload {}: it ran unfunded (free occupancy)",
                    by.0
                )
            } else {
                format!(
                    "preempted for workload {}: its group would be served {:.2}× after, the requester's {:.2}×",
                    by.0,
                    victim_ratio_after.unwrap_or(0.0),
                    requester_ratio_after.unwrap_or(0.0)
                )
            },
        ),
        RevokeWhy::Reservation { by } => (
            "reservation".into(),
            format!("backfill ends: the reservation of workload {} starts", by.0),
        ),
        RevokeWhy::Drain { node: n } => ("drain".into(), format!("node {} drains", node(n))),
        RevokeWhy::DrainNow { node: n } => (
            "drain-now".into(),
            format!("node {} must be emptied now", node(n)),
        ),
        RevokeWhy::Cancelled => ("cancelled".into(), "cancelled by its user".into()),
    }
}

impl Allocator {
    /// A fresh allocator for a config (before replay).
    pub fn new(cfg: &ServerConfig) -> Result<Allocator, CoreError> {
        let tree = OrgTree::new(&cfg.groups).map_err(|e| CoreError::Config(e.to_string()))?;
        Ok(Allocator {
            core: Scheduler::new(cfg.policy.clone(), tree, Vec::new())?,
            nodes: BTreeMap::new(),
            names: Vec::new(),
            work: BTreeMap::new(),
            lease_hosts: BTreeMap::new(),
            counters: Counters::default(),
            auto_drains: VecDeque::new(),
            explaining: true,
        })
    }

    /// Nodes by name.
    pub fn nodes(&self) -> &BTreeMap<String, NodeRec> {
        &self.nodes
    }

    /// A node's runtime fields (connection, health report).
    pub fn node_mut(&mut self, name: &str) -> Option<&mut NodeRec> {
        self.nodes.get_mut(name)
    }

    /// Workloads by id.
    pub fn workloads(&self) -> &BTreeMap<u64, WorkRec> {
        &self.work
    }

    /// Live leases on `node`: (lease, GPU UUIDs there).
    pub fn leases_on(&self, node: &str) -> Vec<(u64, Vec<String>)> {
        self.lease_hosts
            .iter()
            .filter_map(|(l, hosts)| {
                hosts
                    .iter()
                    .find(|(n, _)| n == node)
                    .map(|(_, g)| (*l, g.clone()))
            })
            .collect()
    }

    /// The start command for a live lease on `node` (to re-send on reconnect).
    pub fn start_message(&self, lease: u64, node: &str) -> Option<pb::AllocatorMessage> {
        let l = self.core.lease(LeaseId(lease))?;
        let w = self.work.get(&l.workload.0)?;
        let gpus = self
            .lease_hosts
            .get(&lease)?
            .iter()
            .find(|(n, _)| n == node)?
            .1
            .clone();
        Some(start_msg(lease, w, l.start, gpus))
    }

    /// Whether the breaker lets one more automatic drain through at `at`.
    pub fn breaker_allows(
        &mut self,
        at: Time,
        cfg: &crate::config::BreakerSection,
        node: &str,
    ) -> bool {
        while self
            .auto_drains
            .front()
            .is_some_and(|(t, _)| *t + cfg.window < at)
        {
            self.auto_drains.pop_front();
        }
        let mut recent: std::collections::BTreeSet<&str> =
            self.auto_drains.iter().map(|(_, n)| n.as_str()).collect();
        recent.insert(node);
        let limit = (cfg.max_share * self.nodes.len() as f64).floor().max(1.0) as usize;
        recent.len() <= limit
    }

    /// Applies one input at time `at`. Rejected inputs change nothing.
    pub fn apply(&mut self, at: Time, input: &Input) -> Result<Applied, CoreError> {
        let mut a = Applied {
            changed: true,
            ..Applied::default()
        };
        match input {
            Input::AddNode { spec, gpu_uuids } => {
                let id = self.core.add_node(at, spec.clone())?;
                self.names.push(spec.name.clone());
                self.nodes.insert(
                    spec.name.clone(),
                    NodeRec {
                        id,
                        spec: spec.clone(),
                        gpu_uuids: gpu_uuids.clone(),
                        state: NodeState::Ready,
                        drains: BTreeMap::new(),
                        held: None,
                        connected: false,
                        last_seen: at,
                        verdict: pb::HostVerdict::Ok,
                        gpus: Vec::new(),
                    },
                );
            }
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
                        explanation: String::new(),
                    },
                );
                a.id = Some(id.0);
            }
            Input::Cancel { id } => {
                self.core.cancel(at, WorkloadId(*id))?;
                self.sync(at, *id, "cancelled");
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
                match self.nodes.get(node) {
                    Some(n) if *end == EndKind::Refused => {
                        self.core.lease_refused(at, LeaseId(*lease), n.id)?
                    }
                    _ => self.core.lease_ended(at, LeaseId(*lease), end.core())?,
                };
                // The other hosts of a gang stop too.
                for (node, _) in self.lease_hosts.remove(lease).unwrap_or_default() {
                    a.outs.push(Out::Send {
                        node,
                        msg: Box::new(revoke_msg(*lease, at, "another part of the gang ended")),
                    });
                }
                let how = end.as_str();
                self.sync(at, wid, how);
                a.outs.push(Out::Audit {
                    workload: wid,
                    lease: *lease,
                    text: format!("lease {} ended: {how} ({reason})", lease_wire(*lease)),
                });
            }
            Input::NodeState {
                node,
                state,
                reason,
                by,
                author,
            } => {
                let n = self.nodes.get_mut(node).ok_or_else(|| {
                    CoreError::Config(format!("no node {node:?}; `allot nodes` lists them"))
                })?;
                let kind = drain_kind(by).to_string();
                let lifted = *state == NodeState::Ready;
                if lifted && by == "operator" {
                    // 0.1.0 had one drain per node, and its operator undrain lifted it
                    // whoever had drained: replayed, it means the same.
                    n.drains.clear();
                } else if lifted {
                    if n.drains.remove(&kind).is_none() {
                        // Nothing of that author to lift: the journal keeps no no-ops.
                        a.changed = false;
                        return Ok(a);
                    }
                } else {
                    n.drains.insert(
                        kind.clone(),
                        DrainRec {
                            state: *state,
                            reason: reason.clone(),
                            since: at,
                            author: author.clone(),
                        },
                    );
                    *self.counters.drains.entry(kind.clone()).or_default() += 1;
                    if kind == "health" {
                        self.auto_drains.push_back((at, node.clone()));
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
                if kind == "cluster-operator" || kind == "health" {
                    // The agent refuses starts and revokes too, and shows who asked.
                    a.outs.push(Out::Send {
                        node: node.clone(),
                        msg: Box::new(drain_msg(
                            !lifted,
                            *state == NodeState::DrainNow,
                            reason,
                            &kind,
                        )),
                    });
                }
                a.outs.push(Out::Audit {
                    workload: 0,
                    lease: 0,
                    text: if lifted {
                        format!(
                            "node {node}: {kind} drain lifted ({reason}); now {}",
                            state_name(eff)
                        )
                    } else {
                        format!("node {node}: {} by {kind}: {reason}", state_name(*state))
                    },
                });
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
            Input::SetWeight { group, weight } => {
                self.core.set_weight(group, *weight)?;
                a.outs.push(Out::Audit {
                    workload: 0,
                    lease: 0,
                    text: format!("weight of {group} set to {weight}"),
                });
            }
            Input::Schedule => {
                let claims_before = self.core.claims().len();
                let d = self.core.schedule(at);
                a.changed = !d.actions.is_empty() || self.core.claims().len() != claims_before;
                a.next_wakeup = d.next_wakeup;
                for act in d.actions {
                    self.act(at, act, &mut a.outs);
                }
                if self.explaining {
                    self.explain(at);
                }
            }
        }
        Ok(a)
    }

    /// Refreshes why each pending workload waits (the core renders the text).
    pub fn explain(&mut self, at: Time) {
        for e in self.core.explain(at) {
            if let Some(w) = self.work.get_mut(&e.workload.0) {
                w.explanation = e.text;
            }
        }
    }

    fn act(&mut self, at: Time, act: Action, outs: &mut Vec<Out>) {
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
                w.explanation.clear();
                // A new run: how the last one ended stays in the history.
                w.end_reason.clear();
                self.counters
                    .waits
                    .entry(w.spec.class.clone())
                    .or_default()
                    .add(at.saturating_sub(w.submit));
                let w = w.clone();
                for (node, gpus) in &hosts {
                    outs.push(Out::Send {
                        node: node.clone(),
                        msg: Box::new(start_msg(lease.0, &w, at, gpus.clone())),
                    });
                }
                outs.push(Out::Audit {
                    workload: workload.0,
                    lease: lease.0,
                    text: format!(
                        "start {} on {} ({}): {}",
                        lease_wire(lease.0),
                        w.nodes.join(","),
                        if funded { "funded" } else { "unfunded" },
                        start_text(&why)
                    ),
                });
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
                    outs.push(Out::Send {
                        node,
                        msg: Box::new(revoke_msg(lease.0, not_before, &text)),
                    });
                }
                outs.push(Out::Audit {
                    workload: workload.0,
                    lease: lease.0,
                    text: format!(
                        "revoke {} not before {not_before}: {text}",
                        lease_wire(lease.0)
                    ),
                });
            }
            Action::Withdraw { lease, workload } => {
                for (node, _) in self.lease_hosts.get(&lease.0).cloned().unwrap_or_default() {
                    outs.push(Out::Send {
                        node,
                        msg: Box::new(revoke_cmd(lease.0, 0, "the drain ended", true)),
                    });
                }
                outs.push(Out::Audit {
                    workload: workload.0,
                    lease: lease.0,
                    text: format!(
                        "revocation of {} withdrawn: the drain that asked for it ended",
                        lease_wire(lease.0)
                    ),
                });
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
                outs.push(Out::Audit {
                    workload: workload.0,
                    lease: 0,
                    text: format!(
                        "reserve {} for the gang, expected free at {start}",
                        names.join(",")
                    ),
                });
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

    /// The org tree for `allot share`.
    pub fn tree(&self, now: Time) -> pb::GetTreeResponse {
        let tree = self.core.tree();
        let ratios = self.core.group_ratios(now);
        let capacity = self.core.cluster().total_gpus();
        let window_h = self.core.config().lookback as f64 / 3600.0;
        let mut running = vec![0u32; tree.len()];
        let mut pending = vec![0u32; tree.len()];
        for w in self.work.values() {
            let Some(g) = tree.find(&w.spec.project) else {
                continue;
            };
            let slot = match w.state {
                WorkloadState::Running => &mut running,
                WorkloadState::Pending => &mut pending,
                _ => continue,
            };
            for p in tree.group(g).path.iter() {
                slot[p.idx()] += w.spec.total_gpus();
            }
        }
        let groups = tree
            .groups()
            .filter(|(g, _)| g.idx() != 0)
            .map(|(g, grp)| pb::Group {
                name: grp.name.clone(),
                parent: grp
                    .parent
                    .filter(|p| p.idx() != 0)
                    .map(|p| tree.group(p).name.clone())
                    .unwrap_or_default(),
                weight: grp.weight,
                share: grp.share,
                entitled_gpu_hours: grp.share * capacity as f64 * window_h,
                served_gpu_hours: self.core.usage_gpu_secs(g, now) / 3600.0,
                ratio: ratios.get(g.idx()).copied().unwrap_or(0.0),
                running_gpus: running[g.idx()],
                pending_gpus: pending[g.idx()],
                project: tree.is_project(g),
                depth: grp.path.len() as u32,
            })
            .collect();
        pb::GetTreeResponse {
            groups,
            window_hours: window_h,
            capacity_gpus: u32::try_from(capacity).unwrap_or(u32::MAX),
        }
    }
}

/// A node state as people read it.
pub fn state_name(s: NodeState) -> &'static str {
    match s {
        NodeState::Ready => "ready",
        NodeState::Draining => "draining",
        NodeState::DrainNow => "drain-now",
        NodeState::Down => "down",
    }
}

/// Why a lease started, for people.
fn start_text(why: &StartWhy) -> String {
    match why {
        StartWhy::Free { rank, ratio } => format!(
            "ranked {rank} in the pass, its project served {ratio:.2}× its share, on free GPUs"
        ),
        StartWhy::AfterPreemption => "the victims it preempted have gone".into(),
        StartWhy::Reservation => "its reserved nodes are free".into(),
        StartWhy::Backfill {
            reservation_of,
            starts,
        } => format!(
            "backfill on nodes reserved for workload {} (ends before {starts})",
            reservation_of.0
        ),
    }
}

fn start_msg(lease: u64, w: &WorkRec, start: Time, gpus: Vec<String>) -> pb::AllocatorMessage {
    pb::AllocatorMessage {
        body: Some(pb::allocator_message::Body::Start(pb::StartLeaseCommand {
            lease: Some(pb::Lease {
                id: lease_wire(lease),
                workload_id: w.id.to_string(),
                gpu_uuids: gpus,
                start_unix: i64::try_from(start).unwrap_or(0),
                min_runtime_s: w.spec.min_runtime,
                time_limit_s: w.spec.time_limit,
                checkpoint_hook: w.hook.clone(),
                ..Default::default()
            }),
            argv: w.argv.clone(),
            user: w.spec.user.clone(),
            env: [
                ("ALLOT_WORKLOAD_ID".to_string(), w.id.to_string()),
                ("ALLOT_PROJECT".to_string(), w.spec.project.clone()),
            ]
            .into_iter()
            .collect(),
        })),
    }
}

fn revoke_msg(lease: u64, not_before: Time, why: &str) -> pb::AllocatorMessage {
    revoke_cmd(lease, not_before, why, false)
}

/// A revocation, or with `withdraw` the taking back of one.
fn revoke_cmd(lease: u64, not_before: Time, why: &str, withdraw: bool) -> pb::AllocatorMessage {
    pb::AllocatorMessage {
        body: Some(pb::allocator_message::Body::Revoke(pb::RevokeCommand {
            lease_id: lease_wire(lease),
            not_before_unix: i64::try_from(not_before).unwrap_or(0),
            why: why.to_string(),
            withdraw,
        })),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{BreakerSection, ServerConfig, EXAMPLE};

    fn node(i: u32) -> Input {
        Input::AddNode {
            spec: NodeSpec {
                name: format!("n{i}"),
                cluster: "c".into(),
                gpus: 2,
                cpu: 8,
                memory_gb: 64,
            },
            gpu_uuids: vec![format!("GPU-{i}-0"), format!("GPU-{i}-1")],
        }
    }

    fn allocator(nodes: u32) -> Allocator {
        let cfg = ServerConfig::parse(EXAMPLE, "example").expect("example");
        let mut a = Allocator::new(&cfg).expect("allocator");
        for i in 0..nodes {
            a.apply(0, &node(i)).expect("node");
        }
        a
    }

    fn health_drain(a: &mut Allocator, at: Time, i: u32) {
        a.apply(
            at,
            &Input::NodeState {
                node: format!("n{i}"),
                state: NodeState::Draining,
                reason: "xid:79".into(),
                by: "health".into(),
                author: String::new(),
            },
        )
        .expect("drain");
    }

    #[test]
    fn the_breaker_holds_automatic_drains_past_the_share_within_the_window() {
        let b = BreakerSection {
            max_share: 0.5,
            window: 300,
        };
        let mut a = allocator(4);
        assert!(a.breaker_allows(10, &b, "n0"));
        health_drain(&mut a, 10, 0);
        assert!(a.breaker_allows(20, &b, "n1"));
        health_drain(&mut a, 20, 1);
        // A third node within 5 minutes would be 75 % of the cluster: held.
        assert!(!a.breaker_allows(30, &b, "n2"));
        // A node already counted does not count twice.
        assert!(a.breaker_allows(30, &b, "n1"));
        // Once the window has passed, drains go through again.
        assert!(a.breaker_allows(10 + 301, &b, "n2") || a.breaker_allows(20 + 301, &b, "n2"));
        // Operators' drains never count.
        let mut a = allocator(2);
        a.apply(
            0,
            &Input::NodeState {
                node: "n0".into(),
                state: NodeState::Draining,
                reason: "maintenance".into(),
                by: "cluster-operator".into(),
                author: String::new(),
            },
        )
        .expect("drain");
        assert!(a.breaker_allows(1, &b, "n1"));
    }

    #[test]
    fn journal_entries_of_0_1_keep_their_requeue_rule() {
        let old = r#"{"kind":"submit","spec":{"project":"p","user":"u","class":"batch","gpus_per_node":1,"nodes":1,"cpu_per_node":0,"mem_per_node_gb":0,"min_runtime":0,"time_limit":null,"resumable":RES,"priority":0},"argv":["x"],"hook":""}"#;
        for (res, no_requeue) in [("false", true), ("true", false)] {
            let Ok(Input::Submit { spec, .. }) = Input::decode(&old.replace("RES", res)) else {
                panic!("a 0.1 submission decodes");
            };
            assert_eq!(spec.no_requeue, no_requeue, "resumable {res}");
        }
        // What this release writes reads back as written.
        let new = old
            .replace("RES", "false")
            .replace(r#""priority":0}"#, r#""priority":0,"no_requeue":false}"#);
        let Ok(Input::Submit { spec, .. }) = Input::decode(&new) else {
            panic!("decodes");
        };
        assert!(!spec.no_requeue);
    }

    #[test]
    fn replaying_the_inputs_rebuilds_the_same_state() {
        let spec = |p: &str, min| WorkloadSpec {
            project: p.into(),
            user: "u".into(),
            class: "batch".into(),
            gpus_per_node: 1,
            nodes: 1,
            cpu_per_node: 0,
            mem_per_node_gb: 0,
            min_runtime: min,
            time_limit: None,
            resumable: true,
            priority: 0,
            no_requeue: false,
        };
        let mut inputs: Vec<(Time, Input)> = (0..2).map(|i| (0, node(i))).collect();
        for k in 0..6u64 {
            inputs.push((
                k,
                Input::Submit {
                    spec: spec(if k % 2 == 0 { "demo-a" } else { "demo-b" }, 60 * k),
                    argv: vec!["x".into()],
                    hook: String::new(),
                },
            ));
            inputs.push((k, Input::Schedule));
        }
        inputs.push((
            100,
            Input::LeaseEnded {
                lease: 1,
                end: EndKind::Completed,
                reason: "done".into(),
                node: String::new(),
            },
        ));
        inputs.push((100, Input::Schedule));
        inputs.push((4_000, Input::Schedule));
        let run = |inputs: &[(Time, Input)]| {
            let mut a = allocator(0);
            let mut sent = Vec::new();
            for (t, i) in inputs {
                if let Ok(ap) = a.apply(*t, i) {
                    sent.extend(ap.outs);
                }
            }
            let view: Vec<(u64, WorkloadState, Vec<u64>, Vec<String>)> = a
                .workloads()
                .values()
                .map(|w| (w.id, w.state, w.leases.clone(), w.nodes.clone()))
                .collect();
            (
                view,
                sent,
                a.core.usage_gpu_secs(allot_fairshare::GroupId(0), 5_000),
            )
        };
        let (v1, s1, u1) = run(&inputs);
        let (v2, s2, u2) = run(&inputs);
        assert_eq!(v1, v2);
        assert_eq!(s1, s2);
        assert_eq!(u1, u2);
        assert!(u1 > 0.0, "usage was charged");
        assert!(v1.iter().any(|w| w.1 == WorkloadState::Completed));
    }
}
