//! A throwaway agent for end-to-end tests: the real `allot-agent` binary on the fake
//! GPU source, with its own temp state dir, socket, config and kernel-log file, driven
//! through the real `allot` CLI. Dropping it stops the agent and every workload group
//! it started.

#![allow(dead_code)]

use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output};
use std::time::Duration;

pub use allot_test_support::wait_for;

/// A job whose children leave its session and process group every way there is:
/// `setsid`, `setpgid`, a double fork into a daemon that ignores SIGTERM, and
/// `nohup`. Five processes once it has settled, three of them out of its group.
pub const ESCAPING_JOB: &str = r#"setsid sleep 300 &
python3 -c 'import os,time; os.setpgid(0,0); time.sleep(300)' &
python3 -c '
import os, signal, time
if os.fork(): os._exit(0)
os.setsid()
if os.fork(): os._exit(0)
signal.signal(signal.SIGTERM, signal.SIG_IGN)
time.sleep(300)' &
nohup sleep 300 >/dev/null 2>&1 &
wait"#;

/// The `allot` CLI, built beside the agent.
pub fn allot_bin() -> PathBuf {
    allot_test_support::sibling(env!("CARGO_BIN_EXE_allot-agent"), "allot", "allot-cli")
}

/// A running test agent.
pub struct TestAgent {
    pub dir: PathBuf,
    pub socket: PathBuf,
    pub config: PathBuf,
    pub kmsg: PathBuf,
    pub child: Option<Child>,
}

impl TestAgent {
    /// Writes a config (`extra` is appended to `[agent]`) and starts the agent.
    pub fn start(tag: &str, extra: &str) -> TestAgent {
        let mut a = Self::prepare(tag, extra);
        a.launch();
        a
    }

    /// Like [`TestAgent::start`], but with `allow_root` at its default (off).
    pub fn start_without_root(tag: &str, extra: &str) -> TestAgent {
        let mut a = Self::write(tag, extra, "");
        a.launch();
        a
    }

    /// Writes the config and the dirs; the agent is not started yet. The tests run
    /// as root, so the agent allows root work (`allow_root = true`).
    pub fn prepare(tag: &str, extra: &str) -> TestAgent {
        Self::write(tag, extra, "allow_root = true\n")
    }

    fn write(tag: &str, extra: &str, root: &str) -> TestAgent {
        let dir = std::env::temp_dir().join(format!("allot-e2e-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("temp dir");
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        let socket = dir.join("agent.sock");
        let kmsg = dir.join("kmsg");
        std::fs::write(&kmsg, "").expect("kmsg file");
        let config = dir.join("agent.toml");
        std::fs::write(
            &config,
            format!(
                "[agent]\nsocket = {:?}\nstate_dir = {:?}\nterm_grace = \"2s\"\ndefault_grace = \"2s\"\n{root}{extra}\n[health]\nsource = \"fake:8\"\ninterval_s = 1\nkmsg = {:?}\n",
                socket,
                dir.join("state"),
                kmsg
            ),
        )
        .expect("config");
        TestAgent {
            dir,
            socket,
            config,
            kmsg,
            child: None,
        }
    }

    /// Starts (or restarts) the agent process and waits until it answers.
    pub fn launch(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("agent.log"))
            .expect("log");
        let child = Command::new(env!("CARGO_BIN_EXE_allot-agent"))
            .arg("--config")
            .arg(&self.config)
            .stderr(log)
            .spawn()
            .expect("agent starts");
        self.child = Some(child);
        wait_for("the agent to answer", Duration::from_secs(30), || {
            self.allot(&["gpus", "--json"])
                .status
                .success()
                .then_some(())
        });
    }

    /// Runs the CLI against this agent.
    pub fn allot(&self, args: &[&str]) -> Output {
        self.allot_as(None, args)
    }

    /// Runs the CLI as another uid (the caller must be root; see [`is_root`]).
    pub fn allot_as(&self, uid: Option<u32>, args: &[&str]) -> Output {
        use std::os::unix::process::CommandExt;
        let mut c = Command::new(allot_bin());
        // Through the environment: flags after `--` belong to the workload.
        c.args(args).env("ALLOT_SOCKET", &self.socket);
        if let Some(u) = uid {
            c.uid(u).gid(u);
        }
        c.output().expect("allot runs")
    }

    /// Runs the CLI, expects success, parses its JSON.
    pub fn json(&self, args: &[&str]) -> serde_json::Value {
        allot_test_support::json_of(args, &self.allot(args))
    }

    /// Starts a lease; returns its JSON.
    pub fn lease_start(&self, flags: &[&str], script: &str) -> serde_json::Value {
        let mut args = vec!["lease", "start", "--json"];
        args.extend_from_slice(flags);
        args.extend_from_slice(&["--", "sh", "-c", script]);
        self.json(&args)
    }

    /// One lease by id.
    pub fn lease(&self, id: &str) -> serde_json::Value {
        let all = self.json(&["leases", "--all", "--json"]);
        all.as_array()
            .and_then(|a| a.iter().find(|l| l["id"] == id).cloned())
            .unwrap_or_else(|| panic!("lease {id} not listed: {all}"))
    }

    /// Waits until the lease has ended; returns it.
    pub fn wait_ended(&self, id: &str, limit: Duration) -> serde_json::Value {
        wait_for(&format!("lease {id} to end"), limit, || {
            let l = self.lease(id);
            (l["state"] == "ended").then_some(l)
        })
    }

    /// Events as JSON.
    pub fn events(&self) -> Vec<serde_json::Value> {
        self.json(&["events", "--json"])
            .as_array()
            .cloned()
            .unwrap_or_default()
    }

    /// Appends a kernel-log line the agent's health monitor reads.
    pub fn kernel_log(&self, line: &str) {
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(&self.kmsg)
            .expect("kmsg");
        writeln!(f, "{line}").expect("write kmsg");
    }

    /// The checkpoint dir of a lease.
    pub fn checkpoint_dir(&self, id: &str) -> PathBuf {
        self.dir
            .join("state")
            .join("leases")
            .join(id)
            .join("checkpoint")
    }

    /// Waits for a lease's job to touch `ready` in its checkpoint dir: its traps are
    /// set, so a signal sent now is handled, not the default action.
    pub fn wait_ready(&self, id: &str) {
        let ready = self.checkpoint_dir(id).join("ready");
        wait_for("the job to set its traps", Duration::from_secs(60), || {
            ready.exists().then_some(())
        });
    }

    /// kill -9 the agent (workloads keep running).
    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// The agent's stderr so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("agent.log")).unwrap_or_default()
    }
}

impl Drop for TestAgent {
    fn drop(&mut self) {
        // Every workload group the agent started, ended or not.
        if let Ok(out) = Command::new(allot_bin())
            .args(["leases", "--all", "--json", "--socket"])
            .arg(&self.socket)
            .output()
        {
            if let Ok(serde_json::Value::Array(ls)) = serde_json::from_slice(&out.stdout) {
                for l in ls {
                    if let Some(pid) = l["pid"].as_i64().filter(|p| *p > 0) {
                        let _ = nix::sys::signal::killpg(
                            nix::unistd::Pid::from_raw(pid as i32),
                            nix::sys::signal::Signal::SIGKILL,
                        );
                    }
                }
            }
        }
        if let Some(c) = &self.child {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(c.id() as i32),
                nix::sys::signal::Signal::SIGTERM,
            );
        }
        if let Some(mut c) = self.child.take() {
            let _ = c.wait();
        }
        allot_test_support::remove_agent_cgroups(&self.dir.join("state"));
    }
}

/// Reads a file of nanosecond timestamps written by `date +%s%N`, as Unix ms.
pub fn stamp_ms(p: &Path) -> Option<i64> {
    std::fs::read_to_string(p)
        .ok()?
        .lines()
        .next()?
        .trim()
        .parse::<i64>()
        .ok()
        .map(|ns| ns / 1_000_000)
}

/// Tests that act as another user need root to switch; elsewhere they say so and skip.
pub fn is_root() -> bool {
    let root = nix::unistd::geteuid().is_root();
    if !root {
        eprintln!("skipped: acting as another user needs root");
    }
    root
}
