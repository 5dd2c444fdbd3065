//! Launching real workloads: environment, logs, own session, identity, and the
//! checkpoint ladder reaching the whole group.

use allot_agent::process::{group_and_session, identity, is_same, launch, Launch, ProcId};
use allot_checkpoint_hooks::{run, Ladder, Rung, Target};
use std::time::Duration;

fn launch_spec(tag: &str, script: &str) -> Launch {
    let dir = std::env::temp_dir().join(format!("allot-agent-{tag}-{}", std::process::id()));
    Launch {
        lease: format!("L-{tag}"),
        argv: vec!["sh".into(), "-c".into(), script.into()],
        gpus: vec!["GPU-aaaa".into(), "GPU-bbbb".into()],
        checkpoint_dir: dir.join("ckpt"),
        log_dir: dir.join("logs"),
        uid: None,
        gid: None,
        env: vec![("EXTRA".into(), "1".into())],
    }
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
    };
    let ladder = Ladder {
        hook: None,
        grace: Duration::from_secs(5),
        term_grace: Duration::from_secs(5),
        marker: "checkpoint.done".into(),
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
    l.argv = vec!["/nonexistent/train".into()];
    let e = launch(&l).expect_err("missing program");
    assert!(
        e.to_string()
            .contains("cannot start \"/nonexistent/train\""),
        "{e}"
    );
}
