//! Operator commands on one host: `leases`, `gpus`, `gpus clear`, `drain`, `undrain`,
//! `events` and `lease start|revoke|logs`, over the local agent's unix socket (gRPC
//! `AgentLocal`).
//!
//! A host may be drained by several authors at once (its health verdict, its own
//! operator, a cluster operator through allotd); every output that shows the drain
//! state lists each drain with its author, and the helpers for that are shared with
//! `allot nodes`.

mod view;

use crate::duration::{self, iso_utc};
use crate::failure::{block_on, Failure};
use crate::health_view::gpu_json;
use crate::table::{self, or_dash};
use crate::usage::{check_contract, parse_hook, Usage};
use allot_proto::uds;
use allot_proto::v1::agent_local_client::AgentLocalClient;
use allot_proto::v1::{
    ClearGpuRequest, DrainRequest, EventsRequest, ListGpusRequest, ListLeasesRequest, LogStream,
    ReadLogRequest, RevokeLeaseRequest, StartLeaseRequest, UndrainRequest,
};
use serde_json::{json, Value};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use tonic::transport::Channel;
use view::{
    drain_json, drain_text, gpu_cell, gpu_list, gpu_text, gpus_json, gpus_text, lease_json,
    leases_table,
};

/// Where the agent listens unless `--socket` or `$ALLOT_SOCKET` says otherwise.
pub const DEFAULT_SOCKET: &str = "/run/allot/agent.sock";

/// Where the agent listens, when given after the subcommand.
#[derive(clap::Args, Debug)]
pub struct Conn {
    /// The agent's unix socket [env: ALLOT_SOCKET] [default: /run/allot/agent.sock].
    // No env or default here: those live on the root flag (`allot --socket S leases`),
    // so that this one, typed after the subcommand, is the only thing that beats it.
    // Global so that `allot gpus clear 3 --socket S` works as well as before `clear`.
    #[arg(long, global = true, value_name = "PATH")]
    socket: Option<PathBuf>,
}

/// `allot leases`.
#[derive(clap::Args, Debug)]
pub struct LeasesArgs {
    #[command(flatten)]
    conn: Conn,
    /// Ended leases too [default: live ones only].
    #[arg(long)]
    all: bool,
    /// Only this workload's leases.
    #[arg(long, value_name = "ID")]
    workload: Option<String>,
    /// Only this user's leases.
    #[arg(long, value_name = "U")]
    user: Option<String>,
    /// Print one JSON array of leases.
    #[arg(long)]
    json: bool,
}

/// `allot gpus`: the list, or a clear.
#[derive(clap::Args, Debug)]
pub struct GpusArgs {
    #[command(subcommand)]
    command: Option<GpusCommand>,
    #[command(flatten)]
    conn: Conn,
    /// Print JSON: verdict, drains and gpus, or the one GPU cleared.
    #[arg(long, global = true)]
    json: bool,
}

/// The `gpus` subcommands.
#[derive(clap::Subcommand, Debug)]
pub enum GpusCommand {
    /// Clear a GPU's sticky health conditions after a reset or a repair; prints its new state.
    #[command(
        long_about = "Clear a GPU's sticky health conditions (an XID that asked for a reset, \
            a failed state) after the GPU was reset or repaired, and print its new state. \
            The health monitor samples the GPU again: what is still wrong comes back at once. \
            The host's health drain lifts when no GPU needs one any more."
    )]
    Clear {
        /// The GPU's index, as `allot gpus` shows it.
        index: u32,
        /// What was done (kept in `allot events`): e.g. "nvidia-smi -r after XID 79".
        #[arg(long, value_name = "TEXT")]
        reason: String,
    },
}

/// `allot drain`.
#[derive(clap::Args, Debug)]
pub struct DrainArgs {
    #[command(flatten)]
    conn: Conn,
    /// Why: shown to everyone who asks why the host takes no work.
    #[arg(long, value_name = "TEXT")]
    reason: String,
    /// Revoke running leases at once instead of when their min-runtime lapses.
    #[arg(long)]
    now: bool,
    /// Print the drain state as one JSON object.
    #[arg(long)]
    json: bool,
}

/// `allot undrain`.
#[derive(clap::Args, Debug)]
pub struct UndrainArgs {
    #[command(flatten)]
    conn: Conn,
    /// Print the drain state as one JSON object.
    #[arg(long)]
    json: bool,
}

/// `allot events`.
#[derive(clap::Args, Debug)]
pub struct EventsArgs {
    #[command(flatten)]
    conn: Conn,
    /// How far back: 90s, 10m, 2h, 7d or seconds.
    #[arg(long, value_name = "DURATION", default_value = "1h", value_parser = duration::parse)]
    since: u64,
    /// Print one JSON array of events.
    #[arg(long)]
    json: bool,
}

/// The `lease` subcommands.
#[derive(clap::Subcommand, Debug)]
pub enum LeaseCommand {
    /// Start a workload (the command after `--`) or adopt a running one (--adopt PID).
    Start(StartArgs),
    /// Revoke a lease: checkpoint, then SIGTERM, then SIGKILL.
    Revoke(RevokeArgs),
    /// A lease's output on this host (`allot logs ID` reads a workload's from any host through allotd).
    Logs(LeaseLogsArgs),
}

/// `allot lease logs`.
#[derive(clap::Args, Debug)]
pub struct LeaseLogsArgs {
    #[command(flatten)]
    conn: Conn,
    /// The lease id, as `allot leases` shows it.
    id: String,
    /// Keep reading while the lease lives; ends when it has ended and everything was read.
    #[arg(short, long)]
    follow: bool,
    /// Standard error instead of standard output.
    #[arg(long)]
    stderr: bool,
}

/// `allot lease start`.
#[derive(clap::Args, Debug)]
pub struct StartArgs {
    #[command(flatten)]
    conn: Conn,
    /// How many GPUs.
    #[arg(long, value_name = "N")]
    gpus: u32,
    /// Protected runtime: no revocation before it lapses, short of `--now`. 8h, 1.5h, 90min, or as Slurm: HH:MM:SS, D-HH:MM:SS.
    #[arg(long, value_name = "DURATION", default_value = "0", value_parser = duration::parse_job)]
    min_runtime: u64,
    /// Hard limit: revoked when it is reached. 8h, 1.5h, 90min, or as Slurm: HH:MM:SS, D-HH:MM:SS.
    #[arg(long, value_name = "DURATION", value_parser = duration::parse_job)]
    time_limit: Option<u64>,
    /// How to ask for a checkpoint: signal:USR1, exec:CMD or http:URL.
    #[arg(long, value_name = "HOOK", value_parser = parse_hook)]
    checkpoint: Option<String>,
    /// Warn the work with this signal DURATION before its time limit (as Slurm's --signal; DURATION absent: 60s) [absent: the agent's default, none unless set].
    #[arg(long, value_name = "SIG[@DURATION]", value_parser = crate::usage::parse_signal)]
    signal: Option<(String, u64)>,
    /// How long a checkpoint may take before SIGTERM [absent: the agent's default].
    #[arg(long, value_name = "DURATION", value_parser = duration::parse)]
    grace: Option<u64>,
    /// Adopt this running process instead of starting a command.
    #[arg(long, value_name = "PID", conflicts_with = "argv")]
    adopt: Option<u32>,
    /// Workload id [absent: the lease id].
    #[arg(long, value_name = "ID")]
    workload: Option<String>,
    /// Run as this user [absent: the caller].
    #[arg(long, value_name = "NAME")]
    user: Option<String>,
    /// Print the lease as one JSON object.
    #[arg(long)]
    json: bool,
    /// The command to run, after `--`.
    #[arg(last = true, value_name = "CMD")]
    argv: Vec<String>,
}

/// `allot lease revoke`.
#[derive(clap::Args, Debug)]
pub struct RevokeArgs {
    #[command(flatten)]
    conn: Conn,
    /// The lease id.
    id: String,
    /// Ignore the protected min-runtime.
    #[arg(long)]
    now: bool,
    /// Print the lease as one JSON object.
    #[arg(long)]
    json: bool,
}

/// The commands that talk to the local agent.
#[derive(clap::Subcommand, Debug)]
pub enum Local {
    /// This host's leases: workload, state, protection left, usage, how they ended.
    Leases(LeasesArgs),
    /// This host's GPUs, their health and every drain on the host; `gpus clear` after a repair.
    Gpus(GpusArgs),
    /// Drain this host: no new leases; revoke running ones (at min-runtime lapse, or --now).
    Drain(DrainArgs),
    /// Lift this host's operator drain (health and cluster drains stay).
    Undrain(UndrainArgs),
    /// What the agent did and saw: health, contract and lease events.
    Events(EventsArgs),
    /// Start, adopt or revoke one lease by hand.
    #[command(subcommand)]
    Lease(LeaseCommand),
}

impl Local {
    /// The connection flags of whichever command this is.
    fn conn(&self) -> &Conn {
        match self {
            Local::Leases(a) => &a.conn,
            Local::Gpus(a) => &a.conn,
            Local::Drain(a) => &a.conn,
            Local::Undrain(a) => &a.conn,
            Local::Events(a) => &a.conn,
            Local::Lease(LeaseCommand::Start(a)) => &a.conn,
            Local::Lease(LeaseCommand::Revoke(a)) => &a.conn,
            Local::Lease(LeaseCommand::Logs(a)) => &a.conn,
        }
    }
}

/// Checks what clap cannot express.
pub fn validate(cmd: &Local) -> Result<(), Usage> {
    match cmd {
        Local::Lease(LeaseCommand::Start(a)) => {
            if a.adopt.is_none() && a.argv.is_empty() {
                return Err(Usage {
                    path: &["lease", "start"],
                    message: "say what the lease runs: a command after `--` (allot lease start --gpus 1 -- python train.py) or a running process with --adopt PID".into(),
                });
            }
            check_contract(&["lease", "start"], a.min_runtime, a.time_limit)?;
            crate::usage::check_signal(&["lease", "start"], a.signal.as_ref(), a.time_limit)
        }
        Local::Gpus(GpusArgs {
            command: Some(GpusCommand::Clear { reason, .. }),
            ..
        }) if reason.trim().is_empty() => Err(Usage {
            path: &["gpus", "clear"],
            message: "--reason: say what was done to the GPU (e.g. --reason \"nvidia-smi -r after XID 79\")".into(),
        }),
        _ => Ok(()),
    }
}

/// Runs one local command to completion and says how the process should exit;
/// `socket` is the one given before the subcommand, or from the environment.
pub fn run(cmd: Local, socket: PathBuf) -> ExitCode {
    let socket = cmd.conn().socket.clone().unwrap_or(socket);
    block_on(dispatch(cmd, socket))
}

async fn client(socket: &Path) -> Result<AgentLocalClient<Channel>, Failure> {
    Ok(AgentLocalClient::new(uds::connect(socket).await?))
}

/// Reads a lease's output from the agent, 1 MiB at a time, following while it lives.
async fn lease_logs(socket: &Path, a: LeaseLogsArgs) -> Result<(), Failure> {
    use std::io::Write;
    let mut c = client(socket).await?;
    let mut offset = 0u64;
    loop {
        let chunk = c
            .read_log(ReadLogRequest {
                request_id: 0,
                lease_id: a.id.clone(),
                stream: if a.stderr {
                    LogStream::Stderr
                } else {
                    LogStream::Stdout
                } as i32,
                offset,
                max_bytes: 1 << 20,
            })
            .await?
            .into_inner();
        offset += chunk.data.len() as u64;
        let mut out = std::io::stdout().lock();
        match out.write_all(&chunk.data).and_then(|()| out.flush()) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => std::process::exit(141),
            Err(e) => {
                return Err(Failure::Other(
                    anyhow::Error::new(e).context("writing to stdout"),
                ))
            }
        }
        if chunk.eof || chunk.data.is_empty() {
            if !a.follow || !chunk.lease_live {
                return Ok(());
            }
            // The file's end while the lease lives: look again shortly.
            tokio::time::sleep(std::time::Duration::from_millis(250)).await;
        }
    }
}

async fn dispatch(cmd: Local, socket: PathBuf) -> Result<(), Failure> {
    match cmd {
        Local::Lease(LeaseCommand::Logs(a)) => lease_logs(&socket, a).await?,
        Local::Leases(a) => {
            let leases = client(&socket)
                .await?
                .list_leases(ListLeasesRequest {})
                .await?
                .into_inner()
                .leases
                .into_iter()
                .filter(|l| a.all || l.state() != allot_proto::v1::LeaseState::Ended)
                .filter(|l| a.workload.as_ref().is_none_or(|w| *w == l.workload_id))
                .filter(|l| a.user.as_ref().is_none_or(|u| *u == l.user))
                .collect::<Vec<_>>();
            if a.json {
                let v: Vec<Value> = leases.iter().map(lease_json).collect();
                println!("{}", serde_json::to_string(&v)?);
            } else {
                print!("{}", leases_table(&leases, duration::now_ms()));
            }
        }
        Local::Gpus(GpusArgs {
            command: None,
            json,
            ..
        }) => {
            let r = client(&socket)
                .await?
                .list_gpus(ListGpusRequest {})
                .await?
                .into_inner();
            if json {
                println!("{}", gpus_json(&r));
            } else {
                print!("{}", gpus_text(&r));
            }
        }
        Local::Gpus(GpusArgs {
            command: Some(GpusCommand::Clear { index, reason }),
            json,
            ..
        }) => {
            let g = client(&socket)
                .await?
                .clear_gpu(ClearGpuRequest { index, reason })
                .await?
                .into_inner();
            if json {
                println!("{}", gpu_json(&g));
            } else {
                print!("{}", gpu_text(&g));
            }
        }
        Local::Drain(a) => {
            let d = client(&socket)
                .await?
                .drain(DrainRequest {
                    reason: a.reason,
                    now: a.now,
                })
                .await?
                .into_inner();
            if a.json {
                println!("{}", drain_json(&d));
            } else {
                print!("{}", drain_text(&d, false));
            }
        }
        Local::Undrain(a) => {
            let d = client(&socket)
                .await?
                .undrain(UndrainRequest {})
                .await?
                .into_inner();
            if a.json {
                println!("{}", drain_json(&d));
            } else {
                print!("{}", drain_text(&d, true));
            }
        }
        Local::Events(a) => {
            let now = duration::now_ms() / 1_000;
            let since = i64::try_from(a.since).map_or(i64::MIN, |s| now.saturating_sub(s));
            let mut c = client(&socket).await?;
            let events = c
                .events(EventsRequest { since_unix: since })
                .await?
                .into_inner()
                .events;
            // Events name the lease only; the agent's lease list (live and recently
            // ended) says whose work it was. Older leases show no workload.
            let workloads: HashMap<String, String> =
                if events.iter().any(|e| !e.lease_id.is_empty()) {
                    c.list_leases(ListLeasesRequest {})
                        .await?
                        .into_inner()
                        .leases
                        .into_iter()
                        .map(|l| (l.id, l.workload_id))
                        .collect()
                } else {
                    HashMap::new()
                };
            let workload = |lease: &str| workloads.get(lease).filter(|w| !w.is_empty()).cloned();
            if a.json {
                let v: Vec<Value> = events
                    .iter()
                    .map(|e| {
                        json!({
                            "at_unix": e.at_unix,
                            "time": iso_utc(e.at_unix),
                            "kind": e.kind,
                            "lease_id": e.lease_id,
                            "workload_id": workload(&e.lease_id),
                            "gpu": e.gpu,
                            "message": e.message,
                        })
                    })
                    .collect();
                println!("{}", serde_json::to_string(&v)?);
            } else {
                let rows: Vec<Vec<String>> = events
                    .iter()
                    .map(|e| {
                        vec![
                            iso_utc(e.at_unix),
                            or_dash(&e.kind),
                            or_dash(&e.lease_id),
                            workload(&e.lease_id).unwrap_or_else(|| "-".into()),
                            gpu_cell(&e.gpu),
                            e.message.clone(),
                        ]
                    })
                    .collect();
                print!(
                    "{}",
                    table::render(
                        &["TIME", "KIND", "LEASE", "WORKLOAD", "GPU", "MESSAGE"],
                        &rows
                    )
                );
            }
        }
        Local::Lease(LeaseCommand::Start(a)) => {
            let req = StartLeaseRequest {
                gpus: a.gpus,
                min_runtime_s: a.min_runtime,
                time_limit_s: a.time_limit,
                checkpoint_hook: a.checkpoint.unwrap_or_default(),
                grace_s: a.grace.unwrap_or(0),
                argv: a.argv,
                user: a.user.unwrap_or_default(),
                adopt_pid: a.adopt.unwrap_or(0),
                workload_id: a.workload.unwrap_or_default(),
                // The work starts here, as a submission does (the agent checks the
                // user may enter it).
                cwd: std::env::current_dir()
                    .map(|d| d.to_string_lossy().into_owned())
                    .unwrap_or_default(),
                warn_signal: a.signal.as_ref().map(|s| s.0.clone()).unwrap_or_default(),
                warn_before_s: a.signal.as_ref().map_or(0, |s| s.1),
            };
            let l = client(&socket).await?.start_lease(req).await?.into_inner();
            if a.json {
                println!("{}", lease_json(&l));
            } else {
                let how = if l.adopted { "adopted" } else { "started" };
                println!(
                    "lease {} {how} on GPUs {} (pid {})",
                    l.id,
                    gpu_list(&l.gpu_uuids),
                    l.pid
                );
            }
        }
        Local::Lease(LeaseCommand::Revoke(a)) => {
            let l = client(&socket)
                .await?
                .revoke_lease(RevokeLeaseRequest {
                    lease_id: a.id,
                    now: a.now,
                })
                .await?
                .into_inner();
            if a.json {
                println!("{}", lease_json(&l));
            } else {
                print!("{}", leases_table(&[l], duration::now_ms()));
            }
        }
    }
    Ok(())
}
