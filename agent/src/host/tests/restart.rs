//! Restart: `Host::open` on a store with leases whose processes are alive, gone, or
//! whose pid now names another process.

use super::*;
use crate::os::fake::Call;

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
    t.os.exit(l.pid);
    t.os.advance(ADOPTED_POLL_MS);
    t.tick();
    assert_eq!(t.lease(&l.id).end_reason, "exited");
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
    assert!(t
        .events()
        .iter()
        .any(|e| *e == format!("pid {} exited while the agent was away", l.pid)));
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
    t.h.on_exit(&l.id, Some(0), now);
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
    t.h.on_exit(&l.id, Some(0), now);
    let mut t = t.restart();
    assert_eq!(t.start(spec(1, 0)).id, "L-2");
}
