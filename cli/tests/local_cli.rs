//! The operator commands as operators run them: the real binary, against no agent
//! (errors) and against a fake `AgentLocal` server on a unix socket (the wire path,
//! tables and JSON); and what every command shares: the grouped help, the connection
//! flags before the command, a quiet exit into a closed pipe. End-to-end runs against
//! the real agent live with the agent.

use allot_proto::v1::agent_local_server::{AgentLocal, AgentLocalServer};
use allot_proto::v1::{
    ClearGpuRequest, DrainInfo, DrainRequest, DrainResponse, Event, EventsRequest, EventsResponse,
    Gpu, GpuState, HealthReason, HostVerdict, Lease, LeaseState, ListGpusRequest, ListGpusResponse,
    ListLeasesRequest, ListLeasesResponse, LogChunk, ReadLogRequest, RevokeLeaseRequest,
    StartLeaseRequest, UndrainRequest,
};
use std::io::Read;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use tonic::{Request, Response, Status};

mod support;
use support::{allot, now_unix, serve_unix, Socket};

#[test]
fn no_agent_names_the_socket_and_the_agent() {
    let (code, out, err) = allot(&["leases", "--socket", "/nonexistent/x.sock"]);
    assert_eq!(code, 1, "{out}{err}");
    assert!(err.contains("/nonexistent/x.sock"), "{err}");
    assert!(err.contains("allot-agent"), "{err}");
    assert!(out.is_empty(), "{out}");
}

#[test]
fn socket_comes_from_the_environment() {
    let out = Command::new(env!("CARGO_BIN_EXE_allot"))
        .args(["gpus", "--json"])
        .env("ALLOT_SOCKET", "/nonexistent/from-env.sock")
        .output()
        .expect("allot runs");
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("/nonexistent/from-env.sock"), "{err}");
}

#[test]
fn lease_start_needs_a_command_or_a_pid() {
    let (code, _, err) = allot(&[
        "lease",
        "start",
        "--gpus",
        "1",
        "--socket",
        "/nonexistent/x.sock",
    ]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--adopt PID"), "{err}");
    assert!(err.contains("`--`"), "{err}");
    assert!(err.contains("allot lease start"), "{err}");
}

#[test]
fn lease_start_refuses_both_a_command_and_a_pid() {
    let (code, _, err) = allot(&[
        "lease", "start", "--gpus", "1", "--adopt", "7", "--", "true",
    ]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--adopt"), "{err}");
}

#[test]
fn bad_duration_names_the_flag_and_the_form() {
    let (code, _, err) = allot(&[
        "lease",
        "start",
        "--gpus",
        "1",
        "--min-runtime",
        "10x",
        "--",
        "true",
    ]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--min-runtime"), "{err}");
    assert!(err.contains("10m"), "{err}");
    let (code, _, err) = allot(&["events", "--since", "yesterday"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--since"), "{err}");
}

#[test]
fn bad_checkpoint_hook_is_a_usage_error() {
    let (code, _, err) = allot(&[
        "lease",
        "start",
        "--gpus",
        "1",
        "--checkpoint",
        "USR1",
        "--",
        "true",
    ]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("signal:USR1"), "{err}");
}

#[test]
fn drain_needs_a_reason() {
    let (code, _, err) = allot(&["drain"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--reason"), "{err}");
}

#[test]
fn lease_start_refuses_a_contract_it_cannot_keep() {
    let (code, _, err) = allot(&[
        "lease",
        "start",
        "--gpus",
        "1",
        "--min-runtime",
        "2h",
        "--time-limit",
        "1h",
        "--",
        "true",
    ]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("--min-runtime 2h is longer than --time-limit 1h: the work would be killed before its protection ends"),
        "{err}"
    );
}

#[test]
fn gpus_clear_needs_a_reason() {
    let (code, _, err) = allot(&["gpus", "clear", "0"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--reason"), "{err}");
    let (code, _, err) = allot(&["gpus", "clear", "0", "--reason", "  "]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("say what was done"), "{err}");
    assert!(err.contains("allot gpus clear"), "{err}");
}

#[test]
fn help_groups_the_commands_by_what_they_talk_to() {
    let (code, out, err) = allot(&["--help"]);
    assert_eq!(code, 0, "{err}");
    let at = |s: &str| out.find(s).unwrap_or_else(|| panic!("no {s:?} in\n{out}"));
    let workloads = at("Workloads (allotd");
    let cluster = at("Cluster operators (allotd");
    let host = at("This host (the local allot-agent");
    let xid = at("GPU errors:");
    let options = at("Options:");
    assert!(
        workloads < at("\n  submit ") && at("\n  submit ") < cluster,
        "{out}"
    );
    assert!(
        cluster < at("\n  nodes ") && at("\n  nodes ") < host,
        "{out}"
    );
    for cmd in ["leases", "gpus", "drain", "undrain", "events", "lease"] {
        let c = at(&format!("\n  {cmd} "));
        assert!(
            host < c && c < xid,
            "{cmd} not under the host heading:\n{out}"
        );
    }
    assert!(xid < at("\n  xid ") && at("\n  xid ") < options, "{out}");
    // No command is listed twice, as a flat list under "Commands:" would add.
    assert!(!out.contains("Commands:"), "{out}");
    assert_eq!(out.matches("\n  drain ").count(), 1, "{out}");
    let (_, short, _) = allot(&["-h"]);
    assert!(
        short.contains("This host (the local allot-agent"),
        "{short}"
    );
}

#[test]
fn connection_flags_before_a_command_that_does_not_use_them_are_refused() {
    let (code, _, err) = allot(&["--socket", "/tmp/x.sock", "queue"]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("--socket is the local agent's socket"),
        "{err}"
    );
    assert!(err.contains("`allot queue` does not use it"), "{err}");
    let (code, _, err) = allot(&["--server", "127.0.0.1:1", "leases"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--server is allotd's address"), "{err}");
    let (code, _, err) = allot(&["leases", "--server", "127.0.0.1:1"]);
    assert_eq!(code, 2, "{err}");
}

/// A kernel log with `n` XID lines, so that `xid scan` prints far more than a pipe holds.
fn big_log(n: usize) -> PathBuf {
    let path = std::env::temp_dir().join(format!("allot-pipe-{}-{n}.log", std::process::id()));
    let line = "[ 1451.785035] NVRM: Xid (PCI:0000:3B:00): 79, pid=1234, name=python3, GPU has fallen off the bus.\n";
    std::fs::write(&path, line.repeat(n)).expect("write log");
    path
}

#[test]
fn a_reader_that_goes_away_ends_the_command_quietly() {
    let log = big_log(20_000);
    for args in [
        vec!["xid", "scan", log.to_str().expect("utf-8")],
        vec!["xid", "scan", log.to_str().expect("utf-8"), "--json"],
        vec!["--help"],
    ] {
        let mut child = Command::new(env!("CARGO_BIN_EXE_allot"))
            .args(&args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("allot runs");
        // Read a little, as `head -c` would, then close the pipe's read end.
        let mut first = [0_u8; 16];
        let mut out = child.stdout.take().expect("stdout");
        let _ = out.read(&mut first);
        drop(out);
        let mut err = String::new();
        child
            .stderr
            .take()
            .expect("stderr")
            .read_to_string(&mut err)
            .expect("stderr");
        let status = child.wait().expect("exits");
        assert!(!err.contains("panicked"), "{args:?}: {err}");
        assert!(!err.contains("RUST_BACKTRACE"), "{args:?}: {err}");
        assert!(err.is_empty(), "{args:?}: {err}");
        let code = status.code();
        assert!(code == Some(141) || code == Some(0), "{args:?}: {status:?}");
    }
    std::fs::remove_file(&log).ok();
}

// ---------------------------------------------------------------- a fake agent

/// Answers with canned data and remembers what it was asked.
#[derive(Clone, Default)]
struct Fake {
    seen: Arc<Mutex<Vec<String>>>,
}

fn lease(id: &str) -> Lease {
    Lease {
        id: id.into(),
        workload_id: format!("wl-{id}"),
        gpu_uuids: vec!["GPU-aaaa".into(), "GPU-bbbb".into()],
        start_unix_ms: (now_unix() - 192) * 1_000,
        min_runtime_s: 600,
        state: LeaseState::Running as i32,
        pid: 4242,
        cpu_pct: 99.0,
        rss_bytes: 1_288_490_189,
        user: "ana".into(),
        ..Default::default()
    }
}

#[tonic::async_trait]
impl AgentLocal for Fake {
    async fn list_leases(
        &self,
        _: Request<ListLeasesRequest>,
    ) -> Result<Response<ListLeasesResponse>, Status> {
        let mut ended = lease("L-2");
        ended.state = LeaseState::Ended as i32;
        ended.ended_by = "exited".into();
        ended.end_reason = "exited".into();
        ended.exit_code = Some(0);
        Ok(Response::new(ListLeasesResponse {
            leases: vec![lease("L-1"), ended],
        }))
    }

    async fn list_gpus(
        &self,
        _: Request<ListGpusRequest>,
    ) -> Result<Response<ListGpusResponse>, Status> {
        Ok(Response::new(ListGpusResponse {
            verdict: HostVerdict::DrainNow as i32,
            drain: Some(DrainResponse {
                draining: true,
                reason: "xid:79 on 0000:3b:00".into(),
                now: true,
                by: "health".into(),
                drains: vec![health_drain(), operator_drain("alice", "rack maintenance")],
            }),
            gpus: vec![Gpu {
                uuid: "GPU-aaaa".into(),
                index: 0,
                pci: "0000:3b:00".into(),
                model: "NVIDIA H100".into(),
                state: GpuState::Failed as i32,
                reasons: vec![HealthReason {
                    signal: "xid:79".into(),
                    detail: "fallen off the bus".into(),
                    action: "drain-now".into(),
                    gpu_only: true,
                    since_unix: 1,
                }],
                lease_id: "L-1".into(),
            }],
            ..Default::default()
        }))
    }

    async fn start_lease(&self, r: Request<StartLeaseRequest>) -> Result<Response<Lease>, Status> {
        let r = r.into_inner();
        self.seen.lock().expect("lock").push(format!(
            "start gpus={} min={} limit={:?} hook={} grace={} argv={:?} adopt={} user={} workload={}",
            r.gpus,
            r.min_runtime_s,
            r.time_limit_s,
            r.checkpoint_hook,
            r.grace_s,
            r.argv,
            r.adopt_pid,
            r.user,
            r.workload_id
        ));
        if r.gpus > 8 {
            return Err(Status::invalid_argument(
                "gpus: 9 asked, this host has 8 (ask for at most 8)",
            ));
        }
        let mut l = lease("L-9");
        l.time_limit_s = r.time_limit_s;
        Ok(Response::new(l))
    }

    async fn revoke_lease(
        &self,
        r: Request<RevokeLeaseRequest>,
    ) -> Result<Response<Lease>, Status> {
        let r = r.into_inner();
        self.seen
            .lock()
            .expect("lock")
            .push(format!("revoke {} now={}", r.lease_id, r.now));
        if r.lease_id != "L-1" {
            return Err(Status::not_found(format!(
                "lease_id: no lease {} on this host (see `allot leases`)",
                r.lease_id
            )));
        }
        let mut l = lease("L-1");
        l.state = LeaseState::Revoking as i32;
        l.revoke_why = "operator".into();
        Ok(Response::new(l))
    }

    async fn drain(&self, r: Request<DrainRequest>) -> Result<Response<DrainResponse>, Status> {
        let r = r.into_inner();
        let mut mine = operator_drain("alice", &r.reason);
        mine.now = r.now;
        Ok(Response::new(DrainResponse {
            draining: true,
            reason: r.reason,
            now: r.now,
            by: "local-operator".into(),
            drains: vec![mine],
        }))
    }

    /// The operator's drain goes; the health drain stays.
    async fn undrain(&self, _: Request<UndrainRequest>) -> Result<Response<DrainResponse>, Status> {
        Ok(Response::new(DrainResponse {
            draining: true,
            reason: "xid:79 on 0000:3b:00".into(),
            now: true,
            by: "health".into(),
            drains: vec![health_drain()],
        }))
    }

    async fn clear_gpu(&self, r: Request<ClearGpuRequest>) -> Result<Response<Gpu>, Status> {
        let r = r.into_inner();
        self.seen
            .lock()
            .expect("lock")
            .push(format!("clear {} reason={}", r.index, r.reason));
        if r.index != 0 {
            return Err(Status::not_found(format!(
                "index: no GPU {} on this host; `allot gpus` lists them",
                r.index
            )));
        }
        Ok(Response::new(Gpu {
            uuid: "GPU-aaaa".into(),
            index: 0,
            pci: "0000:3b:00".into(),
            model: "NVIDIA H100".into(),
            state: GpuState::Healthy as i32,
            reasons: vec![],
            lease_id: String::new(),
        }))
    }

    /// L-1's stdout is "hello\nworld\n", given 6 bytes at a time; it lives until
    /// the second read. Anything else is not here.
    async fn read_log(&self, r: Request<ReadLogRequest>) -> Result<Response<LogChunk>, Status> {
        let r = r.into_inner();
        self.seen.lock().expect("lock").push(format!(
            "read {} at {} stream {}",
            r.lease_id, r.offset, r.stream
        ));
        if r.lease_id != "L-1" {
            return Err(Status::not_found(format!(
                "lease_id: no lease {:?} on this host; `allot leases` lists them",
                r.lease_id
            )));
        }
        let all = b"hello\nworld\n";
        let from = (r.offset as usize).min(all.len());
        let to = (from + 6).min(all.len());
        Ok(Response::new(LogChunk {
            data: all[from..to].to_vec(),
            eof: to == all.len(),
            lease_live: r.offset < 6,
            ..Default::default()
        }))
    }

    async fn events(&self, r: Request<EventsRequest>) -> Result<Response<EventsResponse>, Status> {
        let since = r.into_inner().since_unix;
        self.seen
            .lock()
            .expect("lock")
            .push(format!("events since={since}"));
        let eight: Vec<String> = (0..8)
            .map(|i| format!("GPU-{i:08x}-1111-2222-3333-444455556666"))
            .collect();
        Ok(Response::new(EventsResponse {
            events: vec![
                Event {
                    at_unix: 1_795_980_000,
                    kind: "health".into(),
                    lease_id: String::new(),
                    gpu: "GPU-aaaa".into(),
                    message: "xid:79 fallen off the bus".into(),
                },
                Event {
                    at_unix: 1_795_980_060,
                    kind: "lease".into(),
                    lease_id: "L-1".into(),
                    gpu: eight.join(","),
                    message: "started pid 4242 as ana on 8 GPU(s)".into(),
                },
                Event {
                    at_unix: 1_795_980_120,
                    kind: "lease".into(),
                    lease_id: "L-0".into(),
                    gpu: String::new(),
                    message: "pid 7 exited".into(),
                },
            ],
        }))
    }
}

fn health_drain() -> DrainInfo {
    DrainInfo {
        by: "health".into(),
        author: "health monitor".into(),
        reason: "xid:79 on 0000:3b:00".into(),
        now: true,
        since_unix: 1_795_980_000,
        held: false,
    }
}

fn operator_drain(who: &str, reason: &str) -> DrainInfo {
    DrainInfo {
        by: "local-operator".into(),
        author: who.into(),
        reason: reason.into(),
        now: false,
        since_unix: 1_795_980_300,
        held: false,
    }
}

/// A fake agent serving on a fresh socket for the rest of the test process.
fn serve(fake: Fake) -> Socket {
    serve_unix(tonic::transport::Server::builder().add_service(AgentLocalServer::new(fake)))
}
#[test]
fn leases_table_and_json_from_an_agent() {
    let s = serve(Fake::default());
    let (code, out, err) = allot(&["leases", "--socket", s.arg()]);
    assert_eq!(code, 0, "{err}");
    let mut lines = out.lines();
    let header: Vec<&str> = lines.next().expect("header").split_whitespace().collect();
    assert_eq!(
        header,
        [
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
            "END"
        ]
    );
    let l1: Vec<&str> = lines.next().expect("L-1").split_whitespace().collect();
    assert_eq!(&l1[..6], ["L-1", "wl-L-1", "running", "2", "4242", "ana"]);
    assert!(l1[6].starts_with("3m1"), "{out}");
    assert!(l1[7].starts_with("6m4"), "{out}");
    assert_eq!(&l1[8..], ["99", "1.2G", "-"]);
    // Live leases only, unless --all.
    assert!(lines.next().is_none(), "{out}");
    let (code, out, err) = allot(&["leases", "--all", "--socket", s.arg()]);
    assert_eq!(code, 0, "{err}");
    let l2 = out.lines().nth(2).expect("L-2");
    assert!(
        l2.contains("ended") && l2.contains("exited/exited (exit 0)"),
        "{out}"
    );
    let (code, out, _) = allot(&["leases", "--all", "--user", "nobody", "--socket", s.arg()]);
    assert_eq!((code, out.lines().count()), (0, 1), "{out}");
    let (code, out, _) = allot(&[
        "leases",
        "--workload",
        "wl-L-1",
        "--json",
        "--socket",
        s.arg(),
    ]);
    assert_eq!(code, 0);
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&out)
            .expect("JSON")
            .as_array()
            .map(Vec::len),
        Some(1)
    );

    let (code, out, err) = allot(&["leases", "--all", "--json", "--socket", s.arg()]);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).expect("JSON");
    let a = v.as_array().expect("array");
    assert_eq!(a.len(), 2);
    assert_eq!(a[0]["id"], "L-1");
    assert_eq!(a[0]["workload_id"], "wl-L-1");
    assert_eq!(a[0]["state"], "running");
    assert_eq!(a[0]["time_limit_s"], serde_json::Value::Null);
    assert_eq!(a[1]["state"], "ended");
    assert_eq!(a[1]["exit_code"], 0);
}

#[test]
fn gpus_drain_and_undrain_from_an_agent() {
    let s = serve(Fake::default());
    let (code, out, err) = allot(&["gpus", "--socket", s.arg()]);
    assert_eq!(code, 0, "{err}");
    let mut lines = out.lines();
    assert_eq!(lines.next(), Some("host: drain-now"));
    assert_eq!(
        lines.next(),
        Some("  drained by health (xid:79 on 0000:3b:00) since 2026-11-29T19:20:00Z, at once")
    );
    assert_eq!(
        lines.next(),
        Some("  drained by local-operator alice: rack maintenance since 2026-11-29T19:25:00Z, at min-runtime lapse")
    );
    assert!(lines.next().expect("header").starts_with("INDEX  UUID"));
    let row = lines.next().expect("row");
    assert!(
        row.contains("failed") && row.ends_with("xid:79: fallen off the bus"),
        "{row}"
    );

    let (code, out, _) = allot(&["gpus", "--json", "--socket", s.arg()]);
    assert_eq!(code, 0);
    let v: serde_json::Value = serde_json::from_str(&out).expect("JSON");
    assert_eq!(v["verdict"], "drain-now");
    assert_eq!(v["drain"]["reason"], "xid:79 on 0000:3b:00");
    let drains = v["drain"]["drains"].as_array().expect("drains");
    assert_eq!(drains.len(), 2);
    assert_eq!(drains[0]["by"], "health");
    assert_eq!(drains[0]["now"], true);
    assert_eq!(drains[1]["by"], "local-operator");
    assert_eq!(drains[1]["author"], "alice");
    assert_eq!(drains[1]["reason"], "rack maintenance");
    assert_eq!(drains[1]["since_unix"], 1_795_980_300_i64);
    assert_eq!(drains[1]["held"], false);
    assert_eq!(v["gpus"][0]["state"], "failed");
    assert_eq!(v["gpus"][0]["reasons"][0]["gpu_only"], true);
    assert_eq!(v["gpus"][0]["reasons"][0]["action"], "drain-now");

    let (code, out, err) = allot(&[
        "drain",
        "--reason",
        "swap PSU",
        "--now",
        "--socket",
        s.arg(),
    ]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(
        out,
        "host: draining\n  drained by local-operator alice: swap PSU since 2026-11-29T19:25:00Z, at once\n"
    );
    let (code, out, _) = allot(&["drain", "--reason", "x", "--json", "--socket", s.arg()]);
    assert_eq!(code, 0);
    let v: serde_json::Value = serde_json::from_str(&out).expect("JSON");
    assert_eq!(v["draining"], true);
    assert_eq!(v["now"], false);
    assert_eq!(v["drains"][0]["author"], "alice");
    assert_eq!(v["drains"][0]["reason"], "x");

    // The health drain outlives the operator's undrain, and the output says so.
    let (code, out, _) = allot(&["undrain", "--socket", s.arg()]);
    assert_eq!(code, 0);
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines[0], "host: still draining", "{out}");
    assert!(lines[1].starts_with("  drained by health (xid:79"), "{out}");
    assert!(lines[2].contains("allot gpus clear"), "{out}");
    let (code, out, _) = allot(&["undrain", "--json", "--socket", s.arg()]);
    assert_eq!(code, 0);
    let v: serde_json::Value = serde_json::from_str(&out).expect("JSON");
    assert_eq!(v["drains"][0]["by"], "health");
}

#[test]
fn gpus_clear_through_an_agent() {
    let fake = Fake::default();
    let s = serve(fake.clone());
    let (code, out, err) = allot(&[
        "gpus",
        "clear",
        "0",
        "--reason",
        "nvidia-smi -r after XID 79",
        "--socket",
        s.arg(),
    ]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(out, "GPU 0 (GPU-aaaa, 0000:3b:00): healthy\n");
    // --socket and --json before `clear` work too.
    let (code, out, err) = allot(&[
        "gpus",
        "--socket",
        s.arg(),
        "--json",
        "clear",
        "0",
        "--reason",
        "reseated",
    ]);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).expect("JSON");
    assert_eq!(v["index"], 0);
    assert_eq!(v["state"], "healthy");
    let (code, out, err) = allot(&["gpus", "clear", "9", "--reason", "x", "--socket", s.arg()]);
    assert_eq!(code, 1, "{out}");
    assert_eq!(
        err,
        "error: index: no GPU 9 on this host; `allot gpus` lists them\n"
    );
    assert_eq!(
        *fake.seen.lock().expect("lock"),
        [
            "clear 0 reason=nvidia-smi -r after XID 79",
            "clear 0 reason=reseated",
            "clear 9 reason=x"
        ]
    );
}

#[test]
fn the_socket_goes_before_or_after_the_command() {
    let s = serve(Fake::default());
    let (code, out, err) = allot(&["--socket", s.arg(), "leases"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.starts_with("ID "), "{out}");
    // After the command wins over before it, and before it over the environment.
    let (code, _, err) = allot(&[
        "--socket",
        "/nonexistent/a.sock",
        "leases",
        "--socket",
        s.arg(),
    ]);
    assert_eq!(code, 0, "{err}");
    let out = Command::new(env!("CARGO_BIN_EXE_allot"))
        .args(["--socket", s.arg(), "gpus", "--json"])
        .env("ALLOT_SOCKET", "/nonexistent/from-env.sock")
        .output()
        .expect("allot runs");
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (code, _, err) = allot(&["--socket", "/nonexistent/b.sock", "lease", "revoke", "L-1"]);
    assert_eq!(code, 1);
    assert!(err.contains("/nonexistent/b.sock"), "{err}");
}

#[test]
fn events_ask_from_now_minus_since() {
    let fake = Fake::default();
    let s = serve(fake.clone());
    let before = now_unix();
    let (code, out, err) = allot(&["events", "--since", "2h", "--socket", s.arg()]);
    let after = now_unix();
    assert_eq!(code, 0, "{err}");
    let since: i64 = fake.seen.lock().expect("lock")[0]
        .trim_start_matches("events since=")
        .parse()
        .expect("number");
    assert!((before - 7_200..=after - 7_200).contains(&since), "{since}");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(
        lines[0].split_whitespace().collect::<Vec<_>>(),
        ["TIME", "KIND", "LEASE", "WORKLOAD", "GPU", "MESSAGE"]
    );
    let row: Vec<&str> = lines[1].split_whitespace().collect();
    assert_eq!(
        &row[..5],
        ["2026-11-29T19:20:00Z", "health", "-", "-", "GPU-aaaa"]
    );
    // The lease's workload from the lease list; eight UUIDs cut to two and a count.
    let row: Vec<&str> = lines[2].split_whitespace().collect();
    assert_eq!(
        &row[..5],
        [
            "2026-11-29T19:21:00Z",
            "lease",
            "L-1",
            "wl-L-1",
            "GPU-00000000…,GPU-00000001…,+6"
        ]
    );
    // A lease the agent no longer lists has no workload to show.
    let row: Vec<&str> = lines[3].split_whitespace().collect();
    assert_eq!(&row[2..5], ["L-0", "-", "-"]);
    // No padding beyond the real cells: the widest line is the longest message's.
    let widest = lines.iter().map(|l| l.chars().count()).max().unwrap_or(0);
    assert!(widest < 120, "{widest} columns:\n{out}");
    assert!(lines.iter().all(|l| !l.ends_with(' ')), "{out}");

    let (code, out, err) = allot(&["events", "--json", "--socket", s.arg()]);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).expect("JSON");
    assert_eq!(v[0]["workload_id"], serde_json::Value::Null);
    assert_eq!(v[1]["workload_id"], "wl-L-1");
    assert_eq!(v[2]["workload_id"], serde_json::Value::Null);
    // JSON keeps every GPU whole.
    assert_eq!(v[1]["gpu"].as_str().unwrap_or("").split(',').count(), 8);
}

#[test]
fn lease_start_and_revoke_through_an_agent() {
    let fake = Fake::default();
    let s = serve(fake.clone());
    let (code, out, err) = allot(&[
        "lease",
        "start",
        "--gpus",
        "2",
        "--min-runtime",
        "10m",
        "--time-limit",
        "2h",
        "--checkpoint",
        "signal:USR1",
        "--grace",
        "90s",
        "--user",
        "ana",
        "--workload",
        "W-1",
        "--json",
        "--socket",
        s.arg(),
        "--",
        "python",
        "train.py",
        "--lr",
        "3e-4",
    ]);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).expect("JSON");
    assert_eq!(v["id"], "L-9");
    assert_eq!(v["time_limit_s"], 7_200);
    assert_eq!(
        fake.seen.lock().expect("lock")[0],
        "start gpus=2 min=600 limit=Some(7200) hook=signal:USR1 grace=90 \
         argv=[\"python\", \"train.py\", \"--lr\", \"3e-4\"] adopt=0 user=ana workload=W-1"
    );

    let (code, out, err) = allot(&[
        "lease",
        "start",
        "--gpus",
        "1",
        "--adopt",
        "77",
        "--socket",
        s.arg(),
    ]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(
        out.trim(),
        "lease L-9 started on GPUs GPU-aaaa, GPU-bbbb (pid 4242)"
    );
    assert!(fake.seen.lock().expect("lock")[1].contains("argv=[] adopt=77"));

    let (code, out, err) = allot(&[
        "lease",
        "start",
        "--gpus",
        "9",
        "--socket",
        s.arg(),
        "--",
        "true",
    ]);
    assert_eq!(code, 1, "{out}");
    assert_eq!(
        err.trim(),
        "error: gpus: 9 asked, this host has 8 (ask for at most 8)"
    );

    let (code, out, err) = allot(&[
        "lease",
        "revoke",
        "L-1",
        "--now",
        "--json",
        "--socket",
        s.arg(),
    ]);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).expect("JSON");
    assert_eq!(v["state"], "revoking");
    assert_eq!(v["revoke_why"], "operator");
    assert_eq!(fake.seen.lock().expect("lock")[3], "revoke L-1 now=true");

    let (code, _, err) = allot(&["lease", "revoke", "L-404", "--socket", s.arg()]);
    assert_eq!(code, 1);
    assert!(err.starts_with("error: lease_id: no lease L-404"), "{err}");
}

#[test]
fn lease_logs_reads_on_from_each_offset_until_the_lease_has_ended() {
    let fake = Fake::default();
    let s = serve(fake.clone());
    let (code, out, err) = allot(&[
        "lease",
        "logs",
        "L-1",
        "-f",
        "--stderr",
        "--socket",
        s.arg(),
    ]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(out, "hello\nworld\n");
    let (code, _, err) = allot(&["lease", "logs", "L-9", "--socket", s.arg()]);
    assert_eq!(code, 1);
    assert!(err.contains("no lease \"L-9\""), "{err}");
    let seen = fake.seen.lock().expect("lock").clone();
    assert_eq!(
        seen,
        [
            "read L-1 at 0 stream 2",
            "read L-1 at 6 stream 2",
            "read L-9 at 0 stream 1"
        ]
    );
}
