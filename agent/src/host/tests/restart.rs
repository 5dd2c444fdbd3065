//! Restart: `Host::open` on a store with leases whose processes are alive, gone, or
//! whose pid now names another process.

use super::*;
use crate::os::fake::Call;
use allot_checkpoint_hooks::DEFAULT_MARKER;

#[test]
fn a_live_lease_is_readopted_and_its_timers_resume() {
    let mut t = T::new();
    let t0 = t.now();
    let l = t.start(StartSpec {
        time_limit_s: Some(600),
        ..spec(1, 60)
    });
    t.os.advance(5_000);
    let mut t = t.restart();
    let r = t.lease(&l.id);
    assert_eq!((r.state, r.proc_id()), (LeaseState::Running, l.proc_id()));
    assert!(t
        .events()
        .iter()
        .any(|e| *e == format!("re-adopted pid {} (running), timers resume", l.pid)));
    // No longer the agent's child: its exit is seen by polling.
    let now = t.now();
    assert_eq!(t.h.next_wakeup(now), Some(now + ADOPTED_POLL_MS));
    // The time limit still counts from the real start.
    t.os.set_now(t0 + 600_000);
    assert_eq!(t.tick().len(), 1);
    assert_eq!(t.lease(&l.id).ladder_reason, "time-limit");
    assert_eq!(t.os.launches().len(), 1, "nothing started again");
}

#[test]
fn a_readopted_lease_that_exits_is_seen_by_polling() {
    let mut t = T::new();
    let l = t.start(spec(1, 60));
    let mut t = t.restart();
    t.os.write_exit(&t.lease_dir(&l.id), exited(Some(0)));
    t.os.exit(l.pid);
    t.os.advance(ADOPTED_POLL_MS);
    t.tick();
    let r = t.lease(&l.id);
    assert_eq!(
        (r.end_reason.as_str(), r.exit_code, r.end_detail.as_str()),
        ("exited", Some(0), "exit code 0")
    );
}

#[test]
fn a_lease_whose_process_died_while_away_ends_as_vanished() {
    let mut t = T::new();
    let l = t.start(spec(1, 60));
    t.os.exit(l.pid);
    let now = t.os.advance(60_000);
    let t = t.restart();
    let r = t.lease(&l.id);
    assert_eq!(
        (
            r.state,
            r.end_reason.as_str(),
            r.ended_by.as_str(),
            r.ended_ms
        ),
        (LeaseState::Ended, "vanished", "exited", now)
    );
    assert_eq!(t.stored(&l.id).map(|l| l.state), Some(LeaseState::Ended));
    let ev = t.events();
    assert!(
        ev.iter().any(|e| e.starts_with(&format!(
            "pid {} vanished while the agent was away: its supervisor (pid {}) ended without recording the end",
            l.pid, l.supervisor_pid
        ))),
        "{ev:?}"
    );
}

#[test]
fn a_workload_that_ended_while_away_ends_as_its_supervisor_recorded() {
    let mut t = T::new();
    let l = t.start(spec(1, 60));
    assert!(l.supervisor_pid > 0, "started under a supervisor: {l:?}");
    // The supervisor outlives the agent; while it drains the output the lease lives.
    t.os.exit_before_supervisor(l.pid);
    let mut t = t.restart();
    assert!(t.lease(&l.id).live(), "its supervisor still runs");
    t.os.write_exit(
        &t.lease_dir(&l.id),
        Exit {
            code: Some(3),
            output_cut: true,
            output_bytes: 1 << 20,
            ..Exit::default()
        },
    );
    t.os.exit(l.supervisor_pid);
    t.tick();
    let r = t.lease(&l.id);
    assert_eq!(
        (r.end_reason.as_str(), r.exit_code, r.output_cut),
        ("exited", Some(3), true)
    );
    assert_eq!(
        r.end_detail,
        "exit code 3; output cut at 1048576 bytes ([agent] max_output_bytes)"
    );
}

#[test]
fn a_pid_given_to_another_process_ends_as_vanished_and_is_never_signalled() {
    let mut t = T::new();
    let l = t.start(spec(1, 0));
    let now = t.now();
    t.h.revoke(&l.id, true, "cancel", now).expect("revokes");
    t.os.exit(l.pid);
    let stranger = t.os.reuse(l.pid);
    assert_ne!(stranger, l.proc_id());
    let mut t = t.restart();
    assert_eq!(t.lease(&l.id).end_reason, "vanished");
    assert!(t.tick().is_empty(), "no ladder for the stranger");
    assert!(t.os.signals().is_empty());
    assert_eq!(t.start(spec(4, 0)).gpus.len(), 4, "its GPU is free");
}

#[test]
fn a_lease_the_agent_stopped_while_starting_never_ran() {
    let dir = Dir::new();
    let store = Store::open(&dir.0).expect("store");
    store
        .put_lease(&LeaseRecord {
            id: "L-1".into(),
            gpus: vec![uuid(0)],
            ..Default::default()
        })
        .expect("put");
    drop(store);
    let s = settings(&dir.0);
    let t = T::open(FakeOs::new(), dir, s);
    let l = t.lease("L-1");
    assert_eq!(
        (l.state, l.end_reason.as_str()),
        (LeaseState::Ended, "failed-to-start")
    );
    assert!(
        !t.os.calls().iter().any(|c| matches!(c, Call::Identity(0))),
        "pid 0 is nobody's"
    );
}

#[test]
fn a_ladder_cut_short_runs_again() {
    let mut t = T::new();
    let l = t.start(spec(1, 0));
    let now = t.now();
    t.h.revoke(&l.id, true, "cancel", now).expect("revokes");
    assert_eq!(t.tick().len(), 1);
    let later = t.os.advance(30_000);
    let mut t = t.restart();
    let r = t.lease(&l.id);
    assert_eq!(
        (r.state, r.not_before_ms),
        (LeaseState::Revoking, Some(later))
    );
    let jobs = t.tick();
    assert_eq!(jobs.len(), 1);
    assert_eq!(jobs[0].target.pgid, l.pid);
}

#[test]
fn a_revocation_waiting_for_its_lapse_survives_a_restart() {
    let mut t = T::new();
    let t0 = t.now();
    let l = t.start(spec(1, 60));
    t.h.revoke(&l.id, false, "make room", t0).expect("revokes");
    let mut t = t.restart();
    let r = t.lease(&l.id);
    assert_eq!(
        (r.state, r.not_before_ms),
        (LeaseState::Revoking, Some(t0 + 60_000))
    );
    t.os.set_now(t0 + 60_000);
    assert_eq!(t.tick().len(), 1);
}

#[test]
fn ended_leases_stay_ended_and_their_pids_are_not_checked() {
    let mut t = T::new();
    let l = t.start(spec(1, 0));
    let now = t.now();
    t.h.on_exit(&l.id, &exited(Some(0)), now);
    t.os.clear_calls();
    let t = t.restart();
    assert_eq!(t.lease(&l.id).end_reason, "exited");
    assert!(!t
        .os
        .calls()
        .iter()
        .any(|c| matches!(c, Call::Identity(p) if *p == l.pid)));
}

#[test]
fn local_lease_ids_are_never_reused_across_a_restart() {
    let mut t = T::new();
    let l = t.start(spec(1, 0));
    let now = t.now();
    t.h.on_exit(&l.id, &exited(Some(0)), now);
    let mut t = t.restart();
    assert_eq!(t.start(spec(1, 0)).id, "L-2");
}

/// Rewrites a stored row by hand, as an older or newer agent (or damage) left it.
fn put_raw(dir: &Path, id: &str, live: bool, body: &str) {
    let conn = rusqlite::Connection::open(dir.join("agent.db")).expect("db");
    conn.execute(
        "INSERT INTO leases (id, live, body) VALUES (?1, ?2, ?3)
         ON CONFLICT(id) DO UPDATE SET live = excluded.live, body = excluded.body",
        rusqlite::params![id, live, body],
    )
    .expect("row");
}

#[test]
fn a_live_row_with_an_unknown_field_or_without_optional_ones_is_readopted() {
    let mut t = T::new();
    let a = t.start(StartSpec {
        time_limit_s: Some(600),
        ..spec(1, 60)
    });
    let b = t.start(spec(1, 60));
    let dir = t.dir.0.clone();
    // A newer agent's field, and an older agent's row without the later fields.
    let mut newer = serde_json::to_value(t.stored(&a.id).expect("a")).expect("json");
    newer["from_a_newer_agent"] = serde_json::json!({"x": 1});
    put_raw(&dir, &a.id, true, &newer.to_string());
    let mut older = serde_json::to_value(t.stored(&b.id).expect("b")).expect("json");
    for field in [
        "time_limit_s",
        "not_before_ms",
        "revoke_cause",
        "steps",
        "exit_code",
        "hook",
    ] {
        older.as_object_mut().expect("object").remove(field);
    }
    put_raw(&dir, &b.id, true, &older.to_string());
    let t = t.restart();
    let (ra, rb) = (t.lease(&a.id), t.lease(&b.id));
    assert_eq!(
        (ra.state, ra.proc_id(), ra.time_limit_s),
        (LeaseState::Running, a.proc_id(), Some(600))
    );
    assert_eq!(
        (rb.state, rb.proc_id(), rb.gpus.clone()),
        (LeaseState::Running, b.proc_id(), b.gpus.clone())
    );
    assert_eq!((rb.time_limit_s, rb.hook.as_str()), (None, ""));
}

#[test]
fn a_live_row_that_cannot_be_decoded_stops_the_start_naming_the_lease() {
    let mut t = T::new();
    let l = t.start(spec(2, 60));
    let gone = t.start(spec(1, 0));
    let now = t.now();
    t.h.on_exit(&gone.id, &exited(Some(0)), now);
    let T { h, os, dir } = t;
    let s = h.settings.clone();
    drop(h);
    put_raw(&dir.0, &l.id, true, "{\"id\": \"L-1\", \"gpus\": [tru");
    let store = Store::open(&dir.0).expect("store");
    let e = store.leases(100).expect_err("refused").to_string();
    assert!(
        e.starts_with(&format!(
            "{}: reading a live lease: lease \"{}\" cannot be decoded (",
            dir.0.join("agent.db").display(),
            l.id
        )),
        "{e}"
    );
    assert!(e.contains("the agent will not start without it"), "{e}");
    assert!(
        e.contains(&format!("UPDATE leases SET live = 0 WHERE id = '{}'", l.id)),
        "{e}"
    );
    let now = os.now();
    let r = Host::open(store, s.clone(), Box::new(os.clone()), now);
    let e = r.err().expect("the host does not open").to_string();
    assert!(
        e.contains(&format!("lease \"{}\" cannot be decoded", l.id)),
        "{e}"
    );
    // An ended row that cannot be decoded is only history: skipped.
    put_raw(
        &dir.0,
        &l.id,
        true,
        &serde_json::to_string(&l).expect("json"),
    );
    put_raw(&dir.0, &gone.id, false, "garbage");
    let t = T::open(os, dir, s);
    assert_eq!(t.lease(&l.id).state, LeaseState::Running);
    assert!(t.h.lease(&gone.id).is_none());
}

#[test]
fn a_drain_that_cannot_be_decoded_stops_the_start_naming_it() {
    let dir = Dir::new();
    let store = Store::open(&dir.0).expect("store");
    store
        .set("cluster-drain", Some("{\"reason\": "))
        .expect("set");
    let e = Host::open(store, settings(&dir.0), Box::new(FakeOs::new()), 0)
        .err()
        .expect("refused")
        .to_string();
    assert!(
        e.contains("setting \"cluster-drain\" cannot be decoded ("),
        "{e}"
    );
    // A drain row with fields missing reads with their defaults, its kind from the key.
    let store = Store::open(&dir.0).expect("store");
    store
        .set("cluster-drain", Some("{\"reason\": \"rack\"}"))
        .expect("set");
    drop(store);
    let s = settings(&dir.0);
    let t = T::open(FakeOs::new(), dir, s);
    let d = t.h.drains().first().cloned().cloned().expect("drained");
    assert_eq!(
        (d.by.as_str(), d.reason.as_str(), d.now),
        (CLUSTER, "rack", false)
    );
}

/// A lease revoked with `hook`, its ladder begun, then the agent stopped; the
/// workload ends `exit` while the agent is away, leaving the marker or not.
fn cut_ladder(hook: &str, exit: Exit, marked: bool) -> LeaseRecord {
    let mut t = T::new();
    let l = t.start(StartSpec {
        hook: hook.into(),
        ..spec(1, 0)
    });
    let now = t.now();
    t.h.revoke(&l.id, true, "cancelled by alice", now)
        .expect("revokes");
    assert_eq!(t.tick().len(), 1, "the ladder begins");
    assert_eq!(
        t.stored(&l.id).map(|s| s.state),
        Some(LeaseState::Checkpointing),
        "on disk before its first signal"
    );
    let dir = t.lease_dir(&l.id);
    if marked {
        t.os.touch(&dir.join("checkpoint").join(DEFAULT_MARKER));
    }
    t.os.write_exit(&dir, exit);
    t.os.exit(l.pid);
    t.os.advance(5_000);
    let t = t.restart();
    let r = t.lease(&l.id);
    assert_eq!(t.stored(&l.id).map(|s| s.state), Some(LeaseState::Ended));
    r
}

#[test]
fn a_ladder_that_ends_while_the_agent_is_down_ends_as_the_ladder_would() {
    // It checkpointed and exited 0: revoked after a checkpoint, never "exited".
    let r = cut_ladder("signal:USR1", exited(Some(0)), true);
    assert_eq!(
        (r.end_reason.as_str(), r.ended_by.as_str(), r.exit_code),
        ("revoked", "checkpoint", Some(0))
    );
    // It died of the hook's own signal without a marker: revoked, no checkpoint.
    let usr1 = Exit {
        signal: Some(Signal::SIGUSR1 as i32),
        ..Exit::default()
    };
    let r = cut_ladder("signal:USR1", usr1, false);
    assert_eq!(
        (r.end_reason.as_str(), r.ended_by.as_str()),
        ("revoked", "exited")
    );
    // No hook: SIGTERM ended it.
    let term = Exit {
        signal: Some(Signal::SIGTERM as i32),
        ..Exit::default()
    };
    let r = cut_ladder("", term, false);
    assert_eq!(
        (r.end_reason.as_str(), r.ended_by.as_str()),
        ("revoked", "term")
    );
}
