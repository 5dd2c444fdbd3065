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
    Command::new(sibling("allot", "allot-cli"))
        .args(args)
        .env("ALLOT_SERVER", format!("https://{}", c.addr))
        .env("ALLOT_TOKEN", &c.token)
        .env("ALLOT_CA", c.ca())
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
    c.wait_state(&id, "running", LONG);
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
