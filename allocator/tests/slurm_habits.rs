//! What Slurm users reach for every week, through the `allot` CLI against allotd
//! and real agents running real processes: an array under its limit (the jobs
//! themselves count how many run at once), `--afterok` after a success and after a
//! failure, hold / release / requeue / update with the owner's limits, the
//! gates surviving an allotd restart, and history and usage equal to what the runs
//! did, past keep_finished and across a restart.

mod support;

use std::time::Duration;
use support::{wait_for, Cluster};

const LONG: Duration = Duration::from_secs(120);

const ORG: &str = "[[group]]\nname = \"demo-a\"\nweight = 1\nmembers = [\"allot-test-a\"]\n[[group]]\nname = \"demo-b\"\nweight = 1\n";

fn queue_all(c: &Cluster) -> Vec<serde_json::Value> {
    c.json(&["queue", "--all", "--json"])
        .as_array()
        .cloned()
        .unwrap_or_default()
}

fn ok(out: &std::process::Output) -> String {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).to_string()
}

#[test]
fn an_array_of_20_runs_at_most_4_at_once_and_all_complete() {
    // Two hosts of 4 GPUs: room for 8, the array may run 4.
    let c = Cluster::start("habits-array", ORG, 2, 4);
    let dir = c.dir.join("array");
    std::fs::create_dir_all(dir.join("live")).expect("dir");
    // Each element marks itself live, counts the live ones, and leaves.
    let script = format!(
        "cd {d}; touch live/$ALLOT_ARRAY_INDEX; ls live | wc -l > count.$ALLOT_ARRAY_INDEX; echo $ALLOT_ARRAY_ID > array.$ALLOT_ARRAY_INDEX; sleep 1.5; rm live/$ALLOT_ARRAY_INDEX",
        d = dir.display()
    );
    let v = c.json(&[
        "submit",
        "--json",
        "--project",
        "demo-a",
        "--array",
        "0-19%4",
        "--name",
        "sweep",
        "--",
        "sh",
        "-c",
        &script,
    ]);
    let array = v["id"].as_str().expect("id").to_string();
    // The queue folds the pending elements into one line.
    let text = ok(&c.allot(&["queue"]));
    assert!(
        text.contains(&format!("{array}_[")) || text.contains("pending:"),
        "{text}"
    );
    wait_for("all 20 elements to complete", LONG, || {
        let q = queue_all(&c);
        let done = q
            .iter()
            .filter(|w| w["array_id"] == array.as_str() && w["state"] == "completed")
            .count();
        (done == 20).then_some(())
    });
    let counts: Vec<u32> = (0..20)
        .map(|i| {
            let p = dir.join(format!("count.{i}"));
            let text = std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{p:?}: {e}"));
            text.trim().parse().expect("a count")
        })
        .collect();
    assert!(
        counts.iter().all(|n| *n <= 4),
        "never more than 4 live at once: {counts:?}"
    );
    assert!(
        counts.iter().any(|n| *n > 1),
        "elements ran side by side: {counts:?}"
    );
    let ids = std::fs::read_to_string(dir.join("array.19")).expect("array id");
    assert_eq!(ids.trim(), array);
    // Every element is a workload of its own, with its index.
    let w = c.json(&["status", &format!("{array}_7"), "--json"]);
    assert_eq!(w["array_index"], 7);
}

#[test]
fn afterok_runs_after_a_success_and_ends_with_the_reason_after_a_failure() {
    let c = Cluster::start("habits-deps", ORG, 1, 2);
    let first = c.submit(&["--project", "demo-a"], "sleep 0.5; exit 0");
    let second = c.submit(&["--project", "demo-a", "--afterok", &first], "exit 0");
    let failing = c.submit(&["--project", "demo-a"], "exit 3");
    let never = c.submit(
        &[
            "--project",
            "demo-a",
            "--dependency",
            &format!("afterok:{failing}"),
        ],
        "exit 0",
    );
    let w = c.status(&second);
    if w["state"] == "pending" {
        assert_eq!(w["gate"], "dependency", "{w}");
    }
    let done = c.wait_state(&second, "completed", LONG);
    let first_w = c.wait_state(&first, "completed", LONG);
    assert!(
        done["start_unix"].as_i64() >= first_w["end_unix"].as_i64(),
        "{done} started before {first_w} ended"
    );
    let w = c.wait_state(&never, "cancelled", LONG);
    assert_eq!(w["end_reason"], "dependency-never-satisfied", "{w}");
    let history = w["history"].to_string();
    assert!(
        history.contains(&format!(
            "afterok:{failing}: workload {failing} ended failed"
        )),
        "{history}"
    );
}

#[test]
fn hold_release_requeue_and_update_with_the_owners_limits_across_a_restart() {
    let mut c = Cluster::start("habits-hold", ORG, 1, 1);
    let alice = ok(&c.allotd(&["tokens", "create", "--user", "allot-test-a"]))
        .trim()
        .to_string();
    let as_alice = |c: &Cluster, args: &[&str]| {
        c.allot_command(args)
            .env("ALLOT_TOKEN", &alice)
            .output()
            .expect("allot runs")
    };
    let v: serde_json::Value = serde_json::from_str(&ok(&as_alice(
        &c,
        &[
            "submit",
            "--json",
            "--hold",
            "--time-limit",
            "1h",
            "--",
            "sleep",
            "300",
        ],
    )))
    .expect("json");
    let id = v["id"].as_str().expect("id").to_string();
    assert_eq!(c.status(&id)["gate"], "held");
    // The owner may shorten, not lengthen; the refusal names the right.
    ok(&as_alice(&c, &["update", &id, "--time-limit", "30m"]));
    assert_eq!(c.status(&id)["time_limit_s"], 1800);
    let out = as_alice(&c, &["update", &id, "--time-limit", "2h"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("only an operator"), "{err}");
    // Held through a restart.
    c.kill9_server();
    c.start_server();
    c.wait_connected(1);
    assert_eq!(c.status(&id)["gate"], "held");
    ok(&as_alice(&c, &["release", &id]));
    wait_for("the released workload to run", LONG, || {
        let w = c.status(&id);
        (w["state"] == "running").then_some(())
    });
    // Requeue with a hold: back in the queue, held, its run ended by the requeue.
    ok(&as_alice(&c, &["requeue", "--hold", &id]));
    let w = wait_for("the requeued workload to wait held", LONG, || {
        let w = c.status(&id);
        (w["state"] == "pending" && w["gate"] == "held").then_some(w)
    });
    assert_eq!(w["runs"].as_array().map(Vec::len), Some(1), "{w}");
    assert!(w["history"]
        .to_string()
        .contains("requeue asked by allot-test-a"));
    let out = c.allot(&["cancel", &id]);
    assert!(
        out.status.success(),
        "{}: {}",
        String::from_utf8_lossy(&out.stderr),
        c.status(&id)
    );
    // Someone else's work is not theirs to hold.
    let other = c.submit(&["--project", "demo-b", "--hold"], "exit 0");
    let out = as_alice(&c, &["release", &other]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("only its owner, an operator"), "{err}");
}

/// GPU-seconds of a workload's runs as `allot status` has them (its lease records).
fn run_gpu_secs(w: &serde_json::Value) -> i64 {
    w["runs"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|r| {
            r["gpus"].as_i64().unwrap_or(0)
                * (r["end_unix"].as_i64().unwrap_or(0) - r["start_unix"].as_i64().unwrap_or(0))
        })
        .sum()
}

#[test]
fn history_and_usage_equal_what_the_runs_did_across_a_restart_and_past_keep_finished() {
    let mut c = Cluster::start_with("habits-history", "keep_finished = \"1s\"", ORG, 1, 4);
    let ok_id = c.submit(
        &["--project", "demo-a", "--gpus", "2", "-J", "good"],
        "sleep 2",
    );
    let bad = c.submit(&["--project", "demo-a", "--gpus", "1"], "sleep 1; exit 3");
    let never = c.submit(&["--project", "demo-b", "--hold"], "true");
    ok(&c.allot(&["cancel", &never]));
    let done = c.wait_state(&ok_id, "completed", LONG);
    let failed = c.wait_state(&bad, "failed", LONG);
    let want = run_gpu_secs(&done) + run_gpu_secs(&failed);
    assert!(want >= 5, "{want}");
    // Past keep_finished: the stop's snapshot retires them from memory.
    std::thread::sleep(Duration::from_millis(2_100));
    let (_, status) = c.term_server();
    assert!(status.success());
    c.start_server();
    assert!(queue_all(&c).is_empty(), "nothing ended is in memory");
    let runs = c.json(&["history", "--since", "1h", "--json"]);
    let runs = runs.as_array().expect("runs");
    let find = |id: &str| {
        runs.iter()
            .find(|r| r["workload_id"] == id)
            .unwrap_or_else(|| panic!("{id} in {runs:?}"))
            .clone()
    };
    let good = find(&ok_id);
    assert_eq!(
        (good["state"].as_str(), good["gpus"].as_i64()),
        (Some("completed"), Some(2))
    );
    assert_eq!(good["name"], "good");
    let f = find(&bad);
    assert_eq!(
        (f["state"].as_str(), f["exit_code"].as_i64()),
        (Some("failed"), Some(3))
    );
    let n = find(&never);
    assert_eq!(
        (n["state"].as_str(), n["run"].as_i64()),
        (Some("cancelled"), Some(0))
    );
    let history_secs: f64 = runs
        .iter()
        .map(|r| r["gpu_hours"].as_f64().unwrap_or(0.0) * 3600.0)
        .sum();
    assert!(
        (history_secs - want as f64).abs() < 0.5,
        "{history_secs} vs {want}"
    );
    // Usage sums the same, by project; demo-b received nothing.
    let usage = c.json(&["usage", "--since", "1h", "--json"]);
    let rows = usage.as_array().expect("rows");
    let a: f64 = rows
        .iter()
        .filter(|r| r["key"] == "demo-a")
        .map(|r| r["gpu_hours"].as_f64().unwrap_or(0.0) * 3600.0)
        .sum();
    assert!((a - want as f64).abs() < 0.5, "{a} vs {want}: {rows:?}");
    assert!(rows.iter().all(|r| r["key"] != "demo-b"), "{rows:?}");
    let by_user = ok(&c.allot(&[
        "usage", "--since", "1h", "--by", "user", "--per", "day", "--csv",
    ]));
    assert!(by_user.starts_with("period,user,gpu_hours,"), "{by_user}");
    // The counter Prometheus scrapes says the same, and survived the restart.
    let metrics = c.metrics_text();
    let counted: i64 = metrics
        .lines()
        .filter(|l| l.starts_with("allot_gpu_seconds_total{project=\"demo-a\""))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<i64>().ok())
        .sum();
    assert_eq!(counted, want, "{metrics}");
    // The state filter and the CSV.
    let only = c.json(&["history", "--since", "1h", "--state", "failed", "--json"]);
    assert_eq!(only.as_array().map(Vec::len), Some(1), "{only}");
    let csv = ok(&c.allot(&["history", "--since", "1h", "--csv"]));
    assert!(csv.starts_with("id,run,name,user,project,gpus,"), "{csv}");
    assert_eq!(csv.lines().count(), 4, "{csv}");
    // A user sees their own runs only, and is told so when asking for another's.
    let token = ok(&c.allotd(&["tokens", "create", "--user", "allot-test-a"]));
    let as_user = |args: &[&str]| {
        c.allot_command(args)
            .env("ALLOT_TOKEN", token.trim())
            .output()
            .expect("allot runs")
    };
    let mine: serde_json::Value =
        serde_json::from_str(&ok(&as_user(&["history", "--since", "1h", "--json"]))).expect("json");
    assert_eq!(mine.as_array().map(Vec::len), Some(0), "{mine}");
    let out = as_user(&["history", "--user", "root"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("may not see the runs of root"), "{err}");
    let theirs: serde_json::Value =
        serde_json::from_str(&ok(&as_user(&["usage", "--since", "1h", "--json"]))).expect("json");
    assert_eq!(theirs.as_array().map(Vec::len), Some(0), "{theirs}");
}

#[test]
fn a_gpu_type_lands_only_on_such_nodes_and_a_type_nobody_has_is_refused() {
    let mut c = Cluster::start("habits-types", ORG, 0, 2);
    // node-0 says it is a B200 host; node-1's type comes from its GPUs' model (the
    // fake GPUs are "Fake H100 80GB HBM3") and it has NVLink.
    for (i, extra) in [
        (0, "gpu_type = \"b200\"\n"),
        (1, "features = [\"nvlink\"]\n"),
    ] {
        c.agents.push(None);
        c.agent_extra = extra.to_string();
        c.start_agent(i, 2);
    }
    c.wait_connected(2);
    let nodes = c.json(&["nodes", "--json"]);
    let type_of = |name: &str| {
        nodes
            .as_array()
            .into_iter()
            .flatten()
            .find(|n| n["name"] == name)
            .map(|n| (n["gpu_type"].clone(), n["features"].clone()))
    };
    assert_eq!(
        type_of("node-0"),
        Some((serde_json::json!("b200"), serde_json::json!([])))
    );
    assert_eq!(
        type_of("node-1"),
        Some((serde_json::json!("h100"), serde_json::json!(["nvlink"])))
    );
    // Four one-GPU jobs that ask for an H100: node-1 holds two at a time, and
    // node-0's free B200s are never used.
    let ids: Vec<String> = (0..4)
        .map(|_| c.submit(&["--project", "demo-a", "--gpu-type", "h100"], "sleep 1"))
        .collect();
    for id in &ids {
        let w = c.wait_state(id, "completed", LONG);
        let nodes: Vec<&str> = w["runs"]
            .as_array()
            .into_iter()
            .flatten()
            .flat_map(|r| r["nodes"].as_array().into_iter().flatten())
            .filter_map(|n| n.as_str())
            .collect();
        assert_eq!(nodes, ["node-1"], "{w}");
    }
    let any = c.submit(
        &[
            "--project",
            "demo-a",
            "--gpu-type",
            "b200,h100",
            "-C",
            "nvlink",
        ],
        "true",
    );
    c.wait_state(&any, "completed", LONG);
    // Slurm's node lists: --exclude keeps a job off a node, --nodelist (a host list
    // as Slurm writes it) keeps it on the ones named.
    let nodes_of = |id: &str| {
        let w = c.wait_state(id, "completed", LONG);
        let nodes: Vec<String> = w["runs"]
            .as_array()
            .into_iter()
            .flatten()
            .flat_map(|r| r["nodes"].as_array().into_iter().flatten())
            .filter_map(|n| n.as_str().map(String::from))
            .collect();
        nodes
    };
    let off = c.submit(&["--project", "demo-a", "--exclude", "node-1"], "true");
    assert_eq!(nodes_of(&off), ["node-0"]);
    let on = c.submit(
        &["--project", "demo-a", "-w", "node-[0-1]", "-x", "node-0"],
        "true",
    );
    assert_eq!(nodes_of(&on), ["node-1"]);
    // Shapes no node could ever hold are refused at submit, with the reason.
    for (flags, words) in [
        (
            vec!["--gpu-type", "b300"],
            "gpu_types: no node has GPU type \"b300\"; this cluster has b200, h100",
        ),
        (
            vec!["--gpu-type", "b200", "--constraint", "nvlink"],
            "no node has GPU type b200, features nvlink together",
        ),
        (
            vec!["-C", "ib"],
            "no node has feature \"ib\"; nodes have nvlink",
        ),
        (
            vec!["--cluster", "nope"],
            "no cluster \"nope\"; there are test",
        ),
        (
            vec!["--gpu-type", "h100", "--gpus", "3"],
            "the largest node has 2",
        ),
        (
            vec!["--nodelist", "node-7"],
            "nodelist: no node is named \"node-7\"",
        ),
        (
            vec!["--gpu-type", "b200", "-w", "node-1"],
            "no node has GPU type b200, a name in node-1 together",
        ),
    ] {
        let mut args = vec!["submit", "--project", "demo-a"];
        args.extend(flags.iter().copied());
        args.extend(["--", "true"]);
        let out = c.allot(&args);
        assert!(!out.status.success(), "{flags:?} was accepted");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(words), "{flags:?}: {err}");
    }
}

#[test]
fn a_batch_script_runs_with_its_allot_and_sbatch_lines_and_the_command_line_wins() {
    let c = Cluster::start("habits-script", ORG, 1, 2);
    let dir = c.dir.join("scripted");
    std::fs::create_dir_all(&dir).expect("dir");
    let script = dir.join("job.sh");
    std::fs::write(
        &script,
        "#!/bin/sh\n#ALLOT --gpus 2 --project demo-a\n#SBATCH -J scripted\n#SBATCH --time=10\n\n# the work\necho \"name=$ALLOT_JOB_NAME gpus=$CUDA_VISIBLE_DEVICES args=$*\" > result.txt\n#SBATCH --partition=ignored-after-the-first-command\n",
    )
    .expect("script");
    let run = |extra: &[&str]| {
        let mut args = vec!["submit", "--json", "--chdir", dir.to_str().expect("utf-8")];
        args.push(script.to_str().expect("utf-8"));
        args.extend_from_slice(extra);
        let v = c.json(&args);
        v["id"].as_str().expect("id").to_string()
    };
    let id = run(&["--", "a", "b c"]);
    let w = c.wait_state(&id, "completed", LONG);
    assert_eq!(w["name"], "scripted", "{w}");
    assert_eq!(w["time_limit_s"], 600, "#SBATCH --time=10 is minutes");
    assert_eq!(w["gpus_per_node"], 2);
    let out = std::fs::read_to_string(dir.join("result.txt")).expect("the script ran");
    assert!(out.starts_with("name=scripted gpus="), "{out}");
    assert!(out.trim_end().ends_with("args=a b c"), "{out}");
    assert_eq!(
        out.split("gpus=")
            .nth(1)
            .map(|g| g.split(' ').next().unwrap_or("").split(',').count()),
        Some(2),
        "{out}"
    );
    // The command line wins over the directives.
    let id = run(&["--gpus", "1", "-J", "mine"]);
    let w = c.wait_state(&id, "completed", LONG);
    assert_eq!(
        (w["gpus_per_node"].as_i64(), w["name"].as_str()),
        (Some(1), Some("mine"))
    );
    // A #SBATCH flag allot does not share is named, before anything is sent.
    std::fs::write(&script, "#!/bin/sh\n#SBATCH --partition=gpu -J x\ntrue\n").expect("script");
    let out = c.allot(&[
        "submit",
        "--project",
        "demo-a",
        script.to_str().expect("utf-8"),
    ]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("#SBATCH flags allot does not understand: --partition"),
        "{err}"
    );
}

/// A webhook receiver on 127.0.0.1: each POST's JSON body, as it arrives.
fn receiver() -> (String, std::sync::mpsc::Receiver<serde_json::Value>) {
    use std::io::{BufRead, BufReader, Read, Write};
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let url = format!("http://{}/hook", l.local_addr().expect("addr"));
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for conn in l.incoming().flatten() {
            let mut r = BufReader::new(conn);
            let mut len = 0usize;
            loop {
                let mut line = String::new();
                if r.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
                    break;
                }
                if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                    len = v.trim().parse().unwrap_or(0);
                }
            }
            let mut body = vec![0; len];
            if r.read_exact(&mut body).is_err() {
                continue;
            }
            let _ = r
                .get_mut()
                .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\nconnection: close\r\n\r\n");
            if let Ok(v) = serde_json::from_slice(&body) {
                let _ = tx.send(v);
            }
        }
    });
    (url, rx)
}

#[test]
fn a_webhook_gets_end_and_fail_notices_and_a_dead_receiver_delays_nothing() {
    let (url, got) = receiver();
    // A port nothing listens on: the project's receiver is dead.
    let dead = format!("http://127.0.0.1:{}/hook", allot_test_support::free_port());
    let me = allot_test_support::current_user();
    let org = format!(
        "{ORG}[notify]\nattempts = 3\ntimeout = \"2s\"\nwebhooks = [{{ user = {me:?}, url = {url:?} }}, {{ project = \"demo-b\", url = {dead:?} }}]\n"
    );
    let c = Cluster::start("habits-notify", &org, 1, 2);
    let good = c.submit(&["--project", "demo-a", "--notify", "end,fail"], "exit 0");
    let bad = c.submit(
        &["--project", "demo-b", "--notify", "all", "-J", "oops"],
        "exit 3",
    );
    let quiet = c.submit(&["--project", "demo-a"], "exit 0");
    let mut notices = Vec::new();
    while notices.len() < 2 {
        let n = got
            .recv_timeout(LONG)
            .expect("a notice within the deadline");
        notices.push(n);
    }
    let of = |id: &str| {
        notices
            .iter()
            .find(|n| n["workload"].as_u64().map(|w| w.to_string()).as_deref() == Some(id))
            .cloned()
            .unwrap_or_else(|| panic!("{id} in {notices:?}"))
    };
    let g = of(&good);
    assert_eq!(
        (g["events"].clone(), g["state"].clone()),
        (serde_json::json!(["end"]), serde_json::json!("completed"))
    );
    let b = of(&bad);
    assert_eq!(b["events"], serde_json::json!(["end", "fail"]), "{b}");
    assert_eq!(
        (b["exit_code"].as_i64(), b["name"].as_str()),
        (Some(3), Some("oops"))
    );
    c.wait_state(&quiet, "completed", LONG);
    // While the dead receiver is retried, work goes on at once.
    let t0 = std::time::Instant::now();
    let next = c.submit(&["--project", "demo-a"], "exit 0");
    c.wait_state(&next, "completed", LONG);
    assert!(t0.elapsed() < Duration::from_secs(20), "{:?}", t0.elapsed());
    wait_for("the dead receiver's delivery to be given up", LONG, || {
        c.metrics_text()
            .contains("allot_notifications_total{result=\"failed\"} 1")
            .then_some(())
    });
    // Delivered: the two that asked, nothing for the work that did not, whose ends
    // came before the dead receiver was given up.
    let m = c.metrics_text();
    assert!(
        m.contains("allot_notifications_total{result=\"sent\"} 2"),
        "{m}"
    );
    assert!(got.try_recv().is_err(), "no third notice");
}

#[test]
fn a_batch_scripts_start_is_refused_on_an_agent_too_old_to_run_it_and_runs_once_upgraded() {
    use allot_proto::v1 as pb;
    // node-0 enrolled and known, its agent then gone.
    let mut c = Cluster::start("habits-old-agent", ORG, 1, 1);
    if let Some(mut a) = c.agents[0].take() {
        a.kill().expect("kill the agent");
        a.wait().expect("reap it");
    }
    let dir = c.dir.join("old-agent");
    std::fs::create_dir_all(&dir).expect("dir");
    let script = dir.join("job.sh");
    std::fs::write(
        &script,
        "#!/bin/sh\n#ALLOT --project demo-a\necho ran > ran.txt\n",
    )
    .expect("script");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    // An agent of protocol 3 (before scripts): a session of node-0's own.
    let (tx, mut inbox) = rt.block_on(async {
        let mut s = pb::agent_stream_client::AgentStreamClient::new(c.channel(Some(0)).await);
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        tx.send(pb::AgentMessage {
            body: Some(pb::agent_message::Body::Register(pb::Register {
                host: Cluster::node_name(0),
                gpus: vec![pb::Gpu {
                    index: 0,
                    uuid: "GPU-old-0".into(),
                    ..Default::default()
                }],
                protocol: 3,
                ..Default::default()
            })),
        })
        .expect("queue");
        let inbox = s
            .session(tokio_stream::wrappers::UnboundedReceiverStream::new(rx))
            .await
            .expect("session")
            .into_inner();
        (tx, inbox)
    });
    c.wait_connected(1);
    let v = c.json(&[
        "submit",
        "--json",
        "--chdir",
        dir.to_str().expect("utf-8"),
        script.to_str().expect("utf-8"),
    ]);
    let id = v["id"].as_str().expect("id").to_string();
    let refused = wait_for("the refusal in its history", LONG, || {
        let w = c.status(&id);
        w["history"]
            .to_string()
            .contains("too old to run a batch script")
            .then_some(w)
    });
    assert_eq!(refused["state"], "pending", "{refused}");
    // The old agent was never told to start it.
    rt.block_on(async {
        while let Ok(Some(Ok(m))) = tokio::time::timeout(
            Duration::from_millis(200),
            tokio_stream::StreamExt::next(&mut inbox),
        )
        .await
        {
            assert!(
                !matches!(m.body, Some(pb::allocator_message::Body::Start(_))),
                "a start reached the old agent: {m:?}"
            );
        }
    });
    drop(tx);
    // The upgraded agent registers again: the script runs there.
    c.start_agent(0, 1);
    c.wait_state(&id, "completed", LONG);
    let out = std::fs::read_to_string(dir.join("ran.txt")).expect("the script ran");
    assert_eq!(out.trim(), "ran");
}
