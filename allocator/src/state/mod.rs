//! The allocator's state machine: the fair-share core plus what the service knows
//! besides (nodes with their GPU UUIDs and drains, workload commands, lease placement
//! on hosts, the circuit breaker, counters). Sans-IO like the core: inputs and times
//! in, [`Command`]s for agents, audit lines and notices out. Every [`Input`] that
//! changes something is journaled; replaying the journal through
//! [`Allocator::apply`] rebuilds this state exactly (the core is deterministic),
//! usage window included.
//!
//! - `input.rs` — what the journal holds, and how older releases' entries read;
//! - `apply.rs` — [`Allocator::apply`]: workloads, leases, passes;
//! - `hosts.rs` — registration and reconciliation, drains, health and the breaker;
//! - `audit.rs` — the sentences people read;
//! - `out.rs` — what the service shell carries out;
//! - `access.rs` — who may do what ([`Allocator::authorize`]), credentials applied;
//! - `creds.rs` — tokens and node certificates issued (hashes and fingerprints);
//! - `snapshot.rs` — the state as facts, and back: what start-up loads before the
//!   journal's tail.

mod access;
mod apply;
mod audit;
mod creds;
mod gates;
#[cfg(test)]
mod gates_tests;
#[cfg(test)]
mod health_props;
mod hosts;
mod input;
mod out;
mod snapshot;
#[cfg(test)]
mod tests;

pub use access::{anonymous_may, Access, Ask, Denied, Who};
pub use allot_common::array::ArraySpec;
pub use audit::state_name;
pub use creds::{Creds, NodeCred, TokenRec};
pub use gates::{ArrayPos, Dep, DepKind, Gates, HoldRec};
pub use input::{GpuCondition, GpuSeen, HostDrain, Input, Verdict};
pub use out::{lease_from_wire, lease_wire, Applied, Command, Level, Out, StartLease};
pub use snapshot::{Snapshot, SNAPSHOT_VERSION};

use crate::config::{BreakerSection, ServerConfig};
use allot_fairshare::{
    CoreError, LeaseId, NodeId, NodeSpec, NodeState, OrgTree, Scheduler, Time, WorkloadSpec,
    WorkloadState,
};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, VecDeque};

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
    /// for drain-now (re-checked by the scheduling loop: `Input::RecheckHeld`).
    pub held: Option<(String, bool)>,
    /// Its agent's stream is up (not journaled).
    pub connected: bool,
    /// Last message from its agent, or the end of its stream, Unix s (not
    /// journaled): the lost grace counts from it.
    pub last_seen: Time,
    /// Last message from its agent, Unix s (not journaled): its fence counts from
    /// it, for nothing the host heard from allotd is later.
    pub last_heard: Time,
    /// The agent's last health verdict.
    pub verdict: Verdict,
    /// The agent's GPUs as the rules last saw them (registration, health report).
    pub seen: Vec<GpuSeen>,
    /// The agent's GPUs as last reported, for views (not journaled; the API keeps it).
    pub gpus: Vec<GpuReport>,
    /// Where the cluster reaches the host, as its agent registered it (empty from
    /// agents before it was sent: the node's name is used).
    pub addr: String,
    /// Its agent stops every lease of allotd's within this many seconds of its last
    /// word from allotd, as it registered; 0: it does not fence.
    pub fence_s: u64,
}

/// A GPU as its agent last reported it, for views.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct GpuReport {
    /// Its UUID.
    pub uuid: String,
    /// Its index on the host.
    pub index: u32,
    /// Its PCI address (`dddd:bb:dd`).
    pub pci: String,
    /// Its model.
    pub model: String,
    /// Its condition.
    pub state: GpuCondition,
    /// The health signals seen on it.
    pub reasons: Vec<GpuReason>,
    /// The lease the agent holds it for (empty when free).
    pub lease: String,
}

/// One health signal of a [`GpuReport`].
#[derive(Debug, Clone, Default, PartialEq)]
pub struct GpuReason {
    /// `xid:79`, `row-remap-pending`, ...
    pub signal: String,
    /// The value and what it means.
    pub detail: String,
    /// `""`, `drain` or `drain-now`.
    pub action: String,
    /// Only this GPU's leases need to end.
    pub gpu_only: bool,
    /// Since, Unix s.
    pub since_unix: i64,
}

/// The org tree as `allot share` reads it: per group its share, what it was
/// entitled to and received over the window, and what runs and waits.
#[derive(Debug, Clone, PartialEq)]
pub struct TreeView {
    /// Every group but the root, parents before children.
    pub groups: Vec<GroupView>,
    /// The usage window, hours.
    pub window_hours: f64,
    /// GPUs in the cluster.
    pub capacity_gpus: u32,
    /// GPUs in the cluster, each weighted by its type (`gpu_hour_weight`).
    pub weighted_capacity_gpus: f64,
    /// The part of the window the ledger has recorded, hours.
    pub covered_hours: f64,
    /// How far ahead the current allocation is counted, hours.
    pub horizon_hours: f64,
    /// The ranking's longer memory, hours (0: the window).
    pub ranking_window_hours: f64,
    /// Dominant-resource fairness is on.
    pub drf: bool,
}

/// One group of [`TreeView`].
#[derive(Debug, Clone, PartialEq)]
pub struct GroupView {
    /// Its name.
    pub name: String,
    /// Its parent's name (empty under the root).
    pub parent: String,
    /// Its weight among its siblings.
    pub weight: f64,
    /// Its normalised share of the cluster.
    pub share: f64,
    /// Share × capacity × window, GPU-hours.
    pub entitled_gpu_hours: f64,
    /// GPU-hours it used over the window.
    pub served_gpu_hours: f64,
    /// Its served ratio.
    pub ratio: f64,
    /// GPUs its work holds now.
    pub running_gpus: u32,
    /// GPUs its pending work asks for.
    pub pending_gpus: u32,
    /// A project (a leaf that takes work).
    pub project: bool,
    /// Depth below the root (1: top level).
    pub depth: u32,
    /// What the ratio counts as received, GPU-hours.
    pub counted_gpu_hours: f64,
    /// What the ratio counts as fair, GPU-hours.
    pub fair_gpu_hours: f64,
    /// How busy its running GPUs are (0 to 1), by their hosts' last word; `None`
    /// while none has said.
    pub gpu_util: Option<f64>,
}

/// One drain of a node.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
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

/// The node state a set of drains makes: the most severe (`NodeState` is ordered
/// by severity).
fn effective(drains: &BTreeMap<String, DrainRec>) -> NodeState {
    drains
        .values()
        .map(|d| d.state)
        .max()
        .unwrap_or(NodeState::Ready)
}

/// The warning a workload asked for before its time limit (`--signal USR2@5m`, as
/// Slurm's `--signal`): opt-in, so that no program is sent a signal it did not ask
/// for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TimeWarning {
    /// The signal's name (`USR2`), one a program can catch.
    pub signal: String,
    /// How long before the time limit, seconds.
    pub before_s: u64,
}

/// A workload as the service shows it (kept in snapshots: serde defaults, so an
/// older snapshot reads).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct WorkRec {
    /// Id.
    pub id: u64,
    /// Request.
    pub spec: WorkloadSpec,
    /// Command.
    #[serde(default)]
    pub argv: Vec<String>,
    /// Checkpoint hook.
    #[serde(default)]
    pub hook: String,
    /// Submitted, Unix s.
    #[serde(default)]
    pub submit: Time,
    /// State.
    pub state: WorkloadState,
    /// Current or last run's start.
    #[serde(default)]
    pub start: Time,
    /// End once final.
    #[serde(default)]
    pub end: Time,
    /// How the last run ended.
    #[serde(default)]
    pub end_reason: String,
    /// Every lease it held.
    #[serde(default)]
    pub leases: Vec<u64>,
    /// Nodes of the current run.
    #[serde(default)]
    pub nodes: Vec<String>,
    /// Preemptions.
    #[serde(default)]
    pub preemptions: u32,
    /// Current run funded.
    #[serde(default)]
    pub funded: bool,
    /// Where the work starts on every host (absolute; empty: the agent's own
    /// directory, as before it was submitted).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub cwd: String,
    /// The submitted environment, in order (names unique).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<(String, String)>,
    /// Stdout file pattern (`%j`, `%r`, `%n`); empty: the agent's default.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub output: String,
    /// Stderr file pattern; empty: the agent's default.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub error: String,
    /// Every run (lease) it had, oldest first: run N is `runs[N - 1]`.
    #[serde(default)]
    pub runs: Vec<RunRec>,
    /// The warning it asked for before its time limit; none unless asked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub warn: Option<TimeWarning>,
    /// The job's name (`--name`); empty: none given.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub name: String,
    /// The last run's exit status, when its process exited.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    /// The signal that ended the last run's process, when one did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signal: Option<i32>,
    /// What keeps it out of the queue besides the policy (hold, dependencies,
    /// singleton, begin time).
    #[serde(default, skip_serializing_if = "Gates::is_open")]
    pub gates: Gates,
    /// Its array and its index there, for an element of one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub array: Option<ArrayPos>,
    /// Its batch script (`allot submit job.sh`), run with `argv` as arguments.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub script: String,
    /// What its user is told about (`end`, `fail`, `preempt`, `time-limit`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub notify: Vec<String>,
    /// A session (`allot run --pty`): it runs on a terminal `allot attach` reaches.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub pty: bool,
}

/// One run of a workload: a lease, where its parts ran and what they were told.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RunRec {
    /// The lease.
    pub lease: u64,
    /// Its hosts in rank order (rank 0 first).
    pub nodes: Vec<String>,
    /// The rendezvous port on rank 0's host (`MASTER_PORT`); 0 when none was free.
    pub master_port: u16,
    /// Started (0 in records before it was kept).
    #[serde(default)]
    pub start: Time,
    /// Ended (0 while it runs).
    #[serde(default)]
    pub end: Time,
    /// GPUs in all.
    #[serde(default)]
    pub gpus: u32,
    /// How it ended (`exited`, `preempted`, `node-lost`, ...); empty while it runs.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub end_reason: String,
    /// Its process's exit status, when it exited.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    /// The signal that ended its process, when one did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signal: Option<i32>,
    /// How it ended in words: the host's report (`failed-to-start (…) on n0: …`)
    /// or allotd's (`node n0 lost`).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub detail: String,
    /// Charged to the project's budget (false in records before it was kept).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub funded: bool,
    /// Why allotd revoked it, when it did (`preempted`, `drain`, `requeued`, ...).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub revoked: String,
    /// Its GPUs idle since, Unix s, as its host last said (0: in use).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub idle_since: Time,
    /// The mean utilisation of its GPUs when its host last said idle or busy, %.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_util: Option<u32>,
    /// A session's last keystroke, Unix s, as allotd relayed it (0: none yet).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub input_at: Time,
    /// A session told on its terminal that, idle, it is no longer protected (until
    /// it is used again).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub idle_warned: bool,
}

impl RunRec {
    /// What the run's use tells the policy ([`allot_fairshare::Scheduler::lease_use`]):
    /// `Some(None)` in use (its GPUs busy), `Some(Some(t))` idle since `t` (the later
    /// of its GPUs' going idle and its last keystroke), `None` nothing known yet.
    pub fn used(&self) -> Option<Option<Time>> {
        if self.gpu_util.is_some() && self.idle_since == 0 {
            return Some(None);
        }
        let since = self.idle_since.max(self.input_at);
        (since != 0).then_some(Some(since))
    }
}

fn is_zero(t: &Time) -> bool {
    *t == 0
}

/// An output pattern with `%x` replaced by the job's name (`allot` when it has
/// none), and `%A`/`%a` by its array's id and its index there (Slurm's; the
/// workload id and 0 outside an array), here rather than on the agent: names and
/// arrays are allotd's. `%%x` stays.
fn with_name(pattern: &str, w: &WorkRec) -> String {
    let name = if w.name.is_empty() { "allot" } else { &w.name };
    let (array, index) = w.array.map_or((w.id, 0), |p| (p.id, p.index));
    allot_common::fields::expand_pattern(pattern, |e| match e {
        'x' => Some(name.to_string()),
        'A' => Some(array.to_string()),
        'a' => Some(index.to_string()),
        _ => None,
    })
}

/// Counters for `/metrics` (kept in snapshots, rebuilt by replay like everything else).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct Counters {
    /// Revocations by reason kind.
    pub revocations: BTreeMap<String, u64>,
    /// Node drains by who.
    pub drains: BTreeMap<String, u64>,
    /// Queue waits per class, as the histogram `/metrics` shows.
    pub waits: BTreeMap<String, WaitHistogram>,
    /// Automatic drains the breaker held.
    pub breaker_held: u64,
    /// GPU-seconds of ended runs per project: [funded, unfunded] (`/metrics` adds
    /// the running ones' so far).
    pub gpu_seconds: BTreeMap<String, [u64; 2]>,
    /// Workloads ended, by final state (`completed`, `failed`, `timed-out`, …).
    pub finished: BTreeMap<String, u64>,
}

/// Queue-wait histogram buckets, seconds: a second to a week, fine below a minute so
/// that a debug run's promise (started within 60 s) can be read from them.
pub const WAIT_BUCKETS: [u64; 13] = [
    1, 5, 15, 30, 60, 300, 900, 3_600, 14_400, 43_200, 86_400, 259_200, 604_800,
];

/// The buckets before the sub-minute ones (snapshots of earlier releases): a minute
/// to a week, the last nine of [`WAIT_BUCKETS`].
const WAIT_BUCKETS_BEFORE: usize = 9;

/// Reads a histogram's buckets, of this release or the one before.
fn wait_buckets<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> Result<[u64; WAIT_BUCKETS.len()], D::Error> {
    use serde::de::Error;
    let v = Vec::<u64>::deserialize(d)?;
    let mut out = [0; WAIT_BUCKETS.len()];
    match v.len() {
        n if n == WAIT_BUCKETS.len() => out.copy_from_slice(&v),
        WAIT_BUCKETS_BEFORE => out[WAIT_BUCKETS.len() - WAIT_BUCKETS_BEFORE..].copy_from_slice(&v),
        n => return Err(D::Error::invalid_length(n, &"9 or 13 wait buckets")),
    }
    Ok(out)
}

/// Submit-to-start waits of one class: cumulative bucket counts, sum and count.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct WaitHistogram {
    /// Waits at or under each of [`WAIT_BUCKETS`] (a snapshot of an earlier release
    /// reads with nothing under a minute: what it did not count).
    #[serde(deserialize_with = "wait_buckets")]
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
    /// The breaker's settings.
    breaker: BreakerSection,
    /// Tokens and node credentials issued.
    pub creds: Creds,
    /// Roles from the config.
    access: Access,
    /// The configured `MASTER_PORT` range (`[server] master_ports`), inclusive.
    master_ports: (u16, u16),
    /// Rendezvous ports held by live leases: rank 0's node → port → lease. Derived
    /// (from `lease_hosts` and the runs), never journaled.
    ports: BTreeMap<String, BTreeMap<u16, u64>>,
    /// Whom a workload's change concerns (dependents, arrays, names, begin times).
    /// Derived, never journaled.
    gate_ix: gates::GateIndex,
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
            breaker: cfg.breaker.clone(),
            creds: Creds::default(),
            access: Access::new(cfg.roles.clone(), cfg.auth.clone(), cfg.access.clone()),
            master_ports: (cfg.server.master_ports.low, cfg.server.master_ports.high),
            ports: BTreeMap::new(),
            gate_ix: gates::GateIndex::default(),
        })
    }

    /// Nodes by name.
    pub fn nodes(&self) -> &BTreeMap<String, NodeRec> {
        &self.nodes
    }

    /// A node's agent opened its stream and registered these GPUs (runtime facts,
    /// not journaled).
    pub fn agent_connected(&mut self, node: &str, now: Time, gpus: Vec<GpuReport>) {
        if let Some(n) = self.nodes.get_mut(node) {
            n.connected = true;
            n.last_seen = now;
            n.last_heard = now;
            n.gpus = gpus;
        }
    }

    /// A node's agent was heard from.
    pub fn agent_heard(&mut self, node: &str, now: Time) {
        if let Some(n) = self.nodes.get_mut(node) {
            n.last_seen = now;
            n.last_heard = now;
        }
    }

    /// A node's agent says how soon its leases stop without word from allotd
    /// (`Heartbeat.fence_s`: a reload changes it; kept by snapshots, and journaled
    /// at each registration).
    pub fn agent_fences(&mut self, node: &str, fence_s: u64) {
        if let Some(n) = self.nodes.get_mut(node) {
            n.fence_s = fence_s;
        }
    }

    /// A node's agent reported its GPUs, kept for views; false for a node allotd
    /// does not know.
    pub fn agent_reported(&mut self, node: &str, gpus: Vec<GpuReport>) -> bool {
        match self.nodes.get_mut(node) {
            Some(n) => {
                n.gpus = gpus;
                true
            }
            None => false,
        }
    }

    /// A node's agent's stream ended.
    pub fn agent_disconnected(&mut self, node: &str, now: Time) {
        if let Some(n) = self.nodes.get_mut(node) {
            n.connected = false;
            n.last_seen = now;
        }
    }

    /// Workloads by id (ended ones until they retire).
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

    /// Ended leases with a part still held on `node` (being stopped there).
    pub fn leaving_on(&self, node: &str) -> Vec<u64> {
        let Some(id) = self.nodes.get(node).map(|n| n.id) else {
            return Vec::new();
        };
        self.core
            .leaving()
            .iter()
            .filter(|(_, l)| l.parts.iter().any(|p| p.node == id))
            .map(|(l, _)| l.0)
            .collect()
    }

    /// The start command for a live lease on `node` (to re-send on reconnect): the
    /// same run, rank and rendezvous as the first time.
    fn start_command(&self, lease: u64, node: &str) -> Option<Command> {
        let l = self.core.lease(LeaseId(lease))?;
        let w = self.work.get(&l.workload.0)?;
        let gpus = self
            .lease_hosts
            .get(&lease)?
            .iter()
            .find(|(n, _)| n == node)?
            .1
            .clone();
        Some(self.start_for(lease, w, l.start, node, gpus))
    }

    /// The start command for one host of a lease. The run, the rank order and the
    /// port come from the workload's [`RunRec`] (a lease restored from a release
    /// without runs gets its hosts in placement order and no port).
    fn start_for(
        &self,
        lease: u64,
        w: &WorkRec,
        start: Time,
        node: &str,
        gpus: Vec<String>,
    ) -> Command {
        let found = w.runs.iter().position(|r| r.lease == lease);
        let (run, nodes, master_port) = match found {
            Some(i) => (i + 1, w.runs[i].nodes.clone(), w.runs[i].master_port),
            None => (
                w.leases.iter().position(|l| *l == lease).unwrap_or(0) + 1,
                self.lease_hosts
                    .get(&lease)
                    .map(|h| h.iter().map(|(n, _)| n.clone()).collect())
                    .unwrap_or_else(|| vec![node.to_string()]),
                0,
            ),
        };
        let rank = nodes.iter().position(|n| n == node).unwrap_or(0);
        let master_addr = nodes
            .first()
            .map(|n| match self.nodes.get(n) {
                Some(rec) if !rec.addr.is_empty() => rec.addr.clone(),
                _ => n.clone(),
            })
            .unwrap_or_default();
        Command::Start(Box::new(StartLease {
            lease,
            workload: w.id,
            project: w.spec.project.clone(),
            user: w.spec.user.clone(),
            gpu_uuids: gpus,
            start,
            min_runtime: w.spec.min_runtime,
            time_limit: w.spec.time_limit,
            hook: w.hook.clone(),
            warn: w.warn.clone(),
            argv: w.argv.clone(),
            cwd: w.cwd.clone(),
            env: w.env.clone(),
            output: with_name(&w.output, w),
            error: with_name(&w.error, w),
            name: w.name.clone(),
            run: u32::try_from(run).unwrap_or(u32::MAX),
            rank: u32::try_from(rank).unwrap_or(u32::MAX),
            nodes,
            gpus_per_node: w.spec.gpus_per_node,
            master_addr,
            master_port,
            cpu_per_node: w.spec.cpu_per_node,
            mem_per_node_gb: w.spec.mem_per_node_gb,
            array: w.array.map(|p| (p.id, p.index)),
            script: w.script.clone(),
            pty: w.pty,
        }))
    }

    /// The rendezvous port for a new lease whose rank 0 is on `node`: the first port
    /// of the configured range, counted from `lease` (so consecutive leases spread
    /// over the range rather than reuse the port just freed), that no live lease
    /// with rank 0 on `node` holds. Deterministic in the state, so replay picks the
    /// same. `None` when every port of the range is held there.
    pub(super) fn pick_port(&self, node: &str, lease: u64) -> Option<u16> {
        let (lo, hi) = self.master_ports;
        let size = u64::from(hi.saturating_sub(lo)) + 1;
        let held = self.ports.get(node);
        (0..size)
            .map(|i| lo + ((lease.wrapping_add(i)) % size) as u16)
            .find(|p| held.is_none_or(|h| !h.contains_key(p)))
    }

    /// Rebuilds the held-port index from the live leases and their runs.
    pub(super) fn index_ports(&mut self) {
        let mut ports: BTreeMap<String, BTreeMap<u16, u64>> = BTreeMap::new();
        for w in self.work.values() {
            for r in &w.runs {
                if r.master_port != 0 && self.lease_hosts.contains_key(&r.lease) {
                    if let Some(n) = r.nodes.first() {
                        ports
                            .entry(n.clone())
                            .or_default()
                            .insert(r.master_port, r.lease);
                    }
                }
            }
        }
        self.ports = ports;
    }

    /// A lease of workload `wid` ended: its rendezvous port is free again.
    pub(super) fn release_port(&mut self, wid: u64, lease: u64) {
        let rank0 = self
            .work
            .get(&wid)
            .and_then(|w| w.runs.iter().rev().find(|r| r.lease == lease))
            .and_then(|r| r.nodes.first().cloned());
        if let Some(node) = rank0 {
            if let Some(held) = self.ports.get_mut(&node) {
                held.retain(|_, l| *l != lease);
                if held.is_empty() {
                    self.ports.remove(&node);
                }
            }
        }
    }

    /// Whether the breaker lets one more automatic drain (of `node`) through at `at`.
    pub fn breaker_allows(&mut self, at: Time, node: &str) -> bool {
        let window = self.breaker.window;
        while self
            .auto_drains
            .front()
            .is_some_and(|(t, _)| *t + window < at)
        {
            self.auto_drains.pop_front();
        }
        let mut recent: std::collections::BTreeSet<&str> =
            self.auto_drains.iter().map(|(_, n)| n.as_str()).collect();
        recent.insert(node);
        let limit = (self.breaker.max_share * self.nodes.len() as f64)
            .floor()
            .max(1.0) as usize;
        recent.len() <= limit
    }

    /// The org tree for `allot share`.
    pub fn tree(&self, now: Time) -> TreeView {
        let tree = self.core.tree();
        let ratios = self.core.group_ratios(now);
        let (parts, covered) = self.core.group_ratio_parts(now);
        let cfg = self.core.config();
        let ranking_h = match cfg.ranking_usage() {
            Some(_) => cfg.ranking_lookback as f64 / 3600.0,
            None => 0.0,
        };
        let capacity = self.core.cluster().total_gpus();
        let weighted =
            self.core.cluster().total_weighted() as f64 / allot_fairshare::config::MILLI as f64;
        let window_h = self.core.config().lookback as f64 / 3600.0;
        let mut running = vec![0u32; tree.len()];
        let mut pending = vec![0u32; tree.len()];
        // Per group: utilisation × GPUs, and the GPUs whose use was said.
        let mut busy = vec![(0.0f64, 0u64); tree.len()];
        for w in self.work.values() {
            let Some(g) = tree.find(&w.spec.project) else {
                continue;
            };
            if w.state == WorkloadState::Running {
                if let Some((u, n)) = w
                    .runs
                    .last()
                    .filter(|r| r.end == 0)
                    .and_then(|r| r.gpu_util.map(|u| (u, r.gpus)))
                {
                    for p in tree.group(g).path.iter() {
                        busy[p.idx()].0 += f64::from(u) / 100.0 * f64::from(n);
                        busy[p.idx()].1 += u64::from(n);
                    }
                }
            }
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
            .map(|(g, grp)| GroupView {
                name: grp.name.clone(),
                parent: grp
                    .parent
                    .filter(|p| p.idx() != 0)
                    .map(|p| tree.group(p).name.clone())
                    .unwrap_or_default(),
                weight: grp.weight,
                share: grp.share,
                entitled_gpu_hours: grp.share * weighted * window_h,
                served_gpu_hours: self.core.usage_gpu_secs(g, now) / 3600.0,
                ratio: ratios.get(g.idx()).copied().unwrap_or(0.0),
                running_gpus: running[g.idx()],
                pending_gpus: pending[g.idx()],
                project: tree.is_project(g),
                depth: grp.path.len() as u32,
                counted_gpu_hours: parts.get(g.idx()).map_or(0.0, |p| p.0 / 3600.0),
                fair_gpu_hours: parts.get(g.idx()).map_or(0.0, |p| p.1 / 3600.0),
                gpu_util: busy
                    .get(g.idx())
                    .filter(|b| b.1 > 0)
                    .map(|b| b.0 / b.1 as f64),
            })
            .collect();
        TreeView {
            groups,
            window_hours: window_h,
            capacity_gpus: u32::try_from(capacity).unwrap_or(u32::MAX),
            weighted_capacity_gpus: weighted,
            covered_hours: covered / 3600.0,
            horizon_hours: cfg.allocation_horizon as f64 / 3600.0,
            ranking_window_hours: ranking_h,
            drf: cfg.drf,
        }
    }
}
