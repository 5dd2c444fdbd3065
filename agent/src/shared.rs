//! What the local API, the uplink and the daemon loop share: the host state and
//! the handles each side needs to wake or reach the others.

use crate::host::Host;
use allot_proto::v1 as pb;
use std::sync::{Arc, Mutex};

/// What the API and the daemon loop share.
pub struct Shared {
    /// The host state.
    pub host: Mutex<Host>,
    /// Wakes the contract loop after a change.
    pub wake: tokio::sync::Notify,
    /// Processes the agent started, to be reaped by a waiter thread.
    pub spawned: tokio::sync::mpsc::UnboundedSender<(String, crate::os::Reaper)>,
    /// Members of this group may change things.
    pub admin_gid: Option<u32>,
    /// Per-workload CPU and memory; the host's CPUs and memory.
    pub sys: Mutex<sysinfo::System>,
    /// Per-lease CPU from the leases' cgroups, between listings.
    pub cpu: Mutex<crate::cgroup::CpuMeter>,
    /// This host's name, as reported.
    pub host_name: String,
    /// Logical CPUs and installed memory (bytes): read once, they do not change.
    pub host_size: (u32, u64),
    /// The allocator's stream while it is up.
    pub uplink: Mutex<Option<tokio::sync::mpsc::UnboundedSender<pb::AgentMessage>>>,
    /// The health monitor (absent when it could not start): `allot gpus clear`.
    pub monitor: Option<Arc<Mutex<allot_health_sources::service::HealthMonitor>>>,
}

impl Shared {
    /// Locks the host (a panic elsewhere must not wedge the API).
    pub fn host(&self) -> std::sync::MutexGuard<'_, Host> {
        self.host.lock().unwrap_or_else(|e| e.into_inner())
    }
}
