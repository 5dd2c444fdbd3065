//! `allotd dev`: a whole cluster on this machine — allotd plus N real `allot-agent`
//! processes on fake GPUs, each with its own socket, state dir and kernel-log file
//! under the state dir, and an example org (projects `demo-a`, `demo-b`). Started
//! again on the same state dir it resumes where it was.

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

/// Writes `STATE_DIR/env`: absolute paths, to source from any directory.
fn write_env(dir: &Path, listen: &str, metrics: &str, agent: &Path) -> anyhow::Result<()> {
    let bin = agent.parent().unwrap_or(Path::new("."));
    let text = format!(
        "# Written by `allotd dev`; source it: . {}\nexport ALLOT_SERVER=http://{listen}\nexport ALLOT_SOCKET={}\nexport ALLOT_METRICS=http://{metrics}/metrics\nexport ALLOT_DEV_DIR={}\nexport PATH={}:\"$PATH\"\n",
        dir.join("env").display(),
        shell_quote(&dir.join("agents").join("node-1").join("agent.sock")),
        shell_quote(dir),
        shell_quote(bin),
    );
    write_file(&dir.join("env"), &text)
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
        .replace("schedule_interval = \"10s\"", "schedule_interval = \"2s\"");
    write_if_missing(&cfg_path, &example)?;
    let mut cfg = ServerConfig::load(&cfg_path)?;
    // Flags win over a config kept from an earlier run.
    cfg.server.listen = a.listen.clone();
    cfg.server.metrics_listen = metrics_listen.to_string();
    let agent = agent_binary()?;
    // Ports first: a busy port must fail before any agent starts (an agent started
    // now would join whichever allotd holds the port).
    let bound = crate::serve::Bound::bind(&cfg).await?;
    let listen = bound.grpc.local_addr()?.to_string();
    let metrics = match &bound.metrics {
        Some(m) => m.local_addr()?.to_string(),
        None => "-".into(),
    };
    write_env(&dir, &listen, &metrics, &agent)?;
    let server = tokio::spawn(crate::serve::serve_bound(
        cfg,
        bound,
        crate::serve::signalled(),
    ));
    let mut agents: Vec<Child> = Vec::new();
    if let Err(e) = start_agents(&a, &dir, &listen, &agent, &mut agents) {
        // None may outlive a failed start: they would look for this allotd forever.
        stop_agents(agents);
        server.abort();
        return Err(e);
    }
    println!(
        "allot local cluster: {} nodes × {} fake GPUs\n  allotd     http://{listen}  (state {})\n  metrics    http://{metrics}/metrics\n  agents     {}/agents/node-N/ (agent.sock, agent.log, kmsg)\n\nIn another terminal:\n  . {}\n  allot share\n  allot submit --project demo-a --gpus 2 --min-runtime 10m -- sleep 300\n  allot queue; allot nodes; allot leases   # leases: node-1's agent\n\nCtrl-C (or SIGTERM to this process) stops allotd and the agents; workloads keep running and are re-adopted next time.",
        a.nodes,
        a.gpus_per_node,
        dir.display(),
        dir.display(),
        dir.join("env").display(),
    );
    println!("Dev agents allow work as root (allow_root = true); a real host refuses it.");
    let r = server.await;
    stop_agents(agents);
    r.context("allotd task")?
}

/// Writes each agent's config and starts it; the ones started are in `agents`
/// whatever happens.
fn start_agents(
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
                "[agent]\nsocket = {:?}\nstate_dir = {:?}\nallocator = \"http://{}\"\nhost = \"dev-node-{i}\"\ncluster = \"dev\"\nterm_grace = \"10s\"\ndefault_grace = \"30s\"\nallow_root = true   # dev only: work may run as root here\n\n[health]\nsource = \"fake:{}\"\ninterval_s = 2\nkmsg = {:?}   # append an NVRM Xid line here to inject a fault\n",
                d.join("agent.sock"),
                d.join("state"),
                listen,
                a.gpus_per_node,
                kmsg
            ),
        )?;
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(d.join("agent.log"))?;
        agents.push(
            Command::new(agent)
                .arg("--config")
                .arg(&conf)
                .stderr(log)
                .spawn()
                .with_context(|| format!("starting {}", agent.display()))?,
        );
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
