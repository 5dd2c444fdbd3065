//! Launching real workloads under their supervisor: environment, logs, own session,
//! identity, the checkpoint ladder reaching the whole group, and (where this host has
//! a writable cgroup v2 mount, which CI must) the whole process tree through the
//! lease's cgroup, and the output cap.

mod support;

use allot_agent::os::{Os, RealOs};
use allot_agent::process::{launch, Launch};
use allot_agent::procid::{group_and_session, identity, is_same, ProcId};
use allot_agent::supervisor::{exit_file, read_exit, Exit, Started};
use allot_checkpoint_hooks::{run, Ladder, RunAs, Rung, Target};
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::time::Duration;

fn launch_spec(tag: &str, script: &str) -> Launch {
    let dir = std::env::temp_dir().join(format!("allot-agent-{tag}-{}", std::process::id()));
    Launch {
        lease: format!("L-{tag}"),
        argv: vec!["sh".into(), "-c".into(), script.into()],
        gpus: vec!["GPU-aaaa".into(), "GPU-bbbb".into()],
        checkpoint_dir: dir.join("ckpt"),
        lease_dir: dir.join("lease"),
        out_log: dir.join("logs").join(format!("L-{tag}.out")),
        err_log: dir.join("logs").join(format!("L-{tag}.err")),
        out_users_own: false,
        err_users_own: false,
        cap_bytes: 1 << 30,
        cgroup: None,
        limits: Default::default(),
        supervisor: env!("CARGO_BIN_EXE_allot-agent").into(),
        run_as: RunAs::Agent,
        env: vec![
            ("EXTRA".into(), "1".into()),
            ("PATH".into(), "/usr/bin:/bin".into()),
        ],
        cwd: None,
        script: String::new(),
        pty: false,
        fence: None,
    }
}

fn logs(l: &Launch) -> PathBuf {
    l.out_log.parent().expect("log dir").to_path_buf()
}

/// Waits for the supervisor and returns how the job ended.
fn finish(l: &Launch, mut s: Started) -> Exit {
    s.supervisor.wait().expect("the supervisor is reaped");
    read_exit(&exit_file(&l.lease_dir)).expect("exit.json written")
}

/// A cgroup for test `tag`, under an agent directory of its own; `None` where this
/// host has no writable cgroup v2 mount (a failure under CI=true).
fn test_cgroup(tag: &str) -> Option<PathBuf> {
    let state = std::env::temp_dir().join(format!("allot-cg-{tag}-{}", std::process::id()));
    match allot_agent::cgroup::discover("auto", "launch-test", &state) {
        allot_agent::cgroup::Placement::At(base) => Some(base.join(format!("L-{tag}"))),
        allot_agent::cgroup::Placement::Off(why) => {
            assert!(
                std::env::var("CI").as_deref() != Ok("true"),
                "CI=true: this host must give leases cgroups: {why}"
            );
            eprintln!("skipped: {why}");
            None
        }
    }
}

/// Removes a test's cgroups when it ends, passed or not: the lease's (its processes
/// killed), then the agent directory above it.
struct RemoveCgroup(PathBuf);

impl Drop for RemoveCgroup {
    fn drop(&mut self) {
        let cg = allot_checkpoint_hooks::cgroup::Cgroup::at(&self.0);
        cg.kill();
        let _ = cg.remove();
        if let Some(base) = self.0.parent() {
            let _ = std::fs::remove_dir(base);
        }
    }
}

#[test]
fn a_supervisor_without_word_from_allotd_stops_its_job_by_the_ladder() {
    // The host's last word from allotd is 2 s old at the start and never renewed:
    // the 3 s fence runs the ladder (the hook's signal, then SIGTERM) about 1 s in.
    let mut l = launch_spec(
        "fence",
        "trap 'echo checkpoint; exit 0' USR1; while :; do sleep 0.1; done",
    );
    let dir = l.lease_dir.parent().expect("test dir").to_path_buf();
    std::fs::create_dir_all(&dir).expect("dir");
    allot_agent::fence::write(&dir, allot_agent::fence::boot_ms() - 2_000).expect("contact");
    l.fence = Some(allot_agent::fence::Fence {
        contact: dir.join(allot_agent::fence::FILE),
        after_s: 3,
        hook: "signal:USR1".into(),
        grace_s: 5,
        term_grace_s: 2,
        checkpoint_dir: l.checkpoint_dir.clone(),
        hook_hosts: Vec::new(),
    });
    let t0 = std::time::Instant::now();
    let s = launch(&l).expect("starts");
    let e = finish(&l, s);
    let took = t0.elapsed();
    assert_eq!(e.code, Some(0), "it checkpointed and exited: {e:?}");
    let why = e.fenced.clone().expect("the end says it was fenced");
    assert!(why.contains("no word from allotd for 3s"), "{why}");
    assert!(e.detail().contains("fenced"), "{}", e.detail());
    assert!(
        took >= Duration::from_millis(900) && took < Duration::from_secs(8),
        "{took:?}"
    );
    let out = std::fs::read_to_string(&l.out_log).expect("stdout log");
    assert!(out.contains("checkpoint"), "{out}");

    // A word renewed as it goes keeps the job: it ends by itself.
    let mut l = launch_spec("fence-kept", "sleep 2; exit 3");
    let dir = l.lease_dir.parent().expect("test dir").to_path_buf();
    std::fs::create_dir_all(&dir).expect("dir");
    allot_agent::fence::write(&dir, allot_agent::fence::boot_ms()).expect("contact");
    l.fence = Some(allot_agent::fence::Fence {
        contact: dir.join(allot_agent::fence::FILE),
        after_s: 1,
        hook: String::new(),
        grace_s: 1,
        term_grace_s: 1,
        checkpoint_dir: l.checkpoint_dir.clone(),
        hook_hosts: Vec::new(),
    });
    let s = launch(&l).expect("starts");
    let renew = std::thread::spawn(move || {
        for _ in 0..12 {
            let _ = allot_agent::fence::write(&dir, allot_agent::fence::boot_ms());
            std::thread::sleep(Duration::from_millis(200));
        }
    });
    let e = finish(&l, s);
    renew.join().expect("renewer");
    assert_eq!((e.code, e.fenced.as_deref()), (Some(3), None), "{e:?}");
}

#[test]
fn the_environment_is_whole_and_the_work_starts_in_its_directory() {
    let mut l = launch_spec("cwd", "pwd; env | sort");
    let dir = l.lease_dir.parent().expect("test dir").join("work dir");
    std::fs::create_dir_all(&dir).expect("work dir");
    l.cwd = Some(dir.clone());
    let s = launch(&l).expect("starts");
    assert_eq!(finish(&l, s).code, Some(0));
    let out = std::fs::read_to_string(&l.out_log).expect("stdout log");
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
    let s = launch(&l).expect("starts");
    let id = s.job;
    let exit = finish(&l, s);
    assert_eq!((exit.code, exit.output_cut), (Some(0), false), "{exit:?}");
    let out = std::fs::read_to_string(&l.out_log).expect("stdout log");
    assert_eq!(out.trim(), "GPU-aaaa,GPU-bbbb|GPU-aaaa,GPU-bbbb|L-env|1");
    let err = std::fs::read_to_string(&l.err_log).expect("stderr log");
    assert_eq!(err.trim(), "oops");
    assert!(id.start_ticks > 0);
    assert!(!is_same(id), "an exited, reaped process is gone");
}

#[test]
fn a_workload_leads_its_own_session_and_is_known_by_start_time() {
    let l = launch_spec("sess", "sleep 30");
    let s = launch(&l).expect("starts");
    let id = s.job;
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
    assert_eq!(finish(&l, s).signal, Some(9));
}

#[test]
fn the_ladder_reaches_the_whole_group() {
    // The shell starts a child; SIGTERM to the group ends both.
    let l = launch_spec("ladder", "sleep 30 & wait");
    let s = launch(&l).expect("starts");
    let id = s.job;
    let target = Target {
        lease: l.lease.clone(),
        pgid: id.pid,
        cgroup: None,
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
    assert_eq!(finish(&l, s).signal, Some(15));
    assert!(
        !allot_checkpoint_hooks::group_alive(id.pid),
        "no process of the group is left"
    );
}

#[test]
fn a_log_file_of_someone_else_is_never_opened_for_a_job() {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("skipped: giving a file to another user needs root");
        return;
    }
    let l = launch_spec("foreign", "echo mine");
    let _ = std::fs::remove_dir_all(l.lease_dir.parent().expect("dir"));
    std::fs::create_dir_all(logs(&l)).expect("log dir");
    // Another user's output where this job's would go (a pattern naming it).
    std::fs::write(&l.out_log, "theirs\n").expect("their file");
    std::os::unix::fs::chown(&l.out_log, Some(4242), Some(4242)).expect("chown");
    let e = launch(&l).expect_err("refused");
    assert!(
        e.to_string()
            .contains("exists and is not this job's user's own file (uid 4242, 1 link(s))"),
        "{e}"
    );
    assert_eq!(
        std::fs::read_to_string(&l.out_log).expect("kept"),
        "theirs\n"
    );
    // A second name for a file of the agent's is refused too.
    std::fs::remove_file(&l.out_log).expect("rm");
    let agents = logs(&l).join("agent-owned");
    std::fs::write(&agents, "agent\n").expect("w");
    std::fs::hard_link(&agents, &l.out_log).expect("link");
    let e = launch(&l).expect_err("refused");
    assert!(e.to_string().contains("2 link(s)"), "{e}");
    // Its own file from an earlier run is appended to.
    std::fs::remove_file(&l.out_log).expect("rm");
    std::fs::write(&l.out_log, "run 1\n").expect("w");
    let s = launch(&l).expect("starts");
    assert_eq!(finish(&l, s).code, Some(0));
    assert_eq!(
        std::fs::read_to_string(&l.out_log).expect("log"),
        "run 1\nmine\n"
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
    assert!(!logs(&l).exists(), "nothing is made for it");
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
fn a_batch_script_is_written_for_its_user_alone_and_run_with_its_arguments() {
    if !nix::unistd::geteuid().is_root() {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "CI runs the tests as root: running as another user needs it"
        );
        eprintln!("skipped: switching user needs root");
        return;
    }
    let Some((uid, _)) = allot_test_support::test_user("allot-test-a") else {
        return;
    };
    let u = RealOs.user_by_name("allot-test-a").expect("known");
    let mut l = launch_spec("script", "unused");
    let _ = std::fs::remove_dir_all(l.lease_dir.parent().expect("dir"));
    l.argv = vec!["first".into(), "two words".into()];
    l.script = "#!/bin/sh\necho \"me=$(id -u) args=$# $1|$2 at=$0\"\n".into();
    l.run_as = RunAs::User(u.identity());
    l.env = u.env();
    let s = launch(&l).expect("starts");
    let exit = finish(&l, s);
    assert_eq!(exit.code, Some(0), "{exit:?}");
    let out = std::fs::read_to_string(&l.out_log).expect("output");
    let path = l.lease_dir.join("job/script");
    assert_eq!(
        out.trim(),
        format!("me={uid} args=2 first|two words at={}", path.display())
    );
    let meta = std::fs::metadata(&path).expect("kept");
    assert_eq!((meta.uid(), meta.mode() & 0o777), (uid, 0o700));
    let dir = std::fs::metadata(path.parent().expect("dir")).expect("dir");
    assert_eq!(
        (dir.uid(), dir.mode() & 0o777),
        (uid, 0o700),
        "no one else reads it"
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
    let _ = std::fs::remove_dir_all(l.lease_dir.parent().expect("dir"));
    l.run_as = RunAs::User(u.identity());
    l.env = u.env();
    let s = launch(&l).expect("starts");
    let id = s.job;
    assert_eq!(
        group_and_session(id.pid),
        Some((id.pid, id.pid)),
        "its own session, as before"
    );
    let out =
        allot_test_support::wait_for("the workload's report", Duration::from_secs(10), || {
            std::fs::read_to_string(&l.out_log)
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
    // The checkpoint dir the launch made is the user's, and so are the log files;
    // the log dir stays root's.
    assert_eq!(
        std::fs::metadata(&l.checkpoint_dir).expect("made").uid(),
        uid
    );
    assert_eq!(std::fs::metadata(logs(&l)).expect("made").uid(), 0);
    assert_eq!(std::fs::metadata(&l.out_log).expect("made").uid(), uid);

    // The exec hook runs through the same switch.
    let target = Target {
        lease: l.lease.clone(),
        pgid: id.pid,
        cgroup: None,
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
    finish(&l, s);
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

/// The pids of every live process (zombies waiting for init aside) whose
/// `/proc/PID/cgroup` names `dir` (relative to the cgroup2 mount).
fn in_cgroup(dir: &std::path::Path) -> Vec<i32> {
    let rel = std::fs::read_to_string("/proc/self/mountinfo")
        .ok()
        .and_then(|m| allot_checkpoint_hooks::cgroup::mount_point(&m))
        .and_then(|m| {
            dir.strip_prefix(m)
                .ok()
                .map(|r| format!("0::/{}", r.display()))
        })
        .expect("under the cgroup2 mount");
    std::fs::read_dir("/proc")
        .expect("/proc")
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/cgroup"))
                .is_ok_and(|c| c.lines().any(|l| l == rel))
                && identity(*pid).is_some()
        })
        .collect()
}

#[test]
fn nothing_of_a_job_outlives_its_lease_whatever_it_did_with_sessions() {
    let Some(cg) = test_cgroup("escape") else {
        return;
    };
    let _cleanup = RemoveCgroup(cg.clone());
    let mut l = launch_spec("escape", support::ESCAPING_JOB);
    l.cgroup = Some(cg.clone());
    let s = launch(&l).expect("starts");
    let id = s.job;
    // sh, two sleeps, a python, and the daemon (its parents exit at once); three of
    // them out of the job's process group.
    let pids = allot_test_support::wait_for(
        "five processes, three out of the job's group",
        Duration::from_secs(20),
        || {
            let p = in_cgroup(&cg);
            let out = p
                .iter()
                .filter(|p| group_and_session(**p).is_some_and(|(g, s)| g != id.pid || s != id.pid))
                .count();
            (p.len() >= 5 && out >= 3).then_some(p)
        },
    );
    let target = Target {
        lease: l.lease.clone(),
        pgid: id.pid,
        cgroup: Some(cg.clone()),
        checkpoint_dir: l.checkpoint_dir.clone(),
        env: Vec::new(),
        run_as: RunAs::Agent,
    };
    let ladder = Ladder {
        hook: None,
        grace: Duration::from_secs(1),
        term_grace: Duration::from_secs(2),
        marker: "checkpoint.done".into(),
        hook_hosts: Vec::new(),
    };
    let o = run(&target, &ladder);
    // SIGTERM ends sh; its supervisor then ends the rest with cgroup.kill (the daemon
    // ignores SIGTERM), or the ladder's own cgroup.kill does.
    assert!(matches!(o.ended_by, Rung::Term | Rung::Kill), "{o:?}");
    let exit = finish(&l, s);
    assert_eq!(exit.signal, Some(15), "{exit:?}");
    for p in &pids {
        assert!(
            identity(*p).is_none(),
            "pid {p} outlived its lease: {:?}",
            std::fs::read_to_string(format!("/proc/{p}/cmdline"))
        );
    }
    assert!(in_cgroup(&cg).is_empty());
}

/// Limits go to the cgroup where its controllers are; where they are not (this
/// build machine's cgroup2 mount has none) the start says which were not applied.
#[test]
fn limits_not_applied_are_named_at_the_start() {
    let cg = test_cgroup("limits");
    let _cleanup = cg.clone().map(RemoveCgroup);
    let mut l = launch_spec("limits", "sleep 1");
    l.cgroup = cg.clone();
    l.limits = allot_checkpoint_hooks::cgroup::Limits {
        cpu_millis: Some(2_000),
        memory_bytes: Some(1 << 30),
    };
    let s = launch(&l).expect("starts");
    let notes = s.notes.clone();
    // The lease's own controllers, read before its supervisor removes it.
    let have = cg
        .as_ref()
        .map(|c| allot_checkpoint_hooks::cgroup::Cgroup::at(c).controllers())
        .unwrap_or_default();
    finish(&l, s);
    if cg.is_none() {
        assert_eq!(
            notes,
            vec!["no cgroup for this lease: its cpu and memory limits are not applied"]
        );
        return;
    }
    for (controller, file) in [("memory", "memory.max"), ("cpu", "cpu.max")] {
        let missed = notes
            .iter()
            .any(|n| n.starts_with(&format!("{file} not set")));
        assert_eq!(
            missed,
            !have.iter().any(|h| h == controller),
            "{file}: {notes:?} with controllers {have:?}"
        );
    }
}

#[test]
fn a_job_that_writes_without_end_is_cut_at_its_cap_with_a_note() {
    let cg = test_cgroup("cap");
    let _cleanup = cg.clone().map(RemoveCgroup);
    let mut l = launch_spec(
        "cap",
        "yes allot | head -c 3000000; echo to-stderr >&2; exit 4",
    );
    l.cap_bytes = 1 << 20;
    l.cgroup = cg.clone();
    let _ = std::fs::remove_dir_all(l.lease_dir.parent().expect("dir"));
    let s = launch(&l).expect("starts");
    if let Some(cg) = &cg {
        let pids = in_cgroup(cg);
        assert!(
            pids.contains(&s.job.pid) || !is_same(s.job),
            "the job runs in its lease's cgroup: {pids:?}"
        );
    }
    let exit = finish(&l, s);
    assert_eq!(
        (exit.code, exit.output_cut, exit.output_bytes),
        (Some(4), true, 1 << 20),
        "{exit:?}"
    );
    assert!(
        exit.detail().contains("output cut at 1048576 bytes"),
        "{exit:?}"
    );
    let out = std::fs::read(&l.out_log).expect("stdout");
    let err = std::fs::read(&l.err_log).expect("stderr");
    let note = "[allot: output cut at 1048576 bytes ([agent] max_output_bytes)";
    let text = String::from_utf8_lossy(&out);
    assert!(text.contains(note), "the note ends the file");
    assert!(
        text.starts_with("allot\nallot\n"),
        "the first bytes are kept"
    );
    // Both streams share one cap: the stderr line came after it was spent, and
    // stdout holds exactly the cap and the note.
    let whole = format!("\n{note}; the rest of this run's output was discarded]\n");
    assert_eq!(out.len(), (1 << 20) + whole.len());
    assert!(text.ends_with(&whole));
    assert!(err.is_empty(), "{:?}", String::from_utf8_lossy(&err));
}

/// Reads frames from a session's socket until `want` is in the output or the
/// program's end comes; returns the output and the end.
fn read_until(
    conn: &mut std::os::unix::net::UnixStream,
    want: &str,
) -> (String, Option<allot_agent::tty::Ended>) {
    use allot_agent::tty::{read_frame, Frame};
    let mut seen = String::new();
    while let Ok(Some(f)) = read_frame(conn) {
        match f {
            Frame::Data(d) => seen.push_str(&String::from_utf8_lossy(&d)),
            Frame::Exit(e) => return (seen, Some(e)),
            _ => {}
        }
        if !want.is_empty() && seen.contains(want) {
            break;
        }
    }
    (seen, None)
}

#[test]
fn a_session_runs_on_a_terminal_its_supervisor_holds() {
    use allot_agent::tty::{socket_path, Frame};
    use std::io::Write;
    use std::os::unix::net::UnixStream;
    let mut l = launch_spec(
        "pty",
        "echo tty-$(tty | cut -c1-8); read a; stty size; read b; echo got-$b; exit 5",
    );
    l.pty = true;
    let s = launch(&l).expect("starts");
    let sock = socket_path(&l.lease_dir);
    let mut c = UnixStream::connect(&sock).expect("the supervisor listens");
    // A real terminal: the job's stdin is one.
    let (seen, _) = read_until(&mut c, "tty-/dev/pts");
    assert!(seen.contains("tty-/dev/pts"), "{seen}");
    c.write_all(&Frame::Resize(33, 101).encode())
        .expect("resize");
    c.write_all(&Frame::Data(b"\r".to_vec()).encode())
        .expect("type");
    let (seen, _) = read_until(&mut c, "33 101");
    assert!(
        seen.contains("33 101"),
        "the window reaches the program: {seen}"
    );
    drop(c);

    // A second attach replays what was printed before it.
    let mut c = UnixStream::connect(&sock).expect("attach again");
    let (seen, _) = read_until(&mut c, "33 101");
    assert!(seen.contains("tty-/dev/pts"), "replayed: {seen}");
    c.write_all(&Frame::Notice("a word from allot".into()).encode())
        .expect("notice");
    let (seen, _) = read_until(&mut c, "a word from allot");
    assert!(seen.contains("[allot] a word from allot"), "{seen}");
    c.write_all(&Frame::Data(b"xyz\r".to_vec()).encode())
        .expect("type");
    let (seen, end) = read_until(&mut c, "");
    assert!(seen.contains("got-xyz"), "{seen}");
    assert_eq!(end.and_then(|e| e.code), Some(5), "{seen}");
    let e = finish(&l, s);
    assert_eq!(e.code, Some(5), "{e:?}");
    let log = std::fs::read_to_string(&l.out_log).expect("the terminal's log");
    assert!(
        log.contains("got-xyz"),
        "the terminal is the stdout log: {log}"
    );
    assert!(!sock.exists(), "the socket goes with the session");
}
