//! The users', managers' and cluster operators' commands as people run them: the real
//! binary against no allotd (errors) and against a fake allotd (`Workloads`, `Org`,
//! `Nodes` on a TCP port) that answers with canned data and records what it was asked.

use allot_proto::v1::nodes_server::{Nodes, NodesServer};
use allot_proto::v1::org_server::{Org, OrgServer};
use allot_proto::v1::workloads_server::{Workloads, WorkloadsServer};
use allot_proto::v1::{
    CancelRequest, ControlRequest, ControlResponse, DrainInfo, GetRequest, GetTreeRequest,
    GetTreeResponse, Gpu, GpuState, Group, HistoryRequest, HistoryResponse, HistoryRun,
    HostVerdict, ListNodesRequest, ListNodesResponse, ListRequest, ListResponse, LogStream,
    LogsChunk, LogsRequest, Node, NodeDrainRequest, SetWeightRequest, SubmitRequest,
    SubmitResponse, UpdateRequest, UsageRequest, UsageResponse, UsageRow, WatchRequest, Workload,
    WorkloadSpec, WorkloadState,
};
use std::sync::{Arc, Mutex};
use tonic::{Request, Response, Status};

mod support;
use support::{allot, allot_env, json, now_unix, serve_tcp};

#[test]
fn no_allotd_names_the_address_and_the_fix() {
    let (code, out, err) = allot(&["queue", "--server", "127.0.0.1:1"]);
    assert_eq!(code, 1, "{out}{err}");
    assert!(
        err.starts_with("error: cannot reach allotd at https://127.0.0.1:1: "),
        "{err}"
    );
    assert!(
        err.trim_end()
            .ends_with("is it running? (set --server or ALLOT_SERVER)"),
        "{err}"
    );
    assert!(out.is_empty(), "{out}");
}

#[test]
fn server_comes_from_the_environment() {
    let (code, _, err) = allot_env(&["share"], &[("ALLOT_SERVER", "127.0.0.1:1")]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("https://127.0.0.1:1"), "{err}");
    // --server wins over the environment.
    let (code, _, err) = allot_env(
        &["nodes", "--server", "127.0.0.1:2"],
        &[("ALLOT_SERVER", "127.0.0.1:1")],
    );
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("https://127.0.0.1:2"), "{err}");
}

#[test]
fn a_malformed_server_is_a_usage_error() {
    // Plain HTTP to another host would send the token in the clear.
    let (code, _, err) = allot(&["queue", "--server", "http://allotd:7070"]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("--server") && err.contains("loopback"),
        "{err}"
    );
}

#[test]
fn submit_needs_a_command() {
    let (code, out, err) = allot(&["submit", "--project", "p", "--server", "127.0.0.1:1"]);
    assert_eq!(code, 2, "{out}{err}");
    assert!(err.contains("`--`"), "{err}");
    assert!(err.contains("allot submit"), "{err}");
}

#[test]
fn the_project_comes_from_the_flag_the_environment_or_the_config_file() {
    let fake = Fake::default();
    let addr = serve(fake.clone());
    let home = std::env::temp_dir().join(format!("allot-cli-project-{}", std::process::id()));
    std::fs::create_dir_all(home.join("allot")).expect("dir");
    std::fs::write(home.join("allot/config.toml"), "project = \"vision\"\n").expect("config");
    let xdg = home.to_string_lossy().into_owned();
    let run = |args: &[&str], env: &[(&str, &str)]| {
        let mut a = vec!["submit", "--server", addr.as_str()];
        a.extend_from_slice(args);
        a.extend_from_slice(&["--", "true"]);
        let (code, _, err) = allot_env(&a, env);
        assert_eq!(code, 0, "{err}");
    };
    run(&[], &[("XDG_CONFIG_HOME", &xdg)]);
    run(&[], &[("XDG_CONFIG_HOME", &xdg), ("ALLOT_PROJECT", "nlp")]);
    run(
        &["--project", "infra"],
        &[("XDG_CONFIG_HOME", &xdg), ("ALLOT_PROJECT", "nlp")],
    );
    // Nothing anywhere: sent empty, for allotd to pick the user's only project.
    run(&[], &[("XDG_CONFIG_HOME", "/nonexistent")]);
    let seen = fake.seen();
    let projects: Vec<&str> = seen.submits.iter().map(|s| s.project.as_str()).collect();
    assert_eq!(projects, ["vision", "nlp", "infra", ""]);
    let _ = std::fs::remove_dir_all(&home);
}

#[test]
fn bad_memory_names_the_flag_and_the_form() {
    let (code, _, err) = allot(&["submit", "--project", "p", "--memory", "12Q", "--", "true"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--memory"), "{err}");
    assert!(err.contains("64G"), "{err}");
    // A bare number is refused with the unit it needs: Slurm reads --mem 64 as MB.
    let (code, _, err) = allot(&["submit", "--project", "p", "--memory", "64", "--", "true"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--memory"), "{err}");
    assert!(
        err.contains("64 has no unit: write 64G for gigabytes"),
        "{err}"
    );
}

#[test]
fn submit_checks_say_the_flag_and_the_fix_alike() {
    let submit = |extra: &[&str]| {
        let mut args = vec!["submit", "--project", "p", "--server", "127.0.0.1:1"];
        args.extend_from_slice(extra);
        args.extend_from_slice(&["--", "true"]);
        allot(&args)
    };
    for (flags, want) in [
        (&["--gpus", "0"][..], "error: --gpus 0: ask for 1 to 64 GPUs per node"),
        (&["--gpus", "65"][..], "error: --gpus 65: ask for 1 to 64 GPUs per node"),
        (
            &["--nodes", "0"][..],
            "error: --nodes 0: ask for 1 node, or N > 1 for a gang of N whole nodes",
        ),
        (
            &["--min-runtime", "2h", "--time-limit", "1h"][..],
            "error: --min-runtime 2h is longer than --time-limit 1h: the work would be killed before its protection ends",
        ),
    ] {
        let (code, out, err) = submit(flags);
        assert_eq!(code, 2, "{flags:?}: {out}{err}");
        assert_eq!(err.lines().next(), Some(want), "{flags:?}: {err}");
        assert!(err.contains("Usage: allot submit"), "{flags:?}: {err}");
    }
}

#[test]
fn submit_help_says_gangs_take_whole_nodes_and_what_no_requeue_does() {
    let (code, out, err) = allot(&["submit", "--help"]);
    assert_eq!(code, 0, "{err}");
    let line = |flag: &str| {
        out.lines()
            .find(|l| l.trim_start().starts_with(flag))
            .unwrap_or_else(|| panic!("no {flag} in\n{out}"))
            .to_string()
    };
    assert!(line("--nodes").contains("N whole nodes"), "{out}");
    let no_requeue = line("--no-requeue");
    assert!(no_requeue.contains("end (`preempted`"), "{out}");
    assert!(
        no_requeue.contains("starts over unless --resumable"),
        "{out}"
    );
    assert!(line("--memory").contains("with a unit"), "{out}");
}

#[test]
fn bad_durations_and_counts_are_usage_errors() {
    let (code, _, err) = allot(&[
        "submit",
        "--project",
        "p",
        "--min-runtime",
        "8 parsecs",
        "--",
        "x",
    ]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--min-runtime"), "{err}");
    // A bare number: Slurm reads minutes, allot's other flags seconds; said, not guessed.
    let (code, _, err) = allot(&["submit", "--project", "p", "--time-limit", "10", "--", "x"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("write 10m or 10s"), "{err}");
    // Slurm's forms and decimal units pass the flags (and fail only for want of allotd).
    for t in [
        "01:00:00",
        "2-00:00:00",
        "1-12",
        "1-12:30",
        "10:30",
        "1.5h",
        "90min",
        "8 hours",
    ] {
        let (code, _, err) = allot(&[
            "submit",
            "--project",
            "p",
            "--server",
            "127.0.0.1:9",
            "--time-limit",
            t,
            "--",
            "x",
        ]);
        assert_eq!(code, 1, "{t}: {err}");
        assert!(err.contains("cannot reach allotd"), "{t}: {err}");
    }
    let (code, _, err) = allot(&["submit", "--project", "p", "--nodes", "two", "--", "x"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--nodes"), "{err}");
    let (code, _, err) = allot(&[
        "submit",
        "--project",
        "p",
        "--checkpoint",
        "USR1",
        "--",
        "x",
    ]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("signal:USR1"), "{err}");
    let (code, _, err) = allot(&["queue", "--state", "waiting"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("timed-out"), "{err}");
}

#[test]
fn weights_must_be_positive() {
    for bad in ["-1", "0", "lots", "1e308", "5e-324", "inf"] {
        let (code, _, err) = allot(&["budget", "set", "x", "--weight", bad]);
        assert_eq!(code, 2, "{bad}: {err}");
        assert!(err.contains("--weight"), "{bad}: {err}");
        assert!(err.contains("positive number"), "{bad}: {err}");
    }
    let (code, _, err) = allot(&["budget", "set", "x"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--weight"), "{err}");
}

#[test]
fn share_is_refused_with_the_weight_command_to_run() {
    let (code, out, err) = allot(&[
        "budget",
        "set",
        "vision",
        "--share",
        "30",
        "--server",
        "127.0.0.1:1",
    ]);
    assert_eq!(code, 2, "{out}{err}");
    let first = err.lines().next().unwrap_or("");
    assert!(
        first.starts_with("error: --share was renamed --weight"),
        "{err}"
    );
    assert!(first.contains("not a percentage"), "{err}");
    assert!(
        first.ends_with("allot budget set vision --weight 30"),
        "{err}"
    );
    // The old flag is not advertised; the new one says it is a weight among siblings.
    let (_, help, _) = allot(&["budget", "set", "--help"]);
    assert!(!help.contains("--share"), "{help}");
    assert!(help.contains("weight among the group's siblings"), "{help}");
}

#[test]
fn drain_needs_a_reason() {
    let (code, _, err) = allot(&["nodes", "drain", "gpu-07"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--reason"), "{err}");
}

// ---------------------------------------------------------------- a fake allotd

/// What the fake was asked, in order, per call.
#[derive(Default)]
struct Seen {
    submits: Vec<WorkloadSpec>,
    lists: Vec<ListRequest>,
    gets: Vec<String>,
    cancels: Vec<String>,
    controls: Vec<String>,
    weights: Vec<SetWeightRequest>,
    drains: Vec<NodeDrainRequest>,
    logs: Vec<LogsRequest>,
}

/// Answers with canned data and remembers what it was asked.
#[derive(Clone, Default)]
struct Fake {
    seen: Arc<Mutex<Seen>>,
}

impl Fake {
    fn seen(&self) -> std::sync::MutexGuard<'_, Seen> {
        self.seen.lock().expect("lock")
    }
}

fn workload(id: &str, state: WorkloadState) -> Workload {
    let now = now_unix();
    let mut w = Workload {
        id: id.into(),
        spec: Some(WorkloadSpec {
            project: "vision".into(),
            user: "ana".into(),
            class: "batch".into(),
            gpus_per_node: 8,
            nodes: 2,
            mem_per_node_gb: 64,
            min_runtime_s: Some(28_800),
            time_limit_s: Some(172_800),
            resumable: true,
            argv: vec!["python".into(), "train.py".into()],
            checkpoint_hook: "signal:USR1".into(),
            ..Default::default()
        }),
        state: state as i32,
        submit_unix: now - 192,
        ..Default::default()
    };
    match state {
        WorkloadState::Pending => {
            w.explanation =
                "project vision is served 1.30× its share; needs 2 whole nodes, 1 are free in one cluster"
                    .into();
        }
        WorkloadState::Running => {
            w.start_unix = now - 3_900;
            w.nodes = vec!["gpu-01".into(), "gpu-02".into()];
            w.lease_ids = vec!["L-1".into(), "L-2".into()];
            w.funded = true;
            w.preemptions = 1;
        }
        _ => {
            w.start_unix = now - 7_200;
            w.end_unix = now - 3_600;
            w.end_reason = "time-limit".into();
        }
    }
    w
}

impl Fake {
    /// Hold, release, requeue, update: remembered; `99` is someone else's.
    fn control(&self, what: &str, r: ControlRequest) -> Result<Response<ControlResponse>, Status> {
        if r.id == "99" {
            return Err(Status::permission_denied(
                "id: ana may not hold workload 99 of bo: only its owner, an operator ([roles] operators in allotd.toml) or an admin may",
            ));
        }
        self.seen()
            .controls
            .push(format!("{what} {} hold={}", r.id, r.hold));
        Ok(Response::new(ControlResponse {
            workloads: vec![workload(&r.id, WorkloadState::Pending)],
        }))
    }
}

#[tonic::async_trait]
impl Workloads for Fake {
    async fn submit(&self, r: Request<SubmitRequest>) -> Result<Response<SubmitResponse>, Status> {
        let spec = r.into_inner().spec.unwrap_or_default();
        if spec.project == "nope" {
            return Err(Status::not_found(
                "project: no project nope (see `allot share`)",
            ));
        }
        self.seen().submits.push(spec.clone());
        // As allotd answers: the contract in force and the class (allotd's default
        // class when none was named; no class defaults here).
        let workload = Workload {
            id: "17".into(),
            spec: Some(WorkloadSpec {
                min_runtime_s: Some(spec.min_runtime_s.unwrap_or(0)),
                class: if spec.class.is_empty() {
                    "batch".into()
                } else {
                    spec.class.clone()
                },
                ..spec
            }),
            state: WorkloadState::Pending as i32,
            ..Default::default()
        };
        Ok(Response::new(SubmitResponse {
            id: "17".into(),
            workload: Some(workload),
        }))
    }

    /// Pending work ends at once; running work (18) is revoked and still running.
    async fn cancel(&self, r: Request<CancelRequest>) -> Result<Response<Workload>, Status> {
        let id = r.into_inner().id;
        self.seen().cancels.push(id.clone());
        let state = if id == "18" {
            WorkloadState::Running
        } else {
            WorkloadState::Cancelled
        };
        Ok(Response::new(workload(&id, state)))
    }

    async fn hold(&self, r: Request<ControlRequest>) -> Result<Response<ControlResponse>, Status> {
        self.control("hold", r.into_inner())
    }

    async fn release(
        &self,
        r: Request<ControlRequest>,
    ) -> Result<Response<ControlResponse>, Status> {
        self.control("release", r.into_inner())
    }

    async fn requeue(
        &self,
        r: Request<ControlRequest>,
    ) -> Result<Response<ControlResponse>, Status> {
        self.control("requeue", r.into_inner())
    }

    async fn update(&self, r: Request<UpdateRequest>) -> Result<Response<ControlResponse>, Status> {
        let r = r.into_inner();
        self.control(
            &format!(
                "update {:?} {:?} {:?}",
                r.time_limit_s, r.priority, r.begin_unix
            ),
            ControlRequest {
                id: r.id,
                hold: false,
            },
        )
    }

    async fn history(
        &self,
        r: Request<HistoryRequest>,
    ) -> Result<Response<HistoryResponse>, Status> {
        let r = r.into_inner();
        self.seen().controls.push(format!(
            "history user={} since>0={} state={} limit={}",
            r.user,
            r.since_unix > 0,
            r.state,
            r.limit
        ));
        Ok(Response::new(HistoryResponse {
            runs: vec![HistoryRun {
                workload_id: "12".into(),
                run: 1,
                user: "ana".into(),
                project: "vision".into(),
                name: "sweep, big".into(),
                array_id: "10".into(),
                array_index: 2,
                nodes: vec!["gpu-07".into()],
                gpus: 8,
                start_unix: 1_764_936_000,
                end_unix: 1_764_939_600,
                state: "failed".into(),
                exit_code: Some(3),
                gpu_hours: 8.0,
                ..Default::default()
            }],
            truncated: true,
        }))
    }

    async fn get(&self, r: Request<GetRequest>) -> Result<Response<Workload>, Status> {
        let id = r.into_inner().id;
        self.seen().gets.push(id.clone());
        match id.as_str() {
            "17" => Ok(Response::new(workload("17", WorkloadState::Pending))),
            "18" => Ok(Response::new(workload("18", WorkloadState::Running))),
            "19" => Ok(Response::new(workload("19", WorkloadState::TimedOut))),
            "21" => Ok(Response::new(requeued())),
            _ => Err(Status::not_found(format!(
                "id: no workload {id} (see `allot queue --all`)"
            ))),
        }
    }

    async fn list(&self, r: Request<ListRequest>) -> Result<Response<ListResponse>, Status> {
        let r = r.into_inner();
        let state = r.state();
        self.seen().lists.push(r);
        // 20 "starts" between the CLI's pending and running calls: it is in both.
        let workloads = match state {
            WorkloadState::Pending => vec![
                workload("17", WorkloadState::Pending),
                workload("20", WorkloadState::Pending),
            ],
            WorkloadState::Running => vec![
                workload("18", WorkloadState::Running),
                workload("20", WorkloadState::Running),
            ],
            WorkloadState::TimedOut => vec![workload("19", WorkloadState::TimedOut)],
            WorkloadState::Unspecified => vec![
                workload("17", WorkloadState::Pending),
                workload("18", WorkloadState::Running),
                workload("19", WorkloadState::TimedOut),
            ],
            _ => vec![],
        };
        Ok(Response::new(ListResponse { workloads }))
    }

    type WatchStream = tokio_stream::Empty<Result<Workload, Status>>;

    async fn watch(&self, _: Request<WatchRequest>) -> Result<Response<Self::WatchStream>, Status> {
        Err(Status::unimplemented("not in this fake"))
    }

    type AttachStream =
        tokio_stream::Iter<std::vec::IntoIter<Result<allot_proto::v1::AttachOutput, Status>>>;

    /// 18 is a session that prints a line and ends with status 4; anything else
    /// is refused as allotd refuses another user's.
    async fn attach(
        &self,
        r: Request<tonic::Streaming<allot_proto::v1::AttachInput>>,
    ) -> Result<Response<Self::AttachStream>, Status> {
        use allot_proto::v1::AttachOutput;
        let first = r.into_inner().message().await?.unwrap_or_default();
        if first.id != "18" {
            return Err(Status::permission_denied(format!(
                "id: ana may not attach to workload {} of bo: only its owner (or an admin) may type into a session",
                first.id
            )));
        }
        Ok(Response::new(tokio_stream::iter(vec![
            Ok(AttachOutput {
                node: "gpu-01".into(),
                lease_id: "A-2".into(),
                ..Default::default()
            }),
            Ok(AttachOutput {
                data: b"hello from the session\r\n".to_vec(),
                ..Default::default()
            }),
            Ok(AttachOutput {
                ended: true,
                exit_code: Some(4),
                ..Default::default()
            }),
        ])))
    }

    type LogsStream = tokio_stream::Iter<std::vec::IntoIter<Result<LogsChunk, Status>>>;

    /// 18 wrote two pieces in its first run and one in its second (bytes that are
    /// not UTF-8 among them); anything else is refused as allotd refuses.
    async fn logs(&self, r: Request<LogsRequest>) -> Result<Response<Self::LogsStream>, Status> {
        let r = r.into_inner();
        self.seen().logs.push(r.clone());
        if r.id != "18" {
            return Err(Status::permission_denied(format!(
                "id: ana may not read the output of workload {} of bo: only its owner, an operator ([roles] operators in allotd.toml) or an admin may",
                r.id
            )));
        }
        let piece = |data: &[u8], run, node: &str| {
            Ok(LogsChunk {
                data: data.to_vec(),
                run,
                node: node.into(),
                lease_id: format!("A-{run}"),
            })
        };
        Ok(Response::new(tokio_stream::iter(vec![
            piece(b"step 1\n", 1, "gpu-01"),
            piece(b"step 2 \xff\n", 1, "gpu-01"),
            piece(b"resumed\n", 2, "gpu-02"),
        ])))
    }
}

/// Running again after its node was lost, and after an allotd restart that kept no
/// start time.
fn requeued() -> Workload {
    let mut w = workload("21", WorkloadState::Running);
    w.start_unix = 0;
    w.end_reason = "node-lost".into();
    w.preemptions = 1;
    w
}

/// A group of a 32-GPU cluster with a week's window, 24 h of it covered, a 1 h
/// horizon: received 80 % of its fair part, 8 GPUs running.
fn group(name: &str, parent: &str, depth: u32, weight: f64, share: f64) -> Group {
    let fair = share * 32.0 * (24.0 + 1.0);
    let received = fair * 0.8 - 8.0;
    Group {
        name: name.into(),
        parent: parent.into(),
        weight,
        share,
        entitled_gpu_hours: share * 32.0 * 168.0,
        served_gpu_hours: received,
        ratio: (received + 8.0) / fair,
        running_gpus: 8,
        pending_gpus: 16,
        project: depth == 2,
        depth,
        counted_gpu_hours: received + 8.0,
        fair_gpu_hours: fair,
        gpu_util: (depth == 2).then_some(0.42),
    }
}

#[tonic::async_trait]
impl Org for Fake {
    async fn usage(&self, r: Request<UsageRequest>) -> Result<Response<UsageResponse>, Status> {
        let r = r.into_inner();
        self.seen()
            .controls
            .push(format!("usage by={} per={}", r.by, r.per));
        Ok(Response::new(UsageResponse {
            rows: vec![UsageRow {
                period_unix: 1_764_892_800,
                key: "vision".into(),
                gpu_hours: 12.5,
                funded_gpu_hours: 10.0,
                unfunded_gpu_hours: 2.5,
                entitled_gpu_hours: 20.0,
                runs: 3,
                ..Default::default()
            }],
            since_unix: 1_764_892_800,
            until_unix: 1_764_979_200,
        }))
    }

    async fn get_tree(
        &self,
        _: Request<GetTreeRequest>,
    ) -> Result<Response<GetTreeResponse>, Status> {
        Ok(Response::new(GetTreeResponse {
            groups: vec![
                group("ml", "", 1, 3.0, 0.75),
                group("vision", "ml", 2, 1.0, 0.25),
                group("nlp", "ml", 2, 2.0, 0.5),
                group("infra", "", 1, 1.0, 0.25),
                // A sliver of the tree that has received a little: small numbers
                // keep the columns' one precision.
                Group {
                    entitled_gpu_hours: 0.5,
                    served_gpu_hours: 0.005,
                    running_gpus: 0,
                    counted_gpu_hours: 0.005,
                    fair_gpu_hours: 0.075,
                    ratio: 0.005 / 0.075,
                    ..group("tiny", "infra", 2, 1.0, 0.0001)
                },
            ],
            window_hours: 168.0,
            capacity_gpus: 32,
            weighted_capacity_gpus: 32.0,
            covered_hours: 24.0,
            horizon_hours: 1.0,
            ranking_window_hours: 0.0,
            drf: false,
        }))
    }

    async fn set_weight(&self, r: Request<SetWeightRequest>) -> Result<Response<Group>, Status> {
        let r = r.into_inner();
        self.seen().weights.push(r.clone());
        if r.name != "vision" {
            return Err(Status::not_found(format!(
                "name: no group {} (see `allot share`)",
                r.name
            )));
        }
        Ok(Response::new(group("vision", "ml", 2, r.weight, 0.375)))
    }
}

fn node(name: &str) -> Node {
    Node {
        name: name.into(),
        cluster: "a".into(),
        state: "ready".into(),
        connected: true,
        gpus: 8,
        free_gpus: 3,
        cpu: 128,
        memory_gb: 2_048,
        verdict: HostVerdict::Ok as i32,
        lease_ids: vec!["L-1".into(), "L-3".into()],
        gpu_list: vec![Gpu {
            uuid: "GPU-aaaa".into(),
            index: 0,
            state: GpuState::Healthy as i32,
            lease_id: "L-1".into(),
            ..Default::default()
        }],
        last_seen_unix: 1_795_980_000,
        ..Default::default()
    }
}

#[tonic::async_trait]
impl Nodes for Fake {
    async fn list(
        &self,
        _: Request<ListNodesRequest>,
    ) -> Result<Response<ListNodesResponse>, Status> {
        let mut up = node("gpu-01");
        up.gpu_type = "h100".into();
        up.features = vec!["nvlink".into(), "ib".into()];
        let mut down = node("gpu-02");
        down.state = "down".into();
        down.connected = false;
        down.free_gpus = 0;
        down.verdict = HostVerdict::DrainNow as i32;
        down.drain_reason = "health: xid:79 fallen off the bus".into();
        down.drains = vec![
            DrainInfo {
                by: "health".into(),
                author: "gpu-02".into(),
                reason: "xid:79 fallen off the bus".into(),
                now: true,
                since_unix: 1_795_980_000,
                held: false,
            },
            DrainInfo {
                by: "cluster-operator".into(),
                author: "allotd".into(),
                reason: "swap PSU".into(),
                now: false,
                since_unix: 1_795_980_600,
                held: false,
            },
        ];
        Ok(Response::new(ListNodesResponse {
            nodes: vec![up, down],
        }))
    }

    async fn drain(&self, r: Request<NodeDrainRequest>) -> Result<Response<Node>, Status> {
        let r = r.into_inner();
        self.seen().drains.push(r.clone());
        let mut n = node(&r.name);
        if !r.undrain {
            n.state = if r.now { "drain-now" } else { "draining" }.into();
            n.drain_reason = format!("operator: {}", r.reason);
        }
        Ok(Response::new(n))
    }
}

/// A fake allotd serving on a fresh port for the rest of the test process; its address.
fn serve(fake: Fake) -> String {
    serve_tcp(
        tonic::transport::Server::builder()
            .add_service(WorkloadsServer::new(fake.clone()))
            .add_service(OrgServer::new(fake.clone()))
            .add_service(NodesServer::new(fake)),
    )
}
#[test]
fn arrays_dependencies_and_holds_are_sent_as_given() {
    let fake = Fake::default();
    let addr = serve(fake.clone());
    let (code, out, err) = allot(&[
        "submit",
        "--server",
        &addr,
        "--project",
        "vision",
        "--array",
        "0-9%2",
        "--afterok",
        "3,4",
        "-d",
        "afterany:5,singleton",
        "--begin",
        "2026-12-24T16:00",
        "--hold",
        "-J",
        "sweep",
        "--",
        "true",
    ]);
    assert_eq!(code, 0, "{err}");
    assert!(out.starts_with("submitted array 17: 10 workloads"), "{out}");
    assert!(out.contains("at most 2 at once"), "{out}");
    {
        let seen = fake.seen();
        let s = &seen.submits[0];
        assert_eq!(s.array, "0-9%2");
        let deps: Vec<String> = s
            .dependencies
            .iter()
            .map(|d| format!("{}:{}", d.kind, d.id))
            .collect();
        assert_eq!(deps, ["afterok:3", "afterok:4", "afterany:5"]);
        assert!(s.singleton && s.hold);
        assert_eq!(s.begin_unix, 1_798_128_000);
    }
    // Bad shapes are refused before allotd is asked, naming the flag.
    for (flag, value, words) in [
        ("--array", "5-1", "runs backwards"),
        ("--dependency", "before:3", "not a dependency allot knows"),
        ("--begin", "someday", "is not a time"),
        ("--afterok", "x", "is not a workload id"),
    ] {
        let (code, _, err) = allot(&["submit", "--server", &addr, flag, value, "--", "true"]);
        assert_ne!(code, 0, "{flag} {value}");
        assert!(err.contains(words), "{flag} {value}: {err}");
    }
    // Hold, release, requeue --hold, update: each id on its own; a refusal is named
    // and the others go on.
    let (code, out, err) = allot(&["hold", "--server", &addr, "5", "99", "6"]);
    assert_ne!(code, 0);
    assert!(err.contains("workload 99: id: ana may not hold"), "{err}");
    assert!(
        out.contains("workload 5 held: pending") && out.contains("workload 6 held"),
        "{out}"
    );
    let (code, _, err) = allot(&["requeue", "--server", &addr, "--hold", "7"]);
    assert_eq!(code, 0, "{err}");
    let (code, _, err) = allot(&[
        "update",
        "--server",
        &addr,
        "8",
        "--time-limit",
        "30m",
        "--priority",
        "-1",
    ]);
    assert_eq!(code, 0, "{err}");
    let (code, _, err) = allot(&["update", "--server", &addr, "8"]);
    assert_ne!(code, 0);
    assert!(err.contains("nothing to change"), "{err}");
    assert_eq!(
        fake.seen().controls,
        [
            "hold 5 hold=false",
            "hold 6 hold=false",
            "requeue 7 hold=true",
            "update Some(1800) Some(-1) None 8 hold=false"
        ]
    );
}

#[test]
fn history_and_usage_read_as_tables_csv_and_json() {
    let fake = Fake::default();
    let addr = serve(fake.clone());
    let (code, out, err) = allot(&["history", "--server", &addr, "--state", "failed"]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("10_2") && out.contains("gpu-07") && out.contains("1h00m"),
        "{out}"
    );
    assert!(err.contains("more runs matched"), "{err}");
    let (code, out, _) = allot(&[
        "history",
        "--server",
        &addr,
        "--csv",
        "--since",
        "2025-12-01",
    ]);
    assert_eq!(code, 0);
    let mut lines = out.lines();
    assert_eq!(
        lines.next(),
        Some("id,run,name,user,project,gpus,nodes,start,end,elapsed,state,exit,gpu_hours")
    );
    assert!(
        lines
            .next()
            .is_some_and(|l| l.starts_with("10_2,1,\"sweep, big\",ana,")),
        "{out}"
    );
    let (code, out, _) = allot(&["history", "--server", &addr, "--json"]);
    assert_eq!(code, 0);
    let v: serde_json::Value = serde_json::from_str(&out).expect("json");
    assert_eq!(v[0]["exit_code"], 3);
    let (code, _, err) = allot(&["history", "--server", &addr, "--since", "last tuesday"]);
    assert_ne!(code, 0);
    assert!(err.contains("neither a duration back from now"), "{err}");
    let (code, out, err) = allot(&["usage", "--server", &addr, "--by", "team", "--per", "week"]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.starts_with("GPU-hours from 2025-12-05T00:00:00Z"),
        "{out}"
    );
    assert!(
        out.contains("TEAM") && out.contains("12.5") && out.contains("20.0"),
        "{out}"
    );
    let (code, out, _) = allot(&["usage", "--server", &addr, "--csv"]);
    assert_eq!(code, 0);
    assert!(out.starts_with("period,project,gpu_hours,funded,"), "{out}");
    let (code, _, err) = allot(&["usage", "--server", &addr, "--by", "lab"]);
    assert_ne!(code, 0);
    assert!(err.contains("--by"), "{err}");
    assert_eq!(
        fake.seen().controls,
        [
            "history user= since>0=true state=failed limit=1000",
            "history user= since>0=true state= limit=1000",
            "history user= since>0=true state= limit=1000",
            "usage by=team per=week",
            "usage by=project per="
        ]
    );
}

#[test]
fn submit_sends_the_whole_spec() {
    let fake = Fake::default();
    let addr = serve(fake.clone());
    let (code, out, err) = allot(&[
        "submit",
        "--server",
        &addr,
        "--project",
        "vision",
        "--gpus",
        "8",
        "--nodes",
        "2",
        "--cpus",
        "32",
        "--memory",
        "64G",
        "--min-runtime",
        "8h",
        "--time-limit",
        "2d",
        "--resumable",
        "--no-requeue",
        "--priority",
        "-3",
        "--class",
        "interactive",
        "--checkpoint",
        "signal:USR1",
        "--user",
        "ana",
        "--",
        "python",
        "train.py",
        "--lr",
        "3e-4",
    ]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(
        out,
        "submitted workload 17 (project vision, 16 GPUs on 2 nodes)\ncontract: protected for 8h; after that, if preempted, it ends as preempted, not requeued (--no-requeue); ends at its time limit, 2d (class interactive)\n"
    );
    let seen = fake.seen();
    let s = &seen.submits[0];
    assert_eq!(s.project, "vision");
    assert_eq!(s.user, "ana");
    assert_eq!(s.class, "interactive");
    assert_eq!((s.gpus_per_node, s.nodes), (8, 2));
    assert_eq!((s.cpu_per_node, s.mem_per_node_gb), (32, 64));
    assert_eq!(s.min_runtime_s, Some(28_800));
    assert_eq!(s.time_limit_s, Some(172_800));
    assert!(s.resumable);
    assert!(s.no_requeue);
    assert_eq!(s.priority, -3);
    assert_eq!(s.checkpoint_hook, "signal:USR1");
    assert_eq!(s.argv, ["python", "train.py", "--lr", "3e-4"]);
}

#[test]
fn submit_defaults_and_json() {
    let fake = Fake::default();
    let addr = serve(fake.clone());
    let (code, out, err) = allot_env(
        &[
            "submit",
            "--project",
            "vision",
            "--memory",
            "512M",
            "--json",
            "--",
            "true",
        ],
        &[("ALLOT_SERVER", addr.as_str()), ("USER", "bob")],
    );
    assert_eq!(code, 0, "{err}");
    let v = json(&out);
    assert_eq!(v["id"], "17");
    assert_eq!(v["workload"]["min_runtime_s"], 0);
    assert_eq!(
        v["contract"],
        "free occupancy: may be preempted at any time, and then is requeued and restarts from the beginning; add --min-runtime or --resumable; no time limit (class batch)"
    );
    let seen = fake.seen();
    let s = &seen.submits[0];
    // The user is who allotd proves (the token, or the vouching agent), not $USER.
    assert_eq!(s.user, "");
    // Left out, so that allotd applies its default class.
    assert_eq!(s.class, "");
    assert_eq!((s.gpus_per_node, s.nodes), (1, 1));
    assert_eq!((s.cpu_per_node, s.mem_per_node_gb), (0, 1));
    // Left out, so that allotd applies the class's default.
    assert_eq!((s.min_runtime_s, s.time_limit_s), (None, None));
    assert!(!s.resumable);
    assert!(!s.no_requeue);
    assert_eq!(s.priority, 0);
    assert_eq!(s.checkpoint_hook, "");
    assert_eq!(s.argv, ["true"]);
    drop(seen);

    let (code, out, err) = allot(&[
        "submit",
        "--server",
        &addr,
        "--project",
        "vision",
        "--",
        "true",
    ]);
    assert_eq!(code, 0, "{err}");
    // No flags: the contract is said aloud, with how to ask for more.
    assert_eq!(
        out,
        "submitted workload 17 (project vision, 1 GPU)\ncontract: free occupancy: may be preempted at any time, and then is requeued and restarts from the beginning; add --min-runtime or --resumable; no time limit (class batch)\n"
    );
}

#[test]
fn submit_refused_prints_allotds_reason() {
    let addr = serve(Fake::default());
    let (code, out, err) = allot(&["submit", "--server", &addr, "--project", "nope", "--", "x"]);
    assert_eq!(code, 1, "{out}");
    assert_eq!(err, "error: project: no project nope (see `allot share`)\n");
}

#[test]
fn queue_shows_pending_and_running_by_default() {
    let fake = Fake::default();
    let addr = serve(fake.clone());
    let (code, out, err) = allot(&[
        "queue",
        "--server",
        &addr,
        "--project",
        "vision",
        "--user",
        "ana",
    ]);
    assert_eq!(code, 0, "{err}");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(
        lines[0].split_whitespace().collect::<Vec<_>>(),
        [
            "ID",
            "NAME",
            "PROJECT",
            "USER",
            "CLASS",
            "GPUS",
            "STATE",
            "RUN",
            "WAITED/RAN",
            "START",
            "PREEMPTED",
            "NODES",
            "WHY"
        ]
    );
    // Running first, then pending; 20 once, as running.
    assert_eq!(lines.len(), 4, "{out}");
    let ids: Vec<&str> = lines[1..]
        .iter()
        .map(|l| l.split_whitespace().next().unwrap_or(""))
        .collect();
    assert_eq!(ids, ["18", "20", "17"]);
    let running: Vec<&str> = lines[1].split_whitespace().collect();
    assert_eq!(
        running[..8],
        ["18", "-", "vision", "ana", "batch", "8x2", "running", "0"]
    );
    assert!(running[8].starts_with("1h0"), "{out}");
    assert_eq!(running[9..], ["-", "1", "gpu-01,gpu-02", "-"]);
    let pending: Vec<&str> = lines[3].split_whitespace().collect();
    assert_eq!(pending[6], "pending");
    assert!(pending[8].starts_with("3m1"), "{out}");
    assert!(
        lines[3].ends_with("needs 2 whole nodes, 1 are free in one cluster"),
        "{out}"
    );

    let seen = fake.seen();
    let asked: Vec<(WorkloadState, &str, &str)> = seen
        .lists
        .iter()
        .map(|l| (l.state(), l.project.as_str(), l.user.as_str()))
        .collect();
    assert_eq!(
        asked,
        [
            (WorkloadState::Pending, "vision", "ana"),
            (WorkloadState::Running, "vision", "ana")
        ]
    );
}

#[test]
fn queue_state_all_and_json() {
    let fake = Fake::default();
    let addr = serve(fake.clone());
    let (code, out, err) = allot(&["queue", "--server", &addr, "--state", "timed-out"]);
    assert_eq!(code, 0, "{err}");
    let row: Vec<&str> = out
        .lines()
        .nth(1)
        .expect("row")
        .split_whitespace()
        .collect();
    assert_eq!(row[6], "timed-out");
    assert_eq!(row[8], "1h00m");
    assert_eq!(row[12], "time-limit");

    let (code, out, err) = allot(&["queue", "--server", &addr, "--all", "--json"]);
    assert_eq!(code, 0, "{err}");
    let v = json(&out);
    let a = v.as_array().expect("array");
    let states: Vec<&str> = a.iter().filter_map(|w| w["state"].as_str()).collect();
    assert_eq!(states, ["pending", "running", "timed-out"]);
    assert_eq!(a[0]["id"], "17");
    assert_eq!(a[0]["gpus_per_node"], 8);
    assert_eq!(a[0]["nodes"], 2);
    assert_eq!(a[0]["time_limit_s"], 172_800);
    assert_eq!(a[1]["node_names"][1], "gpu-02");
    assert_eq!(a[1]["lease_ids"][0], "L-1");
    assert_eq!(a[1]["funded"], true);
    assert_eq!(a[2]["end_reason"], "time-limit");

    let (code, _, err) = allot(&["queue", "--server", &addr, "--all", "--state", "failed"]);
    assert_eq!(code, 2, "{err}");

    let states: Vec<WorkloadState> = fake.seen().lists.iter().map(|l| l.state()).collect();
    assert_eq!(
        states,
        [WorkloadState::TimedOut, WorkloadState::Unspecified]
    );
}

#[test]
fn status_explains_pending_work() {
    let fake = Fake::default();
    let addr = serve(fake.clone());
    let (code, out, err) = allot(&["status", "17", "--server", &addr]);
    assert_eq!(code, 0, "{err}");
    let lines: Vec<&str> = out.lines().collect();
    for want in [
        "id:          17",
        "project:     vision",
        "user:        ana",
        "class:       batch",
        "state:       pending",
        "gpus:        8x2 (16 in all)",
        "min runtime: 8h",
        "time limit:  2d",
        "resumable:   yes",
        "priority:    0",
        "requeue:     yes, resumes from its checkpoint",
        "started:     -",
        "nodes:       -",
        "leases:      -",
        "preemptions: 0",
        "funded:      no",
        "command:     python train.py",
        "why:",
        "  project vision is served 1.30× its share; needs 2 whole nodes, 1 are free in one cluster",
    ] {
        assert!(lines.contains(&want), "missing {want:?} in\n{out}");
    }
    let submitted = lines
        .iter()
        .find(|l| l.starts_with("submitted:"))
        .expect("submitted");
    assert!(
        submitted.contains("Z (3m1") && submitted.ends_with(" ago)"),
        "{out}"
    );

    // Not final: no end to show.
    assert!(
        !out.contains("ended:") && !out.contains("end reason:"),
        "{out}"
    );

    let (code, out, err) = allot(&["status", "18", "--server", &addr]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("nodes:       gpu-01, gpu-02\n"), "{out}");
    assert!(out.contains("funded:      yes\n"), "{out}");
    assert!(!out.contains("why:"), "{out}");

    // Running again after its node was lost: how the last run ended, not an end reason.
    let (code, out, err) = allot(&["status", "21", "--server", &addr]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("state:          running\n"), "{out}");
    assert!(out.contains("last run ended: node-lost\n"), "{out}");
    assert!(out.contains("started:        -\n"), "{out}");
    assert!(!out.contains("end reason"), "{out}");

    let (code, out, err) = allot(&["status", "19", "--server", &addr]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("end reason:  time-limit\n"), "{out}");
    assert!(out.contains("ran:         1h00m\n"), "{out}");

    let (code, out, err) = allot(&["status", "18", "--json", "--server", &addr]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(json(&out)["state"], "running");

    let (code, out, err) = allot(&["status", "404", "--server", &addr]);
    assert_eq!(code, 1, "{out}");
    assert_eq!(
        err,
        "error: id: no workload 404 (see `allot queue --all`)\n"
    );
    assert_eq!(fake.seen().gets, ["17", "18", "21", "19", "18", "404"]);
}

#[test]
fn cancel_prints_the_state_after() {
    let fake = Fake::default();
    let addr = serve(fake.clone());
    let (code, out, err) = allot(&["cancel", "17", "--server", &addr]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(out, "workload 17: cancelled\n");
    let (code, out, err) = allot(&["cancel", "18", "--server", &addr]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(
        out,
        "cancel requested: workload 18 is revoked now and ends after its checkpoint ladder\n"
    );
    let (code, out, err) = allot(&["cancel", "18", "--json", "--server", &addr]);
    assert_eq!(code, 0, "{err}");
    let v = json(&out);
    assert_eq!(v["id"], "18");
    assert_eq!(v["state"], "running");
    assert_eq!(fake.seen().cancels, ["17", "18", "18"]);
}

#[test]
fn queue_refuses_a_project_that_does_not_exist() {
    let fake = Fake::default();
    let addr = serve(fake.clone());
    let (code, out, err) = allot(&["queue", "--project", "nope", "--server", &addr]);
    assert_eq!(code, 1, "{out}");
    assert_eq!(
        err,
        "error: --project nope: no project nope; the projects are vision, nlp, tiny (`allot share` shows the tree)\n"
    );
    let (code, _, err) = allot(&["queue", "--project", "ml", "--server", &addr]);
    assert_eq!(code, 1);
    assert_eq!(
        err,
        "error: --project ml: ml is a group of the fair-share tree, not a project; its projects: vision, nlp (`allot share` shows the tree)\n"
    );
    // Nothing was listed for either.
    assert!(fake.seen().lists.is_empty());
}

#[test]
fn the_server_goes_before_or_after_the_command() {
    let addr = serve(Fake::default());
    let (code, out, err) = allot(&["--server", &addr, "queue"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.starts_with("ID "), "{out}");
    let (code, _, err) = allot(&["--server", "127.0.0.1:1", "share", "--server", &addr]);
    assert_eq!(code, 0, "{err}");
    let (code, _, err) = allot_env(
        &["--server", &addr, "nodes", "undrain", "gpu-01"],
        &[("ALLOT_SERVER", "127.0.0.1:1")],
    );
    assert_eq!(code, 0, "{err}");
}

#[test]
fn share_shows_the_tree() {
    let addr = serve(Fake::default());
    let (code, out, err) = allot(&["share", "--server", &addr]);
    assert_eq!(code, 0, "{err}");
    // Every column is what it says, and RATIO = COUNTED / FAIR on every row.
    expect_test::expect![[r#"
        window: 168h, capacity: 32 GPUs, history covered: 24h, horizon: 1h
        NAME      WEIGHT  SHARE  BUDGET  RECEIVED  RUNNING  COUNTED  FAIR   RATIO  PENDING  GPU_USE
        ml        3       75.0%  4032.0  472.0     8        480.0    600.0  0.80   16       -
          vision  1       25.0%  1344.0  152.0     8        160.0    200.0  0.80   16       42%
          nlp     2       50.0%  2688.0  312.0     8        320.0    400.0  0.80   16       42%
        infra     1       25.0%  1344.0  152.0     8        160.0    200.0  0.80   16       -
          tiny    1       0.0%   0.5     0.0       0        0.0      0.1    0.07   16       42%
        GPU-hours. BUDGET = SHARE × 32 GPUs × 168h; RECEIVED = usage in the window.
        RATIO = COUNTED / FAIR, lowest served first at each level:
          COUNTED = RECEIVED + RUNNING × 1h
          FAIR = SHARE × 32 GPUs × (24h covered + 1h)
        GPU_USE = how busy the RUNNING GPUs are, by their hosts' last word.
    "#]]
    .assert_eq(&out);

    let (code, out, err) = allot(&["share", "--json", "--server", &addr]);
    assert_eq!(code, 0, "{err}");
    let v = json(&out);
    assert_eq!(v["window_hours"], 168.0);
    assert_eq!(v["capacity_gpus"], 32);
    let g = &v["groups"][1];
    assert_eq!(g["name"], "vision");
    assert_eq!(g["parent"], "ml");
    assert_eq!(g["share"], 0.25);
    assert_eq!(g["project"], true);
    assert_eq!(g["depth"], 2);
    for k in [
        "weight",
        "entitled_gpu_hours",
        "served_gpu_hours",
        "ratio",
        "running_gpus",
        "pending_gpus",
    ] {
        assert!(g.get(k).is_some(), "missing {k}");
    }
}

#[test]
fn budget_set_sends_the_weight() {
    let fake = Fake::default();
    let addr = serve(fake.clone());
    let (code, out, err) = allot(&[
        "budget", "set", "vision", "--weight", "1.5", "--server", &addr,
    ]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(
        out,
        "vision: weight 1.5, share 37.5%, budget 2016.0 gpu-h, received 232.0 gpu-h, ratio 0.80\n"
    );
    let (code, out, err) = allot(&[
        "budget", "set", "vision", "--weight", "2", "--json", "--server", &addr,
    ]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(json(&out)["weight"], 2.0);
    let (code, _, err) = allot(&["budget", "set", "vison", "--weight", "2", "--server", &addr]);
    assert_eq!(code, 1);
    assert_eq!(err, "error: name: no group vison (see `allot share`)\n");
    let asked: Vec<(String, f64)> = fake
        .seen()
        .weights
        .iter()
        .map(|w| (w.name.clone(), w.weight))
        .collect();
    assert_eq!(
        asked,
        [
            ("vision".to_string(), 1.5),
            ("vision".to_string(), 2.0),
            ("vison".to_string(), 2.0)
        ]
    );
}

#[test]
fn nodes_list_drain_and_undrain() {
    let fake = Fake::default();
    let addr = serve(fake.clone());
    let (code, out, err) = allot(&["nodes", "--server", &addr]);
    assert_eq!(code, 0, "{err}");
    let lines: Vec<Vec<&str>> = out
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(
        lines[0],
        [
            "NAME",
            "CLUSTER",
            "TYPE",
            "FEATURES",
            "STATE",
            "CONNECTED",
            "FREE/GPUS",
            "VERDICT",
            "LEASES",
            "DRAIN"
        ]
    );
    assert_eq!(
        lines[1],
        [
            "gpu-01",
            "a",
            "h100",
            "nvlink,ib",
            "ready",
            "yes",
            "3/8",
            "ok",
            "2",
            "-"
        ]
    );
    assert_eq!(
        lines[2][..9],
        [
            "gpu-02",
            "a",
            "-",
            "-",
            "down",
            "no",
            "0/8",
            "drain-now",
            "2"
        ]
    );
    // The first drain's kind and reason, and how many more.
    assert!(
        out.lines()
            .nth(2)
            .unwrap_or("")
            .ends_with("health (xid:79 fallen off the bus) +1"),
        "{out}"
    );

    let (code, out, err) = allot(&["nodes", "--json", "--server", &addr]);
    assert_eq!(code, 0, "{err}");
    let v = json(&out);
    assert_eq!(v[0]["name"], "gpu-01");
    assert_eq!(v[0]["verdict"], "ok");
    assert_eq!(v[0]["gpu_type"], "h100");
    assert_eq!(v[0]["features"][1], "ib");
    assert_eq!(v[0]["memory_gb"], 2_048);
    assert_eq!(v[0]["lease_ids"][1], "L-3");
    assert_eq!(v[0]["last_seen_unix"], 1_795_980_000_i64);
    assert_eq!(v[0]["gpu_list"][0]["uuid"], "GPU-aaaa");
    assert_eq!(v[0]["gpu_list"][0]["state"], "healthy");
    assert_eq!(v[1]["connected"], false);
    assert_eq!(v[1]["drain_reason"], "health: xid:79 fallen off the bus");
    assert_eq!(v[0]["drains"], serde_json::json!([]));
    let drains = v[1]["drains"].as_array().expect("drains");
    assert_eq!(drains.len(), 2);
    assert_eq!(drains[0]["by"], "health");
    assert_eq!(drains[0]["now"], true);
    assert_eq!(drains[1]["by"], "cluster-operator");
    assert_eq!(drains[1]["author"], "allotd");
    assert_eq!(drains[1]["reason"], "swap PSU");
    assert_eq!(drains[1]["since_unix"], 1_795_980_600_i64);
    assert_eq!(drains[1]["held"], false);

    let (code, out, err) = allot(&[
        "nodes", "drain", "gpu-01", "--reason", "swap PSU", "--now", "--server", &addr,
    ]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(out, "node gpu-01: drain-now (operator: swap PSU)\n");

    // --server and --json before the subcommand work too.
    let (code, out, err) = allot(&[
        "nodes", "--server", &addr, "--json", "drain", "gpu-02", "--reason", "rack",
    ]);
    assert_eq!(code, 0, "{err}");
    let v = json(&out);
    assert_eq!(v["state"], "draining");
    assert_eq!(v["drain_reason"], "operator: rack");

    let (code, out, err) = allot(&["nodes", "undrain", "gpu-01", "--server", &addr]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(out, "node gpu-01: ready\n");

    let seen = fake.seen();
    let asked: Vec<(&str, &str, bool, bool)> = seen
        .drains
        .iter()
        .map(|d| (d.name.as_str(), d.reason.as_str(), d.now, d.undrain))
        .collect();
    assert_eq!(
        asked,
        [
            ("gpu-01", "swap PSU", true, false),
            ("gpu-02", "rack", false, false),
            ("gpu-01", "", false, true)
        ]
    );
}

#[test]
fn attach_prints_the_session_and_exits_with_its_status() {
    let fake = Fake::default();
    let addr = serve(fake.clone());
    // Off a terminal (stdin is no tty here): no raw mode, the output as it comes.
    let (code, out, err) = allot(&["attach", "18", "--server", &addr]);
    assert_eq!(code, 4, "the program's status is the command's: {err}");
    assert_eq!(out, "hello from the session\r\n");
    let (code, _, err) = allot(&["attach", "19", "--server", &addr]);
    assert_eq!(code, 1);
    assert!(err.contains("may not attach to workload 19"), "{err}");
}

#[test]
fn run_refuses_what_a_command_one_waits_for_cannot_be() {
    for (flags, named) in [
        (&["--array", "0-3"][..], "--array"),
        (&["--hold"][..], "--hold"),
        (&["--pty", "--nodes", "2"][..], "--nodes"),
    ] {
        let mut args = vec!["run", "--server", "127.0.0.1:1"];
        args.extend_from_slice(flags);
        args.extend(["--", "true"]);
        let (code, _, err) = allot(&args);
        assert_eq!(code, 2, "{flags:?}: {err}");
        assert!(err.contains(named), "{flags:?}: {err}");
    }
    let (code, _, err) = allot(&["run", "--server", "127.0.0.1:1", "job.sh"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("after `--`"), "{err}");
}

#[test]
fn logs_prints_the_bytes_as_they_came_and_marks_a_new_run_on_stderr() {
    let fake = Fake::default();
    let addr = serve(fake.clone());
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_allot"))
        .args(["logs", "18", "-f", "--stderr", "--server", &addr])
        .env_remove("ALLOT_TOKEN")
        .env_remove("ALLOT_SERVER")
        .env_remove("ALLOT_CA")
        .env("ALLOT_SOCKET", "/nonexistent/agent.sock")
        .output()
        .expect("allot runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(out.stdout, b"step 1\nstep 2 \xff\nresumed\n");
    assert_eq!(
        String::from_utf8_lossy(&out.stderr),
        "==> run 2 on gpu-02 (lease A-2) <==\n"
    );
    let (code, out, err) = allot(&["logs", "18", "--run", "1", "--rank", "1", "--server", &addr]);
    assert_eq!(code, 0, "{err}");
    assert!(out.starts_with("step 1\n"), "{out}");
    let (code, _, err) = allot(&["logs", "19", "--server", &addr]);
    assert_eq!(code, 1);
    assert!(
        err.contains("may not read the output of workload 19"),
        "{err}"
    );
    let (code, _, err) = allot(&["logs", "18", "--run", "0", "--server", &addr]);
    assert_eq!(code, 2, "runs count from 1: {err}");
    let seen = fake.seen().logs.clone();
    assert_eq!(seen.len(), 3, "{seen:?}");
    assert!(seen[0].follow && seen[0].run == 0 && seen[0].stream == LogStream::Stderr as i32);
    assert!(!seen[1].follow && seen[1].run == 1 && seen[1].rank == 1);
    assert_eq!(seen[1].stream, LogStream::Stdout as i32);
}
