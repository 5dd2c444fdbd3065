//! When pending work may start: every `[server] forecast_every`, a clone of the
//! live scheduler is run forward off the state's lock (`Scheduler::forecast`,
//! docs/policy/forecast.md) and the answers kept here for `allot status`, `allot
//! queue` and the pages. The forecast learns, in memory, how long runs of each class
//! last (from the runs allotd holds) and how its past answers compared with the
//! starts that followed (calibration); a restart begins that learning again.

use crate::serve::{now, Server};
use allot_fairshare::{Calibration, Forecast, ForecastOptions, RunHistory, Time, WorkloadId};
use allot_proto::v1 as pb;
use std::collections::BTreeMap;
use std::sync::Mutex;

/// A forecast given, kept until its workload starts, to learn from.
#[derive(Debug, Clone)]
struct Given {
    class: String,
    at: Time,
    p50: Option<u64>,
    p90: Option<u64>,
}

#[derive(Debug, Default)]
struct Book {
    /// When the answers were computed (0: never).
    at: Time,
    by: BTreeMap<u64, Forecast>,
    given: BTreeMap<u64, Given>,
    calibration: Calibration,
    /// How long the last computation took, ms.
    took_ms: u64,
}

/// The latest forecasts.
#[derive(Debug, Default)]
pub struct Forecasts {
    book: Mutex<Book>,
    /// How far ahead they look, s.
    horizon: u64,
}

/// Most given forecasts kept to learn from.
const MAX_GIVEN: usize = 50_000;

impl Forecasts {
    /// None yet.
    pub fn new() -> Forecasts {
        Forecasts {
            book: Mutex::new(Book {
                calibration: Calibration::new(500),
                ..Default::default()
            }),
            horizon: ForecastOptions::default().horizon,
        }
    }

    fn book(&self) -> std::sync::MutexGuard<'_, Book> {
        self.book.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Writes workload `id`'s forecast into its view (pending work only). Called
    /// with the state's lock held: this lock is always taken after that one.
    pub fn fill(&self, w: &mut pb::Workload, id: u64) {
        if w.state() != pb::WorkloadState::Pending {
            return;
        }
        let b = self.book();
        if b.at == 0 {
            return;
        }
        let unix = |t: Option<Time>| t.map_or(0, |t| t as i64);
        match b.by.get(&id) {
            Some(f) => {
                w.forecast_p50_unix = unix(f.p50);
                w.forecast_p90_unix = unix(f.p90);
            }
            // Submitted since the last computation: no answer yet.
            None => return,
        }
        w.forecast_at_unix = b.at as i64;
        w.forecast_horizon_s = self.horizon;
    }

    /// How long the last computation took, ms, and when it ran.
    pub fn last(&self) -> (u64, Time) {
        let b = self.book();
        (b.took_ms, b.at)
    }

    /// Computes every pending workload's forecast now: the clone and what it
    /// learns from are taken under the state's lock; the run forward is not.
    pub fn refresh(&self, server: &Server) {
        let t0 = std::time::Instant::now();
        let at = now();
        let (sched, history, calibration, classes) = {
            let c = server.core();
            let classes: BTreeMap<u64, String> = c
                .alloc
                .workloads()
                .values()
                .filter(|w| w.state == allot_fairshare::WorkloadState::Pending)
                .map(|w| (w.id, w.spec.class.clone()))
                .collect();
            let mut history = RunHistory::new(1_000);
            for w in c.alloc.workloads().values() {
                for r in &w.runs {
                    // Runs that ended on their own say how long such work runs.
                    if r.end > r.start && r.start > 0 && r.revoked.is_empty() {
                        history.record(&w.spec.class, r.end - r.start);
                    }
                }
            }
            let mut b = self.book();
            let mut learned = Vec::new();
            b.given.retain(|id, g| match c.alloc.workloads().get(id) {
                Some(w) if w.state.is_final() && w.runs.is_empty() => false,
                Some(w) => match w.runs.iter().find(|r| r.start >= g.at && r.start > 0) {
                    Some(r) => {
                        learned.push((g.clone(), r.start - g.at));
                        false
                    }
                    None => true,
                },
                None => false,
            });
            for (g, actual) in learned {
                b.calibration.record(
                    &g.class,
                    g.p50.map(|t| t.saturating_sub(g.at)),
                    g.p90.map(|t| t.saturating_sub(g.at)),
                    actual,
                );
            }
            (
                c.alloc.core.clone(),
                history,
                b.calibration.clone(),
                classes,
            )
        };
        let opts = ForecastOptions {
            history,
            calibration,
            ..Default::default()
        };
        let by: BTreeMap<u64, Forecast> = sched
            .forecast(at, &opts)
            .into_iter()
            .map(|(WorkloadId(id), f)| (id, f))
            .collect();
        let mut b = self.book();
        for (id, f) in &by {
            if b.given.len() >= MAX_GIVEN {
                break;
            }
            if let Some(class) = classes.get(id) {
                b.given.entry(*id).or_insert(Given {
                    class: class.clone(),
                    at,
                    p50: f.model_p50,
                    p90: f.model_p90,
                });
            }
        }
        b.by = by;
        b.at = at;
        b.took_ms = t0.elapsed().as_millis() as u64;
        tracing::debug!(pending = b.by.len(), ms = b.took_ms, "forecast");
    }
}

/// Recomputes the forecasts every `every` seconds until the task is dropped.
pub async fn run(server: std::sync::Arc<Server>, every: u64) {
    if every == 0 {
        return;
    }
    let mut tick = tokio::time::interval(std::time::Duration::from_secs(every));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let s = server.clone();
        let _ = tokio::task::spawn_blocking(move || s.forecasts.refresh(&s)).await;
    }
}
