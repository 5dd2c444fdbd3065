//! The escalation ladder that ends a revoked lease: hook → wait for the checkpoint
//! (marker file seen through `notify`, the process exiting, or an HTTP
//! acknowledgement) up to a grace period → SIGTERM → grace → SIGKILL.

use crate::cgroup::Cgroup;
use crate::identity::{prepare, RunAs};
use crate::{host_allowed, signal_named, Hook};
use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use notify::{RecursiveMode, Watcher};
use serde::Serialize;
use std::path::PathBuf;
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// The marker a workload writes in its checkpoint dir when a checkpoint is complete.
pub const DEFAULT_MARKER: &str = "checkpoint.done";
/// How often exit is checked while waiting (the marker arrives as an event).
const TICK: Duration = Duration::from_millis(20);
/// After a confirmed checkpoint, how long the workload may take to exit on its own
/// before SIGTERM: most exit right after saving, and a signal mid-exit helps nobody.
const EXIT_AFTER_CHECKPOINT: Duration = Duration::from_secs(2);
/// How long to wait for the group to vanish after SIGKILL before giving up.
const KILL_WAIT: Duration = Duration::from_secs(5);

/// The workload being revoked.
#[derive(Debug, Clone)]
pub struct Target {
    /// Lease id, for the HTTP body and the exec environment.
    pub lease: String,
    /// Its process group (the agent starts each workload in its own session).
    pub pgid: i32,
    /// Its cgroup, when it has one: SIGTERM goes to every process in it and SIGKILL
    /// is `cgroup.kill`, so nothing that left the process group survives; it is
    /// alive while the cgroup is populated.
    pub cgroup: Option<PathBuf>,
    /// Where it writes checkpoints and the marker.
    pub checkpoint_dir: PathBuf,
    /// The lease's environment, for exec hooks (with the user's HOME, USER, LOGNAME
    /// and SHELL: the caller's to set, as for the workload).
    pub env: Vec<(String, String)>,
    /// Whom exec hooks run as: the workload's user, never more.
    pub run_as: RunAs,
}

/// The ladder's settings.
#[derive(Debug, Clone)]
pub struct Ladder {
    /// How to ask; `None` goes straight to SIGTERM.
    pub hook: Option<Hook>,
    /// How long the checkpoint may take.
    pub grace: Duration,
    /// How long SIGTERM may take before SIGKILL.
    pub term_grace: Duration,
    /// The marker file name.
    pub marker: String,
    /// Hosts an http hook may reach besides loopback (the agent's `hook_hosts`).
    pub hook_hosts: Vec<String>,
}

/// A rung of the ladder.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Rung {
    /// It had already exited.
    Exited,
    /// The checkpoint hook (and the workload exiting after it).
    Checkpoint,
    /// SIGTERM.
    Term,
    /// SIGKILL.
    Kill,
}

/// One rung taken and how long it took.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Step {
    /// The rung.
    pub rung: Rung,
    /// How long it took, in milliseconds.
    pub took_ms: u64,
    /// What happened (e.g. "marker seen", "HTTP 503", "grace expired").
    pub note: String,
}

/// How a revocation ended.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Outcome {
    /// The rung that ended it.
    pub ended_by: Rung,
    /// A checkpoint was confirmed before it ended.
    pub checkpointed: bool,
    /// Every rung taken, in order.
    pub steps: Vec<Step>,
}

/// What allot reads from `/proc/PID/stat`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcStat {
    /// State letter (`R`, `S`, `Z` …).
    pub state: char,
    /// Process group.
    pub pgrp: i32,
    /// Session.
    pub session: i32,
    /// Start time in clock ticks since boot: with the pid, it names one process.
    pub start_ticks: u64,
    /// CPU time used, user + system, in clock ticks.
    pub cpu_ticks: u64,
}

impl ProcStat {
    /// True once it has exited (a zombie only waits to be reaped).
    pub fn exited(&self) -> bool {
        matches!(self.state, 'Z' | 'X')
    }
}

/// Reads `/proc/PID/stat`; `None` if there is no such process.
pub fn proc_stat(pid: i32) -> Option<ProcStat> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // "pid (comm) state ppid pgrp session … starttime …": comm may hold anything,
    // even ')', so fields are counted from the last ')'.
    let f: Vec<&str> = stat[stat.rfind(')')? + 1..].split_whitespace().collect();
    Some(ProcStat {
        state: f.first()?.chars().next()?,
        pgrp: f.get(2)?.parse().ok()?,
        session: f.get(3)?.parse().ok()?,
        start_ticks: f.get(19)?.parse().ok()?,
        cpu_ticks: f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?,
    })
}

/// True while any process of the group is alive (zombies count as gone: they have
/// exited and only wait to be reaped).
pub fn group_alive(pgid: i32) -> bool {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return killpg(Pid::from_raw(pgid), None).is_ok();
    };
    dir.flatten().any(|e| {
        e.file_name()
            .to_str()
            .and_then(|n| n.parse::<i32>().ok())
            .and_then(proc_stat)
            .is_some_and(|s| s.pgrp == pgid && !s.exited())
    })
}

fn ms(d: Duration) -> u64 {
    d.as_millis().min(u128::from(u64::MAX)) as u64
}

/// Waits until the group exits, `done` reports true, or `limit` passes; returns
/// (exited, done).
fn wait(t: &Target, limit: Duration, mut done: impl FnMut(Duration) -> bool) -> (bool, bool) {
    let start = Instant::now();
    loop {
        if !alive(t) {
            return (true, false);
        }
        let left = limit.saturating_sub(start.elapsed());
        if done(left.min(TICK)) {
            return (!alive(t), true);
        }
        if start.elapsed() >= limit {
            return (false, false);
        }
    }
}

enum Fired {
    /// The hook itself confirmed the checkpoint.
    Acked(String),
    /// The hook asked; the marker or the exit will tell.
    Asked(String),
    /// The hook failed.
    Failed(String),
}

/// Why `url` may not be sent to (or followed to, in a redirect), read with the HTTP
/// client's own URL parser; `None` when it may.
fn unreachable_host(url: &reqwest::Url, allowed: &[String]) -> Option<String> {
    // Normalised by the parser: IPv4 in dotted decimal, IPv6 in brackets, names
    // lowercased.
    let host = url.host_str().unwrap_or_default();
    (!host_allowed(host, allowed)).then(|| {
        format!(
            "{url} reaches {host:?}, which is neither loopback nor in [agent] hook_hosts; add it there in agent.toml to allow it"
        )
    })
}

/// An error and its causes, `: `-separated (a refused redirect says why only in its
/// source).
fn with_causes(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        let c_s = c.to_string();
        if !s.contains(&c_s) {
            s = format!("{s}: {c_s}");
        }
        cause = c.source();
    }
    s
}

fn fire(hook: &Hook, t: &Target, l: &Ladder) -> Fired {
    let grace = l.grace;
    match hook {
        // Where SIGTERM goes: every process of the workload. A launcher that starts
        // its workers in sessions of their own (torchrun) would otherwise be the only
        // one asked, and die of it while no rank checkpoints.
        Hook::Signal(name) => match signal_named(name) {
            None => Fired::Failed(format!("unknown signal {name}")),
            Some(sig) => match &t.cgroup {
                Some(dir) => match Cgroup::at(dir).signal(sig) {
                    0 => Fired::Failed(format!("{name}: no process in {}", dir.display())),
                    n => Fired::Asked(format!("sent {name} to the {n} processes of its cgroup")),
                },
                None => match killpg(Pid::from_raw(t.pgid), sig) {
                    Ok(()) => Fired::Asked(format!("sent {name} to group {}", t.pgid)),
                    Err(e) => Fired::Failed(format!("{name}: {e}")),
                },
            },
        },
        Hook::Exec(argv) => {
            let mut cmd = std::process::Command::new(&argv[0]);
            cmd.args(&argv[1..])
                .envs(t.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
                .env("ALLOT_LEASE_ID", &t.lease)
                .env("ALLOT_CHECKPOINT_DIR", &t.checkpoint_dir)
                .stdin(std::process::Stdio::null());
            // The hook acts for the workload: it gets the workload's user, groups and
            // nothing more, whatever the agent runs as.
            if let Err(why) = prepare(&mut cmd, &t.run_as, false) {
                return Fired::Failed(format!("{} not run: {why}", argv[0]));
            }
            let mut child = match cmd.spawn() {
                Ok(c) => c,
                Err(e) => return Fired::Failed(format!("cannot run {}: {e}", argv[0])),
            };
            // The hook gets the grace like the checkpoint itself; a hung one is killed
            // so the ladder keeps its promised bound.
            // A grace too long for the clock waits "forever" rather than panicking.
            let end = Instant::now()
                .checked_add(grace)
                .unwrap_or_else(|| Instant::now() + Duration::from_secs(86_400 * 365));
            loop {
                match child.try_wait() {
                    Ok(Some(s)) if s.success() => {
                        return Fired::Acked(format!("{} exited 0", argv[0]))
                    }
                    Ok(Some(s)) => return Fired::Failed(format!("{} exited with {s}", argv[0])),
                    Ok(None) if Instant::now() >= end => {
                        let _ = child.kill();
                        let _ = child.wait();
                        return Fired::Failed(format!(
                            "{} still running after the grace; killed",
                            argv[0]
                        ));
                    }
                    Ok(None) => std::thread::sleep(TICK),
                    Err(e) => return Fired::Failed(format!("waiting for {}: {e}", argv[0])),
                }
            }
        }
        Hook::Http(url) => {
            // Checked when the lease started; again here, with the client's own
            // parser, for leases stored before a change of hook_hosts.
            let parsed = match reqwest::Url::parse(url) {
                Ok(u) => u,
                Err(e) => return Fired::Failed(format!("{url}: {e}")),
            };
            if let Some(why) = unreachable_host(&parsed, &l.hook_hosts) {
                return Fired::Failed(why);
            }
            let allowed = l.hook_hosts.clone();
            // A redirect must not lead the agent where the hook itself may not go.
            let redirects = reqwest::redirect::Policy::custom(move |a| {
                if a.previous().len() >= 10 {
                    a.error("more than 10 redirects")
                } else if let Some(why) = unreachable_host(a.url(), &allowed) {
                    a.error(why)
                } else {
                    a.follow()
                }
            });
            let body = serde_json::json!({
                "lease": t.lease,
                "checkpoint_dir": t.checkpoint_dir,
                "deadline_s": grace.as_secs(),
            });
            let client = reqwest::blocking::Client::builder()
                .timeout(grace)
                .redirect(redirects)
                .build();
            let send = |c: reqwest::blocking::Client| {
                c.post(url)
                    .header("content-type", "application/json")
                    .body(body.to_string())
                    .send()
            };
            match client.and_then(send) {
                Ok(r) if r.status().as_u16() == 202 => {
                    Fired::Asked("HTTP 202: checkpoint started".into())
                }
                Ok(r) if r.status().is_success() => {
                    Fired::Acked(format!("HTTP {}", r.status().as_u16()))
                }
                Ok(r) => Fired::Failed(format!("HTTP {}", r.status().as_u16())),
                Err(e) => Fired::Failed(format!("POST {url}: {}", with_causes(&e))),
            }
        }
    }
}

/// True while any process of the workload lives: its cgroup is populated, or
/// (without one) its process group has a live member.
fn alive(t: &Target) -> bool {
    match &t.cgroup {
        Some(dir) => Cgroup::at(dir).populated(),
        None => group_alive(t.pgid),
    }
}

/// SIGTERM to the whole workload: every process of its cgroup, or its group.
fn terminate(t: &Target) {
    match &t.cgroup {
        Some(dir) => {
            Cgroup::at(dir).signal(Signal::SIGTERM);
        }
        None => {
            let _ = killpg(Pid::from_raw(t.pgid), Signal::SIGTERM);
        }
    }
}

/// SIGKILL to the whole workload: `cgroup.kill`, or its group.
fn kill_all(t: &Target) {
    match &t.cgroup {
        Some(dir) => {
            Cgroup::at(dir).kill();
        }
        None => {
            let _ = killpg(Pid::from_raw(t.pgid), Signal::SIGKILL);
        }
    }
}

/// Runs the ladder on `t` and returns how it ended. Blocks for at most
/// `grace + term_grace + 5 s`.
pub fn run(t: &Target, l: &Ladder) -> Outcome {
    let mut steps = Vec::new();
    let mut checkpointed = false;
    if !alive(t) {
        return Outcome {
            ended_by: Rung::Exited,
            checkpointed,
            steps,
        };
    }
    if let Some(hook) = &l.hook {
        let start = Instant::now();
        let marker = t.checkpoint_dir.join(&l.marker);
        // A marker from an earlier checkpoint must not answer this one.
        let _ = std::fs::remove_file(&marker);
        let (tx, rx) = mpsc::channel();
        // Kept only if it watches: a watcher that could not (no inotify instance left,
        // no checkpoint dir) must not pass for one.
        let watcher = notify::recommended_watcher(move |e: notify::Result<notify::Event>| {
            if let Ok(e) = e {
                let _ = tx.send(e.paths);
            }
        })
        .ok()
        .and_then(|mut w| {
            w.watch(&t.checkpoint_dir, RecursiveMode::NonRecursive)
                .ok()
                .map(|()| w)
        });
        let seen = |dt: Duration| -> bool {
            match rx.recv_timeout(dt) {
                Ok(paths) => paths.iter().any(|p| p == &marker) && marker.exists(),
                Err(_) => {
                    // Without a watcher the channel is closed at once: pace the polling.
                    if watcher.is_none() {
                        std::thread::sleep(dt);
                    }
                    marker.exists()
                }
            }
        };
        let note;
        match fire(hook, t, l) {
            Fired::Acked(n) => {
                checkpointed = true;
                note = n;
            }
            Fired::Failed(n) => note = format!("hook failed: {n}"),
            Fired::Asked(n) => {
                // The marker was removed before the hook fired, so one present now
                // is this checkpoint's, even when the workload wrote it and exited
                // before its event was read.
                let (_, seen_marker) = wait(t, l.grace, seen);
                let done = seen_marker || marker.exists();
                checkpointed = done;
                note = if done {
                    format!("{n}; marker {} seen", marker.display())
                } else if !alive(t) {
                    format!("{n}; the workload exited")
                } else {
                    format!("{n}; grace of {}s expired", l.grace.as_secs())
                };
            }
        }
        let exited = if checkpointed {
            let left = l.grace.saturating_sub(start.elapsed());
            wait(t, left.min(EXIT_AFTER_CHECKPOINT), |dt| {
                std::thread::sleep(dt);
                false
            })
            .0
        } else {
            !alive(t)
        };
        steps.push(Step {
            rung: Rung::Checkpoint,
            took_ms: ms(start.elapsed()),
            note,
        });
        if exited {
            return Outcome {
                ended_by: Rung::Checkpoint,
                checkpointed,
                steps,
            };
        }
    }
    let start = Instant::now();
    terminate(t);
    let (exited, _) = wait(t, l.term_grace, |dt| {
        std::thread::sleep(dt);
        false
    });
    steps.push(Step {
        rung: Rung::Term,
        took_ms: ms(start.elapsed()),
        note: if exited {
            "exited on SIGTERM".into()
        } else {
            format!("still running after {}s", l.term_grace.as_secs())
        },
    });
    if exited {
        return Outcome {
            ended_by: Rung::Term,
            checkpointed,
            steps,
        };
    }
    let start = Instant::now();
    kill_all(t);
    let (exited, _) = wait(t, KILL_WAIT, |dt| {
        std::thread::sleep(dt);
        false
    });
    steps.push(Step {
        rung: Rung::Kill,
        took_ms: ms(start.elapsed()),
        note: if exited {
            "killed".into()
        } else {
            "still present after SIGKILL (uninterruptible sleep?)".into()
        },
    });
    Outcome {
        ended_by: Rung::Kill,
        checkpointed,
        steps,
    }
}
