//! `allot-agent`: the per-host daemon (see the crate docs).

use allot_agent::daemon::{run, Overrides};
use clap::Parser;
use std::path::PathBuf;

/// The allot node agent: leases, workloads, contracts, GPU health, local API.
#[derive(Parser, Debug)]
#[command(name = "allot-agent", version)]
struct Args {
    /// Config file (default /etc/allot/agent.toml if present, else built-in defaults).
    #[arg(long)]
    config: Option<PathBuf>,
    /// Unix socket of the local API (overrides agent.socket).
    #[arg(long)]
    socket: Option<PathBuf>,
    /// State directory: lease table, logs, checkpoints (overrides agent.state_dir).
    #[arg(long)]
    state_dir: Option<PathBuf>,
    /// GPU source: nvml, nvml:PATH, fake:N or fake:N:SCRIPT (overrides health.source).
    #[arg(long, value_parser = gpu_source)]
    gpu_source: Option<String>,
    /// Kernel log to follow, empty to disable (overrides health.kmsg).
    #[arg(long)]
    kmsg: Option<String>,
    /// Only check the config and exit.
    #[arg(long)]
    check_config: bool,
}

fn gpu_source(s: &str) -> Result<String, String> {
    allot_health::config::parse_source(s).map(|_| s.to_string())
}

fn main() -> std::process::ExitCode {
    allot_common::logging::init("info");
    let a = Args::parse();
    let o = Overrides {
        config: a.config,
        socket: a.socket,
        state_dir: a.state_dir,
        gpu_source: a.gpu_source,
        kmsg: a.kmsg,
    };
    if a.check_config {
        return match o.load() {
            Ok(_) => {
                println!("config ok");
                std::process::ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("allot-agent: {e}");
                std::process::ExitCode::from(2)
            }
        };
    }
    if let Err(e) = o.load() {
        eprintln!("allot-agent: {e}");
        return std::process::ExitCode::from(2);
    }
    // Each workload's output and each local client is a descriptor.
    match allot_common::rlimit::raise_nofile() {
        Ok(n) => tracing::info!(nofile = n, "descriptor limit"),
        Err(e) => tracing::warn!(error = %e, "descriptor limit not raised"),
    }
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("allot-agent: cannot start the runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    match rt.block_on(run(o)) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("allot-agent: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
