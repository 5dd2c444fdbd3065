//! `allot`: one CLI for users, managers and operators.
//!
//! Today: `version` and the operators' `xid explain|scan`; the user, manager and
//! other operator commands arrive with the agent (issue 4) and the allocator
//! service (issue 5).

mod xid;

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
    /// NVIDIA XID errors: what they mean and what allot does about them.
    #[command(subcommand)]
    Xid(xid::XidCommand),
}

fn main() -> std::process::ExitCode {
    let result = match Cli::parse().command {
        Command::Version => {
            println!("allot {}", env!("CARGO_PKG_VERSION"));
            Ok(())
        }
        Command::Xid(c) => xid::run(c),
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("allot: {e:#}");
            std::process::ExitCode::from(2)
        }
    }
}
