//! `allotd dev` as a person uses it: its ports, its env file, and how it stops.

mod support;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use support::{sibling, wait_for};

const LONG: Duration = Duration::from_secs(60);

fn dev(dir: &std::path::Path, listen: &str) -> Command {
    // The agents must be beside allotd, as in a release build.
    sibling("allot-agent", "allot-agent");
    sibling("allot", "allot-cli");
    let mut c = Command::new(env!("CARGO_BIN_EXE_allotd"));
    c.args([
        "dev",
        "--nodes",
        "1",
        "--gpus-per-node",
        "2",
        "--listen",
        listen,
    ])
    .arg("--state-dir")
    .arg(dir)
    .stdout(Stdio::null())
    .stderr(Stdio::piped());
    c
}

fn temp(tag: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("allot-dev-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

#[test]
fn a_busy_port_fails_before_any_agent_starts() {
    let held = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = held.local_addr().expect("addr").to_string();
    let dir = temp("busy");
    let out = dev(&dir, &addr).output().expect("allotd runs");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("server.listen") && err.contains(&addr),
        "{err}"
    );
    assert!(
        !dir.join("agents/node-1/agent.log").exists(),
        "no agent may start (it would join whoever holds the port)"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// `allotd dev`, stopped (with its agents) if the test ends before it does.
struct Running(std::process::Child);

impl Drop for Running {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(self.0.id() as i32),
                nix::sys::signal::Signal::SIGTERM,
            );
            let _ = self.0.wait();
        }
    }
}

#[test]
fn the_env_file_works_from_anywhere_and_sigterm_stops_everything() {
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        l.local_addr().expect("addr").port()
    };
    let addr = format!("127.0.0.1:{port}");
    let dir = temp("env");
    let mut child = Running(
        dev(&dir, &addr)
            .stderr(Stdio::null())
            .spawn()
            .expect("allotd dev starts"),
    );
    let env = dir.join("env");
    let text = wait_for("STATE_DIR/env", LONG, || std::fs::read_to_string(&env).ok());
    assert!(
        text.contains(&format!("ALLOT_SERVER=https://{addr}"))
            && text.contains("ALLOT_CA=")
            && text.contains("ALLOT_TOKEN=allot_"),
        "{text}"
    );
    // It holds the token: for its owner only.
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&env).expect("env").permissions().mode();
    assert_eq!(mode & 0o077, 0, "env file mode {mode:o}");
    // Sourced from another directory, the CLI finds the cluster and the agent.
    let out = wait_for("the node to connect through the env file", LONG, || {
        let out = Command::new("sh")
            .arg("-c")
            .arg(format!(
                ". {} && allot nodes --json && allot gpus --json",
                env.display()
            ))
            .current_dir("/")
            .output()
            .expect("sh runs");
        let s = String::from_utf8_lossy(&out.stdout).to_string();
        (out.status.success() && s.contains("\"connected\":true")).then_some(s)
    });
    assert!(out.contains("dev-node-1"), "{out}");
    // The metrics port was picked free, and is in the env file.
    let metrics = text
        .lines()
        .find_map(|l| l.strip_prefix("export ALLOT_METRICS=http://"))
        .and_then(|l| l.strip_suffix("/metrics"))
        .expect("ALLOT_METRICS")
        .to_string();
    assert!(!metrics.ends_with(":9470"), "{metrics}");
    // SIGTERM to allotd dev alone stops it and its agent, and frees the ports.
    let t0 = Instant::now();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.0.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .expect("signal");
    let status = wait_for("allotd dev to exit", LONG, || {
        child.0.try_wait().ok().flatten()
    });
    assert!(status.success(), "{status}");
    assert!(t0.elapsed() < Duration::from_secs(20), "{:?}", t0.elapsed());
    let agents = Command::new("pgrep")
        .args(["-f", &dir.join("agents").display().to_string()])
        .output()
        .expect("pgrep");
    assert!(
        agents.stdout.is_empty(),
        "agents still run: {}",
        String::from_utf8_lossy(&agents.stdout)
    );
    std::net::TcpListener::bind(&addr).expect("the gRPC port is free again");
    std::net::TcpListener::bind(&metrics).expect("the metrics port is free again");
    let _ = std::fs::remove_dir_all(&dir);
}

/// The pids of every process whose command line names this state dir's agents.
fn agents_of(dir: &std::path::Path) -> Vec<i32> {
    let out = Command::new("pgrep")
        .args(["-f", &dir.join("agents").display().to_string()])
        .output()
        .expect("pgrep");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect()
}

#[test]
fn a_killed_dev_leaves_no_agent_and_the_next_one_stops_leftovers_and_says_so() {
    let addr = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        l.local_addr().expect("addr").to_string()
    };
    let dir = temp("orphans");
    let mut first = Running(dev(&dir, &addr).spawn().expect("allotd dev starts"));
    let sock = dir.join("agents/node-1/agent.sock");
    wait_for("the agent to answer", LONG, || {
        std::os::unix::net::UnixStream::connect(&sock)
            .ok()
            .map(|_| ())
    });
    assert_eq!(agents_of(&dir).len(), 1);
    // kill -9: its agent follows it (it asked the kernel to be told).
    first.0.kill().expect("kill -9");
    let _ = first.0.wait();
    wait_for("the agent to stop with it", LONG, || {
        agents_of(&dir).is_empty().then_some(())
    });
    // An agent of this state dir left running anyway (an older allotd dev's, or
    // one started by hand): the next allotd dev stops it first, and says so.
    let mut leftover = Command::new(sibling("allot-agent", "allot-agent"))
        .arg("--config")
        .arg(dir.join("agents/node-1/agent.toml"))
        .stderr(Stdio::null())
        .spawn()
        .expect("an agent by hand");
    wait_for("the leftover to answer", LONG, || {
        std::os::unix::net::UnixStream::connect(&sock)
            .ok()
            .map(|_| ())
    });
    let mut second = Running(
        dev(&dir, &addr)
            .stdout(Stdio::piped())
            .spawn()
            .expect("allotd dev starts again"),
    );
    let stdout = second.0.stdout.take().expect("stdout");
    let (tx, rx) = std::sync::mpsc::channel();
    // Read to the end: a reader gone early would make its next line a broken pipe.
    std::thread::spawn(move || {
        use std::io::BufRead;
        for l in std::io::BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
        {
            if l.contains("that an earlier allotd dev left running") {
                let _ = tx.send(l);
            }
        }
    });
    let line = rx.recv_timeout(LONG).expect("a line about the leftover");
    assert!(line.contains(&format!("(pid {})", leftover.id())), "{line}");
    let _ = leftover.wait();
    // Its own agent runs in the leftover's place, and SIGTERM stops it too.
    wait_for("the new agent", LONG, || {
        let pids = agents_of(&dir);
        (pids.len() == 1 && pids[0] != leftover.id() as i32).then_some(())
    });
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(second.0.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .expect("signal");
    let _ = second.0.wait();
    assert!(agents_of(&dir).is_empty(), "{:?}", agents_of(&dir));
    let _ = std::fs::remove_dir_all(&dir);
}
