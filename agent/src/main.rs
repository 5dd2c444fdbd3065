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
    /// Log lines as text or as one JSON object each (also $ALLOT_LOG_FORMAT); under
    /// systemd, text carries syslog priorities for journalctl -p.
    #[arg(long, global = true, env = "ALLOT_LOG_FORMAT", default_value = "text")]
    log_format: allot_common::logging::Format,
    /// Stop (as on SIGTERM: workloads keep running) when process PID, the one that
    /// started this agent, dies, however it dies: `allotd dev`'s agents, so a killed
    /// `allotd dev` leaves none behind.
    #[arg(long, hide = true, value_name = "PID")]
    exit_with_parent: Option<i32>,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(clap::Subcommand, Debug)]
enum Command {
    /// Get this host's certificate from allotd with a one-time token (an admin
    /// prints one with `allotd nodes enroll NAME`); stored in STATE_DIR/pki.
    Enroll {
        /// allotd's address, e.g. https://allotd.example.org:7070.
        #[arg(long)]
        server: String,
        /// The enrollment token.
        #[arg(long, env = "ALLOT_ENROLL_TOKEN", hide_env_values = true)]
        token: String,
        /// The cluster CA certificate (public), to check allotd by.
        #[arg(long, default_value = "/etc/allot/ca.pem")]
        ca: PathBuf,
    },
}

/// `allot-agent enroll`.
fn enroll(o: &Overrides, server: &str, token: &str, ca: &std::path::Path) -> anyhow::Result<()> {
    use anyhow::Context;
    let cfg = o.load()?;
    let ca_pem = std::fs::read_to_string(ca).with_context(|| {
        format!(
            "reading the cluster CA {} (copy allotd's pki/ca.pem here, or give --ca)",
            ca.display()
        )
    })?;
    let host = if cfg.agent.host.is_empty() {
        sysinfo::System::host_name().unwrap_or_else(|| "localhost".into())
    } else {
        cfg.agent.host.clone()
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let c = rt.block_on(allot_agent::credentials::enroll(
        server,
        token,
        &ca_pem,
        &cfg.agent.state_dir,
        &host,
    ))?;
    println!(
        "enrolled as {} (certificate until {}; renewed automatically) in {}",
        c.info.common_name,
        c.info.not_after,
        allot_agent::credentials::dir(&cfg.agent.state_dir).display()
    );
    if c.info.common_name != host {
        println!(
            "note: the token was for {:?}; set agent.host = {:?} in the agent config",
            c.info.common_name, c.info.common_name
        );
    }
    Ok(())
}

fn gpu_source(s: &str) -> Result<String, String> {
    allot_health::config::parse_source(s).map(|_| s.to_string())
}

fn main() -> std::process::ExitCode {
    // The per-lease supervisor the agent starts (an internal protocol, not a user
    // command): before logging and config, which are the daemon's and not its.
    let title = std::env::args_os().next().unwrap_or_default();
    if title
        .to_str()
        .is_some_and(|t| t.starts_with(allot_agent::supervisor::TITLE))
        || std::env::args_os().nth(1).is_some_and(|a| a == "supervise")
    {
        return allot_agent::supervisor::main();
    }
    if let Some(code) =
        allot_common::clidocs::write_if_asked(<Args as clap::CommandFactory>::command)
    {
        return code;
    }
    let a = Args::parse();
    allot_common::logging::init("info", a.log_format);
    let o = Overrides {
        config: a.config,
        socket: a.socket,
        state_dir: a.state_dir,
        gpu_source: a.gpu_source,
        kmsg: a.kmsg,
    };
    if let Some(Command::Enroll { server, token, ca }) = &a.command {
        return match enroll(&o, server, token, ca) {
            Ok(()) => std::process::ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("allot-agent enroll: {e:#}");
                std::process::ExitCode::from(2)
            }
        };
    }
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
    if let Some(parent) = a.exit_with_parent {
        if let Err(e) = nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGTERM) {
            eprintln!("allot-agent: --exit-with-parent: {e}");
            return std::process::ExitCode::from(2);
        }
        // The parent may have died before the request was made.
        if nix::unistd::getppid().as_raw() != parent {
            eprintln!("allot-agent: the process that started it is gone");
            return std::process::ExitCode::FAILURE;
        }
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
