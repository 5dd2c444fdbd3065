//! The contract's clock and the checkpoint ladder: warnings, time limits, the job
//! handed to the daemon, its outcome, and exits.

use super::*;
use allot_checkpoint_hooks::{Hook, Outcome, Rung, Step, DEFAULT_MARKER};
use std::time::Duration;

fn outcome(ended_by: Rung, checkpointed: bool) -> Outcome {
    Outcome {
        ended_by,
        checkpointed,
        steps: vec![
            Step {
                rung: Rung::Checkpoint,
                took_ms: 1_500,
                note: "grace expired".into(),
            },
            Step {
                rung: ended_by,
                took_ms: 20,
                note: "exited".into(),
            },
        ],
    }
}

#[test]
fn the_ladder_job_names_the_group_the_hook_and_the_graces() {
    let mut t = T::new();
    let l = t.start(StartSpec {
        hook: "signal:USR1".into(),
        grace_s: 20,
        ..spec(2, 0)
    });
    let now = t.now();
    t.h.revoke(&l.id, true, "cancel", now).expect("revokes");
    let jobs = t.tick();
    let [job] = jobs.as_slice() else {
        panic!("one ladder, got {jobs:?}");
    };
    assert_eq!(
        (job.lease.as_str(), job.target.lease.as_str()),
        ("L-1", "L-1")
    );
    assert_eq!(job.target.pgid, l.pid);
    let dir = t.dir.0.join("leases").join("L-1");
    assert_eq!(job.target.checkpoint_dir, dir.join("checkpoint"));
    let env: BTreeMap<_, _> = job.target.env.iter().cloned().collect();
    assert_eq!(env["ALLOT_LEASE_ID"], "L-1");
    assert_eq!(env["CUDA_VISIBLE_DEVICES"], "GPU-0,GPU-1");
    assert_eq!(env["NVIDIA_VISIBLE_DEVICES"], "GPU-0,GPU-1");
    assert_eq!(
        env["ALLOT_CHECKPOINT_DIR"],
        dir.join("checkpoint").display().to_string()
    );
    assert_eq!(job.ladder.hook, Some(Hook::Signal("SIGUSR1".into())));
    assert_eq!(job.ladder.grace, Duration::from_secs(20));
    assert_eq!(job.ladder.term_grace, Duration::from_secs(10));
    assert_eq!(job.ladder.marker, DEFAULT_MARKER);
    assert!(t.tick().is_empty(), "one ladder per revocation");
    assert_eq!(t.h.next_wakeup(now), None, "nothing is due while it runs");
}

#[test]
fn a_process_already_gone_gets_a_ladder_that_signals_nobody() {
    let mut t = T::new();
    let l = t.start(spec(1, 0));
    // It exited, and its pid went to someone else, before the waiter told the host.
    t.os.exit(l.pid);
    t.os.reuse(l.pid);
    let now = t.now();
    t.h.revoke(&l.id, true, "cancel", now).expect("revokes");
    let jobs = t.tick();
    assert_eq!(jobs.len(), 1);
    assert_eq!(jobs[0].target.pgid, i32::MAX);
    assert!(t.os.signals().is_empty());
}

#[test]
fn ladder_done_ends_the_lease_with_its_rung_and_steps() {
    let mut t = T::new();
    let l = t.start(spec(1, 0));
    let now = t.now();
    t.h.revoke(&l.id, true, "cancel", now).expect("revokes");
    t.tick();
    let end = t.os.advance(1_520);
    t.h.ladder_done(&l.id, &outcome(Rung::Term, false), end);
    let l = t.lease(&l.id);
    assert_eq!(
        (
            l.state,
            l.end_reason.as_str(),
            l.ended_by.as_str(),
            l.ended_ms
        ),
        (LeaseState::Ended, "revoked", "term", end)
    );
    let steps: Vec<_> = l
        .steps
        .iter()
        .map(|s| (s.rung.as_str(), s.took_ms))
        .collect();
    assert_eq!(steps, [("checkpoint", 1_500), ("term", 20)]);
    assert_eq!(t.stored(&l.id).map(|s| s.steps.len()), Some(2));
    assert!(t
        .events()
        .iter()
        .any(|e| e == "ended by SIGTERM (terminated): checkpoint 1500ms → term 20ms"));
}

#[test]
fn the_time_limit_warns_the_group_once_then_runs_the_ladder() {
    let mut t = T::new();
    let t0 = t.now();
    let l = t.start(StartSpec {
        time_limit_s: Some(300),
        ..spec(1, 0)
    });
    assert_eq!(
        t.h.next_wakeup(t0),
        Some(t0 + 240_000),
        "the warning's lead"
    );
    t.os.set_now(t0 + 239_999);
    t.tick();
    assert!(t.os.signals().is_empty());
    t.os.set_now(t0 + 240_000);
    assert!(t.tick().is_empty());
    assert_eq!(t.os.signals(), [(l.pid, Signal::SIGUSR2)]);
    assert!(t.lease(&l.id).warned);
    t.tick();
    assert_eq!(t.os.signals().len(), 1, "warned once");
    assert_eq!(t.h.next_wakeup(t.now()), Some(t0 + 300_000));
    t.os.set_now(t0 + 300_000);
    let jobs = t.tick();
    assert_eq!(jobs.len(), 1);
    assert_eq!(t.lease(&l.id).ladder_reason, "time-limit");
    let end = t.os.advance(10);
    t.h.ladder_done(&l.id, &outcome(Rung::Kill, false), end);
    let l = t.lease(&l.id);
    assert_eq!(
        (l.end_reason.as_str(), l.ended_by.as_str()),
        ("time-limit", "kill")
    );
}

#[test]
fn without_a_warning_asked_for_nothing_is_sent_before_the_limit() {
    // The host's default is off; one lease asks for its own, another does not.
    let mut t = T::with(|s| s.warning_before_ms = 0);
    let t0 = t.now();
    let quiet = t.start(StartSpec {
        time_limit_s: Some(300),
        ..spec(1, 0)
    });
    let asked = t.start(StartSpec {
        time_limit_s: Some(300),
        warn_signal: "USR1".into(),
        warn_before_s: 30,
        ..spec(1, 0)
    });
    assert_eq!(t.h.next_wakeup(t0), Some(t0 + 270_000));
    t.os.set_now(t0 + 270_000);
    assert!(t.tick().is_empty());
    assert_eq!(t.os.signals(), [(asked.pid, Signal::SIGUSR1)]);
    assert!(t
        .events()
        .iter()
        .any(|e| e == "time-limit warning (SIGUSR1) sent"));
    // At the limit both climb the ladder; the quiet one heard nothing before it.
    t.os.set_now(t0 + 300_000);
    assert_eq!(t.tick().len(), 2);
    assert_eq!(t.os.signals().len(), 1);
    assert!(!t.lease(&quiet.id).warned);
    // A warning that is not a signal a program can catch is refused at the start.
    let bad = t.try_start(StartSpec {
        time_limit_s: Some(300),
        warn_signal: "KILL".into(),
        warn_before_s: 30,
        ..spec(1, 0)
    });
    assert_eq!(invalid(bad), "signal");
}

#[test]
fn a_warning_missed_while_the_agent_was_down_comes_before_the_limits_ladder() {
    // The agent was down through both the warning and the limit: the work still
    // hears the signal it asked for, then the ladder starts.
    let mut t = T::with(|s| s.warning_before_ms = 0);
    let t0 = t.now();
    let l = t.start(StartSpec {
        time_limit_s: Some(300),
        warn_signal: "USR2".into(),
        warn_before_s: 90,
        ..spec(1, 0)
    });
    t.os.set_now(t0 + 305_000);
    let jobs = t.tick();
    assert_eq!(t.os.signals(), [(l.pid, Signal::SIGUSR2)], "warned first");
    assert_eq!(jobs.len(), 1);
    let l = t.lease(&l.id);
    assert!(l.warned);
    assert_eq!(l.ladder_reason, "time-limit");
}

#[test]
fn the_time_limit_wins_over_a_revocation_due_at_the_same_tick() {
    let mut t = T::with(|s| s.warning_before_ms = 0);
    let t0 = t.now();
    let l = t.start(StartSpec {
        time_limit_s: Some(60),
        ..spec(1, 60)
    });
    t.h.revoke(&l.id, false, "make room", t0).expect("revokes");
    t.os.set_now(t0 + 60_000);
    assert_eq!(t.tick().len(), 1);
    assert_eq!(t.lease(&l.id).ladder_reason, "time-limit");
}

#[test]
fn no_warning_reaches_a_process_already_gone() {
    let mut t = T::new();
    let t0 = t.now();
    let l = t.start(StartSpec {
        time_limit_s: Some(300),
        ..spec(1, 0)
    });
    t.os.exit(l.pid);
    t.os.set_now(t0 + 240_000);
    t.tick();
    assert!(t.lease(&l.id).warned);
    assert!(t.os.signals().is_empty());
    assert_eq!(
        t.state(&l.id),
        LeaseState::Running,
        "its exit comes from the waiter"
    );
}

#[test]
fn an_exit_ends_a_running_lease_with_its_code() {
    let mut t = T::new();
    let l = t.start(spec(1, 60));
    let now = t.os.advance(5_000);
    t.h.on_exit(&l.id, &exited(Some(3)), now);
    let l = t.lease(&l.id);
    assert_eq!(
        (l.state, l.end_reason.as_str(), l.exit_code, l.ended_ms),
        (LeaseState::Ended, "exited", Some(3), now)
    );
    assert!(t
        .events()
        .iter()
        .any(|e| e == "workload ended: exit code 3"));
    t.h.on_exit("L-9", &exited(None), now);
}

#[test]
fn an_exit_while_revoking_ends_the_lease() {
    let mut t = T::new();
    let l = t.start(spec(1, 60));
    let now = t.now();
    t.h.revoke(&l.id, false, "make room", now).expect("revokes");
    t.h.on_exit(&l.id, &exited(None), now);
    let l = t.lease(&l.id);
    assert_eq!(
        (l.state, l.end_reason.as_str()),
        (LeaseState::Ended, "exited")
    );
    assert!(t
        .events()
        .iter()
        .any(|e| e == "workload ended: killed by SIGKILL"));
}

#[test]
fn dying_of_the_hooks_own_signal_is_no_checkpoint() {
    let mut t = T::new();
    let l = t.start(StartSpec {
        hook: "signal:USR1".into(),
        ..spec(1, 0)
    });
    let now = t.now();
    t.h.revoke(&l.id, true, "preempted", now).expect("revokes");
    t.tick();
    // It died of SIGUSR1 (a torchrun that does not handle it) and its supervisor
    // recorded that before the waiter said so.
    t.os.write_exit(
        &t.lease_dir(&l.id),
        Exit {
            signal: Some(Signal::SIGUSR1 as i32),
            ..Exit::default()
        },
    );
    t.h.ladder_done(&l.id, &outcome(Rung::Checkpoint, false), now);
    let r = t.lease(&l.id);
    assert_eq!(
        (r.end_reason.as_str(), r.ended_by.as_str()),
        ("revoked", "exited")
    );
    assert_eq!(
        r.end_detail,
        "killed by SIGUSR1 after the checkpoint hook: no checkpoint"
    );
    assert!(t
        .events()
        .iter()
        .any(|e| e.starts_with("ended by exited: ")));
}

#[test]
fn an_exit_during_the_ladder_leaves_the_end_to_the_ladder() {
    let mut t = T::new();
    let l = t.start(spec(1, 0));
    let now = t.now();
    t.h.revoke(&l.id, true, "cancel", now).expect("revokes");
    t.tick();
    t.h.on_exit(&l.id, &exited(Some(0)), now);
    let mid = t.lease(&l.id);
    assert_eq!(
        (mid.state, mid.exit_code),
        (LeaseState::Checkpointing, Some(0))
    );
    t.h.ladder_done(&l.id, &outcome(Rung::Checkpoint, true), now);
    let l = t.lease(&l.id);
    assert_eq!(
        (l.end_reason.as_str(), l.ended_by.as_str(), l.exit_code),
        ("revoked", "checkpoint", Some(0))
    );
}
