//! The operator commands as operators run them: the real binary, against no agent
//! (errors) and against a fake `AgentLocal` server on a unix socket (the wire path,
//! tables and JSON). End-to-end runs against the real agent live with the agent.

use allot_proto::v1::agent_local_server::{AgentLocal, AgentLocalServer};
use allot_proto::v1::{
    DrainRequest, DrainResponse, Event, EventsRequest, EventsResponse, Gpu, GpuState, HealthReason,
    HostVerdict, Lease, LeaseState, ListGpusRequest, ListGpusResponse, ListLeasesRequest,
    ListLeasesResponse, RevokeLeaseRequest, StartLeaseRequest, UndrainRequest,
};
use std::path::PathBuf;
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};
use tonic::{Request, Response, Status};

fn allot(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_allot"))
        .args(args)
        .env_remove("ALLOT_SOCKET")
        .output()
        .expect("allot runs");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

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

// ---------------------------------------------------------------- a fake agent

/// Answers with canned data and remembers what it was asked.
#[derive(Clone, Default)]
struct Fake {
    seen: Arc<Mutex<Vec<String>>>,
}

fn now_unix() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("after 1970")
        .as_secs() as i64
}

fn lease(id: &str) -> Lease {
    Lease {
        id: id.into(),
        workload_id: id.into(),
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
            verdict: HostVerdict::Drain as i32,
            drain: Some(DrainResponse {
                draining: true,
                reason: "rack maintenance".into(),
                now: false,
                by: "operator".into(),
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
        Ok(Response::new(DrainResponse {
            draining: true,
            reason: r.reason,
            now: r.now,
            by: "operator".into(),
        }))
    }

    async fn undrain(&self, _: Request<UndrainRequest>) -> Result<Response<DrainResponse>, Status> {
        Ok(Response::new(DrainResponse::default()))
    }

    async fn events(&self, r: Request<EventsRequest>) -> Result<Response<EventsResponse>, Status> {
        let since = r.into_inner().since_unix;
        self.seen
            .lock()
            .expect("lock")
            .push(format!("events since={since}"));
        Ok(Response::new(EventsResponse {
            events: vec![Event {
                at_unix: 1_795_980_000,
                kind: "health".into(),
                lease_id: String::new(),
                gpu: "GPU-aaaa".into(),
                message: "xid:79 fallen off the bus".into(),
            }],
        }))
    }
}

/// A fake agent's socket; its directory goes when the test ends.
struct Socket(PathBuf);

impl Drop for Socket {
    fn drop(&mut self) {
        if let Some(dir) = self.0.parent() {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

/// A fake agent serving on a fresh socket for the rest of the test process.
fn serve(fake: Fake) -> Socket {
    static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let dir = std::env::temp_dir().join(format!(
        "allot-cli-{}-{}",
        std::process::id(),
        N.fetch_add(1, std::sync::atomic::Ordering::SeqCst)
    ));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let path = dir.join("agent.sock");
    let _ = std::fs::remove_file(&path);
    let (tx, rx) = std::sync::mpsc::channel();
    let p = path.clone();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        rt.block_on(async move {
            let listener = tokio::net::UnixListener::bind(&p).expect("bind");
            tx.send(()).expect("ready");
            tonic::transport::Server::builder()
                .add_service(AgentLocalServer::new(fake))
                .serve_with_incoming(tokio_stream::wrappers::UnixListenerStream::new(listener))
                .await
                .expect("serve");
        });
    });
    rx.recv().expect("server ready");
    Socket(path)
}

fn sock(s: &Socket) -> &str {
    s.0.to_str().expect("utf-8 path")
}

#[test]
fn leases_table_and_json_from_an_agent() {
    let s = serve(Fake::default());
    let (code, out, err) = allot(&["leases", "--socket", sock(&s)]);
    assert_eq!(code, 0, "{err}");
    let mut lines = out.lines();
    let header: Vec<&str> = lines.next().expect("header").split_whitespace().collect();
    assert_eq!(
        header,
        [
            "ID",
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
    assert_eq!(&l1[..5], ["L-1", "running", "2", "4242", "ana"]);
    assert!(l1[5].starts_with("3m1"), "{out}");
    assert!(l1[6].starts_with("6m4"), "{out}");
    assert_eq!(&l1[7..], ["99", "1.2G", "-"]);
    let l2 = lines.next().expect("L-2");
    assert!(
        l2.contains("ended") && l2.contains("exited/exited (exit 0)"),
        "{out}"
    );

    let (code, out, err) = allot(&["leases", "--json", "--socket", sock(&s)]);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).expect("JSON");
    let a = v.as_array().expect("array");
    assert_eq!(a.len(), 2);
    assert_eq!(a[0]["id"], "L-1");
    assert_eq!(a[0]["state"], "running");
    assert_eq!(a[0]["time_limit_s"], serde_json::Value::Null);
    assert_eq!(a[1]["state"], "ended");
    assert_eq!(a[1]["exit_code"], 0);
}

#[test]
fn gpus_drain_and_undrain_from_an_agent() {
    let s = serve(Fake::default());
    let (code, out, err) = allot(&["gpus", "--socket", sock(&s)]);
    assert_eq!(code, 0, "{err}");
    let mut lines = out.lines();
    assert_eq!(
        lines.next(),
        Some("host: drain (operator: \"rack maintenance\", at min-runtime lapse)")
    );
    assert!(lines.next().expect("header").starts_with("INDEX  UUID"));
    let row = lines.next().expect("row");
    assert!(
        row.contains("failed") && row.ends_with("xid:79: fallen off the bus"),
        "{row}"
    );

    let (code, out, _) = allot(&["gpus", "--json", "--socket", sock(&s)]);
    assert_eq!(code, 0);
    let v: serde_json::Value = serde_json::from_str(&out).expect("JSON");
    assert_eq!(v["verdict"], "drain");
    assert_eq!(v["drain"]["reason"], "rack maintenance");
    assert_eq!(v["gpus"][0]["state"], "failed");
    assert_eq!(v["gpus"][0]["reasons"][0]["gpu_only"], true);

    let (code, out, err) = allot(&[
        "drain",
        "--reason",
        "swap PSU",
        "--now",
        "--socket",
        sock(&s),
    ]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(
        out.trim(),
        "host: draining (operator: \"swap PSU\", at once)"
    );
    let (code, out, _) = allot(&["drain", "--reason", "x", "--json", "--socket", sock(&s)]);
    assert_eq!(code, 0);
    let v: serde_json::Value = serde_json::from_str(&out).expect("JSON");
    assert_eq!(v["draining"], true);
    assert_eq!(v["now"], false);

    let (code, out, _) = allot(&["undrain", "--socket", sock(&s)]);
    assert_eq!(code, 0);
    assert_eq!(out.trim(), "host: not draining");
}

#[test]
fn events_ask_from_now_minus_since() {
    let fake = Fake::default();
    let s = serve(fake.clone());
    let before = now_unix();
    let (code, out, err) = allot(&["events", "--since", "2h", "--socket", sock(&s)]);
    let after = now_unix();
    assert_eq!(code, 0, "{err}");
    let since: i64 = fake.seen.lock().expect("lock")[0]
        .trim_start_matches("events since=")
        .parse()
        .expect("number");
    assert!((before - 7_200..=after - 7_200).contains(&since), "{since}");
    let mut lines = out.lines();
    assert!(lines.next().expect("header").starts_with("TIME"));
    let row: Vec<&str> = lines.next().expect("row").split_whitespace().collect();
    assert_eq!(
        &row[..4],
        ["2026-11-29T19:20:00Z", "health", "-", "GPU-aaaa"]
    );
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
        sock(&s),
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
        sock(&s),
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
        sock(&s),
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
        sock(&s),
    ]);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).expect("JSON");
    assert_eq!(v["state"], "revoking");
    assert_eq!(v["revoke_why"], "operator");
    assert_eq!(fake.seen.lock().expect("lock")[3], "revoke L-1 now=true");

    let (code, _, err) = allot(&["lease", "revoke", "L-404", "--socket", sock(&s)]);
    assert_eq!(code, 1);
    assert!(err.starts_with("error: lease_id: no lease L-404"), "{err}");
}
