//! Interactive sessions that are not killed mid-thought (issue 41), through the
//! real CLI on a terminal of the test's own: `allot run --pty -- bash` is a real
//! shell on a PTY its supervisor holds (typing, window size, Ctrl-C and Ctrl-Z
//! reach it as a terminal's would); `~.` detaches and `allot attach` shows what
//! was printed meanwhile; an agent restart and an allotd restart leave the session
//! running for the next attach; an idle session of a class protected by use is
//! warned on its terminal and then reclaimed, while one being typed into is not.

mod support;

use allot_test_support::pty::Pty;
use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use support::{wait_for, Cluster};

const LONG: Duration = Duration::from_secs(60);

const GROUPS: &str =
    "[[group]]\nname = \"demo-a\"\nweight = 1\n[[group]]\nname = \"demo-b\"\nweight = 1\n";

/// `allot run --pty ... -- bash` on a new terminal, as the test user.
fn session(c: &Cluster, project: &str) -> Pty {
    let args = [
        "run",
        "--pty",
        "--project",
        project,
        "--gpus",
        "1",
        "--",
        "bash",
        "--norc",
        "--noprofile",
        "-i",
    ];
    let mut cmd = c.allot_command(&args);
    cmd.env("PS1", "sess$ ").env("TERM", "dumb");
    Pty::spawn(cmd, 24, 80)
}

/// `allot attach ID` on a new terminal.
fn attach(c: &Cluster, id: &str) -> Pty {
    attach_as(c, id, "dumb")
}

/// `allot attach ID` on a new terminal of type `term`.
fn attach_as(c: &Cluster, id: &str, term: &str) -> Pty {
    let mut cmd = c.allot_command(&["attach", id]);
    cmd.env("TERM", term);
    let mut p = Pty::spawn(cmd, 24, 80);
    p.expect("attached to workload", LONG);
    p
}

/// The id `allot run` printed, once the session is attached and its prompt shown.
fn started(p: &mut Pty) -> String {
    p.expect("submitted workload ", LONG);
    let id = p.until(" (", LONG);
    assert!(
        !id.is_empty() && id.chars().all(|c| c.is_ascii_digit()),
        "an id after `submitted workload`: {}",
        p.text()
    );
    p.expect("attached to workload", LONG);
    p.expect("sess$ ", LONG);
    id
}

/// Detaches with `~.` (after Enter): the CLI says so and exits 0.
fn detach(p: &mut Pty) {
    p.send(b"\r~.");
    p.expect("detached", LONG);
    assert!(p.wait(LONG).success(), "a detach exits 0: {}", p.text());
}

#[test]
fn a_session_is_a_real_terminal_and_attach_shows_what_it_printed_meanwhile() {
    let c = Cluster::start("sessions-pty", GROUPS, 1, 2);
    let mut p = session(&c, "demo-a");
    let id = started(&mut p);

    // Typed, run, printed: the arithmetic shows it is the output, not the echo.
    p.send(b"echo hi-$((40+2))\r");
    p.expect("hi-42", LONG);

    // The window's size reaches the program.
    // (asked in a loop: the new size travels beside the keys, not in front of them)
    p.send(b"until [ \"$(stty size)\" = '40 120' ]; do sleep 0.1; done; echo sized-$((4*10))\r");
    p.resize(40, 120);
    p.expect("sized-40", LONG);

    // Ctrl-C interrupts what runs in front, not the shell. The marker comes from
    // the program in front itself: a builtin `echo` before `sleep` would print
    // while the shell is still forking, and a ^C in that window is lost to bash.
    p.send(b"sh -c 'echo started-$((4*4)); exec sleep 100'\r");
    p.expect("started-16\r\n", LONG);
    p.send(b"\x03");
    p.send(b"echo alive-$((1+1))\r");
    p.expect("alive-2", Duration::from_secs(30));

    // Ctrl-Z stops it, and the shell's job control sees it.
    p.send(b"sh -c 'echo zz-$((6*6)); exec sleep 101'\r");
    p.expect("zz-36\r\n", LONG);
    p.send(b"\x1a");
    p.expect("Stopped", LONG);
    p.send(b"kill -9 %1; echo gone-$((5+5))\r");
    p.expect("gone-10", LONG);

    // Something that prints once the test says so, while nobody is attached.
    let go = c.dir.join("go");
    p.send(
        format!("(while [ ! -e {go:?} ]; do sleep 0.1; done; echo later-$((2*3))) &\r").as_bytes(),
    );
    detach(&mut p);
    std::fs::write(&go, "").expect("go");
    let mut shown = String::new();
    let printed = allot_test_support::try_wait_for(LONG, || {
        let out = c.allot(&["logs", &id]);
        shown = String::from_utf8_lossy(&out.stdout).into_owned();
        shown.contains("later-6").then_some(())
    });
    assert!(
        printed.is_some(),
        "the detached session printed nothing more; its log:\n{shown}\nits status: {}",
        c.status(&id)
    );

    let mut q = attach(&c, &id);
    q.expect("later-6", LONG);
    // The program's exit status is the command's.
    q.send(b"exit 3\r");
    assert_eq!(q.wait(LONG).code(), Some(3), "{}", q.text());
    let w = wait_for("the session to end", LONG, || {
        let w = c.status(&id);
        (w["state"] != "running").then_some(w)
    });
    assert_eq!(w["exit_code"], 3, "{w}");
}

#[test]
fn a_session_survives_an_agent_and_an_allotd_restart_and_attach_comes_back() {
    let mut c = Cluster::start("sessions-restart", GROUPS, 1, 2);
    let mut p = session(&c, "demo-a");
    let id = started(&mut p);
    p.send(b"X=kept-$((3*3))\r");
    p.send(b"echo set-$X\r");
    p.expect("set-kept-9", LONG);

    // The agent goes: the attach ends, saying how to come back; the shell lives on
    // in its supervisor.
    c.kill9_agent(0);
    p.expect("allot attach", LONG);
    assert!(!p.wait(LONG).success(), "a lost attach is not a success");
    c.start_agent(0, 2);
    c.wait_connected(1);
    let mut q = attach(&c, &id);
    q.send(b"echo agent-$X\r");
    q.expect("agent-kept-9", LONG);
    detach(&mut q);

    // allotd stops with an attach open: the stop takes no grace for it, the attach
    // ends saying how to come back, and allotd starts again on its port at once.
    let mut q = attach(&c, &id);
    let (took, status) = c.term_server();
    assert!(status.success(), "{status}");
    assert!(
        took < std::time::Duration::from_millis(2500),
        "SIGTERM with an attach open took {took:?}"
    );
    q.expect("allotd is stopping; the session runs on", LONG);
    assert!(!q.wait(LONG).success(), "{}", q.text());
    c.start_server();
    c.wait_connected(1);
    let mut r = attach(&c, &id);
    r.send(b"echo term-$X\r");
    r.expect("term-kept-9", LONG);
    detach(&mut r);

    // allotd goes and comes back: the same session, attached again.
    c.kill9_server();
    c.start_server();
    c.wait_connected(1);
    let mut r = attach(&c, &id);
    r.send(b"echo allotd-$X\r");
    r.expect("allotd-kept-9", LONG);
    r.send(b"exit\r");
    assert!(r.wait(LONG).success(), "{}", r.text());
}

#[test]
fn an_idle_session_is_warned_then_reclaimed_and_one_in_use_is_not() {
    // demo-b is owed most of the cluster: taking one GPU from demo-a for it is
    // fairer even after the move (the policy's hysteresis).
    let groups = GROUPS.replace(
        "name = \"demo-b\"\nweight = 1",
        "name = \"demo-b\"\nweight = 3",
    );
    let config = format!(
        "{groups}[classes.interactive]\nmin_runtime = \"1s\"\n[policy.protect_by_use.interactive]\nidle_grace = \"8s\"\n"
    );
    let c = Cluster::start("sessions-idle", &config, 1, 2);
    let mut busy = session(&c, "demo-a");
    let busy_id = started(&mut busy);

    // Someone types into one session every second, as a person at work would,
    // from its start: its grace runs from then, not from the second one's.
    let typing = Arc::new(AtomicBool::new(true));
    let mut keys = busy.keyboard();
    let on = typing.clone();
    let typist = std::thread::spawn(move || {
        while on.load(Ordering::Relaxed) {
            let _ = keys.write_all(b"\r");
            std::thread::sleep(Duration::from_secs(1));
        }
    });
    let mut idle = session(&c, "demo-a");
    let idle_id = started(&mut idle);

    // The other is told on its terminal, and in its history, that it may go.
    idle.expect("[allot] this session is idle for", LONG);
    let w = c.status(&idle_id);
    let history = w["history"].to_string();
    assert!(history.contains("no input since it started"), "{history}");
    assert!(history.contains("no longer protected"), "{history}");

    // Another project's work needs a GPU: the idle session's is taken, the one in
    // use keeps its own.
    // Funded work (a min runtime): free occupancy never takes funded GPUs.
    let other = c.submit(
        &["--project", "demo-b", "--gpus", "1", "--min-runtime", "1h"],
        "sleep 300",
    );
    let ran = allot_test_support::try_wait_for(LONG, || {
        (c.status(&other)["state"] == "running").then_some(())
    });
    assert!(
        ran.is_some(),
        "the other project's work waits: {}",
        c.status(&other)
    );
    let code = idle.wait(LONG).code();
    assert_ne!(
        code,
        Some(0),
        "a reclaimed session is no success: {}",
        idle.text()
    );
    let w = c.status(&idle_id);
    assert_ne!(w["state"], "running", "{w}");
    assert_eq!(c.status(&busy_id)["state"], "running");
    typing.store(false, Ordering::Relaxed);
    let _ = typist.join();
    let w = c.status(&busy_id);
    assert!(
        !w["history"].to_string().contains("no longer protected"),
        "the session in use was never warned: {w}"
    );
}

#[test]
fn a_requeued_tmux_session_finds_its_windows_again() {
    // A checkpoint directory every run of a workload sees (the agents' shared
    // checkpoint_root), as a site with resumable sessions has.
    let root = std::env::temp_dir().join(format!("allot-sessions-ckpt-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    let c = Cluster::start_metered_with(
        "sessions-resume",
        GROUPS,
        1,
        2,
        &format!("checkpoint_root = {root:?}\n"),
        None,
    );
    // The session's tmux server is named for its lease; none may be left from an
    // earlier run of this test (where no cgroup holds tmux, it outlives a session).
    let tmux = |lease: &str, args: &[&str]| {
        let out = std::process::Command::new("tmux")
            .args(["-L", &format!("allot-{lease}")])
            .args(args)
            .output()
            .expect("tmux runs");
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
        )
    };
    for lease in ["A-1", "A-2"] {
        tmux(lease, &["kill-server"]);
    }
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../checkpoint-hooks/scripts/allot-tmux-session")
        .canonicalize()
        .expect("the shipped hook");
    let script = script.display().to_string();
    let hook = format!("exec:{script} save");
    let args = [
        "run",
        "--pty",
        "--resumable",
        "--min-runtime",
        "1m",
        "--checkpoint",
        &hook,
        "--project",
        "demo-a",
        "--gpus",
        "1",
        // A shell of no one's dotfiles: the test is of the session, not of root's.
        "--env",
        "ALLOT_TMUX_SHELL=/bin/sh",
        "--",
        &script,
    ];
    let mut cmd = c.allot_command(&args);
    cmd.env("TERM", "xterm-256color").env("SHELL", "/bin/sh");
    let mut p = Pty::spawn(cmd, 30, 100);
    p.expect("submitted workload ", LONG);
    let id = p.until(" (", LONG);
    p.expect("attached to workload", LONG);
    let work = c.dir.join("work-here");
    std::fs::create_dir_all(&work).expect("a directory to work in");
    // Work in the window through tmux's own client (keys typed while tmux still
    // queries its terminal are tmux's).
    let lease = c.status(&id)["lease_ids"][0]
        .as_str()
        .expect("a lease")
        .to_string();
    wait_for("tmux's window", LONG, || {
        tmux(&lease, &["has-session", "-t", "main"]).0.then_some(())
    });
    // Typed once the shell shows its prompt, as a user would: keys typed before it
    // are echoed first, and the output then follows the prompt on its line.
    let pane = || tmux(&lease, &["capture-pane", "-p", "-t", "main"]).1;
    wait_for("the window's shell to show its prompt", LONG, || {
        (!pane().trim().is_empty()).then_some(())
    });
    let typed = format!("cd {work:?} && echo marker-$((6*7))");
    assert!(tmux(&lease, &["send-keys", "-t", "main", &typed, "Enter"]).0);
    let shown = allot_test_support::try_wait_for(LONG, || {
        // A line of output, not the command line that asked for it.
        pane()
            .lines()
            .any(|l| l.trim_end().ends_with("marker-42") && !l.contains("echo"))
            .then_some(())
    });
    assert!(
        shown.is_some(),
        "the window never showed the marker; it shows:\n{}",
        pane()
    );

    // Sent back to the queue: the hook saves the windows, then the session ends.
    let out = c.allot(&["requeue", &id]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let code = p.wait(LONG).code();
    assert_ne!(
        code,
        Some(0),
        "a requeued session is no success: {}",
        p.text()
    );
    let saved = wait_for("the saved windows", LONG, || {
        std::fs::read_dir(&root)
            .ok()?
            .flatten()
            .flat_map(|u| std::fs::read_dir(u.path()).into_iter().flatten().flatten())
            .map(|w| w.path().join("tmux/windows"))
            .find(|f| f.exists())
    });
    let windows = std::fs::read_to_string(&saved).expect("windows");
    assert!(windows.contains("work-here"), "{windows}");

    // It runs again, and its window comes back where it was, showing what it showed.
    wait_for("the second run", LONG, || {
        let w = c.status(&id);
        let runs = w["runs"].as_array().map_or(0, Vec::len);
        (w["state"] == "running" && runs == 2).then_some(())
    });
    let mut q = attach_as(&c, &id, "xterm-256color");
    q.expect("[allot-tmux-session: restored]", LONG);
    assert!(q.text().contains("marker-42"), "{}", q.text());
    let lease = c.status(&id)["lease_ids"][1]
        .as_str()
        .expect("a second lease")
        .to_string();
    let (_, path) = tmux(
        &lease,
        &[
            "display-message",
            "-p",
            "-t",
            "main",
            "#{pane_current_path}",
        ],
    );
    assert!(
        path.contains("work-here"),
        "the window is where it was: {path}"
    );
    let _ = std::fs::remove_dir_all(&root);
}

#[test]
fn run_without_a_terminal_streams_the_output_and_exits_with_its_status() {
    let c = Cluster::start("sessions-run", GROUPS, 1, 2);
    let out = c.allot(&[
        "run",
        "--project",
        "demo-a",
        "--gpus",
        "1",
        "--",
        "sh",
        "-c",
        "echo out-$((2+3)); exit 7",
    ]);
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert_eq!(
        out.status.code(),
        Some(7),
        "its status is the command's: {stderr}"
    );
    assert_eq!(stdout, "out-5\n", "stdout is the work's own: {stderr}");
    assert!(stderr.contains("submitted workload"), "{stderr}");
}
