//! End to end: the real agent binary on fake GPUs, real workloads (sh) receiving real
//! signals, driven through the real `allot` CLI over the unix socket.

mod support;

use std::time::Duration;
use support::{stamp_ms, wait_for, TestAgent};

const LONG: Duration = Duration::from_secs(30);

/// A workload that checkpoints on SIGUSR1: records when the signal came, writes the
/// marker, ends its child and exits.
const CHECKPOINTS_ON_USR1: &str = r#"trap 'date +%s%N > "$ALLOT_CHECKPOINT_DIR/got-usr1"; touch "$ALLOT_CHECKPOINT_DIR/checkpoint.done"; kill $P; exit 0' USR1
sleep 600 & P=$!
while :; do wait $P; done"#;

fn id(l: &serde_json::Value) -> String {
    l["id"].as_str().expect("lease id").to_string()
}

#[test]
fn checkpoint_signal_waits_for_the_min_runtime_lapse() {
    let a = TestAgent::start("lapse", "");
    let l = a.lease_start(
        &[
            "--gpus",
            "2",
            "--min-runtime",
            "3s",
            "--checkpoint",
            "signal:USR1",
        ],
        CHECKPOINTS_ON_USR1,
    );
    let lid = id(&l);
    assert_eq!(l["gpu_uuids"].as_array().map(Vec::len), Some(2));
    let lapse = l["start_unix_ms"].as_i64().expect("start") + 3_000;
    let r = a.json(&["lease", "revoke", &lid, "--json"]);
    assert_eq!(r["state"], "revoking", "{r}");
    // Protected: nothing has reached the workload yet.
    assert!(!a.checkpoint_dir(&lid).join("got-usr1").exists());
    let ended = a.wait_ended(&lid, LONG);
    let got = stamp_ms(&a.checkpoint_dir(&lid).join("got-usr1")).expect("the workload got SIGUSR1");
    assert!(got >= lapse, "signal {}ms before the lapse", lapse - got);
    // The agent wakes at the lapse itself; the bound is slack for a loaded machine.
    assert!(got < lapse + 2_000, "signal {}ms late", got - lapse);
    assert_eq!(ended["ended_by"], "checkpoint", "{ended}");
    assert_eq!(ended["end_reason"], "revoked", "{ended}");
    // Its GPUs are free again, and the log has the contract's story.
    let gpus = a.json(&["gpus", "--json"]);
    // What the agent will report to the allocator: the host's CPUs and memory too.
    assert!(
        gpus["cpus"].as_u64().unwrap_or(0) >= 1 && gpus["memory_bytes"].as_u64().unwrap_or(0) > 0,
        "{gpus}"
    );
    assert!(
        gpus["gpus"]
            .as_array()
            .expect("gpus")
            .iter()
            .all(|g| g["lease_id"] == ""),
        "{gpus}"
    );
    let ev = a.events();
    assert!(
        ev.iter().any(|e| e["lease_id"] == lid.as_str()
            && e["message"]
                .as_str()
                .unwrap_or("")
                .contains("ended by checkpoint")),
        "{ev:?}"
    );
}

#[test]
fn a_workload_that_ignores_everything_climbs_to_sigkill() {
    let a = TestAgent::start("kill", "");
    let l = a.lease_start(
        &[
            "--gpus",
            "1",
            "--grace",
            "1s",
            "--checkpoint",
            "signal:USR1",
        ],
        r#"trap '' USR1 TERM; touch "$ALLOT_CHECKPOINT_DIR/ready"; while :; do sleep 1; done"#,
    );
    let lid = id(&l);
    a.wait_ready(&lid);
    a.json(&["lease", "revoke", &lid, "--now", "--json"]);
    let ended = a.wait_ended(&lid, LONG);
    assert_eq!(ended["ended_by"], "kill", "{ended}");
    let rungs: Vec<&str> = ended["steps"]
        .as_array()
        .expect("steps")
        .iter()
        .filter_map(|s| s["rung"].as_str())
        .collect();
    assert_eq!(rungs, ["checkpoint", "term", "kill"], "{ended}");
    let pid = ended["pid"].as_i64().expect("pid") as i32;
    assert!(
        !allot_checkpoint_hooks::group_alive(pid),
        "the whole group is gone"
    );
}

#[test]
fn exec_and_http_hooks_reach_the_workload() {
    use std::io::{BufRead, BufReader, Read, Write};
    let a = TestAgent::start("hooks", "");
    // exec: a command run with the lease's environment.
    let hook_out = a.dir.join("hook-ran");
    let script = a.dir.join("hook.sh");
    std::fs::write(
        &script,
        format!("echo \"$ALLOT_LEASE_ID\" > {:?}\n", hook_out),
    )
    .expect("hook script");
    let spec = format!("exec:/bin/sh {}", script.display());
    let l = a.lease_start(&["--gpus", "1", "--checkpoint", &spec], "sleep 600");
    let lid = id(&l);
    a.json(&["lease", "revoke", &lid, "--now", "--json"]);
    let ended = a.wait_ended(&lid, LONG);
    assert_eq!(
        std::fs::read_to_string(&hook_out)
            .expect("the hook ran")
            .trim(),
        lid
    );
    assert_eq!(ended["steps"][0]["rung"], "checkpoint", "{ended}");

    // http: a POST with a JSON body naming the lease; 200 means done.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().expect("addr").port();
    let server = std::thread::spawn(move || {
        let (mut s, _) = listener.accept().expect("the agent calls");
        let mut r = BufReader::new(s.try_clone().expect("clone"));
        let mut head = String::new();
        let mut len = 0usize;
        loop {
            let mut line = String::new();
            r.read_line(&mut line).expect("header");
            if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                len = v.trim().parse().unwrap_or(0);
            }
            if line == "\r\n" || line.is_empty() {
                break;
            }
            head.push_str(&line);
        }
        let mut body = vec![0; len];
        r.read_exact(&mut body).expect("body");
        s.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n")
            .expect("reply");
        (head, String::from_utf8_lossy(&body).to_string())
    });
    let spec = format!("http://127.0.0.1:{port}/checkpoint");
    let l = a.lease_start(&["--gpus", "1", "--checkpoint", &spec], "sleep 600");
    let lid = id(&l);
    a.json(&["lease", "revoke", &lid, "--now", "--json"]);
    let ended = a.wait_ended(&lid, LONG);
    let (head, body) = server.join().expect("server");
    assert!(head.starts_with("POST /checkpoint"), "{head}");
    assert!(body.contains(&lid), "{body}");
    assert_eq!(ended["steps"][0]["rung"], "checkpoint", "{ended}");
}

#[test]
fn xid_79_ends_the_lost_gpus_lease_at_once_and_drains_the_rest() {
    let a = TestAgent::start("xid", "");
    let first = a.lease_start(
        &[
            "--gpus",
            "2",
            "--min-runtime",
            "1h",
            "--checkpoint",
            "signal:USR1",
        ],
        CHECKPOINTS_ON_USR1,
    );
    let second = a.lease_start(
        &[
            "--gpus",
            "2",
            "--min-runtime",
            "1h",
            "--checkpoint",
            "signal:USR1",
        ],
        CHECKPOINTS_ON_USR1,
    );
    let gpus = a.json(&["gpus", "--json"]);
    let lost = gpus["gpus"]
        .as_array()
        .expect("gpus")
        .iter()
        .find(|g| g["lease_id"] == second["id"])
        .expect("the second lease's GPU")
        .clone();
    let pci = lost["pci"].as_str().expect("pci");
    a.kernel_log(&format!(
        "[12345.678] NVRM: Xid (PCI:{pci}): 79, pid=1234, name=python, GPU has fallen off the bus."
    ));
    let ended = a.wait_ended(&id(&second), LONG);
    assert_eq!(ended["end_reason"], "gpu-lost", "{ended}");
    let pid = ended["pid"].as_i64().expect("pid") as i32;
    wait_for("the killed workload to vanish", LONG, || {
        (!allot_checkpoint_hooks::group_alive(pid)).then_some(())
    });
    // The other lease keeps its protection: revoked for the lapse, still running.
    let f = wait_for("the healthy lease to be revoked", LONG, || {
        let f = a.lease(&id(&first));
        (f["state"] == "revoking").then_some(f)
    });
    let lapse = f["start_unix_ms"].as_i64().expect("start") / 1000 + 3_600;
    assert!(
        (f["not_before_unix"].as_i64().expect("not_before") - lapse).abs() <= 1,
        "{f}"
    );
    assert!(!a.checkpoint_dir(&id(&first)).join("got-usr1").exists());
    let g = a.json(&["gpus", "--json"]);
    assert_eq!(g["verdict"], "drain-now", "{g}");
    assert_eq!(g["drain"]["by"], "health", "{g}");
    let failed: Vec<&serde_json::Value> = g["gpus"]
        .as_array()
        .expect("gpus")
        .iter()
        .filter(|x| x["state"] == "failed")
        .collect();
    assert_eq!(failed.len(), 1, "{g}");
    assert_eq!(failed[0]["pci"], pci);
    // The action reads as `allot xid explain` names it.
    assert_eq!(failed[0]["reasons"][0]["action"], "drain-now", "{g}");
    // A drained host takes no new lease, and says why.
    let out = a.allot(&["lease", "start", "--gpus", "1", "--", "true"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("drained by health")
            && err.contains("xid:79")
            && err.contains("allot gpus clear"),
        "{err}"
    );
}

#[test]
fn without_a_hook_a_revocation_terminates_and_never_sends_sigusr1() {
    // A program with no handler would die of SIGUSR1; with no hook it gets SIGTERM,
    // as Slurm users expect, and the end says so.
    let a = TestAgent::start("nohook", "");
    let l = a.lease_start(
        &["--gpus", "1"],
        r#"trap 'touch "$ALLOT_CHECKPOINT_DIR/got-usr1"' USR1
trap 'touch "$ALLOT_CHECKPOINT_DIR/got-term"; exit 0' TERM
touch "$ALLOT_CHECKPOINT_DIR/ready"
while :; do sleep 0.1; done"#,
    );
    let lid = id(&l);
    a.wait_ready(&lid);
    a.json(&["lease", "revoke", &lid, "--now", "--json"]);
    let ended = a.wait_ended(&lid, LONG);
    assert_eq!(ended["ended_by"], "term", "{ended}");
    assert!(a.checkpoint_dir(&lid).join("got-term").exists());
    assert!(!a.checkpoint_dir(&lid).join("got-usr1").exists());
    assert!(a.events().iter().any(|e| e["lease_id"] == lid.as_str()
        && e["message"]
            .as_str()
            .unwrap_or("")
            .contains("SIGTERM (terminated)")));
}

#[test]
fn operator_drain_and_undrain_with_a_reason() {
    let a = TestAgent::start("drain", "");
    let l = a.lease_start(&["--gpus", "1", "--min-runtime", "1h"], "sleep 600");
    let d = a.json(&["drain", "--reason", "rack maintenance", "--json"]);
    assert_eq!(d["reason"], "rack maintenance", "{d}");
    assert_eq!(a.lease(&id(&l))["state"], "revoking");
    let g = a.json(&["gpus", "--json"]);
    assert_eq!(g["drain"]["reason"], "rack maintenance", "{g}");
    let out = a.allot(&["lease", "start", "--gpus", "1", "--", "true"]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("rack maintenance"));
    assert_eq!(g["drain"]["by"], "local-operator", "{g}");
    let u = a.json(&["undrain", "--json"]);
    assert_eq!(u["draining"], false, "{u}");
    // The revocation the drain queued is withdrawn: the protected lease runs on.
    let after = a.lease(&id(&l));
    assert_eq!(after["state"], "running", "{after}");
    assert!(a.events().iter().any(|e| e["lease_id"] == id(&l).as_str()
        && e["message"]
            .as_str()
            .unwrap_or("")
            .contains("revocation withdrawn")));
    let l2 = a.lease_start(&["--gpus", "1"], "sleep 600");
    assert_eq!(l2["state"], "running", "{l2}");
    // The drain with no reason is refused by the CLI itself.
    assert_eq!(a.allot(&["drain"]).status.code(), Some(2));
}

#[test]
fn kill_9_of_the_agent_loses_nothing_and_the_lapse_is_still_kept() {
    let mut a = TestAgent::start("restart", "");
    let l = a.lease_start(
        &[
            "--gpus",
            "1",
            "--min-runtime",
            "8s",
            "--checkpoint",
            "signal:USR1",
        ],
        CHECKPOINTS_ON_USR1,
    );
    let lid = id(&l);
    let lapse = l["start_unix_ms"].as_i64().expect("start") + 8_000;
    a.json(&["lease", "revoke", &lid, "--json"]);
    a.kill9();
    let pid = l["pid"].as_i64().expect("pid") as i32;
    assert!(
        allot_checkpoint_hooks::group_alive(pid),
        "the workload outlives its agent"
    );
    a.launch();
    let back = a.lease(&lid);
    assert_eq!(back["state"], "revoking", "{back}");
    let ended = a.wait_ended(&lid, LONG);
    let got = stamp_ms(&a.checkpoint_dir(&lid).join("got-usr1")).expect("signal after the restart");
    assert!(
        got >= lapse && got < lapse + 2_500,
        "lapse {lapse}, signal {got}"
    );
    assert_eq!(ended["ended_by"], "checkpoint", "{ended}");
    assert!(a
        .events()
        .iter()
        .any(|e| e["message"].as_str().unwrap_or("").contains("re-adopted")));
}

#[test]
fn a_recycled_pid_is_never_signalled() {
    use std::os::unix::process::CommandExt;
    let mut a = TestAgent::start("recycle", "");
    let l = a.lease_start(&["--gpus", "1", "--min-runtime", "0s"], "sleep 600");
    let lid = id(&l);
    a.kill9();
    // The workload ends while the agent is away, and its pid now names someone else:
    // another process group leader, standing in for a recycled pid.
    let old = l["pid"].as_i64().expect("pid") as i32;
    let _ = nix::sys::signal::killpg(
        nix::unistd::Pid::from_raw(old),
        nix::sys::signal::Signal::SIGKILL,
    );
    // Its supervisor, which outlives the agent, records the end.
    let exit = a.dir.join("state/leases").join(&lid).join("exit.json");
    wait_for("the supervisor's exit.json", LONG, || {
        exit.exists().then_some(())
    });
    // A real recycled pid comes after the whole pid space wrapped, so its start time
    // (10 ms ticks) is later; make sure this stand-in's is too.
    let db = rusqlite::Connection::open(a.dir.join("state/agent.db")).expect("db");
    let body: String = db
        .query_row("SELECT body FROM leases WHERE id = ?1", [&lid], |r| {
            r.get(0)
        })
        .expect("row");
    let mut v: serde_json::Value = serde_json::from_str(&body).expect("json");
    let workload_ticks = v["start_ticks"].as_u64().expect("ticks");
    let mut bystander = wait_for("a bystander with a later start time", LONG, || {
        let mut c = std::process::Command::new("sleep")
            .arg("600")
            .process_group(0)
            .spawn()
            .expect("bystander");
        let ticks = allot_checkpoint_hooks::proc_stat(c.id() as i32).map(|s| s.start_ticks);
        if ticks.is_some_and(|t| t > workload_ticks) {
            Some(c)
        } else {
            let _ = c.kill();
            let _ = c.wait();
            None
        }
    });
    let by = bystander.id() as i32;
    v["pid"] = by.into();
    db.execute(
        "UPDATE leases SET body = ?1 WHERE id = ?2",
        [v.to_string(), lid.clone()],
    )
    .expect("update");
    drop(db);
    a.launch();
    let ended = a.lease(&lid);
    assert_eq!(ended["state"], "ended", "{ended}");
    assert_eq!(ended["end_reason"], "exited", "{ended}");
    assert_eq!(ended["end_detail"], "killed by SIGKILL", "{ended}");
    // Nothing the agent did at start (re-adoption, ladders re-run) reached it, and
    // a revoke now finds an ended lease.
    let _ = a.allot(&["lease", "revoke", &lid, "--now"]);
    assert_eq!(
        bystander.try_wait().expect("try_wait"),
        None,
        "the bystander was signalled"
    );
    let _ = bystander.kill();
    let _ = bystander.wait();
}

#[test]
fn an_adopted_process_is_held_to_the_contract() {
    use std::os::unix::process::CommandExt;
    let a = TestAgent::start("adopt", "");
    let marker = a.dir.join("adopted-got-usr1");
    let ready = a.dir.join("adopted-ready");
    let mut p = std::process::Command::new("sh")
        .args([
            "-c",
            &format!(
                "trap 'date +%s%N > {marker:?}; exit 0' USR1; touch {ready:?}; while :; do sleep 0.05; done",
            ),
        ])
        .process_group(0)
        .spawn()
        .expect("workload");
    wait_for("the process to set its trap", LONG, || {
        ready.exists().then_some(())
    });
    let pid = p.id().to_string();
    let l = a.json(&[
        "lease",
        "start",
        "--gpus",
        "1",
        "--adopt",
        &pid,
        "--checkpoint",
        "signal:USR1",
        "--json",
    ]);
    assert_eq!(l["adopted"], true, "{l}");
    a.json(&["lease", "revoke", &id(&l), "--now", "--json"]);
    let ended = a.wait_ended(&id(&l), LONG);
    assert!(
        marker.exists(),
        "the adopted process got the checkpoint signal"
    );
    assert_eq!(ended["ended_by"], "checkpoint", "{ended}");
    let _ = p.wait();
    // A process that does not lead its group cannot be adopted (its group is shared).
    let out = a.allot(&[
        "lease",
        "start",
        "--gpus",
        "1",
        "--adopt",
        &std::process::id().to_string(),
    ]);
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("process group"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn time_limit_warns_then_ends_the_lease() {
    let a = TestAgent::start(
        "limit",
        "time_limit_warning = \"2s\"\ntime_limit_signal = \"USR2\"",
    );
    let l = a.lease_start(
        &[
            "--gpus",
            "1",
            "--time-limit",
            "3s",
            "--checkpoint",
            "signal:USR1",
        ],
        r#"trap 'date +%s%N > "$ALLOT_CHECKPOINT_DIR/got-usr2"' USR2
trap 'kill $P; exit 0' USR1
sleep 600 & P=$!
while :; do wait $P; done"#,
    );
    let lid = id(&l);
    let start = l["start_unix_ms"].as_i64().expect("start");
    let ended = a.wait_ended(&lid, LONG);
    let warned = stamp_ms(&a.checkpoint_dir(&lid).join("got-usr2")).expect("the warning came");
    assert!(
        warned >= start + 1_000 && warned < start + 2_500,
        "warning at +{}ms",
        warned - start
    );
    assert_eq!(ended["end_reason"], "time-limit", "{ended}");
    assert!(
        ended["ended_unix"].as_i64().expect("end") * 1000 >= start + 2_000,
        "{ended}"
    );
}

#[test]
fn bad_config_bad_arguments_and_outsiders_get_clear_errors() {
    // A bad config file: the agent refuses to start, naming line and field.
    let dir = std::env::temp_dir().join(format!("allot-e2e-badcfg-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let cfg = dir.join("agent.toml");
    std::fs::write(
        &cfg,
        "[agent]\nsocket = \"/tmp/x.sock\"\ndefault_grace = \"soon\"\n",
    )
    .expect("cfg");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_allot-agent"))
        .arg("--config")
        .arg(&cfg)
        .output()
        .expect("runs");
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("agent.toml:3") && err.contains("soon"),
        "{err}"
    );
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_allot-agent"))
        .args(["--gpu-source", "gpus:8"])
        .output()
        .expect("runs");
    assert_eq!(out.status.code(), Some(2));

    let a = TestAgent::start("errors", "socket_mode = \"0666\"");
    // A bad CLI argument.
    let out = a.allot(&[
        "lease",
        "start",
        "--gpus",
        "1",
        "--min-runtime",
        "10x",
        "--",
        "true",
    ]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--min-runtime"));
    // Asking for more GPUs than the host has.
    let out = a.allot(&["lease", "start", "--gpus", "9", "--", "true"]);
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("9 GPUs asked, 8 free"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // An outsider may read but not change.
    if support::is_root() {
        let nobody = 65_534;
        let out = a.allot_as(Some(nobody), &["leases", "--all", "--json"]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let out = a.allot_as(Some(nobody), &["drain", "--reason", "mine now"]);
        assert_eq!(out.status.code(), Some(1));
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("needs root or membership"), "{err}");
        assert_eq!(a.json(&["gpus", "--json"])["drain"]["draining"], false);
    }

    // A reload with a broken file keeps the running config and says why.
    let text = std::fs::read_to_string(&a.config).expect("config");
    std::fs::write(
        &a.config,
        text.replace("term_grace = \"2s\"", "term_grace = \"later\""),
    )
    .expect("write");
    let ev = wait_for("the reload to be rejected", LONG, || {
        a.events().into_iter().find(|e| {
            e["kind"] == "config" && e["message"].as_str().unwrap_or("").contains("rejected")
        })
    });
    assert!(
        ev["message"].as_str().unwrap_or("").contains("term_grace"),
        "{ev}"
    );
    assert!(a.allot(&["gpus"]).status.success(), "still serving");
}

#[test]
fn the_default_socket_mode_keeps_outsiders_out() {
    if !support::is_root() {
        return;
    }
    let a = TestAgent::start("mode", "");
    let out = a.allot_as(Some(65_534), &["leases"]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("permission denied") && err.contains("allot"),
        "{err}"
    );
}

#[test]
fn sighup_reloads_what_can_be_reloaded() {
    let mut a = TestAgent::prepare("hup", "");
    // The file lives elsewhere, behind a symlink, so the directory watcher does not
    // see the edit: only SIGHUP can bring it in.
    let real = a.dir.join("real");
    std::fs::create_dir_all(&real).expect("dir");
    let text = std::fs::read_to_string(&a.config).expect("config");
    std::fs::write(real.join("agent.toml"), &text).expect("copy");
    std::fs::remove_file(&a.config).expect("rm");
    std::os::unix::fs::symlink(real.join("agent.toml"), &a.config).expect("symlink");
    a.launch();
    std::fs::write(
        real.join("agent.toml"),
        text.replace("default_grace = \"2s\"", "default_grace = \"7s\"")
            .replace("[health]", "cluster = \"east\"\n[health]"),
    )
    .expect("edit");
    let pid = a.child.as_ref().expect("agent").id() as i32;
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGHUP,
    )
    .expect("hup");
    let ev = wait_for("the reload", LONG, || {
        a.events().into_iter().find(|e| {
            e["message"]
                .as_str()
                .unwrap_or("")
                .starts_with("config reloaded")
        })
    });
    assert!(
        ev["message"]
            .as_str()
            .unwrap_or("")
            .contains("restart is needed for: agent.host/cluster"),
        "{ev}"
    );
    // The new default grace applies to the next lease.
    let l = a.lease_start(&["--gpus", "1"], "sleep 600");
    assert_eq!(l["grace_s"], 7, "{l}");
}

#[test]
fn the_0_1_0_agent_state_opens_and_its_cluster_drain_keeps_its_author() {
    // The fixture was written by release 0.1.0 (tests/fixtures/make.sh): a cluster
    // operator's drain stored as `operator` with an `allocator:` reason, and leases
    // whose processes are long gone.
    let mut a = TestAgent::prepare("upgrade", "");
    let fixture = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/fixtures/0.1.0-cbf7145/agent-node-2.db");
    std::fs::create_dir_all(a.dir.join("state")).expect("state dir");
    std::fs::copy(&fixture, a.dir.join("state/agent.db")).expect("fixture copied");
    a.launch();
    let g = a.json(&["gpus", "--json"]);
    assert_eq!(g["drain"]["by"], "cluster-operator", "{g}");
    assert_eq!(g["drain"]["reason"], "fixture: rack maintenance", "{g}");
    // Every lease is still listed; the ones whose process is gone ended, saying so.
    let leases = a.json(&["leases", "--all", "--json"]);
    let leases = leases.as_array().expect("leases");
    assert_eq!(leases.len(), 2, "{leases:?}");
    assert!(leases.iter().all(|l| l["state"] == "ended"), "{leases:?}");
    assert!(
        leases.iter().any(|l| l["end_reason"] == "vanished"),
        "{leases:?}"
    );
    // The host operator's undrain does not lift the cluster operator's drain.
    let u = a.json(&["undrain", "--json"]);
    assert_eq!(u["draining"], true, "{u}");
}

/// The supervisor holds the job's output, not the agent: a `kill -9` of the agent
/// while the job writes loses none of it, the cap still holds, and the next agent
/// learns the end from the supervisor. Every process of the job is in its lease's
/// cgroup (required under CI=true).
#[test]
fn kill_9_of_the_agent_while_a_job_writes_keeps_its_output_captured_and_capped() {
    let mut a = TestAgent::start("output", "max_output_bytes = 65536\n");
    // Lines for a while (the agent is killed meanwhile), a flood past the cap, an
    // exit code of its own.
    let l = a.lease_start(
        &["--gpus", "1", "--min-runtime", "0s"],
        "i=0; while [ $i -lt 40 ]; do echo line $i; i=$((i+1)); sleep 0.05; done; \
         yes flood | head -c 200000; echo gone-past-the-cap; exit 3",
    );
    let lid = id(&l);
    let pid = l["pid"].as_i64().expect("pid") as i32;
    let cgroup = a.lease(&lid)["cgroup"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    if std::env::var("CI").as_deref() == Ok("true") {
        assert!(
            !cgroup.is_empty(),
            "CI=true: every lease has a cgroup: {}",
            a.log()
        );
    }
    if !cgroup.is_empty() {
        let procs = std::fs::read_to_string(std::path::Path::new(&cgroup).join("cgroup.procs"))
            .expect("the lease's cgroup");
        assert!(
            procs.lines().any(|p| p == pid.to_string()),
            "pid {pid} in {cgroup}: {procs}"
        );
    }
    let out = a.dir.join("state/logs/root").join(&lid).join("0.0.out");
    wait_for("the first lines", LONG, || {
        std::fs::read_to_string(&out)
            .ok()
            .filter(|s| s.contains("line 1\n"))
    });
    a.kill9();
    let exit = a.dir.join("state/leases").join(&lid).join("exit.json");
    wait_for("the job's end, recorded by its supervisor", LONG, || {
        exit.exists().then_some(())
    });
    let text = std::fs::read_to_string(&out).expect("stdout");
    for i in 0..40 {
        assert!(
            text.contains(&format!("line {i}\n")),
            "line {i} kept: {text:.300}"
        );
    }
    let note = "[allot: output cut at 65536 bytes ([agent] max_output_bytes)";
    assert!(text.contains(note), "cut with a note");
    assert!(!text.contains("gone-past-the-cap"));
    assert!(text.len() < 65536 + 200, "{} bytes", text.len());
    a.launch();
    let ended = a.wait_ended(&lid, LONG);
    assert_eq!(ended["end_reason"], "exited", "{ended}");
    assert_eq!(ended["exit_code"], 3, "{ended}");
    assert_eq!(
        ended["end_detail"], "exit code 3; output cut at 65536 bytes ([agent] max_output_bytes)",
        "{ended}"
    );
    if !cgroup.is_empty() {
        assert!(
            !std::path::Path::new(&cgroup).exists(),
            "the supervisor removed the lease's cgroup"
        );
    }
    // The node keeps serving: the next job runs and ends as it should.
    let next = a.lease_start(&["--gpus", "1"], "echo next; exit 0");
    let done = a.wait_ended(&id(&next), LONG);
    assert_eq!(done["end_detail"], "exit code 0", "{done}");
}

/// A revocation through the agent ends the whole process tree: children that
/// called setsid or setpgid, a double-forked daemon that ignores SIGTERM, a nohup'd
/// one. Where the host gives leases cgroups (required under CI=true).
#[test]
fn a_revoke_leaves_nothing_of_a_job_whatever_it_did_with_sessions() {
    let a = TestAgent::start("escape", "");
    let l = a.lease_start(
        &["--gpus", "1", "--min-runtime", "0s"],
        support::ESCAPING_JOB,
    );
    let lid = id(&l);
    let cgroup = a.lease(&lid)["cgroup"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    if cgroup.is_empty() {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "CI=true: every lease has a cgroup: {}",
            a.log()
        );
        eprintln!("skipped: this host gives leases no cgroup");
        return;
    }
    let procs = |cg: &str| -> Vec<i32> {
        std::fs::read_to_string(std::path::Path::new(cg).join("cgroup.procs"))
            .unwrap_or_default()
            .lines()
            .filter_map(|p| p.parse().ok())
            .collect()
    };
    let pids = wait_for("the job's five processes", LONG, || {
        let p = procs(&cgroup);
        (p.len() >= 5).then_some(p)
    });
    a.json(&["lease", "revoke", &lid, "--now", "--json"]);
    let ended = a.wait_ended(&lid, LONG);
    assert_eq!(ended["end_reason"], "revoked", "{ended}");
    for p in &pids {
        let alive = allot_checkpoint_hooks::proc_stat(*p).is_some_and(|s| !s.exited());
        assert!(!alive, "pid {p} outlived the revocation of {lid}");
    }
    assert!(procs(&cgroup).is_empty());
}

/// The checkpoint signal goes where SIGTERM goes: every process of the lease's
/// cgroup, so a worker its launcher started in a session of its own (as torchrun
/// does) checkpoints too; a workload that dies of the signal did not checkpoint.
/// Where the host gives leases cgroups (required under CI=true).
#[test]
fn the_checkpoint_signal_reaches_workers_in_their_own_sessions() {
    let a = TestAgent::start("sessions", "");
    // The launcher waits for its worker, which checkpoints in its own session; each
    // handles USR1 before the worker says it is ready.
    let launcher = r#"trap 'wait $W; exit 0' USR1
setsid -w sh -c 'trap "touch \"$ALLOT_CHECKPOINT_DIR/worker-got-usr1\"; exit 0" USR1; touch "$ALLOT_CHECKPOINT_DIR/worker-ready"; while :; do sleep 0.2; done' &
W=$!
while :; do sleep 0.2; done"#;
    let flags = [
        "--gpus",
        "1",
        "--checkpoint",
        "signal:USR1",
        "--grace",
        "5s",
    ];
    let l = a.lease_start(&flags, launcher);
    let lid = id(&l);
    // And one that handles nothing: it dies of SIGUSR1.
    let bare = id(&a.lease_start(&flags, "sleep 600"));
    let cgroup = a.lease(&lid)["cgroup"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    if cgroup.is_empty() {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "CI=true: every lease has a cgroup: {}",
            a.log()
        );
        eprintln!("skipped: this host gives leases no cgroup");
        return;
    }
    wait_for("the worker, in its own session, ready", LONG, || {
        a.checkpoint_dir(&lid)
            .join("worker-ready")
            .exists()
            .then_some(())
    });
    let procs = std::fs::read_to_string(std::path::Path::new(&cgroup).join("cgroup.procs"))
        .unwrap_or_default();
    let own_session = procs
        .lines()
        .filter_map(|p| p.parse::<i32>().ok())
        .any(|p| {
            allot_checkpoint_hooks::proc_stat(p)
                .is_some_and(|s| s.session != l["pid"].as_i64().unwrap_or(0) as i32)
        });
    assert!(
        own_session,
        "a process of the lease in a session of its own: {procs}"
    );
    for lease in [&lid, &bare] {
        a.json(&["lease", "revoke", lease, "--now", "--json"]);
    }
    let ended = a.wait_ended(&lid, LONG);
    assert!(
        a.checkpoint_dir(&lid).join("worker-got-usr1").exists(),
        "the worker in its own session heard the hook: {ended}"
    );
    assert_eq!(
        (&ended["end_reason"], &ended["ended_by"]),
        (&"revoked".into(), &"checkpoint".into()),
        "{ended}"
    );
    // Dying of the hook's own signal: revoked, and no checkpoint.
    let ended = a.wait_ended(&bare, LONG);
    assert_eq!(
        (&ended["end_reason"], &ended["ended_by"]),
        (&"revoked".into(), &"exited".into()),
        "{ended}"
    );
    assert_eq!(
        ended["end_detail"], "killed by SIGUSR1 after the checkpoint hook: no checkpoint",
        "{ended}"
    );
}

/// A fault cleared by `allot gpus clear` stays cleared across restarts, with the
/// kernel log written as dmesg prints it (no sequence numbers): the restarted agent
/// does not fail the GPU again, nor kill the work it re-adopted there.
#[test]
fn a_cleared_xid_does_not_come_back_when_the_agent_restarts() {
    let mut a = TestAgent::start("cleared", "");
    let gpus = a.json(&["gpus", "--json"]);
    let pci = |i: usize| gpus["gpus"][i]["pci"].as_str().expect("pci").to_string();
    let fault = |pci: &str| {
        format!("[12345.678901] NVRM: Xid (PCI:{pci}): 79, pid=4242, name=python, GPU has fallen off the bus.")
    };
    a.kernel_log(&fault(&pci(0)));
    wait_for("the GPU to fail", LONG, || {
        let g = a.json(&["gpus", "--json"]);
        (g["gpus"][0]["state"] == "failed").then_some(())
    });
    let out = a.allot(&["gpus", "clear", "0", "--reason", "nvidia-smi -r"]);
    assert!(out.status.success(), "{out:?}");
    wait_for("the host to be healthy", LONG, || {
        let g = a.json(&["gpus", "--json"]);
        (g["verdict"] == "ok").then_some(())
    });
    // Work on every GPU, the cleared one included.
    let l = a.lease_start(&["--gpus", "8"], "sleep 600");
    let lid = id(&l);
    for _ in 0..2 {
        a.kill9();
        a.launch();
    }
    // A new fault on another GPU: by the time it is seen, the old line was read.
    a.kernel_log(&fault(&pci(5)));
    let g = wait_for("the new fault", LONG, || {
        let g = a.json(&["gpus", "--json"]);
        (g["gpus"][5]["state"] == "failed").then_some(g)
    });
    assert_eq!(
        g["gpus"][0]["state"], "healthy",
        "a cleared fault came back: {g}"
    );
    // The lease holds GPU 5 too, so it ends gpu-lost now, and not before: its end
    // names the new fault's GPU, never the cleared one.
    let ended = a.wait_ended(&lid, LONG);
    assert_eq!(ended["end_reason"], "gpu-lost", "{ended}");
    let ev = a.events();
    let killed: Vec<&serde_json::Value> = ev
        .iter()
        .filter(|e| {
            e["lease_id"] == lid.as_str()
                && e["message"]
                    .as_str()
                    .unwrap_or("")
                    .contains("its GPU is gone")
        })
        .collect();
    assert_eq!(killed.len(), 1, "{ev:?}");
}
