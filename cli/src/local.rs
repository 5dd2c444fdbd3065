//! Operator commands on one host: `leases`, `gpus`, `gpus clear`, `drain`, `undrain`,
//! `events` and `lease start|revoke`, over the local agent's unix socket (gRPC
//! `AgentLocal`).
//!
//! A host may be drained by several authors at once (its health verdict, its own
//! operator, a cluster operator through allotd); every output that shows the drain
//! state lists each drain with its author, and the helpers for that are shared with
//! `allot nodes`.

use crate::duration::{self, age, exact, iso_utc, ms_to_secs_ceil};
use crate::failure::{block_on, Failure};
use crate::table::{self, or_dash};
use allot_proto::uds;
use allot_proto::v1::agent_local_client::AgentLocalClient;
use allot_proto::v1::{
    ClearGpuRequest, DrainInfo, DrainRequest, DrainResponse, EventsRequest, Gpu, GpuState,
    HostVerdict, Lease, LeaseState, ListGpusRequest, ListGpusResponse, ListLeasesRequest,
    RevokeLeaseRequest, StartLeaseRequest, UndrainRequest,
};
use serde_json::{json, Value};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use tonic::transport::Channel;

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
}

/// `allot lease start`.
#[derive(clap::Args, Debug)]
pub struct StartArgs {
    #[command(flatten)]
    conn: Conn,
    /// How many GPUs.
    #[arg(long, value_name = "N")]
    gpus: u32,
    /// Protected runtime: no revocation before it lapses, short of `--now`.
    #[arg(long, value_name = "DURATION", default_value = "0", value_parser = duration::parse)]
    min_runtime: u64,
    /// Hard limit: revoked when it is reached.
    #[arg(long, value_name = "DURATION", value_parser = duration::parse)]
    time_limit: Option<u64>,
    /// How to ask for a checkpoint: signal:USR1, exec:CMD or http:URL.
    #[arg(long, value_name = "HOOK", value_parser = parse_hook)]
    checkpoint: Option<String>,
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
        }
    }
}

/// Clap value parser: the hook's kind only; the agent checks the rest and says why.
pub(crate) fn parse_hook(s: &str) -> Result<String, String> {
    let known = ["signal:", "exec:", "http:"];
    match known.iter().find(|k| s.starts_with(*k)) {
        Some(k) if s.len() > k.len() => Ok(s.to_string()),
        _ => Err("expected signal:NAME (e.g. signal:USR1), exec:CMD or http:URL".into()),
    }
}

/// A usage problem clap cannot express, reported like clap's own (exit 2).
pub struct Usage {
    /// The subcommand path whose usage line to show, e.g. `["lease", "start"]`.
    pub path: &'static [&'static str],
    /// What is wrong and how to say it right.
    pub message: String,
}

/// `--min-runtime` longer than `--time-limit`: the contract cannot be kept, so it is
/// refused before anything is asked (`lease start` and `submit` say it alike).
pub(crate) fn check_contract(
    path: &'static [&'static str],
    min_runtime: u64,
    time_limit: Option<u64>,
) -> Result<(), Usage> {
    match time_limit {
        Some(limit) if min_runtime > limit => Err(Usage {
            path,
            message: format!(
                "--min-runtime {} is longer than --time-limit {}: the work would be killed before its protection ends",
                exact(min_runtime),
                exact(limit)
            ),
        }),
        _ => Ok(()),
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
            check_contract(&["lease", "start"], a.min_runtime, a.time_limit)
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

async fn dispatch(cmd: Local, socket: PathBuf) -> Result<(), Failure> {
    match cmd {
        Local::Leases(a) => {
            let leases = client(&socket)
                .await?
                .list_leases(ListLeasesRequest {})
                .await?
                .into_inner()
                .leases;
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

fn gpu_list(uuids: &[String]) -> String {
    if uuids.is_empty() {
        "(none)".into()
    } else {
        uuids.join(", ")
    }
}

/// How many GPUs an events cell names in full before it counts the rest.
const GPUS_SHOWN: usize = 2;

/// An event's GPUs for a table cell: UUIDs cut to their first group and at most
/// [`GPUS_SHOWN`] of them, `GPU-1a2b3c4d…,GPU-5e6f7a8b…,+6`; `--json` has them whole.
///
/// A lease's event lists every GPU UUID (41 characters each), and one such cell
/// would otherwise widen every row of the table to hundreds of columns.
fn gpu_cell(gpus: &str) -> String {
    let items: Vec<&str> = gpus
        .split(',')
        .map(str::trim)
        .filter(|g| !g.is_empty())
        .collect();
    if items.is_empty() {
        return "-".into();
    }
    let short = |g: &str| -> String {
        // `GPU-` and the UUID's first group of 8 hex digits tell a host's GPUs apart.
        const KEEP: usize = "GPU-".len() + 8;
        if g.starts_with("GPU-") && g.chars().count() > KEEP + 1 {
            format!("{}…", g.chars().take(KEEP).collect::<String>())
        } else {
            g.to_string()
        }
    };
    let mut cell: Vec<String> = items.iter().take(GPUS_SHOWN).map(|g| short(g)).collect();
    if items.len() > GPUS_SHOWN {
        cell.push(format!("+{}", items.len() - GPUS_SHOWN));
    }
    cell.join(",")
}

fn lease_state(s: LeaseState) -> &'static str {
    match s {
        LeaseState::Starting => "starting",
        LeaseState::Running => "running",
        LeaseState::Revoking => "revoking",
        LeaseState::Checkpointing => "checkpointing",
        LeaseState::Ended => "ended",
        LeaseState::Unspecified => "unknown",
    }
}

fn gpu_state(s: GpuState) -> &'static str {
    match s {
        GpuState::Healthy => "healthy",
        GpuState::Degraded => "degraded",
        GpuState::Failed => "failed",
        GpuState::Unspecified => "unknown",
    }
}

/// A host verdict as tables and JSON show it.
pub(crate) fn verdict(v: HostVerdict) -> &'static str {
    match v {
        HostVerdict::Ok => "ok",
        HostVerdict::Drain => "drain",
        HostVerdict::DrainNow => "drain-now",
        HostVerdict::Unspecified => "unknown",
    }
}

/// A lease as JSON; the generated types do not derive `Serialize`.
fn lease_json(l: &Lease) -> Value {
    json!({
        "id": l.id,
        "workload_id": l.workload_id,
        "gpu_uuids": l.gpu_uuids,
        "pid": l.pid,
        "user": l.user,
        "state": lease_state(l.state()),
        "adopted": l.adopted,
        "start_unix_ms": l.start_unix_ms,
        "min_runtime_s": l.min_runtime_s,
        "time_limit_s": l.time_limit_s,
        "checkpoint_hook": l.checkpoint_hook,
        "grace_s": l.grace_s,
        "not_before_unix": l.not_before_unix,
        "revoke_why": l.revoke_why,
        "ended_by": l.ended_by,
        "end_reason": l.end_reason,
        "exit_code": l.exit_code,
        "ended_unix": l.ended_unix,
        "steps": l.steps.iter().map(|s| json!({
            "rung": s.rung,
            "took_ms": s.took_ms,
            "note": s.note,
        })).collect::<Vec<_>>(),
        "cpu_pct": l.cpu_pct,
        "rss_bytes": l.rss_bytes,
    })
}

/// Start in milliseconds; an agent that only filled in seconds still gets ages.
fn start_ms(l: &Lease) -> i64 {
    if l.start_unix_ms != 0 {
        l.start_unix_ms
    } else {
        l.start_unix.saturating_mul(1_000)
    }
}

fn leases_table(leases: &[Lease], now_ms: i64) -> String {
    let rows: Vec<Vec<String>> = leases
        .iter()
        .map(|l| {
            let ended = l.state() == LeaseState::Ended;
            let start = start_ms(l);
            let started = if start == 0 {
                "-".into()
            } else {
                age(ms_to_secs_ceil(now_ms - start))
            };
            let protected_until = start.saturating_add(
                i64::try_from(l.min_runtime_s.saturating_mul(1_000)).unwrap_or(i64::MAX),
            );
            let protected = if ended {
                "-".into()
            } else if protected_until > now_ms {
                age(ms_to_secs_ceil(protected_until - now_ms))
            } else {
                "lapsed".into()
            };
            let (cpu, rss) = if ended {
                ("-".into(), "-".into())
            } else {
                (format!("{:.0}", l.cpu_pct), table::bytes(l.rss_bytes))
            };
            let end = if ended {
                let mut e = format!("{}/{}", or_dash(&l.ended_by), or_dash(&l.end_reason));
                if let Some(code) = l.exit_code {
                    e.push_str(&format!(" (exit {code})"));
                }
                e
            } else {
                "-".into()
            };
            vec![
                l.id.clone(),
                or_dash(&l.workload_id),
                lease_state(l.state()).into(),
                l.gpu_uuids.len().to_string(),
                if l.pid == 0 {
                    "-".into()
                } else {
                    l.pid.to_string()
                },
                or_dash(&l.user),
                started,
                protected,
                cpu,
                rss,
                end,
            ]
        })
        .collect();
    table::render(
        &[
            "ID",
            "WORKLOAD",
            "STATE",
            "GPUS",
            "PID",
            "USER",
            "STARTED",
            "PROTECTED",
            "CPU%",
            "RSS",
            "END",
        ],
        &rows,
    )
}

/// A drain's author and reason: `health (xid:79 on 0000:3b:00)`,
/// `local-operator alice: rack work`.
pub(crate) fn drain_who(d: &DrainInfo) -> String {
    // A health drain's author is the monitor or the signal, which its reason names.
    match (d.by.as_str(), d.author.trim()) {
        ("health", _) if d.reason.is_empty() => "health".into(),
        ("health", _) => format!("health ({})", d.reason),
        (by, "") => format!("{}: {}", or_dash(by), or_dash(&d.reason)),
        (by, author) => format!("{} {author}: {}", or_dash(by), or_dash(&d.reason)),
    }
}

/// One drain on one line: who and why, since when, how leases end, whether it is
/// held: `drained by local-operator alice: rack work since 2026-…Z, at min-runtime lapse`.
pub(crate) fn drain_line(d: &DrainInfo) -> String {
    let mut s = drain_who(d);
    if d.since_unix > 0 {
        s.push_str(&format!(" since {}", iso_utc(d.since_unix)));
    }
    s.push_str(if d.now {
        ", at once"
    } else {
        ", at min-runtime lapse"
    });
    if d.held {
        format!("held by allotd's circuit breaker, not in force: {s}")
    } else {
        format!("drained by {s}")
    }
}

/// A drain as JSON.
pub(crate) fn drain_info_json(d: &DrainInfo) -> Value {
    json!({
        "by": d.by,
        "author": d.author,
        "reason": d.reason,
        "now": d.now,
        "since_unix": d.since_unix,
        "held": d.held,
    })
}

fn drain_json(d: &DrainResponse) -> Value {
    json!({
        "draining": d.draining,
        "reason": d.reason,
        "now": d.now,
        "by": d.by,
        "drains": d.drains.iter().map(drain_info_json).collect::<Vec<_>>(),
    })
}

/// `operator: "rack maintenance", at min-runtime lapse`, for an agent that sends no
/// list of drains.
fn legacy_drain_detail(d: &DrainResponse) -> String {
    let when = if d.now {
        "at once"
    } else {
        "at min-runtime lapse"
    };
    format!("{}: \"{}\", {when}", or_dash(&d.by), d.reason)
}

/// `allot drain` and `allot undrain`: the host's drain state, then each drain.
fn drain_text(d: &DrainResponse, undrain: bool) -> String {
    if d.drains.is_empty() {
        return if d.draining {
            format!("host: draining ({})\n", legacy_drain_detail(d))
        } else {
            "host: not draining\n".into()
        };
    }
    let mut out = match (d.draining, undrain) {
        (true, true) => "host: still draining\n",
        (true, false) => "host: draining\n",
        (false, _) => "host: not draining\n",
    }
    .to_string();
    for x in &d.drains {
        out.push_str(&format!("  {}\n", drain_line(x)));
    }
    if d.draining && undrain {
        out.push_str(&format!("{}\n", undrain_hint(&d.drains)));
    }
    out
}

/// What lifts the drains an `allot undrain` left in place.
fn undrain_hint(drains: &[DrainInfo]) -> String {
    let kinds = |k: &str| drains.iter().any(|d| d.by == k && !d.held);
    let mut how = vec!["undrain lifts only this host's operator drain".to_string()];
    if kinds("cluster-operator") {
        how.push("a cluster operator's lifts with `allot nodes undrain HOST`".into());
    }
    if kinds("health") {
        how.push("a health drain lifts when the GPUs are healthy again (`allot gpus clear INDEX --reason TEXT` after a reset)".into());
    }
    how.join("; ")
}

/// A GPU as JSON; `allot gpus` and `allot nodes` show GPUs the same way.
pub(crate) fn gpu_json(g: &Gpu) -> Value {
    json!({
        "index": g.index,
        "uuid": g.uuid,
        "pci": g.pci,
        "model": g.model,
        "state": gpu_state(g.state()),
        "lease_id": g.lease_id,
        "reasons": g.reasons.iter().map(|r| json!({
            "signal": r.signal,
            "detail": r.detail,
            "action": r.action,
            "gpu_only": r.gpu_only,
            "since_unix": r.since_unix,
        })).collect::<Vec<_>>(),
    })
}

fn gpus_json(r: &ListGpusResponse) -> Value {
    let drain = r.drain.clone().unwrap_or_default();
    json!({
        "verdict": verdict(r.verdict()),
        "host": r.host,
        "cpus": r.cpus,
        "memory_bytes": r.memory_bytes,
        "drain": drain_json(&drain),
        "gpus": r.gpus.iter().map(gpu_json).collect::<Vec<_>>(),
    })
}

/// A GPU's health reasons for one cell: `xid:94: contained ECC error; row-remap-pending`.
fn reasons_text(g: &Gpu) -> String {
    let reasons: Vec<String> = g
        .reasons
        .iter()
        .map(|x| {
            if x.detail.is_empty() {
                x.signal.clone()
            } else {
                format!("{}: {}", x.signal, x.detail)
            }
        })
        .collect();
    reasons.join("; ")
}

fn gpus_text(r: &ListGpusResponse) -> String {
    let drain = r.drain.clone().unwrap_or_default();
    let mut out = format!("host: {}", verdict(r.verdict()));
    if drain.drains.is_empty() && drain.draining {
        out.push_str(&format!(" ({})", legacy_drain_detail(&drain)));
    }
    for d in &drain.drains {
        out.push_str(&format!("\n  {}", drain_line(d)));
    }
    if !r.host.is_empty() {
        out.push_str(&format!(
            "\n{}: {} CPUs, {} memory",
            r.host,
            r.cpus,
            table::bytes(r.memory_bytes)
        ));
    }
    out.push('\n');
    let rows: Vec<Vec<String>> = r
        .gpus
        .iter()
        .map(|g| {
            vec![
                g.index.to_string(),
                g.uuid.clone(),
                or_dash(&g.pci),
                or_dash(&g.model),
                gpu_state(g.state()).into(),
                or_dash(&g.lease_id),
                or_dash(&reasons_text(g)),
            ]
        })
        .collect();
    out.push_str(&table::render(
        &["INDEX", "UUID", "PCI", "MODEL", "STATE", "LEASE", "REASONS"],
        &rows,
    ));
    out
}

/// One GPU after `allot gpus clear`: `GPU 3 (GPU-…, 0000:3b:00): healthy`, then what
/// is still wrong with it, if anything.
fn gpu_text(g: &Gpu) -> String {
    let mut out = format!(
        "GPU {} ({}, {}): {}\n",
        g.index,
        or_dash(&g.uuid),
        or_dash(&g.pci),
        gpu_state(g.state())
    );
    if !g.reasons.is_empty() {
        out.push_str(&format!("  still: {}\n", reasons_text(g)));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use allot_proto::v1::{HealthReason, LeaseStep};

    fn lease() -> Lease {
        Lease {
            id: "L-7".into(),
            workload_id: "W-7".into(),
            gpu_uuids: vec!["GPU-a".into(), "GPU-b".into()],
            start_unix_ms: 1_000_000,
            min_runtime_s: 600,
            state: LeaseState::Running as i32,
            pid: 4242,
            cpu_pct: 187.4,
            rss_bytes: 1_288_490_189,
            user: "ana".into(),
            checkpoint_hook: "signal:USR1".into(),
            grace_s: 120,
            ..Default::default()
        }
    }

    #[test]
    fn lease_table_shows_workload_age_protection_and_usage() {
        let t = leases_table(&[lease()], 1_000_000 + 192_000);
        let lines: Vec<&str> = t.lines().collect();
        assert!(
            lines[0].starts_with("ID   WORKLOAD  STATE    GPUS  PID   USER"),
            "{t}"
        );
        let cells: Vec<&str> = lines[1].split_whitespace().collect();
        assert_eq!(
            cells,
            ["L-7", "W-7", "running", "2", "4242", "ana", "3m12s", "6m48s", "187", "1.2G", "-"]
        );
        let lapsed = leases_table(&[lease()], 1_000_000 + 601_000);
        assert!(lapsed.contains("lapsed"), "{lapsed}");
    }

    #[test]
    fn ended_leases_say_how_they_ended() {
        let mut l = lease();
        l.state = LeaseState::Ended as i32;
        l.ended_by = "term".into();
        l.end_reason = "revoked".into();
        l.exit_code = Some(143);
        let t = leases_table(&[l], 2_000_000);
        assert!(t.contains("term/revoked (exit 143)"), "{t}");
        assert!(!t.contains("lapsed"), "{t}");
    }

    #[test]
    fn lease_json_has_the_documented_fields() {
        let mut l = lease();
        l.steps = vec![LeaseStep {
            rung: "checkpoint".into(),
            took_ms: 1_500,
            note: "marker".into(),
        }];
        let v = lease_json(&l);
        assert_eq!(v["id"], "L-7");
        assert_eq!(v["state"], "running");
        assert_eq!(v["time_limit_s"], Value::Null);
        assert_eq!(v["exit_code"], Value::Null);
        assert_eq!(v["steps"][0]["rung"], "checkpoint");
        assert_eq!(v["rss_bytes"], 1_288_490_189_u64);
        for k in [
            "workload_id",
            "gpu_uuids",
            "pid",
            "user",
            "adopted",
            "start_unix_ms",
            "min_runtime_s",
            "checkpoint_hook",
            "grace_s",
            "not_before_unix",
            "revoke_why",
            "ended_by",
            "end_reason",
            "ended_unix",
            "cpu_pct",
        ] {
            assert!(v.get(k).is_some(), "missing {k}");
        }
    }

    fn gpus() -> ListGpusResponse {
        ListGpusResponse {
            verdict: HostVerdict::Drain as i32,
            drain: Some(DrainResponse {
                draining: true,
                reason: "rack maintenance".into(),
                now: false,
                by: "operator".into(),
                drains: vec![],
            }),
            gpus: vec![Gpu {
                uuid: "GPU-a".into(),
                index: 0,
                pci: "0000:3b:00".into(),
                model: "H100".into(),
                state: GpuState::Degraded as i32,
                reasons: vec![
                    HealthReason {
                        signal: "xid:94".into(),
                        detail: "contained ECC error".into(),
                        action: "drain-now".into(),
                        ..Default::default()
                    },
                    HealthReason {
                        signal: "row-remap-pending".into(),
                        ..Default::default()
                    },
                ],
                lease_id: "L-7".into(),
            }],
            ..Default::default()
        }
    }

    fn drains() -> Vec<DrainInfo> {
        vec![
            DrainInfo {
                by: "health".into(),
                author: "health monitor".into(),
                reason: "xid:79 on 0000:3b:00".into(),
                now: true,
                since_unix: 1_795_980_000,
                held: false,
            },
            DrainInfo {
                by: "local-operator".into(),
                author: "alice".into(),
                reason: "rack work".into(),
                now: false,
                since_unix: 0,
                held: false,
            },
        ]
    }

    #[test]
    fn gpus_text_starts_with_the_host_line() {
        let t = gpus_text(&gpus());
        let mut lines = t.lines();
        assert_eq!(
            lines.next(),
            Some("host: drain (operator: \"rack maintenance\", at min-runtime lapse)")
        );
        assert!(lines.next().unwrap_or("").starts_with("INDEX"));
        let row = lines.next().unwrap_or("");
        assert!(row.contains("degraded"), "{row}");
        assert!(
            row.ends_with("xid:94: contained ECC error; row-remap-pending"),
            "{row}"
        );
    }

    #[test]
    fn every_drain_is_listed_with_its_author() {
        let mut r = gpus();
        if let Some(d) = r.drain.as_mut() {
            d.drains = drains();
        }
        let t = gpus_text(&r);
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines[0], "host: drain");
        assert_eq!(
            lines[1],
            "  drained by health (xid:79 on 0000:3b:00) since 2026-11-29T19:20:00Z, at once"
        );
        assert_eq!(
            lines[2],
            "  drained by local-operator alice: rack work, at min-runtime lapse"
        );
        assert!(lines[3].starts_with("INDEX"), "{t}");
        let v = gpus_json(&r);
        assert_eq!(v["drain"]["drains"][0]["by"], "health");
        assert_eq!(v["drain"]["drains"][1]["author"], "alice");
        assert_eq!(v["drain"]["drains"][1]["held"], false);
        assert_eq!(v["drain"]["drains"][0]["since_unix"], 1_795_980_000_i64);

        let mut held = drains()[0].clone();
        held.held = true;
        assert!(
            drain_line(&held).starts_with("held by allotd's circuit breaker, not in force: health"),
            "{}",
            drain_line(&held)
        );
    }

    #[test]
    fn undrain_says_what_is_left_and_who_lifts_it() {
        let left = DrainResponse {
            draining: true,
            reason: "xid:79 on 0000:3b:00".into(),
            now: true,
            by: "health".into(),
            drains: drains()[..1].to_vec(),
        };
        let t = drain_text(&left, true);
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines[0], "host: still draining");
        assert!(lines[1].starts_with("  drained by health"), "{t}");
        assert!(lines[2].contains("allot gpus clear INDEX"), "{t}");
        assert!(!t.contains("nodes undrain"), "{t}");
        assert_eq!(
            drain_text(&DrainResponse::default(), true),
            "host: not draining\n"
        );
        let v = drain_json(&left);
        assert_eq!(v["drains"][0]["reason"], "xid:79 on 0000:3b:00");
    }

    #[test]
    fn gpus_json_is_one_object() {
        let v = gpus_json(&gpus());
        assert_eq!(v["verdict"], "drain");
        assert_eq!(v["drain"]["by"], "operator");
        assert_eq!(v["gpus"][0]["state"], "degraded");
        assert_eq!(v["gpus"][0]["reasons"][0]["signal"], "xid:94");
        assert_eq!(v["gpus"][0]["reasons"][0]["action"], "drain-now");
        let ok = gpus_json(&ListGpusResponse {
            verdict: HostVerdict::Ok as i32,
            ..Default::default()
        });
        assert_eq!(ok["verdict"], "ok");
        assert_eq!(ok["drain"]["draining"], false);
        assert_eq!(ok["drain"]["drains"], json!([]));
    }

    #[test]
    fn verdict_names_are_hyphenated() {
        assert_eq!(verdict(HostVerdict::DrainNow), "drain-now");
    }

    #[test]
    fn a_cleared_gpu_reads_on_one_line_then_what_is_left() {
        let g = gpus().gpus.remove(0);
        assert_eq!(
            gpu_text(&g),
            "GPU 0 (GPU-a, 0000:3b:00): degraded\n  still: xid:94: contained ECC error; row-remap-pending\n"
        );
        let healthy = Gpu {
            index: 3,
            uuid: "GPU-c".into(),
            state: GpuState::Healthy as i32,
            ..Default::default()
        };
        assert_eq!(gpu_text(&healthy), "GPU 3 (GPU-c, -): healthy\n");
    }

    #[test]
    fn long_gpu_lists_are_shortened() {
        let uuid = |n: u32| format!("GPU-{n:08x}-1111-2222-3333-444455556666");
        let eight: Vec<String> = (0..8).map(uuid).collect();
        assert_eq!(gpu_cell(&eight.join(",")), "GPU-00000000…,GPU-00000001…,+6");
        assert_eq!(gpu_cell(&uuid(10)), "GPU-0000000a…");
        assert_eq!(gpu_cell("0000:3b:00"), "0000:3b:00");
        assert_eq!(gpu_cell("GPU-aaaa"), "GPU-aaaa");
        assert_eq!(gpu_cell(""), "-");
    }

    #[test]
    fn contracts_that_cannot_be_kept_are_refused() {
        let e = check_contract(&["submit"], 7_200, Some(3_600)).expect_err("refused");
        assert_eq!(
            e.message,
            "--min-runtime 2h is longer than --time-limit 1h: the work would be killed before its protection ends"
        );
        assert!(check_contract(&["submit"], 3_600, Some(3_600)).is_ok());
        assert!(check_contract(&["submit"], 7_200, None).is_ok());
    }

    #[test]
    fn hook_kinds_are_checked_before_the_call() {
        assert!(parse_hook("signal:USR1").is_ok());
        assert!(parse_hook("exec:/bin/ckpt --now").is_ok());
        assert!(parse_hook("http:http://127.0.0.1:9/ckpt").is_ok());
        assert!(parse_hook("USR1").is_err());
        assert!(parse_hook("signal:").is_err());
    }
}
