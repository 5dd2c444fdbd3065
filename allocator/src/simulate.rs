//! `allotd simulate`: read the scenario and trace, run the core on a virtual clock,
//! print the report.

use allot_sim::{self as sim, scenario::AI2, trace, PolicyKind, Scenario, SimOptions};
use anyhow::{bail, Context, Result};
use std::path::PathBuf;
use std::time::Instant;

/// Options of `allotd simulate`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Scenario: a TOML file, or the name of a built-in one (`ai2`).
    #[arg(long, default_value = "ai2")]
    scenario: String,
    /// Replay this CSV trace instead of the scenario's workload classes.
    #[arg(long)]
    trace: Option<PathBuf>,
    /// `fairshare` (allot) or `priority` (the static-priority baseline).
    #[arg(long, default_value = "fairshare")]
    policy: String,
    /// Seed (default: the scenario's).
    #[arg(long)]
    seed: Option<u64>,
    /// Simulated days (default: the scenario's).
    #[arg(long)]
    days: Option<u32>,
    /// Print one JSON object instead of the table.
    #[arg(long)]
    json: bool,
    /// Write plots (team shares, waits, occupancy) as SVG files into this directory.
    #[arg(long)]
    svg: Option<PathBuf>,
}

pub fn run(a: Args) -> Result<()> {
    let policy = match a.policy.as_str() {
        "fairshare" => PolicyKind::FairShare,
        "priority" => PolicyKind::Priority,
        other => bail!("--policy {other:?}: use `fairshare` or `priority`"),
    };
    let (text, file) = if a.scenario == "ai2" {
        (AI2.to_string(), "ai2 (built-in)".to_string())
    } else {
        let text = std::fs::read_to_string(&a.scenario).with_context(|| {
            format!(
                "--scenario {}: cannot read the file (or name a built-in: ai2)",
                a.scenario
            )
        })?;
        (text, a.scenario.clone())
    };
    let mut sc = Scenario::parse(&text, &file)?;
    if let Some(d) = a.days {
        if d == 0 {
            bail!("--days 0: simulate at least 1 day");
        }
        sc.days = d;
    }
    let seed = a.seed.unwrap_or(sc.seed);
    let (jobs, groups) = match &a.trace {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("--trace {}: cannot read the file", path.display()))?;
            let t = trace::parse(&text, &path.display().to_string(), &sc)?;
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
    report.sim_wall_s = (started.elapsed().as_secs_f64() * 1000.0).round() / 1000.0;
    if let Some(dir) = &a.svg {
        crate::svg::write_all(dir, &report)
            .with_context(|| format!("--svg {}: cannot write plots", dir.display()))?;
    }
    if a.json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        print!("{}", report.table());
    }
    Ok(())
}
