//! What allot's end-to-end tests share (the agent's, allotd's and the CLI's): finding
//! the workspace's other binaries, waiting for state changes in other processes, free
//! loopback ports, reading a command's JSON, and the unprivileged test users. Test code: it panics with the reason
//! rather than returning errors.

#![allow(clippy::unwrap_used)]

pub mod chromium;
pub mod partition;
pub mod pty;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Binary `bin` of workspace package `package`, in the directory of `beside` (the
/// test's own binary under test, `env!("CARGO_BIN_EXE_…")`). Built first when a
/// package-only test run did not build it, or it is older than one of its sources:
/// a stale CLI would test yesterday's code.
pub fn sibling(beside: &str, bin: &str, package: &str) -> PathBuf {
    static CHECKED: Mutex<Vec<String>> = Mutex::new(Vec::new());
    let p = PathBuf::from(beside).with_file_name(bin);
    let mut checked = CHECKED.lock().unwrap_or_else(|e| e.into_inner());
    if !checked.iter().any(|b| b == bin) {
        if !fresh(&p) {
            let ok = Command::new(env!("CARGO"))
                .args(["build", "-p", package, "--bin", bin])
                .status()
                .expect("cargo runs")
                .success();
            assert!(ok, "building {bin}");
        }
        checked.push(bin.to_string());
    }
    p
}

/// Whether `p` exists and is no older than any source file cargo's dep-info
/// (`p.d`, written beside it) says it was built from. Not the test binary's own
/// age: `cargo test --workspace` links the binaries before the tests, and a
/// rebuild here (another profile, other features) would cost minutes of CI and
/// overwrite what that run built.
fn fresh(p: &Path) -> bool {
    let m = |p: &Path| std::fs::metadata(p).and_then(|m| m.modified()).ok();
    let (Some(bin), Ok(deps)) = (m(p), std::fs::read_to_string(p.with_extension("d"))) else {
        return false;
    };
    let Some((_, sources)) = deps.lines().next().and_then(|l| l.split_once(": ")) else {
        return false;
    };
    dep_info_paths(sources)
        .iter()
        .all(|s| m(Path::new(s)).is_some_and(|t| t <= bin))
}

/// The paths of a dep-info line: separated by spaces, a space inside one escaped.
fn dep_info_paths(line: &str) -> Vec<String> {
    let mut paths = vec![String::new()];
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => paths.last_mut().expect("never empty").extend(chars.next()),
            ' ' => paths.push(String::new()),
            c => paths.last_mut().expect("never empty").push(c),
        }
    }
    paths.retain(|p| !p.is_empty());
    paths
}

/// Polls `f` until it returns `Some`, for at most `limit`: what a test waits for is a
/// state change in another process, seen through its API (there is no event to
/// await across processes).
pub fn wait_for<T>(what: &str, limit: Duration, f: impl FnMut() -> Option<T>) -> T {
    try_wait_for(limit, f).unwrap_or_else(|| panic!("timed out waiting for {what}"))
}

/// [`wait_for`], `None` at the deadline: for a test that says more when it fails.
pub fn try_wait_for<T>(limit: Duration, mut f: impl FnMut() -> Option<T>) -> Option<T> {
    let end = Instant::now() + limit;
    loop {
        if let Some(v) = f() {
            return Some(v);
        }
        if Instant::now() >= end {
            return None;
        }
        std::thread::sleep(Duration::from_millis(25));
    }
}

/// A loopback port free at the time of asking.
pub fn free_port() -> u16 {
    free_ports::<1>()[0]
}

/// `N` distinct free ports: each held until all are picked, so two never collide.
pub fn free_ports<const N: usize>() -> [u16; N] {
    let held: Vec<std::net::TcpListener> = (0..N)
        .map(|_| std::net::TcpListener::bind("127.0.0.1:0").expect("a free port"))
        .collect();
    std::array::from_fn(|i| held[i].local_addr().expect("its address").port())
}

/// The JSON a successful `allot {args}` printed; panics with its stderr or stdout.
pub fn json_of(args: &[&str], out: &Output) -> serde_json::Value {
    assert!(
        out.status.success(),
        "allot {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "allot {args:?} printed no JSON ({e}): {}",
            String::from_utf8_lossy(&out.stdout)
        )
    })
}

/// The name of the user running the tests (what a token for "me" proves).
pub fn current_user() -> String {
    let out = std::process::Command::new("id")
        .arg("-un")
        .output()
        .expect("id runs");
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// The uid and primary gid of test user `name` (`allot-test-a`, `allot-test-b`: made
/// by `.ci/run`); `None`, with a skip line, where it is missing, so a developer's
/// machine without them still passes. On CI (`CI=true`) a missing user is a failure:
/// the tests it guards must not pass by being skipped.
pub fn test_user(name: &str) -> Option<(u32, u32)> {
    let id = |flag: &str| -> Option<u32> {
        let out = Command::new("id").args([flag, name]).output().ok()?;
        if !out.status.success() {
            return None;
        }
        String::from_utf8_lossy(&out.stdout).trim().parse().ok()
    };
    match (id("-u"), id("-g")) {
        (Some(uid), Some(gid)) => Some((uid, gid)),
        _ if std::env::var("CI").is_ok_and(|v| v == "true") => {
            panic!("test user {name:?} is missing; create it: see .ci/run")
        }
        _ => {
            eprintln!("skipped: test user {name:?} is missing (create it as .ci/run does)");
            None
        }
    }
}

/// The id of group `name`, if it exists (`getent group`).
pub fn group_id(name: &str) -> Option<u32> {
    let out = Command::new("getent").args(["group", name]).output().ok()?;
    if !out.status.success() {
        return None;
    }
    String::from_utf8_lossy(&out.stdout)
        .trim()
        .split(':')
        .nth(2)?
        .parse()
        .ok()
}

/// Spawns `cmd` with stderr to `log` and waits for it to exit (a daemon that does
/// not exit within 30 s is the failure: it is killed and the test fails); its
/// status and stderr. For daemons that must refuse to start.
pub fn run_until_exit(
    what: &str,
    cmd: &mut std::process::Command,
    log: &Path,
) -> (std::process::ExitStatus, String) {
    let mut child = cmd
        .stderr(std::fs::File::create(log).expect("log"))
        .spawn()
        .expect("starts");
    let status = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        wait_for(what, Duration::from_secs(30), || {
            child.try_wait().expect("wait")
        })
    }));
    let status = status.unwrap_or_else(|p| {
        let _ = child.kill();
        let _ = child.wait();
        std::panic::resume_unwind(p)
    });
    (status, std::fs::read_to_string(log).unwrap_or_default())
}

/// Folds a SQLite database's write-ahead log into the file and removes the `-wal`
/// and `-shm` beside it, as a clean stop would.
pub fn checkpoint_sqlite(db: &Path) {
    let conn = rusqlite::Connection::open(db).expect("db");
    conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))
        .expect("checkpoint");
    drop(conn);
    for side in ["-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{side}", db.display()));
    }
}

/// Ends and removes the lease cgroups of the agent whose state dir is `state_dir`
/// (named in its `STATE_DIR/cgroup`), then its own cgroup directory: what a test
/// leaves on the shared cgroup mount once its agents are stopped or killed.
pub fn remove_agent_cgroups(state_dir: &Path) {
    let Ok(base) = std::fs::read_to_string(state_dir.join("cgroup")) else {
        return;
    };
    let base = PathBuf::from(base.trim());
    for lease in std::fs::read_dir(&base).into_iter().flatten().flatten() {
        let dir = lease.path();
        if !dir.is_dir() {
            continue;
        }
        let _ = std::fs::write(dir.join("cgroup.kill"), "1");
        let end = Instant::now() + Duration::from_secs(5);
        while std::fs::read_to_string(dir.join("cgroup.events"))
            .is_ok_and(|e| e.lines().any(|l| l == "populated 1"))
            && Instant::now() < end
        {
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = std::fs::remove_dir(&dir);
    }
    let _ = std::fs::remove_dir(&base);
}

/// Whether Prometheus' `promtool` (Debian's `prometheus` package) can run here;
/// under `CI=true` its absence fails the test (`.ci/run` installs it).
pub fn promtool() -> bool {
    let found = Command::new("promtool")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    assert!(
        found || std::env::var("CI").as_deref() != Ok("true"),
        "promtool cannot run under CI=true; .ci/run installs Debian's prometheus"
    );
    found
}

/// `promtool check metrics` on an exposition (`what` names it in the failure).
pub fn promtool_check_metrics(what: &str, body: &str) {
    use std::io::Write;
    let mut p = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("promtool starts");
    p.stdin
        .take()
        .expect("stdin")
        .write_all(body.as_bytes())
        .expect("feed promtool");
    let out = p.wait_with_output().expect("promtool runs");
    assert!(
        out.status.success(),
        "promtool check metrics on {what}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::SystemTime;

    #[test]
    fn dep_info_paths_keep_escaped_spaces() {
        assert_eq!(
            dep_info_paths("/w/a.rs /w/my\\ dir/b.rs  /w/c.rs"),
            ["/w/a.rs", "/w/my dir/b.rs", "/w/c.rs"]
        );
    }

    #[test]
    fn a_binary_older_than_one_of_its_sources_is_stale() {
        let dir = std::env::temp_dir().join(format!("allot-fresh-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (bin, src) = (dir.join("tool"), dir.join("main.rs"));
        let at = |p: &Path, t: SystemTime| {
            std::fs::File::options()
                .create(true)
                .truncate(false)
                .write(true)
                .open(p)
                .and_then(|f| f.set_modified(t))
                .unwrap();
        };
        let now = SystemTime::now();
        at(&src, now - Duration::from_secs(60));
        at(&bin, now);
        assert!(!fresh(&bin), "no dep-info: built again");
        std::fs::write(
            dir.join("tool.d"),
            format!("{}: {}\n", bin.display(), src.display()),
        )
        .unwrap();
        assert!(fresh(&bin));
        at(&src, now + Duration::from_secs(60));
        assert!(!fresh(&bin), "a source changed since");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
