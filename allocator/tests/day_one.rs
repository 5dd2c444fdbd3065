//! What a new user meets on day one, end to end through the `allot` CLI against
//! allotd and real agents on fake GPUs: exit statuses passed on by `submit --wait`,
//! `watch` and `logs -f` (as `srun` does), and every run of a workload with how it
//! ended in `status`.

mod support;

use std::process::{Command, Stdio};
use std::time::Duration;
use support::{sibling, wait_for, Cluster};

const LONG: Duration = Duration::from_secs(90);

const PROJECTS: &str =
    "[[group]]\nname = \"demo-a\"\nweight = 1\n[[group]]\nname = \"demo-b\"\nweight = 1\n";

/// `allot ARGS` against `c`, not waited for.
fn spawn(c: &Cluster, args: &[&str]) -> std::process::Child {
    c.allot_command(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("allot runs")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[test]
fn waiting_commands_pass_on_the_jobs_exit_status() {
    let c = Cluster::start("day-one-exit", PROJECTS, 1, 2);
    let wait = |script: &str| {
        let o = c.allot(&[
            "submit",
            "--wait",
            "--project",
            "demo-a",
            "--",
            "sh",
            "-c",
            script,
        ]);
        (o.status.code(), text(&o.stdout), text(&o.stderr))
    };
    // Its own exit status, and what it was said along the way.
    let (code, out, err) = wait("sleep 1; exit 3");
    assert_eq!(code, Some(3), "{out}{err}");
    assert!(out.starts_with("submitted workload "), "{out}");
    assert!(err.contains(": running on node-0 (run 1, lease "), "{err}");
    assert!(
        err.contains(": failed (failed (exit 3)), exit status 3"),
        "{err}"
    );
    let (code, _, err) = wait("true");
    assert_eq!(code, Some(0), "{err}");
    assert!(
        err.contains(": completed (completed (exit 0)), exit status 0"),
        "{err}"
    );
    // Killed by a signal: 128 + N, as shells say it.
    let (code, _, err) = wait("kill -KILL $$");
    assert_eq!(code, Some(137), "{err}");
    assert!(err.contains("killed by signal 9"), "{err}");

    // The runs, in status: each with its lease, nodes, GPUs and end.
    let id = c.submit(&["--project", "demo-a", "--gpus", "2"], "exit 7");
    let w = c.wait_state(&id, "failed", LONG);
    assert_eq!(w["exit_code"], 7, "{w}");
    assert_eq!(w["exit_status"], 7, "{w}");
    let runs = w["runs"].as_array().expect("runs");
    assert_eq!(runs.len(), 1, "{w}");
    assert_eq!(runs[0]["run"], 1);
    assert_eq!(runs[0]["nodes"], serde_json::json!(["node-0"]));
    assert_eq!(runs[0]["gpus"], 2);
    assert_eq!(runs[0]["end_reason"], "failed");
    assert_eq!(runs[0]["exit_code"], 7);
    assert!(runs[0]["end_unix"].as_i64() >= runs[0]["start_unix"].as_i64());
    let o = c.allot(&["status", &id]);
    let s = text(&o.stdout);
    assert!(s.contains("exit status: 7"), "{s}");
    assert!(s.contains("runs:\n  RUN  LEASE"), "{s}");
    assert!(s.contains("failed (exit 7)"), "{s}");

    // `watch` follows to the end and exits as the job did.
    let id = c.submit(&["--project", "demo-a"], "sleep 1; exit 5");
    let o = c.allot(&["watch", &id]);
    let out = text(&o.stdout);
    assert_eq!(o.status.code(), Some(5), "{out}{}", text(&o.stderr));
    let last = out.lines().last().unwrap_or("");
    assert_eq!(
        last,
        format!("workload {id}: failed (failed (exit 5)), exit status 5"),
        "{out}"
    );

    // `logs -f` prints the output, then exits as the job did.
    let id = c.submit(&["--project", "demo-a"], "echo hello; sleep 1; exit 4");
    // Started (a poll slower than its second may find it ended already).
    wait_for("the job to start", LONG, || {
        (c.status(&id)["state"] != "pending").then_some(())
    });
    let o = c.allot(&["logs", "-f", &id]);
    assert_eq!(o.status.code(), Some(4), "{}", text(&o.stderr));
    assert_eq!(text(&o.stdout), "hello\n");

    // Ended by someone else: cancelled is 130, said as such.
    let waiting = spawn(
        &c,
        &[
            "submit",
            "--wait",
            "--project",
            "demo-a",
            "--",
            "sleep",
            "300",
        ],
    );
    let id = wait_for("the waited job to be submitted", LONG, || {
        let all = c.json(&["queue", "--json"]);
        all.as_array()?
            .iter()
            .find(|w| w["argv"] == serde_json::json!(["sleep", "300"]))
            .and_then(|w| w["id"].as_str().map(str::to_string))
    });
    c.wait_state(&id, "running", LONG);
    assert!(c.allot(&["cancel", &id]).status.success());
    let o = waiting.wait_with_output().expect("waited");
    assert_eq!(o.status.code(), Some(130), "{}", text(&o.stderr));
    assert!(
        text(&o.stderr).contains(": cancelled ("),
        "{}",
        text(&o.stderr)
    );
}

#[test]
fn submit_says_the_contract_and_classes_have_defaults() {
    let classes =
        "[classes.training]\nmin_runtime = \"8h\"\n[classes.debug]\ntime_limit = \"1h\"\n";
    let c = Cluster::start("day-one-contract", &format!("{PROJECTS}{classes}"), 1, 1);
    let submit = |flags: &[&str]| {
        let mut args = vec!["submit", "--project", "demo-a"];
        args.extend_from_slice(flags);
        args.extend_from_slice(&["--", "sleep", "0"]);
        let o = c.allot(&args);
        (o.status.code(), text(&o.stdout), text(&o.stderr))
    };
    // No flags: free occupancy, said aloud with how to ask for more.
    let (code, out, err) = submit(&[]);
    assert_eq!(code, Some(0), "{err}");
    assert!(
        out.contains("\ncontract: free occupancy: may be preempted at any time, and then is requeued and restarts from the beginning; add --min-runtime or --resumable; no time limit (class batch)"),
        "{out}"
    );
    // A class names its default contract; what is asked for wins.
    let (_, out, _) = submit(&["--class", "training", "--resumable"]);
    assert!(
        out.contains(
            "contract: protected for 8h; after that, if preempted, it is asked to checkpoint"
        ),
        "{out}"
    );
    let (_, out, _) = submit(&["--class", "training", "--min-runtime", "0"]);
    assert!(out.contains("contract: free occupancy"), "{out}");
    let (_, out, _) = submit(&["--class", "debug"]);
    assert!(
        out.contains("ends at its time limit, 1h (class debug)"),
        "{out}"
    );
    // A warning before the time limit may lean on the class's limit; with none at
    // all it is refused, naming the class.
    let (code, _, err) = submit(&["--class", "debug", "--signal", "USR2@5m"]);
    assert_eq!(code, Some(0), "{err}");
    let (code, _, err) = submit(&["--signal", "USR2@5m"]);
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.contains("warn_signal: a warning before the time limit needs a time limit, and class batch has none"),
        "{err}"
    );
    // A warning at or before the start (an offset as long as the limit) is refused:
    // it would fire as the work starts.
    let (code, _, err) = submit(&["--class", "debug", "--signal", "USR2@1h"]);
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.contains("warn_before_s: 3600 s before a time limit of 3600 s (the class's default) is at or before the start"),
        "{err}"
    );
    // A protection past the class's limit is refused, naming where each came from.
    let (code, _, err) = submit(&["--class", "debug", "--min-runtime", "2h"]);
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.contains("(asked for): longer than time_limit (3600 s, the class's default)"),
        "{err}"
    );

    // `allot share`: a manager recomputes every ratio from its row.
    let id = c.submit(&["--project", "demo-a"], "sleep 60");
    c.wait_state(&id, "running", LONG);
    let t = c.json(&["share", "--json"]);
    let horizon = t["horizon_hours"].as_f64().expect("horizon");
    assert_eq!(t["ranking_window_hours"], 0.0);
    for g in t["groups"].as_array().expect("groups") {
        let f = |k: &str| g[k].as_f64().unwrap_or_else(|| panic!("{k} in {g}"));
        let (counted, fair) = (f("counted_gpu_hours"), f("fair_gpu_hours"));
        assert!((f("ratio") - counted / fair).abs() < 1e-9, "{g}");
        let running = f("running_gpus");
        assert!(
            (counted - (f("served_gpu_hours") + running * horizon)).abs() < 1e-3,
            "COUNTED = RECEIVED + RUNNING × horizon: {g}"
        );
        let share = f("share");
        let want = share
            * t["capacity_gpus"].as_f64().expect("cap")
            * (t["covered_hours"].as_f64().expect("covered") + horizon);
        assert!(
            (fair - want).abs() < 1e-6,
            "FAIR = SHARE × capacity × (covered + horizon): {g}"
        );
    }
    let demo_a = &t["groups"].as_array().expect("groups")[0];
    assert_eq!(demo_a["name"], "demo-a");
    assert_eq!(demo_a["running_gpus"], 1);
}

#[test]
fn under_systemd_log_lines_carry_syslog_priorities_and_json_is_one_object_a_line() {
    use std::os::unix::fs::MetadataExt;
    let dir = std::env::temp_dir().join(format!("allot-day-one-log-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("dir");
    let cfg = dir.join("allotd.toml");
    std::fs::write(
        &cfg,
        format!(
            "[server]\nstate_dir = {:?}\n{PROJECTS}",
            dir.join("state").display().to_string()
        ),
    )
    .expect("config");
    let allotd = |env: &[(&str, String)], stderr: &std::path::Path| {
        let err = std::fs::File::create(stderr).expect("stderr file");
        let meta = err.metadata().expect("meta");
        let mut cmd = Command::new(sibling("allotd", "allot-allocator"));
        cmd.args(["serve", "--check", "--config"])
            .arg(&cfg)
            .env_remove("ALLOT_LOG")
            .env_remove("JOURNAL_STREAM")
            .stderr(err);
        for (k, v) in env {
            let v = v.replace("DEV:INO", &format!("{}:{}", meta.dev(), meta.ino()));
            cmd.env(k, v);
        }
        let o = cmd.output().expect("allotd runs");
        assert!(o.status.success(), "{}", text(&o.stdout));
        std::fs::read_to_string(stderr).expect("log")
    };
    // systemd's JOURNAL_STREAM names stderr: info lines begin <6>, no timestamp.
    let log = allotd(
        &[("JOURNAL_STREAM", "DEV:INO".into())],
        &dir.join("journal.log"),
    );
    let line = log
        .lines()
        .find(|l| l.contains("descriptor limit"))
        .unwrap_or_else(|| panic!("{log}"));
    assert!(
        line.starts_with("<6>allotd: descriptor limit nofile="),
        "{log}"
    );
    // Another stream's JOURNAL_STREAM (stderr redirected elsewhere): plain text.
    let log = allotd(&[("JOURNAL_STREAM", "1:2".into())], &dir.join("plain.log"));
    assert!(
        !log.starts_with('<') && log.contains(" INFO allotd: descriptor limit"),
        "{log}"
    );
    // --log-format json (or ALLOT_LOG_FORMAT): one object per line.
    let log = allotd(
        &[("ALLOT_LOG_FORMAT", "json".into())],
        &dir.join("json.log"),
    );
    for l in log.lines() {
        let v: serde_json::Value = serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}"));
        assert_eq!(v["level"], "INFO", "{l}");
    }
    assert!(log.contains("descriptor limit"), "{log}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn names_cancel_by_filter_and_a_default_project() {
    let me = allot_test_support::current_user();
    let groups = format!(
        "[[group]]\nname = \"demo-a\"\nweight = 1\n[[group]]\nname = \"demo-b\"\nweight = 1\nmembers = [{me:?}]\n"
    );
    let c = Cluster::start("day-one-names", &groups, 1, 4);
    // No --project: the only project the user is a member of.
    let o = c.allot(&[
        "submit",
        "--name",
        "probe",
        "--",
        "sh",
        "-c",
        "echo \"$ALLOT_JOB_NAME\"",
    ]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    assert!(
        text(&o.stdout).contains("(project demo-b, 1 GPU)"),
        "{}",
        text(&o.stdout)
    );
    // A name: in the queue, as a filter, in the job's environment and in %x.
    let id = c.submit(
        &[
            "--project",
            "demo-a",
            "-J",
            "sweep-1",
            "--output",
            "%x-%j.out",
        ],
        "echo named",
    );
    let w = c.wait_state(&id, "completed", LONG);
    assert_eq!(w["name"], "sweep-1");
    let o = c.allot(&["logs", &id]);
    assert_eq!(text(&o.stdout), "named\n", "{}", text(&o.stderr));
    let file = c
        .node_dir(0)
        .join("state/logs")
        .join(&me)
        .join(format!("sweep-1-{id}.out"));
    assert!(
        file.exists(),
        "%x put the name in the file name: {}",
        file.display()
    );
    let probe = c.json(&["queue", "--all", "--name", "probe", "--json"]);
    let probe = probe.as_array().expect("array");
    assert_eq!(probe.len(), 1);
    let pid = probe[0]["id"].as_str().expect("id");
    c.wait_state(pid, "completed", LONG);
    assert_eq!(text(&c.allot(&["logs", pid]).stdout), "probe\n");

    // Cancel several by id, and every live one of a name.
    let ids: Vec<String> = (0..4)
        .map(|i| {
            c.submit(
                &[
                    "--project",
                    "demo-a",
                    "--name",
                    if i < 2 { "a" } else { "b" },
                ],
                "sleep 300",
            )
        })
        .collect();
    let o = c.allot(&["cancel", &ids[0], &ids[1]]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    assert_eq!(text(&o.stdout).lines().count(), 2, "{}", text(&o.stdout));
    let o = c.allot(&["cancel", "--name", "b", "--state", "pending"]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let o = c.allot(&["cancel", "--name", "b"]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    for id in &ids {
        c.wait_state(id, "cancelled", LONG);
    }
    // One refusal does not stop the rest, and says which.
    let o = c.allot(&["cancel", "999", &ids[0]]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        text(&o.stderr).contains("error: workload 999: "),
        "{}",
        text(&o.stderr)
    );
    let o = c.allot(&["cancel"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o.stderr));
}

#[test]
fn with_a_shared_checkpoint_root_a_requeued_job_finds_its_checkpoint_on_another_node() {
    let mut c = Cluster::start("day-one-ckpt", PROJECTS, 0, 1);
    let root = c.dir.join("shared-checkpoints");
    c.agent_extra = format!("checkpoint_root = {:?}\n", root.display().to_string());
    for i in 0..2 {
        c.agents.push(None);
        c.start_agent(i, 1);
    }
    c.wait_connected(2);
    // Run 1 writes its step and waits; run 2, wherever it runs, finds it and ends.
    let script = "f=\"$ALLOT_CHECKPOINT_DIR/step\"; if [ -f \"$f\" ]; then echo \"resumed at $(cat \"$f\") in $ALLOT_CHECKPOINT_DIR\"; exit 0; fi; echo 41 > \"$f\"; echo \"wrote step 41\"; exec sleep 300";
    let id = c.submit(&["--project", "demo-a", "--resumable"], script);
    let w = c.wait_state(&id, "running", LONG);
    let (first, _) = Cluster::node_of(&w);
    wait_for("run 1 to write its step", LONG, || {
        (text(&c.allot(&["logs", &id]).stdout) == "wrote step 41\n").then_some(())
    });
    assert!(c
        .allot(&["nodes", "drain", &first, "--reason", "maintenance", "--now"])
        .status
        .success());
    let w = c.wait_state(&id, "completed", LONG);
    let runs = w["runs"].as_array().expect("runs");
    assert_eq!(runs.len(), 2, "{w}");
    assert_ne!(
        runs[1]["nodes"][0], runs[0]["nodes"][0],
        "run 2 on the other node: {w}"
    );
    let me = allot_test_support::current_user();
    let dir = root.join(&me).join(&id);
    assert_eq!(
        text(&c.allot(&["logs", &id]).stdout),
        format!("resumed at 41 in {}\n", dir.display())
    );
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&dir).expect("dir").permissions().mode() & 0o777;
    assert_eq!(mode, 0o700, "a workload's checkpoints are its user's alone");
}

#[test]
fn output_on_a_users_own_path_is_opened_as_that_user() {
    let Some((uid, gid)) = allot_test_support::test_user("allot-test-a") else {
        return;
    };
    let groups = "[[group]]\nname = \"demo-a\"\nweight = 1\nopen = true\n";
    let c = Cluster::start("day-one-own-output", groups, 1, 1);
    let out = c.allotd(&["tokens", "create", "--user", "allot-test-a"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let token = text(&out.stdout).trim().to_string();
    let as_a = |args: &[&str]| {
        c.allot_command(args)
            .env("ALLOT_TOKEN", &token)
            .output()
            .expect("allot runs")
    };
    // A directory only allot-test-a may write, and one it may not.
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let base = std::env::temp_dir().join(format!("allot-own-output-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&base);
    let mine = base.join("mine");
    let roots = base.join("roots");
    std::fs::create_dir_all(&mine).expect("dir");
    std::fs::create_dir_all(&roots).expect("dir");
    std::fs::set_permissions(&base, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    std::os::unix::fs::chown(&mine, Some(uid), Some(gid)).expect("chown");
    std::fs::set_permissions(&mine, std::fs::Permissions::from_mode(0o700)).expect("chmod");
    std::fs::set_permissions(&roots, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let submit = |output: &str| {
        let o = as_a(&[
            "submit",
            "--json",
            "--project",
            "demo-a",
            "--chdir",
            "/tmp",
            "--name",
            "own",
            "--output",
            output,
            "--",
            "sh",
            "-c",
            "echo written by $(id -u)",
        ]);
        assert!(o.status.success(), "{}", text(&o.stderr));
        allot_test_support::json_of(&["submit"], &o)["id"]
            .as_str()
            .expect("id")
            .to_string()
    };
    let pattern = format!("{}/%x-%j.out", mine.display());
    let id = submit(&pattern);
    c.wait_state(&id, "completed", LONG);
    let file = mine.join(format!("own-{id}.out"));
    let m = std::fs::metadata(&file).expect("the file is there");
    assert_eq!(m.uid(), uid, "made by the job's user, not by root");
    assert_eq!(
        std::fs::read_to_string(&file).expect("read"),
        format!("written by {uid}\n")
    );
    // `allot logs` reads it still.
    assert_eq!(
        text(&as_a(&["logs", &id]).stdout),
        format!("written by {uid}\n")
    );
    // The file is its user's to replace: a link to a file only root may read is
    // not followed, and a file that is not the user's own is not read.
    let secret = roots.join("secret");
    std::fs::write(&secret, "root's secret\n").expect("write");
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    let refused = |why: &str| {
        let o = as_a(&["logs", &id]);
        assert!(!o.status.success(), "{}", text(&o.stdout));
        assert!(!text(&o.stdout).contains("secret"), "{}", text(&o.stdout));
        assert!(text(&o.stderr).contains(why), "{}", text(&o.stderr));
        std::fs::remove_file(&file).expect("rm");
    };
    std::fs::remove_file(&file).expect("rm");
    std::os::unix::fs::symlink(&secret, &file).expect("symlink");
    refused("cannot be read");
    std::fs::hard_link(&secret, &file).expect("a hard link, as root may make one");
    refused("no longer a file of allot-test-a's own");
    std::fs::remove_file(&secret).expect("rm");
    // Where that user cannot write, the job fails, saying why; nothing is made there.
    let id = submit(&format!("{}/x.out", roots.display()));
    let w = c.wait_state(&id, "failed", LONG);
    let why = w["runs"][0]["detail"].as_str().unwrap_or("").to_string();
    assert!(
        why.contains(&format!(
            "cannot open the output {}/x.out as uid {uid}: Permission denied",
            roots.display()
        )),
        "{w}"
    );
    assert!(!roots.join("x.out").exists());
    let _ = std::fs::remove_dir_all(&base);
}

#[test]
fn init_keeps_a_config_written_elsewhere_and_its_state_together() {
    let dir = std::env::temp_dir().join(format!("allot-day-one-init-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("dir");
    let cfg = dir.join("allotd.toml");
    let o = Command::new(sibling("allotd", "allot-allocator"))
        .arg("init")
        .arg(&cfg)
        .output()
        .expect("allotd runs");
    assert!(o.status.success(), "{}", text(&o.stderr));
    let state = dir.join("allotd-state");
    assert!(
        std::fs::read_to_string(&cfg)
            .expect("written")
            .contains(&format!("state_dir = {:?}", state.display().to_string())),
        "the state dir is beside the config"
    );
    assert!(state.join("pki/ca.pem").exists(), "{}", text(&o.stdout));
    assert!(text(&o.stdout).contains(&state.join("pki").display().to_string()));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn allotd_simulate_still_runs_and_points_to_allot_sim() {
    let o = Command::new(sibling("allotd", "allot-allocator"))
        .args(["simulate", "--days", "1", "--json"])
        .output()
        .expect("allotd runs");
    assert!(o.status.success(), "{}", text(&o.stderr));
    assert!(
        text(&o.stderr).contains("`allotd simulate` is now `allot-sim` (same options)"),
        "{}",
        text(&o.stderr)
    );
    let report: serde_json::Value = serde_json::from_slice(&o.stdout).expect("the report");
    assert_eq!(report["scenario"], "ai2", "{report}");
}
