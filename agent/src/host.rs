//! The agent's state and every change to it: the lease table, the GPUs and their
//! health, drains, and the event log. The daemon (`daemon.rs`) feeds it requests,
//! process exits, health verdicts and the time, and runs the ladders it hands back;
//! all waiting and all threads live there, all rules live here.

use crate::contract::{self, Due, Terms};
use crate::lease::{LeaseRecord, LeaseState, StepRecord};
use crate::process::{identity, is_same, launch, Launch};
use crate::store::{Event, Store, StoreError};
use allot_checkpoint_hooks::{Hook, Ladder, Outcome, Target, DEFAULT_MARKER};
use allot_health::verdict::{GpuSample, GpuState, HostVerdict, Verdict};
use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::process::Child;
use std::str::FromStr;
use std::time::Duration;

/// Ended leases kept in memory for `allot leases` (all stay in the database).
const ENDED_SHOWN: usize = 50;
/// How often processes the agent did not start (adopted) are checked for exit.
pub const ADOPTED_POLL_MS: i64 = 1_000;

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
    Launch(#[from] crate::process::LaunchError),
}

/// A drain and who asked for it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Drain {
    /// Why.
    pub reason: String,
    /// Revoke at once rather than at the min-runtime lapse.
    pub now: bool,
    /// Author kind: `local-operator`, `cluster-operator` or `health` (rows written
    /// before 0.2 say `operator`, see [`Drain::migrate`]).
    pub by: String,
    /// Who: a user, `allotd`, or the health monitor.
    #[serde(default)]
    pub author: String,
    /// Since, Unix ms.
    pub at_ms: i64,
    /// A health drain that waits for allotd's circuit breaker (not in force).
    #[serde(default)]
    pub held: bool,
}

/// The three drain author kinds a host knows.
pub const LOCAL: &str = "local-operator";
/// A cluster operator's drain, carried out for allotd.
pub const CLUSTER: &str = "cluster-operator";
/// The health verdict's drain.
pub const HEALTH: &str = "health";

impl Drain {
    /// An operator drain as 0.1 stored it: allotd's drains were marked by their reason.
    fn migrate(mut self) -> Drain {
        if self.by == "operator" {
            match self.reason.strip_prefix("allocator: ") {
                Some(r) => {
                    self.reason = r.to_string();
                    self.by = CLUSTER.into();
                    self.author = "allotd".into();
                }
                None => self.by = LOCAL.into(),
            }
        }
        self
    }
}

/// Settings the host applies to every lease (reloadable).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    /// Checkpoint grace for leases that name none.
    pub default_grace_s: u64,
    /// SIGTERM → SIGKILL grace.
    pub term_grace_s: u64,
    /// The time-limit warning's lead, ms.
    pub warning_before_ms: i64,
    /// The time-limit warning's signal.
    pub warning_signal: Signal,
    /// Hook for leases that name none.
    pub default_hook: String,
    /// Where lease dirs (logs, checkpoints) live.
    pub state_dir: PathBuf,
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
    /// Command; empty when adopting.
    pub argv: Vec<String>,
    /// Adopt this pid instead.
    pub adopt_pid: Option<i32>,
    /// User name to run as; empty: the caller.
    pub user: String,
    /// Workload id; empty: the lease id.
    pub workload_id: String,
    /// Extra environment.
    pub env: Vec<(String, String)>,
    /// The allocator's lease id; empty: a local lease (`L-n`).
    pub lease_id: String,
    /// The allocator's choice of GPUs (UUIDs); empty: the agent picks.
    pub gpu_uuids: Vec<String>,
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
    store: Store,
    leases: BTreeMap<String, LeaseRecord>,
    /// Leases whose process the agent started in this run and reaps itself.
    owned: BTreeSet<String>,
    settings: Settings,
    inventory: Vec<GpuSample>,
    verdict: Option<Verdict>,
    /// The host operator's drain (`allot drain`), kept across restarts.
    local_drain: Option<Drain>,
    /// allotd's cluster-operator drain, kept across restarts.
    cluster_drain: Option<Drain>,
    /// What the health verdict asks; `held` while allotd's breaker decides.
    health_drain: Option<Drain>,
    /// While allotd is connected its circuit breaker decides host-wide health drains.
    defer_health: bool,
    /// Bus ids whose leases a GPU-only verdict ended or revoked: no new leases there.
    held_gpus: BTreeSet<String>,
    /// Leases written since the allocator's stream last took them.
    changed: std::sync::Mutex<Vec<LeaseRecord>>,
}

fn lease_dir(s: &Settings, id: &str) -> PathBuf {
    s.state_dir.join("leases").join(id)
}

fn lease_env(l: &LeaseRecord, s: &Settings) -> Vec<(String, String)> {
    let gpus = l.gpus.join(",");
    vec![
        ("ALLOT_LEASE_ID".into(), l.id.clone()),
        (
            "ALLOT_CHECKPOINT_DIR".into(),
            lease_dir(s, &l.id).join("checkpoint").display().to_string(),
        ),
        ("CUDA_VISIBLE_DEVICES".into(), gpus.clone()),
        ("NVIDIA_VISIBLE_DEVICES".into(), gpus),
    ]
}

impl Host {
    /// Loads the lease table and re-adopts what still runs: a lease whose pid now
    /// names another process (or none) ended while the agent was away.
    pub fn open(store: Store, settings: Settings, now_ms: i64) -> Result<Host, HostError> {
        let load = |key: &str| -> Result<Option<Drain>, StoreError> {
            Ok(store
                .get(key)?
                .and_then(|v| serde_json::from_str::<Drain>(&v).ok())
                .map(Drain::migrate))
        };
        let mut local_drain = load("drain")?;
        let mut cluster_drain = load("cluster-drain")?;
        if local_drain.as_ref().is_some_and(|d| d.by == CLUSTER) {
            // 0.1.0 kept allotd's drain under the host operator's key: move it, so that
            // allotd's undrain lifts it for good.
            cluster_drain = local_drain.take();
            let v = cluster_drain
                .as_ref()
                .map(|d| serde_json::to_string(d).unwrap_or_default());
            store.set("cluster-drain", v.as_deref())?;
            store.set("drain", None)?;
        }
        let mut h = Host {
            leases: BTreeMap::new(),
            owned: BTreeSet::new(),
            settings,
            inventory: Vec::new(),
            verdict: None,
            local_drain,
            cluster_drain,
            health_drain: None,
            defer_health: false,
            held_gpus: BTreeSet::new(),
            changed: std::sync::Mutex::new(Vec::new()),
            store,
        };
        if let Err(e) = h.store.prune_events(now_ms) {
            tracing::warn!(error = %e, "cannot prune old events");
        }
        for mut l in h.store.leases(ENDED_SHOWN)? {
            if l.live() {
                let id = l.proc_id();
                if l.pid <= 0 {
                    l.end(now_ms, "failed-to-start", "");
                    h.note(
                        "lease",
                        &l.id,
                        "",
                        "the agent stopped while starting it; never ran",
                    );
                } else if !is_same(id) {
                    l.end(now_ms, "vanished", "exited");
                    h.note(
                        "lease",
                        &l.id,
                        "",
                        &format!("pid {} exited while the agent was away", l.pid),
                    );
                } else {
                    if l.state == LeaseState::Checkpointing {
                        // The ladder was cut short with the old agent: run it again.
                        l.state = LeaseState::Revoking;
                        l.not_before_ms = Some(now_ms);
                    }
                    h.note(
                        "lease",
                        &l.id,
                        "",
                        &format!(
                            "re-adopted pid {} ({}), timers resume",
                            l.pid,
                            l.state.as_str()
                        ),
                    );
                }
                h.store.put_lease(&l)?;
            }
            h.leases.insert(l.id.clone(), l);
        }
        Ok(h)
    }

    /// Records an event (and logs it with fields).
    fn note(&self, kind: &str, lease: &str, gpu: &str, message: &str) {
        tracing::info!(kind, lease, gpu, "{message}");
        let e = Event {
            at_ms: now_ms(),
            kind: kind.into(),
            lease: lease.into(),
            gpu: gpu.into(),
            message: message.into(),
        };
        if let Err(err) = self.store.event(&e) {
            tracing::error!(error = %err, "cannot record an event");
        }
    }

    /// An operator cleared a GPU's sticky health conditions (after a reset or repair).
    pub fn gpu_cleared(&self, pci: &str, index: u32, who: &str, reason: &str) {
        self.note(
            "health",
            "",
            pci,
            &format!("GPU {index} cleared by {who}: {reason}"),
        );
    }

    /// A config reload's new settings.
    pub fn set_settings(&mut self, s: Settings) {
        self.settings = s;
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
        // In-memory state stays the truth for this run; a failed write is loud.
        if let Err(e) = self.store.put_lease(l) {
            tracing::error!(lease = %l.id, error = %e, "cannot persist the lease");
        }
        self.changed
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(l.clone());
    }

    /// Leases changed since the last call (for the allocator's stream).
    pub fn take_changes(&self) -> Vec<LeaseRecord> {
        std::mem::take(&mut *self.changed.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// Revokes for the allocator: at once when its `not_before` has come (a
    /// drain-now, a cancel, a lapse already past), else at the contract's lapse as
    /// this host measures it from the workload's real start.
    pub fn revoke_until(
        &mut self,
        id: &str,
        not_before_ms: i64,
        why: &str,
        now_ms: i64,
    ) -> Result<LeaseRecord, HostError> {
        self.revoke(id, not_before_ms <= now_ms, why, now_ms)
    }

    /// The drain in force that people see first: health's (a fault), then the
    /// host operator's, then the cluster operator's.
    pub fn drain_state(&self) -> Option<&Drain> {
        self.drains().into_iter().find(|d| !d.held)
    }

    /// Every drain of the host, in force or held.
    pub fn drains(&self) -> Vec<&Drain> {
        [&self.health_drain, &self.local_drain, &self.cluster_drain]
            .into_iter()
            .flatten()
            .collect()
    }

    /// While allotd is connected, host-wide health drains wait for its circuit
    /// breaker (a fleet-wide false alarm must not empty the fleet); alone, the host
    /// drains itself.
    pub fn set_defer_health(&mut self, defer: bool, now_ms: i64) {
        self.defer_health = defer;
        if defer {
            return;
        }
        // Alone again: a drain allotd's breaker was holding takes effect here.
        self.enforce_health_drain(
            None,
            "allotd is away: the held health drain takes effect",
            now_ms,
        );
    }

    /// The health drain held for allotd's breaker comes into force (`now` overrides
    /// how it revokes): no new leases, every lease revoked. False if none was held.
    fn enforce_health_drain(&mut self, now: Option<bool>, why: &str, now_ms: i64) -> bool {
        let Some(d) = self.health_drain.as_mut().filter(|d| d.held) else {
            return false;
        };
        d.held = false;
        d.now = now.unwrap_or(d.now);
        let (now, summary) = (d.now, d.reason.clone());
        self.note("drain", "", "", &format!("{why}: {summary}"));
        self.revoke_all(now, &format!("health: {summary}"), HEALTH, now_ms);
        true
    }

    fn save_drain(&self, key: &str, d: Option<&Drain>) -> Result<(), HostError> {
        let v = d.map(|d| serde_json::to_string(d).unwrap_or_default());
        Ok(self.store.set(key, v.as_deref())?)
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

    /// Every GPU with its health and lease.
    pub fn gpus(&self) -> Vec<GpuView> {
        let holder: BTreeMap<&str, &str> = self
            .leases
            .values()
            .filter(|l| l.live())
            .flat_map(|l| l.gpus.iter().map(move |g| (g.as_str(), l.id.as_str())))
            .collect();
        self.inventory
            .iter()
            .map(|s| {
                let v = self
                    .verdict
                    .as_ref()
                    .and_then(|v| v.gpus.iter().find(|g| g.pci == s.pci));
                GpuView {
                    sample: s.clone(),
                    state: v.map_or(GpuState::Healthy, |g| g.state),
                    reasons: v.map(|g| g.reasons.clone()).unwrap_or_default(),
                    lease: holder.get(s.uuid.as_str()).map(|l| l.to_string()),
                }
            })
            .collect()
    }

    /// The host verdict (health only).
    pub fn host_verdict(&self) -> HostVerdict {
        self.verdict.as_ref().map_or(HostVerdict::Ok, |v| v.host)
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

    /// Events since `since_ms`.
    pub fn events(&self, since_ms: i64) -> Result<Vec<Event>, HostError> {
        Ok(self.store.events_since(since_ms, 10_000)?)
    }

    fn resolve_user(
        &self,
        spec: &StartSpec,
        caller: Caller,
    ) -> Result<(String, Option<u32>, Option<u32>), HostError> {
        let me = nix::unistd::geteuid().as_raw();
        let user = if spec.user.is_empty() {
            nix::unistd::User::from_uid(caller.uid.into())
                .ok()
                .flatten()
        } else {
            let u = nix::unistd::User::from_name(&spec.user)
                .ok()
                .flatten()
                .ok_or_else(|| HostError::Invalid {
                    field: "user",
                    message: format!("no user {:?} on this host", spec.user),
                })?;
            if u.uid.as_raw() != caller.uid && caller.uid != 0 {
                return Err(HostError::Refused(format!(
                    "only root may start a lease as another user ({:?}); leave --user out to run as yourself",
                    spec.user
                )));
            }
            Some(u)
        };
        let (name, uid, gid) = match user {
            Some(u) => (u.name, u.uid.as_raw(), u.gid.as_raw()),
            None => (caller.uid.to_string(), caller.uid, caller.gid),
        };
        // Switching identity needs root; running as the agent's own user needs nothing.
        if uid == me {
            Ok((name, None, None))
        } else if me == 0 {
            Ok((name, Some(uid), Some(gid)))
        } else {
            Err(HostError::Refused(format!(
                "the agent runs as uid {me} and cannot start work as uid {uid}; run the agent as root"
            )))
        }
    }

    fn free_gpus(&self) -> Vec<&GpuSample> {
        let used: BTreeSet<&str> = self
            .leases
            .values()
            .filter(|l| l.live())
            .flat_map(|l| l.gpus.iter().map(String::as_str))
            .collect();
        self.inventory
            .iter()
            .filter(|g| !used.contains(g.uuid.as_str()))
            .filter(|g| {
                self.gpu_state(&g.pci) != GpuState::Failed && !self.held_gpus.contains(&g.pci)
            })
            .collect()
    }

    /// Starts (or adopts) a workload under a new lease. The lease is on disk before
    /// the process starts, and again with its pid right after.
    pub fn start(
        &mut self,
        spec: StartSpec,
        caller: Caller,
        now_ms: i64,
    ) -> Result<(LeaseRecord, Option<Child>), HostError> {
        if let Some(d) = self.drain_state() {
            return Err(HostError::Refused(format!(
                "host is drained by {} ({}); no new leases until {}",
                d.by,
                d.reason,
                match d.by.as_str() {
                    HEALTH => "the fault is cleared (`allot gpus clear INDEX --reason TEXT` after a reset or repair)",
                    CLUSTER => "`allot nodes undrain` on the cluster",
                    _ => "`allot undrain` on this host",
                }
            )));
        }
        if spec.gpus == 0 {
            return Err(HostError::Invalid {
                field: "gpus",
                message: "must be at least 1".into(),
            });
        }
        match (spec.argv.is_empty(), spec.adopt_pid) {
            (true, None) => {
                return Err(HostError::Invalid {
                    field: "argv",
                    message: "give a command after `--`, or --adopt PID".into(),
                })
            }
            (false, Some(_)) => {
                return Err(HostError::Invalid {
                    field: "adopt_pid",
                    message: "give either a command or --adopt PID, not both".into(),
                })
            }
            _ => {}
        }
        // allotd's work carries its own hook (or none); the host's default is for
        // local leases only.
        let hook = if spec.hook.is_empty() && spec.lease_id.is_empty() {
            self.settings.default_hook.clone()
        } else {
            spec.hook.clone()
        };
        if !hook.is_empty() {
            Hook::from_str(&hook).map_err(|e| HostError::Invalid {
                field: "checkpoint",
                message: e.to_string(),
            })?;
        }
        let free = self.free_gpus();
        let gpus: Vec<String> = if spec.gpu_uuids.is_empty() {
            if free.len() < spec.gpus as usize {
                return Err(HostError::Refused(format!(
                    "{} GPUs asked, {} free and healthy of {} (`allot gpus` shows which are leased or unhealthy)",
                    spec.gpus,
                    free.len(),
                    self.inventory.len()
                )));
            }
            free[..spec.gpus as usize]
                .iter()
                .map(|g| g.uuid.clone())
                .collect()
        } else {
            if let Some(u) = spec
                .gpu_uuids
                .iter()
                .find(|u| !free.iter().any(|g| g.uuid == **u))
            {
                return Err(HostError::Refused(format!(
                    "GPU {u} is not free and healthy here (`allot gpus` shows it)"
                )));
            }
            spec.gpu_uuids.clone()
        };
        if !spec.lease_id.is_empty() && self.leases.contains_key(&spec.lease_id) {
            return Err(HostError::Refused(format!(
                "lease {} exists already",
                spec.lease_id
            )));
        }
        let adopt = match spec.adopt_pid {
            Some(pid) => {
                let id = identity(pid).ok_or_else(|| HostError::Invalid {
                    field: "adopt_pid",
                    message: format!("no running process {pid}"),
                })?;
                let pgrp = crate::process::group_and_session(pid).map(|g| g.0);
                if pgrp != Some(pid) {
                    return Err(HostError::Invalid {
                        field: "adopt_pid",
                        message: format!(
                            "pid {pid} does not lead its process group (group {}), so signals to its group would reach others; adopt the group leader or start it with setsid",
                            pgrp.unwrap_or(0)
                        ),
                    });
                }
                if self.leases.values().any(|l| l.live() && l.pid == pid) {
                    return Err(HostError::Refused(format!(
                        "pid {pid} already belongs to a lease"
                    )));
                }
                Some(id)
            }
            None => None,
        };
        let (user, uid, gid) = self.resolve_user(&spec, caller)?;
        let id = if spec.lease_id.is_empty() {
            format!("L-{}", self.store.next_lease_number()?)
        } else {
            spec.lease_id.clone()
        };
        let mut l = LeaseRecord {
            id: id.clone(),
            workload_id: if spec.workload_id.is_empty() {
                id.clone()
            } else {
                spec.workload_id.clone()
            },
            gpus,
            user,
            argv: spec.argv.clone(),
            adopted: adopt.is_some(),
            start_ms: now_ms,
            min_runtime_s: spec.min_runtime_s,
            time_limit_s: spec.time_limit_s,
            hook,
            grace_s: if spec.grace_s == 0 {
                self.settings.default_grace_s
            } else {
                spec.grace_s
            },
            ..Default::default()
        };
        self.store.put_lease(&l)?;
        let dir = lease_dir(&self.settings, &id);
        let (child, proc_id) = match adopt {
            Some(p) => {
                let _ = std::fs::create_dir_all(dir.join("checkpoint"));
                (None, p)
            }
            None => {
                let launched = launch(&Launch {
                    lease: id.clone(),
                    argv: spec.argv.clone(),
                    gpus: l.gpus.clone(),
                    checkpoint_dir: dir.join("checkpoint"),
                    log_dir: dir.clone(),
                    uid,
                    gid,
                    env: spec.env.clone(),
                });
                match launched {
                    Ok((c, p)) => (Some(c), p),
                    Err(e) => {
                        l.end(now_ms, "failed-to-start", "");
                        self.save(&l);
                        self.note("lease", &id, "", &e.to_string());
                        self.leases.insert(id, l);
                        return Err(e.into());
                    }
                }
            }
        };
        l.pid = proc_id.pid;
        l.start_ticks = proc_id.start_ticks;
        l.state = LeaseState::Running;
        self.store.put_lease(&l)?;
        // A started lease is a change like any other: allotd hears that its GPUs are
        // taken (a local lease it did not place) or that its start went through.
        self.changed
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(l.clone());
        if child.is_some() {
            self.owned.insert(id.clone());
        }
        self.note(
            "lease",
            &id,
            &l.gpus.join(","),
            &format!(
                "{} pid {} as {} on {} GPU(s), min runtime {}s{}",
                if l.adopted { "adopted" } else { "started" },
                l.pid,
                l.user,
                l.gpus.len(),
                l.min_runtime_s,
                l.time_limit_s
                    .map_or(String::new(), |t| format!(", time limit {t}s"))
            ),
        );
        self.leases.insert(id, l.clone());
        Ok((l, child))
    }

    fn revoke_inner(
        &mut self,
        id: &str,
        now: bool,
        why: &str,
        cause: &str,
        now_ms: i64,
    ) -> Option<LeaseRecord> {
        let l = self.leases.get_mut(id)?;
        if !matches!(l.state, LeaseState::Running | LeaseState::Revoking) {
            return Some(l.clone());
        }
        let nb = contract::not_before(l, now_ms, now);
        if l.state == LeaseState::Revoking && l.not_before_ms == Some(nb) {
            return Some(l.clone());
        }
        // A lease revoked for another reason (a preemption, a cancel) stays revoked
        // when a drain ends, so a drain never claims it.
        l.revoke_cause = if l.state == LeaseState::Revoking && l.revoke_cause.is_empty() {
            String::new()
        } else {
            cause.to_string()
        };
        l.state = LeaseState::Revoking;
        l.not_before_ms = Some(nb);
        l.revoke_why = why.to_string();
        let l = l.clone();
        self.save(&l);
        let wait = (nb - now_ms).max(0) / 1000;
        self.note(
            "contract",
            id,
            "",
            &format!(
                "revoked ({why}); the ladder starts {}",
                if wait == 0 {
                    "now".to_string()
                } else {
                    format!("in {wait}s, at the min-runtime lapse")
                }
            ),
        );
        Some(l)
    }

    /// Revokes a lease: its ladder starts at the min-runtime lapse (at once with `now`).
    pub fn revoke(
        &mut self,
        id: &str,
        now: bool,
        why: &str,
        now_ms: i64,
    ) -> Result<LeaseRecord, HostError> {
        self.revoke_inner(id, now, why, "", now_ms)
            .ok_or_else(|| HostError::NoLease(id.to_string()))
    }

    /// Ids of the leases not yet ended (a copy: the callers change the table).
    fn live_ids(&self) -> Vec<String> {
        self.leases
            .values()
            .filter(|l| l.live())
            .map(|l| l.id.clone())
            .collect()
    }

    fn revoke_all(&mut self, now: bool, why: &str, cause: &str, now_ms: i64) {
        let ids = self.live_ids();
        for id in ids {
            self.revoke_inner(&id, now, why, cause, now_ms);
        }
    }

    /// Takes back a revocation whose ladder has not begun: the lease runs on under
    /// its contract. Returns whether it did.
    pub fn withdraw(&mut self, id: &str, why: &str) -> bool {
        let Some(l) = self.leases.get_mut(id) else {
            return false;
        };
        if l.state != LeaseState::Revoking {
            return false;
        }
        l.state = LeaseState::Running;
        l.not_before_ms = None;
        l.revoke_why.clear();
        l.revoke_cause.clear();
        let l = l.clone();
        self.save(&l);
        self.note("contract", id, "", &format!("revocation withdrawn: {why}"));
        true
    }

    /// A drain of `kind` ended: once no drain holds the host, every revocation a
    /// drain queued is withdrawn (whichever drain it was attributed to).
    fn drain_ended(&mut self, kind: &str) {
        if self.drain_state().is_some() {
            return;
        }
        let ids: Vec<String> = self
            .leases
            .values()
            .filter(|l| l.state == LeaseState::Revoking && !l.revoke_cause.is_empty())
            .map(|l| l.id.clone())
            .collect();
        for id in ids {
            self.withdraw(&id, &format!("the {kind} drain ended"));
        }
    }

    /// The host operator drains the host: no new leases; every lease is revoked at
    /// its lapse (at once with `now`).
    pub fn drain(
        &mut self,
        reason: &str,
        now: bool,
        author: &str,
        now_ms: i64,
    ) -> Result<Drain, HostError> {
        if reason.trim().is_empty() {
            return Err(HostError::Invalid {
                field: "reason",
                message: "say why (it is kept and shown), e.g. --reason \"rack maintenance\""
                    .into(),
            });
        }
        let d = Drain {
            reason: reason.to_string(),
            now,
            by: LOCAL.into(),
            author: author.to_string(),
            at_ms: now_ms,
            held: false,
        };
        self.save_drain("drain", Some(&d))?;
        self.local_drain = Some(d.clone());
        self.note(
            "drain",
            "",
            "",
            &format!(
                "drained by the host operator {author}{}: {reason}",
                if now { " (now)" } else { "" }
            ),
        );
        self.revoke_all(now, &format!("drain: {reason}"), LOCAL, now_ms);
        Ok(d)
    }

    /// Ends the host operator's drain (a health drain stays while the verdict says
    /// so, a cluster drain until allotd lifts it); revocations the drain queued
    /// whose ladder has not begun are withdrawn when nothing else drains the host.
    pub fn undrain(&mut self) -> Result<Option<Drain>, HostError> {
        self.save_drain("drain", None)?;
        if self.local_drain.take().is_some() {
            self.note("drain", "", "", "undrained by the host operator");
            self.drain_ended(LOCAL);
        }
        Ok(self.drain_state().cloned())
    }

    /// allotd drains or lifts: a cluster operator's drain, or a health drain its
    /// circuit breaker let through.
    pub fn allocator_drain(
        &mut self,
        kind: &str,
        drain: bool,
        now: bool,
        reason: &str,
        now_ms: i64,
    ) -> Result<(), HostError> {
        match (kind, drain) {
            (HEALTH, true) => {
                self.enforce_health_drain(
                    Some(now),
                    "allotd's circuit breaker let the health drain through",
                    now_ms,
                );
            }
            // allotd's breaker holds the drain: the host keeps serving its healthy
            // GPUs, and what the drain revoked runs on. (The host lifts its health
            // drain itself, when its verdict is ok again.)
            (HEALTH, false) => {
                if !self.defer_health {
                    return Ok(());
                }
                let Some(d) = self.health_drain.as_mut().filter(|d| !d.held) else {
                    return Ok(());
                };
                d.held = true;
                self.note(
                    "drain",
                    "",
                    "",
                    &format!("health drain held by allotd: {reason}"),
                );
                self.drain_ended(HEALTH);
            }
            (_, true) => {
                let d = Drain {
                    reason: reason.to_string(),
                    now,
                    by: CLUSTER.into(),
                    author: "allotd".into(),
                    at_ms: now_ms,
                    held: false,
                };
                if self.cluster_drain.as_ref().map(|c| (&c.reason, c.now))
                    == Some((&d.reason, d.now))
                {
                    return Ok(());
                }
                self.save_drain("cluster-drain", Some(&d))?;
                self.cluster_drain = Some(d);
                self.note(
                    "drain",
                    "",
                    "",
                    &format!(
                        "drained by a cluster operator through allotd{}: {reason}",
                        if now { " (now)" } else { "" }
                    ),
                );
                self.revoke_all(now, &format!("drain: {reason}"), CLUSTER, now_ms);
            }
            (_, false) => {
                self.save_drain("cluster-drain", None)?;
                if self.cluster_drain.take().is_some() {
                    self.note(
                        "drain",
                        "",
                        "",
                        "undrained by a cluster operator through allotd",
                    );
                    self.drain_ended(CLUSTER);
                }
            }
        }
        Ok(())
    }

    /// A new health verdict (and the GPUs as last sampled).
    pub fn on_verdict(&mut self, v: Verdict, inventory: Vec<GpuSample>, now_ms: i64) {
        if !inventory.is_empty() {
            self.inventory = inventory;
        }
        let changed = self.verdict.as_ref() != Some(&v);
        self.verdict = Some(v.clone());
        if !changed {
            return;
        }
        for g in &v.gpus {
            if let Some(r) = g.reasons.first() {
                self.note(
                    "health",
                    "",
                    &g.pci,
                    &format!("{:?}: {}: {}", g.state, r.signal, r.detail).to_lowercase(),
                );
            }
        }
        // A lease on a GPU that failed cannot finish: end it and kill the workload now.
        let failed: BTreeSet<String> = v
            .gpus
            .iter()
            .filter(|g| g.state == GpuState::Failed)
            .map(|g| g.pci.clone())
            .collect();
        let doomed: Vec<String> = self
            .leases
            .values()
            .filter(|l| {
                l.live()
                    && l.gpus
                        .iter()
                        .any(|u| self.pci_of(u).is_some_and(|p| failed.contains(p)))
            })
            .map(|l| l.id.clone())
            .collect();
        for id in doomed {
            self.kill_lost(&id, now_ms);
        }
        let known: BTreeSet<&str> = self.inventory.iter().map(|g| g.pci.as_str()).collect();
        let summary = v
            .gpus
            .iter()
            .filter(|g| g.reasons.iter().any(|r| r.action.is_some()))
            .map(|g| {
                format!(
                    "{} {}",
                    g.pci,
                    g.reasons.first().map_or("", |r| r.signal.as_str())
                )
            })
            .collect::<Vec<_>>()
            .join(", ");
        if v.host == HostVerdict::Ok {
            self.held_gpus.clear();
            if self.health_drain.take().is_some() {
                self.note(
                    "drain",
                    "",
                    "",
                    "health verdict ok again: health drain lifted",
                );
                self.drain_ended(HEALTH);
            }
            return;
        }
        if !v.only_gpus.is_empty() {
            // Only those GPUs' leases end; the rest of the host keeps working.
            let now = v.host == HostVerdict::DrainNow;
            self.held_gpus = v.only_gpus.iter().cloned().collect();
            let ids: Vec<String> = self
                .leases
                .values()
                .filter(|l| {
                    l.live()
                        && l.gpus
                            .iter()
                            .any(|u| self.pci_of(u).is_some_and(|p| self.held_gpus.contains(p)))
                })
                .map(|l| l.id.clone())
                .collect();
            for id in ids {
                self.revoke_inner(&id, now, &format!("health: {summary}"), "", now_ms);
            }
            return;
        }
        // A drain-now whose cause is a GPU already handled above (its lease killed)
        // leaves the others their protection; one from elsewhere (an NVSwitch) does not.
        let now = v.host == HostVerdict::DrainNow
            && v.gpus.iter().any(|g| {
                g.reasons
                    .iter()
                    .any(|r| r.action == Some(allot_health::xid::Action::DrainNow))
                    && !known.contains(g.pci.as_str())
            });
        let d = Drain {
            reason: summary.clone(),
            now,
            by: HEALTH.into(),
            author: "health monitor".into(),
            at_ms: now_ms,
            // A drain allotd let through stays through when its reasons change.
            held: self.defer_health && self.health_drain.as_ref().is_none_or(|h| h.held),
        };
        if self.health_drain.as_ref().map(|h| (&h.reason, h.now)) != Some((&d.reason, d.now)) {
            let verdict = match v.host {
                HostVerdict::DrainNow => "drain-now",
                _ => "drain",
            };
            let deferred = d.held;
            // Recorded held, then put in force unless allotd's breaker is to decide.
            self.health_drain = Some(Drain { held: true, ..d });
            if deferred {
                self.note(
                    "drain",
                    "",
                    "",
                    &format!("health verdict {verdict}: {summary}; allotd's circuit breaker decides (the host keeps serving its healthy GPUs meanwhile)"),
                );
            } else {
                self.enforce_health_drain(
                    None,
                    &format!("drained by the health verdict ({verdict})"),
                    now_ms,
                );
            }
        }
    }

    fn kill_lost(&mut self, id: &str, now_ms: i64) {
        let Some(l) = self.leases.get_mut(id) else {
            return;
        };
        if is_same(l.proc_id()) {
            let _ = killpg(Pid::from_raw(l.pgid()), Signal::SIGKILL);
        }
        l.end(now_ms, "gpu-lost", "kill");
        let l = l.clone();
        self.save(&l);
        self.note(
            "lease",
            id,
            &l.gpus.join(","),
            "ended as failed: its GPU is gone; workload killed",
        );
    }

    /// A process the agent reaps exited.
    pub fn on_exit(&mut self, id: &str, code: Option<i32>, now_ms: i64) {
        self.owned.remove(id);
        let Some(l) = self.leases.get_mut(id) else {
            return;
        };
        l.exit_code = code;
        // A ladder in progress ends the lease itself; otherwise the exit does.
        let ended = matches!(
            l.state,
            LeaseState::Running | LeaseState::Revoking | LeaseState::Starting
        );
        if ended {
            l.end(now_ms, "exited", "exited");
        }
        let l = l.clone();
        self.save(&l);
        if ended {
            self.note(
                "lease",
                id,
                "",
                &format!(
                    "workload exited ({})",
                    code.map_or("signalled".into(), |c| format!("code {c}"))
                ),
            );
        }
    }

    /// The earliest instant the host needs the daemon's attention.
    pub fn next_wakeup(&self, now_ms: i64) -> Option<i64> {
        let timers = contract::next_wakeup(self.leases.values(), self.terms());
        let poll = self
            .leases
            .values()
            .any(|l| {
                l.live() && !self.owned.contains(&l.id) && l.state != LeaseState::Checkpointing
            })
            .then_some(now_ms + ADOPTED_POLL_MS);
        timers.into_iter().chain(poll).min()
    }

    /// Does what is due at `now_ms`; returns the ladders to run.
    pub fn tick(&mut self, now_ms: i64) -> Vec<LadderJob> {
        let terms = self.terms();
        let mut jobs = Vec::new();
        let ids = self.live_ids();
        for id in ids {
            let owned = self.owned.contains(&id);
            let Some(l) = self.leases.get(&id) else {
                continue;
            };
            let due = contract::due(l, terms, now_ms);
            // A process the agent reaps itself reports its exit; its identity is only
            // needed when something is due for it.
            if owned && due.is_empty() {
                continue;
            }
            let alive = is_same(l.proc_id());
            if !owned && !alive && l.state != LeaseState::Checkpointing {
                let mut l = l.clone();
                l.end(now_ms, "exited", "exited");
                self.save(&l);
                self.note("lease", &id, "", &format!("pid {} exited", l.pid));
                self.leases.insert(id, l);
                continue;
            }
            for d in due {
                match d {
                    Due::Warn => {
                        let Some(l) = self.leases.get_mut(&id) else {
                            continue;
                        };
                        l.warned = true;
                        if alive {
                            let _ = killpg(Pid::from_raw(l.pgid()), self.settings.warning_signal);
                        }
                        let l = l.clone();
                        self.save(&l);
                        self.note(
                            "contract",
                            &id,
                            "",
                            &format!(
                                "time-limit warning ({}) sent",
                                self.settings.warning_signal.as_str()
                            ),
                        );
                    }
                    Due::TimeLimit | Due::Revoke => {
                        let reason = if d == Due::TimeLimit {
                            "time-limit"
                        } else {
                            "revoked"
                        };
                        if let Some(j) = self.begin_ladder(&id, reason, alive) {
                            jobs.push(j);
                        }
                    }
                }
            }
        }
        jobs
    }

    fn begin_ladder(&mut self, id: &str, reason: &str, alive: bool) -> Option<LadderJob> {
        let settings = self.settings.clone();
        let l = self.leases.get_mut(id)?;
        l.state = LeaseState::Checkpointing;
        l.ladder_reason = reason.into();
        let l = l.clone();
        self.save(&l);
        self.note(
            "contract",
            id,
            "",
            &format!(
                "{reason}: checkpoint ladder starts (hook {}, grace {}s)",
                if l.hook.is_empty() { "none" } else { &l.hook },
                l.grace_s
            ),
        );
        // A recycled pid must never be signalled: a gone process gets an empty ladder.
        let pgid = if alive { l.pgid() } else { i32::MAX };
        Some(LadderJob {
            lease: id.to_string(),
            target: Target {
                lease: id.to_string(),
                pgid,
                checkpoint_dir: lease_dir(&settings, id).join("checkpoint"),
                env: lease_env(&l, &settings),
            },
            ladder: Ladder {
                hook: l.hook.parse().ok(),
                grace: Duration::from_secs(l.grace_s),
                term_grace: Duration::from_secs(settings.term_grace_s),
                marker: DEFAULT_MARKER.into(),
            },
        })
    }

    /// A ladder finished.
    pub fn ladder_done(&mut self, id: &str, o: &Outcome, now_ms: i64) {
        let Some(l) = self.leases.get_mut(id) else {
            return;
        };
        l.steps = o
            .steps
            .iter()
            .map(|s| StepRecord {
                rung: format!("{:?}", s.rung).to_lowercase(),
                took_ms: s.took_ms,
                note: s.note.clone(),
            })
            .collect();
        if l.live() {
            let reason = if l.ladder_reason.is_empty() {
                "revoked".to_string()
            } else {
                l.ladder_reason.clone()
            };
            l.end(now_ms, &reason, &format!("{:?}", o.ended_by).to_lowercase());
        }
        let l = l.clone();
        self.save(&l);
        let rung = match l.ended_by.as_str() {
            "term" => "SIGTERM (terminated)",
            "kill" => "SIGKILL (killed after the grace)",
            other => other,
        };
        self.note(
            "contract",
            id,
            "",
            &format!(
                "ended by {rung}{}: {}",
                if o.checkpointed {
                    " after a checkpoint"
                } else {
                    ""
                },
                l.steps
                    .iter()
                    .map(|s| format!("{} {}ms", s.rung, s.took_ms))
                    .collect::<Vec<_>>()
                    .join(" → ")
            ),
        );
    }
}

/// Wall-clock Unix milliseconds (the daemon's one clock).
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}
