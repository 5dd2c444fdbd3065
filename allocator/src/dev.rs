//! `allotd dev`: a whole cluster on this machine — allotd plus N real `allot-agent`
//! processes on fake GPUs, each with its own socket, state dir and kernel-log file
//! under the state dir, and an example org (projects `demo-a`, `demo-b`). Started
//! again on the same state dir it resumes where it was.
//!
//! Its agents stop when it dies, however it dies (`--exit-with-parent`); agents of its
//! state dir left running anyway (by an `allotd dev` older than that) are stopped
//! before new ones start, and an agent that exits while it runs is reported.

use crate::config::{ServerConfig, EXAMPLE};
use anyhow::Context;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};

/// `allotd dev` flags.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Agents (hosts) to start.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=64))]
    pub nodes: u32,
    /// Fake GPUs per host.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..=64))]
    pub gpus_per_node: u32,
    /// Where allotd and the agents keep their state.
    #[arg(long, default_value = "allot-dev")]
    pub state_dir: PathBuf,
    /// gRPC address; fails at once when the port is taken.
    #[arg(long, default_value = "127.0.0.1:7070")]
    pub listen: String,
    /// Prometheus address; by default a free port (printed, and in STATE_DIR/env).
    #[arg(long)]
    pub metrics: Option<String>,
}

fn agent_binary() -> anyhow::Result<PathBuf> {
    let me = std::env::current_exe().context("locating allotd")?;
    let p = me.with_file_name("allot-agent");
    if p.exists() {
        Ok(p)
    } else {
        anyhow::bail!(
            "{} not found beside allotd; build it with `cargo build --release --bin allot-agent` (the README's main command builds both)",
            p.display()
        )
    }
}

fn write_file(path: &Path, text: &str) -> anyhow::Result<()> {
    std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))
}

fn write_if_missing(path: &Path, text: &str) -> anyhow::Result<()> {
    if path.exists() {
        Ok(())
    } else {
        write_file(path, text)
    }
}

/// Writes `STATE_DIR/env` (0600: it holds the token): absolute paths, to source
/// from any directory.
fn write_env(
    dir: &Path,
    listen: &str,
    metrics: &str,
    agent: &Path,
    token: &str,
) -> anyhow::Result<()> {
    let bin = agent.parent().unwrap_or(Path::new("."));
    let text = format!(
        "# Written by `allotd dev`; source it: . {}\nexport ALLOT_SERVER=https://{listen}\nexport ALLOT_CA={}\nexport ALLOT_TOKEN={token}\nexport ALLOT_SOCKET={}\nexport ALLOT_METRICS=http://{metrics}/metrics\nexport ALLOT_DEV_DIR={}\nexport ALLOTD_CONFIG={}\nexport PATH={}:\"$PATH\"\n",
        dir.join("env").display(),
        shell_quote(&dir.join("allotd").join("pki").join("ca.pem")),
        shell_quote(&dir.join("agents").join("node-1").join("agent.sock")),
        shell_quote(dir),
        shell_quote(&dir.join("allotd.toml")),
        shell_quote(bin),
    );
    // Whole or not at all, and 0600 from the start: it holds the admin's token,
    // and a script sourcing it as soon as it appears must not read half of it.
    let path = dir.join("env");
    allot_common::files::write_atomic(&path, &text, 0o600)
        .with_context(|| format!("writing {}", path.display()))
}

/// The user running this process: the admin of the allotd that `dev` and
/// `loadtest` start.
pub fn current_user() -> String {
    let uid = nix::unistd::geteuid();
    match nix::unistd::User::from_uid(uid) {
        Ok(Some(u)) => u.name,
        _ => std::env::var("USER").unwrap_or_else(|_| uid.to_string()),
    }
}

/// The dev user's token: kept in `STATE_DIR/token` (0600) and reused, or made
/// through the admin socket.
async fn user_token(dir: &Path, user: &str) -> anyhow::Result<String> {
    let path = dir.join("token");
    if let Ok(t) = std::fs::read_to_string(&path) {
        if !t.trim().is_empty() {
            return Ok(t.trim().to_string());
        }
    }
    let r = crate::admin_cmd::client_at(&crate::daemon::admin_socket_path(&dir.join("allotd")))
        .await?
        .create_token(allot_proto::v1::CreateTokenRequest {
            user: user.to_string(),
            ttl_s: crate::admin::TOKEN_TTL_MAX,
            note: "allotd dev".into(),
        })
        .await
        .map_err(crate::admin_cmd::status)?
        .into_inner();
    // 0600 from its first byte: a token is a user's whole identity.
    allot_common::files::write_atomic(&path, &r.token, 0o600)
        .with_context(|| format!("writing {}", path.display()))?;
    Ok(r.token)
}

/// Enrolls node `name` whose config is `conf` unless it is already: a token
/// through the admin socket, then `allot-agent enroll` with it (the real path).
async fn enroll(
    dir: &Path,
    agent: &Path,
    conf: &Path,
    state: &Path,
    name: &str,
    listen: &str,
) -> anyhow::Result<()> {
    if state.join("pki").join("node.pem").exists() {
        return Ok(());
    }
    let r = crate::admin_cmd::client_at(&crate::daemon::admin_socket_path(&dir.join("allotd")))
        .await?
        .enroll_node(allot_proto::v1::EnrollNodeRequest {
            node: name.to_string(),
            ttl_s: 0,
        })
        .await
        .map_err(crate::admin_cmd::status)?
        .into_inner();
    let mut cmd = Command::new(agent);
    cmd.arg("--config")
        .arg(conf)
        .args([
            "enroll",
            "--server",
            &format!("https://{listen}"),
            "--token",
            &r.token,
            "--ca",
        ])
        .arg(dir.join("allotd").join("pki").join("ca.pem"));
    // Blocking, off the runtime: allotd answers the enrollment on it meanwhile.
    let out = tokio::task::spawn_blocking(move || cmd.output())
        .await?
        .with_context(|| format!("running {} enroll", agent.display()))?;
    if !out.status.success() {
        anyhow::bail!(
            "enrolling {name}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

fn shell_quote(p: &Path) -> String {
    format!("'{}'", p.display().to_string().replace('\'', "'\\''"))
}

/// Runs the local cluster until SIGINT/SIGTERM.
pub async fn run(a: Args) -> anyhow::Result<()> {
    let metrics_listen = a.metrics.as_deref().unwrap_or("127.0.0.1:0");
    let dir = std::path::absolute(&a.state_dir).context("state dir")?;
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let cfg_path = dir.join("allotd.toml");
    let example = EXAMPLE
        .replace(
            "listen = \"127.0.0.1:7070\"",
            &format!("listen = {:?}", a.listen),
        )
        .replace(
            "metrics_listen = \"127.0.0.1:9470\"",
            &format!("metrics_listen = {metrics_listen:?}"),
        )
        .replace(
            "state_dir = \"/var/lib/allot/allotd\"",
            &format!("state_dir = {:?}", dir.join("allotd")),
        )
        .replace("lost_grace = \"2m\"", "lost_grace = \"30s\"")
        .replace("admins = []", &format!("admins = [{:?}]", current_user()))
        .replace("schedule_interval = \"10s\"", "schedule_interval = \"2s\"");
    write_if_missing(&cfg_path, &example)?;
    let mut cfg = ServerConfig::load(&cfg_path)?;
    // Flags win over a config kept from an earlier run.
    cfg.server.listen = a.listen.clone();
    cfg.server.metrics_listen = metrics_listen.to_string();
    let agent = agent_binary()?;
    // Ports first: a busy port must fail before any agent starts (an agent started
    // now would join whichever allotd holds the port).
    let bound = crate::daemon::Bound::bind(&cfg).await?;
    let listen = bound.grpc.local_addr()?.to_string();
    let metrics = match &bound.metrics {
        Some(m) => m.local_addr()?.to_string(),
        None => "-".into(),
    };
    let server = tokio::spawn(crate::daemon::serve_bound(
        cfg,
        bound,
        crate::daemon::signalled(),
    ));
    let user = current_user();
    let token = match user_token(&dir, &user).await {
        Ok(t) => t,
        Err(e) => {
            server.abort();
            return Err(e.context("making the dev user's token"));
        }
    };
    write_env(&dir, &listen, &metrics, &agent, &token)?;
    let mut agents: Vec<Child> = Vec::new();
    for line in stop_leftovers(&dir) {
        println!("{line}");
    }
    if let Err(e) = start_agents(&a, &dir, &listen, &agent, &mut agents).await {
        // None may outlive a failed start: they would look for this allotd forever.
        stop_agents(agents);
        server.abort();
        return Err(e);
    }
    if let Err(e) = agents_up(&dir, &mut agents).await {
        stop_agents(agents);
        server.abort();
        return Err(e);
    }
    println!(
        "allot local cluster: {} nodes × {} fake GPUs (TLS with its own CA; you, {user}, are its admin)\n  allotd     https://{listen}  (state {})\n  metrics    http://{metrics}/metrics\n  agents     {}/agents/node-N/ (agent.sock, agent.log, kmsg)\n\nIn another terminal:\n  . {}\n  allot share\n  allot submit --project demo-a --gpus 2 --min-runtime 10m -- sleep 300\n  allot queue; allot nodes; allot leases   # leases: node-1's agent\n  allotd tokens create --user NAME         # admin commands find this cluster by $ALLOTD_CONFIG\n\nCtrl-C (or SIGTERM to this process) stops allotd and the agents; workloads keep running and are re-adopted next time.",
        a.nodes,
        a.gpus_per_node,
        dir.display(),
        dir.display(),
        dir.join("env").display(),
    );
    println!("Dev agents allow work as root (allow_root = true); a real host refuses it.");
    let agents = std::sync::Arc::new(std::sync::Mutex::new(agents));
    let watch = tokio::spawn(watch_agents(dir.clone(), agents.clone()));
    let r = server.await;
    watch.abort();
    let agents = std::mem::take(&mut *agents.lock().unwrap_or_else(|e| e.into_inner()));
    stop_agents(agents);
    r.context("allotd task")?
}

/// Whether `pid` is the agent of `node_dir`: an `allot-agent` (a pager showing the
/// config is not) whose command line names that node's config (a recycled pid does
/// not).
fn is_agent_of(pid: i32, node_dir: &Path) -> bool {
    let agent = std::fs::read_link(format!("/proc/{pid}/exe")).is_ok_and(|exe| {
        exe.file_name()
            .is_some_and(|n| n.to_string_lossy().starts_with("allot-agent"))
    });
    let conf = node_dir.join("agent.toml");
    agent
        && std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| {
            c.split(|b| *b == 0)
                .any(|arg| arg == conf.as_os_str().as_encoded_bytes())
        })
}

/// Every process whose command line names a node config of this state dir: its
/// agents, whoever started them.
fn running_agents(dir: &Path) -> Vec<(i32, PathBuf)> {
    let Ok(nodes) = std::fs::read_dir(dir.join("agents")) else {
        return Vec::new();
    };
    let nodes: Vec<PathBuf> = nodes.flatten().map(|e| e.path()).collect();
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let me = std::process::id() as i32;
    procs
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| *pid != me)
        .filter_map(|pid| {
            let d = nodes.iter().find(|d| is_agent_of(pid, d))?;
            Some((pid, d.clone()))
        })
        .collect()
}

/// Stops the agents of this state dir that still run (left by an `allotd dev`
/// that was killed before its agents could follow it, or started by hand): SIGTERM
/// (their workloads keep running), SIGKILL after 10 s. Returns what it did, to say.
fn stop_leftovers(dir: &Path) -> Vec<String> {
    let mut said = Vec::new();
    for (pid, d) in running_agents(dir) {
        let p = nix::unistd::Pid::from_raw(pid);
        let _ = nix::sys::signal::kill(p, nix::sys::signal::Signal::SIGTERM);
        let t0 = std::time::Instant::now();
        while is_agent_of(pid, &d) && t0.elapsed() < std::time::Duration::from_secs(10) {
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        let how = if is_agent_of(pid, &d) {
            let _ = nix::sys::signal::kill(p, nix::sys::signal::Signal::SIGKILL);
            "killed (it did not stop on SIGTERM within 10 s)"
        } else {
            "stopped"
        };
        said.push(format!(
            "{how} the agent of {} (pid {pid}) that an earlier allotd dev left running; its workloads keep running and the new agent re-adopts them",
            d.display()
        ));
    }
    said
}

/// Waits until every agent answers on its socket; one that exits first fails the
/// start, with the end of its log.
async fn agents_up(dir: &Path, agents: &mut [Child]) -> anyhow::Result<()> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    for (i, c) in agents.iter_mut().enumerate() {
        let d = dir.join("agents").join(format!("node-{}", i + 1));
        loop {
            if let Some(status) = c.try_wait()? {
                anyhow::bail!(
                    "the agent of node-{} exited at once ({status}): {}",
                    i + 1,
                    log_tail(&d)
                );
            }
            if std::os::unix::net::UnixStream::connect(d.join("agent.sock")).is_ok() {
                break;
            }
            if std::time::Instant::now() > deadline {
                anyhow::bail!(
                    "the agent of node-{} does not answer on {} after 30 s: {}",
                    i + 1,
                    d.join("agent.sock").display(),
                    log_tail(&d)
                );
            }
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
    }
    Ok(())
}

/// The last line of a node's agent log, and where the log is.
fn log_tail(node_dir: &Path) -> String {
    let log = node_dir.join("agent.log");
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    format!(
        "{} (see {})",
        text.lines().last().unwrap_or("no log"),
        log.display()
    )
}

/// Says so when an agent exits while the cluster runs (its node is then lost to
/// allotd after `lost_grace`).
async fn watch_agents(dir: PathBuf, agents: std::sync::Arc<std::sync::Mutex<Vec<Child>>>) {
    let mut told = std::collections::BTreeSet::new();
    loop {
        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
        let mut a = agents.lock().unwrap_or_else(|e| e.into_inner());
        for (i, c) in a.iter_mut().enumerate() {
            if let Ok(Some(status)) = c.try_wait() {
                if told.insert(i) {
                    let d = dir.join("agents").join(format!("node-{}", i + 1));
                    eprintln!(
                        "allotd dev: the agent of node-{} exited ({status}): {}",
                        i + 1,
                        log_tail(&d)
                    );
                }
            }
        }
    }
}

/// Writes each agent's config and starts it; the ones started are in `agents`
/// whatever happens.
async fn start_agents(
    a: &Args,
    dir: &Path,
    listen: &str,
    agent: &Path,
    agents: &mut Vec<Child>,
) -> anyhow::Result<()> {
    for i in 1..=a.nodes {
        let d = dir.join("agents").join(format!("node-{i}"));
        std::fs::create_dir_all(&d)?;
        let kmsg = d.join("kmsg");
        write_if_missing(&kmsg, "")?;
        let conf = d.join("agent.toml");
        // Written every time: the agents must follow this run's --listen.
        write_file(
            &conf,
            &format!(
                "[agent]\nsocket = {:?}\nstate_dir = {:?}\nallocator = \"https://{}\"\nhost = \"dev-node-{i}\"\ncluster = \"dev\"\nterm_grace = \"10s\"\ndefault_grace = \"30s\"\nallow_root = true   # dev only: work may run as root here\n\n[health]\nsource = \"fake:{}\"\ninterval_s = 2\nkmsg = {:?}   # append an NVRM Xid line here to inject a fault\n",
                d.join("agent.sock"),
                d.join("state"),
                listen,
                a.gpus_per_node,
                kmsg
            ),
        )?;
        enroll(
            dir,
            agent,
            &conf,
            &d.join("state"),
            &format!("dev-node-{i}"),
            listen,
        )
        .await?;
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(d.join("agent.log"))?;
        let child = Command::new(agent)
            .arg("--config")
            .arg(&conf)
            .arg("--exit-with-parent")
            .arg(std::process::id().to_string())
            .stderr(log)
            .spawn()
            .with_context(|| format!("starting {}", agent.display()))?;
        agents.push(child);
    }
    Ok(())
}

/// SIGTERM to each agent, and waits for it (its workloads keep running).
fn stop_agents(agents: Vec<Child>) {
    for mut c in agents {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(c.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
        let _ = c.wait();
    }
}
