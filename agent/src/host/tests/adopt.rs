//! Adopting a process the agent did not start, and watching it.

use super::*;
use crate::os::fake::Call;

#[test]
fn adopting_records_the_identity_without_launching() {
    let mut t = T::new();
    let p = t.os.spawn();
    let (l, reaper) = t
        .try_start(StartSpec {
            argv: Vec::new(),
            adopt_pid: Some(p.pid),
            ..spec(1, 60)
        })
        .expect("adopts");
    assert!(l.adopted);
    assert!(reaper.is_none(), "someone else reaps it");
    assert_eq!(l.proc_id(), p);
    assert_eq!(l.state, LeaseState::Running);
    assert!(t.os.launches().is_empty());
    let ckpt = t.dir.0.join("leases").join(&l.id).join("checkpoint");
    assert!(t
        .os
        .calls()
        .iter()
        .any(|c| matches!(c, Call::CreateDir(d, None) if *d == ckpt)));
    // Its exit is seen by polling.
    assert_eq!(t.h.next_wakeup(t.now()), Some(t.now() + ADOPTED_POLL_MS));
}

#[test]
fn adoption_refuses_a_missing_pid_a_member_of_another_group_and_a_taken_pid() {
    let mut t = T::new();
    let adopt = |pid: i32| StartSpec {
        argv: Vec::new(),
        adopt_pid: Some(pid),
        ..spec(1, 0)
    };
    assert_eq!(invalid(t.try_start(adopt(4242))), "adopt_pid");
    let gone = t.os.spawn();
    t.os.exit(gone.pid);
    assert_eq!(invalid(t.try_start(adopt(gone.pid))), "adopt_pid");
    let leader = t.os.spawn();
    let member = t.os.spawn_in_group(leader.pid);
    match t.try_start(adopt(member.pid)) {
        Err(HostError::Invalid { field, message }) => {
            assert_eq!(field, "adopt_pid");
            assert!(
                message.contains("does not lead its process group"),
                "{message}"
            );
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
    t.start(adopt(leader.pid));
    let m = refusal(t.try_start(adopt(leader.pid)));
    assert!(m.contains("already belongs to a lease"), "{m}");
    assert_eq!(t.h.leases().len(), 1);
}

#[test]
fn an_adopted_process_that_exits_ends_on_the_next_tick() {
    let mut t = T::new();
    let l = t.adopt(1, 60);
    t.os.advance(ADOPTED_POLL_MS);
    assert!(t.tick().is_empty());
    assert_eq!(t.state(&l.id), LeaseState::Running);
    t.os.exit(l.pid);
    let now = t.os.advance(ADOPTED_POLL_MS);
    assert!(t.tick().is_empty());
    let l = t.lease(&l.id);
    assert_eq!(
        (
            l.state,
            l.end_reason.as_str(),
            l.ended_by.as_str(),
            l.ended_ms
        ),
        (LeaseState::Ended, "exited", "exited", now)
    );
    assert!(t.os.signals().is_empty());
    assert_eq!(t.h.next_wakeup(now), None, "nothing left to poll");
}

#[test]
fn an_adopted_pid_given_to_another_process_ends_the_lease() {
    let mut t = T::new();
    let l = t.adopt(1, 60);
    t.os.exit(l.pid);
    t.os.reuse(l.pid);
    t.tick();
    assert_eq!(t.lease(&l.id).end_reason, "exited");
    assert!(
        t.os.signals().is_empty(),
        "a recycled pid is never signalled"
    );
}

#[test]
fn an_owned_process_is_not_polled() {
    let mut t = T::new();
    let l = t.start(spec(1, 60));
    t.os.clear_calls();
    t.os.advance(10 * ADOPTED_POLL_MS);
    assert!(t.tick().is_empty());
    assert!(
        t.os.calls().is_empty(),
        "nothing due: its identity is not even read"
    );
    assert_eq!(t.state(&l.id), LeaseState::Running);
}

#[test]
fn the_agent_and_its_ancestors_are_never_adopted() {
    let mut t = T::new();
    for pid in [crate::os::fake::AGENT_PID, 1] {
        match t.try_start(StartSpec {
            argv: Vec::new(),
            adopt_pid: Some(pid),
            ..spec(1, 0)
        }) {
            Err(HostError::Invalid { field, message }) => {
                assert_eq!(field, "adopt_pid");
                assert!(
                    message.contains("the agent or one of its ancestors"),
                    "{message}"
                );
            }
            other => panic!("pid {pid}: expected a refusal, got {other:?}"),
        }
    }
    assert!(t.h.leases().is_empty());
}

#[test]
fn a_user_adopts_only_their_own_processes_and_root_any() {
    let mut t = T::new();
    let adopt = |pid: i32| StartSpec {
        argv: Vec::new(),
        adopt_pid: Some(pid),
        ..spec(1, 0)
    };
    let roots = t.os.spawn_owned_by(0);
    let now = t.now();
    let m = refusal(t.h.start(adopt(roots.pid), ALICE, now));
    assert!(m.contains("belongs to uid 0, not to you (uid 1000)"), "{m}");
    let hers = t.os.spawn_owned_by(1000);
    let (l, _) = t.h.start(adopt(hers.pid), ALICE, now).expect("her own");
    assert_eq!(l.user, "alice");
    // Root may adopt anyone's (the operator taking over a running job).
    t.start(adopt(roots.pid));
    assert_eq!(t.h.leases().len(), 2);
}
