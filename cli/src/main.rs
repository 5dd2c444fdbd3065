//! `allot`: one CLI for users, managers and operators.
//!
//! Today it only knows `version`; the user, manager and operator commands arrive with
//! the agent (issue 4) and the allocator service (issue 5).

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "allot", version, about = "allot: GPU fair-share allocator CLI")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Print the version.
    Version,
}

fn main() -> anyhow::Result<()> {
    match Cli::parse().command {
        Command::Version => println!("allot {}", env!("CARGO_PKG_VERSION")),
    }
    Ok(())
}
