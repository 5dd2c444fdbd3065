//! Launching real workloads: environment, logs, own session, identity, and the
//! checkpoint ladder reaching the whole group.

use allot_agent::os::{Os, RealOs};
use allot_agent::process::{group_and_session, identity, is_same, launch, Launch, ProcId};
use allot_checkpoint_hooks::{run, Ladder, RunAs, Rung, Target};
use std::os::unix::fs::MetadataExt;
use std::time::Duration;

fn launch_spec(tag: &str, script: &str) -> Launch {
    let dir = std::env::temp_dir().join(format!("allot-agent-{tag}-{}", std::process::id()));
    Launch {
        lease: format!("L-{tag}"),
        argv: vec!["sh".into(), "-c".into(), script.into()],
        gpus: vec!["GPU-aaaa".into(), "GPU-bbbb".into()],
        checkpoint_dir: dir.join("ckpt"),
        log_dir: dir.join("logs"),
        run_as: RunAs::Agent,
        env: vec![
            ("EXTRA".into(), "1".into()),
            ("PATH".into(), "/usr/bin:/bin".into()),
        ],
        cwd: None,
    }
}

#[test]
fn the_environment_is_whole_and_the_work_starts_in_its_directory() {
    let mut l = launch_spec("cwd", "pwd; env | sort");
    let dir = l.log_dir.parent().expect("test dir").join("work dir");
    std::fs::create_dir_all(&dir).expect("work dir");
    l.cwd = Some(dir.clone());
    let (mut child, _) = launch(&l).expect("starts");
    assert!(child.wait().expect("exits").success());
    let out = std::fs::read_to_string(l.log_dir.join("L-cwd.out")).expect("stdout log");
    let mut lines = out.lines();
    assert_eq!(lines.next(), Some(dir.to_str().expect("utf-8")), "{out}");
    let names: Vec<&str> = lines.filter_map(|v| v.split('=').next()).collect();
    // The given variables, the lease's own, and what sh sets itself: nothing of
    // this test process's environment (HOME, CARGO_*, …).
    for n in &names {
        assert!(
            [
                "EXTRA",
                "PATH",
                "CUDA_VISIBLE_DEVICES",
                "NVIDIA_VISIBLE_DEVICES",
                "ALLOT_LEASE_ID",
                "ALLOT_CHECKPOINT_DIR",
                "PWD",
                "SHLVL",
                "_",
                "OLDPWD",
            ]
            .contains(n),
            "{n} leaked into the workload: {out}"
        );
    }
    assert!(
        names.contains(&"EXTRA") && names.contains(&"ALLOT_LEASE_ID"),
        "{out}"
    );
}

#[test]
fn environment_logs_and_own_session() {
    let l = launch_spec("env", "echo \"$CUDA_VISIBLE_DEVICES|$NVIDIA_VISIBLE_DEVICES|$ALLOT_LEASE_ID|$EXTRA\"; echo oops >&2");
    let (mut child, id) = launch(&l).expect("starts");
    let status = child.wait().expect("exits");
    assert!(status.success());
    let out = std::fs::read_to_string(l.log_dir.join("L-env.out")).expect("stdout log");
    assert_eq!(out.trim(), "GPU-aaaa,GPU-bbbb|GPU-aaaa,GPU-bbbb|L-env|1");
    let err = std::fs::read_to_string(l.log_dir.join("L-env.err")).expect("stderr log");
    assert_eq!(err.trim(), "oops");
    assert!(id.start_ticks > 0);
    assert!(!is_same(id), "an exited, reaped process is gone");
}

#[test]
fn a_workload_leads_its_own_session_and_is_known_by_start_time() {
    let l = launch_spec("sess", "sleep 30");
    let (mut child, id) = launch(&l).expect("starts");
    assert_eq!(group_and_session(id.pid), Some((id.pid, id.pid)));
    assert!(is_same(id));
    assert_eq!(identity(id.pid), Some(id));
    // The same pid with another start time is another process: never signal it.
    let recycled = ProcId {
        pid: id.pid,
        start_ticks: id.start_ticks + 1,
    };
    assert!(!is_same(recycled));
    // The whole group: sh may have forked sleep rather than exec'd it.
    let _ = nix::sys::signal::killpg(
        nix::unistd::Pid::from_raw(id.pid),
        nix::sys::signal::Signal::SIGKILL,
    );
    let _ = child.wait();
}

#[test]
fn the_ladder_reaches_the_whole_group() {
    // The shell starts a child; SIGTERM to the group ends both.
    let l = launch_spec("ladder", "sleep 30 & wait");
    let (mut child, id) = launch(&l).expect("starts");
    let target = Target {
        lease: l.lease.clone(),
        pgid: id.pid,
        checkpoint_dir: l.checkpoint_dir.clone(),
        env: Vec::new(),
        run_as: RunAs::Agent,
    };
    let ladder = Ladder {
        hook: None,
        grace: Duration::from_secs(5),
        term_grace: Duration::from_secs(5),
        marker: "checkpoint.done".into(),
        hook_hosts: Vec::new(),
    };
    let o = run(&target, &ladder);
    assert_eq!(o.ended_by, Rung::Term, "{o:?}");
    let _ = child.wait();
    assert!(
        !allot_checkpoint_hooks::group_alive(id.pid),
        "no process of the group is left"
    );
}

#[test]
fn empty_commands_and_bad_programs_are_named() {
    let mut l = launch_spec("bad", "true");
    l.argv.clear();
    let e = launch(&l).expect_err("empty");
    assert!(e.to_string().contains("lease L-bad: empty command"), "{e}");
    l.argv = vec!["true".into()];
    l.run_as = RunAs::Nobody("user \"gone\" is not known on this host".into());
    let e = launch(&l).expect_err("no one to run as");
    assert!(
        e.to_string()
            .ends_with("cannot start \"true\": user \"gone\" is not known on this host"),
        "{e}"
    );
    assert!(!l.log_dir.exists(), "nothing is made for it");
    l.run_as = RunAs::Agent;
    l.argv = vec!["/nonexistent/train".into()];
    let e = launch(&l).expect_err("missing program");
    assert!(
        e.to_string()
            .contains("cannot start \"/nonexistent/train\""),
        "{e}"
    );
}

#[test]
fn a_workload_and_its_exec_hook_take_the_users_identity_and_groups() {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("skipped: switching user needs root");
        return;
    }
    let Some((uid, gid)) = allot_test_support::test_user("allot-test-a") else {
        return;
    };
    let extra = allot_test_support::group_id("allot-test-grp").expect("made with the user");
    let u = RealOs.user_by_name("allot-test-a").expect("known");
    // /proc/self/status: the real, effective, saved and fs ids, and every group.
    let mut l = launch_spec(
        "user",
        "grep -E '^(Uid|Gid|Groups):' /proc/self/status; echo \"$HOME\"; exec sleep 30",
    );
    let _ = std::fs::remove_dir_all(l.log_dir.parent().expect("dir"));
    l.run_as = RunAs::User(u.identity());
    l.env = u.env();
    let (mut child, id) = launch(&l).expect("starts");
    assert_eq!(
        group_and_session(id.pid),
        Some((id.pid, id.pid)),
        "its own session, as before"
    );
    let out =
        allot_test_support::wait_for("the workload's report", Duration::from_secs(10), || {
            std::fs::read_to_string(l.log_dir.join("L-user.out"))
                .ok()
                .filter(|o| o.lines().count() >= 4)
        });
    let field = |k: &str| -> Vec<String> {
        out.lines()
            .find_map(|x| x.strip_prefix(k))
            .unwrap_or_else(|| panic!("{k} in {out}"))
            .split_whitespace()
            .map(String::from)
            .collect()
    };
    assert_eq!(field("Uid:"), vec![uid.to_string(); 4], "{out}");
    assert_eq!(field("Gid:"), vec![gid.to_string(); 4], "{out}");
    let mut groups = field("Groups:");
    groups.sort();
    let mut want: Vec<String> = u.groups.iter().map(u32::to_string).collect();
    want.sort();
    assert_eq!(groups, want, "exactly the user's groups: {out}");
    assert!(groups.contains(&extra.to_string()), "{out}");
    assert!(!groups.contains(&"0".to_string()), "none of root's: {out}");
    assert!(out.contains("/home/allot-test-a"), "{out}");
    // The checkpoint dir the launch made is the user's; the log dir stays root's.
    assert_eq!(
        std::fs::metadata(&l.checkpoint_dir).expect("made").uid(),
        uid
    );
    assert_eq!(std::fs::metadata(&l.log_dir).expect("made").uid(), 0);

    // The exec hook runs through the same switch.
    let target = Target {
        lease: l.lease.clone(),
        pgid: id.pid,
        checkpoint_dir: l.checkpoint_dir.clone(),
        env: u.env(),
        run_as: RunAs::User(u.identity()),
    };
    let ladder = Ladder {
        hook: Some(
            "exec:/bin/sh -c 'id -u > \"$ALLOT_CHECKPOINT_DIR/hook-uid\"; id -G >> \"$ALLOT_CHECKPOINT_DIR/hook-uid\"'"
                .parse()
                .expect("hook"),
        ),
        grace: Duration::from_secs(10),
        term_grace: Duration::from_secs(5),
        marker: "checkpoint.done".into(),
        hook_hosts: Vec::new(),
    };
    let o = run(&target, &ladder);
    assert!(o.checkpointed, "{o:?}");
    let _ = child.wait();
    let hook = std::fs::read_to_string(l.checkpoint_dir.join("hook-uid")).expect("written");
    let mut lines = hook.lines();
    assert_eq!(lines.next(), Some(uid.to_string().as_str()), "{hook}");
    assert!(
        lines
            .next()
            .is_some_and(|g| g.split_whitespace().any(|g| g == extra.to_string())),
        "{hook}"
    );
}
