//! The checkpoint ladder on real processes receiving real signals.

use allot_checkpoint_hooks::{run, Hook, Ladder, RunAs, Rung, Target};
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

struct Workload {
    child: Child,
    dir: PathBuf,
}

impl Workload {
    /// Starts `script` under sh in its own process group and waits until it says
    /// "ready" (its traps are set) on stdout.
    fn start(tag: &str, script: &str) -> Workload {
        let dir = std::env::temp_dir().join(format!("allot-ckpt-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let mut child = Command::new("sh")
            .arg("-c")
            .arg(script)
            .env("ALLOT_CHECKPOINT_DIR", &dir)
            .stdout(Stdio::piped())
            .process_group(0)
            .spawn()
            .expect("sh runs");
        let mut line = String::new();
        BufReader::new(child.stdout.as_mut().expect("stdout"))
            .read_line(&mut line)
            .expect("reads");
        assert_eq!(line.trim(), "ready");
        Workload { child, dir }
    }

    fn target(&self) -> Target {
        Target {
            lease: "lease-7".into(),
            pgid: self.child.id() as i32,
            cgroup: None,
            checkpoint_dir: self.dir.clone(),
            env: vec![(
                "ALLOT_CHECKPOINT_DIR".into(),
                self.dir.display().to_string(),
            )],
            run_as: RunAs::Agent,
        }
    }
}

impl Drop for Workload {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn ladder(hook: Option<&str>, grace_ms: u64) -> Ladder {
    Ladder {
        hook: hook.map(|h| h.parse().expect("valid hook")),
        grace: Duration::from_millis(grace_ms),
        term_grace: Duration::from_millis(grace_ms),
        marker: "checkpoint.done".into(),
        hook_hosts: Vec::new(),
    }
}

const LOOP: &str = "echo ready; while :; do sleep 0.05; done";

#[test]
fn signal_hook_checkpoint_then_exit() {
    let w = Workload::start(
        "exit",
        &format!("trap 'touch \"$ALLOT_CHECKPOINT_DIR/checkpoint.done\"; exit 0' USR1; {LOOP}"),
    );
    let o = run(&w.target(), &ladder(Some("signal:USR1"), 10_000));
    assert_eq!(
        (o.ended_by, o.checkpointed),
        (Rung::Checkpoint, true),
        "{o:?}"
    );
    assert_eq!(o.steps.len(), 1);
    assert!(o.steps[0].note.contains("sent SIGUSR1"), "{o:?}");
}

#[test]
fn checkpoint_written_but_still_running_ends_on_sigterm() {
    let w = Workload::start(
        "term",
        &format!("trap 'touch \"$ALLOT_CHECKPOINT_DIR/checkpoint.done\"' USR1; {LOOP}"),
    );
    let o = run(&w.target(), &ladder(Some("signal:USR1"), 10_000));
    assert_eq!((o.ended_by, o.checkpointed), (Rung::Term, true), "{o:?}");
    assert!(o.steps[0].note.contains("marker"), "{o:?}");
    assert_eq!(
        o.steps.iter().map(|s| s.rung).collect::<Vec<_>>(),
        [Rung::Checkpoint, Rung::Term]
    );
}

#[test]
fn a_workload_that_ignores_everything_is_killed() {
    let w = Workload::start("kill", &format!("trap '' USR1 TERM; {LOOP}"));
    let o = run(&w.target(), &ladder(Some("signal:USR1"), 300));
    assert_eq!((o.ended_by, o.checkpointed), (Rung::Kill, false), "{o:?}");
    assert!(o.steps[0].note.contains("grace"), "{o:?}");
    assert_eq!(
        o.steps.iter().map(|s| s.rung).collect::<Vec<_>>(),
        [Rung::Checkpoint, Rung::Term, Rung::Kill]
    );
    assert!(o.steps[1].took_ms >= 300, "SIGTERM had its grace: {o:?}");
}

#[test]
fn exec_hook_exit_zero_is_the_checkpoint() {
    let w = Workload::start("exec", LOOP);
    let hook = w.dir.join("hook.sh");
    std::fs::write(
        &hook,
        "#!/bin/sh\ntest -n \"$ALLOT_LEASE_ID\" && touch \"$ALLOT_CHECKPOINT_DIR/saved\"\n",
    )
    .expect("write");
    std::fs::set_permissions(&hook, std::os::unix::fs::PermissionsExt::from_mode(0o755))
        .expect("chmod");
    let o = run(
        &w.target(),
        &ladder(Some(&format!("exec:{}", hook.display())), 10_000),
    );
    assert_eq!((o.ended_by, o.checkpointed), (Rung::Term, true), "{o:?}");
    assert!(
        w.dir.join("saved").exists(),
        "the hook ran with the lease's environment"
    );
    // A failing hook escalates without a checkpoint.
    let w2 = Workload::start("exec-fail", LOOP);
    let o = run(&w2.target(), &ladder(Some("exec:false"), 10_000));
    assert_eq!((o.ended_by, o.checkpointed), (Rung::Term, false), "{o:?}");
    assert!(
        o.steps[0].note.starts_with("hook failed: false exited"),
        "{o:?}"
    );
    // A hook with no one it may run as is not run at all.
    let w3 = Workload::start("exec-nobody", LOOP);
    let t = Target {
        run_as: RunAs::Nobody("user \"gone\" is not known on this host".into()),
        ..w3.target()
    };
    let o = run(
        &t,
        &ladder(Some(&format!("exec:{}", hook.display())), 10_000),
    );
    assert_eq!((o.ended_by, o.checkpointed), (Rung::Term, false), "{o:?}");
    assert!(
        o.steps[0]
            .note
            .ends_with("not run: user \"gone\" is not known on this host"),
        "{o:?}"
    );
    assert!(!w3.dir.join("saved").exists(), "the hook never ran");
}

/// Answers one POST with `status`, returning the body it received.
fn http_once(status: &'static str) -> (String, std::thread::JoinHandle<String>) {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let url = format!("http://{}/checkpoint", l.local_addr().expect("addr"));
    let h = std::thread::spawn(move || {
        let (mut s, _) = l.accept().expect("a request");
        let mut buf = vec![0u8; 4096];
        let mut got = Vec::new();
        while !String::from_utf8_lossy(&got).contains("}") {
            let n = s.read(&mut buf).expect("read");
            if n == 0 {
                break;
            }
            got.extend_from_slice(&buf[..n]);
        }
        let _ = write!(
            s,
            "HTTP/1.1 {status}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
        );
        String::from_utf8_lossy(&got).into_owned()
    });
    (url, h)
}

#[test]
fn http_hook_acknowledges_or_fails() {
    let w = Workload::start("http", LOOP);
    let (url, h) = http_once("200 OK");
    let o = run(&w.target(), &ladder(Some(&format!("http:{url}")), 10_000));
    let req = h.join().expect("server");
    assert!(
        req.starts_with("POST /checkpoint") && req.contains("\"lease\":\"lease-7\""),
        "{req}"
    );
    assert_eq!((o.ended_by, o.checkpointed), (Rung::Term, true), "{o:?}");
    let w2 = Workload::start("http-503", LOOP);
    let (url, h) = http_once("503 Service Unavailable");
    let o = run(&w2.target(), &ladder(Some(&format!("http:{url}")), 10_000));
    h.join().expect("server");
    assert_eq!((o.ended_by, o.checkpointed), (Rung::Term, false), "{o:?}");
    assert!(o.steps[0].note.contains("HTTP 503"), "{o:?}");
}

#[test]
fn http_hooks_reach_only_loopback_and_the_allowed_hosts() {
    // 192.0.2.0/24 is TEST-NET-1: nothing answers there.
    let elsewhere = "http://192.0.2.1:9/checkpoint";
    let w = Workload::start("http-far", LOOP);
    let o = run(&w.target(), &ladder(Some(elsewhere), 10_000));
    assert_eq!((o.ended_by, o.checkpointed), (Rung::Term, false), "{o:?}");
    assert!(
        o.steps[0]
            .note
            .contains("reaches \"192.0.2.1\", which is neither loopback nor in [agent] hook_hosts"),
        "refused before any connection: {o:?}"
    );
    // A redirect from an allowed host is held to the same rule.
    let w2 = Workload::start("http-redirect", LOOP);
    let (url, h) = http_once("302 Found\r\nLocation: http://192.0.2.1:9/x");
    let o = run(&w2.target(), &ladder(Some(&format!("http:{url}")), 10_000));
    h.join().expect("server");
    assert_eq!((o.ended_by, o.checkpointed), (Rung::Term, false), "{o:?}");
    assert!(o.steps[0].note.contains("hook_hosts"), "{o:?}");
    // Named in hook_hosts, the host is called (and here, times out).
    let w3 = Workload::start("http-named", LOOP);
    let named = Ladder {
        hook_hosts: vec!["192.0.2.1".into()],
        ..ladder(Some(elsewhere), 300)
    };
    let o = run(&w3.target(), &named);
    assert!(
        o.steps[0]
            .note
            .starts_with("hook failed: POST http://192.0.2.1:9/checkpoint")
            && !o.steps[0].note.contains("hook_hosts"),
        "{o:?}"
    );
}

#[test]
fn no_hook_and_already_exited() {
    let w = Workload::start("nohook", LOOP);
    let o = run(&w.target(), &ladder(None, 10_000));
    assert_eq!((o.ended_by, o.steps.len()), (Rung::Term, 1), "{o:?}");
    let mut w2 = Workload::start("gone", "echo ready; exit 0");
    let _ = w2.child.wait();
    let o = run(&w2.target(), &ladder(Some("signal:USR1"), 10_000));
    assert_eq!((o.ended_by, o.steps.len()), (Rung::Exited, 0));
}

#[test]
fn hook_specs() {
    assert_eq!(
        "signal:USR1".parse::<Hook>(),
        Ok(Hook::Signal("SIGUSR1".into()))
    );
    assert_eq!(
        "signal:SIGTERM".parse::<Hook>(),
        Ok(Hook::Signal("SIGTERM".into()))
    );
    assert_eq!(
        "exec:/bin/ckpt --now".parse::<Hook>(),
        Ok(Hook::Exec(vec!["/bin/ckpt".into(), "--now".into()]))
    );
    // Arguments split like a shell: quotes keep spaces.
    assert_eq!(
        r#"exec:"/opt/my tools/ckpt" --tag 'run 7'"#.parse::<Hook>(),
        Ok(Hook::Exec(vec![
            "/opt/my tools/ckpt".into(),
            "--tag".into(),
            "run 7".into()
        ]))
    );
    // Both the spelled-out kind and a bare URL are accepted.
    assert_eq!(
        "http:http://x:1/a".parse::<Hook>(),
        Ok(Hook::Http("http://x:1/a".into()))
    );
    assert_eq!(
        "http://x:1/a".parse::<Hook>(),
        Ok(Hook::Http("http://x:1/a".into()))
    );
    for bad in [
        "signal:KILL",
        "signal:NOPE",
        "exec:",
        "exec:/bin/ckpt 'unclosed",
        "http:ftp://x",
        "sms:555",
    ] {
        let e = bad.parse::<Hook>().expect_err(bad);
        assert!(e.to_string().contains("use signal:USR1"), "{e}");
    }
}
