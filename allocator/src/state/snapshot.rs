//! Snapshots: the allocator's facts at one journal position, so start-up loads the
//! last snapshot and applies only the journal's tail (and the journal below it is
//! compacted away). Facts only, never derived structures: the core's
//! [`Facts`](allot_fairshare::scheduler::Facts), workloads as the service shows
//! them, where each lease runs, nodes with their drains and their authors,
//! credentials and counters. Every type has serde defaults, and `version` says
//! which release's layout a snapshot has, so a later release reads it.

use super::{effective, Allocator, Counters, Creds, DrainRec, GpuSeen, NodeRec, Verdict, WorkRec};
use crate::config::ServerConfig;
use allot_fairshare::scheduler::Facts;
use allot_fairshare::{CoreError, NodeId, OrgTree, Scheduler, Time};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, VecDeque};

/// The snapshot layout this release writes; it reads this and every earlier one.
pub const SNAPSHOT_VERSION: u32 = 1;

/// Where one lease runs: each node with the GPU UUIDs there.
pub type LeaseHosts = Vec<(String, Vec<String>)>;

/// What allotd's state is, as facts.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct Snapshot {
    /// Layout version ([`SNAPSHOT_VERSION`] when written by this release).
    pub version: u32,
    /// The core's facts (workloads, leases, usage, node states, weights).
    pub core: Facts,
    /// What the service knows of each node besides, in the core's node order.
    pub nodes: Vec<NodeFacts>,
    /// Workloads as the service shows them, finished ones included.
    pub work: Vec<WorkRec>,
    /// Where each live lease runs: node and GPU UUIDs there.
    pub lease_hosts: Vec<(u64, LeaseHosts)>,
    /// Counters for `/metrics`.
    pub counters: Counters,
    /// Recent automatic drains, for the circuit breaker.
    pub auto_drains: Vec<(Time, String)>,
    /// Tokens and node credentials issued.
    pub creds: Creds,
}

/// One node as the service knows it beyond the core.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct NodeFacts {
    /// Its name (the core's node of the same position has this name).
    pub name: String,
    /// GPU UUIDs by index.
    pub gpu_uuids: Vec<String>,
    /// Every drain in force, by author kind.
    pub drains: BTreeMap<String, DrainRec>,
    /// A health drain the breaker holds.
    pub held: Option<(String, bool)>,
    /// The agent's last verdict.
    pub verdict: Verdict,
    /// The agent's GPUs as the rules last saw them.
    pub seen: Vec<GpuSeen>,
    /// Where the cluster reaches it, as its agent registered it.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub addr: String,
    /// How soon its agent fences, as it last registered (0: it does not).
    #[serde(default, skip_serializing_if = "super::is_zero")]
    pub fence_s: u64,
}

/// Why a snapshot could not be taken back into memory.
#[derive(Debug, thiserror::Error)]
pub enum RestoreError {
    /// Written by a later release.
    #[error("snapshot layout {0} is newer than this allotd reads ({SNAPSHOT_VERSION}): run the release that wrote it, or import an export made with it")]
    Newer(u32),
    /// The core refused its facts.
    #[error("{0}")]
    Core(#[from] CoreError),
    /// The service's facts disagree with the core's.
    #[error("node {index} is {found:?} in the service's facts but {want:?} in the core's")]
    NodeOrder {
        /// Position.
        index: usize,
        /// Name found.
        found: String,
        /// Name the core has there.
        want: String,
    },
}

impl Allocator {
    /// Takes out the workloads that ended at or before `before`: they leave memory and
    /// snapshots for the state file's retired records (`allot status` still reads
    /// them), so memory and start-up stay bounded however long allotd runs.
    pub fn retire(&mut self, before: Time) -> Vec<WorkRec> {
        let ids: Vec<u64> = self
            .work
            .values()
            .filter(|w| w.state.is_final() && w.end <= before)
            .map(|w| w.id)
            .collect();
        if ids.is_empty() {
            return Vec::new();
        }
        // The core needs no finished workload: it decides over live ones only.
        self.core.forget_finished();
        ids.iter().filter_map(|id| self.work.remove(id)).collect()
    }

    /// Puts back retired workloads whose records could not be written.
    pub fn unretire(&mut self, recs: Vec<WorkRec>) {
        for w in recs {
            self.work.insert(w.id, w);
        }
    }

    /// This state as facts, for a snapshot or an export.
    pub fn snapshot(&self) -> Snapshot {
        Snapshot {
            version: SNAPSHOT_VERSION,
            core: self.core.facts(),
            nodes: self
                .names
                .iter()
                .enumerate()
                .map(|(i, name)| match self.nodes.get(name) {
                    Some(n) if n.id.idx() == i => NodeFacts {
                        name: n.spec.name.clone(),
                        gpu_uuids: n.gpu_uuids.clone(),
                        drains: n.drains.clone(),
                        held: n.held.clone(),
                        verdict: n.verdict,
                        seen: n.seen.clone(),
                        addr: n.addr.clone(),
                        fence_s: n.fence_s,
                    },
                    // A removed node keeps its place (ids never move) and nothing else.
                    _ => NodeFacts {
                        name: name.clone(),
                        ..NodeFacts::default()
                    },
                })
                .collect(),
            work: self.work.values().cloned().collect(),
            lease_hosts: self
                .lease_hosts
                .iter()
                .map(|(l, h)| (*l, h.clone()))
                .collect(),
            counters: self.counters.clone(),
            auto_drains: self.auto_drains.iter().cloned().collect(),
            creds: self.creds.clone(),
        }
    }

    /// The allocator a snapshot describes, under today's config (its groups, roles,
    /// breaker, policy). Nodes come back not connected, last seen at `at`.
    pub fn restore(cfg: &ServerConfig, s: &Snapshot, at: Time) -> Result<Allocator, RestoreError> {
        if s.version > SNAPSHOT_VERSION {
            return Err(RestoreError::Newer(s.version));
        }
        let mut a = Allocator::new(cfg)?;
        let tree = OrgTree::new(&cfg.groups).map_err(|e| CoreError::Config(e.to_string()))?;
        a.core = Scheduler::from_facts(cfg.policy.clone(), tree, &s.core)?;
        for (i, n) in s.core.nodes.iter().enumerate() {
            let theirs = s.nodes.get(i).cloned().unwrap_or_else(|| NodeFacts {
                name: n.spec.name.clone(),
                ..NodeFacts::default()
            });
            if theirs.name != n.spec.name {
                return Err(RestoreError::NodeOrder {
                    index: i,
                    found: theirs.name,
                    want: n.spec.name.clone(),
                });
            }
            a.names.push(n.spec.name.clone());
            if n.removed {
                continue;
            }
            a.nodes.insert(
                n.spec.name.clone(),
                NodeRec {
                    id: NodeId(i as u32),
                    spec: n.spec.clone(),
                    gpu_uuids: theirs.gpu_uuids,
                    state: effective(&theirs.drains),
                    drains: theirs.drains,
                    held: theirs.held,
                    connected: false,
                    last_seen: at,
                    last_heard: at,
                    verdict: theirs.verdict,
                    seen: theirs.seen,
                    gpus: Vec::new(),
                    addr: theirs.addr,
                    fence_s: theirs.fence_s,
                },
            );
        }
        a.work = s.work.iter().map(|w| (w.id, w.clone())).collect();
        a.lease_hosts = s.lease_hosts.iter().cloned().collect();
        a.counters = s.counters.clone();
        a.auto_drains = s.auto_drains.iter().cloned().collect::<VecDeque<_>>();
        a.creds = s.creds.clone();
        a.index_ports();
        a.index_gates();
        Ok(a)
    }
}
