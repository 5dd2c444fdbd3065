//! `allot-sim` (and, for one release, `allot-sim`): read the scenario and
//! trace, run the core on a virtual clock, print the report.
//!
//! `--policy fifo|sjf` runs the Helios study's strict-order baselines instead
//! ([`crate::strict`]): they need a scenario whose `[trace]` is in the Helios
//! format with `clusters_separately = true` (`scenarios/philly-vc.toml`), and print
//! one row per cluster. They are deterministic and run until every job has ended, so
//! `--seed`, `--seeds`, `--days` and `--svg` do not apply. Such a scenario under
//! `fairshare` or `priority` is refused with a pointer to fifo/sjf: allot's policy
//! replays Philly through `scenarios/philly.toml` (one shared cluster,
//! the VCs as teams), which is the comparison it is built for.

use crate::pool::{self, wall_s};
use crate::scenario::TraceFormat;
use crate::{self as sim, helios, scenario::AI2, strict, trace, PolicyKind, Scenario, SimOptions};
use anyhow::{bail, Context, Result};
use std::path::PathBuf;
use std::time::Instant;

/// Options of `allot-sim`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Scenario: a TOML file, or the name of a built-in one (`ai2`).
    #[arg(long, default_value = "ai2")]
    scenario: String,
    /// Replay this CSV trace instead of the scenario's workload classes.
    #[arg(long)]
    trace: Option<PathBuf>,
    /// `fairshare` (allot), `priority` (the static-priority baseline), `fifo-backfill`
    /// (FIFO with EASY backfill, real durations as estimates), `fifo-backfill-user`
    /// (the same with time limits as users set them), or the Helios study's
    /// strict-order baselines `fifo` and `sjf` (a Helios-format scenario).
    #[arg(long, default_value = "fairshare")]
    policy: String,
    /// Seed (default: the scenario's).
    #[arg(long, conflicts_with = "seeds")]
    seed: Option<u64>,
    /// Run once per seed and print the spread (min / median / max) of every measure:
    /// a range `1-10`, a list `1,4,7`, or both `1-3,9`.
    #[arg(long, conflicts_with = "svg")]
    seeds: Option<String>,
    /// Simulated days (default: the scenario's).
    #[arg(long)]
    days: Option<u32>,
    /// Print one JSON object instead of the table.
    #[arg(long)]
    json: bool,
    /// Write plots (team shares, waits, occupancy) as SVG files into this directory.
    #[arg(long)]
    svg: Option<PathBuf>,
    /// `fifo`/`sjf`: write every job's start to this CSV
    /// (`cluster,line,submit_s,duration_s,gpus,start_s,queue_s`).
    #[arg(long)]
    per_job: Option<PathBuf>,
}

/// Runs the simulation `a` asks for and prints its report.
pub fn run(a: Args) -> Result<()> {
    let policy = match a.policy.as_str() {
        "fifo" => return run_strict(a, strict::Order::Fifo),
        "sjf" => return run_strict(a, strict::Order::Sjf),
        other => PolicyKind::parse(other).with_context(|| {
            format!(
                "--policy {other:?}: use `fairshare`, `priority`, `fifo-backfill`, \
                 `fifo-backfill-user`, `fifo` or `sjf`"
            )
        })?,
    };
    if a.per_job.is_some() {
        bail!("--per-job applies to --policy fifo and sjf");
    }
    let mut sc = read_scenario(&a.scenario)?;
    let trace_path = match sc.trace.as_ref().map(|t| t.format) {
        Some(TraceFormat::Helios) => bail!(
            "--scenario {}: its [trace] is a Helios trace with each cluster simulated \
             separately; run it with --policy fifo or --policy sjf (allot's policy replays \
             Philly with --scenario scenarios/philly.toml)",
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
    if let Some(list) = &a.seeds {
        let seeds = parse_seeds(list)?;
        let trace = match &trace_path {
            Some(path) => Some(read_trace(path, &sc)?),
            None => None,
        };
        let table = run_seeds(&sc, trace.as_ref(), policy, &seeds)?;
        return print(a.json, &table, sim::SeedTable::table);
    }
    let seed = a.seed.unwrap_or(sc.seed);
    let (jobs, groups) = match &trace_path {
        Some(path) => {
            let t = read_trace(path, &sc)?;
            (t.jobs, t.groups)
        }
        None => (sc.generate(seed), Vec::new()),
    };
    let opts = SimOptions {
        policy,
        seed,
        timeline: a.svg.is_some(),
    };
    tracing::info!(scenario = %sc.name, policy = policy.name(), seed, jobs = jobs.len(), "simulating");
    let started = Instant::now();
    let mut report = sim::run(&sc, jobs, &groups, &opts)?;
    report.sim_wall_s = wall_s(started);
    if let Some(dir) = &a.svg {
        crate::svg::write_all(dir, &report)
            .with_context(|| format!("--svg {}: cannot write plots", dir.display()))?;
    }
    print(a.json, &report, sim::Report::table)
}

pub(crate) fn read_scenario(name: &str) -> Result<Scenario> {
    let (text, file) = if name == "ai2" {
        (AI2.to_string(), "ai2 (built-in)".to_string())
    } else {
        let text = std::fs::read_to_string(name).with_context(|| {
            format!("--scenario {name}: cannot read the file (or name a built-in: ai2)")
        })?;
        (text, name.to_string())
    };
    Ok(Scenario::parse(&text, &file)?)
}

/// The scenario's file, against which its `[trace] path` is resolved (a built-in:
/// the working directory).
pub(crate) fn scenario_file(name: &str) -> &std::path::Path {
    if name == "ai2" {
        std::path::Path::new("ai2")
    } else {
        std::path::Path::new(name)
    }
}

/// `--policy fifo|sjf`: every cluster of a Helios trace, separately.
fn run_strict(a: Args, order: strict::Order) -> Result<()> {
    let flag = format!("--policy {}", order.name());
    for (given, what) in [
        (a.seed.is_some(), "--seed"),
        (a.seeds.is_some(), "--seeds"),
        (a.days.is_some(), "--days"),
        (a.svg.is_some(), "--svg"),
    ] {
        if given {
            bail!(
                "{what} does not apply to {flag}: it is deterministic and runs until every job \
                 has ended"
            );
        }
    }
    let sc = read_scenario(&a.scenario)?;
    if sc.trace.as_ref().map(|t| t.format) != Some(TraceFormat::Helios) {
        bail!(
            "{flag} needs a scenario whose [trace] has format = \"helios\" and \
             clusters_separately = true (e.g. scenarios/philly-vc.toml); --scenario {} has none",
            a.scenario
        );
    }
    let path = match &a.trace {
        Some(p) => p.clone(),
        None => sc
            .trace_path(scenario_file(&a.scenario))
            .context("the scenario names no trace")?,
    };
    let started = Instant::now();
    let text = std::fs::read_to_string(&path)
        .with_context(|| format!("trace {}: cannot read the file", path.display()))?;
    let tr = helios::parse(&text, &path.display().to_string(), &sc)?;
    let parse_wall_s = wall_s(started);
    tracing::info!(scenario = %sc.name, policy = order.name(), rows = tr.clusters.iter().map(|c| c.jobs.len()).sum::<usize>(), "simulating");
    let started = Instant::now();
    let mut report = strict::run(&sc.name, &tr, order).map_err(|e| anyhow::anyhow!(e))?;
    report.sim_wall_s = wall_s(started);
    report.parse_wall_s = parse_wall_s;
    if let Some(out) = &a.per_job {
        std::fs::write(out, report.per_job_csv())
            .with_context(|| format!("--per-job {}: cannot write the file", out.display()))?;
    }
    print(a.json, &report, strict::StrictReport::table)
}

/// Seconds since `started`, to the millisecond (what reports print as wall time).
/// Prints a report: one JSON object, or its table for people.
fn print<T: serde::Serialize>(json: bool, report: &T, table: fn(&T) -> String) -> Result<()> {
    if json {
        println!("{}", serde_json::to_string(report)?);
    } else {
        print!("{}", table(report));
    }
    Ok(())
}

pub(crate) fn read_trace(path: &std::path::Path, sc: &Scenario) -> Result<trace::Trace> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("--trace {}: cannot read the file", path.display()))?;
    Ok(trace::parse(&text, &path.display().to_string(), sc)?)
}

/// Most seeds one `--seeds` may name.
const MAX_SEEDS: usize = 1_000;

/// `1-10`, `1,4,7`, `1-3,9`: the seeds in the order given, each once.
pub(crate) fn parse_seeds(list: &str) -> Result<Vec<u64>> {
    let bad = |part: &str| {
        anyhow::anyhow!(
            "--seeds {list:?}: {part:?} is not a seed or a range; write e.g. `1-10` or `1,4,7`"
        )
    };
    let mut seeds = Vec::new();
    for part in list.split(',').map(str::trim) {
        let (lo, hi) = match part.split_once('-') {
            Some((a, b)) => (a.trim().parse::<u64>(), b.trim().parse::<u64>()),
            None => (part.parse::<u64>(), part.parse::<u64>()),
        };
        let (Ok(lo), Ok(hi)) = (lo, hi) else {
            return Err(bad(part));
        };
        if hi < lo {
            bail!("--seeds {list:?}: the range {part:?} runs backwards; write it low-high");
        }
        if hi - lo >= MAX_SEEDS as u64 || seeds.len() + (hi - lo) as usize >= MAX_SEEDS {
            bail!("--seeds {list:?}: more than {MAX_SEEDS} seeds; name fewer");
        }
        for s in lo..=hi {
            if !seeds.contains(&s) {
                seeds.push(s);
            }
        }
    }
    Ok(seeds)
}

/// One run per seed, on as many threads as the machine has cores.
fn run_seeds(
    sc: &Scenario,
    trace: Option<&trace::Trace>,
    policy: PolicyKind,
    seeds: &[u64],
) -> Result<sim::SeedTable> {
    let runs = pool::par_map(seeds.len(), |i| {
        pool::run_timed(sc, trace, policy, seeds[i]).with_context(|| format!("seed {}", seeds[i]))
    })
    .into_iter()
    .map(|r| r.unwrap_or_else(|| Err(anyhow::anyhow!("a simulation thread panicked"))))
    .collect::<Result<Vec<_>>>()?;
    Ok(sim::SeedTable::new(runs))
}

#[cfg(test)]
mod tests {
    use super::parse_seeds;

    #[test]
    fn seeds_are_ranges_and_lists_and_bad_ones_are_named() {
        assert_eq!(parse_seeds("1-3").unwrap(), vec![1, 2, 3]);
        assert_eq!(parse_seeds("4, 1-2,4").unwrap(), vec![4, 1, 2]);
        let e = parse_seeds("1-x").unwrap_err().to_string();
        assert!(e.contains("\"1-x\" is not a seed"), "{e}");
        let e = parse_seeds("5-1").unwrap_err().to_string();
        assert!(e.contains("runs backwards"), "{e}");
        let e = parse_seeds("1-100000").unwrap_err().to_string();
        assert!(e.contains("more than 1000 seeds"), "{e}");
    }
}
