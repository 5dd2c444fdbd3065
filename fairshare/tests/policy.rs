//! Behaviour of the core, one rule per test: funding, preemption, contracts, gangs,
//! reservations, draining, wake-ups, explanations and input errors.

mod common;

use allot_fairshare::time::{DAY, HOUR, MINUTE};
use allot_fairshare::{
    Action, Blocked, CoreError, LeaseEnd, NodeId, NodeState, PolicyConfig, RevokeWhy, Scheduler,
    WorkloadState,
};
use common::{gang, job, nodes, reserves, revokes, sched, starts, tree};

fn two_teams() -> allot_fairshare::OrgTree {
    tree(&[("x", None, 1.0), ("y", None, 1.0)])
}

fn lease_of(s: &Scheduler, w: allot_fairshare::WorkloadId) -> allot_fairshare::LeaseId {
    s.workload(w).and_then(|w| w.lease).expect("running")
}

#[test]
fn single_node_work_is_packed_best_fit() {
    let mut s = sched(two_teams(), nodes("c", 3, 8));
    let a = s.submit(0, job("x", 6, HOUR)).unwrap();
    let b = s.submit(0, job("y", 4, HOUR)).unwrap();
    s.schedule(0);
    let c = s.submit(1, job("x", 2, HOUR)).unwrap();
    s.schedule(1);
    // The 2-GPU job goes where exactly 2 are left (beside the 6), keeping a node whole.
    let node_of = |w| s.lease(lease_of(&s, w)).unwrap().placement[0].node;
    assert_eq!(node_of(c), node_of(a));
    assert_ne!(node_of(b), node_of(a));
    assert_eq!(s.cluster().most_whole_free(), 1);
}

#[test]
fn one_burst_cannot_take_everything() {
    // Both projects submit 16 one-GPU jobs at once on 16 free GPUs: the pass charges
    // each start to its project at once, so they interleave instead of the first
    // project in tree order taking all 16.
    let mut s = sched(two_teams(), nodes("c", 2, 8));
    let mut ids = Vec::new();
    for _ in 0..16 {
        ids.push(("x", s.submit(0, job("x", 1, HOUR)).unwrap()));
        ids.push(("y", s.submit(0, job("y", 1, HOUR)).unwrap()));
    }
    let d = s.schedule(0);
    let started = starts(&d);
    assert_eq!(started.len(), 16);
    let xs = started
        .iter()
        .filter(|(w, _, _)| ids.iter().any(|(p, id)| id == w && *p == "x"))
        .count();
    assert_eq!(xs, 8, "x got {xs} of 16");
}

#[test]
fn funded_work_preempts_unfunded_and_the_victim_is_requeued_in_place() {
    let mut s = sched(two_teams(), nodes("c", 1, 8));
    let free = s.submit(0, job("x", 8, 0)).unwrap();
    let d = s.schedule(0);
    assert_eq!(
        starts(&d),
        vec![(free, lease_of(&s, free), false)],
        "min_runtime 0 is unfunded"
    );
    let funded = s.submit(10, job("y", 4, HOUR)).unwrap();
    let d = s.schedule(10);
    let victim = lease_of(&s, free);
    assert_eq!(revokes(&d), vec![(victim, 10)]);
    match &d.actions[0] {
        Action::Revoke {
            why: RevokeWhy::Preempted { by, unfunded, .. },
            ..
        } => assert_eq!((*by, *unfunded), (funded, true)),
        other => panic!("expected a preemption, got {other:?}"),
    }
    // Nothing else may take the claimed GPUs while the victim checkpoints.
    let sneaky = s.submit(20, job("x", 4, HOUR)).unwrap();
    assert!(starts(&s.schedule(20)).is_empty());
    assert_eq!(
        s.lease_ended(70, victim, LeaseEnd::Revoked).unwrap(),
        WorkloadState::Pending
    );
    let d = s.schedule(70);
    let started: Vec<_> = starts(&d).into_iter().map(|x| x.0).collect();
    assert_eq!(started[0], funded, "the claimant starts first");
    assert!(started.contains(&sneaky), "then the rest fits");
    let w = s.workload(free).unwrap();
    assert_eq!(
        (w.state, w.submit, w.preemptions),
        (WorkloadState::Pending, 0, 1)
    );
}

#[test]
fn protected_leases_wait_out_their_min_runtime() {
    let mut s = sched(two_teams(), nodes("c", 1, 8));
    // x runs alone for three days, building history.
    let hog = s.submit(0, job("x", 8, 8 * HOUR)).unwrap();
    s.schedule(0);
    let t = 3 * DAY;
    // 3 GPUs: the 8-GPU lease loses 80 GPU-minutes, within 3 × max_loss_per_gpu.
    let y = s.submit(t, job("y", 3, HOUR)).unwrap();
    let d = s.schedule(t);
    // Past its 8 h, x is over-served, so y may take GPUs from it.
    assert_eq!(revokes(&d).len(), 1);
    let _ = y;
    // A fresh protected lease is another matter.
    let mut s = sched(two_teams(), nodes("c", 1, 8));
    let hog = {
        let _ = hog;
        s.submit(0, job("x", 8, 8 * HOUR)).unwrap()
    };
    s.schedule(0);
    s.submit(HOUR, job("y", 1, HOUR)).unwrap();
    let d = s.schedule(HOUR);
    assert!(revokes(&d).is_empty(), "protected for 8 h");
    assert_eq!(
        d.next_wakeup,
        Some(8 * HOUR),
        "woken at the lapse, not later"
    );
    assert_eq!(
        s.workload(hog).unwrap().state,
        WorkloadState::Running,
        "still running"
    );
}

#[test]
fn funded_victims_only_from_better_served_groups() {
    // y has run for three days too: both are equally served, so neither preempts.
    let mut s = sched(two_teams(), nodes("c", 2, 8));
    let xh = s.submit(0, job("x", 8, HOUR)).unwrap();
    let yh = s.submit(0, job("y", 8, HOUR)).unwrap();
    s.schedule(0);
    let t = 3 * DAY;
    s.submit(t, job("y", 8, HOUR)).unwrap();
    s.submit(t, job("x", 8, HOUR)).unwrap();
    let d = s.schedule(t);
    assert!(revokes(&d).is_empty(), "{:?}", d.actions);
    let (bx, by) = (s.workload(xh).unwrap().state, s.workload(yh).unwrap().state);
    assert_eq!((bx, by), (WorkloadState::Running, WorkloadState::Running));
    let pending_reason = s
        .explain(t)
        .into_iter()
        .map(|e| e.blocked)
        .collect::<Vec<_>>();
    assert!(
        pending_reason.contains(&Blocked::NothingPreemptible),
        "{pending_reason:?}"
    );
}

#[test]
fn budget_spent_runs_unfunded() {
    // x's budget over the 7-day window is half the cluster: 4 GPUs × 7 days. Running 8
    // GPUs for 3.5 days spends it.
    let mut s = sched(two_teams(), nodes("c", 1, 8));
    let a = s.submit(0, job("x", 8, HOUR)).unwrap();
    s.schedule(0);
    let half = 7 * DAY / 2;
    s.lease_ended(half, lease_of(&s, a), LeaseEnd::Completed)
        .unwrap();
    let gx = s.tree().find("x").unwrap();
    assert!(s.budget_spent(gx, half));
    let b = s.submit(half, job("x", 8, HOUR)).unwrap();
    let d = s.schedule(half);
    assert_eq!(starts(&d), vec![(b, lease_of(&s, b), false)]);
    // y's funded work may now take x's GPUs at once (3 GPUs: the lease's 80
    // GPU-minutes lost are within y's loss bound).
    s.submit(half + 1, job("y", 3, HOUR)).unwrap();
    let d = s.schedule(half + 1);
    assert_eq!(revokes(&d), vec![(lease_of(&s, b), half + 1)]);
}

#[test]
fn gangs_start_whole_or_not_at_all_and_reserve_nodes() {
    let mut s = sched(two_teams(), nodes("c", 3, 8));
    let small = s.submit(0, job("x", 1, 2 * HOUR)).unwrap();
    s.schedule(0);
    // Two whole nodes are free: a 2-node gang starts on both; a 3-node one cannot.
    let g2 = s.submit(1, gang("y", 2, 8, HOUR)).unwrap();
    let g3 = s.submit(1, gang("y", 3, 8, HOUR)).unwrap();
    let d = s.schedule(1);
    let st = starts(&d);
    assert_eq!(st.len(), 1);
    assert_eq!(st[0].0, g2);
    let l = s.lease(st[0].1).unwrap();
    assert_eq!(l.placement.len(), 2);
    assert!(l.placement.iter().all(|p| p.gpus.count_ones() == 8));
    assert_ne!(l.placement[0].node, l.placement[1].node);
    // The 3-node gang gets a reservation ending when the protected leases lapse.
    let reserved = d.actions.iter().find_map(|a| match a {
        Action::Reserve {
            workload,
            start,
            nodes,
        } => Some((*workload, *start, nodes.len())),
        _ => None,
    });
    assert_eq!(reserved, Some((g3, 2 * HOUR, 3)));
    assert_eq!(s.workload(g3).unwrap().state, WorkloadState::Pending);
    assert_eq!(s.workload(small).unwrap().state, WorkloadState::Running);
}

#[test]
fn backfill_only_what_leaves_before_the_reservation() {
    let mut s = sched(two_teams(), nodes("c", 2, 8));
    let hold = s.submit(0, job("x", 4, 2 * HOUR)).unwrap();
    s.schedule(0);
    let g = s.submit(1, gang("y", 2, 8, HOUR)).unwrap();
    let d = s.schedule(1);
    assert!(d
        .actions
        .iter()
        .any(|a| matches!(a, Action::Reserve { workload, .. } if *workload == g)));
    // A protected 4 h job would still be protected at the reservation start: refused.
    let long = s.submit(2, job("x", 2, 4 * HOUR)).unwrap();
    // A 30-minute protected job leaves in time: it may backfill.
    let short = s.submit(2, job("x", 2, 30 * MINUTE)).unwrap();
    // Unfunded work is preemptible at any time: it may backfill too.
    let free = s.submit(2, job("x", 2, 0)).unwrap();
    let d = s.schedule(2);
    let started: Vec<_> = starts(&d).into_iter().map(|x| x.0).collect();
    assert!(
        started.contains(&short) && started.contains(&free),
        "{started:?}"
    );
    assert!(!started.contains(&long));
    // At the reservation start the gang reclaims its nodes.
    let d = s.schedule(2 * HOUR);
    let revoked: Vec<_> = revokes(&d).into_iter().map(|x| x.0).collect();
    assert!(revoked.contains(&lease_of(&s, hold)));
    assert!(revoked.contains(&lease_of(&s, free)));
    assert!(revoked.contains(&lease_of(&s, short)));
    for l in revoked {
        s.lease_ended(2 * HOUR + 60, l, LeaseEnd::Revoked).unwrap();
    }
    let d = s.schedule(2 * HOUR + 60);
    assert_eq!(starts(&d)[0].0, g);
}

#[test]
fn backfill_by_prediction_keeps_a_run_predicted_to_outlast_the_reservation_off_its_nodes() {
    for by_prediction in [false, true] {
        let cfg = allot_fairshare::PolicyConfig {
            backfill_by_prediction: by_prediction,
            ..Default::default()
        };
        let mut s = Scheduler::new(cfg, two_teams(), nodes("c", 2, 8)).unwrap();
        // Its user's last two runs of class `long` lasted 5 h each.
        let long = || allot_fairshare::WorkloadSpec {
            class: "long".into(),
            ..job("x", 2, 30 * MINUTE)
        };
        for k in 0..2 {
            let w = s.submit(k * 5 * HOUR, long()).unwrap();
            s.schedule(k * 5 * HOUR);
            s.lease_ended((k + 1) * 5 * HOUR, lease_of(&s, w), LeaseEnd::Completed)
                .unwrap();
        }
        let t = 10 * HOUR;
        s.submit(t, job("x", 4, 2 * HOUR)).unwrap();
        s.schedule(t);
        let g = s.submit(t + 1, gang("y", 2, 8, HOUR)).unwrap();
        let d = s.schedule(t + 1);
        assert!(d
            .actions
            .iter()
            .any(|a| matches!(a, Action::Reserve { workload, start, .. }
                if *workload == g && *start == t + 2 * HOUR)));
        // Both pass their protection (30 min) before the reservation starts (2 h);
        // the `long` one is predicted to run 5 h, the other has no runs to go by.
        let predicted_long = s.submit(t + 2, long()).unwrap();
        let unknown = s.submit(t + 2, job("x", 2, 30 * MINUTE)).unwrap();
        let started: Vec<_> = starts(&s.schedule(t + 2))
            .into_iter()
            .map(|x| x.0)
            .collect();
        assert!(started.contains(&unknown), "{by_prediction}: {started:?}");
        assert_eq!(
            started.contains(&predicted_long),
            !by_prediction,
            "by_prediction = {by_prediction}: {started:?}"
        );
    }
}

#[test]
fn draining_revokes_at_the_lapse_and_drain_now_at_once() {
    let mut s = sched(two_teams(), nodes("c", 2, 8));
    let p = s.submit(0, job("x", 8, 8 * HOUR)).unwrap();
    let f = s.submit(0, job("y", 8, 0)).unwrap();
    s.schedule(0);
    let (lp, lf) = (lease_of(&s, p), lease_of(&s, f));
    let np = s.lease(lp).unwrap().placement[0].node;
    let nf = s.lease(lf).unwrap().placement[0].node;
    s.set_node_state(HOUR, np, NodeState::Draining).unwrap();
    s.set_node_state(HOUR, nf, NodeState::Draining).unwrap();
    let d = s.schedule(HOUR);
    let mut r = revokes(&d);
    r.sort();
    let mut want = vec![(lp, 8 * HOUR), (lf, HOUR)];
    want.sort();
    assert_eq!(r, want);
    // No new lease on a draining node.
    s.submit(HOUR, job("x", 1, HOUR)).unwrap();
    assert!(starts(&s.schedule(HOUR)).is_empty());
    // drain-now pulls the protected lease's revocation forward.
    s.set_node_state(2 * HOUR, np, NodeState::DrainNow).unwrap();
    let d = s.schedule(2 * HOUR);
    assert_eq!(revokes(&d), vec![(lp, 2 * HOUR)]);
}

#[test]
fn unhealthy_gpus_take_no_leases() {
    let mut s = sched(two_teams(), nodes("c", 1, 8));
    s.set_gpu_health(NodeId(0), 3, false).unwrap();
    let w = s.submit(0, job("x", 8, HOUR)).unwrap();
    assert!(starts(&s.schedule(0)).is_empty());
    let a = s.submit(0, job("x", 7, HOUR)).unwrap();
    s.schedule(0);
    let l = s.lease(lease_of(&s, a)).unwrap();
    assert_eq!(l.placement[0].gpus & (1 << 3), 0);
    assert_eq!(s.workload(w).unwrap().state, WorkloadState::Pending);
}

#[test]
fn cancel_pending_and_running() {
    let mut s = sched(two_teams(), nodes("c", 1, 8));
    let r = s.submit(0, job("x", 8, HOUR)).unwrap();
    let p = s.submit(0, job("x", 8, HOUR)).unwrap();
    s.schedule(0);
    s.cancel(1, p).unwrap();
    assert_eq!(s.workload(p).unwrap().state, WorkloadState::Cancelled);
    assert_eq!(s.pending_len(), 0);
    s.cancel(1, r).unwrap();
    let d = s.schedule(1);
    assert_eq!(
        revokes(&d),
        vec![(lease_of(&s, r), 1)],
        "cancel revokes at once"
    );
    let st = s
        .lease_ended(2, lease_of(&s, r), LeaseEnd::Revoked)
        .unwrap();
    assert_eq!(
        st,
        WorkloadState::Cancelled,
        "not requeued although resumable"
    );
    assert!(matches!(s.cancel(3, r), Err(CoreError::AlreadyEnded(_))));
}

#[test]
fn priority_and_aging_order_a_project() {
    let mut s = sched(two_teams(), nodes("c", 1, 1));
    let blocker = s.submit(0, job("x", 1, HOUR)).unwrap();
    s.schedule(0);
    let old_low = s.submit(0, job("x", 1, HOUR)).unwrap();
    let mut hi = job("x", 1, HOUR);
    hi.priority = 10;
    let new_high = s.submit(HOUR, hi).unwrap();
    s.lease_ended(HOUR, lease_of(&s, blocker), LeaseEnd::Completed)
        .unwrap();
    // Priority 10 beats one hour of aging.
    assert_eq!(starts(&s.schedule(HOUR))[0].0, new_high);
    let _ = old_low;
    // Thirty hours of waiting lifts work to the top of its band of 10, never into the
    // next: priority 0 rises over a fresh 5 (to 9), never over a fresh 10; priority 5
    // rises to 9, not to 5 + 24, so never over 10 either. With no bands the cap of 24
    // alone lifts 0 over 10 (and 5 over 20).
    for (band, old_prio, fresh_prio, old_first) in [
        (10, 0, 5, true),
        (10, 0, 10, false),
        (10, 5, 10, false),
        (10, 10, 15, true),
        (10, 10, 20, false),
        (0, 0, 10, true),
        (0, 5, 20, true),
    ] {
        let cfg = PolicyConfig {
            priority_band: band,
            ..PolicyConfig::default()
        };
        let mut s = Scheduler::new(cfg, two_teams(), nodes("c", 1, 1)).unwrap();
        let blocker = s.submit(0, job("x", 1, HOUR)).unwrap();
        s.schedule(0);
        let mut old = job("x", 1, HOUR);
        old.priority = old_prio;
        let old = s.submit(0, old).unwrap();
        let mut hi = job("x", 1, HOUR);
        hi.priority = fresh_prio;
        let fresh = s.submit(30 * HOUR, hi).unwrap();
        s.lease_ended(30 * HOUR, lease_of(&s, blocker), LeaseEnd::Completed)
            .unwrap();
        let first = starts(&s.schedule(30 * HOUR))[0].0;
        assert_eq!(
            first,
            if old_first { old } else { fresh },
            "band {band}: aged {old_prio} against fresh {fresh_prio}"
        );
    }
}

#[test]
fn explanations_name_the_ratio_and_the_obstacle() {
    let mut s = sched(two_teams(), nodes("c", 1, 8));
    s.submit(0, job("x", 8, 2 * HOUR)).unwrap();
    s.schedule(0);
    s.submit(60, job("y", 4, HOUR)).unwrap();
    s.schedule(60);
    let e = s.explain(60);
    assert_eq!(e.len(), 1);
    assert!(
        e[0].text.starts_with("project y is served 0.00× its share"),
        "{}",
        e[0].text
    );
    assert!(
        e[0].text
            .contains("needs 4 GPUs on one node, the most free is 0"),
        "{}",
        e[0].text
    );
    assert!(
        e[0].text
            .contains("1 lease is within its min runtime, which lapses in 1h59m"),
        "{}",
        e[0].text
    );
}

#[test]
fn explanations_call_the_cooldown_a_cooldown_not_protection() {
    // y's 10-minute job displaces x's unfunded work: once its 10 minutes are up it is
    // held by the preemption cooldown (30 min), not by its contract.
    let mut s = sched(two_teams(), nodes("c", 1, 8));
    let free = s.submit(0, job("x", 8, 0)).unwrap();
    s.schedule(0);
    let y = s.submit(10, job("y", 8, 10 * MINUTE)).unwrap();
    s.schedule(10);
    s.lease_ended(70, lease_of(&s, free), LeaseEnd::Revoked)
        .unwrap();
    assert_eq!(starts(&s.schedule(70))[0].0, y);
    let e = s.explain(80);
    assert!(
        e[0].text
            .contains("; 1 lease is within its min runtime, which lapses in 9m50s"),
        "{}",
        e[0].text
    );
    assert!(!e[0].text.contains("cooldown"), "{}", e[0].text);
    let later = 70 + 20 * MINUTE;
    let e = s.explain(later);
    assert_eq!((e[0].protected_leases, e[0].cooling_leases), (0, 1));
    assert!(
        e[0].text
            .contains("; 1 lease is in the preemption cooldown, which ends in 10m"),
        "{}",
        e[0].text
    );
    assert!(!e[0].text.contains("min runtime"), "{}", e[0].text);
}

#[test]
fn drf_counts_the_dominant_resource() {
    let cfg = PolicyConfig {
        drf: true,
        ..PolicyConfig::default()
    };
    let mut s = Scheduler::new(cfg, two_teams(), nodes("c", 1, 8)).unwrap();
    let mut cpu_heavy = job("x", 1, HOUR);
    cpu_heavy.cpu_per_node = 96; // 1/8 of the GPUs, 3/4 of the CPUs
    s.submit(0, cpu_heavy).unwrap();
    s.submit(0, job("y", 1, HOUR)).unwrap();
    s.schedule(0);
    let r = s.group_ratios(HOUR);
    let (gx, gy) = (s.tree().find("x").unwrap(), s.tree().find("y").unwrap());
    assert!((r[gx.idx()] / r[gy.idx()] - 6.0).abs() < 1e-9, "{r:?}");
    // Without DRF the two are equal.
    let mut s = sched(two_teams(), nodes("c", 1, 8));
    let mut cpu_heavy = job("x", 1, HOUR);
    cpu_heavy.cpu_per_node = 96;
    s.submit(0, cpu_heavy).unwrap();
    s.submit(0, job("y", 1, HOUR)).unwrap();
    s.schedule(0);
    let r = s.group_ratios(HOUR);
    assert_eq!(r[gx.idx()], r[gy.idx()]);
}

#[test]
fn submissions_that_can_never_fit_are_refused_with_the_field() {
    let mut s = sched(two_teams(), nodes("c", 2, 8));
    let e = s.submit(0, job("nope", 1, 0)).unwrap_err();
    assert!(e.to_string().contains("\"nope\""), "{e}");
    let e = s.submit(0, job("x", 9, 0)).unwrap_err();
    assert!(e.to_string().starts_with("gpus_per_node = 9"), "{e}");
    let e = s.submit(0, gang("x", 3, 8, 0)).unwrap_err();
    assert!(e.to_string().starts_with("nodes = 3"), "{e}");
    let t = tree(&[("team", None, 1.0), ("proj", Some("team"), 1.0)]);
    let mut s = sched(t, nodes("c", 1, 8));
    let e = s.submit(0, job("team", 1, 0)).unwrap_err();
    assert!(
        matches!(e, CoreError::UnknownProject(_)),
        "teams are not charged: {e}"
    );
}

/// A day's window for budgets, four for ranking (`ranking_lookback`; 0: one window).
fn ranking_cfg(ranking_lookback: u64) -> PolicyConfig {
    PolicyConfig {
        lookback: DAY,
        ranking_lookback,
        allocation_horizon: 1,
        ..PolicyConfig::default()
    }
}

/// x runs the only node funded for a day; two days later x and y each ask for it.
/// Returns the scheduler and who started.
fn after_x_ran_a_day(ranking_lookback: u64) -> (Scheduler, &'static str) {
    let mut s = Scheduler::new(ranking_cfg(ranking_lookback), two_teams(), nodes("c", 1, 8))
        .expect("valid");
    let a = s.submit(0, job("x", 8, HOUR)).expect("submitted");
    s.schedule(0);
    s.lease_ended(DAY, lease_of(&s, a), LeaseEnd::Completed)
        .expect("ended");
    let x = s.submit(2 * DAY, job("x", 8, 0)).expect("submitted");
    let y = s.submit(2 * DAY, job("y", 8, 0)).expect("submitted");
    let started = starts(&s.schedule(2 * DAY));
    assert_eq!(started.len(), 1, "one node");
    let who = if started[0].0 == x {
        "x"
    } else {
        assert_eq!(started[0].0, y);
        "y"
    };
    (s, who)
}

#[test]
fn the_ranking_remembers_past_the_budget_window() {
    // One window: x's day is forgotten, the two tie and the tree's order decides.
    assert_eq!(after_x_ran_a_day(0).1, "x");
    // Four days of ranking memory: x is still better served, so y goes first …
    let (s, who) = after_x_ran_a_day(4 * DAY);
    assert_eq!(who, "y");
    let gx = s.tree().find("x").unwrap();
    assert!(s.group_ratios(2 * DAY)[gx.idx()] > 0.0);
    // … while x's budget, a day's window, is whole again: its day of funded work no
    // longer counts against it.
    assert!(s.budget_spent(gx, DAY));
    assert!(!s.budget_spent(gx, 2 * DAY));
    assert_eq!(
        s.usage_gpu_secs(gx, 2 * DAY),
        0.0,
        "received: the budget's window"
    );
}

#[test]
fn a_snapshot_keeps_the_rankings_memory() {
    let (mut s, _) = after_x_ran_a_day(4 * DAY);
    let gx = s.tree().find("x").unwrap();
    // y's run ends and x's starts: past its day-long window, the budget's record of x
    // drops the day x ran, the ranking's keeps it.
    let now = 2 * DAY + HOUR;
    let y_run = s.leases().next().map(|l| l.id).expect("y runs");
    s.lease_ended(now, y_run, LeaseEnd::Completed).unwrap();
    assert_eq!(starts(&s.schedule(now)).len(), 1, "x starts");
    let facts = s.facts();
    assert!(!facts.ranking_usage.is_empty());
    let back = Scheduler::from_facts(ranking_cfg(4 * DAY), two_teams(), &facts).unwrap();
    assert_eq!(back.group_ratios(now), s.group_ratios(now));
    // A snapshot kept before the setting: the memory starts from the budget's record,
    // which no longer holds x's day.
    let mut older = facts.clone();
    older.ranking_usage.clear();
    let fresh = Scheduler::from_facts(ranking_cfg(4 * DAY), two_teams(), &older).unwrap();
    let (remembered, forgot) = (
        s.group_ratios(now)[gx.idx()],
        fresh.group_ratios(now)[gx.idx()],
    );
    assert!(remembered > 0.9, "{remembered}");
    assert!(forgot < 0.1, "{forgot}");
}

#[test]
fn a_too_short_ranking_lookback_is_refused_naming_the_field() {
    let e = Scheduler::new(ranking_cfg(60), two_teams(), nodes("c", 1, 8)).unwrap_err();
    assert!(e.to_string().contains("policy.ranking_lookback"), "{e}");
}

#[test]
fn half_life_usage_decays() {
    let cfg = PolicyConfig {
        usage_model: allot_fairshare::config::UsageModelKind::HalfLife,
        lookback: DAY,
        allocation_horizon: 1,
        ..PolicyConfig::default()
    };
    let mut s = Scheduler::new(cfg, two_teams(), nodes("c", 1, 8)).unwrap();
    let a = s.submit(0, job("x", 8, HOUR)).unwrap();
    s.schedule(0);
    s.lease_ended(HOUR, lease_of(&s, a), LeaseEnd::Completed)
        .unwrap();
    let gx = s.tree().find("x").unwrap();
    let u1 = s.usage_gpu_secs(gx, HOUR);
    let u2 = s.usage_gpu_secs(gx, HOUR + DAY);
    assert!((u2 / u1 - 0.5).abs() < 1e-6, "{u1} → {u2}");
    // The ratio's divisor, the decay kernel's weight since usage began, grows over
    // that day as well: the ratio falls by more than half.
    let (r1, r2) = (
        s.group_ratios(HOUR)[gx.idx()],
        s.group_ratios(HOUR + DAY)[gx.idx()],
    );
    assert!(r2 < r1 / 2.0, "{r1} → {r2}");
}

#[test]
fn a_reserved_gang_takes_whole_nodes_that_free_up_elsewhere() {
    let mut s = sched(two_teams(), nodes("c", 4, 8));
    let long = s.submit(0, job("x", 8, 8 * HOUR)).unwrap();
    let short = s.submit(0, job("x", 8, 8 * HOUR)).unwrap();
    let a = s.submit(0, job("x", 8, 8 * HOUR)).unwrap();
    s.schedule(0);
    let g = s.submit(1, gang("y", 2, 8, HOUR)).unwrap();
    let d = s.schedule(1);
    assert!(d
        .actions
        .iter()
        .any(|x| matches!(x, Action::Reserve { .. })));
    // Two leases off the reserved nodes end early: the gang starts there at once.
    let _ = (long, a);
    s.lease_ended(100, lease_of(&s, short), LeaseEnd::Completed)
        .unwrap();
    let reserved: Vec<NodeId> = s.claims()[&g].nodes.iter().map(|p| p.node).collect();
    let other = s
        .leases()
        .find(|l| !reserved.contains(&l.placement[0].node))
        .map(|l| l.id);
    if let Some(l) = other {
        s.lease_ended(100, l, LeaseEnd::Completed).unwrap();
    }
    let d = s.schedule(100);
    assert_eq!(starts(&d).first().map(|x| x.0), Some(g), "{:?}", d.actions);
    assert!(s.claims().is_empty(), "the reservation is released");
}

#[test]
fn a_claim_sets_host_room_aside_too() {
    let mut s = sched(two_teams(), nodes("c", 1, 8));
    let cpu = |mut j: allot_fairshare::WorkloadSpec, c| {
        j.cpu_per_node = c;
        j
    };
    let a = s.submit(0, cpu(job("x", 2, 0), 100)).unwrap();
    s.schedule(0);
    // y needs 110 of the 128 cores: it claims two free GPUs and preempts a for CPU.
    let y = s.submit(1, cpu(job("y", 2, HOUR), 110)).unwrap();
    // h would fit on GPUs nobody claimed, but not beside y's claimed cores.
    let h = s.submit(1, cpu(job("x", 2, 0), 28)).unwrap();
    let d = s.schedule(1);
    assert_eq!(revokes(&d), vec![(lease_of(&s, a), 1)]);
    assert!(starts(&d).is_empty(), "{:?}", d.actions);
    s.lease_ended(2, lease_of(&s, a), LeaseEnd::Revoked)
        .unwrap();
    let d = s.schedule(2);
    let started: Vec<_> = starts(&d).into_iter().map(|x| x.0).collect();
    assert_eq!(started.first(), Some(&y), "{:?}", d.actions);
    assert!(s.claims().is_empty());
    assert_eq!(s.workload(h).unwrap().state, WorkloadState::Pending);
}

#[test]
fn own_project_leases_do_not_block_preemption_on_a_node() {
    let t = tree(&[("x", None, 1.0), ("y", None, 1.0)]);
    let mut s = sched(t, nodes("c", 1, 8));
    let y6 = s.submit(0, job("y", 6, HOUR)).unwrap();
    let x2 = s.submit(0, job("x", 2, HOUR)).unwrap();
    s.schedule(0);
    let _ = x2;
    // Three days on, y's 6 GPUs are well past protection and y is over-served.
    let t = 3 * DAY;
    s.submit(t, job("x", 6, HOUR)).unwrap();
    let d = s.schedule(t);
    assert_eq!(revokes(&d), vec![(lease_of(&s, y6), t)], "{:?}", d.actions);
}

#[test]
fn restarts_after_preemption_get_the_cooldown() {
    let mut s = sched(two_teams(), nodes("c", 1, 8));
    let mut spec = job("x", 8, 10 * MINUTE);
    spec.priority = 0;
    let w = s.submit(0, spec).unwrap();
    s.schedule(0);
    // x over-served for 3 days; y takes its GPUs, x is requeued.
    let t = 3 * DAY;
    s.submit(t, job("y", 8, 10 * MINUTE)).unwrap();
    let d = s.schedule(t);
    assert_eq!(revokes(&d).len(), 1);
    s.lease_ended(t + 60, lease_of(&s, w), LeaseEnd::Revoked)
        .unwrap();
    s.schedule(t + 60);
    let yl = s.leases().next().map(|l| l.id).unwrap();
    s.lease_ended(t + 120, yl, LeaseEnd::Completed).unwrap();
    s.schedule(t + 120);
    let l = s.lease(lease_of(&s, w)).unwrap();
    assert_eq!(
        l.preemptible_at,
        t + 120 + 30 * MINUTE,
        "cooldown, not the 10 min contract"
    );
}

#[test]
fn absurd_contracts_are_refused_not_overflowed() {
    let mut s = sched(two_teams(), nodes("c", 1, 8));
    let e = s.submit(0, job("x", 1, u64::MAX)).unwrap_err();
    assert!(e.to_string().starts_with("min_runtime = "), "{e}");
    let mut j = job("x", 1, HOUR);
    j.time_limit = Some(u64::MAX);
    let e = s.submit(0, j).unwrap_err();
    assert!(e.to_string().starts_with("time_limit = "), "{e}");
}

#[test]
fn time_never_runs_backwards() {
    let mut s = sched(two_teams(), nodes("c", 1, 8));
    let a = s.submit(100, job("x", 8, HOUR)).unwrap();
    s.schedule(100);
    // A late report with an older timestamp is taken as "now", not as the past.
    s.lease_ended(50, lease_of(&s, a), LeaseEnd::Completed)
        .unwrap();
    let gx = s.tree().find("x").unwrap().idx();
    assert!(s.group_ratios(200)[gx] >= 0.0);
    let b = s.submit(10, job("x", 1, HOUR)).unwrap();
    assert_eq!(s.workload(b).unwrap().submit, 100);
}

#[test]
fn a_node_that_joins_later_takes_work_and_gangs() {
    let mut s = sched(two_teams(), nodes("c", 1, 8));
    // Two whole nodes are needed: impossible until a second node joins.
    assert!(s.submit(0, gang("x", 2, 8, HOUR)).is_err());
    let n = s
        .add_node(
            1,
            allot_fairshare::NodeSpec {
                name: "late".into(),
                cluster: "c".into(),
                gpus: 8,
                cpu: 128,
                memory_gb: 2048,
                ..Default::default()
            },
        )
        .unwrap();
    assert!(
        s.add_node(1, nodes("c", 1, 8).remove(0)).is_err(),
        "names are unique"
    );
    let g = s.submit(2, gang("x", 2, 8, HOUR)).unwrap();
    let d = s.schedule(2);
    assert_eq!(starts(&d).len(), 1);
    let placed: Vec<_> = s
        .lease(lease_of(&s, g))
        .unwrap()
        .placement
        .iter()
        .map(|p| p.node)
        .collect();
    assert!(placed.contains(&n), "{placed:?}");
    assert_eq!(s.cluster().total_gpus(), 16);
}

#[test]
fn a_new_weight_changes_shares_and_so_the_ranking() {
    let mut s = sched(two_teams(), nodes("c", 1, 8));
    let share = |s: &Scheduler, g: &str| s.tree().group(s.tree().find(g).unwrap()).share;
    assert_eq!(share(&s, "x"), 0.5);
    s.set_weight("x", 3.0).unwrap();
    assert_eq!(share(&s, "x"), 0.75);
    assert_eq!(share(&s, "y"), 0.25);
    assert!(s.set_weight("nope", 1.0).is_err());
    assert!(s.set_weight("x", -1.0).is_err());
    // 3:1 now: both saturate, x gets 6 of the 8 GPUs.
    for _ in 0..8 {
        s.submit(10, job("x", 1, HOUR)).unwrap();
        s.submit(10, job("y", 1, HOUR)).unwrap();
    }
    let d = s.schedule(10);
    let xs = starts(&d)
        .iter()
        .filter(|(w, _, _)| s.workload(*w).unwrap().spec.project == "x")
        .count();
    assert_eq!(xs, 6, "x got {xs} of 8");
}

/// An unfunded, non-resumable 8-GPU job preempted by funded work: its state after
/// the ladder, and its preemption count.
fn preempt_unresumable(no_requeue: bool) -> (WorkloadState, u32) {
    let mut s = sched(two_teams(), nodes("c", 1, 8));
    let spec = allot_fairshare::WorkloadSpec {
        resumable: false,
        no_requeue,
        ..job("x", 8, 0)
    };
    let victim = s.submit(0, spec).expect("fits");
    s.schedule(0);
    let lease = lease_of(&s, victim);
    s.submit(1, job("y", 8, HOUR)).expect("fits");
    s.schedule(1);
    let next = s
        .lease_ended(70, lease, LeaseEnd::Revoked)
        .expect("a live lease");
    (next, s.workload(victim).expect("known").preemptions)
}

#[test]
fn preempted_work_that_cannot_resume_waits_again_and_is_counted() {
    // Requeued (from scratch) rather than lost, and the preemption is counted.
    assert_eq!(preempt_unresumable(false), (WorkloadState::Pending, 1));
}

#[test]
fn no_requeue_work_ends_preempted_and_is_counted() {
    assert_eq!(preempt_unresumable(true), (WorkloadState::Preempted, 1));
}

#[test]
fn a_refused_start_requeues_and_the_node_is_not_offered_that_size_until_it_changes() {
    let mut s = sched(two_teams(), nodes("c", 2, 8));
    let w = s
        .submit(
            0,
            allot_fairshare::WorkloadSpec {
                resumable: false,
                ..job("x", 4, HOUR)
            },
        )
        .unwrap();
    let d = s.schedule(0);
    let first = starts(&d)[0].1;
    let refusing = s.lease(first).unwrap().placement[0].node;
    assert_eq!(
        s.lease_ended(1, first, LeaseEnd::Refused).unwrap(),
        WorkloadState::Pending,
        "a refusal is the node's fact, not the work's failure"
    );
    assert_eq!(s.workload(w).unwrap().preemptions, 0);
    // The next pass places it on the other node, not back on the refusing one.
    let d = s.schedule(2);
    let second = starts(&d)[0].1;
    assert_ne!(s.lease(second).unwrap().placement[0].node, refusing);
    // That one refuses too: nothing is offered until a node changes (no hot loop).
    let other = s.lease(second).unwrap().placement[0].node;
    s.lease_ended(3, second, LeaseEnd::Refused).unwrap();
    assert!(starts(&s.schedule(4)).is_empty());
    // Smaller work is still offered there.
    let small = s.submit(5, job("y", 2, HOUR)).unwrap();
    let d = s.schedule(5);
    assert!(starts(&d).iter().any(|(id, _, _)| *id == small));
    // Once the node changes (its agent reports anew) it is offered again.
    s.node_changed(other);
    let d = s.schedule(6);
    assert!(starts(&d).iter().any(|(id, _, _)| *id == w));
}

#[test]
fn undraining_before_the_lapse_withdraws_the_drain_revocation() {
    let mut s = sched(two_teams(), nodes("c", 1, 8));
    let w = s.submit(0, job("x", 8, HOUR)).unwrap();
    s.schedule(0);
    let lease = lease_of(&s, w);
    s.set_node_state(10, NodeId(0), NodeState::Draining)
        .unwrap();
    let d = s.schedule(10);
    assert_eq!(revokes(&d).len(), 1, "the drain revokes at the lapse");
    s.set_node_state(20, NodeId(0), NodeState::Ready).unwrap();
    let d = s.schedule(20);
    assert!(
        d.actions
            .iter()
            .any(|a| matches!(a, Action::Withdraw { lease: l, .. } if *l == lease)),
        "{:?}",
        d.actions
    );
    assert!(s.lease(lease).unwrap().revoke.is_none());
    // Past the lapse nothing revokes it: it runs on under its contract.
    let d = s.schedule(HOUR + 10);
    assert!(revokes(&d).is_empty());
    assert_eq!(s.workload(w).unwrap().state, WorkloadState::Running);
}

#[test]
fn oversized_requests_name_the_field_and_the_fix() {
    let mut s = sched(two_teams(), nodes("c", 2, 8));
    let e = s.submit(0, job("x", 9, 0)).unwrap_err().to_string();
    assert!(e.starts_with("gpus_per_node = 9: ask for 1 to 8"), "{e}");
    let e = s.submit(0, job("x", 0, 0)).unwrap_err().to_string();
    assert!(e.starts_with("gpus_per_node = 0: ask for 1 to 8"), "{e}");
    let e = s
        .submit(
            0,
            allot_fairshare::WorkloadSpec {
                mem_per_node_gb: 4096,
                ..job("x", 1, 0)
            },
        )
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("mem_per_node_gb = 4096") && e.contains("2048 GB"),
        "{e}"
    );
    let e = s.submit(0, gang("x", 3, 8, 0)).unwrap_err().to_string();
    assert!(
        e.contains("nodes = 3: ask for 1 to 2") && e.contains("whole nodes"),
        "{e}"
    );
}

#[test]
fn a_gangs_drain_revocation_is_withdrawn_once_all_its_nodes_are_ready() {
    let mut s = sched(two_teams(), nodes("c", 2, 8));
    let g = s.submit(0, gang("x", 2, 8, HOUR)).expect("fits");
    s.schedule(0);
    let lease = lease_of(&s, g);
    s.set_node_state(10, NodeId(0), NodeState::Draining)
        .expect("node");
    s.set_node_state(11, NodeId(1), NodeState::Draining)
        .expect("node");
    s.schedule(11);
    s.set_node_state(20, NodeId(0), NodeState::Ready)
        .expect("node");
    assert!(
        s.lease(lease).expect("lease").revoke.is_some(),
        "node 1 still drains"
    );
    s.set_node_state(21, NodeId(1), NodeState::Ready)
        .expect("node");
    let d = s.schedule(21);
    assert!(
        d.actions
            .iter()
            .any(|a| matches!(a, Action::Withdraw { lease: l, .. } if *l == lease)),
        "{:?}",
        d.actions
    );
}

#[test]
fn a_refusal_marks_only_the_node_that_refused() {
    let mut s = sched(two_teams(), nodes("c", 2, 8));
    let g = s.submit(0, gang("x", 2, 4, HOUR)).expect("fits");
    let d = s.schedule(0);
    let lease = starts(&d)[0].1;
    s.lease_refused(1, lease, NodeId(1)).expect("live lease");
    assert!(s.cluster().node(NodeId(0)).offers(4));
    assert!(!s.cluster().node(NodeId(1)).offers(4));
    assert!(s.cluster().node(NodeId(1)).offers(3));
    // Nothing places the gang while node 1 refuses it: no plan, no reservation loop.
    for t in 2..5 {
        let d = s.schedule(t);
        assert!(starts(&d).is_empty(), "{:?}", d.actions);
    }
    assert_eq!(s.workload(g).expect("known").state, WorkloadState::Pending);
}

#[test]
fn the_victim_is_the_lease_that_loses_the_least_work() {
    // Two unfunded leases share a node: one cannot resume and has run 1 h, the other
    // can and has run 2 h. Counting GPU-hours since start would take the younger;
    // the work lost is 1 h for it and at most checkpoint_loss (10 min) for the other.
    let mut s = sched(two_teams(), nodes("c", 1, 8));
    let old_resumable = s.submit(0, job("x", 4, 0)).unwrap();
    s.schedule(0);
    let mut young = job("x", 4, 0);
    young.resumable = false;
    let young = s.submit(HOUR, young).unwrap();
    s.schedule(HOUR);
    s.submit(2 * HOUR, job("y", 4, HOUR)).unwrap();
    let d = s.schedule(2 * HOUR);
    assert_eq!(revokes(&d), vec![(lease_of(&s, old_resumable), 2 * HOUR)]);
    assert!(s.workload(young).unwrap().lease.is_some());
}

#[test]
fn no_preemption_throws_away_more_than_its_bound_a_gpu() {
    // Free occupancy of 8 GPUs that cannot resume: revoking it loses all it ran. A
    // 1-GPU request may lose at most 30 min (max_loss_per_gpu): after 3 min (24
    // GPU-minutes) the lease is taken, after 3 h (24 GPU-hours) it is not, and the
    // request waits.
    assert_eq!(PolicyConfig::default().max_loss_per_gpu, 30 * MINUTE);
    for (ran, taken) in [(3 * MINUTE, true), (3 * HOUR, false)] {
        let mut s = sched(two_teams(), nodes("c", 1, 8));
        let mut free = job("x", 8, 0);
        free.resumable = false;
        let free = s.submit(0, free).unwrap();
        s.schedule(0);
        let debug = s.submit(ran, job("y", 1, HOUR)).unwrap();
        let d = s.schedule(ran);
        let want = if taken {
            vec![(lease_of(&s, free), ran)]
        } else {
            vec![]
        };
        assert_eq!(revokes(&d), want, "after {ran} s");
        assert_eq!(
            s.workload(debug).unwrap().state,
            WorkloadState::Pending,
            "after {ran} s"
        );
        if !taken {
            // The user reads why: what taking the lease would throw away, and the bound.
            let e = s.explain_workload(ran, debug).expect("pending");
            assert_eq!(
                e.blocked,
                Blocked::PreemptionTooDear {
                    lost_gpu_s: 8 * 3 * HOUR,
                    most_gpu_s: 30 * MINUTE,
                }
            );
            assert!(
                e.text.contains(
                    "would throw away 24.0 GPU-hours of others' work, more than the 0.5 \
                     allowed for its size (policy.max_loss_per_gpu)"
                ),
                "{}",
                e.text
            );
        }
    }
    // Resumable, the same lease loses only checkpoint_loss (8 × 10 min) after 3 h:
    // more than a 1-GPU request may throw away, within a 3-GPU one's 90 minutes.
    for (gpus, taken) in [(1, false), (3, true)] {
        let mut s = sched(two_teams(), nodes("c", 1, 8));
        let free = s.submit(0, job("x", 8, 0)).unwrap();
        s.schedule(0);
        s.submit(3 * HOUR, job("y", gpus, HOUR)).unwrap();
        let d = s.schedule(3 * HOUR);
        let want = if taken {
            vec![(lease_of(&s, free), 3 * HOUR)]
        } else {
            vec![]
        };
        assert_eq!(revokes(&d), want, "{gpus} GPUs");
    }
    // With no bound (the rules of 0.4 had none) 24 GPU-hours are thrown away.
    let cfg = PolicyConfig {
        max_loss_per_gpu: 30 * 24 * HOUR,
        ..PolicyConfig::default()
    };
    let mut s = Scheduler::new(cfg, two_teams(), nodes("c", 1, 8)).unwrap();
    let mut free = job("x", 8, 0);
    free.resumable = false;
    let free = s.submit(0, free).unwrap();
    s.schedule(0);
    s.submit(3 * HOUR, job("y", 1, HOUR)).unwrap();
    let d = s.schedule(3 * HOUR);
    assert_eq!(revokes(&d), vec![(lease_of(&s, free), 3 * HOUR)]);
}

#[test]
fn a_gang_neither_preempts_nor_reserves_past_its_loss_budget() {
    // Two nodes of non-resumable free occupancy that have run 3 h: taking both loses
    // 2 × 8 × 3 h = 48 GPU-hours, more than 16 GPUs × 30 min. The gang neither preempts
    // them nor reserves their nodes; it starts when they end. Resumable, they lose
    // 16 × 10 min and are taken at once.
    for resumable in [false, true] {
        let mut s = sched(two_teams(), nodes("c", 2, 8));
        let mut free = job("x", 8, 0);
        free.resumable = resumable;
        let a = s.submit(0, free.clone()).unwrap();
        let b = s.submit(0, free).unwrap();
        s.schedule(0);
        let g = s.submit(3 * HOUR, gang("y", 2, 8, HOUR)).unwrap();
        let d = s.schedule(3 * HOUR);
        if resumable {
            assert_eq!(revokes(&d).len(), 2, "{:?}", d.actions);
            continue;
        }
        assert!(revokes(&d).is_empty(), "{:?}", d.actions);
        assert!(reserves(&d).is_empty(), "{:?}", d.actions);
        for w in [a, b] {
            s.lease_ended(4 * HOUR, lease_of(&s, w), LeaseEnd::Completed)
                .unwrap();
        }
        let d = s.schedule(4 * HOUR);
        assert_eq!(starts(&d), vec![(g, lease_of(&s, g), true)]);
    }
}

#[test]
fn a_gang_whose_budget_is_spent_reserves_and_takes_back_only_free_occupancy() {
    let cfg = PolicyConfig {
        lookback: HOUR,
        ..PolicyConfig::default()
    };
    let mut s = Scheduler::new(cfg, two_teams(), nodes("c", 2, 8)).unwrap();
    // x spends its hour's budget (half of 16 GPUs for the hour); y runs funded work
    // that its time limit ends at 2 h.
    let spend = s.submit(0, job("x", 8, HOUR)).unwrap();
    let mut limited = job("y", 8, 10 * MINUTE);
    limited.time_limit = Some(2 * HOUR);
    let limited = s.submit(0, limited).unwrap();
    s.schedule(0);
    s.lease_ended(HOUR, lease_of(&s, spend), LeaseEnd::Completed)
        .unwrap();
    let free = s.submit(HOUR, job("y", 8, 0)).unwrap();
    let g = s.submit(HOUR, gang("x", 2, 8, HOUR)).unwrap();
    let d = s.schedule(HOUR);
    assert!(s.budget_spent(s.workload(g).unwrap().project, HOUR));
    // The funded lease is waited for, to its time limit, not preempted.
    assert_eq!(reserves(&d), vec![(g, 2 * HOUR)]);
    assert!(revokes(&d).is_empty(), "{:?}", d.actions);
    let funded = lease_of(&s, limited);
    s.lease_ended(2 * HOUR, funded, LeaseEnd::TimeLimit)
        .unwrap();
    let d = s.schedule(2 * HOUR);
    // At the start only the free occupancy is taken back.
    let unfunded = lease_of(&s, free);
    assert_eq!(revokes(&d), vec![(unfunded, 2 * HOUR)]);
    s.lease_ended(2 * HOUR + 60, unfunded, LeaseEnd::Revoked)
        .unwrap();
    let d = s.schedule(2 * HOUR + 60);
    // It starts (funded by now: the one-hour window has let go of the spending).
    assert_eq!(starts(&d), vec![(g, lease_of(&s, g), true)]);
}

#[test]
fn free_occupancy_leaves_the_headroom_to_protected_work() {
    // 16 GPUs, 1/8 kept free: of 16 one-GPU batch jobs 14 start, and a 2-GPU debug
    // job then starts at once on the 2 left, preempting nobody.
    let cfg = PolicyConfig {
        protected_headroom: 0.125,
        ..PolicyConfig::default()
    };
    let mut s = Scheduler::new(cfg.clone(), two_teams(), nodes("c", 2, 8)).unwrap();
    for _ in 0..16 {
        s.submit(0, job("y", 1, 0)).unwrap();
    }
    assert_eq!(starts(&s.schedule(0)).len(), 14);
    assert_eq!(s.cluster().free_total(), 2);
    let debug = s.submit(60, job("x", 2, HOUR)).unwrap();
    let d = s.schedule(60);
    assert_eq!(starts(&d).iter().map(|x| x.0).collect::<Vec<_>>(), [debug]);
    assert!(revokes(&d).is_empty());
    // With no headroom the batch backlog takes every GPU and the same debug job
    // preempts.
    let cfg = PolicyConfig {
        protected_headroom: 0.0,
        ..cfg
    };
    let mut s = Scheduler::new(cfg, two_teams(), nodes("c", 2, 8)).unwrap();
    for _ in 0..16 {
        s.submit(0, job("y", 1, 0)).unwrap();
    }
    assert_eq!(starts(&s.schedule(0)).len(), 16);
    s.submit(60, job("x", 2, HOUR)).unwrap();
    assert_eq!(revokes(&s.schedule(60)).len(), 2);
}

#[test]
fn occupancy_that_does_not_fit_above_the_headroom_is_not_jumped() {
    // y runs 12 one-GPU jobs (4 GPUs free, 2 kept). x, served worse, asks for 3: it
    // does not fit above the headroom, and y's next 1-GPU job, ranked below it, may
    // not take the GPUs x waits for.
    let cfg = PolicyConfig {
        protected_headroom: 0.125,
        ..PolicyConfig::default()
    };
    let mut s = Scheduler::new(cfg, two_teams(), nodes("c", 2, 8)).unwrap();
    for _ in 0..12 {
        s.submit(0, job("y", 1, 0)).unwrap();
    }
    assert_eq!(starts(&s.schedule(0)).len(), 12);
    let wide = s.submit(60, job("x", 3, 0)).unwrap();
    let narrow = s.submit(60, job("y", 1, 0)).unwrap();
    assert!(starts(&s.schedule(60)).is_empty());
    for w in [wide, narrow] {
        assert_eq!(s.workload(w).unwrap().state, WorkloadState::Pending);
    }
    // Its user reads why: free GPUs, kept for protected work.
    let e = s.explain_workload(60, wide).expect("pending");
    assert_eq!(e.blocked, Blocked::Headroom { free: 4, kept: 2 });
    assert!(
        e.text.contains(
            "4 GPUs are free, but 2 are kept for protected work (policy.protected_headroom)"
        ),
        "{}",
        e.text
    );
    // A share outside 0..=0.5 is refused, naming the field.
    let bad = PolicyConfig {
        protected_headroom: 0.9,
        ..PolicyConfig::default()
    };
    let e = Scheduler::new(bad, two_teams(), nodes("c", 1, 8)).unwrap_err();
    assert!(e.to_string().contains("policy.protected_headroom"), "{e}");
}

#[test]
fn a_soft_drain_lets_work_that_cannot_checkpoint_run_for_its_grace() {
    // One node drains at 1 h. Resumable free occupancy checkpoints at once; work that
    // cannot resume runs on for drain_grace (a day) unless it ends first. Under the
    // rules of 0.4 it was revoked at its lapse.
    for (grace, want) in [(DAY, HOUR + DAY), (0, HOUR)] {
        let cfg = PolicyConfig {
            drain_grace: grace,
            ..PolicyConfig::default()
        };
        let mut s = Scheduler::new(cfg, two_teams(), nodes("c", 1, 8)).unwrap();
        let resumable = s.submit(0, job("x", 4, 0)).unwrap();
        let mut spec = job("y", 4, 0);
        spec.resumable = false;
        let fragile = s.submit(0, spec).unwrap();
        s.schedule(0);
        let (lr, lf) = (lease_of(&s, resumable), lease_of(&s, fragile));
        s.set_node_state(HOUR, NodeId(0), NodeState::Draining)
            .unwrap();
        let mut r = revokes(&s.schedule(HOUR));
        r.sort();
        let mut expect = vec![(lr, HOUR), (lf, want)];
        expect.sort();
        assert_eq!(r, expect, "drain_grace {grace}");
    }
}

#[test]
fn a_gangs_parts_hold_their_gpus_until_each_has_left_and_its_work_waits_for_them() {
    let mut s = sched(two_teams(), nodes("c", 3, 8));
    let g = s.submit(0, gang("y", 2, 8, 0)).unwrap();
    let d = s.schedule(0);
    let lease = starts(&d)[0].1;
    let (first, second) = {
        let p = &s.lease(lease).unwrap().placement;
        (p[0].node, p[1].node)
    };
    // Rank 0's node drains; its part ends first while the other part is stopped.
    assert_eq!(
        s.lease_ended_leaving(10, lease, LeaseEnd::Revoked, None, &[second])
            .unwrap(),
        WorkloadState::Pending
    );
    assert_eq!(
        s.cluster().node(first).used,
        0,
        "the part that ended is free"
    );
    assert_eq!(s.cluster().node(second).used, 0xff, "the other is held");
    assert!(s.cluster().node(second).soft == 0, "and not preemptible");
    // Two whole nodes are free, yet the gang waits for its old part: never two runs.
    assert!(starts(&s.schedule(11)).is_empty());
    let e = s.explain_workload(11, g).unwrap();
    assert_eq!(
        e.blocked,
        Blocked::PreviousRunEnding {
            nodes: vec![s.cluster().node(second).spec.name.clone()]
        }
    );
    assert!(
        e.text.contains("previous run is still ending on c-"),
        "{}",
        e.text
    );
    // Nothing else is placed on the held GPUs either.
    let other = s.submit(12, job("x", 8, HOUR)).unwrap();
    let d = s.schedule(12);
    let placed = s.lease(starts(&d)[0].1).unwrap().placement[0].node;
    assert_eq!(starts(&d)[0].0, other);
    assert_ne!(placed, second);
    // A restart from facts keeps what is held and who waits.
    let mut s = Scheduler::from_facts(PolicyConfig::default(), two_teams(), &s.facts()).unwrap();
    assert_eq!(s.cluster().node(second).used, 0xff);
    assert!(starts(&s.schedule(13)).is_empty());
    // A part the core does not hold is no report of anything.
    assert!(matches!(
        s.part_left(14, lease, first),
        Err(CoreError::UnknownLease(_))
    ));
    // The last part leaves: its GPUs are free and the gang starts again at once.
    s.part_left(15, lease, second).unwrap();
    assert!(s.leaving().is_empty());
    let d = s.schedule(15);
    assert_eq!(starts(&d).len(), 1);
    assert_eq!(starts(&d)[0].0, g);
}

#[test]
fn a_lost_nodes_lease_that_comes_back_is_held_until_it_is_gone() {
    let mut s = sched(two_teams(), nodes("c", 2, 8));
    let w = s.submit(0, job("x", 8, HOUR)).unwrap();
    let d = s.schedule(0);
    let lease = starts(&d)[0].1;
    let node = s.lease(lease).unwrap().placement[0].node;
    s.set_node_state(10, node, NodeState::Down).unwrap();
    s.lease_ended(11, lease, LeaseEnd::NodeLost).unwrap();
    assert_eq!(s.workload(w).unwrap().state, WorkloadState::Pending);
    // The node comes back running the lease before the work restarted elsewhere.
    s.set_node_state(20, node, NodeState::Ready).unwrap();
    assert_eq!(s.hold_stray(20, lease, w, node, 0xff).unwrap(), Some(0xff));
    assert_eq!(
        s.hold_stray(20, lease, w, node, 0xff).unwrap(),
        None,
        "held once"
    );
    assert_eq!(s.cluster().node(node).free(), 0, "its GPUs are not free");
    assert!(
        starts(&s.schedule(21)).is_empty(),
        "the work does not run twice"
    );
    // A live lease is no stray.
    let other = s.submit(22, job("y", 8, HOUR)).unwrap();
    let d = s.schedule(22);
    let live = starts(&d)[0].1;
    assert_eq!(starts(&d)[0].0, other);
    assert!(s.hold_stray(22, live, other, node, 0xff).is_err());
    // Once the host reports it gone, the work starts again.
    s.part_left(30, lease, node).unwrap();
    let d = s.schedule(30);
    assert_eq!(starts(&d)[0].0, w);
}

#[test]
fn a_removed_node_counts_nowhere_and_its_name_may_join_again() {
    let mut s = sched(two_teams(), nodes("c", 2, 8));
    let w = s.submit(0, job("x", 8, HOUR)).unwrap();
    s.schedule(0);
    let busy = s.lease(lease_of(&s, w)).unwrap().placement[0].node;
    let idle = NodeId(1 - busy.0);
    // A node with a lease on it stays.
    let e = s.remove_node(1, busy).unwrap_err();
    assert!(e.to_string().contains("still holds leases"), "{e}");
    assert_eq!(s.cluster().total_gpus(), 16);
    s.set_node_state(1, idle, NodeState::Down).unwrap();
    s.remove_node(1, idle).unwrap();
    assert_eq!(s.cluster().total_gpus(), 8, "capacity drops by its GPUs");
    assert_eq!(s.cluster().kinds().map(|(_, n)| n).sum::<u32>(), 1);
    let name = s.cluster().node(idle).spec.name.clone();
    assert_eq!(s.cluster().find(&name), None);
    // Nothing brings it back but joining again, as a new node.
    assert!(s.set_node_state(2, idle, NodeState::Ready).is_err());
    assert!(s.submit(2, job("y", 8, HOUR)).is_ok());
    assert!(starts(&s.schedule(2)).is_empty(), "never placed on");
    // A snapshot keeps the hole (ids never move) and the name free.
    let back = Scheduler::from_facts(PolicyConfig::default(), two_teams(), &s.facts()).unwrap();
    assert_eq!(back.cluster().total_gpus(), 8);
    assert!(back.cluster().node(idle).removed);
    let mut back = back;
    let again = back
        .add_node(
            3,
            allot_fairshare::NodeSpec {
                name: name.clone(),
                ..nodes("c", 1, 8)[0].clone()
            },
        )
        .unwrap();
    assert_ne!(again, idle);
    assert_eq!(back.cluster().total_gpus(), 16);
    let facts = back.facts();
    let twice = Scheduler::from_facts(PolicyConfig::default(), two_teams(), &facts).unwrap();
    assert_eq!(twice.cluster().find(&name), Some(again));
    assert_eq!(twice.cluster().total_gpus(), 16);
}

/// One 8-GPU node of each of `types`, weighted by `weights`.
fn typed(
    types: &[&str],
    weights: &[(&str, f64)],
) -> (PolicyConfig, Vec<allot_fairshare::NodeSpec>) {
    let cfg = PolicyConfig {
        gpu_hour_weight: weights.iter().map(|(t, w)| (t.to_string(), *w)).collect(),
        ..PolicyConfig::default()
    };
    let nodes = types
        .iter()
        .enumerate()
        .map(|(i, t)| {
            allot_fairshare::NodeSpec {
                gpu_type: t.to_string(),
                ..nodes("c", 1, 8).remove(0)
            }
            .renamed(i)
        })
        .collect();
    (cfg, nodes)
}

trait Renamed {
    fn renamed(self, i: usize) -> Self;
}

impl Renamed for allot_fairshare::NodeSpec {
    fn renamed(mut self, i: usize) -> Self {
        self.name = format!("n{i}");
        self
    }
}

/// A job of `gpus` asking for GPU type `t`.
fn on_type(project: &str, gpus: u32, t: &str) -> allot_fairshare::WorkloadSpec {
    allot_fairshare::WorkloadSpec {
        select: allot_fairshare::select::Select {
            gpu_types: vec![t.into()],
            ..Default::default()
        },
        ..job(project, gpus, HOUR)
    }
}

#[test]
fn an_hour_of_a_heavier_type_counts_for_more_in_usage_and_capacity() {
    let (cfg, n) = typed(&["h100", "b300"], &[("b300", 2.0)]);
    let mut s = Scheduler::new(cfg, two_teams(), n).unwrap();
    let a = s.submit(0, on_type("x", 8, "b300")).unwrap();
    let b = s.submit(0, on_type("y", 8, "h100")).unwrap();
    s.schedule(0);
    s.lease_ended(HOUR, lease_of(&s, a), LeaseEnd::Completed)
        .unwrap();
    s.lease_ended(HOUR, lease_of(&s, b), LeaseEnd::Completed)
        .unwrap();
    let (gx, gy) = (s.tree().find("x").unwrap(), s.tree().find("y").unwrap());
    assert_eq!(s.usage_gpu_secs(gx, HOUR), 2.0 * 8.0 * 3600.0);
    assert_eq!(s.usage_gpu_secs(gy, HOUR), 8.0 * 3600.0);
    let r = s.group_ratios(HOUR);
    assert!(
        (r[gx.idx()] / r[gy.idx()] - 2.0).abs() < 1e-9,
        "x served twice y: {} vs {}",
        r[gx.idx()],
        r[gy.idx()]
    );
    // Entitlement is in the same units: x's half of 24 weighted GPUs over the covered
    // hour and the allocation horizon.
    let (parts, covered) = s.group_ratio_parts(HOUR);
    assert_eq!(covered, 3600.0);
    let horizon = PolicyConfig::default().allocation_horizon as f64;
    assert_eq!(
        parts[gx.idx()],
        (16.0 * 3600.0, 0.5 * 24.0 * (3600.0 + horizon))
    );
}

#[test]
fn a_budget_spends_faster_on_a_heavier_type() {
    // x's budget is half of 24 weighted GPUs over 7 days: 12 × 7 days. 8 B300s
    // at weight 2 spend it in 5.25 days; 8 H100s would take 10.5.
    let (cfg, n) = typed(&["h100", "b300"], &[("b300", 2.0)]);
    let mut s = Scheduler::new(cfg, two_teams(), n).unwrap();
    let a = s.submit(0, on_type("x", 8, "b300")).unwrap();
    s.schedule(0);
    let t = 7 * DAY * 3 / 4;
    s.lease_ended(t, lease_of(&s, a), LeaseEnd::Completed)
        .unwrap();
    let gx = s.tree().find("x").unwrap();
    assert!(
        s.budget_spent(gx, t),
        "5.25 days of 8 B300s spends 12 × 7 days"
    );
    let (cfg, n) = typed(&["h100", "b300"], &[("b300", 2.0)]);
    let mut s = Scheduler::new(cfg, two_teams(), n).unwrap();
    let a = s.submit(0, on_type("x", 8, "h100")).unwrap();
    s.schedule(0);
    s.lease_ended(t, lease_of(&s, a), LeaseEnd::Completed)
        .unwrap();
    assert!(!s.budget_spent(gx, t), "the same time on H100s spends half");
}

#[test]
fn a_lease_keeps_the_weight_it_started_with_through_a_snapshot() {
    let (cfg, n) = typed(&["h100", "b300"], &[("b300", 1.5)]);
    let mut s = Scheduler::new(cfg.clone(), two_teams(), n).unwrap();
    let a = s.submit(0, on_type("x", 4, "b300")).unwrap();
    s.schedule(0);
    let f = s.facts();
    // Weights change across the restart: the running lease ends charging what it
    // started charging, so the ledger's rate returns to zero.
    let later = PolicyConfig {
        gpu_hour_weight: [("b300".to_string(), 3.0)].into(),
        ..cfg
    };
    let mut s = Scheduler::from_facts(later, two_teams(), &f).unwrap();
    s.lease_ended(HOUR, lease_of(&s, a), LeaseEnd::Completed)
        .unwrap();
    let gx = s.tree().find("x").unwrap();
    assert_eq!(s.usage_gpu_secs(gx, HOUR), 1.5 * 4.0 * 3600.0);
    assert_eq!(
        s.usage_gpu_secs(gx, 2 * HOUR),
        1.5 * 4.0 * 3600.0,
        "nothing held after"
    );
}

#[test]
fn a_weight_out_of_range_is_refused_naming_the_field() {
    for (t, w) in [("b300", 0.0), ("b300", f64::NAN), ("B300", 1.0)] {
        let (cfg, n) = typed(&["b300"], &[(t, w)]);
        let Err(e) = Scheduler::new(cfg, two_teams(), n) else {
            panic!("{t} = {w} was accepted");
        };
        assert!(e.to_string().contains("policy.gpu_hour_weight"), "{e}");
    }
}

#[test]
fn a_node_list_places_only_on_its_nodes_and_an_excluded_node_never() {
    let mut s = sched(two_teams(), nodes("c", 3, 8));
    let listed = |only: &[&str], exclude: &[&str]| allot_fairshare::WorkloadSpec {
        select: allot_fairshare::select::Select {
            nodelist: only.iter().map(|n| n.to_string()).collect(),
            exclude: exclude.iter().map(|n| n.to_string()).collect(),
            ..Default::default()
        },
        ..job("x", 2, HOUR)
    };
    let a = s.submit(0, listed(&["c-2"], &[])).unwrap();
    let b = s.submit(0, listed(&[], &["c-0", "c-1"])).unwrap();
    let c = s.submit(0, listed(&["c-1", "c-2"], &["c-2"])).unwrap();
    s.schedule(0);
    let node_of = |w| {
        let n = s.lease(lease_of(&s, w)).unwrap().placement[0].node;
        s.cluster().node(n).spec.name.clone()
    };
    assert_eq!(node_of(a), "c-2");
    assert_eq!(
        node_of(b),
        "c-2",
        "best fit would pick c-0 or c-1 otherwise"
    );
    assert_eq!(node_of(c), "c-1");
    // Nine GPUs only one listed node of 8 could hold: refused at submit, naming the
    // field; so is a node nobody has.
    let e = s.submit(1, listed(&["nope"], &[])).unwrap_err().to_string();
    assert!(e.contains("nodelist") && e.contains("\"nope\""), "{e}");
    let e = s
        .submit(1, listed(&["c-0"], &["c-0"]))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("nodelist") && e.contains("a name outside c-0"),
        "{e}"
    );
    let gang = allot_fairshare::WorkloadSpec {
        nodes: 2,
        ..listed(&["c-0"], &[])
    };
    let e = s.submit(1, gang).unwrap_err().to_string();
    assert!(e.contains("nodes"), "{e}");
}
