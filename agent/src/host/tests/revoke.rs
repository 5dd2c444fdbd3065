//! Revocations: when their ladder may start, and taking them back.

use super::*;

#[test]
fn a_revocation_waits_for_the_min_runtime_lapse() {
    let mut t = T::new();
    let t0 = t.now();
    let l = t.start(spec(1, 60));
    let now = t.os.advance(10_000);
    let r = t.h.revoke(&l.id, false, "make room", now).expect("revokes");
    assert_eq!(r.state, LeaseState::Revoking);
    assert_eq!(r.not_before_ms, Some(t0 + 60_000));
    assert_eq!(r.revoke_why, "make room");
    assert_eq!(r.revoke_cause, "", "no drain caused it");
    assert_eq!(t.stored(&l.id).map(|l| l.state), Some(LeaseState::Revoking));
    assert_eq!(t.h.next_wakeup(now), Some(t0 + 60_000));
    t.os.set_now(t0 + 59_999);
    assert!(t.tick().is_empty());
    assert_eq!(t.state(&l.id), LeaseState::Revoking);
    t.os.set_now(t0 + 60_000);
    let jobs = t.tick();
    assert_eq!(jobs.len(), 1);
    assert_eq!(jobs[0].lease, l.id);
    let l = t.lease(&l.id);
    assert_eq!(
        (l.state, l.ladder_reason.as_str()),
        (LeaseState::Checkpointing, "revoked")
    );
    assert!(
        t.os.signals().is_empty(),
        "the ladder signals, not the host"
    );
}

#[test]
fn a_revocation_now_starts_the_ladder_at_once() {
    let mut t = T::new();
    let l = t.start(spec(1, 3_600));
    let now = t.os.advance(1);
    let r = t.h.revoke(&l.id, true, "cancel", now).expect("revokes");
    assert_eq!(r.not_before_ms, Some(now));
    assert_eq!(t.tick().len(), 1);
}

#[test]
fn revoke_until_acts_at_once_once_its_not_before_has_come() {
    let mut t = T::new();
    let t0 = t.now();
    let a = t.start(spec(1, 60));
    let b = t.start(spec(1, 60));
    let now = t.os.advance(1_000);
    let ra = t.h.revoke_until(&a.id, now, "due", now).expect("a");
    assert_eq!(ra.not_before_ms, Some(now));
    let rb = t.h.revoke_until(&b.id, now + 1, "later", now).expect("b");
    assert_eq!(rb.not_before_ms, Some(t0 + 60_000), "this host's lapse");
    // A time allotd names past the lapse (a drain's grace for work that cannot
    // resume) is kept: the host starts the ladder when allotd said it would.
    let c = t.start(spec(1, 60));
    let day = now + 86_400_000;
    let rc =
        t.h.revoke_until(&c.id, day, "drain: maintenance", now)
            .expect("c");
    assert_eq!(rc.not_before_ms, Some(day));
}

#[test]
fn a_later_revocation_never_delays_an_earlier_one() {
    let mut t = T::new();
    let l = t.start(spec(1, 60));
    let now = t.os.advance(1);
    t.h.revoke(&l.id, true, "first", now).expect("revokes");
    t.h.take_changes();
    let r = t.h.revoke(&l.id, false, "second", now).expect("revokes");
    assert_eq!(r.not_before_ms, Some(now));
    assert_eq!(
        r.revoke_why, "first",
        "the same revocation: nothing changes"
    );
    assert!(t.h.take_changes().is_empty());
}

#[test]
fn revoking_an_unknown_lease_names_it() {
    let mut t = T::new();
    let now = t.now();
    assert!(matches!(
        t.h.revoke("L-9", true, "x", now),
        Err(HostError::NoLease(id)) if id == "L-9"
    ));
}

#[test]
fn a_lease_in_its_ladder_or_ended_is_not_revoked_again() {
    let mut t = T::new();
    let l = t.start(spec(1, 0));
    let now = t.now();
    t.h.revoke(&l.id, true, "first", now).expect("revokes");
    t.tick();
    let r = t.h.revoke(&l.id, true, "again", now).expect("known");
    assert_eq!(
        (r.state, r.revoke_why.as_str()),
        (LeaseState::Checkpointing, "first")
    );
    let e = t.start(spec(1, 0));
    t.h.on_exit(&e.id, &exited(Some(0)), now);
    assert_eq!(
        t.h.revoke(&e.id, true, "late", now).expect("known").state,
        LeaseState::Ended
    );
}

#[test]
fn a_withdrawn_revocation_runs_on_under_its_contract() {
    let mut t = T::new();
    let l = t.start(spec(1, 60));
    let now = t.now();
    t.h.revoke(&l.id, false, "make room", now).expect("revokes");
    assert!(t.h.withdraw(&l.id, "no longer needed"));
    let w = t.lease(&l.id);
    assert_eq!(w.state, LeaseState::Running);
    assert_eq!(w.not_before_ms, None);
    assert_eq!((w.revoke_why.as_str(), w.revoke_cause.as_str()), ("", ""));
    assert!(t
        .events()
        .iter()
        .any(|e| e == "revocation withdrawn: no longer needed"));
    t.os.advance(3_600_000);
    assert!(t.tick().is_empty());
    assert!(!t.h.withdraw(&l.id, "again"), "nothing to withdraw");
    assert!(!t.h.withdraw("L-9", "unknown"));
}

#[test]
fn a_revocation_whose_ladder_began_cannot_be_withdrawn() {
    let mut t = T::new();
    let l = t.start(spec(1, 0));
    let now = t.now();
    t.h.revoke(&l.id, true, "now", now).expect("revokes");
    t.tick();
    assert!(!t.h.withdraw(&l.id, "too late"));
    assert_eq!(t.state(&l.id), LeaseState::Checkpointing);
}

#[test]
fn allotds_repeat_of_a_revocation_in_force_changes_nothing() {
    // allotd sends what it wants again on every connect and resync: the second
    // copy of a cancel, arriving later, must neither move the ladder's start nor
    // write the lease again.
    let mut t = T::new();
    let l = t.start(spec(1, 3_600));
    let first = t.os.advance(1_000);
    let r =
        t.h.revoke_until(&l.id, first - 500, "cancelled", first)
            .expect("revokes");
    assert_eq!(r.not_before_ms, Some(first));
    t.h.take_changes();
    let later = t.os.advance(700);
    let again =
        t.h.revoke_until(&l.id, first - 500, "cancelled", later)
            .expect("again");
    assert_eq!(again.not_before_ms, Some(first), "the ladder's start stays");
    assert!(
        t.h.take_changes().is_empty(),
        "nothing written: {:?}",
        t.h.take_changes()
    );
}
