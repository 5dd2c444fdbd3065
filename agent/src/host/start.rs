//! Starting a lease: the drain check, the request's checks, GPU choice (free and
//! healthy, lowest index first, or the allocator's choice), where an http hook may
//! go, the user it runs as (never below `min_uid`, root only when allowed, switched
//! to only by a root agent), and the lease on disk before the process starts, so
//! that a crash in between leaves a lease that reads as never started.

use super::{lease_dir, Caller, Host, HostError, StartSpec, CLUSTER, HEALTH};
use crate::lease::LeaseEnd;
use crate::lease::{LeaseRecord, LeaseState, LogStream};
use crate::os::Reaper;
use crate::process::Launch;
use allot_checkpoint_hooks::cgroup::Limits;
use allot_checkpoint_hooks::{host_allowed, Hook, Identity, RunAs};
use allot_health::verdict::{GpuSample, GpuState};
use allot_units::MAX_CONTRACT;
use std::collections::BTreeSet;
use std::path::Path;
use std::str::FromStr;

/// `PATH` when the submission gives none: the system's directories, as a login
/// shell's default has them.
pub const DEFAULT_PATH: &str = "/usr/local/bin:/usr/bin:/bin";

/// A workload's whole environment (nothing of the agent's own): the submitted
/// variables, then the user's login `HOME`, `USER`, `LOGNAME`, `SHELL` over them,
/// [`DEFAULT_PATH`] when no `PATH` was submitted, then allot's variables over
/// everything. Each name once, in that order of first appearance.
pub fn job_env(
    submitted: &[(String, String)],
    login: &[(String, String)],
    allot: &[(String, String)],
) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = Vec::new();
    let mut set = |k: &str, v: &str| match out.iter_mut().find(|(n, _)| n == k) {
        Some(slot) => slot.1 = v.to_string(),
        None => out.push((k.to_string(), v.to_string())),
    };
    for (k, v) in submitted.iter().chain(login) {
        set(k, v);
    }
    if !submitted.iter().any(|(k, _)| k == "PATH") {
        set("PATH", DEFAULT_PATH);
    }
    // allot's own, in name order (they come from a map on the wire).
    let mut ours: Vec<&(String, String)> = allot.iter().collect();
    ours.sort();
    for (k, v) in ours {
        set(k, v);
    }
    out
}

/// Whom a lease's work runs as, and that user's login environment.
pub(super) struct RunUser {
    /// The lease's user: a login name, or a uid without one.
    pub name: String,
    /// The identity switch, if any.
    pub run_as: RunAs,
    /// `HOME`, `USER`, `LOGNAME`, `SHELL` (empty for a uid without a passwd entry).
    pub env: Vec<(String, String)>,
}

impl Host {
    /// Whether user `name` (uid `uid`) may run work here: root only when allowed,
    /// nobody else below `min_uid`. The refusal names the user, the uid and the key.
    pub(super) fn may_run(&self, name: &str, uid: u32) -> Result<(), String> {
        if uid == 0 && !self.settings.allow_root {
            Err(format!(
                "{name:?} (uid 0) may not run work on this host; set [agent] allow_root = true in agent.toml to allow it"
            ))
        } else if uid != 0 && uid < self.settings.min_uid {
            Err(format!(
                "{name:?} (uid {uid}) may not run work on this host: uids below [agent] min_uid = {} are the system's; lower min_uid in agent.toml to allow it",
                self.settings.min_uid
            ))
        } else {
            Ok(())
        }
    }

    /// The user a start runs as: the one asked for (root may name anyone) or the
    /// caller, checked against the host's rules, switched to only when it is not the
    /// agent's own.
    fn resolve_user(&self, spec: &StartSpec, caller: Caller) -> Result<RunUser, HostError> {
        let me = self.os.euid();
        let user = if spec.user.is_empty() {
            self.os.user_by_uid(caller.uid)
        } else {
            let u = self
                .os
                .user_by_name(&spec.user)
                .ok_or_else(|| HostError::Invalid {
                    field: "user",
                    message: format!("no user {:?} on this host", spec.user),
                })?;
            if u.uid != caller.uid && caller.uid != 0 {
                return Err(HostError::Refused(format!(
                    "only root may start a lease as another user ({:?}); leave --user out to run as yourself",
                    spec.user
                )));
            }
            Some(u)
        };
        // A caller without a passwd entry runs as its uid and gid, in no other group.
        let (name, id, env) = match user {
            Some(u) => (u.name.clone(), u.identity(), u.env()),
            None => (
                caller.uid.to_string(),
                Identity {
                    uid: caller.uid,
                    gid: caller.gid,
                    groups: vec![caller.gid],
                },
                Vec::new(),
            ),
        };
        self.may_run(&name, id.uid)
            .map_err(|message| HostError::Invalid {
                field: "user",
                message,
            })?;
        // Switching identity needs root; running as the agent's own user needs nothing.
        let run_as = if id.uid == me {
            RunAs::Agent
        } else if me == 0 {
            RunAs::User(id)
        } else {
            return Err(HostError::Refused(format!(
                "the agent runs as uid {me} and cannot start work as uid {}; run the agent as root",
                id.uid
            )));
        };
        Ok(RunUser { name, run_as, env })
    }

    /// Whom a lease's exec hook runs as now: its user, looked up again (the agent
    /// may have restarted, the passwd entry changed) and held to the same rules.
    pub(super) fn hook_user(&self, user: &str) -> (RunAs, Vec<(String, String)>) {
        let me = self.os.euid();
        let found = self.os.user_by_name(user).or_else(|| {
            user.parse::<u32>()
                .ok()
                .and_then(|uid| self.os.user_by_uid(uid))
        });
        let Some(u) = found else {
            // A uid without a passwd entry: as itself only when it is the agent's.
            return match user.parse::<u32>() {
                Ok(uid) if uid == me && self.may_run(user, uid).is_ok() => {
                    (RunAs::Agent, Vec::new())
                }
                _ => (
                    RunAs::Nobody(format!("user {user:?} is not known on this host")),
                    Vec::new(),
                ),
            };
        };
        let run_as = match self.may_run(&u.name, u.uid) {
            Err(why) => RunAs::Nobody(why),
            Ok(()) if u.uid == me => RunAs::Agent,
            Ok(()) if me == 0 => RunAs::User(u.identity()),
            Ok(()) => RunAs::Nobody(format!(
                "the agent runs as uid {me} and cannot act as uid {}",
                u.uid
            )),
        };
        (run_as, u.env())
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

    /// Lease `l`'s fence: allotd's leases have one while `fence_after` is set; a
    /// local lease is the operator's, and allotd never restarts it elsewhere.
    fn fence_for(&self, l: &LeaseRecord) -> Option<crate::fence::Fence> {
        let s = &self.settings;
        (s.fence_after_s > 0 && crate::lease::from_allocator_id(&l.id)).then(|| {
            crate::fence::Fence {
                contact: s.state_dir.join(crate::fence::FILE),
                after_s: s.fence_after_s,
                hook: l.hook.clone(),
                grace_s: l.grace_s.min(MAX_CONTRACT),
                term_grace_s: s.term_grace_s,
                checkpoint_dir: super::checkpoint_dir(s, l),
                hook_hosts: s.hook_hosts.clone(),
            }
        })
    }

    /// How soon after its last word from allotd every lease of allotd's here is
    /// gone (`Register.fence_s`): the longest bound of those running and of one
    /// started now; 0 when any of them is not fenced.
    pub fn fence_s(&self) -> u64 {
        let s = &self.settings;
        if s.fence_after_s == 0 {
            return 0;
        }
        let mut most = crate::fence::bound_s(s.fence_after_s, s.default_grace_s, s.term_grace_s);
        for l in self
            .leases
            .values()
            .filter(|l| l.live() && crate::lease::from_allocator_id(&l.id))
        {
            if l.fence_s == 0 {
                return 0;
            }
            most = most.max(l.fence_s);
        }
        most
    }

    /// A write a start needed failed: the host drains itself (`disk-full`) and the
    /// start is refused, so the work waits again rather than failing.
    fn cannot_write(&mut self, what: &str, now_ms: i64) -> HostError {
        self.write_failed(what, now_ms);
        HostError::Refused(format!(
            "this host cannot write its state ({what}); it drains itself (disk-full) until a write succeeds again"
        ))
    }

    /// Starts (or adopts) a workload under a new lease. The lease is on disk before
    /// the process starts, and again with its pid right after.
    pub fn start(
        &mut self,
        spec: StartSpec,
        caller: Caller,
        now_ms: i64,
    ) -> Result<(LeaseRecord, Option<Reaper>), HostError> {
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
        // The core caps contracts at a year; so does the host, so that no duration
        // overflows a clock (a u64::MAX grace once crash-looped the agent).
        for (field, secs) in [
            ("min_runtime_s", spec.min_runtime_s),
            ("time_limit_s", spec.time_limit_s.unwrap_or(0)),
            ("grace_s", spec.grace_s),
            ("warn_before_s", spec.warn_before_s),
        ] {
            if secs > MAX_CONTRACT {
                return Err(HostError::Invalid {
                    field,
                    message: format!(
                        "{secs} s is longer than the longest contract (365d); give at most 365d"
                    ),
                });
            }
        }
        match (
            spec.argv.is_empty() && spec.script.is_empty(),
            spec.adopt_pid,
        ) {
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
            let parsed = Hook::from_str(&hook).map_err(|e| HostError::Invalid {
                field: "checkpoint",
                message: e.to_string(),
            })?;
            // A submission must not make the agent call into the network: an http
            // hook goes to this host's own services or those the operator named.
            if let Some(host) = parsed
                .http_host()
                .filter(|h| !host_allowed(h, &self.settings.hook_hosts))
            {
                return Err(HostError::Invalid {
                    field: "checkpoint",
                    message: format!(
                        "hook {hook:?} reaches {host:?}, which is neither loopback nor in [agent] hook_hosts; add it to hook_hosts in agent.toml to allow it"
                    ),
                });
            }
        }
        if !spec.warn_signal.is_empty() {
            format!("signal:{}", spec.warn_signal)
                .parse::<Hook>()
                .map_err(|e| HostError::Invalid {
                    field: "signal",
                    message: format!(
                        "{:?} is not a signal a program can catch ({}); use e.g. USR2@5m",
                        spec.warn_signal, e.why
                    ),
                })?;
            if spec.time_limit_s.is_none() {
                return Err(HostError::Invalid {
                    field: "signal",
                    message: "a warning before the time limit needs --time-limit".into(),
                });
            }
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
                let id = self.os.identity(pid).ok_or_else(|| HostError::Invalid {
                    field: "adopt_pid",
                    message: format!("no running process {pid}"),
                })?;
                let pgrp = self.os.process_group(pid);
                if pgrp != Some(pid) {
                    return Err(HostError::Invalid {
                        field: "adopt_pid",
                        message: format!(
                            "pid {pid} does not lead its process group (group {}), so signals to its group would reach others; adopt the group leader or start it with setsid",
                            pgrp.unwrap_or(0)
                        ),
                    });
                }
                // A revocation signals the lease's group: never the agent's own.
                if self.os.own_lineage().contains(&pid) {
                    return Err(HostError::Invalid {
                        field: "adopt_pid",
                        message: format!(
                            "pid {pid} is the agent or one of its ancestors; only workloads can be adopted"
                        ),
                    });
                }
                let owner = self.os.owner(pid);
                if caller.uid != 0 && owner != Some(caller.uid) {
                    return Err(HostError::Refused(format!(
                        "pid {pid} belongs to uid {}, not to you (uid {}); only root may adopt another user's process",
                        owner.map_or_else(|| "?".to_string(), |o| o.to_string()),
                        caller.uid
                    )));
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
        let who = self.resolve_user(&spec, caller)?;
        // A directory the host lacks is a fact about the work (it was submitted from
        // somewhere this host does not share): the start fails, the node is fine.
        let cwd = (!spec.cwd.is_empty()).then(|| std::path::PathBuf::from(&spec.cwd));
        if let Some(dir) = cwd.as_deref().filter(|_| adopt.is_none()) {
            self.os
                .work_dir(dir, &who.run_as)
                .map_err(|message| HostError::Invalid {
                    field: "cwd",
                    message: format!("{message} on this host (as {})", who.name),
                })?;
        }
        let id = if spec.lease_id.is_empty() {
            let n = self
                .store
                .next_lease_number()
                .map_err(|e| self.cannot_write(&e.to_string(), now_ms))?;
            format!("L-{n}")
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
            user: who.name.clone(),
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
            cwd: spec.cwd.clone(),
            run: spec.run,
            rank: spec.rank,
            output: spec.output.clone(),
            error: spec.error.clone(),
            warn_signal: spec.warn_signal.clone(),
            warn_before_s: spec.warn_before_s,
            allotd_start_s: spec.allotd_start_s,
            ..Default::default()
        };
        // An adopted process has no supervisor to fence it.
        let fence = adopt.is_none().then(|| self.fence_for(&l)).flatten();
        l.fence_s = fence.as_ref().map_or(0, crate::fence::Fence::bound_s);
        let dir = lease_dir(&self.settings, &id);
        // Where its output goes and its cgroup, recorded before it starts (an adopted
        // process writes wherever it already did, in whatever cgroup it is).
        let cgroup = self
            .settings
            .cgroups
            .lease_dir(&id)
            .filter(|_| adopt.is_none());
        if adopt.is_none() {
            let log = |pattern: &str, stream| {
                crate::logs::log_file(
                    &self.settings.log_dir,
                    &l.user,
                    pattern,
                    &l.workload_id,
                    l.run,
                    l.rank,
                    stream,
                    Path::new(if l.cwd.is_empty() { "/" } else { &l.cwd }),
                )
            };
            l.out_log = log(&l.output, LogStream::Stdout).display().to_string();
            l.err_log = log(&l.error, LogStream::Stderr).display().to_string();
            l.cgroup = cgroup
                .as_ref()
                .map(|c| c.display().to_string())
                .unwrap_or_default();
        }
        // A lease that cannot be written first cannot be kept: the host's fault, so
        // the work waits again elsewhere.
        self.store
            .put_lease(&l)
            .map_err(|e| self.cannot_write(&e.to_string(), now_ms))?;
        // Checkpoints are written by the workload and its hook, as its user.
        let owner = match &who.run_as {
            RunAs::User(i) => Some((i.uid, i.gid)),
            _ => None,
        };
        let (reaper, proc_id) = match adopt {
            Some(p) => {
                let _ = self
                    .os
                    .create_private_dir(&super::checkpoint_dir(&self.settings, &l), owner);
                (None, p)
            }
            None => {
                let launched = self.os.launch(&Launch {
                    lease: id.clone(),
                    argv: spec.argv.clone(),
                    script: spec.script.clone(),
                    gpus: l.gpus.clone(),
                    checkpoint_dir: super::checkpoint_dir(&self.settings, &l),
                    lease_dir: dir.clone(),
                    out_log: l.out_log.clone().into(),
                    err_log: l.err_log.clone().into(),
                    out_users_own: crate::logs::users_own(&l.output),
                    err_users_own: crate::logs::users_own(&l.error),
                    cap_bytes: self.settings.max_output_bytes,
                    cgroup,
                    limits: Limits {
                        cpu_millis: (spec.cpus > 0).then(|| u64::from(spec.cpus) * 1000),
                        memory_bytes: (spec.memory_gb > 0).then(|| u64::from(spec.memory_gb) << 30),
                    },
                    supervisor: self.settings.supervisor.clone(),
                    run_as: who.run_as.clone(),
                    env: job_env(&spec.job_env, &who.env, &spec.env),
                    cwd: cwd.clone(),
                    pty: spec.pty,
                    fence,
                });
                match launched {
                    Ok(started) => {
                        for n in &started.notes {
                            self.note("lease", &id, "", n);
                        }
                        l.supervisor_pid = started.supervisor.pid;
                        l.supervisor_ticks = started.supervisor.start_ticks;
                        (Some(started.reaper), started.id)
                    }
                    Err(e) => {
                        // A file system that is full or read-only is the host's fault,
                        // not the work's: refused, not failed.
                        let host_fault = e.out_of_room();
                        let how = if host_fault {
                            LeaseEnd::Refused
                        } else {
                            LeaseEnd::FailedToStart
                        };
                        l.end(now_ms, how, "");
                        l.end_detail = e.to_string();
                        self.save(&l);
                        self.note("lease", &id, "", &e.to_string());
                        self.leases.insert(id, l);
                        if host_fault {
                            return Err(self.cannot_write(&e.to_string(), now_ms));
                        }
                        return Err(e.into());
                    }
                }
            }
        };
        l.pid = proc_id.pid;
        l.start_ticks = proc_id.start_ticks;
        l.state = LeaseState::Running;
        if let Err(e) = self.store.put_lease(&l) {
            // It runs: the host keeps it (in memory, and on disk again once writes
            // succeed) and takes nothing new meanwhile.
            tracing::error!(lease = %id, error = %e, "cannot persist the started lease");
            self.write_failed(&e.to_string(), now_ms);
        }
        // A started lease is a change like any other: allotd hears that its GPUs are
        // taken (a local lease it did not place) or that its start went through.
        self.changed
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(l.clone());
        if reaper.is_some() {
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
        Ok((l, reaper))
    }
}
