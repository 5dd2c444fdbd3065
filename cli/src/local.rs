//! Operator commands on one host: `leases`, `gpus`, `drain`, `undrain`, `events` and
//! `lease start|revoke`, over the local agent's unix socket (gRPC `AgentLocal`).

use crate::duration::{self, age, iso_utc, ms_to_secs_ceil};
use crate::failure::{block_on, Failure};
use crate::table::{self, or_dash};
use allot_proto::uds;
use allot_proto::v1::agent_local_client::AgentLocalClient;
use allot_proto::v1::{
    DrainRequest, DrainResponse, EventsRequest, Gpu, GpuState, HostVerdict, Lease, LeaseState,
    ListGpusRequest, ListGpusResponse, ListLeasesRequest, RevokeLeaseRequest, StartLeaseRequest,
    UndrainRequest,
};
use serde_json::{json, Value};
use std::path::PathBuf;
use std::process::ExitCode;
use tonic::transport::Channel;

/// Where the agent listens.
#[derive(clap::Args, Debug)]
pub struct Conn {
    /// The agent's unix socket.
    #[arg(
        long,
        value_name = "PATH",
        env = "ALLOT_SOCKET",
        default_value = "/run/allot/agent.sock"
    )]
    socket: PathBuf,
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

/// `allot gpus`.
#[derive(clap::Args, Debug)]
pub struct GpusArgs {
    #[command(flatten)]
    conn: Conn,
    /// Print one JSON object: verdict, drain and gpus.
    #[arg(long)]
    json: bool,
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
    /// This host's leases: state, protection left, usage, how they ended.
    Leases(LeasesArgs),
    /// This host's GPUs, their health and the host's drain state.
    Gpus(GpusArgs),
    /// Take no new leases; revoke running ones (at min-runtime lapse, or --now).
    Drain(DrainArgs),
    /// Take new leases again.
    Undrain(UndrainArgs),
    /// What the agent did and saw: health, contract and lease events.
    Events(EventsArgs),
    /// Start, adopt or revoke one lease by hand.
    #[command(subcommand)]
    Lease(LeaseCommand),
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

/// Checks what clap cannot express.
pub fn validate(cmd: &Local) -> Result<(), Usage> {
    if let Local::Lease(LeaseCommand::Start(a)) = cmd {
        if a.adopt.is_none() && a.argv.is_empty() {
            return Err(Usage {
                path: &["lease", "start"],
                message: "say what the lease runs: a command after `--` (allot lease start --gpus 1 -- python train.py) or a running process with --adopt PID".into(),
            });
        }
    }
    Ok(())
}

/// Runs one local command to completion and says how the process should exit.
pub fn run(cmd: Local) -> ExitCode {
    block_on(dispatch(cmd))
}

async fn client(conn: &Conn) -> Result<AgentLocalClient<Channel>, Failure> {
    Ok(AgentLocalClient::new(uds::connect(&conn.socket).await?))
}

async fn dispatch(cmd: Local) -> Result<(), Failure> {
    match cmd {
        Local::Leases(a) => {
            let leases = client(&a.conn)
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
        Local::Gpus(a) => {
            let r = client(&a.conn)
                .await?
                .list_gpus(ListGpusRequest {})
                .await?
                .into_inner();
            if a.json {
                println!("{}", gpus_json(&r));
            } else {
                print!("{}", gpus_text(&r));
            }
        }
        Local::Drain(a) => {
            let d = client(&a.conn)
                .await?
                .drain(DrainRequest {
                    reason: a.reason,
                    now: a.now,
                })
                .await?
                .into_inner();
            print_drain(&d, a.json);
        }
        Local::Undrain(a) => {
            let d = client(&a.conn)
                .await?
                .undrain(UndrainRequest {})
                .await?
                .into_inner();
            print_drain(&d, a.json);
        }
        Local::Events(a) => {
            let now = duration::now_ms() / 1_000;
            let since = i64::try_from(a.since).map_or(i64::MIN, |s| now.saturating_sub(s));
            let events = client(&a.conn)
                .await?
                .events(EventsRequest { since_unix: since })
                .await?
                .into_inner()
                .events;
            if a.json {
                let v: Vec<Value> = events
                    .iter()
                    .map(|e| {
                        json!({
                            "at_unix": e.at_unix,
                            "time": iso_utc(e.at_unix),
                            "kind": e.kind,
                            "lease_id": e.lease_id,
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
                            or_dash(&e.gpu),
                            e.message.clone(),
                        ]
                    })
                    .collect();
                print!(
                    "{}",
                    table::render(&["TIME", "KIND", "LEASE", "GPU", "MESSAGE"], &rows)
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
            let l = client(&a.conn).await?.start_lease(req).await?.into_inner();
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
            let l = client(&a.conn)
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

fn drain_json(d: &DrainResponse) -> Value {
    json!({
        "draining": d.draining,
        "reason": d.reason,
        "now": d.now,
        "by": d.by,
    })
}

/// `operator: "rack maintenance", at min-runtime lapse`.
fn drain_detail(d: &DrainResponse) -> String {
    let when = if d.now {
        "at once"
    } else {
        "at min-runtime lapse"
    };
    format!("{}: \"{}\", {when}", or_dash(&d.by), d.reason)
}

fn print_drain(d: &DrainResponse, json: bool) {
    if json {
        println!("{}", drain_json(d));
    } else if d.draining {
        println!("host: draining ({})", drain_detail(d));
    } else {
        println!("host: not draining");
    }
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

fn gpus_text(r: &ListGpusResponse) -> String {
    let drain = r.drain.clone().unwrap_or_default();
    let mut out = format!("host: {}", verdict(r.verdict()));
    if drain.draining {
        out.push_str(&format!(" ({})", drain_detail(&drain)));
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
            vec![
                g.index.to_string(),
                g.uuid.clone(),
                or_dash(&g.pci),
                or_dash(&g.model),
                gpu_state(g.state()).into(),
                or_dash(&g.lease_id),
                or_dash(&reasons.join("; ")),
            ]
        })
        .collect();
    out.push_str(&table::render(
        &["INDEX", "UUID", "PCI", "MODEL", "STATE", "LEASE", "REASONS"],
        &rows,
    ));
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
    fn lease_table_shows_age_protection_and_usage() {
        let t = leases_table(&[lease()], 1_000_000 + 192_000);
        let lines: Vec<&str> = t.lines().collect();
        assert!(
            lines[0].starts_with("ID   STATE    GPUS  PID   USER"),
            "{t}"
        );
        let cells: Vec<&str> = lines[1].split_whitespace().collect();
        assert_eq!(
            cells,
            ["L-7", "running", "2", "4242", "ana", "3m12s", "6m48s", "187", "1.2G", "-"]
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
    fn gpus_json_is_one_object() {
        let v = gpus_json(&gpus());
        assert_eq!(v["verdict"], "drain");
        assert_eq!(v["drain"]["by"], "operator");
        assert_eq!(v["gpus"][0]["state"], "degraded");
        assert_eq!(v["gpus"][0]["reasons"][0]["signal"], "xid:94");
        let ok = gpus_json(&ListGpusResponse {
            verdict: HostVerdict::Ok as i32,
            ..Default::default()
        });
        assert_eq!(ok["verdict"], "ok");
        assert_eq!(ok["drain"]["draining"], false);
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
