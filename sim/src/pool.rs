//! Many independent simulation runs on as many threads as the machine has cores.

use crate::{self as sim, trace, PolicyKind, Report, Scenario, SimError, SimOptions};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Instant;

/// `f(0) … f(n - 1)` on up to one thread per core, taken in that order; each result
/// at its index, `None` where its thread panicked.
pub(crate) fn par_map<T: Send>(n: usize, f: impl Fn(usize) -> T + Sync) -> Vec<Option<T>> {
    let workers = std::thread::available_parallelism()
        .map_or(1, |c| c.get())
        .min(n);
    let next = AtomicUsize::new(0);
    let slots: Mutex<Vec<Option<T>>> = Mutex::new((0..n).map(|_| None).collect());
    std::thread::scope(|scope| {
        for _ in 0..workers {
            scope.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= n {
                    break;
                }
                let r = f(i);
                if let Ok(mut s) = slots.lock() {
                    s[i] = Some(r);
                }
            });
        }
    });
    // A poisoned lock means a thread panicked holding it; the others' results stand.
    slots.into_inner().unwrap_or_else(|p| p.into_inner())
}

/// One run of `sc` (replaying `trace` if given, else its classes for `seed`), its
/// wall time in the report.
pub(crate) fn run_timed(
    sc: &Scenario,
    trace: Option<&trace::Trace>,
    policy: PolicyKind,
    seed: u64,
) -> Result<Report, SimError> {
    let (jobs, groups) = match trace {
        Some(t) => (t.jobs.clone(), t.groups.clone()),
        None => (sc.generate(seed), Vec::new()),
    };
    let opts = SimOptions {
        policy,
        seed,
        timeline: false,
    };
    let started = Instant::now();
    let mut r = sim::run(sc, jobs, &groups, &opts)?;
    r.sim_wall_s = wall_s(started);
    Ok(r)
}

/// Seconds since `started`, to the millisecond.
pub(crate) fn wall_s(started: Instant) -> f64 {
    (started.elapsed().as_secs_f64() * 1000.0).round() / 1000.0
}
