//! Health verdicts: failed GPUs, GPU-only verdicts, host drains, and the drains
//! held for allotd's circuit breaker.

use super::*;

fn failed(i: u32) -> Verdict {
    verdict(
        HostVerdict::Drain,
        &[i],
        &[(
            &pci(i),
            GpuState::Failed,
            reason("xid:79", Some(Action::DrainNow), true),
        )],
    )
}

/// A host-wide drain caused by GPU 0's NVLink.
fn nvlink(signal: &str) -> Verdict {
    verdict(
        HostVerdict::Drain,
        &[],
        &[(
            &pci(0),
            GpuState::Degraded,
            reason(signal, Some(Action::Drain), false),
        )],
    )
}

#[test]
fn a_failed_gpu_kills_its_lease_and_is_not_offered_again() {
    let mut t = T::new();
    let a = t.start(spec(1, 3_600));
    let b = t.start(spec(1, 3_600));
    let now = t.os.advance(1_000);
    t.verdict(failed(0));
    let l = t.lease(&a.id);
    assert_eq!(
        (
            l.state,
            l.end_reason.as_str(),
            l.ended_by.as_str(),
            l.ended_ms
        ),
        (LeaseState::Ended, "gpu-lost", "kill", now)
    );
    assert_eq!(t.os.signals(), [(a.pid, Signal::SIGKILL)]);
    assert_eq!(
        t.state(&b.id),
        LeaseState::Running,
        "other GPUs keep working"
    );
    assert_eq!(t.h.drain_state(), None);
    let m = refusal(t.try_start(spec(3, 0)));
    assert!(m.contains("2 free and healthy of 4"), "{m}");
}

#[test]
fn a_failed_gpus_workload_already_gone_is_not_signalled() {
    let mut t = T::new();
    let a = t.start(spec(1, 3_600));
    t.os.exit(a.pid);
    t.os.reuse(a.pid);
    t.verdict(failed(0));
    assert_eq!(t.lease(&a.id).end_reason, "gpu-lost");
    assert!(t.os.signals().is_empty());
}

#[test]
fn a_gpu_only_verdict_revokes_just_those_leases_and_holds_the_gpus() {
    let mut t = T::new();
    let t0 = t.now();
    let a = t.start(spec(1, 60));
    let b = t.start(StartSpec {
        gpu_uuids: vec![uuid(3)],
        lease_id: "A-1".into(),
        ..spec(1, 60)
    });
    let r = reason("row-remap-pending", Some(Action::Drain), true);
    t.verdict(verdict(
        HostVerdict::Drain,
        &[0, 1],
        &[
            (&pci(0), GpuState::Degraded, r.clone()),
            (&pci(1), GpuState::Degraded, r),
        ],
    ));
    let l = t.lease(&a.id);
    assert_eq!(l.state, LeaseState::Revoking);
    assert_eq!(l.not_before_ms, Some(t0 + 60_000));
    assert_eq!(
        l.revoke_why,
        "health: 0000:00:00.0 row-remap-pending, 0000:01:00.0 row-remap-pending"
    );
    assert_eq!(t.state(&b.id), LeaseState::Running);
    assert_eq!(t.h.drain_state(), None, "the host is not drained");
    let m = refusal(t.try_start(spec(2, 0)));
    assert!(m.contains("1 free and healthy of 4"), "{m}");
    t.verdict(ok());
    assert_eq!(t.start(spec(2, 0)).gpus, vec![uuid(1), uuid(2)]);
    assert_eq!(
        t.state(&a.id),
        LeaseState::Revoking,
        "the verdict's revocation is not a drain's: it stays"
    );
}

#[test]
fn a_gpu_only_drain_now_revokes_at_once() {
    let mut t = T::new();
    let a = t.start(spec(1, 3_600));
    let now = t.os.advance(1);
    t.verdict(verdict(
        HostVerdict::DrainNow,
        &[0],
        &[(
            &pci(0),
            GpuState::Degraded,
            reason("xid:48", Some(Action::DrainNow), true),
        )],
    ));
    assert_eq!(t.lease(&a.id).not_before_ms, Some(now));
}

#[test]
fn a_host_drain_verdict_drains_and_the_all_clear_lifts_it() {
    let mut t = T::new();
    let t0 = t.now();
    let a = t.start(spec(1, 60));
    let b = t.start(spec(1, 60));
    t.verdict(nvlink("nvlink-errors"));
    let d = t.h.drain_state().cloned().expect("drained");
    assert_eq!(
        (d.by.as_str(), d.now, d.held, d.reason.as_str()),
        (HEALTH, false, false, "0000:00:00.0 nvlink-errors")
    );
    for id in [&a.id, &b.id] {
        let l = t.lease(id);
        assert_eq!(
            (l.state, l.not_before_ms, l.revoke_cause.as_str()),
            (LeaseState::Revoking, Some(t0 + 60_000), HEALTH)
        );
    }
    let m = refusal(t.try_start(spec(1, 0)));
    assert!(m.contains("the fault is cleared"), "{m}");
    assert_eq!(t.h.host_verdict(), HostVerdict::Drain);
    t.verdict(ok());
    assert_eq!(t.h.drain_state(), None);
    assert_eq!(t.state(&a.id), LeaseState::Running);
    assert_eq!(t.state(&b.id), LeaseState::Running);
    assert!(t
        .events()
        .iter()
        .any(|e| e == "health verdict ok again: health drain lifted"));
}

#[test]
fn a_drain_now_from_outside_the_gpus_revokes_at_once() {
    let mut t = T::new();
    let a = t.start(spec(1, 3_600));
    let now = t.os.advance(1);
    t.verdict(verdict(
        HostVerdict::DrainNow,
        &[],
        &[(
            "nvswitch-0",
            GpuState::Failed,
            reason("xid:145", Some(Action::DrainNow), false),
        )],
    ));
    assert_eq!(t.h.drain_state().map(|d| d.now), Some(true));
    assert_eq!(t.lease(&a.id).not_before_ms, Some(now));
}

#[test]
fn a_drain_now_from_a_gpu_already_handled_leaves_the_others_their_protection() {
    let mut t = T::new();
    let t0 = t.now();
    let a = t.start(spec(1, 60));
    let b = t.start(spec(1, 60));
    t.os.advance(1);
    t.verdict(verdict(
        HostVerdict::DrainNow,
        &[],
        &[(
            &pci(1),
            GpuState::Failed,
            reason("xid:79", Some(Action::DrainNow), false),
        )],
    ));
    assert_eq!(t.lease(&b.id).end_reason, "gpu-lost");
    assert_eq!(t.h.drain_state().map(|d| d.now), Some(false));
    assert_eq!(t.lease(&a.id).not_before_ms, Some(t0 + 60_000));
}

#[test]
fn the_same_verdict_again_changes_nothing() {
    let mut t = T::new();
    t.start(spec(1, 60));
    t.verdict(nvlink("nvlink-errors"));
    t.h.take_changes();
    let events = t.events().len();
    t.os.advance(1_000);
    t.verdict(nvlink("nvlink-errors"));
    assert!(t.h.take_changes().is_empty());
    assert_eq!(t.events().len(), events);
}

#[test]
fn while_allotd_decides_a_health_drain_is_held() {
    let mut t = T::new();
    let a = t.start(spec(1, 3_600));
    let now = t.now();
    t.h.set_defer_health(true, now);
    t.verdict(nvlink("nvlink-errors"));
    assert_eq!(t.h.drain_state(), None, "not in force");
    assert_eq!(
        t.h.drains().iter().map(|d| d.held).collect::<Vec<_>>(),
        [true]
    );
    assert_eq!(t.state(&a.id), LeaseState::Running);
    t.start(spec(1, 0));
    assert!(t
        .events()
        .iter()
        .any(|e| e.contains("allotd's circuit breaker decides")));
    // The breaker lets it through, as a drain-now.
    let now = t.os.advance(1);
    t.h.allocator_drain(HEALTH, true, true, "", now)
        .expect("lets it through");
    let d = t.h.drain_state().cloned().expect("in force");
    assert_eq!((d.by.as_str(), d.now), (HEALTH, true));
    let l = t.lease(&a.id);
    assert_eq!(
        (l.state, l.not_before_ms, l.revoke_cause.as_str()),
        (LeaseState::Revoking, Some(now), HEALTH)
    );
}

#[test]
fn allotd_holding_the_drain_again_withdraws_its_revocations() {
    let mut t = T::new();
    let a = t.start(spec(1, 3_600));
    let now = t.now();
    t.h.set_defer_health(true, now);
    t.verdict(nvlink("nvlink-errors"));
    t.h.allocator_drain(HEALTH, true, false, "", now)
        .expect("lets it through");
    assert_eq!(t.state(&a.id), LeaseState::Revoking);
    t.h.allocator_drain(HEALTH, false, false, "breaker open", now)
        .expect("holds");
    assert_eq!(t.h.drain_state(), None);
    assert_eq!(t.state(&a.id), LeaseState::Running);
    assert!(t
        .events()
        .iter()
        .any(|e| e == "health drain held by allotd: breaker open"));
}

#[test]
fn alone_the_host_does_not_hold_its_health_drain() {
    let mut t = T::new();
    let a = t.start(spec(1, 3_600));
    let now = t.now();
    t.verdict(nvlink("nvlink-errors"));
    t.h.allocator_drain(HEALTH, false, false, "breaker open", now)
        .expect("ignored");
    assert!(t.h.drain_state().is_some());
    assert_eq!(t.state(&a.id), LeaseState::Revoking);
}

#[test]
fn when_allotd_goes_away_the_held_drain_takes_effect() {
    let mut t = T::new();
    let a = t.start(spec(1, 3_600));
    let now = t.now();
    t.h.set_defer_health(true, now);
    t.verdict(nvlink("nvlink-errors"));
    assert_eq!(t.state(&a.id), LeaseState::Running);
    t.h.set_defer_health(false, now);
    assert_eq!(t.h.drain_state().map(|d| d.by.as_str()), Some(HEALTH));
    assert_eq!(t.lease(&a.id).revoke_cause, HEALTH);
    assert!(t
        .events()
        .iter()
        .any(|e| e.starts_with("allotd is away: the held health drain takes effect")));
}

#[test]
fn a_drain_allotds_breaker_held_stays_held_while_allotd_is_away() {
    let mut t = T::new();
    let a = t.start(spec(1, 0));
    let now = t.now();
    t.h.set_defer_health(true, now);
    t.verdict(nvlink("nvlink-errors"));
    t.h.allocator_drain(HEALTH, false, false, "breaker open", now)
        .expect("holds");
    // allotd goes away (killed, restarted): its decision stands.
    t.h.set_defer_health(false, now);
    assert_eq!(t.h.drain_state(), None, "still held");
    assert_eq!(t.state(&a.id), LeaseState::Running);
    assert!(t.events().iter().any(|e| e.starts_with(
        "allotd is away: the health drain its circuit breaker held stays held until allotd says otherwise"
    )));
    // And across a restart of the agent itself, as long as the reasons are the same.
    let mut t = t.restart();
    t.verdict(nvlink("nvlink-errors"));
    assert_eq!(t.h.drain_state(), None, "held after the agent's restart");
    assert_eq!(t.state(&a.id), LeaseState::Running);
    // allotd, back, lets it through: in force, and the hold is forgotten.
    let now = t.now();
    t.h.set_defer_health(true, now);
    t.h.allocator_drain(HEALTH, true, false, "", now)
        .expect("lets it through");
    assert!(t.h.drain_state().is_some());
    assert_eq!(t.state(&a.id), LeaseState::Revoking);
}

#[test]
fn new_reasons_while_allotd_is_away_are_the_hosts_to_decide() {
    let mut t = T::new();
    let a = t.start(spec(1, 0));
    let now = t.now();
    t.h.set_defer_health(true, now);
    t.verdict(nvlink("nvlink-errors"));
    t.h.allocator_drain(HEALTH, false, false, "breaker open", now)
        .expect("holds");
    t.h.set_defer_health(false, now);
    // Another fault allotd never heard of: the host drains itself.
    t.verdict(nvlink("nvlink-crc"));
    assert_eq!(t.h.drain_state().map(|d| d.by.as_str()), Some(HEALTH));
    assert_eq!(t.state(&a.id), LeaseState::Revoking);
}

#[test]
fn a_drain_let_through_stays_through_when_its_reasons_change() {
    let mut t = T::new();
    let now = t.now();
    t.h.set_defer_health(true, now);
    t.verdict(nvlink("nvlink-errors"));
    t.h.allocator_drain(HEALTH, true, false, "", now)
        .expect("lets it through");
    t.verdict(nvlink("nvlink-crc"));
    let d = t.h.drain_state().cloned().expect("still in force");
    assert_eq!(d.reason, "0000:00:00.0 nvlink-crc");
}

#[test]
fn a_held_drain_stays_held_when_its_reasons_change() {
    let mut t = T::new();
    let a = t.start(spec(1, 3_600));
    let now = t.now();
    t.h.set_defer_health(true, now);
    t.verdict(nvlink("nvlink-errors"));
    t.verdict(nvlink("nvlink-crc"));
    let held: Vec<_> =
        t.h.drains()
            .iter()
            .map(|d| (d.reason.clone(), d.held))
            .collect();
    assert_eq!(held, [("0000:00:00.0 nvlink-crc".to_string(), true)]);
    assert_eq!(t.state(&a.id), LeaseState::Running);
}

#[test]
fn gpus_show_their_health_and_holder() {
    let mut t = T::new();
    let a = t.start(spec(1, 0));
    t.verdict(verdict(
        HostVerdict::Ok,
        &[],
        &[(&pci(2), GpuState::Degraded, reason("thermal", None, true))],
    ));
    let g = t.h.gpus();
    assert_eq!(g.len(), 4);
    assert_eq!(g[0].lease.as_deref(), Some(a.id.as_str()));
    assert_eq!(g[0].state, GpuState::Healthy);
    assert_eq!(
        (g[2].lease.as_deref(), g[2].state),
        (None, GpuState::Degraded)
    );
    assert_eq!(g[2].reasons[0].signal, "thermal");
    assert_eq!(t.h.host_verdict(), HostVerdict::Ok);
    t.h.gpu_cleared(&pci(2), 2, "bob", "reset");
    assert!(t
        .events()
        .iter()
        .any(|e| e == "GPU 2 cleared by bob: reset"));
}

/// What `disk::assess` reports for a nearly full state dir.
fn disk_low() -> Reason {
    Reason {
        signal: "disk-low".into(),
        detail: "/var/lib/allot/agent has 10.0 MiB free of 100.0 GiB, below [agent] min_free_bytes = 1.0 GiB".into(),
        action: Some(Action::Drain),
        gpu_only: false,
        since: 0,
    }
}

#[test]
fn a_disk_nearly_full_drains_the_host_and_space_back_lifts_it() {
    let mut t = T::new();
    t.verdict(ok());
    let t0 = t.now();
    let a = t.start(spec(1, 60));
    assert!(t.h.on_disk(Some(disk_low()), t0), "a new fault is a change");
    assert_eq!(t.h.host_verdict(), HostVerdict::Drain);
    let d = t.h.drain_state().cloned().expect("drained");
    assert_eq!((d.by.as_str(), d.now, d.held), (HEALTH, false, false));
    assert!(
        d.reason
            .starts_with("disk-low: /var/lib/allot/agent has 10.0 MiB free"),
        "{}",
        d.reason
    );
    assert_eq!(t.h.host_reasons(), [disk_low()]);
    // Like any host-wide health drain: no new work, leases revoked at their lapse.
    let m = refusal(t.try_start(spec(1, 0)));
    assert!(
        m.contains("drained by health") && m.contains("disk-low"),
        "{m}"
    );
    assert_eq!(t.lease(&a.id).not_before_ms, Some(t0 + 60_000));
    // The same condition again changes nothing; a GPU sample keeps the drain.
    assert!(!t.h.on_disk(Some(disk_low()), t0 + 1));
    t.verdict(ok());
    assert_eq!(
        t.h.host_verdict(),
        HostVerdict::Drain,
        "the disk still holds it"
    );
    assert!(t.h.drain_state().is_some());
    // Space back: the drain lifts and work starts again.
    assert!(t.h.on_disk(None, t0 + 2));
    assert_eq!(t.h.host_verdict(), HostVerdict::Ok);
    assert_eq!(t.h.drain_state(), None);
    assert!(t.h.host_reasons().is_empty());
    t.start(spec(1, 0));
}

#[test]
fn a_disk_fault_before_any_gpu_sample_drains_and_lifts_too() {
    let mut t = T::new();
    let now = t.now();
    t.h.on_disk(Some(disk_low()), now);
    assert_eq!(
        t.h.drain_state().map(|d| d.by.as_str()),
        Some(HEALTH),
        "drained without a GPU verdict"
    );
    t.h.on_disk(None, now);
    assert_eq!(t.h.drain_state(), None);
}

#[test]
fn a_write_the_host_cannot_make_refuses_the_start_and_drains_until_writes_succeed() {
    let mut t = T::new();
    let now = t.now();
    t.h.set_defer_health(false, now);
    // The lease dir cannot be made: the file system is full.
    t.os.fail_next_launch_errno(nix::errno::Errno::ENOSPC as i32);
    let e = refusal(t.try_start(spec(1, 0)));
    assert!(e.contains("drains itself (disk-full)"), "{e}");
    assert!(
        t.h.take_disk_check(),
        "the daemon looks at the disk at once"
    );
    let d = t.h.drain_state().cloned().expect("drained");
    assert_eq!(d.by, HEALTH);
    assert!(d.reason.contains("disk-full"), "{d:?}");
    assert_eq!(
        t.h.host_reasons()
            .iter()
            .map(|r| r.signal.as_str())
            .collect::<Vec<_>>(),
        ["disk-full"]
    );
    // Refused, not failed: the lease says so.
    let l = t.h.leases().into_iter().next().expect("the refused lease");
    assert_eq!(l.end_reason, "refused");
    // Nothing starts while it holds.
    assert!(refusal(t.try_start(spec(1, 0))).contains("drained by health"));
    // While the file system is still full, the daemon's retry keeps it.
    let now = t.now();
    t.os.set_full(&t.dir.0, true);
    assert!(!t.h.retry_write(now));
    assert!(t.h.drain_state().is_some());
    // A write that succeeds lifts it.
    t.os.set_full(&t.dir.0, false);
    assert!(t.h.retry_write(now));
    assert_eq!(t.h.drain_state(), None);
    assert!(t.h.host_reasons().is_empty());
    t.start(spec(1, 0));
    // A failure to spawn for another reason is the work's: it fails, no drain.
    t.os.fail_next_launch("no such program");
    let e = t.try_start(spec(1, 0)).expect_err("fails");
    assert!(matches!(e, HostError::Launch(_)), "{e}");
    assert_eq!(t.h.drain_state(), None);
}
