//! What the local API, the uplink and the daemon loop share: the host state and
//! the handles each side needs to wake or reach the others.

use crate::host::{Effect, Host, HostCommand, HostError, Outcome};
use allot_proto::v1 as pb;
use std::sync::atomic::Ordering;
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
    /// allotd is to hear the host's health and drains: set by commands, sent by the
    /// daemon loop.
    pub health_due: std::sync::atomic::AtomicBool,
    /// Attaches to sessions' terminals open over the allocator stream.
    pub ttys: crate::tty_relay::Ttys,
    /// The health monitor (absent when it could not start): `allot gpus clear`.
    pub monitor: Option<Arc<Mutex<allot_health_sources::service::HealthMonitor>>>,
}

impl Shared {
    /// Locks the host (a panic elsewhere must not wedge the API).
    pub fn host(&self) -> std::sync::MutexGuard<'_, Host> {
        self.host.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Carries out `cmd` on the host, then hands what it leaves to the daemon: the
    /// process to the waiter threads, a wake-up and a health report to the loop.
    pub fn command(&self, cmd: HostCommand) -> Result<Outcome, HostError> {
        let (outcome, effects) = self.host().command(cmd, crate::host::now_ms())?;
        self.carry_out(effects);
        Ok(outcome)
    }

    /// Hands `effects` to the daemon's threads and loop.
    pub fn carry_out(&self, effects: Vec<Effect>) {
        for e in effects {
            match e {
                Effect::Reap(id, reaper) => {
                    let _ = self.spawned.send((id, reaper));
                }
                Effect::Wake => self.wake.notify_one(),
                Effect::ReportHealth => {
                    self.health_due.store(true, Ordering::Release);
                    self.wake.notify_one();
                }
            }
        }
    }
}
