//! Output a user can find, from a host that cannot sink (issue 13): `allot logs`
//! reads a workload's output from the node that ran it, follows a running job to
//! its end, shows an earlier run's after a requeue, and refuses another user
//! naming the right; an agent whose disk is nearly full drains instead of failing
//! work, and serves again with a normal threshold (no disk filled: the threshold is
//! set above what is free); an agent whose disk is really full (a small tmpfs the
//! test mounts and fills) refuses work instead of failing it, drains itself and
//! serves again once a write succeeds.

mod support;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};
use support::{sibling, wait_for, Cluster};

const LONG: Duration = Duration::from_secs(60);

const ONE_PROJECT: &str = "[[group]]\nname = \"demo-a\"\nweight = 1\n";

/// `allot logs ARGS` as the test user: exit code, stdout (raw), stderr.
fn logs(c: &Cluster, args: &[&str]) -> (i32, Vec<u8>, String) {
    let mut all = vec!["logs"];
    all.extend_from_slice(args);
    let out = c.allot(&all);
    (
        out.status.code().unwrap_or(-1),
        out.stdout,
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Waits until `allot logs ARGS` succeeds with output containing `text`.
fn wait_output(c: &Cluster, args: &[&str], text: &str) -> String {
    wait_for(
        &format!("`allot logs {}` to show {text:?}", args.join(" ")),
        LONG,
        || {
            let (code, out, _) = logs(c, args);
            let out = String::from_utf8_lossy(&out).into_owned();
            (code == 0 && out.contains(text)).then_some(out)
        },
    )
}

/// The next line `allot logs -f` printed, within the deadline.
fn next_line(lines: &mpsc::Receiver<String>, what: &str) -> String {
    lines
        .recv_timeout(LONG)
        .unwrap_or_else(|e| panic!("no {what} from `allot logs -f` within {LONG:?}: {e}"))
}

#[test]
fn logs_follow_a_running_job_and_show_an_earlier_run_after_a_requeue() {
    let mut c = Cluster::start("logs", ONE_PROJECT, 2, 1);
    let go = c.dir.join("go");

    // A job that prints a line, waits for a file, prints another.
    let job = c.submit(
        &["--project", "demo-a", "--gpus", "1"],
        &format!(
            "echo line 1; echo to stderr >&2; while [ ! -e {go:?} ]; do sleep 0.1; done; echo line 2"
        ),
    );
    c.wait_state(&job, "running", LONG);
    let mut follow = c
        .allot_command(&["logs", &job, "-f"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("allot logs -f starts");
    let out = follow.stdout.take().expect("stdout");
    let (tx, lines) = mpsc::channel();
    std::thread::spawn(move || {
        for l in BufReader::new(out).lines().map_while(Result::ok) {
            if tx.send(l).is_err() {
                return;
            }
        }
    });
    assert_eq!(next_line(&lines, "line 1"), "line 1");
    // Still following: the job waits for the file, so nothing more has come, and the
    // stream has not ended.
    assert!(
        follow.try_wait().expect("try_wait").is_none(),
        "`allot logs -f` ended while the job runs"
    );
    std::fs::write(&go, "").expect("the file the job waits for");
    assert_eq!(next_line(&lines, "line 2"), "line 2");
    // The job exits, and with everything read the stream ends by itself.
    let status = wait_for("`allot logs -f` to end with the job", LONG, || {
        follow.try_wait().expect("try_wait")
    });
    let mut err = String::new();
    std::io::Read::read_to_string(&mut follow.stderr.take().expect("stderr"), &mut err)
        .expect("stderr");
    assert!(status.success(), "{status}: {err}");
    assert!(
        lines.recv_timeout(Duration::from_secs(5)).is_err(),
        "nothing after line 2"
    );
    assert_eq!(c.status(&job)["state"], "completed");
    // Read again once it has ended: the same bytes; stderr on its own.
    let (code, out, err) = logs(&c, &[&job]);
    assert_eq!(
        (code, out.as_slice()),
        (0, &b"line 1\nline 2\n"[..]),
        "{err}"
    );
    let (code, out, err) = logs(&c, &[&job, "--stderr"]);
    assert_eq!((code, out.as_slice()), (0, &b"to stderr\n"[..]), "{err}");

    // Requeued by an operator's drain-now: each run's output stays on its node.
    let job = c.submit(
        &["--project", "demo-a", "--gpus", "1"],
        "echo \"run of $ALLOT_LEASE_ID\"; exec sleep 600",
    );
    let w = c.wait_state(&job, "running", LONG);
    let first_lease = w["lease_ids"][0].as_str().expect("lease").to_string();
    let (first_node, first_i) = Cluster::node_of(&w);
    wait_output(&c, &[&job], &format!("run of {first_lease}"));
    let out = c.allot(&[
        "nodes",
        "drain",
        &first_node,
        "--now",
        "--reason",
        "logs test",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let moved = wait_for("the job to run again on the other node", LONG, || {
        let w = c.status(&job);
        (w["state"] == "running" && w["node_names"][0] != first_node.as_str()).then_some(w)
    });
    let second_lease = moved["lease_ids"][1].as_str().expect("lease").to_string();
    assert_ne!(first_lease, second_lease);
    // The latest run by default; run 1 on request, from the drained node.
    let latest = wait_output(&c, &[&job], &format!("run of {second_lease}"));
    assert!(!latest.contains(&first_lease), "{latest}");
    let (code, out, err) = logs(&c, &[&job, "--run", "1"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(
        String::from_utf8_lossy(&out),
        format!("run of {first_lease}\n")
    );
    let (code, _, err) = logs(&c, &[&job, "--run", "3"]);
    assert_eq!(code, 1);
    assert!(err.contains("give --run 1 to 2"), "{err}");
    let (code, _, err) = logs(&c, &[&job, "--rank", "1"]);
    assert_eq!(code, 1);
    assert!(
        err.contains("rank: run 2") && err.contains("1 node(s)"),
        "{err}"
    );

    // Another user may not read it, and is told which right is missing.
    let t = c.allotd(&["tokens", "create", "--user", "mallory"]);
    assert!(t.status.success(), "{}", String::from_utf8_lossy(&t.stderr));
    let out = Command::new(sibling("allot", "allot-cli"))
        .args(["logs", &job])
        .env("ALLOT_SERVER", format!("https://{}", c.addr))
        .env("ALLOT_TOKEN", String::from_utf8_lossy(&t.stdout).trim())
        .env("ALLOT_CA", c.ca())
        .output()
        .expect("allot runs");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(out.stdout.is_empty());
    assert!(
        err.contains("mallory may not read the output of workload")
            && err.contains("only its owner, an operator"),
        "{err}"
    );

    // The node that ran run 1 gone: the answer names it and where the file is.
    c.kill9_agent(first_i);
    wait_for("allotd to see the agent gone", LONG, || {
        (c.node_view(first_i)["connected"] == false).then_some(())
    });
    let (code, _, err) = logs(&c, &[&job, "--run", "1"]);
    assert_eq!(code, 1);
    assert!(
        err.contains(&format!(
            "{first_node} is not connected; its logs are on that host (`allot lease logs {first_lease}` there reads them)"
        )) && err.contains("/1.0.out under the agent's [agent] log_dir"),
        "{err}"
    );
}

/// Free bytes (for unprivileged writers) on the file system holding `path`.
fn free_bytes(path: &std::path::Path) -> u64 {
    let s = nix::sys::statvfs::statvfs(path).expect("statvfs");
    (s.blocks_available() as u64).saturating_mul(s.fragment_size() as u64)
}

/// Rewrites node `i`'s agent.toml with `lines` at the top of `[agent]`; the agent
/// reloads it on its own (it watches the file).
fn set_agent_lines(c: &Cluster, i: usize, lines: &str) {
    let path = c.node_dir(i).join("agent.toml");
    let text = std::fs::read_to_string(&path).expect("agent.toml");
    let rest = text
        .split_once("[agent]\n")
        .map(|(_, r)| r)
        .expect("an [agent] section");
    // Lines set before are replaced, not repeated (a key twice is a config error).
    let rest: String = rest
        .lines()
        .filter(|l| !l.starts_with("min_free_bytes") && !l.starts_with("disk_check_interval"))
        .map(|l| format!("{l}\n"))
        .collect();
    std::fs::write(&path, format!("[agent]\n{lines}{rest}")).expect("agent.toml written");
}

#[test]
fn a_node_nearly_out_of_disk_drains_and_takes_no_work_until_space_is_back() {
    let c = Cluster::start("disk", ONE_PROJECT, 2, 1);
    let state = c.node_dir(0).join("state");
    // Never fill the disk: ask for a terabyte more than there is.
    let threshold = free_bytes(&state) + (1u64 << 40);
    set_agent_lines(
        &c,
        0,
        &format!("min_free_bytes = {threshold}\ndisk_check_interval = \"1s\"\n"),
    );
    let n = wait_for("node-0 to drain for want of disk", LONG, || {
        let n = c.node_view(0);
        (n["state"] == "draining").then_some(n)
    });
    let reason = n["drain_reason"].as_str().unwrap_or_default().to_string();
    for words in [
        "health: ",
        "disk-low",
        &state.display().to_string(),
        " free of ",
        &format!("min_free_bytes = {}", human_tib(threshold)),
        "lower min_free_bytes in agent.toml",
    ] {
        assert!(reason.contains(words), "{words:?} not in {reason:?}");
    }
    // The host holds the drain itself (allotd let it through).
    let gpus = c.agent_json(0, &["gpus", "--json"]);
    assert!(
        gpus["drain"]["drains"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|d| d["by"] == "health" && d["held"] == false),
        "{gpus}"
    );

    // Work goes to node-1 only; what does not fit there waits.
    let a = c.submit(&["--project", "demo-a", "--gpus", "1"], "exec sleep 600");
    let b = c.submit(&["--project", "demo-a", "--gpus", "1"], "exec sleep 600");
    let w = c.wait_state(&a, "running", LONG);
    assert_eq!(Cluster::node_of(&w).0, "node-1", "{w}");
    c.wait_passes(3);
    let wb = c.status(&b);
    assert_eq!(wb["state"], "pending", "{wb}");
    assert_eq!(c.node_view(0)["lease_ids"], serde_json::json!([]));
    assert_eq!(
        c.agent_json(0, &["leases", "--all", "--json"]),
        serde_json::json!([]),
        "node-0 started nothing"
    );

    // A normal threshold: the fault clears, the drain lifts, the waiting job runs there.
    set_agent_lines(
        &c,
        0,
        "min_free_bytes = 1048576\ndisk_check_interval = \"1s\"\n",
    );
    let t = Instant::now();
    let wb = c.wait_state(&b, "running", LONG);
    assert_eq!(Cluster::node_of(&wb).0, "node-0", "{wb}");
    assert_eq!(c.node_view(0)["state"], "ready");
    eprintln!(
        "node-0 served again {:?} after the threshold was lowered",
        t.elapsed()
    );
}

/// How the agent writes a threshold of some TiB (`disk::human`).
fn human_tib(bytes: u64) -> String {
    format!("{:.1} TiB", bytes as f64 / (1u64 << 40) as f64)
}

/// A small tmpfs mounted over `dir` (its files copied in first), unmounted when
/// dropped; `None` where this host cannot mount (not root, no CAP_SYS_ADMIN), which
/// fails the test under `CI=true`.
struct Tmpfs(std::path::PathBuf);

impl Tmpfs {
    fn over(dir: &std::path::Path, size: &str) -> Option<Tmpfs> {
        let keep = dir.with_extension("before-tmpfs");
        std::fs::rename(dir, &keep).expect("move the dir aside");
        std::fs::create_dir(dir).expect("mount point");
        let ok = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir)
            .status()
            .is_ok_and(|s| s.success());
        if !ok {
            assert!(
                std::env::var("CI").as_deref() != Ok("true"),
                "CI=true: cannot mount a tmpfs at {} (the test needs root)",
                dir.display()
            );
            std::fs::remove_dir(dir).expect("mount point removed");
            std::fs::rename(&keep, dir).expect("the dir back");
            return None;
        }
        let copied = Command::new("cp")
            .arg("-a")
            .arg(format!("{}/.", keep.display()))
            .arg(dir)
            .status()
            .is_ok_and(|s| s.success());
        assert!(copied, "copying {} onto the tmpfs", keep.display());
        Some(Tmpfs(dir.to_path_buf()))
    }

    /// Fills it to the last byte: a file written until the file system says no.
    fn fill(&self) -> std::path::PathBuf {
        use std::io::Write;
        let p = self.0.join("filler");
        let mut f = std::fs::File::create(&p).expect("filler");
        let chunk = vec![0u8; 64 << 10];
        while f.write_all(&chunk).is_ok() {}
        // What a whole chunk no longer fits, a byte at a time.
        while f.write_all(&[0]).is_ok() {}
        p
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        // Lazily: the agent may still hold files there while the cluster stops.
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

#[test]
fn a_full_disk_refuses_work_and_drains_the_node_instead_of_failing_the_job() {
    let mut c = Cluster::start("fulldisk", ONE_PROJECT, 2, 1);
    // node-0's state dir on a small file system of its own, with the free-space
    // threshold off: the write itself must be what the agent notices.
    c.kill9_agent(0);
    let Some(fs) = Tmpfs::over(&c.node_dir(0).join("state"), "16m") else {
        eprintln!("skipped: cannot mount a tmpfs here");
        return;
    };
    c.start_agent(0, 1);
    // Up before its config is rewritten (a file half written reads as no file).
    wait_for("node-0's agent to answer", LONG, || {
        c.agent_allot(0, &["gpus", "--json"])
            .status
            .success()
            .then_some(())
    });
    set_agent_lines(&c, 0, "min_free_bytes = 0\ndisk_check_interval = \"1s\"\n");
    c.wait_connected(2);
    wait_for("node-0 ready", LONG, || {
        (c.node_view(0)["state"] == "ready").then_some(())
    });
    // Only node-0 may take the first job.
    let out = c.allot(&["nodes", "drain", "node-1", "--reason", "keep it for later"]);
    assert!(out.status.success(), "{out:?}");
    let filler = fs.fill();
    let first = c.submit(&["--project", "demo-a", "--gpus", "1"], "exec sleep 600");
    // The host could not write the lease: refused (it waits again), and node-0
    // drains itself for want of disk.
    let n = wait_for("node-0 to drain: disk-full", LONG, || {
        let n = c.node_view(0);
        (n["state"] == "draining").then_some(n)
    });
    let reason = n["drain_reason"].as_str().unwrap_or_default();
    assert!(reason.contains("disk-full"), "{n}");
    // The agent retries every second (disk_check_interval): still full, still drained.
    c.wait_passes(4);
    assert_eq!(c.node_view(0)["state"], "draining");
    let w = c.status(&first);
    assert_eq!(w["state"], "pending", "not failed: {w}");
    let history = w["history"].to_string();
    assert!(history.contains("refused"), "{history}");
    // It runs on node-1 once that one is back.
    let out = c.allot(&["nodes", "undrain", "node-1"]);
    assert!(out.status.success(), "{out:?}");
    let w = c.wait_state(&first, "running", LONG);
    assert_eq!(Cluster::node_of(&w).0, "node-1", "{w}");
    // Space back: the next write succeeds, the drain lifts, work goes there again.
    std::fs::remove_file(&filler).expect("filler removed");
    wait_for("node-0 ready again", LONG, || {
        (c.node_view(0)["state"] == "ready").then_some(())
    });
    let second = c.submit(&["--project", "demo-a", "--gpus", "1"], "exec sleep 600");
    let w = c.wait_state(&second, "running", LONG);
    assert_eq!(Cluster::node_of(&w).0, "node-0", "{w}");
    // Nothing failed on the way.
    for id in [&first, &second] {
        assert_eq!(c.status(id)["state"], "running", "{id}");
    }
    drop(c);
    drop(fs);
}

#[test]
fn a_user_cannot_take_the_name_of_another_users_log() {
    let (Some(_), Some(_)) = (
        allot_test_support::test_user("allot-test-a"),
        allot_test_support::test_user("allot-test-b"),
    ) else {
        return;
    };
    let c = Cluster::start(
        "squat",
        "[[group]]\nname = \"demo-a\"\nweight = 1\nopen = true\n",
        1,
        1,
    );
    let token = |user: &str| {
        let out = c.allotd(&["tokens", "create", "--user", user]);
        assert!(out.status.success(), "{out:?}");
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    };
    let (ta, tb) = (token("allot-test-a"), token("allot-test-b"));
    let submit_as = |t: &str, flags: &[&str], script: &str| {
        let mut args = vec!["submit", "--json", "--project", "demo-a", "--chdir", "/tmp"];
        args.extend_from_slice(flags);
        args.extend_from_slice(&["--", "sh", "-c", script]);
        let out = Command::new(sibling("allot", "allot-cli"))
            .args(&args)
            .env("ALLOT_SERVER", format!("https://{}", c.addr))
            .env("ALLOT_TOKEN", t)
            .env("ALLOT_CA", c.ca())
            .output()
            .expect("allot runs");
        allot_test_support::json_of(&args, &out)["id"]
            .as_str()
            .expect("id")
            .to_string()
    };
    // Workload ids are sequential: a takes the name workload 2's output would have
    // had under one log dir for all ("2/1.0.out").
    let squat = submit_as(&ta, &["--output", "2/1.0.out"], "echo squatter");
    c.wait_state(&squat, "completed", LONG);
    let victim = submit_as(&tb, &[], "echo mine");
    assert_eq!(victim, "2");
    let w = c.wait_state(&victim, "completed", LONG);
    assert_eq!(w["end_reason"], "completed", "{w}");
    let logs = c.node_dir(0).join("state/logs");
    let read = |p: &str| std::fs::read_to_string(logs.join(p)).unwrap_or_default();
    assert_eq!(read("allot-test-a/2/1.0.out"), "squatter\n");
    assert_eq!(read("allot-test-b/2/1.0.out"), "mine\n");
}
