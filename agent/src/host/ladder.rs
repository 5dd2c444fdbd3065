//! The contract's clock: what is due at each tick (the time-limit warning, the
//! ladder at the time limit or a revocation's `not_before`), the ladder's outcome,
//! and workload exits. Ladders block, so the host only describes them
//! ([`LadderJob`]) and the daemon runs them off the lock.

use super::{lease_dir, lease_env, Host, LadderJob, ADOPTED_POLL_MS};
use crate::contract::{self, Due};
use crate::lease::{LeaseRecord, LeaseState, StepRecord};
use crate::supervisor::Exit;
use allot_checkpoint_hooks::{Ladder, Outcome, Target, DEFAULT_MARKER};
use allot_fairshare::scheduler::MAX_CONTRACT;
use allot_proto::v1::LeaseEnd;
use std::time::Duration;

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
            l.end(now_ms, LeaseEnd::Exited, "exited");
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
                l.end(now_ms, LeaseEnd::Exited, "exited");
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
                            let _ = self.os.signal_group(l.pgid(), sig);
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
        // An exec hook acts for the workload: as its user, with its login environment.
        let (run_as, user_env) = self.hook_user(&l.user);
        Some(LadderJob {
            lease: id.to_string(),
            target: Target {
                lease: id.to_string(),
                pgid,
                cgroup: (!l.cgroup.is_empty()).then(|| l.cgroup.clone().into()),
                checkpoint_dir: lease_dir(&settings, id).join("checkpoint"),
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
            let how = match LeaseEnd::from_name(&l.ladder_reason) {
                LeaseEnd::TimeLimit => LeaseEnd::TimeLimit,
                _ => LeaseEnd::Revoked,
            };
            l.end(now_ms, how, &format!("{:?}", o.ended_by).to_lowercase());
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
