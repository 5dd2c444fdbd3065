//! Sessions protected by use, not the clock (`policy.protect_by_use`,
//! `Scheduler::lease_use`): in use they are never preemption victims, idle past
//! their grace they are, used again they are protected again.

mod common;

use allot_fairshare::config::UseProtection;
use allot_fairshare::time::{DAY, HOUR, MINUTE};
use allot_fairshare::{
    Action, LeaseEnd, LeaseId, LeaseUse, PolicyConfig, RevokeWhy, Scheduler, WorkloadId,
    WorkloadSpec, WorkloadState,
};
use common::{job, nodes, revokes, starts, tree};
use proptest::prelude::*;
use std::collections::BTreeMap;

const GRACE: u64 = 30 * MINUTE;

fn policy() -> PolicyConfig {
    PolicyConfig {
        protect_by_use: [(
            "interactive".to_string(),
            UseProtection { idle_grace: GRACE },
        )]
        .into(),
        ..PolicyConfig::default()
    }
}

fn session(project: &str, gpus: u32, min_runtime: u64) -> WorkloadSpec {
    WorkloadSpec {
        class: "interactive".into(),
        ..job(project, gpus, min_runtime)
    }
}

/// x's 8-GPU session has run alone for three days on one node (x is over-served,
/// past its 8 h min runtime); y asks for 3 GPUs at `t`.
fn hog() -> (Scheduler, LeaseId) {
    let t = tree(&[("x", None, 1.0), ("y", None, 1.0)]);
    let mut s = Scheduler::new(policy(), t, nodes("c", 1, 8)).expect("scheduler");
    let w = s.submit(0, session("x", 8, 8 * HOUR)).expect("submits");
    let d = s.schedule(0);
    assert_eq!(starts(&d).len(), 1);
    let l = s.workload(w).and_then(|w| w.lease).expect("runs");
    (s, l)
}

const T: u64 = 3 * DAY;

#[test]
fn an_in_use_session_past_its_min_runtime_is_never_a_victim() {
    let (mut s, l) = hog();
    s.lease_use(10 * MINUTE, l, None).unwrap();
    s.submit(T, job("y", 3, HOUR)).unwrap();
    for now in [T, T + HOUR, T + DAY] {
        let d = s.schedule(now);
        assert!(revokes(&d).is_empty(), "{:?}", d.actions);
    }
    assert_eq!(s.lease(l).unwrap().used, Some(LeaseUse::InUse));
    assert_eq!(s.lease(l).unwrap().preemptible_at, u64::MAX);
}

#[test]
fn an_idle_session_past_its_grace_is_taken() {
    let (mut s, l) = hog();
    s.lease_use(T - HOUR + 20 * MINUTE, l, Some(T - HOUR))
        .unwrap();
    s.submit(T, job("y", 3, HOUR)).unwrap();
    let d = s.schedule(T);
    assert_eq!(revokes(&d), vec![(l, T)], "{:?}", d.actions);
}

#[test]
fn an_idle_session_within_its_grace_waits_and_the_shell_is_woken_at_its_end() {
    let (mut s, l) = hog();
    let idle = T - 10 * MINUTE;
    s.lease_use(T, l, Some(idle)).unwrap();
    s.submit(T, job("y", 3, HOUR)).unwrap();
    let d = s.schedule(T);
    assert!(revokes(&d).is_empty(), "{:?}", d.actions);
    assert_eq!(
        d.next_wakeup,
        Some(idle + GRACE),
        "woken when the grace ends"
    );
    let d = s.schedule(idle + GRACE);
    assert_eq!(revokes(&d).len(), 1, "{:?}", d.actions);
}

#[test]
fn a_session_used_again_is_protected_again() {
    let (mut s, l) = hog();
    s.lease_use(T - 2 * HOUR, l, Some(T - 2 * HOUR)).unwrap();
    s.lease_use(T - MINUTE, l, None).unwrap();
    s.submit(T, job("y", 3, HOUR)).unwrap();
    let d = s.schedule(T);
    assert!(revokes(&d).is_empty(), "{:?}", d.actions);
    // Idle again: protected for the grace from the new idle time.
    s.lease_use(T + 20 * MINUTE, l, Some(T)).unwrap();
    let d = s.schedule(T + 20 * MINUTE);
    assert!(revokes(&d).is_empty(), "{:?}", d.actions);
    assert_eq!(d.next_wakeup, Some(T + GRACE));
    assert_eq!(revokes(&s.schedule(T + GRACE)).len(), 1);
}

#[test]
fn the_min_runtime_still_protects_an_idle_session_from_its_start() {
    let (mut s, l) = hog();
    // Idle from the first minute: its 8 h still protect it.
    s.lease_use(MINUTE, l, Some(0)).unwrap();
    s.submit(HOUR, job("y", 3, HOUR)).unwrap();
    let d = s.schedule(HOUR);
    assert!(revokes(&d).is_empty(), "{:?}", d.actions);
    assert_eq!(s.lease(l).unwrap().preemptible_at, 8 * HOUR);
}

#[test]
fn other_classes_ignore_use_and_unknown_leases_are_errors() {
    let (mut s, _) = hog();
    assert!(s.lease_use(T, LeaseId(999), None).is_err());
    // Not a class protected by use: the report is ignored, the clock decides.
    let t = tree(&[("x", None, 1.0), ("y", None, 1.0)]);
    let mut s = Scheduler::new(policy(), t, nodes("c", 1, 8)).unwrap();
    let w = s.submit(0, job("x", 8, 8 * HOUR)).unwrap();
    s.schedule(0);
    let l = s.workload(w).and_then(|w| w.lease).unwrap();
    s.lease_use(MINUTE, l, None).unwrap();
    assert_eq!(s.lease(l).unwrap().used, None);
    s.submit(T, job("y", 3, HOUR)).unwrap();
    assert_eq!(revokes(&s.schedule(T)).len(), 1);
}

#[test]
fn use_survives_a_rebuild_from_facts() {
    let (mut s, l) = hog();
    s.lease_use(MINUTE, l, None).unwrap();
    let f = s.facts();
    let json = serde_json::to_string(&f).unwrap();
    let f: allot_fairshare::scheduler::Facts = serde_json::from_str(&json).unwrap();
    let mut r = Scheduler::from_facts(policy(), s.tree().clone(), &f).unwrap();
    assert_eq!(r.lease(l).unwrap().used, Some(LeaseUse::InUse));
    r.submit(T, job("y", 3, HOUR)).unwrap();
    assert!(revokes(&r.schedule(T)).is_empty());
    // Idle reported after the rebuild: taken once the grace ends.
    r.lease_use(T, l, Some(T - GRACE)).unwrap();
    assert_eq!(revokes(&r.schedule(T)).len(), 1);
}

#[test]
fn idle_grace_reads_from_the_config_and_names_bad_classes() {
    let p: PolicyConfig =
        serde_json::from_str(r#"{"protect_by_use": {"interactive": {"idle_grace": "30m"}}}"#)
            .unwrap();
    assert_eq!(p.idle_grace("interactive"), Some(GRACE));
    assert_eq!(p.idle_grace("batch"), None);
    assert!(p.validate().is_ok());
    let p: PolicyConfig =
        serde_json::from_str(r#"{"protect_by_use": {"gpu": {"idle_grace": 60}}}"#).unwrap();
    assert!(p.validate().unwrap_err().contains("protect_by_use.gpu"));
}

#[derive(Debug, Clone)]
enum Op {
    Session(u8, u32),
    Batch(u8, u32),
    Use(u8, Option<u16>),
    End(u8),
    Pass,
}

fn ops() -> impl Strategy<Value = Vec<(u16, Op)>> {
    let op = prop_oneof![
        (0u8..2, 1u32..5).prop_map(|(p, g)| Op::Session(p, g)),
        (0u8..2, 1u32..9).prop_map(|(p, g)| Op::Batch(p, g)),
        (any::<u8>(), proptest::option::of(0u16..120)).prop_map(|(l, i)| Op::Use(l, i)),
        any::<u8>().prop_map(Op::End),
        Just(Op::Pass),
    ];
    proptest::collection::vec((1u16..120, op), 1..80)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]
    /// Over random submissions, use reports, ends and passes, a lease of a class
    /// protected by use whose last report says in use is never revoked for
    /// rebalancing or a reservation.
    #[test]
    fn an_in_use_session_is_never_revoked_by_preemption(ops in ops()) {
        let t = tree(&[("x", None, 1.0), ("y", None, 1.0)]);
        let mut s = Scheduler::new(policy(), t, nodes("c", 2, 8)).unwrap();
        let projects = ["x", "y"];
        let mut now = 0;
        let mut in_use: BTreeMap<LeaseId, bool> = BTreeMap::new();
        let mut sessions: BTreeMap<WorkloadId, ()> = BTreeMap::new();
        for (dt, op) in ops {
            now += u64::from(dt) * MINUTE;
            match op {
                Op::Session(p, g) => {
                    let w = s.submit(now, session(projects[p as usize], g, 20 * MINUTE)).unwrap();
                    sessions.insert(w, ());
                }
                Op::Batch(p, g) => {
                    s.submit(now, job(projects[p as usize], g, 10 * MINUTE)).unwrap();
                }
                Op::Use(k, idle) => {
                    let live: Vec<LeaseId> = in_use.keys().copied().collect();
                    if !live.is_empty() {
                        let l = live[k as usize % live.len()];
                        let idle = idle.map(|m| now.saturating_sub(u64::from(m) * MINUTE));
                        s.lease_use(now, l, idle).unwrap();
                        in_use.insert(l, idle.is_none());
                    }
                }
                Op::End(k) => {
                    let live: Vec<LeaseId> = s.leases().map(|l| l.id).collect();
                    if !live.is_empty() {
                        let l = live[k as usize % live.len()];
                        s.lease_ended(now, l, LeaseEnd::Completed).unwrap();
                        in_use.remove(&l);
                    }
                }
                Op::Pass => {}
            }
            let d = s.schedule(now);
            for a in &d.actions {
                match a {
                    Action::Start { lease, workload, .. } if sessions.contains_key(workload) => {
                        // The agent reports a new session in use at once.
                        s.lease_use(now, *lease, None).unwrap();
                        in_use.insert(*lease, true);
                    }
                    Action::Revoke { lease, why, .. } => {
                        let taken = matches!(
                            why,
                            RevokeWhy::Preempted { .. } | RevokeWhy::Reservation { .. }
                        );
                        prop_assert!(
                            !(taken && in_use.get(lease) == Some(&true)),
                            "in-use session {lease:?} revoked: {why:?}"
                        );
                    }
                    _ => {}
                }
            }
            // Revoked leases end before the next step, as the shell would report.
            let revoked: Vec<LeaseId> =
                s.leases().filter(|l| l.revoke.is_some()).map(|l| l.id).collect();
            for l in revoked {
                let st = s.lease_ended(now, l, LeaseEnd::Revoked).unwrap();
                prop_assert!(st != WorkloadState::Running);
                in_use.remove(&l);
            }
        }
    }
}

#[test]
fn an_in_use_session_with_a_time_limit_frees_at_its_limit_for_reservations() {
    let t = tree(&[("x", None, 1.0), ("y", None, 1.0)]);
    let mut s = Scheduler::new(policy(), t, nodes("c", 1, 8)).unwrap();
    let spec = WorkloadSpec {
        time_limit: Some(8 * HOUR),
        ..session("x", 2, HOUR)
    };
    let w = s.submit(0, spec).unwrap();
    s.schedule(0);
    let l = s.workload(w).and_then(|w| w.lease).unwrap();
    s.lease_use(MINUTE, l, None).unwrap();
    // Protected until it ends anyway: its time limit.
    assert_eq!(s.lease(l).unwrap().preemptible_at, 8 * HOUR);
    s.lease_use(2 * HOUR, l, Some(HOUR + 50 * MINUTE)).unwrap();
    assert_eq!(
        s.lease(l).unwrap().preemptible_at,
        HOUR + 50 * MINUTE + GRACE
    );
}
