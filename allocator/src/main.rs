//! `allotd`: the allot fair-share allocator: the service (`serve`), a whole local
//! cluster on fake GPUs (`dev`), an example config (`init`), and the state file's
//! tools (`state`); `simulate` is an alias of `allot-sim` for one release.

mod acked;
mod admin;
mod admin_cmd;
mod api;
mod attach;
mod config;
mod conns;
mod daemon;
mod dev;
mod forecast;
mod history;
mod limits;
mod loadtest;
mod log_relay;
mod logs;
mod metrics;
mod notify;
mod pki;
mod reports;
mod serve;
mod state;
mod state_cmd;
mod store;
mod web;
mod wire;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "allotd", version, about = "allot fair-share allocator")]
struct Cli {
    /// Log lines as text or as one JSON object each (also $ALLOT_LOG_FORMAT); under
    /// systemd, text carries syslog priorities for journalctl -p.
    #[arg(long, global = true, env = "ALLOT_LOG_FORMAT", default_value = "text")]
    log_format: allot_common::logging::Format,
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
    /// Write an example config (unless one is there) and create the cluster CA and
    /// allotd's certificate in its state dir.
    Init {
        /// Where the config is, or goes.
        #[arg(default_value = "allotd.toml")]
        path: std::path::PathBuf,
    },
    /// Simulate a month of scheduling: moved to `allot-sim` (same options); this
    /// alias goes in the next release.
    Simulate(allot_sim::cli::Args),
    /// User tokens (through the running allotd's admin socket).
    #[command(subcommand)]
    Tokens(admin_cmd::Tokens),
    /// Node enrollment and revocation (through the running allotd's admin socket).
    #[command(subcommand)]
    Nodes(admin_cmd::Nodes),
    /// The state file: check, export, import; and a start-up bench.
    #[command(subcommand)]
    State(state_cmd::StateCmd),
}

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?)
}

fn init(path: &std::path::Path) -> anyhow::Result<()> {
    if path.exists() {
        println!("{} exists; kept", path.display());
    } else {
        // A config written anywhere but /etc/allot keeps its state beside it, so
        // trying allotd out never writes a CA under /var/lib.
        let text = match std::path::absolute(path)?.parent() {
            Some(dir) if dir != std::path::Path::new("/etc/allot") => {
                let state = dir.join("allotd-state");
                config::EXAMPLE.replacen(
                    "state_dir = \"/var/lib/allot/allotd\"",
                    &format!("state_dir = {:?}", state.display().to_string()),
                    1,
                )
            }
            _ => config::EXAMPLE.to_string(),
        };
        std::fs::write(path, text)?;
        println!("wrote {}; edit the org tree", path.display());
    }
    let cfg = config::ServerConfig::load(path)?;
    let pki = pki::ensure(&cfg, "allot", serve::now())?;
    println!(
        "cluster CA and allotd's certificate in {} (ca.key is 0600: run this as allotd's user, or chown it)
then: allotd serve --config {}",
        pki.dir.display(),
        path.display()
    );
    Ok(())
}

fn main() -> std::process::ExitCode {
    if let Some(code) =
        allot_common::clidocs::write_if_asked(<Cli as clap::CommandFactory>::command)
    {
        return code;
    }
    let cli = Cli::parse();
    // One line per decision (starts, preemptions, drains, breaker holds, lost
    // nodes) at info: what `journalctl -u allotd` should show.
    allot_common::logging::init("info", cli.log_format);
    // Every connection is a descriptor: 1,024 is not enough to serve a cluster.
    match allot_common::rlimit::raise_nofile() {
        Ok(n) => tracing::info!(nofile = n, "descriptor limit"),
        Err(e) => tracing::warn!(error = %e, "descriptor limit not raised"),
    }
    let result = match cli.command {
        Command::Simulate(a) => {
            eprintln!("allotd: `allotd simulate` is now `allot-sim` (same options); this alias goes in the next release");
            allot_sim::cli::run(a)
        }
        Command::Init { path } => init(&path),
        Command::Serve { config, check } => match config::ServerConfig::load(&config) {
            Err(e) => Err(e.into()),
            Ok(cfg) if check => pki::check_key_modes(&cfg).map(|()| println!("config ok")),
            Ok(cfg) => {
                runtime().and_then(|rt| rt.block_on(daemon::serve(cfg, daemon::signalled())))
            }
        },
        Command::Dev(a) => runtime().and_then(|rt| rt.block_on(dev::run(a))),
        Command::Loadtest(a) => runtime().and_then(|rt| rt.block_on(loadtest::run(a))),
        Command::Tokens(t) => runtime().and_then(|rt| rt.block_on(admin_cmd::tokens(t))),
        Command::Nodes(n) => runtime().and_then(|rt| rt.block_on(admin_cmd::nodes(n))),
        Command::State(s) => state_cmd::run(s),
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("allotd: {e:#}");
            std::process::ExitCode::from(2)
        }
    }
}
