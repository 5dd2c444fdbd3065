//! `allotd`: the allot fair-share allocator: the service (`serve`), a whole local
//! cluster on fake GPUs (`dev`), an example config (`init`), and the policy
//! simulator (`simulate`).

mod api;
mod config;
mod conns;
mod dev;
mod limits;
mod loadtest;
mod metrics;
mod serve;
mod simulate;
mod state;
mod store;
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
    /// Run the allocator service.
    Serve {
        /// Config file (`allotd init` writes one).
        #[arg(long, default_value = "/etc/allot/allotd.toml")]
        config: std::path::PathBuf,
        /// Check the config and exit.
        #[arg(long)]
        check: bool,
    },
    /// Run allotd and N agents on fake GPUs on this machine.
    Dev(dev::Args),
    /// Load-test an allotd: many simulated agents over real gRPC plus submissions.
    Loadtest(loadtest::Args),
    /// Write an example config with an org tree.
    Init {
        /// Where to write it.
        #[arg(default_value = "allotd.toml")]
        path: std::path::PathBuf,
    },
    /// Simulate a month of scheduling on a scenario (and optionally a trace).
    Simulate(simulate::Args),
}

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?)
}

fn init(path: &std::path::Path) -> anyhow::Result<()> {
    if path.exists() {
        anyhow::bail!("{} exists; not overwriting it", path.display());
    }
    std::fs::write(path, config::EXAMPLE)?;
    println!(
        "wrote {}; edit the org tree, then `allotd serve --config {}`",
        path.display(),
        path.display()
    );
    Ok(())
}

fn main() -> std::process::ExitCode {
    allot_common::logging::init("warn");
    let cli = Cli::parse();
    // Every connection is a descriptor: 1,024 is not enough to serve a cluster.
    match allot_common::rlimit::raise_nofile() {
        Ok(n) => tracing::info!(nofile = n, "descriptor limit"),
        Err(e) => tracing::warn!(error = %e, "descriptor limit not raised"),
    }
    let result = match cli.command {
        Command::Simulate(a) => simulate::run(a),
        Command::Init { path } => init(&path),
        Command::Serve { config, check } => match config::ServerConfig::load(&config) {
            Err(e) => Err(e.into()),
            Ok(_) if check => {
                println!("config ok");
                Ok(())
            }
            Ok(cfg) => runtime().and_then(|rt| rt.block_on(serve::serve(cfg, serve::signalled()))),
        },
        Command::Dev(a) => runtime().and_then(|rt| rt.block_on(dev::run(a))),
        Command::Loadtest(a) => runtime().and_then(|rt| rt.block_on(loadtest::run(a))),
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("allotd: {e:#}");
            std::process::ExitCode::from(2)
        }
    }
}
