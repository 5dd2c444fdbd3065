//! `allot-sim suite`: one policy judged on every scenario of a directory, on many
//! seeds, against two baselines and the targets it must meet.
//!
//! Each scenario runs under allot's **default** policy (its own `[policy]` table is
//! not read, but for `gpu_hour_weight`, which describes its GPUs: the suite judges
//! one policy for every workload; `--set key=value` tries
//! another value of a key everywhere at once), under the static-priority baseline,
//! and under FIFO with EASY backfill (what a Slurm site runs; work-conserving). Every
//! measure is printed as min / median / max over the seeds; each target is checked
//! on every seed, and a verdict names the seed and the figure that missed.

use crate::{trace, PolicyKind, Report, Scenario};
use allot_fairshare::config::PolicyConfig;
use anyhow::{bail, Context, Result};
use serde::Serialize;
use std::path::PathBuf;
use std::time::Instant;

/// Options of `allot-sim suite`.
#[derive(clap::Args, Debug)]
pub struct SuiteArgs {
    /// The directory of scenarios (every `*.toml` in it, by name).
    #[arg(long, default_value = "scenarios/suite")]
    pub dir: PathBuf,
    /// Seeds of every scenario (default: each scenario's `[suite] seeds`, else 1-10).
    #[arg(long)]
    pub seeds: Option<String>,
    /// The suite CI runs: scenarios marked `[suite] quick = false` left out, seeds 1-2.
    #[arg(long)]
    pub quick: bool,
    /// Policies to run, comma-separated.
    #[arg(
        long,
        default_value = "fairshare,priority,fifo-backfill,fifo-backfill-user"
    )]
    pub policies: String,
    /// Only the scenarios whose name contains this.
    #[arg(long)]
    pub only: Option<String>,
    /// A `[policy]` key for allot's runs, as `key=value` (TOML value; a bare word is
    /// taken as a string): `--set protected_headroom=0 --set lookback=14d`.
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub set: Vec<String>,
    /// Print one JSON object instead of the tables.
    #[arg(long)]
    pub json: bool,
    /// Judge each variant of this file against the policy (allot's runs only):
    /// a TOML table per variant, `name = { key = value, … }` (`[policy]` keys).
    #[arg(long, value_name = "FILE")]
    pub variants: Option<PathBuf>,
    /// Exit non-zero when a target is missed that the scenario does not list in
    /// `[suite] known_misses`, or (on the scenarios' own seeds) a listed one is met.
    #[arg(long)]
    pub strict: bool,
}

/// One scenario of the suite, read and ready to run.
pub(crate) struct Entry {
    pub name: String,
    pub scenario: Scenario,
    pub trace: Option<trace::Trace>,
    pub seeds: Vec<u64>,
}

/// The figures the suite reads from one run.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Figures {
    /// Busy GPU-hours / capacity.
    pub occupancy: f64,
    /// Worst team's received / entitled.
    pub worst_team: f64,
    /// Mean team ratio.
    pub mean_team: f64,
    /// p90 wait of small short work, s.
    pub small_short_p90_s: f64,
    /// p90 wait of small short work that started funded, s.
    pub small_short_funded_p90_s: f64,
    /// GPU-hours lost to preemption and reservations (drains left out: a fault's
    /// cost, the same under every policy).
    pub lost_gpu_hours: f64,
    /// Those, % of GPU-hours delivered.
    pub lost_pct: f64,
    /// Of those, GPU-hours lost to reservations taking their nodes back.
    pub reservation_lost_gpu_hours: f64,
    /// Leases revoked for preemption or reservations.
    pub preemptions: f64,
    /// p90 wait of the largest gangs, s.
    pub largest_gang_p90_s: f64,
    /// Wall time of the run, s.
    pub wall_s: f64,
}

impl Figures {
    fn of(r: &Report) -> Figures {
        let lost = r.lost_gpu_hours - r.lost_gpu_hours_by.get("drain").copied().unwrap_or(0.0);
        Figures {
            occupancy: r.occupancy,
            worst_team: r.fairness.min_ratio,
            mean_team: r.fairness.mean_ratio,
            small_short_p90_s: r.small_short_wait_s.p90 as f64,
            small_short_funded_p90_s: r.small_short_funded_wait_s.p90 as f64,
            lost_gpu_hours: lost,
            lost_pct: if r.delivered_gpu_hours > 0.0 {
                100.0 * lost / r.delivered_gpu_hours
            } else {
                0.0
            },
            reservation_lost_gpu_hours: r
                .lost_gpu_hours_by
                .get("reservation")
                .copied()
                .unwrap_or(0.0),
            preemptions: r.preemptions as f64,
            largest_gang_p90_s: r.largest_gang_wait_s.p90 as f64,
            wall_s: r.sim_wall_s,
        }
    }
}

/// How a measure is read and printed.
struct Measure {
    name: &'static str,
    get: fn(&Figures) -> f64,
    /// Printed as a duration (seconds), else as a number with this many decimals.
    duration: bool,
    decimals: usize,
}

const MEASURES: [Measure; 11] = [
    Measure {
        name: "occupancy",
        get: |f| f.occupancy,
        duration: false,
        decimals: 3,
    },
    Measure {
        name: "worst team",
        get: |f| f.worst_team,
        duration: false,
        decimals: 3,
    },
    Measure {
        name: "mean team",
        get: |f| f.mean_team,
        duration: false,
        decimals: 3,
    },
    Measure {
        name: "small short p90",
        get: |f| f.small_short_p90_s,
        duration: true,
        decimals: 0,
    },
    Measure {
        name: "… funded p90",
        get: |f| f.small_short_funded_p90_s,
        duration: true,
        decimals: 0,
    },
    Measure {
        name: "preempt lost GPU-h",
        get: |f| f.lost_gpu_hours,
        duration: false,
        decimals: 0,
    },
    Measure {
        name: "lost % delivered",
        get: |f| f.lost_pct,
        duration: false,
        decimals: 2,
    },
    Measure {
        name: "… to reservations",
        get: |f| f.reservation_lost_gpu_hours,
        duration: false,
        decimals: 0,
    },
    Measure {
        name: "preemptions",
        get: |f| f.preemptions,
        duration: false,
        decimals: 0,
    },
    Measure {
        name: "largest gang p90",
        get: |f| f.largest_gang_p90_s,
        duration: true,
        decimals: 0,
    },
    Measure {
        name: "wall s",
        get: |f| f.wall_s,
        duration: false,
        decimals: 2,
    },
];

/// min / median / max of `xs`.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Spread3 {
    /// Smallest.
    pub min: f64,
    /// Median (the lower middle of an even count).
    pub median: f64,
    /// Largest.
    pub max: f64,
}

impl Spread3 {
    /// The spread of `xs`.
    pub(crate) fn of(xs: &[f64]) -> Spread3 {
        let mut v = xs.to_vec();
        v.sort_by(f64::total_cmp);
        let at = |i: usize| v.get(i).copied().unwrap_or(0.0);
        Spread3 {
            min: at(0),
            median: at(v.len().saturating_sub(1) / 2),
            max: at(v.len().saturating_sub(1)),
        }
    }
}

/// One target checked on one scenario.
#[derive(Debug, Clone, Serialize)]
pub struct Verdict {
    /// What is checked.
    pub target: String,
    /// Met on every seed.
    pub met: bool,
    /// The scenario lists it as a known miss (`[suite] known_misses`).
    pub known_miss: bool,
    /// A wall-time target: shown, never failing `--strict` (a machine's speed is
    /// the benchmarks' to judge, not a pass/fail check).
    pub timed: bool,
    /// The worst seed and its figure, or why it does not apply.
    pub detail: String,
}

/// One scenario's results.
#[derive(Debug, Clone, Serialize)]
pub struct ScenarioResult {
    /// Its name.
    pub scenario: String,
    /// Its seeds.
    pub seeds: Vec<u64>,
    /// Per policy, the figures of each seed (in `seeds` order).
    pub runs: Vec<(String, Vec<Figures>)>,
    /// Per policy and measure, the spread over the seeds.
    pub spread: Vec<(String, Vec<(String, Spread3)>)>,
    /// allot's policy against the targets.
    pub verdicts: Vec<Verdict>,
}

/// The whole suite's results.
#[derive(Debug, Clone, Serialize)]
pub struct SuiteReport {
    /// The `--set` overrides allot's runs used.
    pub set: Vec<String>,
    /// Per scenario.
    pub scenarios: Vec<ScenarioResult>,
    /// Wall time of the suite, s.
    pub wall_s: f64,
}

/// Runs the suite `a` asks for and prints it.
pub fn run(a: SuiteArgs) -> Result<()> {
    if let Some(file) = &a.variants {
        return crate::ablation::run(&a, file);
    }
    let started = Instant::now();
    let policies = parse_policies(&a.policies)?;
    let policy = policy_with(&a.set)?;
    let entries = read_entries(&a)?;
    if entries.is_empty() {
        bail!(
            "--dir {}: no scenario (*.toml){}",
            a.dir.display(),
            a.only
                .as_ref()
                .map_or(String::new(), |o| format!(" whose name contains {o:?}"))
        );
    }
    let tasks = tasks_of(&entries, &policies, 1);
    tracing::info!(
        scenarios = entries.len(),
        runs = tasks.len(),
        "running the suite"
    );
    let figures = run_all(&entries, std::slice::from_ref(&policy), &tasks)?;
    let mut scenarios = Vec::new();
    for (i, e) in entries.iter().enumerate() {
        let runs: Vec<(String, Vec<Figures>)> = policies
            .iter()
            .map(|&p| (p.name().to_string(), figures_of(&tasks, &figures, i, p, 0)))
            .collect();
        let spread = runs
            .iter()
            .map(|(p, figs)| {
                let per = MEASURES
                    .iter()
                    .map(|m| {
                        let xs: Vec<f64> = figs.iter().map(m.get).collect();
                        (m.name.to_string(), Spread3::of(&xs))
                    })
                    .collect();
                (p.clone(), per)
            })
            .collect();
        let verdicts = judge(e, &runs);
        scenarios.push(ScenarioResult {
            scenario: e.name.clone(),
            seeds: e.seeds.clone(),
            runs,
            spread,
            verdicts,
        });
    }
    let report = SuiteReport {
        set: a.set.clone(),
        scenarios,
        wall_s: (started.elapsed().as_secs_f64() * 10.0).round() / 10.0,
    };
    if a.json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        print!("{}", report.table());
    }
    let surprises = surprises(&report, !a.quick && a.seeds.is_none());
    if a.strict && !surprises.is_empty() {
        bail!("{}", surprises.join("; "));
    }
    Ok(())
}

pub(crate) fn parse_policies(list: &str) -> Result<Vec<PolicyKind>> {
    let mut out = Vec::new();
    for name in list.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let p = PolicyKind::parse(name).with_context(|| {
            format!(
                "--policies {list:?}: {name:?} is not one; use fairshare, priority, fifo-backfill, fifo-backfill-user"
            )
        })?;
        if !out.contains(&p) {
            out.push(p);
        }
    }
    if out.is_empty() {
        bail!("--policies {list:?}: name at least one");
    }
    Ok(out)
}

/// The default policy with `--set` overrides.
fn policy_with(set: &[String]) -> Result<PolicyConfig> {
    policy_of(set_table(set)?, "--set")
}

/// A `[policy]` table as its config, checked; `what` names where it came from.
pub(crate) fn policy_of(table: toml::Table, what: &str) -> Result<PolicyConfig> {
    let text = toml::to_string(&table)?;
    let cfg: PolicyConfig = allot_common::config_error::from_toml(&text, what, "policy")
        .map_err(|e| anyhow::anyhow!("{what}: {e}"))?;
    cfg.validate().map_err(|e| anyhow::anyhow!("{what}: {e}"))?;
    Ok(cfg)
}

/// `--set key=value` pairs as a `[policy]` table.
pub(crate) fn set_table(set: &[String]) -> Result<toml::Table> {
    let mut table = toml::Table::new();
    for kv in set {
        let Some((k, v)) = kv.split_once('=') else {
            bail!("--set {kv:?}: write key=value, e.g. --set protected_headroom=0");
        };
        let (k, v) = (k.trim(), v.trim());
        let value: toml::Value = match toml::from_str::<toml::Table>(&format!("x = {v}")) {
            Ok(mut t) => t.remove("x").unwrap_or(toml::Value::String(v.to_string())),
            Err(_) => toml::Value::String(v.to_string()),
        };
        table.insert(k.to_string(), value);
    }
    Ok(table)
}

/// Most seeds one scenario of the suite runs.
const MAX_SUITE_SEEDS: usize = 100;

/// The scenarios `a` asks for, read and checked (each run sets its own policy).
pub(crate) fn read_entries(a: &SuiteArgs) -> Result<Vec<Entry>> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(&a.dir)
        .with_context(|| format!("--dir {}: cannot read the directory", a.dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "toml"))
        .collect();
    files.sort();
    let mut out = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(&file)
            .with_context(|| format!("{}: cannot read the file", file.display()))?;
        let sc = Scenario::parse(&text, &file.display().to_string())?;
        if a.only
            .as_ref()
            .is_some_and(|o| !sc.name.contains(o.as_str()))
        {
            continue;
        }
        if a.quick && !sc.suite.quick {
            continue;
        }
        let list = match (&a.seeds, a.quick, &sc.suite.seeds) {
            (Some(s), _, _) => s.clone(),
            (None, true, _) => "1-2".to_string(),
            (None, false, Some(s)) => s.clone(),
            (None, false, None) => "1-10".to_string(),
        };
        let seeds = crate::cli::parse_seeds(&list)?;
        if seeds.len() > MAX_SUITE_SEEDS {
            bail!("--seeds {list:?}: at most {MAX_SUITE_SEEDS} seeds a scenario in a suite");
        }
        let trace = match sc.trace_path(&file) {
            Some(path) => {
                let text = std::fs::read_to_string(&path).with_context(|| {
                    format!(
                        "{}: trace {}: cannot read it",
                        file.display(),
                        path.display()
                    )
                })?;
                Some(trace::parse(&text, &path.display().to_string(), &sc)?)
            }
            None => None,
        };
        out.push(Entry {
            name: sc.name.clone(),
            scenario: sc,
            trace,
            seeds,
        });
    }
    Ok(out)
}

/// One run of the suite: a scenario (index into the entries), a policy, a seed, and
/// which of the allot configurations it uses (index; the baselines ignore it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Task {
    pub entry: usize,
    pub kind: PolicyKind,
    pub seed: u64,
    pub config: usize,
}

/// Every (scenario, seed, policy) run; allot's once per configuration, the baselines
/// once.
pub(crate) fn tasks_of(entries: &[Entry], kinds: &[PolicyKind], configs: usize) -> Vec<Task> {
    let mut out = Vec::new();
    for (entry, e) in entries.iter().enumerate() {
        for &seed in &e.seeds {
            for &kind in kinds {
                let n = if kind == PolicyKind::FairShare {
                    configs
                } else {
                    1
                };
                out.extend((0..n).map(|config| Task {
                    entry,
                    kind,
                    seed,
                    config,
                }));
            }
        }
    }
    out
}

/// The figures of scenario `entry` under `kind` (configuration `config`), seed by seed.
pub(crate) fn figures_of(
    tasks: &[Task],
    figures: &[Figures],
    entry: usize,
    kind: PolicyKind,
    config: usize,
) -> Vec<Figures> {
    tasks
        .iter()
        .zip(figures)
        .filter(|(t, _)| t.entry == entry && t.kind == kind && t.config == config)
        .map(|(_, f)| *f)
        .collect()
}

/// The policy a scenario runs under: `config`, with the scenario's own
/// `gpu_hour_weight` and `protect_by_use` unless `config` sets them, since weights
/// describe a scenario's GPUs and the classes protected by use its sessions (as a
/// site's class settings do) rather than the policy being judged.
fn judged(scenario: &PolicyConfig, config: &PolicyConfig) -> PolicyConfig {
    let mut p = config.clone();
    if p.gpu_hour_weight.is_empty() {
        p.gpu_hour_weight = scenario.gpu_hour_weight.clone();
    }
    if p.protect_by_use.is_empty() {
        p.protect_by_use = scenario.protect_by_use.clone();
    }
    p
}

/// Every run, on as many threads as the machine has cores, largest scenarios first.
pub(crate) fn run_all(
    entries: &[Entry],
    configs: &[PolicyConfig],
    tasks: &[Task],
) -> Result<Vec<Figures>> {
    let mut order: Vec<usize> = (0..tasks.len()).collect();
    let size = |e: &Entry| {
        let gpus: u64 = e.scenario.nodes().iter().map(|n| u64::from(n.gpus)).sum();
        gpus * u64::from(e.scenario.days)
    };
    order.sort_by_key(|&k| std::cmp::Reverse(size(&entries[tasks[k].entry])));
    let done = crate::pool::par_map(order.len(), |i| {
        let Task {
            entry: e,
            kind,
            seed,
            config,
        } = tasks[order[i]];
        let entry = &entries[e];
        let mut scenario = entry.scenario.clone();
        scenario.policy = judged(&entry.scenario.policy, &configs[config]);
        let r = crate::pool::run_timed(&scenario, entry.trace.as_ref(), kind, seed)
            .map(|r| Figures::of(&r))
            .with_context(|| format!("{} {} seed {seed}", entry.name, kind.name()));
        tracing::debug!(scenario = %entry.name, policy = kind.name(), seed, "ran");
        r
    });
    let mut slots: Vec<Option<Result<Figures>>> = (0..tasks.len()).map(|_| None).collect();
    for (k, r) in order.into_iter().zip(done) {
        slots[k] = r;
    }
    slots
        .into_iter()
        .map(|r| r.unwrap_or_else(|| Err(anyhow::anyhow!("a simulation thread panicked"))))
        .collect()
}

/// The targets, checked seed by seed on allot's runs.
fn judge(e: &Entry, runs: &[(String, Vec<Figures>)]) -> Vec<Verdict> {
    let of = |name: &str| {
        runs.iter()
            .find(|(p, _)| p == name)
            .map(|(_, f)| f.as_slice())
    };
    let Some(fs) = of(PolicyKind::FairShare.name()) else {
        return Vec::new();
    };
    let fifo = of(PolicyKind::FifoBackfill.name());
    let prio = of(PolicyKind::Priority.name());
    let seeds = &e.seeds;
    // The seed where `bad` is largest (how far past its bound), if any is past it.
    let check = |target: String, miss: &dyn Fn(usize) -> Option<(f64, String)>| {
        let worst = (0..seeds.len())
            .filter_map(|i| miss(i).map(|(by, d)| (by, format!("seed {}: {d}", seeds[i]))))
            .max_by(|a, b| a.0.total_cmp(&b.0));
        match worst {
            Some((_, detail)) => Verdict {
                target,
                met: false,
                known_miss: false,
                timed: false,
                detail,
            },
            None => Verdict {
                target,
                met: true,
                known_miss: false,
                timed: false,
                detail: String::new(),
            },
        }
    };
    let at_least = |x: f64, bound: f64, what: &str| {
        (x < bound).then(|| (bound - x, format!("{what} {x:.3} < {bound:.3}")))
    };
    let at_most = |x: f64, bound: f64, what: &str| {
        (x > bound).then(|| (x - bound, format!("{what} {x:.0} > {bound:.0}")))
    };
    let mut v = Vec::new();
    if let Some(fifo) = fifo {
        v.push(check(
            "occupancy ≥ 0.97 × FIFO+backfill's".into(),
            &|i| at_least(fs[i].occupancy, 0.97 * fifo[i].occupancy, "occupancy"),
        ));
    }
    v.push(check("worst team ≥ 0.92".into(), &|i| {
        at_least(fs[i].worst_team, 0.92, "worst")
    }));
    v.push(check("mean team ≥ 0.98".into(), &|i| {
        at_least(fs[i].mean_team, 0.98, "mean")
    }));
    v.push(check("small short p90 ≤ 10 min".into(), &|i| {
        at_most(fs[i].small_short_p90_s, 600.0, "p90 s")
    }));
    v.push(check("… funded p90 ≤ 60 s".into(), &|i| {
        at_most(fs[i].small_short_funded_p90_s, 60.0, "p90 s")
    }));
    if let Some(prio) = prio {
        v.push(check("lost ≤ priority's".into(), &|i| {
            at_most(fs[i].lost_gpu_hours, prio[i].lost_gpu_hours, "GPU-h")
        }));
    }
    v.push(check("lost ≤ 2% of delivered".into(), &|i| {
        (fs[i].lost_pct > 2.0)
            .then(|| (fs[i].lost_pct - 2.0, format!("{:.2}% > 2%", fs[i].lost_pct)))
    }));
    if let Some(fifo) = fifo {
        v.push(check(
            "largest gang p90 ≤ 2 h where FIFO+backfill's is".into(),
            &|i| {
                if fifo[i].largest_gang_p90_s > 7_200.0 {
                    return None;
                }
                at_most(fs[i].largest_gang_p90_s, 7_200.0, "p90 s")
            },
        ));
    }
    if let Some(max) = e.scenario.suite.max_wall_s {
        let mut w = check(format!("wall < {max} s"), &|i| {
            (fs[i].wall_s >= max).then(|| (fs[i].wall_s - max, format!("{:.1} s", fs[i].wall_s)))
        });
        w.timed = true;
        v.push(w);
    }
    for x in &mut v {
        x.known_miss = e
            .scenario
            .suite
            .known_misses
            .iter()
            .any(|k| !k.is_empty() && x.target.starts_with(k.as_str()));
    }
    v
}

/// What `--strict` fails on: misses not listed as known, and (`all_seeds`: on the
/// seeds the known misses were found on) known misses met now; wall times never.
fn surprises(report: &SuiteReport, all_seeds: bool) -> Vec<String> {
    report
        .scenarios
        .iter()
        .flat_map(|s| {
            s.verdicts.iter().filter(|v| !v.timed).filter_map(move |v| {
                match (v.met, v.known_miss) {
                    (false, false) => Some(format!("{}: missed {}", s.scenario, v.target)),
                    (true, true) if all_seeds => Some(format!(
                        "{}: {} is met now; take it off [suite] known_misses",
                        s.scenario, v.target
                    )),
                    _ => None,
                }
            })
        })
        .collect()
}

impl SuiteReport {
    /// The tables for people: per scenario, each measure's spread per policy and
    /// the verdicts; then one summary line per scenario.
    pub fn table(&self) -> String {
        let mut s = String::new();
        if !self.set.is_empty() {
            s += &format!("allot's policy with --set {}\n\n", self.set.join(" --set "));
        }
        for sc in &self.scenarios {
            s += &format!("== {} (seeds {})\n", sc.scenario, seed_list(&sc.seeds));
            s += &format!("{:<18}", "measure");
            for (p, _) in &sc.spread {
                s += &format!(" {:>30}", format!("{p} min/med/max"));
            }
            s += "\n";
            for (mi, m) in MEASURES.iter().enumerate() {
                s += &format!("{:<18}", m.name);
                for (_, per) in &sc.spread {
                    let x = per[mi].1;
                    let f = |v: f64| fmt(v, m);
                    s += &format!(
                        " {:>30}",
                        format!("{} / {} / {}", f(x.min), f(x.median), f(x.max))
                    );
                }
                s += "\n";
            }
            for v in &sc.verdicts {
                s += &format!(
                    "  {} {}{}\n",
                    match (v.met, v.known_miss || v.timed) {
                        (true, _) => "ok  ",
                        (false, true) => "miss",
                        (false, false) => "MISS",
                    },
                    v.target,
                    if v.detail.is_empty() {
                        String::new()
                    } else {
                        format!(" ({})", v.detail)
                    }
                );
            }
            s += "\n";
        }
        s += "summary: targets met per scenario (allot's policy; MISS: not a known miss)\n";
        for sc in &self.scenarios {
            let met = sc.verdicts.iter().filter(|v| v.met).count();
            let missed: Vec<&str> = sc
                .verdicts
                .iter()
                .filter(|v| !v.met)
                .map(|v| v.target.as_str())
                .collect();
            s += &format!(
                "  {:<16} {met}/{}{}\n",
                sc.scenario,
                sc.verdicts.len(),
                if missed.is_empty() {
                    String::new()
                } else {
                    format!("  missed: {}", missed.join("; "))
                }
            );
        }
        s += &format!("suite wall time {:.1} s\n", self.wall_s);
        s
    }
}

fn fmt(v: f64, m: &Measure) -> String {
    if m.duration {
        allot_fairshare::time::format_duration(v.max(0.0) as u64)
    } else {
        format!("{v:.*}", m.decimals)
    }
}

fn seed_list(seeds: &[u64]) -> String {
    match (seeds.first(), seeds.last()) {
        (Some(a), Some(b)) if seeds.len() > 1 && b - a + 1 == seeds.len() as u64 => {
            format!("{a}-{b}")
        }
        _ => seeds
            .iter()
            .map(u64::to_string)
            .collect::<Vec<_>>()
            .join(","),
    }
}
