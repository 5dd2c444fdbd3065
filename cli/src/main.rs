//! `allot`: one CLI for users, managers and operators.
//!
//! `version`; the users' and managers' commands against allotd (`submit`, `queue`,
//! `status`, `cancel`, `share`, `budget set`) and the operators' `nodes`, in
//! `remote`; the operators' `xid explain|scan`; and the per-host operator commands
//! that talk to the local allot-agent (`leases`, `gpus`, `drain`, `undrain`, `events`,
//! `lease start|revoke`), in `local`.

mod duration;
mod failure;
mod local;
mod remote;
mod size;
mod table;
mod xid;

use clap::{CommandFactory, Parser, Subcommand};

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
    #[command(flatten)]
    Remote(remote::Remote),
    /// NVIDIA XID errors: what they mean and what allot does about them.
    #[command(subcommand)]
    Xid(xid::XidCommand),
    #[command(flatten)]
    Local(local::Local),
}

fn main() -> std::process::ExitCode {
    let result = match Cli::parse().command {
        Command::Version => {
            println!("allot {}", env!("CARGO_PKG_VERSION"));
            Ok(())
        }
        Command::Xid(c) => xid::run(c),
        Command::Remote(c) => {
            if let Err(u) = remote::validate(&c) {
                usage_error(u);
            }
            return remote::run(c);
        }
        Command::Local(c) => {
            if let Err(u) = local::validate(&c) {
                usage_error(u);
            }
            return local::run(c);
        }
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("allot: {e:#}");
            std::process::ExitCode::from(2)
        }
    }
}

/// Exits 2 with clap's layout and the usage line of the subcommand at fault.
fn usage_error(u: local::Usage) -> ! {
    let mut root = Cli::command();
    // Building fills in each subcommand's full name (`allot lease start`) for its usage.
    root.build();
    let mut cmd = root;
    for name in u.path {
        match cmd.find_subcommand(name).cloned() {
            Some(sub) => cmd = sub,
            None => break,
        }
    }
    cmd.error(clap::error::ErrorKind::MissingRequiredArgument, u.message)
        .exit()
}
