//! A whole cluster of real processes for end-to-end tests: `allotd serve` with a
//! temp state dir and ports it picked, and N `allot-agent`s on fake GPUs, each with
//! its own socket, state dir and kernel-log file; driven through the real `allot`
//! CLI. Dropping it stops everything, workloads included.

#![allow(dead_code)]

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output};
use std::time::Duration;

use allot_test_support::free_port;
pub use allot_test_support::wait_for;

/// Another binary of the workspace, beside allotd.
pub fn sibling(bin: &str, package: &str) -> PathBuf {
    allot_test_support::sibling(env!("CARGO_BIN_EXE_allotd"), bin, package)
}

/// Whether `addr` (`HOST:PORT`) can be bound now.
pub fn port_free(addr: &str) -> bool {
    std::net::TcpListener::bind(addr).is_ok()
}

/// The running cluster.
pub struct Cluster {
    pub dir: PathBuf,
    pub addr: String,
    /// A token for the user running the tests, an admin of this allotd.
    pub token: String,
    pub metrics: String,
    pub config: PathBuf,
    pub server: Option<Child>,
    pub agents: Vec<Option<Child>>,
    /// Lines added to every agent's `[agent]` table from its next start.
    pub agent_extra: String,
    /// Each agent's `/metrics` address, when agents serve them
    /// ([`Cluster::start_metered`]); empty: they do not.
    pub agent_metrics: Vec<String>,
    /// Agents serve `/metrics`, and their fake GPU `i` is `40 + i` % busy.
    pub metered: bool,
    /// The fake GPU source's script for every agent, instead of `40 + i` %.
    pub gpu_script: Option<String>,
    /// Where agent `i` reaches allotd instead of `addr` (a relay the test can cut).
    pub agent_route: std::collections::BTreeMap<usize, String>,
}

impl Cluster {
    /// allotd with `groups` (TOML `[[group]]` tables) and `nodes` agents of `gpus`.
    pub fn start(tag: &str, groups: &str, nodes: usize, gpus: u32) -> Cluster {
        Self::start_with(tag, "lost_grace = \"30s\"", groups, nodes, gpus)
    }

    /// Like [`Cluster::start`], with every agent serving `/metrics` (addresses in
    /// `agent_metrics`) and its fake GPU `i` busy at `40 + i` %.
    pub fn start_metered(tag: &str, groups: &str, nodes: usize, gpus: u32) -> Cluster {
        Self::start_metered_with(tag, groups, nodes, gpus, "", None)
    }

    /// Like [`Cluster::start_metered`], with `agent_extra` in every agent's
    /// `[agent]` and, when given, `script` as every agent's fake GPU script.
    pub fn start_metered_with(
        tag: &str,
        groups: &str,
        nodes: usize,
        gpus: u32,
        agent_extra: &str,
        script: Option<&str>,
    ) -> Cluster {
        // Forecasts soon after a change, so a test sees them.
        let server = "lost_grace = \"30s\"\nforecast_every = \"2s\"";
        let mut c = Self::prepare(tag, server, groups);
        c.metered = true;
        c.agent_extra = agent_extra.to_string();
        c.gpu_script = script.map(String::from);
        c.start_server();
        for i in 0..nodes {
            c.agents.push(None);
            c.start_agent(i, gpus);
        }
        c.wait_connected(nodes);
        c
    }

    /// Like [`Cluster::start`], with `agent_extra` in every agent's `[agent]` (a
    /// `term_grace` there replaces the tests' 2 s).
    pub fn start_with_agents(
        tag: &str,
        groups: &str,
        nodes: usize,
        gpus: u32,
        agent_extra: &str,
    ) -> Cluster {
        let mut c = Self::prepare(tag, "lost_grace = \"30s\"", groups);
        c.agent_extra = agent_extra.to_string();
        c.start_agents(nodes, gpus);
        c
    }

    /// The same, with `server` lines added to `[server]`.
    pub fn start_with(tag: &str, server: &str, groups: &str, nodes: usize, gpus: u32) -> Cluster {
        let mut c = Self::prepare(tag, server, groups);
        c.start_agents(nodes, gpus);
        c
    }

    /// Starts allotd and `nodes` agents of `gpus`; waits until they are connected.
    pub fn start_agents(&mut self, nodes: usize, gpus: u32) {
        self.start_server();
        for i in 0..nodes {
            self.agents.push(None);
            self.start_agent(i, gpus);
        }
        self.wait_connected(nodes);
    }

    /// allotd alone, no agents, listening on `ip` (`[::]`: every address of both
    /// families) at a free port; `addr` stays its IPv4 loopback address.
    pub fn start_listening_on(tag: &str, ip: &str, server: &str, groups: &str) -> Cluster {
        let mut c = Self::prepare(tag, server, groups);
        let port = c.addr.rsplit(':').next().expect("a port").to_string();
        let cfg = std::fs::read_to_string(&c.config).expect("config");
        let cfg = cfg.replace(
            &format!("listen = {:?}", c.addr),
            &format!("listen = \"{ip}:{port}\""),
        );
        std::fs::write(&c.config, cfg).expect("config");
        c.start_server();
        c
    }

    /// allotd alone on a copy of an `allotd.db` (an earlier release's fixture), no
    /// agents.
    pub fn from_state(tag: &str, groups: &str, db: &Path) -> Cluster {
        let mut c = Self::prepare(tag, "lost_grace = \"10m\"", groups);
        std::fs::create_dir_all(c.dir.join("allotd")).expect("dir");
        std::fs::copy(db, c.dir.join("allotd/allotd.db")).expect("fixture copied");
        c.start_server();
        c
    }

    /// A fresh dir and config with ports picked free; nothing started yet.
    /// Writes allotd's config (`server` lines in `[server]`, `groups`); starts
    /// nothing.
    pub fn prepare(tag: &str, server: &str, groups: &str) -> Cluster {
        let dir = std::env::temp_dir().join(format!("allot-cluster-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("dir");
        let [port, metrics_port] = allot_test_support::free_ports();
        let addr = format!("127.0.0.1:{port}");
        let metrics = format!("127.0.0.1:{metrics_port}");
        let config = dir.join("allotd.toml");
        std::fs::write(
            &config,
            format!(
                "[server]\nlisten = {addr:?}\nmetrics_listen = {metrics:?}\nstate_dir = {:?}\nschedule_interval = \"1s\"\n{server}\n{groups}\n{}",
                dir.join("allotd"),
                // The test user administers; a test with its own [roles] names them.
                if groups.contains("[roles]") {
                    String::new()
                } else {
                    format!("[roles]\nadmins = [{:?}]\n", allot_test_support::current_user())
                }
            ),
        )
        .expect("config");
        Cluster {
            dir,
            addr,
            token: String::new(),
            metrics,
            config,
            server: None,
            agents: Vec::new(),
            agent_extra: String::new(),
            agent_metrics: Vec::new(),
            metered: false,
            gpu_script: None,
            agent_route: std::collections::BTreeMap::new(),
        }
    }

    /// (Re)starts allotd.
    pub fn start_server(&mut self) {
        self.spawn_server();
        if self.token.is_empty() {
            self.token = self.first_token();
        }
        wait_for("allotd to answer", Duration::from_secs(30), || {
            self.allot(&["share", "--json"])
                .status
                .success()
                .then_some(())
        });
    }

    /// The admin's token, from allotd's first start. A port free when picked may be
    /// taken before allotd binds it (a client's ephemeral port); allotd then exits,
    /// and is started on others: no agent knows the address yet.
    fn first_token(&mut self) -> String {
        let me = allot_test_support::current_user();
        for tries in 1.. {
            let mut server = self.server.take();
            let out = wait_for("allotd's admin socket", Duration::from_secs(30), || {
                if let Some(Ok(Some(_))) = server.as_mut().map(Child::try_wait) {
                    return Some(None);
                }
                let out = self.allotd(&["tokens", "create", "--user", &me]);
                out.status.success().then_some(Some(out))
            });
            self.server = server;
            if let Some(out) = out {
                return String::from_utf8_lossy(&out.stdout).trim().to_string();
            }
            let log = std::fs::read_to_string(self.dir.join("allotd.log")).unwrap_or_default();
            assert!(
                tries < 3 && log.contains("Address already in use"),
                "allotd exited at start:\n{log}"
            );
            self.repick_ports();
            self.spawn_server();
        }
        unreachable!("the loop returns or fails")
    }

    fn spawn_server(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("allotd.log"))
            .expect("log");
        self.server = Some(
            Command::new(env!("CARGO_BIN_EXE_allotd"))
                .args(["serve", "--config"])
                .arg(&self.config)
                .env("ALLOT_LOG", "info")
                .stderr(log)
                .spawn()
                .expect("allotd starts"),
        );
    }

    /// New ports for allotd's two listeners, in its config too.
    fn repick_ports(&mut self) {
        let [port, metrics_port] = allot_test_support::free_ports();
        let mut cfg = std::fs::read_to_string(&self.config).expect("config");
        for (addr, new) in [(&mut self.addr, port), (&mut self.metrics, metrics_port)] {
            let old = addr.rsplit(':').next().expect("a port").to_string();
            cfg = cfg.replace(&format!(":{old}\""), &format!(":{new}\""));
            *addr = format!("127.0.0.1:{new}");
        }
        std::fs::write(&self.config, cfg).expect("config");
    }

    /// Runs an `allotd` admin command (`tokens …`, `nodes …`) on its admin socket.
    pub fn allotd(&self, args: &[&str]) -> Output {
        Command::new(env!("CARGO_BIN_EXE_allotd"))
            .args(args)
            .arg("--socket")
            .arg(self.dir.join("allotd/admin.sock"))
            .output()
            .expect("allotd runs")
    }

    /// The cluster CA's certificate.
    pub fn ca(&self) -> PathBuf {
        self.dir.join("allotd/pki/ca.pem")
    }

    /// Enrolls node `i` (its agent config must be written): a token from allotd,
    /// then `allot-agent enroll` with it.
    pub fn enroll(&self, i: usize) {
        let out = self.allotd(&["nodes", "enroll", &Self::node_name(i)]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let token = String::from_utf8_lossy(&out.stdout).trim().to_string();
        let out = Command::new(sibling("allot-agent", "allot-agent"))
            .arg("--config")
            .arg(self.node_dir(i).join("agent.toml"))
            .args([
                "enroll",
                "--server",
                &format!("https://{}", self.addr),
                "--token",
                &token,
                "--ca",
            ])
            .arg(self.ca())
            .output()
            .expect("allot-agent enroll runs");
        assert!(
            out.status.success(),
            "enroll: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// A TLS channel to allotd: as node `i` (its certificate and key) or, with
    /// `None`, with no client certificate.
    pub async fn channel(&self, node: Option<usize>) -> tonic::transport::Channel {
        use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity};
        let ca = std::fs::read_to_string(self.ca()).expect("CA");
        let mut tls = ClientTlsConfig::new()
            .ca_certificate(Certificate::from_pem(ca))
            .domain_name("127.0.0.1");
        if let Some(i) = node {
            let pki = self.node_dir(i).join("state/pki");
            let cert = std::fs::read_to_string(pki.join("node.pem")).expect("node cert");
            let key = std::fs::read_to_string(pki.join("node.key")).expect("node key");
            tls = tls.identity(Identity::from_pem(cert, key));
        }
        Endpoint::from_shared(format!("https://{}", self.addr))
            .expect("endpoint")
            .tls_config(tls)
            .expect("tls")
            .connect()
            .await
            .expect("connect")
    }

    /// The directory of node `i`.
    pub fn node_dir(&self, i: usize) -> PathBuf {
        self.dir.join(format!("node-{i}"))
    }

    /// Node `i`'s host name.
    pub fn node_name(i: usize) -> String {
        format!("node-{i}")
    }

    /// (Re)starts agent `i`.
    pub fn start_agent(&mut self, i: usize, gpus: u32) {
        let d = self.node_dir(i);
        std::fs::create_dir_all(&d).expect("node dir");
        let kmsg = d.join("kmsg");
        if !kmsg.exists() {
            std::fs::write(&kmsg, "").expect("kmsg");
        }
        let conf = d.join("agent.toml");
        let term_grace = if self.agent_extra.contains("term_grace") {
            ""
        } else {
            "term_grace = \"2s\"\n"
        };
        let (mut metered, mut source) = (String::new(), format!("fake:{gpus}"));
        if self.metered {
            while self.agent_metrics.len() <= i {
                self.agent_metrics
                    .push(format!("127.0.0.1:{}", free_port()));
            }
            metered = format!("metrics_listen = {:?}\n", self.agent_metrics[i]);
            let script = d.join("gpus.txt");
            let lines: String = self.gpu_script.clone().unwrap_or_else(|| {
                (0..gpus)
                    .map(|g| format!("at 0s gpu {g} util {}\n", 40 + g))
                    .collect()
            });
            std::fs::write(&script, lines).expect("GPU script");
            source = format!("fake:{gpus}:{}", script.display());
        }
        std::fs::write(
            &conf,
            format!(
                "[agent]\nsocket = {:?}\nstate_dir = {:?}\nallocator = \"https://{}\"\nhost = \"node-{i}\"\ncluster = \"test\"\n{term_grace}default_grace = \"3s\"\nallow_root = true\n{}{metered}[health]\nsource = \"{source}\"\ninterval_s = 1\nkmsg = {:?}\n",
                d.join("agent.sock"),
                d.join("state"),
                self.agent_route.get(&i).unwrap_or(&self.addr),
                self.agent_extra,
                kmsg
            ),
        )
        .expect("agent config");
        if !d.join("state/pki/node.pem").exists() {
            self.enroll(i);
        }
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(d.join("agent.log"))
            .expect("log");
        let child = Command::new(sibling("allot-agent", "allot-agent"))
            .arg("--config")
            .arg(&conf)
            .env("ALLOT_LOG", "info")
            .stderr(log)
            .spawn()
            .expect("agent starts");
        self.agents[i] = Some(child);
    }

    /// Waits until `n` nodes are connected.
    pub fn wait_connected(&self, n: usize) {
        wait_for("agents to connect", Duration::from_secs(60), || {
            let v = self.json(&["nodes", "--json"]);
            let up = v
                .as_array()
                .map_or(0, |a| a.iter().filter(|n| n["connected"] == true).count());
            (up >= n).then_some(())
        });
    }

    /// The CLI against this allotd as its admin, not started yet.
    pub fn allot_command(&self, args: &[&str]) -> Command {
        let mut c = Command::new(sibling("allot", "allot-cli"));
        c.args(args)
            .env("ALLOT_SERVER", format!("https://{}", self.addr))
            .env("ALLOT_TOKEN", &self.token)
            .env("ALLOT_CA", self.ca());
        c
    }

    /// Runs the CLI against this allotd.
    pub fn allot(&self, args: &[&str]) -> Output {
        self.allot_command(args).output().expect("allot runs")
    }

    /// Runs the CLI, expects success, parses JSON.
    pub fn json(&self, args: &[&str]) -> serde_json::Value {
        allot_test_support::json_of(args, &self.allot(args))
    }

    /// Submits; returns the id.
    pub fn submit(&self, flags: &[&str], script: &str) -> String {
        let mut args = vec!["submit", "--json"];
        args.extend_from_slice(flags);
        args.extend_from_slice(&["--", "sh", "-c", script]);
        let v = self.json(&args);
        v["id"].as_str().expect("id").to_string()
    }

    /// One workload.
    pub fn status(&self, id: &str) -> serde_json::Value {
        self.json(&["status", id, "--json"])
    }

    /// Waits until the workload is in `state`.
    pub fn wait_state(&self, id: &str, state: &str, limit: Duration) -> serde_json::Value {
        wait_for(&format!("workload {id} to be {state}"), limit, || {
            let w = self.status(id);
            (w["state"] == state).then_some(w)
        })
    }

    /// Appends a kernel-log line on node `i`.
    pub fn kernel_log(&self, i: usize, line: &str) {
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(self.node_dir(i).join("kmsg"))
            .expect("kmsg");
        writeln!(f, "{line}").expect("write");
    }

    /// The node a workload (as `allot status --json` shows it) runs on: its name
    /// and index.
    pub fn node_of(w: &serde_json::Value) -> (String, usize) {
        let name = w["node_names"][0].as_str().expect("a node").to_string();
        let i = name
            .trim_start_matches("node-")
            .parse()
            .expect("a node index");
        (name, i)
    }

    /// Node `i`'s first GPU falls off the bus: XID 79 in its kernel log.
    pub fn gpu_falls_off(&self, i: usize) {
        let gpus = self.agent_json(i, &["gpus", "--json"]);
        let pci = gpus["gpus"][0]["pci"].as_str().expect("pci").to_string();
        self.kernel_log(
            i,
            &format!("NVRM: Xid (PCI:{pci}): 79, pid=1, name=python, GPU has fallen off the bus."),
        );
    }

    /// A local command on node `i` (through its agent's socket).
    pub fn agent_allot(&self, i: usize, args: &[&str]) -> Output {
        Command::new(sibling("allot", "allot-cli"))
            .args(args)
            .env("ALLOT_SOCKET", self.node_dir(i).join("agent.sock"))
            .output()
            .expect("allot runs")
    }

    /// Node `i` as allotd shows it (`allot nodes --json`).
    pub fn node_view(&self, i: usize) -> serde_json::Value {
        let nodes = self.json(&["nodes", "--json"]);
        nodes
            .as_array()
            .and_then(|a| a.iter().find(|n| n["name"] == Self::node_name(i).as_str()))
            .cloned()
            .unwrap_or_default()
    }

    /// The local agent's view (through its socket).
    pub fn agent_json(&self, i: usize, args: &[&str]) -> serde_json::Value {
        let out = self.agent_allot(i, args);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).expect("json")
    }

    /// kill -9 allotd.
    pub fn kill9_server(&mut self) {
        if let Some(mut c) = self.server.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// SIGTERM to allotd; waits for it to exit (at most 30 s): how long it took,
    /// and its exit status.
    pub fn term_server(&mut self) -> (Duration, std::process::ExitStatus) {
        let mut c = self.server.take().expect("allotd runs");
        let t = std::time::Instant::now();
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(c.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        )
        .expect("SIGTERM sent");
        let status = wait_for("allotd to exit on SIGTERM", Duration::from_secs(30), || {
            c.try_wait().ok().flatten()
        });
        (t.elapsed(), status)
    }

    /// Every live lease the agents hold, with its process: (node index, lease id) → pid.
    pub fn agent_pids(&self) -> std::collections::BTreeMap<(usize, String), i64> {
        let mut out = std::collections::BTreeMap::new();
        for i in 0..self.agents.len() {
            let v = self.agent_json(i, &["leases", "--json"]);
            for l in v.as_array().into_iter().flatten() {
                if l["state"] != "ended" {
                    let id = l["id"].as_str().unwrap_or_default().to_string();
                    out.insert((i, id), l["pid"].as_i64().unwrap_or(0));
                }
            }
        }
        out
    }

    /// Agent `i`'s pid, while it runs.
    pub fn agent_pid(&self, i: usize) -> Option<i32> {
        self.agents[i]
            .as_ref()
            .and_then(|c| i32::try_from(c.id()).ok())
    }

    /// kill -9 agent `i`.
    pub fn kill9_agent(&mut self, i: usize) {
        if let Some(mut c) = self.agents[i].take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Prometheus text.
    /// Scheduling passes allotd has run (its `/metrics` count).
    pub fn passes(&self) -> u64 {
        self.metrics_text()
            .lines()
            .find_map(|l| l.strip_prefix("allot_schedule_cycle_seconds_count "))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0)
    }

    /// Waits until allotd has run `n` more scheduling passes: every decision those
    /// passes could make has been made.
    pub fn wait_passes(&self, n: u64) {
        let from = self.passes();
        wait_for("scheduling passes", Duration::from_secs(60), || {
            (self.passes() >= from + n).then_some(())
        });
    }

    pub fn metrics_text(&self) -> String {
        use std::io::Read;
        let mut s = std::net::TcpStream::connect(&self.metrics).expect("metrics port");
        // Host is the address: allotd refuses names that are not its own.
        s.write_all(format!("GET /metrics HTTP/1.1\r\nhost: {}\r\n\r\n", self.metrics).as_bytes())
            .expect("request");
        let mut out = String::new();
        let _ = s.read_to_string(&mut out);
        out
    }
}

/// Every workload group a node's agent started (for cleanup).
fn workload_pids(dir: &Path) -> Vec<i32> {
    let mut v = Vec::new();
    if let Ok(conn) = rusqlite::Connection::open(dir.join("state/agent.db")) {
        if let Ok(mut st) = conn.prepare("SELECT body FROM leases") {
            if let Ok(rows) = st.query_map([], |r| r.get::<_, String>(0)) {
                for b in rows.flatten() {
                    if let Ok(j) = serde_json::from_str::<serde_json::Value>(&b) {
                        if let Some(p) = j["pid"].as_i64().filter(|p| *p > 0) {
                            v.push(p as i32);
                        }
                    }
                }
            }
        }
    }
    v
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for c in self
            .agents
            .iter_mut()
            .chain(std::iter::once(&mut self.server))
        {
            if let Some(mut c) = c.take() {
                let _ = c.kill();
                let _ = c.wait();
            }
        }
        for i in 0..self.agents.len() {
            for pid in workload_pids(&self.node_dir(i)) {
                let _ = nix::sys::signal::killpg(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
            allot_test_support::remove_agent_cgroups(&self.node_dir(i).join("state"));
        }
    }
}
