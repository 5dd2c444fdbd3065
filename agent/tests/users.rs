//! Whom work runs as, end to end: the real agent (as root) starting real workloads
//! and exec hooks as the unprivileged test users (`allot-test-a`, made by `.ci/run`),
//! and refusing root and system users. Skipped, saying so, without root or the users
//! (never on CI: there a missing user fails).

mod support;

use allot_test_support::{group_id, test_user};
use std::os::unix::fs::MetadataExt;
use std::time::Duration;
use support::{is_root, TestAgent};

const LONG: Duration = Duration::from_secs(30);

/// uid and gid of `allot-test-a` and the id of its extra group, when this run can
/// act as it.
fn user_a() -> Option<(u32, u32, u32)> {
    if !is_root() {
        return None;
    }
    let (uid, gid) = test_user("allot-test-a")?;
    let extra = group_id("allot-test-grp").expect("allot-test-grp is made with the user");
    Some((uid, gid, extra))
}

fn stderr(o: &std::process::Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn work_and_its_exec_hook_run_as_the_user_with_groups_and_login_environment() {
    let Some((uid, gid, extra)) = user_a() else {
        return;
    };
    let a = TestAgent::start("user-a", "");
    let hook = "exec:/bin/sh -c 'echo \"$(id -u) $(id -G) $HOME $USER\" > \"$ALLOT_CHECKPOINT_DIR/hook-id\"'";
    let l = a.lease_start(
        &["--gpus", "1", "--user", "allot-test-a", "--checkpoint", hook],
        "id -u; id -g; id -G; echo \"$HOME|$USER|$LOGNAME|$SHELL\"; touch \"$ALLOT_CHECKPOINT_DIR/mine\"; echo started; exec sleep 600",
    );
    let id = l["id"].as_str().expect("lease id").to_string();
    assert_eq!(l["user"], "allot-test-a", "{l}");
    let out_log = a
        .dir
        .join("state/logs/allot-test-a")
        .join(&id)
        .join("0.0.out");
    let out = support::wait_for("the workload's report", LONG, || {
        std::fs::read_to_string(&out_log)
            .ok()
            .filter(|o| o.contains("started"))
    });
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines[0], uid.to_string(), "{out}");
    assert_eq!(lines[1], gid.to_string(), "{out}");
    let groups: Vec<&str> = lines[2].split_whitespace().collect();
    assert!(
        groups.contains(&gid.to_string().as_str()) && groups.contains(&extra.to_string().as_str()),
        "its supplementary groups, allot-test-grp ({extra}) included: {out}"
    );
    assert_eq!(
        lines[3], "/home/allot-test-a|allot-test-a|allot-test-a|/bin/bash",
        "{out}"
    );
    // The checkpoint dir is the user's (the workload wrote into it), and so is its
    // output file; the lease dir and the log dir stay root's.
    let ckpt = a.checkpoint_dir(&id);
    assert_eq!(std::fs::metadata(&ckpt).expect("ckpt dir").uid(), uid);
    assert_eq!(
        std::fs::metadata(&ckpt).expect("ckpt dir").mode() & 0o777,
        0o700,
        "a checkpoint is its user's alone"
    );
    assert!(ckpt.join("mine").exists());
    assert_eq!(
        std::fs::metadata(ckpt.parent().expect("lease dir"))
            .expect("lease dir")
            .uid(),
        0
    );
    assert_eq!(std::fs::metadata(&out_log).expect("log").uid(), uid);
    assert_eq!(
        std::fs::metadata(out_log.parent().expect("log dir"))
            .expect("log dir")
            .uid(),
        0
    );

    a.json(&["lease", "revoke", &id, "--now", "--json"]);
    let ended = a.wait_ended(&id, LONG);
    assert_eq!(ended["steps"][0]["rung"], "checkpoint", "{ended}");
    let hook_id = std::fs::read_to_string(ckpt.join("hook-id")).expect("the hook ran");
    let f: Vec<&str> = hook_id.split_whitespace().collect();
    assert_eq!(f.first(), Some(&uid.to_string().as_str()), "{hook_id}");
    assert!(f.contains(&extra.to_string().as_str()), "{hook_id}");
    assert_eq!(
        f.get(f.len().saturating_sub(2)..),
        Some(&["/home/allot-test-a", "allot-test-a"][..]),
        "{hook_id}"
    );
}

#[test]
fn root_work_is_refused_by_default_and_runs_when_allowed() {
    if !is_root() {
        return;
    }
    let a = TestAgent::start_without_root("no-root", "");
    let out = a.allot(&["lease", "start", "--gpus", "1", "--", "true"]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("user: \"root\" (uid 0) may not run work on this host; set [agent] allow_root = true in agent.toml to allow it"),
        "{}",
        stderr(&out)
    );
    assert_eq!(
        a.json(&["leases", "--all", "--json"]),
        serde_json::json!([])
    );
    // A user's work still runs there.
    if test_user("allot-test-b").is_some() {
        let l = a.lease_start(&["--gpus", "1", "--user", "allot-test-b"], "true");
        assert_eq!(l["user"], "allot-test-b", "{l}");
    }
    drop(a);

    let a = TestAgent::start("root", "");
    let l = a.lease_start(&["--gpus", "1"], "id -u; exec sleep 600");
    assert_eq!(l["user"], "root", "{l}");
}

#[test]
fn system_users_and_unknown_users_are_refused_naming_why() {
    if !is_root() {
        return;
    }
    let a = TestAgent::start("sys-user", "");
    // `daemon` is uid 1 on Debian and its relatives.
    let out = a.allot(&[
        "lease", "start", "--gpus", "1", "--user", "daemon", "--", "true",
    ]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("user: \"daemon\" (uid 1) may not run work on this host: uids below [agent] min_uid = 1000 are the system's; lower min_uid in agent.toml to allow it"),
        "{}",
        stderr(&out)
    );
    let out = a.allot(&[
        "lease",
        "start",
        "--gpus",
        "1",
        "--user",
        "allot-no-such-user",
        "--",
        "true",
    ]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("no user \"allot-no-such-user\" on this host"),
        "{}",
        stderr(&out)
    );
    assert_eq!(
        a.json(&["leases", "--all", "--json"]),
        serde_json::json!([])
    );
}

/// A job running as a normal user writes its own checkpoint marker (the checkpoint
/// dir is the user's), so the ladder ends at the marker, never at SIGTERM.
#[test]
fn a_non_root_jobs_checkpoint_marker_ends_the_ladder_at_the_checkpoint() {
    let Some((uid, _, _)) = user_a() else {
        return;
    };
    let a = TestAgent::start("user-marker", "");
    let l = a.lease_start(
        &[
            "--gpus",
            "1",
            "--min-runtime",
            "0s",
            "--user",
            "allot-test-a",
            "--checkpoint",
            "signal:USR1",
            "--grace",
            "20s",
        ],
        r#"trap 'id -u > "$ALLOT_CHECKPOINT_DIR/by"; touch "$ALLOT_CHECKPOINT_DIR/checkpoint.done"; kill $P; exit 0' USR1
touch "$ALLOT_CHECKPOINT_DIR/ready"
sleep 600 & P=$!
while :; do wait $P; done"#,
    );
    let id = l["id"].as_str().expect("lease id").to_string();
    let ckpt = a.checkpoint_dir(&id);
    support::wait_for("the job to be ready", LONG, || {
        ckpt.join("ready").exists().then_some(())
    });
    a.json(&["lease", "revoke", &id, "--now", "--json"]);
    let ended = a.wait_ended(&id, LONG);
    assert_eq!(ended["ended_by"], "checkpoint", "{ended}");
    assert_eq!(ended["steps"][0]["rung"], "checkpoint", "{ended}");
    assert!(
        ended["steps"][0]["note"]
            .as_str()
            .is_some_and(|n| n.contains("marker")),
        "{ended}"
    );
    let by = std::fs::read_to_string(ckpt.join("by")).expect("the job wrote it");
    assert_eq!(by.trim(), uid.to_string());
    assert_eq!(
        std::fs::metadata(ckpt.join("checkpoint.done"))
            .expect("marker")
            .uid(),
        uid
    );
}
