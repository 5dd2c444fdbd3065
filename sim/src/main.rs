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
struct Cli {
    #[command(flatten)]
    args: allot_sim::cli::Args,
}

fn main() -> std::process::ExitCode {
    if let Some(code) =
        allot_common::clidocs::write_if_asked(<Cli as clap::CommandFactory>::command)
    {
        return code;
    }
    let cli = Cli::parse();
    allot_common::logging::init("info", allot_common::logging::Format::Text);
    match allot_sim::cli::run(cli.args) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("allot-sim: {e:#}");
            std::process::ExitCode::from(2)
        }
    }
}
