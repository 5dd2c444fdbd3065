//! When pending work will start: a p50 ("about") and a p90 ("at most") start time
//! for every pending workload, from the very pass that will start it.
//!
//! The forecast clones the scheduler and runs it forward on a virtual clock, as the
//! simulator drives it, with what allotd knows and nothing more: running leases end
//! at an assumed end (below), revocations end their lease at once at their
//! `not_before` (the workload waits again, as it would), the queue is as it is, and
//! nothing new arrives. The first time the clone starts a pending workload is its
//! forecast start. It does this twice:
//!
//! - **p90**: every lease runs to its time limit; one without a limit runs
//!   [`ForecastOptions::unlimited_p90`]. With a [`RunHistory`] of the runs that
//!   ended, a lease ends at the 90th percentile of the runs of its class that lasted
//!   longer than it has run so far (never past its time limit).
//! - **p50**: a lease ends at [`ForecastOptions::p50_fraction`] of its time limit
//!   ([`ForecastOptions::unlimited_p50`] without one), or at the median of its
//!   class's history as above.
//!
//! Nothing new arriving makes the runs forward optimistic where new work keeps
//! ranking ahead (a busy cluster's free occupancy). A [`Calibration`] of how past
//! forecasts of each class compared with their actual starts corrects that: each
//! forecast wait `w` becomes `(w + 10 min) × k − 10 min`, `k` the median (p50) or
//! 90th percentile (p90) of `(actual wait + 10 min) / (forecast wait + 10 min)` over
//! the class's recent forecasts, once it has 20 of them.
//!
//! The p90 forecast is never earlier than the p50 one (it takes the later of the
//! two). Work is bounded: nothing past `now + horizon` (that workload gets `None`:
//! "not within 14 days"), at most `max_steps` passes, and passes no closer together
//! than `resolution` or 1/64 of how far ahead they look, so a forecast costs a few
//! hundred passes whatever the number of leases.

use super::*;
use crate::time::{Secs, DAY, HOUR};
use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};

/// What a forecast assumes and how far it looks.
#[derive(Debug, Clone, PartialEq)]
pub struct ForecastOptions {
    /// How far ahead it looks; later starts are `None`.
    pub horizon: Secs,
    /// Most passes of each of the two runs forward.
    pub max_steps: u32,
    /// Passes are at least this far apart (lease ends between are taken together).
    pub resolution: Secs,
    /// p50: the part of its time limit a lease is taken to run, without history.
    pub p50_fraction: f64,
    /// p50: how long a lease without a time limit is taken to run, without history.
    pub unlimited_p50: Secs,
    /// p90: how long a lease without a time limit is taken to run, without history.
    pub unlimited_p90: Secs,
    /// Seconds between a revocation's `not_before` and its lease's end (the
    /// checkpoint ladder), 0 to end it at once.
    pub revoke_delay: Secs,
    /// How long runs of each class lasted (fed by the shell from ended leases).
    pub history: RunHistory,
    /// How past forecasts of each class compared with what happened (fed by the
    /// shell when forecast work starts).
    pub calibration: Calibration,
}

impl Default for ForecastOptions {
    fn default() -> Self {
        ForecastOptions {
            horizon: 14 * DAY,
            max_steps: 2_000,
            resolution: 60,
            p50_fraction: 0.5,
            unlimited_p50: 6 * HOUR,
            unlimited_p90: 3 * DAY,
            revoke_delay: 0,
            history: RunHistory::default(),
            calibration: Calibration::default(),
        }
    }
}

/// The forecast start of one pending workload.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct Forecast {
    /// About when it starts (half the time sooner, half later); `None`: not within
    /// the horizon.
    pub p50: Option<Time>,
    /// When it starts at the latest, give or take one time in ten; `None`: not
    /// within the horizon. Never before `p50`.
    pub p90: Option<Time>,
    /// The p50 run forward's own answer, before calibration: what
    /// [`Calibration::record`] takes (as a wait from `now`) once the work starts.
    pub model_p50: Option<Time>,
    /// The p90 run forward's own answer, before calibration.
    pub model_p90: Option<Time>,
}

/// Run lengths of leases that ended on their own (completed, failed or at their
/// time limit: a revoked run says nothing of how long it would have run), the last
/// `cap` of each class.
#[derive(Debug, Clone, PartialEq)]
pub struct RunHistory {
    cap: usize,
    classes: BTreeMap<String, VecDeque<Secs>>,
}

impl Default for RunHistory {
    fn default() -> Self {
        RunHistory::new(1_000)
    }
}

impl RunHistory {
    /// Keeps the last `cap` runs of each class.
    pub fn new(cap: usize) -> Self {
        RunHistory {
            cap: cap.max(1),
            classes: BTreeMap::new(),
        }
    }

    /// A run of `class` lasted `secs`.
    pub fn record(&mut self, class: &str, secs: Secs) {
        let runs = match self.classes.get_mut(class) {
            Some(r) => r,
            None => self.classes.entry(class.to_string()).or_default(),
        };
        if runs.len() == self.cap {
            runs.pop_front();
        }
        runs.push_back(secs);
    }

    /// Runs recorded of `class`.
    pub fn len(&self, class: &str) -> usize {
        self.classes.get(class).map_or(0, VecDeque::len)
    }

    /// Whether no run is recorded.
    pub fn is_empty(&self) -> bool {
        self.classes.values().all(VecDeque::is_empty)
    }

    fn sorted(&self) -> BTreeMap<&str, Vec<Secs>> {
        self.classes
            .iter()
            .map(|(c, r)| {
                let mut v: Vec<Secs> = r.iter().copied().collect();
                v.sort_unstable();
                (c.as_str(), v)
            })
            .collect()
    }
}

/// How the waits past forecasts foresaw compared with the actual waits, per class:
/// the last `cap` ratios of each class, for p50 and p90.
#[derive(Debug, Clone, PartialEq)]
pub struct Calibration {
    cap: usize,
    classes: BTreeMap<String, (VecDeque<f64>, VecDeque<f64>)>,
}

impl Default for Calibration {
    fn default() -> Self {
        Calibration::new(500)
    }
}

/// Seconds added to both sides of a calibration ratio, so that work forecast to
/// start now (a wait of 0) still has one.
const CAL_SLACK: f64 = 600.0;

/// Fewest forecasts of a class before its calibration is used.
const CAL_MIN: usize = 20;

impl Calibration {
    /// Keeps the last `cap` forecasts of each class.
    pub fn new(cap: usize) -> Self {
        Calibration {
            cap: cap.max(1),
            classes: BTreeMap::new(),
        }
    }

    /// Work of `class` was forecast to wait `p50` and `p90` seconds (from the
    /// forecast's `now`; `None`: not within the horizon), and waited `actual`.
    pub fn record(&mut self, class: &str, p50: Option<Secs>, p90: Option<Secs>, actual: Secs) {
        let (a, b) = match self.classes.get_mut(class) {
            Some(x) => x,
            None => self.classes.entry(class.to_string()).or_default(),
        };
        let ratio = |w: Secs| (actual as f64 + CAL_SLACK) / (w as f64 + CAL_SLACK);
        for (q, w) in [(&mut *a, p50), (&mut *b, p90)] {
            if let Some(w) = w {
                if q.len() == self.cap {
                    q.pop_front();
                }
                q.push_back(ratio(w));
            }
        }
    }

    /// Forecasts recorded of `class` (with a p90).
    pub fn len(&self, class: &str) -> usize {
        self.classes.get(class).map_or(0, |c| c.1.len())
    }

    /// Whether none is recorded.
    pub fn is_empty(&self) -> bool {
        self.classes
            .values()
            .all(|c| c.0.is_empty() && c.1.is_empty())
    }

    /// The factors (p50, p90) for each class with enough forecasts.
    fn factors(&self) -> BTreeMap<&str, (Option<f64>, Option<f64>)> {
        let at = |q: &VecDeque<f64>, p: f64| {
            if q.len() < CAL_MIN {
                return None;
            }
            let mut v: Vec<f64> = q.iter().copied().collect();
            v.sort_by(f64::total_cmp);
            Some(v[((v.len() - 1) as f64 * p).round() as usize])
        };
        self.classes
            .iter()
            .map(|(c, (a, b))| (c.as_str(), (at(a, 0.5), at(b, 0.9))))
            .collect()
    }
}

/// `now` + `wait` stretched by `k` (see [`Calibration`]); `None` past `last`.
fn calibrated(now: Time, at: Option<Time>, k: Option<f64>, last: Time) -> Option<Time> {
    let (at, k) = match (at, k) {
        (Some(at), Some(k)) => (at, k),
        (at, _) => return at,
    };
    let w = (at - now) as f64;
    let stretched = ((w + CAL_SLACK) * k - CAL_SLACK).max(0.0);
    let t = now.saturating_add(stretched.min(u64::MAX as f64 / 2.0) as Secs);
    (t <= last).then_some(t)
}

/// Fewest runs longer than a lease's age the history must hold to be used for it.
const MIN_RUNS: usize = 10;

/// Which of the two runs forward.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Quantile {
    P50,
    P90,
}

impl Quantile {
    fn q(self) -> f64 {
        match self {
            Quantile::P50 => 0.5,
            Quantile::P90 => 0.9,
        }
    }
}

/// When a lease is assumed to end, for one run forward.
struct Ends<'a> {
    opts: &'a ForecastOptions,
    history: BTreeMap<&'a str, Vec<Secs>>,
    q: Quantile,
}

impl Ends<'_> {
    /// A lease of `class` started at `start` (with its time limit ending it at
    /// `ends_by`), seen at `now`: when it ends.
    fn end(&self, class: &str, start: Time, ends_by: Option<Time>, now: Time) -> Time {
        let age = now.saturating_sub(start);
        let by_limit = ends_by.map(|e| e.max(now));
        if let Some(runs) = self.history.get(class) {
            let k = runs.partition_point(|&x| x <= age);
            let longer = &runs[k..];
            if longer.len() >= MIN_RUNS {
                let i = ((longer.len() - 1) as f64 * self.q.q()).round() as usize;
                let end = start.saturating_add(longer[i]).max(now);
                return by_limit.map_or(end, |b| end.min(b));
            }
        }
        match (self.q, by_limit, ends_by) {
            (Quantile::P90, Some(b), _) => b,
            (Quantile::P50, Some(b), Some(e)) => {
                let f = self.opts.p50_fraction.clamp(0.0, 1.0);
                let limit = e.saturating_sub(start);
                let at = start + (limit as f64 * f) as Secs;
                if at > now {
                    at
                } else {
                    // Past that: the same fraction of what is left of its limit.
                    now + (b.saturating_sub(now) as f64 * f) as Secs
                }
            }
            _ => {
                let len = match self.q {
                    Quantile::P50 => self.opts.unlimited_p50,
                    Quantile::P90 => self.opts.unlimited_p90,
                };
                let at = start.saturating_add(len);
                if at > now {
                    at
                } else {
                    // It ran past the assumption: as long again from now.
                    now.saturating_add(len)
                }
            }
        }
    }
}

/// A lease end the run forward will report: (when, lease, a revocation's).
type EndEv = Reverse<(Time, LeaseId, bool)>;

impl Scheduler {
    /// The forecast start of every pending workload, as of `now` (see the module
    /// page): held work gets `None` (it waits for its shell, not for GPUs). The live
    /// scheduler is not changed; the work is done on clones.
    pub fn forecast(&self, now: Time, opts: &ForecastOptions) -> BTreeMap<WorkloadId, Forecast> {
        let ids: Vec<WorkloadId> = self
            .st
            .workloads
            .values()
            .filter(|w| w.state == WorkloadState::Pending)
            .map(|w| w.id)
            .collect();
        self.forecast_workloads(now, &ids, opts)
    }

    /// The forecast of the pending workloads of `ids` only (others are left out):
    /// the same figures as [`Scheduler::forecast`] gives them, found sooner, since
    /// the runs forward stop once these have started.
    pub fn forecast_workloads(
        &self,
        now: Time,
        ids: &[WorkloadId],
        opts: &ForecastOptions,
    ) -> BTreeMap<WorkloadId, Forecast> {
        let now = now.max(self.st.last_now);
        let targets: BTreeSet<WorkloadId> = ids
            .iter()
            .copied()
            .filter(|id| {
                self.st
                    .workloads
                    .get(id)
                    .is_some_and(|w| w.state == WorkloadState::Pending)
            })
            .collect();
        let queued: BTreeSet<WorkloadId> = targets
            .iter()
            .copied()
            .filter(|id| self.st.workloads.get(id).is_some_and(|w| !w.held))
            .collect();
        let history = || opts.history.sorted();
        let p90 = self.run_forward(
            now,
            &queued,
            &Ends {
                opts,
                history: history(),
                q: Quantile::P90,
            },
        );
        let p50 = self.run_forward(
            now,
            &queued,
            &Ends {
                opts,
                history: history(),
                q: Quantile::P50,
            },
        );
        let factors = opts.calibration.factors();
        let last = now.saturating_add(opts.horizon);
        targets
            .into_iter()
            .map(|id| {
                let class = self
                    .st
                    .workloads
                    .get(&id)
                    .map_or("", |w| w.spec.class.as_str());
                let (k50, k90) = factors.get(class).copied().unwrap_or_default();
                let (model_p50, model_p90) = (p50.get(&id).copied(), p90.get(&id).copied());
                let a = calibrated(now, model_p50, k50, last);
                let b = calibrated(now, model_p90, k90, last);
                // The later of the two, `None` (beyond the horizon) latest of all.
                let b = match (a, b) {
                    (Some(a), Some(b)) => Some(a.max(b)),
                    _ => None,
                };
                (
                    id,
                    Forecast {
                        p50: a,
                        p90: b,
                        model_p50,
                        model_p90,
                    },
                )
            })
            .collect()
    }

    /// Runs a clone forward from `now` until every workload of `targets` started,
    /// the horizon or the step cap; returns when each started.
    fn run_forward(
        &self,
        now: Time,
        targets: &BTreeSet<WorkloadId>,
        ends: &Ends,
    ) -> BTreeMap<WorkloadId, Time> {
        let opts = ends.opts;
        let mut started = BTreeMap::new();
        if targets.is_empty() {
            return started;
        }
        let mut s = self.clone();
        // Parts of ended leases still on their hosts are taken as gone.
        let leaving: Vec<(LeaseId, NodeId)> =
            s.st.leaving
                .iter()
                .flat_map(|(lid, l)| l.parts.iter().map(move |p| (*lid, p.node)))
                .collect();
        for (lid, node) in leaving {
            let _ = s.part_left(now, lid, node);
        }
        let mut heap: BinaryHeap<EndEv> = BinaryHeap::new();
        for l in s.st.leases.values() {
            let class =
                s.st.workloads
                    .get(&l.workload)
                    .map_or("", |w| w.spec.class.as_str());
            heap.push(Reverse((
                ends.end(class, l.start, l.ends_by, now),
                l.id,
                false,
            )));
            if let Some(r) = &l.revoke {
                let at = r.not_before.max(now).saturating_add(opts.revoke_delay);
                heap.push(Reverse((at, l.id, true)));
            }
        }
        let last = now.saturating_add(opts.horizon);
        let mut t = now;
        let mut steps = 0u32;
        loop {
            let d = s.schedule(t);
            steps += 1;
            for a in &d.actions {
                match a {
                    Action::Start {
                        lease, workload, ..
                    } => {
                        if targets.contains(workload) {
                            started.entry(*workload).or_insert(t);
                        }
                        if let Some(l) = s.st.leases.get(lease) {
                            let class =
                                s.st.workloads
                                    .get(workload)
                                    .map_or("", |w| w.spec.class.as_str());
                            heap.push(Reverse((ends.end(class, t, l.ends_by, t), *lease, false)));
                        }
                    }
                    Action::Revoke {
                        lease, not_before, ..
                    } => {
                        let at = (*not_before).max(t).saturating_add(opts.revoke_delay);
                        heap.push(Reverse((at, *lease, true)));
                    }
                    Action::Withdraw { .. } | Action::Reserve { .. } => {}
                }
            }
            if started.len() == targets.len() || steps >= opts.max_steps {
                break;
            }
            let next_end = heap.peek().map(|Reverse((at, _, _))| *at);
            let next = match (next_end, d.next_wakeup) {
                (Some(a), Some(b)) => a.min(b),
                (a, b) => match a.or(b) {
                    Some(x) => x,
                    None => break,
                },
            };
            let gap = opts.resolution.max(1).max((t - now) / 64);
            let next = next.max(t + gap);
            if next > last {
                break;
            }
            while let Some(&Reverse((at, lid, revoked))) = heap.peek() {
                if at > next {
                    break;
                }
                heap.pop();
                let Some(l) = s.st.leases.get(&lid) else {
                    continue;
                };
                if revoked && l.revoke.is_none() {
                    // Withdrawn since.
                    continue;
                }
                let end = if revoked {
                    LeaseEnd::Revoked
                } else {
                    LeaseEnd::Completed
                };
                let _ = s.lease_ended(next, lid, end);
            }
            t = next;
        }
        started
    }
}
