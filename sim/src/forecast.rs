//! `allot-sim forecast`: how good the core's start-time forecast
//! ([`Scheduler::forecast`]) is, measured against what then happened.
//!
//! The engine runs as usual; at the first pass after an arrival, once every
//! `--every` of simulated time, it asks the live core for the forecast of the
//! workloads that arrived since the last pass (before that pass runs, so work that
//! fits now is forecast now), and records their actual first start. The forecast
//! reads only what allotd would know: the queue, leases' starts, time limits and
//! min runtimes, and, with `--history` (the default), how long runs of each class
//! that ended so far lasted. It never reads a job's true duration.

use crate::cli::{parse_seeds, read_scenario, read_trace, scenario_file};
use crate::pool::{self, wall_s};
use crate::scenario::TraceFormat;
use crate::{PolicyKind, Scenario, SimOptions};
use allot_fairshare::time::{Secs, Time};
use allot_fairshare::{ForecastOptions, Scheduler, WorkloadId};
use anyhow::{bail, Context, Result};
use serde::Serialize;
use std::path::PathBuf;
use std::time::Instant;

/// Options of `allot-sim forecast`.
#[derive(clap::Args, Debug)]
pub struct ForecastArgs {
    /// Scenario: a TOML file, or the name of a built-in one (`ai2`).
    #[arg(long, default_value = "ai2")]
    scenario: String,
    /// Replay this CSV trace instead of the scenario's workload classes.
    #[arg(long)]
    trace: Option<PathBuf>,
    /// Seeds: a range `1-10`, a list `1,4,7`, or both.
    #[arg(long, default_value = "1-3")]
    seeds: String,
    /// Simulated days (default: the scenario's).
    #[arg(long)]
    days: Option<u32>,
    /// Take a forecast at most once per this much simulated time (`30m`, `2h`).
    #[arg(long, default_value = "1h")]
    every: String,
    /// How far the forecast looks ahead.
    #[arg(long, default_value = "14d")]
    horizon: String,
    /// Assume leases end as their time limits and the defaults say, without the
    /// run lengths of ended runs of the same class.
    #[arg(long)]
    no_history: bool,
    /// p50 without history: the part of a lease's time limit it is taken to run.
    #[arg(long, default_value_t = 0.5)]
    p50_fraction: f64,
    /// Do not correct forecasts by how earlier ones of the same class compared
    /// with the actual starts.
    #[arg(long)]
    no_calibration: bool,
    /// Print one JSON object instead of the table.
    #[arg(long)]
    json: bool,
}

/// What a run collects: the forecasts taken and their cost.
#[derive(Debug)]
pub struct Probe {
    every: Secs,
    opts: ForecastOptions,
    use_history: bool,
    next: Time,
    /// (workload, when forecast, p50, p90).
    taken: Vec<(WorkloadId, Time, Option<Time>, Option<Time>)>,
    /// Each taken workload's class.
    classes: Vec<String>,
    /// Forecasts not yet started: workload → (when, class, model p50, model p90).
    open: std::collections::BTreeMap<WorkloadId, (Time, String, Option<Time>, Option<Time>)>,
    use_calibration: bool,
    /// Wall seconds of each forecast.
    costs: Vec<f64>,
}

impl Probe {
    /// A probe forecasting once per `every` seconds with `opts`.
    pub fn new(
        every: Secs,
        opts: ForecastOptions,
        use_history: bool,
        use_calibration: bool,
    ) -> Self {
        Probe {
            every: every.max(1),
            opts,
            use_history,
            next: 0,
            taken: Vec::new(),
            classes: Vec::new(),
            open: Default::default(),
            use_calibration,
            costs: Vec::new(),
        }
    }

    /// A pass is about to run at `t`; `arrived` came since the last one.
    pub(crate) fn before_pass(&mut self, core: &Scheduler, t: Time, arrived: &[WorkloadId]) {
        if arrived.is_empty() || t < self.next {
            return;
        }
        self.next = t + self.every;
        let started = Instant::now();
        let f = core.forecast_workloads(t, arrived, &self.opts);
        self.costs.push(started.elapsed().as_secs_f64());
        for (id, x) in f {
            let class = core.workload(id).map_or("", |w| w.spec.class.as_str());
            self.classes.push(class.to_string());
            if self.use_calibration {
                self.open
                    .insert(id, (t, class.to_string(), x.model_p50, x.model_p90));
            }
            self.taken.push((id, t, x.p50, x.p90));
        }
    }

    /// Workload `id` started (for the first time) at `t`: what the calibration learns.
    pub(crate) fn started(&mut self, id: WorkloadId, t: Time) {
        if let Some((at, class, a, b)) = self.open.remove(&id) {
            let wait = |x: Option<Time>| x.map(|x| x.saturating_sub(at));
            self.opts
                .calibration
                .record(&class, wait(a), wait(b), t.saturating_sub(at));
        }
    }

    /// A run of `class` ended on its own after `secs` (what allotd learns).
    pub(crate) fn ran(&mut self, class: &str, secs: Secs) {
        if self.use_history {
            self.opts.history.record(class, secs);
        }
    }

    /// The figures, given each workload's first start (by workload index) and the
    /// end of the simulated time.
    pub(crate) fn score(&self, first_start: &[Option<Time>], end: Time) -> Score {
        let mut s = self.score_of(first_start, end, |_, _| true);
        s.waited =
            Some(Box::new(self.score_of(first_start, end, |t, start| {
                start.is_none_or(|x| x > t)
            })));
        let mut names: Vec<&str> = self.classes.iter().map(String::as_str).collect();
        names.sort_unstable();
        names.dedup();
        for c in names {
            let mut cs = self.score_of_class(first_start, end, c);
            cs.class = c.to_string();
            s.by_class.push(cs);
        }
        let mut c: Vec<f64> = self.costs.iter().map(|x| x * 1000.0).collect();
        s.cost_ms_mean = if c.is_empty() {
            0.0
        } else {
            c.iter().sum::<f64>() / c.len() as f64
        };
        s.cost_ms_max = c.iter().copied().fold(0.0, f64::max);
        s.cost_ms_median = median(&mut c);
        s
    }

    fn score_of_class(&self, first_start: &[Option<Time>], end: Time, class: &str) -> Score {
        let keep: Vec<bool> = self.classes.iter().map(|c| c == class).collect();
        let mut i = 0;
        self.score_of(first_start, end, |_, _| {
            i += 1;
            keep[i - 1]
        })
    }

    /// The figures over the forecasts `keep(when forecast, actual start)` keeps.
    fn score_of(
        &self,
        first_start: &[Option<Time>],
        end: Time,
        mut keep: impl FnMut(Time, Option<Time>) -> bool,
    ) -> Score {
        let mut s = Score::default();
        let (mut e50, mut e90) = (Vec::new(), Vec::new());
        let (mut known, mut within, mut by_p50) = (0u64, 0u64, 0u64);
        for &(id, t, p50, p90) in &self.taken {
            let start = first_start.get((id.0 - 1) as usize).copied().flatten();
            if !keep(t, start) {
                continue;
            }
            s.forecasts += 1;
            match p90 {
                None => {
                    s.no_forecast += 1;
                    if start.is_some() {
                        s.no_forecast_started += 1;
                    }
                }
                Some(b) => {
                    // Known: it started, or the sim ran past its p90 without.
                    if start.is_some() || end > b {
                        known += 1;
                        if start.is_some_and(|x| x <= b) {
                            within += 1;
                        }
                    }
                    if let Some(x) = start {
                        e90.push(x.abs_diff(b) as f64 / 60.0);
                    }
                }
            }
            if let (Some(a), Some(x)) = (p50, start) {
                e50.push(x.abs_diff(a) as f64 / 60.0);
                if x <= a {
                    by_p50 += 1;
                }
            }
        }
        s.known = known;
        s.within_p90 = if known > 0 {
            within as f64 / known as f64
        } else {
            0.0
        };
        s.by_p50 = if e50.is_empty() {
            0.0
        } else {
            by_p50 as f64 / e50.len() as f64
        };
        s.p50_mae_min = median(&mut e50);
        s.p90_mae_min = median(&mut e90);
        s
    }
}

fn median(v: &mut [f64]) -> f64 {
    allot_common::stats::percentile_of(v, 0.5).unwrap_or(0.0)
}

/// How good one run's forecasts were.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Score {
    /// Seed.
    pub seed: u64,
    /// The class these figures are of (empty: every class).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub class: String,
    /// Workloads forecast.
    pub forecasts: u64,
    /// Of those with a p90, how many whose outcome is known (started, or the
    /// simulated time ran past their p90).
    pub known: u64,
    /// Share of `known` that started at or before their p90.
    pub within_p90: f64,
    /// Share of those started (with a p50) that started at or before their p50.
    pub by_p50: f64,
    /// Median |actual start − p50|, minutes (workloads that started).
    pub p50_mae_min: f64,
    /// Median |actual start − p90|, minutes.
    pub p90_mae_min: f64,
    /// Forecasts with no p90 within the horizon.
    pub no_forecast: u64,
    /// … of which started in the simulated time all the same.
    pub no_forecast_started: u64,
    /// Wall time of one forecast (the workloads of one arrival), ms.
    pub cost_ms_mean: f64,
    /// Median of the same.
    pub cost_ms_median: f64,
    /// Most.
    pub cost_ms_max: f64,
    /// The same figures over the work that did not start at once (started later
    /// than forecast, or never).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub waited: Option<Box<Score>>,
    /// The same figures per class.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub by_class: Vec<Score>,
}

/// The scores of every seed.
#[derive(Debug, Serialize)]
pub struct ForecastReport {
    /// Scenario name.
    pub scenario: String,
    /// One per seed.
    pub seeds: Vec<Score>,
    /// Wall seconds in all.
    pub wall_s: f64,
}

impl ForecastReport {
    /// The table people read.
    pub fn table(&self) -> String {
        let mut s = format!(
            "forecast of {} at submission (first pass after arrival)\n\
             seed       forecasts  known  ≤p90    ≤p50    |err| p50 min  |err| p90 min  none (started)  cost ms mean/max\n",
            self.scenario
        );
        let row = |label: &str, r: &Score| {
            format!(
                "{:<10} {:>9}  {:>5}  {:>5.1}%  {:>5.1}%  {:>13.1}  {:>13.1}  {:>6} ({:>5})\n",
                label,
                r.forecasts,
                r.known,
                r.within_p90 * 100.0,
                r.by_p50 * 100.0,
                r.p50_mae_min,
                r.p90_mae_min,
                r.no_forecast,
                r.no_forecast_started,
            )
        };
        for r in &self.seeds {
            s += &format!(
                "{:<10} {:>9}  {:>5}  {:>5.1}%  {:>5.1}%  {:>13.1}  {:>13.1}  {:>6} ({:>5})  {:.1}/{:.1}\n",
                r.seed,
                r.forecasts,
                r.known,
                r.within_p90 * 100.0,
                r.by_p50 * 100.0,
                r.p50_mae_min,
                r.p90_mae_min,
                r.no_forecast,
                r.no_forecast_started,
                r.cost_ms_mean,
                r.cost_ms_max,
            );
            if let Some(w) = &r.waited {
                s += &row("  waited", w);
            }
            for c in &r.by_class {
                s += &row(&format!("  {}", c.class), c);
            }
        }
        let w: Vec<f64> = self.seeds.iter().map(|r| r.within_p90 * 100.0).collect();
        if !w.is_empty() {
            let min = w.iter().copied().fold(f64::INFINITY, f64::min);
            let max = w.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let mean = w.iter().sum::<f64>() / w.len() as f64;
            s += &format!(
                "share within p90: min {min:.1}% / mean {mean:.1}% / max {max:.1}% over {} seeds (target ≥ 85%)\n",
                w.len()
            );
        }
        s += &format!("wall {:.1} s\n", self.wall_s);
        s
    }
}

/// Runs `allot-sim forecast`.
pub fn run(a: ForecastArgs) -> Result<()> {
    let mut sc: Scenario = read_scenario(&a.scenario)?;
    let trace_path = match sc.trace.as_ref().map(|t| t.format) {
        Some(TraceFormat::Helios) => bail!(
            "--scenario {}: a Helios trace simulated per cluster; use scenarios/philly.toml \
             or a scenario that extends it",
            a.scenario
        ),
        Some(TraceFormat::Allot) => a
            .trace
            .clone()
            .or_else(|| sc.trace_path(scenario_file(&a.scenario))),
        None => a.trace.clone(),
    };
    if let Some(d) = a.days {
        if d == 0 {
            bail!("--days 0: simulate at least 1 day");
        }
        sc.days = d;
    }
    let seeds = parse_seeds(&a.seeds)?;
    let every = allot_fairshare::time::parse_duration(&a.every)
        .map_err(|e| anyhow::anyhow!("--every {:?}: {e}", a.every))?;
    let horizon = allot_fairshare::time::parse_duration(&a.horizon)
        .map_err(|e| anyhow::anyhow!("--horizon {:?}: {e}", a.horizon))?;
    if !(0.0..=1.0).contains(&a.p50_fraction) {
        bail!(
            "--p50-fraction {}: give a part of 1, 0 to 1",
            a.p50_fraction
        );
    }
    let trace = match &trace_path {
        Some(p) => Some(read_trace(p, &sc)?),
        None => None,
    };
    let opts = ForecastOptions {
        horizon,
        p50_fraction: a.p50_fraction,
        ..Default::default()
    };
    let started = Instant::now();
    let scores = pool::par_map(seeds.len(), |i| {
        let seed = seeds[i];
        let (jobs, groups) = match &trace {
            Some(t) => (t.jobs.clone(), t.groups.clone()),
            None => (sc.generate(seed), Vec::new()),
        };
        let sim_opts = SimOptions {
            policy: PolicyKind::FairShare,
            seed,
            timeline: false,
        };
        let mut probe = Probe::new(every, opts.clone(), !a.no_history, !a.no_calibration);
        crate::run_probed(&sc, jobs, &groups, &sim_opts, Some(&mut probe))
            .map(|(_, score)| Score {
                seed,
                ..score.unwrap_or_default()
            })
            .with_context(|| format!("seed {seed}"))
    })
    .into_iter()
    .map(|r| r.unwrap_or_else(|| Err(anyhow::anyhow!("a simulation thread panicked"))))
    .collect::<Result<Vec<_>>>()?;
    let report = ForecastReport {
        scenario: sc.name.clone(),
        seeds: scores,
        wall_s: wall_s(started),
    };
    if a.json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        print!("{}", report.table());
    }
    Ok(())
}
