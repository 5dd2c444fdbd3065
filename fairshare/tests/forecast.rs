//! Start-time forecasts (`Scheduler::forecast`): the p90 pass runs leases to their
//! time limits, p50 ≤ p90, work that fits now starts now, and the live scheduler is
//! left as it was.

mod common;

use allot_fairshare::scheduler::LeaseEnd;
use allot_fairshare::time::{DAY, HOUR};
use allot_fairshare::{ForecastOptions, RunHistory, Scheduler, WorkloadSpec};
use common::{job, nodes, sched, starts, tree};
use proptest::prelude::*;

fn limited(mut spec: WorkloadSpec, limit: u64) -> WorkloadSpec {
    spec.time_limit = Some(limit);
    spec.min_runtime = spec.min_runtime.min(limit);
    spec
}

fn one_node() -> Scheduler {
    sched(
        tree(&[("p", None, 1.0), ("q", None, 1.0)]),
        nodes("c", 1, 8),
    )
}

#[test]
fn work_behind_a_limited_lease_starts_at_its_limit_in_the_p90_pass() {
    let mut s = one_node();
    let running = s
        .submit(0, limited(job("p", 8, 4 * HOUR), 10 * HOUR))
        .expect("submit");
    assert_eq!(starts(&s.schedule(0)).len(), 1);
    let waiting = s.submit(HOUR, job("q", 8, HOUR)).expect("submit");
    s.schedule(HOUR);
    let f = s.forecast(HOUR, &ForecastOptions::default());
    assert!(!f.contains_key(&running), "only pending work is forecast");
    let w = f[&waiting];
    assert_eq!(w.p90, Some(10 * HOUR), "{w:?}");
    // p50: half the limit.
    assert_eq!(w.p50, Some(5 * HOUR), "{w:?}");
}

#[test]
fn work_that_fits_now_is_forecast_now() {
    let mut s = one_node();
    s.submit(0, limited(job("p", 4, 0), HOUR)).expect("submit");
    s.schedule(0);
    let fits = s.submit(60, job("q", 4, HOUR)).expect("submit");
    let f = s.forecast(60, &ForecastOptions::default());
    assert_eq!(f[&fits].p50, Some(60));
    assert_eq!(f[&fits].p90, Some(60));
}

#[test]
fn the_forecast_leaves_the_live_scheduler_as_it_was() {
    let mut s = one_node();
    s.submit(0, limited(job("p", 8, HOUR), 2 * HOUR))
        .expect("submit");
    s.schedule(0);
    for _ in 0..3 {
        s.submit(10, job("q", 4, HOUR)).expect("submit");
    }
    let before = s.facts();
    let f = s.forecast(20, &ForecastOptions::default());
    assert_eq!(f.len(), 3);
    assert_eq!(before, s.facts());
    assert_eq!(s.pending_len(), 3);
    // And the next live pass decides as if nothing had happened.
    let mut fresh = s.clone();
    assert_eq!(s.schedule(30), fresh.schedule(30));
}

#[test]
fn beyond_the_horizon_there_is_no_forecast() {
    let mut s = one_node();
    s.submit(0, limited(job("p", 8, 0), 20 * DAY))
        .expect("submit");
    s.schedule(0);
    let w = s.submit(1, job("q", 8, HOUR)).expect("submit");
    // Unfunded lease: the funded one preempts it at once.
    let f = s.forecast(1, &ForecastOptions::default());
    assert_eq!(
        f[&w].p90,
        Some(61),
        "its victim ends at the next pass: {:?}",
        f[&w]
    );
    let mut s = one_node();
    s.submit(0, limited(job("p", 8, 20 * DAY), 20 * DAY))
        .expect("submit");
    s.schedule(0);
    let w = s.submit(1, job("q", 8, HOUR)).expect("submit");
    let f = s.forecast(1, &ForecastOptions::default());
    assert_eq!(
        f[&w].p90, None,
        "a contract of 20 days is not out within 14"
    );
    assert_eq!(f[&w].p50, Some(10 * DAY), "half its limit");
}

#[test]
fn history_of_ended_runs_replaces_the_limit() {
    let mut s = one_node();
    let mut spec = limited(job("p", 8, HOUR), 10 * HOUR);
    spec.class = "batch".into();
    s.submit(0, spec).expect("submit");
    s.schedule(0);
    let w = s.submit(0, job("q", 8, HOUR)).expect("submit");
    let mut opts = ForecastOptions::default();
    for m in 1..=100u64 {
        opts.history.record("batch", m * 60); // 1 to 100 minutes
    }
    let f = s.forecast(0, &opts)[&w];
    let (p50, p90) = (f.p50.expect("p50"), f.p90.expect("p90"));
    assert!((49 * 60..=52 * 60).contains(&p50), "{f:?}");
    assert!((89 * 60..=92 * 60).contains(&p90), "{f:?}");
    // Seen at 95 minutes, still running: longer than most, ends soon after.
    let f = s.forecast(95 * 60, &opts)[&w];
    assert!(f.p90.expect("p90") <= 10 * HOUR, "{f:?}");
    let mut h = RunHistory::new(2);
    for x in [1, 2, 3] {
        h.record("c", x);
    }
    assert_eq!(h.len("c"), 2, "the last runs only");
}

#[test]
fn a_lease_ending_is_what_the_pending_work_waits_for() {
    let mut s = one_node();
    let l = s.submit(0, job("p", 8, HOUR)).expect("submit");
    let lease = starts(&s.schedule(0))[0].1;
    let w = s.submit(10, job("q", 8, HOUR)).expect("submit");
    let opts = ForecastOptions {
        unlimited_p50: 2 * HOUR,
        unlimited_p90: 5 * HOUR,
        ..Default::default()
    };
    let f = s.forecast(10, &opts)[&w];
    assert_eq!((f.p50, f.p90), (Some(2 * HOUR), Some(5 * HOUR)));
    s.lease_ended(600, lease, LeaseEnd::Completed).expect("end");
    let f = s.forecast(600, &opts)[&w];
    assert_eq!((f.p50, f.p90), (Some(600), Some(600)), "{l:?} ended");
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// p50 ≤ p90, neither before now, and the live state is unchanged.
    #[test]
    fn p50_is_never_after_p90(
        jobs in prop::collection::vec((0u32..2, 1u32..=8, 0u64..4, prop::option::of(1u64..48), 0u64..7_200), 1..24),
    ) {
        let mut s = sched(tree(&[("p", None, 1.0), ("q", None, 2.0)]), nodes("c", 3, 8));
        let mut now = 0;
        for (i, (p, gpus, mr, limit, gap)) in jobs.iter().enumerate() {
            now += gap;
            let mut spec = job(if *p == 0 { "p" } else { "q" }, *gpus, mr * HOUR);
            if let Some(l) = limit {
                spec = limited(spec, l * HOUR);
            }
            s.submit(now, spec).expect("submit");
            if i % 3 == 0 {
                s.schedule(now);
            }
        }
        let before = format!("{:?}", s.facts());
        let f = s.forecast(now, &ForecastOptions::default());
        prop_assert_eq!(f.len(), s.pending_len());
        for (id, x) in &f {
            if let (Some(a), Some(b)) = (x.p50, x.p90) {
                prop_assert!(a <= b, "{:?}: {:?}", id, x);
            }
            if x.p90.is_some() {
                prop_assert!(x.p50.is_some());
            }
            for t in [x.p50, x.p90].into_iter().flatten() {
                prop_assert!(t >= now && t <= now + 14 * DAY);
            }
        }
        prop_assert_eq!(before, format!("{:?}", s.facts()));
    }
}

#[test]
fn calibration_stretches_forecasts_by_how_past_ones_missed() {
    let mut s = one_node();
    let mut spec = limited(job("p", 8, HOUR), 10 * HOUR);
    spec.class = "batch".into();
    s.submit(0, spec.clone()).expect("submit");
    s.schedule(0);
    let w = s.submit(0, spec).expect("submit");
    let mut opts = ForecastOptions::default();
    let plain = s.forecast(0, &opts)[&w];
    assert_eq!((plain.p50, plain.p90), (Some(5 * HOUR), Some(10 * HOUR)));
    assert_eq!((plain.model_p50, plain.model_p90), (plain.p50, plain.p90));
    // Past batch work waited (w + 10 min) × 2 − 10 min for a forecast of w.
    for _ in 0..30 {
        opts.calibration
            .record("batch", Some(HOUR), Some(HOUR), 2 * HOUR + 600);
    }
    assert_eq!(opts.calibration.len("batch"), 30);
    let f = s.forecast(0, &opts)[&w];
    assert_eq!(f.p50, Some(10 * HOUR + 600));
    assert_eq!(f.p90, Some(20 * HOUR + 600));
    assert_eq!((f.model_p50, f.model_p90), (plain.p50, plain.p90));
    // Other classes are left alone.
    let mut other = opts.clone();
    other.calibration = Default::default();
    for _ in 0..30 {
        other.calibration.record("debug", Some(0), Some(0), DAY);
    }
    assert_eq!(s.forecast(0, &other)[&w], plain);
}
