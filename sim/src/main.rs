//! `allot-sim`: the policy simulator. A scenario (and optionally a trace) in, a month
//! of scheduling by the same core allotd runs on a virtual clock, a report out.

use clap::Parser;

/// The simulator allocates millions of small values a run (6M workloads in the
/// 100,000-GPU month); mimalloc serves them faster than glibc's malloc, and the
/// benches (`sim/benches`) run on it too.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(
    name = "allot-sim",
    version,
    about = "Simulate allot's fair-share policy on a scenario or a cluster trace"
)]
#[command(args_conflicts_with_subcommands = true)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    #[command(flatten)]
    args: allot_sim::cli::Args,
}

#[derive(clap::Subcommand)]
enum Command {
    /// Judge allot's default policy on every scenario of a directory, on many seeds,
    /// against the priority baseline and FIFO with EASY backfill, and print the
    /// spread of each measure and a verdict per target.
    Suite(allot_sim::suite::SuiteArgs),
    /// Measure the start-time forecast against what happened: at each sampled
    /// arrival, the forecast p50/p90 start of the new work, then its actual start;
    /// prints the share that started by its p90, the median errors and the cost.
    Forecast(allot_sim::forecast::ForecastArgs),
}

fn main() -> std::process::ExitCode {
    if let Some(code) =
        allot_common::clidocs::write_if_asked(<Cli as clap::CommandFactory>::command)
    {
        return code;
    }
    let cli = Cli::parse();
    allot_common::logging::init("info", allot_common::logging::Format::Text);
    let result = match cli.command {
        Some(Command::Suite(a)) => allot_sim::suite::run(a),
        Some(Command::Forecast(a)) => allot_sim::forecast::run(a),
        None => allot_sim::cli::run(cli.args),
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("allot-sim: {e:#}");
            std::process::ExitCode::from(2)
        }
    }
}
