//! The contract's clock: what is due at each tick (the time-limit warning, the
//! ladder at the time limit or a revocation's `not_before`), the ladder's outcome,
//! and workload exits. Ladders block, so the host only describes them
//! ([`LadderJob`]) and the daemon runs them off the lock.

use super::{lease_dir, lease_env, Host, LadderJob, ADOPTED_POLL_MS};
use crate::contract::{self, Due};
use crate::lease::LeaseEnd;
use crate::lease::{LeaseRecord, LeaseState, StepRecord};
use crate::supervisor::Exit;
use allot_checkpoint_hooks::{Ladder, Outcome, Rung, Target, DEFAULT_MARKER};
use allot_units::MAX_CONTRACT;
use std::time::Duration;

/// How a ladder that began reads once the workload is gone: the rung that ended it
/// and whether it checkpointed. `rung` is the ladder's own (`None`: the agent stopped
/// while it ran, so only what the workload left tells); `marked`: the checkpoint
/// marker (or the hook's acknowledgement) was seen. A workload says its checkpoint
/// is done by the marker or by exiting; one that died of a signal after the hook
/// (the hook's own, as a torchrun that does not handle SIGUSR1 does) did not
/// checkpoint, whatever the rung.
fn ladder_result(l: &LeaseRecord, rung: Option<Rung>, marked: bool) -> (Rung, bool) {
    let hooked = !l.hook.is_empty();
    match (rung, l.signal) {
        _ if marked => (rung.unwrap_or(Rung::Checkpoint), true),
        (Some(Rung::Checkpoint) | None, Some(_)) if hooked => (died_by(l), false),
        (Some(Rung::Checkpoint), None) => (Rung::Checkpoint, true),
        // After a restart only a recorded exit says it exited after the hook.
        (None, None) if hooked && l.exit_code.is_some() => (Rung::Checkpoint, true),
        (Some(r), _) => (r, false),
        (None, _) => (died_by(l), false),
    }
}

/// The rung a workload's death names: SIGTERM and SIGKILL are the ladder's own; any
/// other end is the workload's.
fn died_by(l: &LeaseRecord) -> Rung {
    match l.signal {
        Some(s) if s == nix::sys::signal::Signal::SIGTERM as i32 => Rung::Term,
        Some(s) if s == nix::sys::signal::Signal::SIGKILL as i32 => Rung::Kill,
        _ => Rung::Exited,
    }
}

/// A rung's stored name (`checkpoint`, `term`, `kill`, `exited`).
fn rung_name(r: Rung) -> String {
    format!("{r:?}").to_lowercase()
}

/// The end a ladder causes: what it was started for.
fn ladder_end(l: &LeaseRecord) -> LeaseEnd {
    match LeaseEnd::from_name(&l.ladder_reason) {
        LeaseEnd::TimeLimit => LeaseEnd::TimeLimit,
        _ => LeaseEnd::Revoked,
    }
}

impl Host {
    /// A workload the agent started ended (its supervisor, the agent's child, was
    /// reaped and told how).
    pub fn on_exit(&mut self, id: &str, exit: &Exit, now_ms: i64) {
        self.owned.remove(id);
        let Some(l) = self.leases.get_mut(id) else {
            return;
        };
        l.record_exit(exit);
        // A ladder in progress ends the lease itself; otherwise the exit does.
        let ended = matches!(
            l.state,
            LeaseState::Running | LeaseState::Revoking | LeaseState::Starting
        );
        if ended {
            l.end_by_exit(now_ms, exit);
        }
        let l = l.clone();
        self.save(&l);
        if ended {
            self.note(
                "lease",
                id,
                "",
                &format!("workload ended: {}", l.end_detail),
            );
        }
    }

    /// Whether any of lease `l`'s work still runs: its process, or its supervisor
    /// (which outlives the process by the time it takes to drain its output).
    pub(super) fn still_running(&self, l: &LeaseRecord) -> bool {
        self.os.is_same(l.proc_id()) || self.supervisor_alive(l)
    }

    /// Whether lease `l`'s supervisor still runs.
    fn supervisor_alive(&self, l: &LeaseRecord) -> bool {
        l.supervisor_id().is_some_and(|s| self.os.is_same(s))
    }

    /// Ends lease `l`, whose process and supervisor are gone without the agent
    /// reaping them (it restarted meanwhile, or adopted the process): how it ended
    /// is in the supervisor's `exit.json` when it lived to write it. `away`: the
    /// agent was not running. Returns what to say in the event log.
    pub(super) fn end_unreaped(&self, l: &mut LeaseRecord, now_ms: i64, away: bool) -> String {
        let when = if away {
            " while the agent was away"
        } else {
            ""
        };
        if l.supervisor_pid <= 0 {
            // Adopted (or started before supervisors): nobody saw how it ended.
            let how = if away {
                LeaseEnd::Vanished
            } else {
                LeaseEnd::Exited
            };
            l.end(now_ms, how, "exited");
            return format!("pid {} exited{when}", l.pid);
        }
        match self.os.read_exit(&lease_dir(&self.settings, &l.id)) {
            Some(e) => {
                l.record_exit(&e);
                l.end_by_exit(now_ms, &e);
                format!("workload ended{when}: {}", l.end_detail)
            }
            None => {
                l.end_detail = format!(
                    "its supervisor (pid {}) ended without recording the end; see {}",
                    l.supervisor_pid,
                    crate::process::supervisor_log(&lease_dir(&self.settings, &l.id)).display()
                );
                l.end(now_ms, LeaseEnd::Vanished, "exited");
                format!("pid {} vanished{when}: {}", l.pid, l.end_detail)
            }
        }
    }

    /// Ends lease `l`, whose ladder was running when the agent stopped and whose work
    /// ended meanwhile: its end is the one the ladder was causing (revoked, cancelled
    /// or preempted as allotd asked, or the time limit), never a plain exit, and it
    /// checkpointed if the marker is there (what the ladder was doing was on disk
    /// before its first signal). Returns what to say in the event log.
    pub(super) fn end_cut_ladder(&self, l: &mut LeaseRecord, now_ms: i64) -> String {
        let dir = lease_dir(&self.settings, &l.id);
        if let Some(e) = self.os.read_exit(&dir) {
            l.record_exit(&e);
        }
        let marked = self
            .os
            .file_exists(&super::checkpoint_dir(&self.settings, l).join(DEFAULT_MARKER));
        let (rung, checkpointed) = ladder_result(l, None, marked);
        l.end(now_ms, ladder_end(l), &rung_name(rung));
        format!(
            "its ladder ({}) was running when the agent stopped; the workload ended meanwhile{}: {}",
            l.ladder_reason,
            if checkpointed {
                " after a checkpoint"
            } else {
                ", without a checkpoint"
            },
            if l.end_detail.is_empty() {
                "end not seen"
            } else {
                &l.end_detail
            }
        )
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
            let alive = self.os.is_same(l.proc_id());
            let running = alive || self.supervisor_alive(l);
            if !owned && !running && l.state != LeaseState::Checkpointing {
                let mut l = l.clone();
                let msg = self.end_unreaped(&mut l, now_ms, false);
                self.save(&l);
                self.note("lease", &id, "", &msg);
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
                        // Checked when the lease started; a row that no longer reads
                        // falls back to the host's signal rather than none.
                        let sig = allot_checkpoint_hooks::signal_named(&l.warn_signal)
                            .unwrap_or(self.settings.warning_signal);
                        if alive {
                            let _ = self.os.signal_warning(&l.cgroup, l.pgid(), sig);
                        }
                        let l = l.clone();
                        self.save(&l);
                        self.note(
                            "contract",
                            &id,
                            "",
                            &format!("time-limit warning ({}) sent", sig.as_str()),
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
        let supervisor = l.supervisor_id();
        // An exec hook acts for the workload: as its user, with its login environment.
        let (run_as, user_env) = self.hook_user(&l.user);
        Some(LadderJob {
            lease: id.to_string(),
            target: Target {
                lease: id.to_string(),
                pgid,
                cgroup: (!l.cgroup.is_empty()).then(|| l.cgroup.clone().into()),
                checkpoint_dir: super::checkpoint_dir(&settings, &l),
                env: user_env
                    .into_iter()
                    .chain(lease_env(&l, &settings))
                    .collect(),
                run_as,
            },
            ladder: Ladder {
                hook: l.hook.parse().ok(),
                // Capped again: a lease stored before the cap must not overflow a clock.
                grace: Duration::from_secs(l.grace_s.min(MAX_CONTRACT)),
                term_grace: Duration::from_secs(settings.term_grace_s),
                marker: DEFAULT_MARKER.into(),
                hook_hosts: settings.hook_hosts.clone(),
            },
            supervisor,
        })
    }

    /// A ladder finished.
    pub fn ladder_done(&mut self, id: &str, o: &Outcome, now_ms: i64) {
        let dir = lease_dir(&self.settings, id);
        let Some(l) = self.leases.get_mut(id) else {
            return;
        };
        // How the workload died decides whether it checkpointed; its supervisor may
        // have recorded it before the waiter reported it.
        if l.exit_code.is_none() && l.signal.is_none() {
            if let Some(e) = self.os.read_exit(&dir) {
                l.record_exit(&e);
            }
        }
        let (rung, checkpointed) = ladder_result(l, Some(o.ended_by), o.checkpointed);
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
            let how = ladder_end(l);
            l.end(now_ms, how, &rung_name(rung));
            if !checkpointed && !l.hook.is_empty() && l.signal.is_some() {
                l.end_detail
                    .push_str(" after the checkpoint hook: no checkpoint");
            }
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
                if checkpointed {
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
