//! End to end: allotd and real agents on fake GPUs, real workloads, driven through
//! the `allot` CLI.

mod support;

use std::time::Duration;
use support::{wait_for, Cluster};

const LONG: Duration = Duration::from_secs(60);

const TWO_PROJECTS: &str =
    "[[group]]\nname = \"demo-a\"\nweight = 1\n[[group]]\nname = \"demo-b\"\nweight = 1\n";

#[test]
fn a_job_runs_to_completion() {
    let c = Cluster::start("complete", TWO_PROJECTS, 2, 4);
    let id = c.submit(
        &["--project", "demo-a", "--gpus", "2"],
        "echo \"$CUDA_VISIBLE_DEVICES\"; sleep 1",
    );
    let w = c.wait_state(&id, "completed", LONG);
    assert_eq!(w["end_reason"], "completed", "{w}");
    assert_eq!(w["lease_ids"].as_array().map(Vec::len), Some(1), "{w}");
    // It really ran on an agent with its two GPUs.
    // Output goes to the agent's log dir: <workload>/<run>.<rank>.out.
    let ran = (0..2).any(|i| {
        // Each user's output is in a directory of their own.
        let logs = c
            .node_dir(i)
            .join("state/logs")
            .join(allot_test_support::current_user());
        std::fs::read_dir(&logs)
            .into_iter()
            .flatten()
            .flatten()
            .any(|w| {
                std::fs::read_to_string(w.path().join("1.0.out"))
                    .is_ok_and(|s| s.trim().split(',').count() == 2)
            })
    });
    assert!(ran, "no node has the lease's output with two GPUs");
    let m = c.metrics_text();
    assert!(m.contains("allot_agents_connected 2"), "{m}");
    assert!(
        m.contains("allot_queue_wait_seconds_count{class=\"batch\"} 1"),
        "{m}"
    );
}

#[test]
fn shares_3_to_1_split_a_saturated_cluster_3_to_1() {
    let groups =
        "[[group]]\nname = \"demo-a\"\nweight = 3\n[[group]]\nname = \"demo-b\"\nweight = 1\n";
    let c = Cluster::start("share", groups, 2, 4);
    // Saturated demand in short jobs, submitted alternately: first come, first
    // served would split the 8 GPUs 4:4; fair share gives each freed GPU to the
    // project furthest below its share. Jobs of 5 s: demo-a's queue lasts about
    // 25 s, time for the samples below even where each CLI call is slow.
    for _ in 0..30 {
        c.submit(
            &["--project", "demo-a", "--gpus", "1", "--min-runtime", "1m"],
            "sleep 5",
        );
        c.submit(
            &["--project", "demo-b", "--gpus", "1", "--min-runtime", "1m"],
            "sleep 5",
        );
    }
    // The first wave filled the GPUs in arrival order; measure once it has gone.
    wait_for("the first wave to finish", LONG, || {
        let done = c.json(&["queue", "--state", "completed", "--json"]);
        (done.as_array().map_or(0, Vec::len) >= 8).then_some(())
    });
    let (mut a, mut b, mut samples) = (0u64, 0u64, 0);
    wait_for("enough saturated samples", LONG, || {
        let t = c.json(&["share", "--json"]);
        let g = |name: &str, f: &str| {
            t["groups"]
                .as_array()
                .and_then(|g| g.iter().find(|g| g["name"] == name))
                .and_then(|g| g[f].as_u64())
                .unwrap_or(0)
        };
        let (ra, rb) = (g("demo-a", "running_gpus"), g("demo-b", "running_gpus"));
        if ra + rb == 8 && g("demo-a", "pending_gpus") > 0 && g("demo-b", "pending_gpus") > 0 {
            a += ra;
            b += rb;
            samples += 1;
        }
        std::thread::sleep(Duration::from_millis(200));
        (samples >= 20).then_some(())
    });
    let share = a as f64 / (a + b) as f64;
    assert!(
        (0.65..=0.85).contains(&share),
        "demo-a held {share:.2} of the GPUs ({a}:{b} over {samples} samples)"
    );
}

#[test]
fn an_unfunded_job_is_preempted_at_once_and_requeued() {
    let c = Cluster::start("preempt", TWO_PROJECTS, 1, 2);
    let free = c.submit(
        &["--project", "demo-b", "--gpus", "2", "--resumable"],
        "sleep 600",
    );
    c.wait_state(&free, "running", LONG);
    let funded = c.submit(
        &["--project", "demo-a", "--gpus", "2", "--min-runtime", "1h"],
        "sleep 600",
    );
    let f = c.wait_state(&funded, "running", LONG);
    assert_eq!(f["funded"], true, "{f}");
    let v = c.status(&free);
    assert_eq!(v["state"], "pending", "{v}");
    assert_eq!(v["preemptions"], 1, "{v}");
    // Why this victim: the audit log names the preemptor and the rule.
    let history: Vec<&str> = v["history"]
        .as_array()
        .expect("history")
        .iter()
        .filter_map(|h| h.as_str())
        .collect();
    assert!(
        history
            .iter()
            .any(|h| h.contains(&format!("preempted for workload {funded}"))
                && h.contains("unfunded")),
        "{history:?}"
    );
    assert!(c
        .metrics_text()
        .contains("allot_revocations_total{reason=\"preempted\"} 1"));
    // And why the preemptor started when it did.
    let fh = c.status(&funded)["history"].to_string();
    assert!(fh.contains("the victims it preempted have gone"), "{fh}");
}

#[test]
fn xid_79_drains_the_node_and_the_work_resumes_elsewhere() {
    let c = Cluster::start("xid", TWO_PROJECTS, 2, 2);
    let id = c.submit(
        &[
            "--project",
            "demo-a",
            "--gpus",
            "2",
            "--resumable",
            "--min-runtime",
            "1h",
        ],
        "sleep 600",
    );
    let w = c.wait_state(&id, "running", LONG);
    let (first, i) = Cluster::node_of(&w);
    c.gpu_falls_off(i);
    let moved = wait_for("the work to resume on the other node", LONG, || {
        let w = c.status(&id);
        (w["state"] == "running" && w["node_names"][0] != first.as_str()).then_some(w)
    });
    assert_eq!(
        moved["lease_ids"].as_array().map(Vec::len),
        Some(2),
        "{moved}"
    );
    let nodes = c.json(&["nodes", "--json"]);
    let n = nodes
        .as_array()
        .and_then(|a| a.iter().find(|n| n["name"] == first.as_str()))
        .expect("node")
        .clone();
    assert_ne!(n["state"], "ready", "{n}");
    assert!(
        n["drain_reason"].as_str().unwrap_or("").contains("health"),
        "{n}"
    );
}

#[test]
fn kill_9_of_allotd_loses_nothing_and_touches_no_workload() {
    let mut c = Cluster::start("restart", TWO_PROJECTS, 2, 2);
    let running = c.submit(
        &["--project", "demo-a", "--gpus", "2", "--min-runtime", "1h"],
        "sleep 600",
    );
    let w = c.wait_state(&running, "running", LONG);
    let pending: Vec<String> = (0..3)
        .map(|_| {
            c.submit(
                &[
                    "--project",
                    "demo-b",
                    "--gpus",
                    "2",
                    "--min-runtime",
                    "1h",
                    "--nodes",
                    "2",
                ],
                "sleep 600",
            )
        })
        .collect();
    let (_, i) = Cluster::node_of(&w);
    let before = c.agent_json(i, &["leases", "--all", "--json"]);
    let pid = before[0]["pid"].as_i64().expect("pid");
    c.kill9_server();
    c.start_server();
    let after = c.status(&running);
    assert_eq!(after["state"], "running", "{after}");
    assert_eq!(after["lease_ids"], w["lease_ids"]);
    for id in &pending {
        assert_eq!(c.status(id)["state"], "pending");
    }
    c.wait_connected(2);
    let again = c.agent_json(i, &["leases", "--all", "--json"]);
    assert_eq!(again[0]["pid"].as_i64(), Some(pid));
    assert_eq!(again[0]["state"], "running", "{again}");
    assert!(
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), None).is_ok(),
        "the workload lives"
    );
}

#[test]
fn an_agent_restart_does_not_disturb_its_workloads() {
    let mut c = Cluster::start("agent", TWO_PROJECTS, 1, 2);
    let id = c.submit(
        &["--project", "demo-a", "--gpus", "1", "--min-runtime", "1h"],
        "sleep 600",
    );
    let w = c.wait_state(&id, "running", LONG);
    let pid = c.agent_json(0, &["leases", "--all", "--json"])[0]["pid"]
        .as_i64()
        .expect("pid");
    c.kill9_agent(0);
    c.start_agent(0, 2);
    c.wait_connected(1);
    let l = c.agent_json(0, &["leases", "--all", "--json"]);
    assert_eq!(
        (l[0]["pid"].as_i64(), l[0]["state"].as_str()),
        (Some(pid), Some("running")),
        "{l}"
    );
    let after = c.status(&id);
    assert_eq!(after["lease_ids"], w["lease_ids"], "{after}");
    assert_eq!(after["state"], "running");
}

#[test]
fn bad_requests_get_clear_errors() {
    let c = Cluster::start("errors", TWO_PROJECTS, 1, 2);
    let out = c.allot(&["submit", "--project", "nope", "--", "true"]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("\"nope\"") && err.contains("allot share"),
        "{err}"
    );
    let out = c.allot(&["submit", "--project", "demo-a", "--gpus", "9", "--", "true"]);
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("gpus"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = c.allot(&["status", "abc"]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("not a workload id"));
    let out = c.allot(&[
        "submit",
        "--project",
        "demo-a",
        "--checkpoint",
        "signal:KILL",
        "--",
        "true",
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("checkpoint_hook") && err.contains("SIGKILL"),
        "{err}"
    );
    let out = c.allot(&["budget", "set", "nope", "--weight", "2"]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("nope"));
    // None of it disturbed the agent's stream.
    let m = c.metrics_text();
    assert!(m.contains("allot_agents_connected 1"), "{m}");
}

#[test]
fn a_funded_job_waits_for_the_lapse_then_the_victim_checkpoints_and_resumes_elsewhere() {
    let c = Cluster::start("lapse", TWO_PROJECTS, 3, 2);
    // demo-b fills the three nodes: a victim whose protection lapses in 5 s and that
    // checkpoints on SIGUSR1, a long protected job, and a short one whose node frees.
    let victim = c.submit(
        &[
            "--project",
            "demo-b",
            "--gpus",
            "2",
            "--min-runtime",
            "5s",
            "--resumable",
            "--checkpoint",
            "signal:USR1",
        ],
        r#"trap 'touch "$ALLOT_CHECKPOINT_DIR/checkpoint.done"; kill $P; exit 0' USR1
sleep 600 & P=$!
while :; do wait $P; done"#,
    );
    let v = c.wait_state(&victim, "running", LONG);
    c.submit(
        &["--project", "demo-b", "--gpus", "2", "--min-runtime", "1h"],
        "sleep 600",
    );
    let short = c.submit(
        &["--project", "demo-b", "--gpus", "2", "--min-runtime", "1h"],
        "sleep 12",
    );
    c.wait_state(&short, "running", LONG);
    let (first_node, i) = Cluster::node_of(&v);
    let funded = c.submit(
        &["--project", "demo-a", "--gpus", "2", "--min-runtime", "1h"],
        "sleep 600",
    );
    let f = c.wait_state(&funded, "running", LONG);
    // It waited for the victim's min runtime.
    let lapse = v["start_unix"].as_i64().expect("start") + 5;
    assert!(
        f["start_unix"].as_i64().expect("start") >= lapse,
        "started before the victim's lapse: {f}"
    );
    assert_eq!(f["node_names"][0], first_node.as_str());
    // The victim checkpointed (its marker), was requeued, and resumed on the node the
    // short job left.
    let first_lease = v["lease_ids"][0].as_str().expect("lease");
    assert!(c
        .node_dir(i)
        .join("state/leases")
        .join(first_lease)
        .join("checkpoint/checkpoint.done")
        .exists());
    let resumed = wait_for("the victim to resume elsewhere", LONG, || {
        let w = c.status(&victim);
        (w["state"] == "running" && w["lease_ids"].as_array().map_or(0, Vec::len) == 2).then_some(w)
    });
    assert_ne!(resumed["node_names"][0], first_node.as_str(), "{resumed}");
    assert_eq!(resumed["preemptions"], 1, "{resumed}");
}

#[test]
fn a_silent_node_is_lost_only_after_the_grace_and_its_work_moves() {
    // The host fences 2 s after its last word from allotd (ladder 3 s + 2 s): allotd
    // moves the work once that is known over, 22 s after it last heard the host.
    let mut c = Cluster::prepare("lost", "lost_grace = \"3s\"", TWO_PROJECTS);
    c.agent_extra = "fence_after = \"2s\"\n".into();
    c.start_agents(2, 2);
    let id = c.submit(
        &[
            "--project",
            "demo-a",
            "--gpus",
            "2",
            "--resumable",
            "--min-runtime",
            "1h",
        ],
        "sleep 600",
    );
    let w = c.wait_state(&id, "running", LONG);
    let (first, i) = Cluster::node_of(&w);
    c.kill9_agent(i);
    let killed = std::time::Instant::now();
    // Within the grace nothing moves: a restarting agent must not cost its leases.
    let still = c.status(&id);
    assert_eq!(
        (still["state"].as_str(), still["node_names"][0].as_str()),
        (Some("running"), Some(first.as_str())),
        "{still}"
    );
    let moved = wait_for("the work to move off the lost node", LONG, || {
        let w = c.status(&id);
        (w["state"] == "running" && w["node_names"][0] != first.as_str()).then_some(w)
    });
    assert!(
        killed.elapsed() >= Duration::from_secs(3),
        "moved {:?} after the agent went silent, inside the 3 s grace",
        killed.elapsed()
    );
    assert_eq!(
        moved["lease_ids"].as_array().map(Vec::len),
        Some(2),
        "{moved}"
    );
    let nodes = c.json(&["nodes", "--json"]);
    let n = nodes
        .as_array()
        .and_then(|a| a.iter().find(|n| n["name"] == first.as_str()))
        .expect("node")
        .clone();
    assert_eq!(
        (n["state"].as_str(), n["connected"].as_bool()),
        (Some("down"), Some(false)),
        "{n}"
    );
    // The agent comes back: the node is ready again.
    c.start_agent(i, 2);
    wait_for("the node to be ready again", LONG, || {
        let nodes = c.json(&["nodes", "--json"]);
        nodes
            .as_array()?
            .iter()
            .find(|n| n["name"] == first.as_str() && n["state"] == "ready")
            .map(|_| ())
    });
}

#[test]
fn a_malformed_agent_stream_is_refused_with_the_field() {
    use allot_proto::v1 as pb;
    let c = Cluster::start("stream", TWO_PROJECTS, 1, 2);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("rt");
    let refuse = |first: pb::AgentMessage| -> String {
        rt.block_on(async {
            // As node 0 itself: the fields are checked whoever asks.
            let mut client =
                pb::agent_stream_client::AgentStreamClient::new(c.channel(Some(0)).await);
            let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
            tx.send(first).expect("queue");
            match client
                .session(tokio_stream::wrappers::UnboundedReceiverStream::new(rx))
                .await
            {
                Ok(_) => "accepted".to_string(),
                Err(s) => s.message().to_string(),
            }
        })
    };
    let health_first = refuse(pb::AgentMessage {
        body: Some(pb::agent_message::Body::Health(pb::HealthReport::default())),
    });
    assert!(health_first.contains("must be register"), "{health_first}");
    let no_gpus = refuse(pb::AgentMessage {
        body: Some(pb::agent_message::Body::Register(pb::Register {
            host: Cluster::node_name(0),
            ..Default::default()
        })),
    });
    assert!(no_gpus.contains("register.gpus"), "{no_gpus}");
    let no_host = refuse(pb::AgentMessage {
        body: Some(pb::agent_message::Body::Register(pb::Register::default())),
    });
    assert!(no_host.contains("register.host"), "{no_host}");
    // allotd is unharmed: the real agent is still connected and work still runs.
    let id = c.submit(&["--project", "demo-b", "--gpus", "1"], "true");
    c.wait_state(&id, "completed", LONG);
}

#[test]
fn the_breaker_holds_automatic_drains_past_half_the_nodes() {
    let mut c = Cluster::start("breaker", TWO_PROJECTS, 4, 2);
    // A bad driver push: every node reports XID 79 at once.
    for i in 0..4 {
        c.gpu_falls_off(i);
    }
    let held = wait_for("the breaker to hold the rest", LONG, || {
        let m = c.metrics_text();
        m.lines()
            .find_map(|l| l.strip_prefix("allot_breaker_held_total "))
            .and_then(|v| v.trim().parse::<u64>().ok())
            .filter(|n| *n >= 2)
    });
    let nodes = c.json(&["nodes", "--json"]);
    let drained = nodes
        .as_array()
        .expect("nodes")
        .iter()
        .filter(|n| n["state"] != "ready")
        .count();
    assert_eq!(
        drained, 2,
        "half the nodes drain, the rest are held ({held} held): {nodes}"
    );
    // The hold is real on the held hosts too: their agents defer to allotd and
    // keep serving their healthy GPUs, so work sent there runs.
    let held_nodes: Vec<String> = nodes
        .as_array()
        .expect("nodes")
        .iter()
        .filter(|n| n["state"] == "ready")
        .filter_map(|n| n["name"].as_str().map(str::to_string))
        .collect();
    assert!(nodes
        .as_array()
        .expect("nodes")
        .iter()
        .filter(|n| n["state"] == "ready")
        .all(|n| n["drains"]
            .as_array()
            .is_some_and(|d| d.iter().any(|d| d["held"] == true))));
    let ids: Vec<String> = (0..2)
        .map(|_| c.submit(&["--project", "demo-a", "--gpus", "1"], "sleep 600"))
        .collect();
    for id in &ids {
        let w = c.wait_state(id, "running", LONG);
        let node = w["node_names"][0].as_str().unwrap_or("").to_string();
        assert!(held_nodes.contains(&node), "{w}");
        assert_eq!(
            w["lease_ids"].as_array().map(Vec::len),
            Some(1),
            "never refused: {w}"
        );
    }
    // Operators can still drain by hand.
    let ready = nodes
        .as_array()
        .expect("nodes")
        .iter()
        .find(|n| n["state"] == "ready")
        .expect("a ready node");
    let name = ready["name"].as_str().expect("name");
    let n = c.json(&[
        "nodes",
        "drain",
        name,
        "--reason",
        "confirmed bad",
        "--json",
    ]);
    assert_eq!(n["state"], "draining", "{n}");
    // A hold is allotd's decision: with allotd killed, and after it is back, the held
    // hosts keep holding, and the work on their healthy GPUs runs on.
    let held_index: Vec<usize> = (0..4)
        .filter(|i| held_nodes.contains(&Cluster::node_name(*i)) && Cluster::node_name(*i) != name)
        .collect();
    let host_drain = |c: &Cluster, i: usize, held: bool| {
        let g = c.agent_json(i, &["gpus", "--json"]);
        g["drain"]["drains"]
            .as_array()
            .is_some_and(|d| d.iter().any(|d| d["by"] == "health" && d["held"] == held))
    };
    for &i in &held_index {
        assert!(host_drain(&c, i, true), "the host holds its drain too");
    }
    let pids = c.agent_pids();
    c.kill9_server();
    let stays = "allotd is away: the health drain its circuit breaker held stays held";
    for &i in &held_index {
        wait_for("a held host to see allotd gone", LONG, || {
            let ev = c.agent_json(i, &["events", "--json"]);
            ev.as_array()
                .is_some_and(|e| {
                    e.iter()
                        .any(|e| e["message"].as_str().unwrap_or("").starts_with(stays))
                })
                .then_some(())
        });
        assert!(host_drain(&c, i, true), "still held with allotd away");
    }
    c.start_server();
    c.wait_connected(4);
    c.wait_passes(2);
    for &i in &held_index {
        assert!(host_drain(&c, i, true), "still held with allotd back");
    }
    for ((i, lease), pid) in pids {
        if held_index.contains(&i) {
            let l = c.agent_json(i, &["leases", "--all", "--json"]);
            let live = l.as_array().is_some_and(|a| {
                a.iter().any(|l| {
                    l["id"] == lease.as_str() && l["state"] == "running" && l["pid"] == pid
                })
            });
            assert!(live, "{lease} on node-{i} was touched: {l}");
        }
    }
}

#[test]
fn a_local_drain_is_seen_by_allotd_and_no_work_is_sent_there() {
    let c = Cluster::start("localdrain", TWO_PROJECTS, 2, 2);
    let out = c.agent_allot(0, &["drain", "--reason", "replacing a fan"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let n = wait_for("allotd to see the host's drain", LONG, || {
        let n = c.node_view(0);
        (n["state"] == "draining").then_some(n)
    });
    let d = &n["drains"][0];
    assert_eq!(d["by"], "local-operator", "{n}");
    assert_eq!(d["reason"], "replacing a fan", "{n}");
    // A cluster undrain cannot lift the host operator's drain.
    let out = c.allot(&["nodes", "undrain", &Cluster::node_name(0)]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("allot undrain"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Two 2-GPU jobs: one runs on the other node, the other waits — neither is sent
    // to the drained host and refused.
    let a = c.submit(&["--project", "demo-a", "--gpus", "2"], "sleep 600");
    let b = c.submit(&["--project", "demo-b", "--gpus", "2"], "sleep 600");
    let running = wait_for("one of them to run", LONG, || {
        [&a, &b]
            .into_iter()
            .find(|id| c.status(id)["state"] == "running")
            .cloned()
    });
    let waiting = if running == a { &b } else { &a };
    let w = c.status(waiting);
    assert_eq!(w["state"], "pending", "{w}");
    assert_eq!(w["lease_ids"].as_array().map(Vec::len), Some(0), "{w}");
    // Undrained on the host, the waiting job runs there.
    let out = c.agent_allot(0, &["undrain"]);
    assert!(out.status.success());
    let w = c.wait_state(waiting, "running", LONG);
    assert_eq!(w["node_names"][0], Cluster::node_name(0).as_str(), "{w}");
}

#[test]
fn a_health_drain_is_lifted_by_clearing_the_gpu_not_by_a_cluster_undrain() {
    let c = Cluster::start("clear", TWO_PROJECTS, 2, 2);
    c.gpu_falls_off(0);
    wait_for("the health drain", LONG, || {
        (c.node_view(0)["state"] != "ready").then_some(())
    });
    let out = c.allot(&["nodes", "undrain", &Cluster::node_name(0)]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("health") && err.contains("allot gpus clear"),
        "{err}"
    );
    assert_ne!(c.node_view(0)["state"], "ready");
    // After a reset the operator clears the GPU on the host: the drain lifts
    // everywhere, and the events say who cleared it.
    let out = c.agent_allot(0, &["gpus", "clear", "0", "--reason", "nvidia-smi -r"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    wait_for("allotd to see the node ready", LONG, || {
        (c.node_view(0)["state"] == "ready").then_some(())
    });
    let ev = c.agent_json(0, &["events", "--json"]);
    assert!(
        ev.as_array().is_some_and(|e| e
            .iter()
            .any(|e| e["message"].as_str().unwrap_or("").contains("cleared by"))),
        "{ev}"
    );
}

#[test]
fn a_refused_start_requeues_the_work_without_a_hot_loop() {
    let c = Cluster::start("refused", TWO_PROJECTS, 1, 2);
    // A local lease takes the GPUs behind allotd's back: the host refuses.
    let out = c.agent_allot(
        0,
        &[
            "lease", "start", "--gpus", "2", "--json", "--", "sleep", "600",
        ],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let local: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    let lid = local["id"].as_str().expect("lease id").to_string();
    // allotd has the host's report of it before any work is sent there.
    wait_for("allotd to see the local lease", LONG, || {
        c.node_view(0)["gpu_list"]
            .as_array()
            .is_some_and(|g| g.iter().any(|g| g["lease_id"] == lid.as_str()))
            .then_some(())
    });
    let id = c.submit(&["--project", "demo-a", "--gpus", "2"], "sleep 600");
    let w = wait_for("the refusal to reach allotd", LONG, || {
        let w = c.status(&id);
        (w["lease_ids"].as_array().map_or(0, Vec::len) >= 1 && w["state"] == "pending").then_some(w)
    });
    assert!(
        w["history"].as_array().is_some_and(|h| h
            .iter()
            .any(|h| h.as_str().unwrap_or("").contains("refused"))),
        "{w}"
    );
    // Not offered to that node again while nothing changed there, however many
    // passes run (the test cluster runs one a second at least).
    c.wait_passes(3);
    let w = c.status(&id);
    assert_eq!(w["lease_ids"].as_array().map(Vec::len), Some(1), "{w}");
    assert_eq!(w["state"], "pending", "{w}");
    // The local lease ends: the host changed, and the work runs.
    let out = c.agent_allot(0, &["lease", "revoke", &lid, "--now"]);
    assert!(out.status.success());
    let w = c.wait_state(&id, "running", LONG);
    assert_eq!(w["lease_ids"].as_array().map(Vec::len), Some(2), "{w}");
}

#[test]
fn preempted_work_that_cannot_resume_runs_again_from_the_start() {
    let c = Cluster::start("requeue", TWO_PROJECTS, 1, 2);
    let free = c.submit(&["--project", "demo-b", "--gpus", "2"], "sleep 600");
    c.wait_state(&free, "running", LONG);
    // It runs until the test has looked.
    let go = c.dir.join("funded-may-end");
    let funded = c.submit(
        &["--project", "demo-a", "--gpus", "2", "--min-runtime", "1h"],
        &format!("while [ ! -e {go:?} ]; do sleep 0.1; done"),
    );
    c.wait_state(&funded, "running", LONG);
    let v = c.status(&free);
    assert_eq!(v["state"], "pending", "{v}");
    assert_eq!(v["preemptions"], 1, "{v}");
    std::fs::write(&go, "").expect("go");
    // When the funded work is done it runs again (from the beginning).
    let v = c.wait_state(&free, "running", LONG);
    assert_eq!(v["lease_ids"].as_array().map(Vec::len), Some(2), "{v}");
    // With --no-requeue it ends preempted instead, and says so.
    let once = c.submit(
        &["--project", "demo-b", "--gpus", "2", "--no-requeue"],
        "sleep 600",
    );
    let _ = c.allot(&["cancel", &free]);
    c.wait_state(&once, "running", LONG);
    let funded = c.submit(
        &["--project", "demo-a", "--gpus", "2", "--min-runtime", "1h"],
        "sleep 600",
    );
    c.wait_state(&funded, "running", LONG);
    let o = c.wait_state(&once, "preempted", LONG);
    assert_eq!(o["preemptions"], 1, "{o}");
}
