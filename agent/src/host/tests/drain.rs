//! Drains by the host operator and by allotd, and what their end withdraws.

use super::*;

#[test]
fn a_local_drain_refuses_new_leases_and_revokes_at_the_lapse() {
    let mut t = T::new();
    let t0 = t.now();
    let a = t.start(spec(1, 60));
    let b = t.start(spec(1, 120));
    let now = t.os.advance(1_000);
    let d = t.h.drain("rack work", false, "bob", now).expect("drains");
    assert_eq!(
        (d.by.as_str(), d.author.as_str(), d.at_ms),
        (LOCAL, "bob", now)
    );
    assert_eq!(t.h.drain_state(), Some(&d));
    for (id, lapse) in [(&a.id, 60_000), (&b.id, 120_000)] {
        let l = t.lease(id);
        assert_eq!(l.state, LeaseState::Revoking);
        assert_eq!(l.not_before_ms, Some(t0 + lapse));
        assert_eq!(
            (l.revoke_why.as_str(), l.revoke_cause.as_str()),
            ("drain: rack work", LOCAL)
        );
    }
    let m = refusal(t.try_start(spec(1, 0)));
    assert!(m.contains("drained by local-operator (rack work)"), "{m}");
    assert!(m.contains("`allot undrain` on this host"), "{m}");
}

#[test]
fn a_drain_needs_a_reason() {
    let mut t = T::new();
    let now = t.now();
    assert_eq!(invalid(t.h.drain("  ", false, "bob", now)), "reason");
    assert_eq!(t.h.drain_state(), None);
}

#[test]
fn a_drain_now_revokes_at_once() {
    let mut t = T::new();
    let l = t.start(spec(1, 3_600));
    let now = t.os.advance(1);
    t.h.drain("fire", true, "bob", now).expect("drains");
    assert_eq!(t.lease(&l.id).not_before_ms, Some(now));
    assert_eq!(t.tick().len(), 1);
}

#[test]
fn undrain_withdraws_what_the_drain_revoked_but_not_a_preemption() {
    let mut t = T::new();
    let preempted = t.start(spec(1, 60));
    let drained = t.start(spec(1, 60));
    let now = t.now();
    t.h.revoke(&preempted.id, false, "preempted", now)
        .expect("revokes");
    t.h.drain("rack work", false, "bob", now).expect("drains");
    assert_eq!(
        t.lease(&preempted.id).revoke_cause,
        "",
        "a drain never claims it"
    );
    assert_eq!(t.h.undrain().expect("undrains"), None);
    assert_eq!(t.state(&drained.id), LeaseState::Running);
    let p = t.lease(&preempted.id);
    assert_eq!(
        (p.state, p.revoke_why.as_str()),
        (LeaseState::Revoking, "preempted")
    );
    t.start(spec(1, 0));
}

#[test]
fn revocations_stay_while_another_drain_holds_the_host() {
    let mut t = T::new();
    let l = t.start(spec(1, 60));
    let now = t.now();
    t.h.drain("rack work", false, "bob", now).expect("drains");
    t.h.allocator_drain(CLUSTER, true, false, "decommission", now)
        .expect("drains");
    let left = t.h.undrain().expect("undrains").expect("still drained");
    assert_eq!(
        (left.by.as_str(), left.reason.as_str()),
        (CLUSTER, "decommission")
    );
    assert_eq!(t.state(&l.id), LeaseState::Revoking);
    t.h.allocator_drain(CLUSTER, false, false, "", now)
        .expect("lifts");
    assert_eq!(t.h.drain_state(), None);
    assert_eq!(t.state(&l.id), LeaseState::Running);
}

#[test]
fn the_cluster_drain_is_allotds_to_lift() {
    let mut t = T::new();
    let l = t.start(spec(1, 60));
    let now = t.now();
    t.h.allocator_drain(CLUSTER, true, false, "decommission", now)
        .expect("drains");
    let d = t.h.drain_state().cloned().expect("drained");
    assert_eq!((d.by.as_str(), d.author.as_str()), (CLUSTER, "allotd"));
    assert_eq!(t.lease(&l.id).revoke_cause, CLUSTER);
    let m = refusal(t.try_start(spec(1, 0)));
    assert!(m.contains("`allot nodes undrain` on the cluster"), "{m}");
    // The same drain again changes nothing.
    t.h.take_changes();
    let events = t.events().len();
    let again = t.os.advance(1_000);
    t.h.allocator_drain(CLUSTER, true, false, "decommission", again)
        .expect("drains");
    assert_eq!(t.h.drain_state().map(|d| d.at_ms), Some(now));
    assert!(t.h.take_changes().is_empty());
    assert_eq!(t.events().len(), events);
    // The host operator's undrain leaves it.
    assert!(t.h.undrain().expect("undrains").is_some());
    // A drain-now replaces it and revokes at once.
    let later = t.now();
    t.h.allocator_drain(CLUSTER, true, true, "decommission", later)
        .expect("drains");
    assert_eq!(t.lease(&l.id).not_before_ms, Some(later));
}

#[test]
fn drains_are_kept_across_a_restart() {
    let mut t = T::new();
    let now = t.now();
    t.h.drain("rack work", false, "bob", now).expect("drains");
    t.h.allocator_drain(CLUSTER, true, false, "decommission", now)
        .expect("drains");
    let t = t.restart();
    let kinds: Vec<_> = t.h.drains().iter().map(|d| d.by.clone()).collect();
    assert_eq!(kinds, [LOCAL, CLUSTER]);
    assert_eq!(t.h.drain_state().map(|d| d.author.as_str()), Some("bob"));
}

#[test]
fn a_0_1_0_allotd_drain_moves_to_the_cluster_key() {
    let dir = Dir::new();
    let old = r#"{"reason":"allocator: rack","now":true,"by":"operator","at_ms":5}"#;
    Store::open(&dir.0)
        .expect("store")
        .set("drain", Some(old))
        .expect("set");
    let s = settings(&dir.0);
    let t = T::open(FakeOs::new(), dir, s);
    let d = t.h.drain_state().cloned().expect("drained");
    assert_eq!(
        (d.by.as_str(), d.author.as_str(), d.reason.as_str(), d.now),
        (CLUSTER, "allotd", "rack", true)
    );
    let store = Store::open(&t.dir.0).expect("store");
    assert_eq!(store.get("drain").expect("get"), None);
    assert!(store.get("cluster-drain").expect("get").is_some());
}

#[test]
fn a_0_1_0_operator_drain_is_the_host_operators() {
    let dir = Dir::new();
    let old = r#"{"reason":"rack","now":false,"by":"operator","at_ms":5}"#;
    Store::open(&dir.0)
        .expect("store")
        .set("drain", Some(old))
        .expect("set");
    let s = settings(&dir.0);
    let mut t = T::open(FakeOs::new(), dir, s);
    assert_eq!(t.h.drain_state().map(|d| d.by.as_str()), Some(LOCAL));
    assert_eq!(t.h.undrain().expect("undrains"), None);
}

#[test]
fn commands_leave_the_daemon_its_reaper_a_wake_up_and_a_health_report() {
    let mut t = T::new();
    let kinds = |e: &[Effect]| -> Vec<&'static str> {
        e.iter()
            .map(|e| match e {
                Effect::Reap(..) => "reap",
                Effect::Wake => "wake",
                Effect::ReportHealth => "health",
            })
            .collect()
    };
    let now = t.now();
    let (o, e) =
        t.h.command(
            HostCommand::Start {
                spec: Box::new(spec(1, 60)),
                caller: ROOT,
            },
            now,
        )
        .expect("starts");
    let Outcome::Lease(l) = o else {
        panic!("a start answers with its lease: {o:?}")
    };
    assert!(matches!(&e[..], [Effect::Wake, Effect::Reap(id, _)] if *id == l.id));
    // A drain changes what allotd must hear; allotd's own does not (it knows).
    let (o, e) =
        t.h.command(
            HostCommand::Drain {
                reason: "rack work".into(),
                now: false,
                author: "bob".into(),
            },
            now,
        )
        .expect("drains");
    assert_eq!(kinds(&e), ["health", "wake"]);
    let Outcome::Drains(d) = o else {
        panic!("a drain answers with the drains: {o:?}")
    };
    assert_eq!((d.len(), d[0].by.as_str()), (1, LOCAL));
    let (_, e) =
        t.h.command(
            HostCommand::AllocatorDrain {
                kind: CLUSTER.into(),
                drain: true,
                now: false,
                reason: "swap PSU".into(),
            },
            now,
        )
        .expect("allotd drains");
    assert_eq!(kinds(&e), ["wake"]);
    let (o, e) = t.h.command(HostCommand::Undrain, now).expect("undrains");
    assert_eq!(kinds(&e), ["health", "wake"]);
    assert!(matches!(o, Outcome::Drains(d) if d.len() == 1 && d[0].by == CLUSTER));
    let (o, _) =
        t.h.command(
            HostCommand::Revoke {
                lease: l.id.clone(),
                now: true,
                by: "operator".into(),
            },
            now,
        )
        .expect("revokes");
    assert!(matches!(o, Outcome::Lease(r) if r.state == LeaseState::Revoking || !r.live()));
}
