//! What the journal holds: every accepted [`Input`], and how entries written by
//! earlier releases are read ([`Input::decode`], [`drain_kind`]).

use allot_common::drain::DrainAuthor;
use allot_fairshare::{Action, LeaseEnd, NodeSpec, NodeState, WorkloadSpec};
use serde::{Deserialize, Serialize};

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// One accepted input: what the journal holds.
// One at a time through `apply`, never stored in bulk: a submission's size costs
// nothing worth a box.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", tag = "kind")]
pub enum Input {
    /// A host registered for the first time.
    AddNode {
        /// What the core needs.
        spec: NodeSpec,
        /// GPU UUIDs by index.
        #[serde(default)]
        gpu_uuids: Vec<String>,
    },
    /// A user submitted work.
    Submit {
        /// The request.
        spec: WorkloadSpec,
        /// The command.
        #[serde(default)]
        argv: Vec<String>,
        /// Checkpoint hook spec.
        #[serde(default)]
        hook: String,
        /// Where it starts (absolute; empty in journals before it existed).
        #[serde(default, skip_serializing_if = "String::is_empty")]
        cwd: String,
        /// The submitted environment, in order.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        env: Vec<(String, String)>,
        /// Stdout file pattern.
        #[serde(default, skip_serializing_if = "String::is_empty")]
        output: String,
        /// Stderr file pattern.
        #[serde(default, skip_serializing_if = "String::is_empty")]
        error: String,
        /// The warning asked for before the time limit (none in journals before it
        /// existed, whose agents sent their own default: that default is now off).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        warn: Option<super::TimeWarning>,
        /// The job's name (`--name`); empty: none given.
        #[serde(default, skip_serializing_if = "String::is_empty")]
        name: String,
        /// What keeps it out of the queue at first (hold, dependencies, singleton,
        /// begin time).
        #[serde(default, skip_serializing_if = "super::Gates::is_open")]
        gates: super::Gates,
        /// An array: one workload per index, each with `ALLOT_ARRAY_ID` and
        /// `ALLOT_ARRAY_INDEX`, at most `limit` running at once.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        array: Option<allot_common::array::ArraySpec>,
        /// A batch script run by its `#!` line with `argv` as its arguments.
        #[serde(default, skip_serializing_if = "String::is_empty")]
        script: String,
        /// What its user is told about (`end`, `fail`, `preempt`, `time-limit`).
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        notify: Vec<String>,
        /// A session (`allot run --pty`): it runs on a terminal `allot attach` reaches.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        pty: bool,
    },
    /// A user cancelled work.
    Cancel {
        /// Workload.
        id: u64,
        /// Who (empty in journals before 0.4).
        #[serde(default, skip_serializing_if = "String::is_empty")]
        by: String,
    },
    /// The owner or an operator held pending work (`allot hold`).
    Hold {
        /// Workload.
        id: u64,
        /// Who.
        by: String,
        /// An operator's hold, which only an operator releases.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        operator: bool,
    },
    /// The owner or an operator released a hold (`allot release`).
    Release {
        /// Workload.
        id: u64,
        /// Who.
        by: String,
    },
    /// The owner or an operator sent running work back to the queue
    /// (`allot requeue`), held there with `hold`.
    Requeue {
        /// Workload.
        id: u64,
        /// Who.
        by: String,
        /// Held once back in the queue.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        hold: bool,
        /// An operator asked.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        operator: bool,
    },
    /// The owner or an operator changed pending work (`allot update`).
    Update {
        /// Workload.
        id: u64,
        /// Who.
        by: String,
        /// A new time limit, seconds.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        time_limit: Option<u64>,
        /// A new priority within its project.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        priority: Option<i32>,
        /// A new begin time (0: now).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        begin: Option<u64>,
    },
    /// An agent reported a lease over.
    LeaseEnded {
        /// Lease.
        lease: u64,
        /// How.
        end: LeaseEnd,
        /// The agent's words.
        #[serde(default)]
        reason: String,
        /// The node that reported it (a refusal marks that node only); empty in
        /// journals before 0.2 and for ends allotd decides itself.
        #[serde(default, skip_serializing_if = "String::is_empty")]
        node: String,
        /// The exit status the host saw, when it saw one.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        exit_code: Option<i32>,
        /// The signal that ended the workload's process, when one did.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        signal: Option<i32>,
        /// One part's end (the host's own report): a part that completed waits for
        /// the others of its gang, which go on. False in journals before it existed,
        /// where any part's end ended the whole lease, and replay keeps that.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        part: bool,
        /// The lease's parts on its other hosts stay held until each reports its
        /// end (they are told to stop), and its workload does not start again before
        /// (false in journals before it existed, whose ends released every part at
        /// once, and replay keeps that). A report for a part of a lease already ended
        /// is that part's end.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        leaving: bool,
    },
    /// A lease's host found its GPUs idle (under `[agent] idle_below` for
    /// `idle_after`) or busy again.
    LeaseUse {
        /// Lease.
        lease: u64,
        /// The node that saw it.
        node: String,
        /// Idle since, Unix s; 0: busy again.
        idle_since: allot_fairshare::Time,
        /// The mean utilisation of its GPUs there, %.
        gpu_util: u32,
    },
    /// A session's terminal was typed into (journaled at most every
    /// `attach::INPUT_EVERY`): its use, as its GPUs' is.
    Typed {
        /// Lease.
        lease: u64,
    },
    /// A session idle past its class's grace was told on its terminal that it is
    /// no longer protected (`[policy] protect_by_use`).
    SessionIdle {
        /// Lease.
        lease: u64,
    },
    /// A node's scheduling state changed (operator, health, or lost).
    NodeState {
        /// Node name.
        node: String,
        /// New state.
        state: NodeState,
        /// Why.
        #[serde(default)]
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
        /// Who (empty in journals before 0.4).
        #[serde(default, skip_serializing_if = "String::is_empty")]
        by: String,
    },
    /// An admin created a user token; only its hash is kept.
    TokenCreated {
        /// Its id.
        id: String,
        /// Whom it proves.
        user: String,
        /// SHA-256 of the secret, hex.
        hash: String,
        /// Expiry, Unix s.
        expires: u64,
        /// The admin.
        #[serde(default)]
        by: String,
        /// The admin's note.
        #[serde(default, skip_serializing_if = "String::is_empty")]
        note: String,
    },
    /// An admin revoked a user token.
    TokenRevoked {
        /// Its id.
        id: String,
        /// The admin.
        #[serde(default)]
        by: String,
    },
    /// An admin offered a node enrollment: a one-time token (hash kept).
    NodeOffered {
        /// The node's name: what its certificate will carry.
        node: String,
        /// SHA-256 of the token, hex.
        hash: String,
        /// Expiry, Unix s.
        expires: u64,
        /// The admin.
        #[serde(default)]
        by: String,
    },
    /// A node got a certificate (by enrolling, which uses up its token, or by
    /// renewing).
    NodeCertified {
        /// The node.
        node: String,
        /// The certificate's SHA-256, hex.
        fingerprint: String,
        /// Its expiry, Unix s.
        not_after: u64,
    },
    /// An admin revoked a node: its sessions end and it is refused from then on.
    NodeRevoked {
        /// The node.
        node: String,
        /// The admin.
        #[serde(default)]
        by: String,
    },
    /// An admin took a node out of the cluster for good: it counts in no capacity,
    /// takes no work and is refused until enrolled again (then it joins as new).
    NodeRemoved {
        /// The node.
        node: String,
        /// The admin.
        #[serde(default)]
        by: String,
    },
    /// A scheduling pass. Journals since 0.5 keep what it decided instead
    /// ([`Input::Decided`]); older ones hold this and replay runs the pass.
    Schedule,
    /// What a scheduling pass decided: starts with their lease ids and places,
    /// revocations, withdrawals (the facts agents act on). Replayed as is, without
    /// the policy, so an upgrade that changes a rule never moves a running lease.
    Decided {
        /// The core's actions, in order.
        actions: Vec<Action>,
    },
    /// An agent (re)registered: its node is added if new and back from lost if it
    /// was, its own drain recorded, and the leases and drains both sides hold are
    /// reconciled (journals before 0.3 hold `add-node`, `node-state` and
    /// `node-changed` entries instead).
    Register {
        /// What the core needs.
        spec: NodeSpec,
        /// GPU UUIDs by index.
        #[serde(default)]
        gpu_uuids: Vec<String>,
        /// Its GPUs as it sees them.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        gpus: Vec<GpuSeen>,
        /// allotd's leases it runs.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        running: Vec<u64>,
        /// Its drains in force (and a health drain held).
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        drains: Vec<HostDrain>,
        /// Where the cluster reaches it (empty from agents before it was sent).
        #[serde(default, skip_serializing_if = "String::is_empty")]
        addr: String,
        /// The highest workload and lease ids of allotd's it holds, ended or not
        /// (0: none, or an agent from before it was sent): new ids continue above.
        #[serde(default, skip_serializing_if = "is_zero")]
        highest_workload: u64,
        /// See `highest_workload`.
        #[serde(default, skip_serializing_if = "is_zero")]
        highest_lease: u64,
        /// Leases the host runs that allotd had ended are held and ended (false in
        /// journals before it existed, whose registrations only reported them, and
        /// replay keeps that).
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        end_strays: bool,
        /// Every lease of allotd's on the host is gone within this many seconds of
        /// its agent's last word from allotd (it fences); 0: it does not fence, and
        /// a lost node's leases are held until the host reports.
        #[serde(default, skip_serializing_if = "is_zero")]
        fence_s: u64,
    },
    /// New ids continue at or above these: an operator restored the state from a
    /// backup (`allotd state restore`) or accepted a loss (`allotd state
    /// accept-loss`), and ids issued since must never be given again.
    IdsAbove {
        /// The next workload id at least.
        next_workload: u64,
        /// The next lease id at least.
        next_lease: u64,
        /// Why, for the audit log.
        why: String,
    },
    /// A host's health report: GPU health, its own drain, and a health drain through
    /// the circuit breaker (or held), or lifted once the verdict is ok again.
    Health {
        /// Node name.
        node: String,
        /// The host's verdict.
        #[serde(default)]
        verdict: Verdict,
        /// Its GPUs as it sees them.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        gpus: Vec<GpuSeen>,
        /// Why, for people: the signals that ask for an action.
        #[serde(default, skip_serializing_if = "String::is_empty")]
        reasons: String,
        /// Its drains in force (and a health drain held).
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        drains: Vec<HostDrain>,
    },
    /// A health drain the breaker holds is looked at again (the scheduling loop asks
    /// for a connected node): through once the breaker's window has room.
    RecheckHeld {
        /// Node name.
        node: String,
    },
}

/// A host's health verdict.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Verdict {
    /// Not said.
    #[default]
    Unspecified,
    /// Healthy.
    Ok,
    /// Drain at the min-runtime lapse.
    Drain,
    /// Empty now.
    DrainNow,
}

/// One GPU's condition as its host reports it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum GpuCondition {
    /// Not said.
    #[default]
    Unspecified,
    /// Usable.
    Healthy,
    /// Usable, with conditions.
    Degraded,
    /// Unusable.
    Failed,
}

/// One GPU in a host's report: what allotd's rules look at.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuSeen {
    /// Index on the host.
    pub index: u32,
    /// Condition.
    #[serde(default)]
    pub state: GpuCondition,
    /// The lease on it (the wire id, allotd's or the host's own), empty when free.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub lease: String,
}

/// A drain a host reports.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostDrain {
    /// Author kind: `local-operator`, `cluster-operator`, `health`.
    pub by: String,
    /// Who, where known.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub author: String,
    /// Why.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub reason: String,
    /// Drain-now.
    #[serde(default)]
    pub now: bool,
    /// A health drain the breaker holds (not in force).
    #[serde(default)]
    pub held: bool,
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

/// Drain author kinds as journals of every release name them.
pub fn drain_kind(by: &str) -> &str {
    match by {
        "operator" => DrainAuthor::ClusterOperator.as_str(),
        "agent" => DrainAuthor::Lost.as_str(),
        k => k,
    }
}
