//! `allotd`: the allot fair-share allocator.
//!
//! Today it runs the policy simulator (`allotd simulate`); the service (`serve`), the
//! local cluster (`dev`) and `init` arrive with issue 5.

mod simulate;
mod svg;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "allotd", version, about = "allot fair-share allocator")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Simulate a month of scheduling on a scenario (and optionally a trace).
    Simulate(simulate::Args),
}

fn main() -> std::process::ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("ALLOT_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Simulate(a) => simulate::run(a),
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("allotd: {e:#}");
            std::process::ExitCode::from(2)
        }
    }
}
