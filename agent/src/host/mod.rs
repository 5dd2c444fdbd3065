//! The agent's state and every change to it: the lease table, the GPUs and their
//! health, drains, and the event log. The daemon (`daemon.rs`) feeds it requests,
//! process exits, health verdicts and the time, and runs the ladders it hands back;
//! all waiting and all threads live there, all rules live here.
//!
//! The rules are split by concern, one file each, so that a change to one kind of
//! rule is read and reviewed in one place: `open` (restart and re-adoption),
//! `start` (new and adopted leases), `revoke` (revocations and their withdrawal),
//! `ladder` (contract timers, the checkpoint ladder, exits), `drain` (the three
//! drain authors), `health` (verdicts and GPUs). The operating system (processes,
//! signals, `/proc`, users, the clock) is reached only through [`Os`], so that the
//! unit tests (`tests/`) run every rule against a fake, without a process.

mod command;
mod drain;
mod health;
mod ladder;
mod open;
mod revoke;
mod start;
#[cfg(test)]
mod tests;
pub(crate) mod usage;

use crate::contract::Terms;
use crate::lease::LeaseRecord;
use crate::os::Os;
use crate::store::{Event, Store, StoreError};
use allot_checkpoint_hooks::{Ladder, Target};
use allot_common::drain::DrainAuthor;
use allot_health::verdict::{GpuSample, GpuState, Verdict};
use nix::sys::signal::Signal;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

pub use crate::os::now_ms;
pub use command::{Effect, HostCommand, Outcome};
pub use start::{job_env, DEFAULT_PATH};

/// Ended leases kept in memory for `allot leases` (all stay in the database).
const ENDED_SHOWN: usize = 50;
/// How often processes the agent did not start (adopted) are checked for exit.
pub const ADOPTED_POLL_MS: i64 = 1_000;
/// The settings key of the reasons of the health drain allotd's breaker held.
const HOLD_KEY: &str = "health-hold";

/// Why a request was refused; each names the field or state and the fix.
#[derive(Debug, thiserror::Error)]
pub enum HostError {
    /// A request field is wrong.
    #[error("{field}: {message}")]
    Invalid {
        /// The field.
        field: &'static str,
        /// What is wrong and the fix.
        message: String,
    },
    /// The host cannot take it now.
    #[error("{0}")]
    Refused(String),
    /// No such lease.
    #[error("no lease {0:?} on this host; `allot leases` lists them")]
    NoLease(String),
    /// The state could not be written; nothing was changed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The workload could not be started.
    #[error(transparent)]
    Launch(#[from] crate::supervisor::LaunchError),
}

/// A drain and who asked for it (stored as JSON in `agent.db`'s settings; a field
/// an older row lacks reads as its default).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Drain {
    /// Why.
    pub reason: String,
    /// Revoke at once rather than at the min-runtime lapse.
    pub now: bool,
    /// Author kind: `local-operator`, `cluster-operator` or `health` (rows written
    /// before 0.2 say `operator`, see [`Drain::migrate`]).
    pub by: String,
    /// Who: a user, `allotd`, or the health monitor.
    pub author: String,
    /// Since, Unix ms.
    pub at_ms: i64,
    /// A health drain that waits for allotd's circuit breaker (not in force).
    pub held: bool,
}

/// The three drain author kinds a host knows (`allot_common::drain`): an operator
/// on the host.
pub const LOCAL: &str = DrainAuthor::LocalOperator.as_str();
/// A cluster operator's drain, carried out for allotd.
pub const CLUSTER: &str = DrainAuthor::ClusterOperator.as_str();
/// The health verdict's drain.
pub const HEALTH: &str = DrainAuthor::Health.as_str();

/// Settings the host applies to every lease (reloadable).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    /// Checkpoint grace for leases that name none.
    pub default_grace_s: u64,
    /// SIGTERM → SIGKILL grace.
    pub term_grace_s: u64,
    /// Without word from allotd this long, allotd's leases stop ([`crate::fence`]);
    /// 0: never.
    pub fence_after_s: u64,
    /// The time-limit warning's lead, ms.
    pub warning_before_ms: i64,
    /// The time-limit warning's signal.
    pub warning_signal: Signal,
    /// Hook for leases that name none.
    pub default_hook: String,
    /// Where lease dirs (logs, checkpoints) live.
    pub state_dir: PathBuf,
    /// No work (workload or exec hook) runs as a uid below this, root aside.
    pub min_uid: u32,
    /// Work may run as root (uid 0).
    pub allow_root: bool,
    /// Hosts an http hook may reach besides loopback.
    pub hook_hosts: Vec<String>,
    /// Where workloads' output goes.
    pub log_dir: PathBuf,
    /// Shared storage for checkpoints (`<root>/<user>/<workload>`); `None`:
    /// host-local per lease.
    pub checkpoint_root: Option<PathBuf>,
    /// Bytes of output kept per run.
    pub max_output_bytes: u64,
    /// Where lease cgroups go, or why there are none.
    pub cgroups: crate::cgroup::Placement,
    /// The program that supervises each workload (`allot-agent`).
    pub supervisor: PathBuf,
    /// A lease whose GPUs stay under this utilisation (%) ...
    pub idle_below_pct: u32,
    /// ... for this long (ms) is idle: allotd hears it, and hears again when it is
    /// busy; 0: never.
    pub idle_after_ms: i64,
}

/// What a caller asks to start.
#[derive(Debug, Clone, Default)]
pub struct StartSpec {
    /// GPUs wanted.
    pub gpus: u32,
    /// Protected seconds.
    pub min_runtime_s: u64,
    /// Hard limit.
    pub time_limit_s: Option<u64>,
    /// Hook spec; empty: the default.
    pub hook: String,
    /// Grace; 0: the default.
    pub grace_s: u64,
    /// Command; empty when adopting. With a script: its arguments.
    pub argv: Vec<String>,
    /// A batch script from allotd (`allot submit job.sh`), run by its `#!` line.
    pub script: String,
    /// Adopt this pid instead.
    pub adopt_pid: Option<i32>,
    /// User name to run as; empty: the caller.
    pub user: String,
    /// Workload id; empty: the lease id.
    pub workload_id: String,
    /// allot's variables (`ALLOT_*`, the gang's, torchrun's): they win over
    /// everything but the agent's own (`CUDA_VISIBLE_DEVICES`, `ALLOT_LEASE_ID` …).
    pub env: Vec<(String, String)>,
    /// The submitter's environment: the base of the work's whole environment (the
    /// user's login variables and allot's win over it).
    pub job_env: Vec<(String, String)>,
    /// Where the work starts (absolute); empty: the agent's own directory.
    pub cwd: String,
    /// Which run of its workload (from 1; 0 for local leases).
    pub run: u32,
    /// This host's rank in the gang (from 0).
    pub rank: u32,
    /// Stdout file pattern; empty: the agent's default.
    pub output: String,
    /// Stderr file pattern; empty: the agent's default.
    pub error: String,
    /// The warning asked for before the time limit (a signal name); empty: none of
    /// its own.
    pub warn_signal: String,
    /// How long before the time limit, seconds.
    pub warn_before_s: u64,
    /// When allotd started it, Unix s (0: a local lease).
    pub allotd_start_s: i64,
    /// The allocator's lease id; empty: a local lease (`L-n`).
    pub lease_id: String,
    /// The allocator's choice of GPUs (UUIDs); empty: the agent picks.
    pub gpu_uuids: Vec<String>,
    /// CPUs the work may use (its cgroup's `cpu.max`); 0: no limit.
    pub cpus: u32,
    /// Memory the work may use, GiB (its cgroup's `memory.max`); 0: no limit.
    pub memory_gb: u32,
    /// A session (`allot run --pty`): it runs on a terminal its supervisor holds.
    pub pty: bool,
}

/// Who is calling, from the socket's peer credentials.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Caller {
    /// User id.
    pub uid: u32,
    /// Group id.
    pub gid: u32,
}

/// A ladder the daemon must run (it blocks, so not under the lock).
#[derive(Debug, Clone)]
pub struct LadderJob {
    /// The lease.
    pub lease: String,
    /// Whom to signal.
    pub target: Target,
    /// How.
    pub ladder: Ladder,
    /// The workload's supervisor: the daemon waits (briefly) for it to record the
    /// workload's exit before telling the host the ladder is done, so that the end
    /// reads how the workload died.
    pub supervisor: Option<crate::procid::ProcId>,
}

/// One GPU as the agent shows it.
#[derive(Debug, Clone, PartialEq)]
pub struct GpuView {
    /// The last sample (UUID, bus id, index, model).
    pub sample: GpuSample,
    /// Health state.
    pub state: GpuState,
    /// Health reasons, most severe first.
    pub reasons: Vec<allot_health::verdict::Reason>,
    /// The live lease holding it.
    pub lease: Option<String>,
}

/// The host.
pub struct Host {
    /// Every process, signal, user and clock read goes through here.
    os: Box<dyn Os>,
    store: Store,
    leases: BTreeMap<String, LeaseRecord>,
    /// Leases whose process the agent started in this run and reaps itself.
    owned: BTreeSet<String>,
    settings: Settings,
    inventory: Vec<GpuSample>,
    verdict: Option<Verdict>,
    /// The health monitor's own verdict and the host's conditions (a disk nearly
    /// full) that `verdict` merges.
    faults: health::HostFaults,
    /// The host operator's drain (`allot drain`), kept across restarts.
    local_drain: Option<Drain>,
    /// allotd's cluster-operator drain, kept across restarts.
    cluster_drain: Option<Drain>,
    /// What the health verdict asks; `held` while allotd's breaker decides.
    health_drain: Option<Drain>,
    /// While allotd is connected its circuit breaker decides host-wide health drains.
    defer_health: bool,
    /// The reasons of the health drain allotd's breaker held (kept across restarts):
    /// a decision of allotd's, which stands while allotd is away, until allotd says
    /// otherwise or the reasons change.
    allotd_hold: Option<String>,
    /// Bus ids whose leases a GPU-only verdict ended or revoked: no new leases there.
    held_gpus: BTreeSet<String>,
    /// Leases written since the allocator's stream last took them.
    changed: std::sync::Mutex<Vec<LeaseRecord>>,
    /// A lease write `save` could not make (what, and why), for the daemon to turn
    /// into the `disk-full` fault: `save` borrows the host shared.
    failed_write: std::sync::Mutex<Option<String>>,
    /// A write failed: the daemon checks the disk at once, not at its next interval.
    check_disk: bool,
    /// Per live lease, since when (ms) its GPUs have been under `idle_below_pct`
    /// (not kept across restarts: a restarted agent watches afresh).
    low_since: BTreeMap<String, i64>,
    /// Per live lease, when (ms) its utilisation was last written for allotd.
    use_said: BTreeMap<String, i64>,
}

fn lease_dir(s: &Settings, id: &str) -> PathBuf {
    s.state_dir.join("leases").join(id)
}

/// Where lease `l` checkpoints: under the shared root, one directory per workload
/// that every run sees, or a host-local one of its own.
fn checkpoint_dir(s: &Settings, l: &LeaseRecord) -> PathBuf {
    match &s.checkpoint_root {
        Some(root) => {
            let user = if l.user.is_empty() {
                "root"
            } else {
                l.user.as_str()
            };
            let work = if l.workload_id.is_empty() {
                l.id.as_str()
            } else {
                l.workload_id.as_str()
            };
            // Names from allotd and the socket are checked to the safe set; a
            // component that is not one plain name stays inside the root anyway.
            let part = |p: &str| p.replace(['/', '\0'], "_").replace("..", "__");
            root.join(part(user)).join(part(work))
        }
        None => lease_dir(s, &l.id).join("checkpoint"),
    }
}

fn lease_env(l: &LeaseRecord, s: &Settings) -> Vec<(String, String)> {
    let gpus = l.gpus.join(",");
    vec![
        ("ALLOT_LEASE_ID".into(), l.id.clone()),
        (
            "ALLOT_CHECKPOINT_DIR".into(),
            checkpoint_dir(s, l).display().to_string(),
        ),
        ("CUDA_VISIBLE_DEVICES".into(), gpus.clone()),
        ("NVIDIA_VISIBLE_DEVICES".into(), gpus),
    ]
}

impl Host {
    /// Records an event (and logs it with fields).
    fn note(&self, kind: &str, lease: &str, gpu: &str, message: &str) {
        tracing::info!(kind, lease, gpu, "{message}");
        let e = Event {
            at_ms: self.os.now_ms(),
            kind: kind.into(),
            lease: lease.into(),
            gpu: gpu.into(),
            message: message.into(),
        };
        if let Err(err) = self.store.event(&e) {
            tracing::error!(error = %err, "cannot record an event");
        }
    }

    /// A config reload's new settings.
    pub fn set_settings(&mut self, s: Settings) {
        self.settings = s;
    }

    /// The settings in force.
    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    /// The cgroups of the live leases (what a sweep at start must keep).
    pub fn live_cgroups(&self) -> BTreeSet<PathBuf> {
        self.leases
            .values()
            .filter(|l| l.live() && !l.cgroup.is_empty())
            .map(|l| PathBuf::from(&l.cgroup))
            .collect()
    }

    /// The contract terms now in force.
    pub fn terms(&self) -> Terms {
        Terms {
            warning_before_ms: self.settings.warning_before_ms,
        }
    }

    /// Records a config event.
    pub fn config_event(&self, message: &str) {
        self.note("config", "", "", message);
    }

    fn save(&self, l: &LeaseRecord) {
        // In-memory state stays the truth for this run; a failed write is loud, and
        // drains the host until writes succeed again.
        if let Err(e) = self.store.put_lease(l) {
            tracing::error!(lease = %l.id, error = %e, "cannot persist the lease");
            *self.failed_write.lock().unwrap_or_else(|e| e.into_inner()) = Some(e.to_string());
        }
        self.changed
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(l.clone());
    }

    /// The highest workload and lease ids of allotd's this host holds, ended or not.
    pub fn highest_allotd_ids(&self) -> Result<(u64, u64), HostError> {
        Ok(self.store.highest_allotd_ids()?)
    }

    /// Leases changed since the last call (for the allocator's stream).
    pub fn take_changes(&self) -> Vec<LeaseRecord> {
        std::mem::take(&mut *self.changed.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// Live leases, then recently ended ones.
    pub fn leases(&self) -> Vec<LeaseRecord> {
        let mut v: Vec<LeaseRecord> = self.leases.values().cloned().collect();
        v.sort_by(|a, b| b.live().cmp(&a.live()).then(a.start_ms.cmp(&b.start_ms)));
        v
    }

    /// One lease.
    pub fn lease(&self, id: &str) -> Option<&LeaseRecord> {
        self.leases.get(id)
    }

    /// Where lease `id`'s `stream` is on this host, for `allot logs`: from the
    /// table, or from the database for a lease ended long enough ago to have left
    /// memory. `None`: this host never held it.
    pub fn log_source(
        &self,
        id: &str,
        stream: crate::lease::LogStream,
    ) -> Result<Option<crate::lease::LogSource>, HostError> {
        let l = match self.leases.get(id) {
            Some(l) => l.clone(),
            None => match self.store.lease(id)? {
                Some(l) => l,
                None => return Ok(None),
            },
        };
        Ok(Some(crate::lease::LogSource {
            path: l.log_path(stream, &lease_dir(&self.settings, &l.id)),
            live: l.live(),
            adopted: l.adopted,
            user: l.user.clone(),
            users_own: crate::logs::users_own(match stream {
                crate::lease::LogStream::Stdout => &l.output,
                crate::lease::LogStream::Stderr => &l.error,
            }),
        }))
    }

    /// Where the terminal of live lease `id` is attached to (`allot attach`), and
    /// the user it runs as: only a lease this host holds and runs, found by its id.
    pub fn tty_socket(&self, id: &str) -> Result<(PathBuf, String), String> {
        match self.leases.get(id) {
            Some(l) if l.live() => Ok((
                crate::tty::socket_path(&lease_dir(&self.settings, id)),
                l.user.clone(),
            )),
            Some(_) => Err(format!("lease {id} has ended on this host")),
            None => Err(format!("this host holds no lease {id}")),
        }
    }

    /// Events since `since_ms`.
    pub fn events(&self, since_ms: i64) -> Result<Vec<Event>, HostError> {
        Ok(self.store.events_since(since_ms, 10_000)?)
    }

    /// Ids of the leases not yet ended (a copy: the callers change the table).
    fn live_ids(&self) -> Vec<String> {
        self.leases
            .values()
            .filter(|l| l.live())
            .map(|l| l.id.clone())
            .collect()
    }

    /// The live leases holding any GPU of `pcis` (bus ids).
    fn live_leases_on(&self, pcis: &BTreeSet<String>) -> Vec<String> {
        self.leases
            .values()
            .filter(|l| {
                l.live()
                    && l.gpus
                        .iter()
                        .any(|u| self.pci_of(u).is_some_and(|p| pcis.contains(p)))
            })
            .map(|l| l.id.clone())
            .collect()
    }

    fn pci_of(&self, uuid: &str) -> Option<&str> {
        self.inventory
            .iter()
            .find(|g| g.uuid == uuid)
            .map(|g| g.pci.as_str())
    }

    fn gpu_state(&self, pci: &str) -> GpuState {
        self.verdict
            .as_ref()
            .and_then(|v| v.gpus.iter().find(|g| g.pci == pci))
            .map_or(GpuState::Healthy, |g| g.state)
    }
}
