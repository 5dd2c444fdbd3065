//! The daemon shell: loads the config, opens the state, starts the health monitor and
//! the local API, and runs the contract loop: sleep until the host's next deadline,
//! a request, a process exit, a verdict or a reload, then let [`Host`] act.

use crate::api::LocalApi;
use crate::cgroup::Placement;
use crate::config::{socket_mode, AgentConfig, DEFAULT_PATH};
use crate::host::{now_ms, Host, Settings};
use crate::os::{RealOs, Reaper};
use crate::shared::Shared;
use crate::store::Store;
use crate::supervisor::Exit;
use allot_health::verdict::{GpuSample, Verdict};
use allot_health_sources::service::HealthMonitor;
use allot_proto::v1 as pb;
use allot_proto::v1::agent_local_server::AgentLocalServer;
use anyhow::{bail, Context};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::mpsc;

/// Command-line overrides of the config file.
#[derive(Debug, Clone, Default)]
pub struct Overrides {
    /// Config file; `None`: `/etc/allot/agent.toml` if it exists, else defaults.
    pub config: Option<PathBuf>,
    /// `agent.socket`.
    pub socket: Option<PathBuf>,
    /// `agent.state_dir`.
    pub state_dir: Option<PathBuf>,
    /// `health.source`.
    pub gpu_source: Option<String>,
    /// `health.kmsg`.
    pub kmsg: Option<String>,
}

impl Overrides {
    fn apply(&self, mut c: AgentConfig) -> AgentConfig {
        if let Some(s) = &self.socket {
            c.agent.socket = s.clone();
        }
        if let Some(s) = &self.state_dir {
            c.agent.state_dir = s.clone();
        }
        if let Some(s) = &self.gpu_source {
            c.health.source = s.clone();
        }
        if let Some(s) = &self.kmsg {
            c.health.kmsg = s.clone();
        }
        c
    }

    /// Reads the config (or the defaults) with these overrides.
    pub fn load(&self) -> Result<AgentConfig, allot_common::config_error::ConfigError> {
        let c = match &self.config {
            Some(p) => AgentConfig::load(p)?,
            None if Path::new(DEFAULT_PATH).exists() => AgentConfig::load(Path::new(DEFAULT_PATH))?,
            None => AgentConfig::default(),
        };
        Ok(self.apply(c))
    }

    fn config_path(&self) -> Option<PathBuf> {
        self.config.clone().or_else(|| {
            Path::new(DEFAULT_PATH)
                .exists()
                .then(|| DEFAULT_PATH.into())
        })
    }
}

/// The host settings a config gives.
pub fn settings(c: &AgentConfig, cgroups: &Placement, supervisor: &Path) -> Settings {
    Settings {
        checkpoint_root: (!c.agent.checkpoint_root.as_os_str().is_empty())
            .then(|| c.agent.checkpoint_root.clone()),
        default_grace_s: c.agent.default_grace,
        term_grace_s: c.agent.term_grace,
        fence_after_s: c.agent.fence_after,
        warning_before_ms: i64::try_from(c.agent.time_limit_warning.saturating_mul(1000))
            .unwrap_or(i64::MAX),
        // Checked when the config was parsed, by the same parser.
        warning_signal: allot_checkpoint_hooks::signal_named(&c.agent.time_limit_signal)
            .unwrap_or(nix::sys::signal::Signal::SIGUSR2),
        default_hook: c.agent.default_checkpoint.clone(),
        state_dir: c.agent.state_dir.clone(),
        min_uid: c.agent.min_uid,
        allow_root: c.agent.allow_root,
        hook_hosts: c.agent.hook_hosts.clone(),
        log_dir: c.agent.logs(),
        max_output_bytes: c.agent.max_output_bytes,
        cgroups: cgroups.clone(),
        supervisor: supervisor.to_path_buf(),
        idle_below_pct: c.agent.idle_below,
        idle_after_ms: i64::try_from(c.agent.idle_after.saturating_mul(1000)).unwrap_or(i64::MAX),
    }
}

/// Creates the socket: parent dir, stale file removed, mode and group set.
fn bind(c: &AgentConfig) -> anyhow::Result<(tokio::net::UnixListener, Option<u32>)> {
    let path = &c.agent.socket;
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    if path.exists() {
        if std::os::unix::net::UnixStream::connect(path).is_ok() {
            bail!(
                "{}: another agent is listening here; stop it or choose another --socket",
                path.display()
            );
        }
        std::fs::remove_file(path)
            .with_context(|| format!("removing the stale socket {}", path.display()))?;
    }
    let listener = tokio::net::UnixListener::bind(path)
        .with_context(|| format!("binding {}", path.display()))?;
    let mode = socket_mode(&c.agent.socket_mode).map_err(anyhow::Error::msg)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        .with_context(|| format!("setting the mode of {}", path.display()))?;
    let gid = nix::unistd::Group::from_name(&c.agent.socket_group)
        .ok()
        .flatten()
        .map(|g| g.gid);
    if let Some(g) = gid {
        if let Err(e) = nix::unistd::chown(path, None, Some(g)) {
            tracing::warn!(socket = %path.display(), group = %c.agent.socket_group, error = %e, "cannot give the socket to its group");
        }
    } else {
        tracing::info!(group = %c.agent.socket_group, "no such group: the socket is for root and the agent's user only");
    }
    Ok((listener, gid.map(|g| g.as_raw())))
}

/// Runs the health monitor on its own thread and forwards each verdict with the GPU
/// inventory (until the agent drops the receiver); returns why it could not start,
/// if so. Without a monitor the agent goes on without GPUs: the leases it holds are
/// still enforced.
fn health(
    c: &AgentConfig,
    tx: mpsc::UnboundedSender<(Verdict, Vec<GpuSample>)>,
) -> Result<Arc<Mutex<HealthMonitor>>, String> {
    let (updates, monitor) = match HealthMonitor::start(&c.health, &c.agent.state_dir) {
        // The receiver moves to the forwarding thread (it cannot be shared); the
        // monitor itself stays reachable for `allot gpus clear`.
        Ok(mut m) => (
            std::mem::replace(&mut m.updates, std::sync::mpsc::channel().1),
            Arc::new(Mutex::new(m)),
        ),
        Err(e) => {
            tracing::error!(error = %e, "health monitor cannot start; no GPUs will be offered");
            return Err(format!(
                "health monitor cannot start: {e}; for a host without GPUs set [health] source = \"fake:8\""
            ));
        }
    };
    let m = monitor.clone();
    std::thread::spawn(move || {
        while let Ok(v) = updates.recv() {
            let inventory = m.lock().unwrap_or_else(|e| e.into_inner()).inventory();
            if tx.send((v, inventory)).is_err() {
                return;
            }
        }
    });
    Ok(monitor)
}

/// Watches the config file (its directory: editors replace files) for changes.
fn watch_config(path: &Path, tx: mpsc::UnboundedSender<()>) -> Option<notify::RecommendedWatcher> {
    use notify::Watcher;
    let dir = path.parent()?.to_path_buf();
    let name = path.file_name()?.to_os_string();
    let mut w = notify::recommended_watcher(move |ev: notify::Result<notify::Event>| {
        if let Ok(ev) = ev {
            if (ev.kind.is_modify() || ev.kind.is_create())
                && ev.paths.iter().any(|p| p.file_name() == Some(&name))
            {
                let _ = tx.send(());
            }
        }
    })
    .ok()?;
    w.watch(&dir, notify::RecursiveMode::NonRecursive).ok()?;
    Some(w)
}

fn reload(o: &Overrides, current: &mut AgentConfig, shared: &Shared) {
    match o.load() {
        Err(e) => {
            tracing::error!(error = %e, "config rejected; the running config stays");
            shared
                .host()
                .config_event(&format!("config rejected, the running config stays: {e}"));
        }
        Ok(new) if new == *current => {}
        Ok(new) => {
            let restart = current.needs_restart(&new);
            let (cgroups, supervisor) = {
                let h = shared.host();
                (
                    h.settings().cgroups.clone(),
                    h.settings().supervisor.clone(),
                )
            };
            shared
                .host()
                .set_settings(settings(&new, &cgroups, &supervisor));
            let mut msg = "config reloaded".to_string();
            if !restart.is_empty() {
                msg.push_str(&format!(
                    "; a restart is needed for: {}",
                    restart.join(", ")
                ));
            }
            shared.host().config_event(&msg);
            *current = new;
            shared.wake.notify_one();
        }
    }
}

/// Runs the agent until SIGTERM or SIGINT.
pub async fn run(o: Overrides) -> anyhow::Result<()> {
    let mut cfg = o.load()?;
    let store = Store::open(&cfg.agent.state_dir)?;
    let host_name = if cfg.agent.host.is_empty() {
        sysinfo::System::host_name().unwrap_or_else(|| "localhost".into())
    } else {
        cfg.agent.host.clone()
    };
    let logs = cfg.agent.logs();
    crate::process::create_log_dir(&logs)
        .with_context(|| format!("creating [agent] log_dir {}", logs.display()))?;
    let cgroups = crate::cgroup::discover(&cfg.agent.cgroup, &host_name, &cfg.agent.state_dir);
    match &cgroups {
        Placement::At(dir) => {
            tracing::info!(cgroup = %dir.display(), "each lease runs in a cgroup of its own");
            // For operators and tools: where this agent's lease cgroups are.
            let note = cfg.agent.state_dir.join("cgroup");
            if let Err(e) = std::fs::write(&note, format!("{}\n", dir.display())) {
                tracing::warn!(file = %note.display(), error = %e, "cannot record the cgroup dir");
            }
        }
        Placement::Off(why) => tracing::warn!(
            why = %why,
            "no cgroups for leases: a workload is its process group, and a process that leaves it outlives the lease"
        ),
    }
    // Itself, as the supervisor: `/proc/self/exe` names this very binary even once an
    // upgrade has replaced the file.
    let supervisor = Path::new("/proc/self/exe");
    let host = Host::open(
        store,
        settings(&cfg, &cgroups, supervisor),
        Box::new(RealOs),
        now_ms(),
    )?;
    if let Placement::At(base) = &cgroups {
        // What a lease that ended while no agent ran left behind.
        for dir in crate::cgroup::sweep(base, &host.live_cgroups()) {
            tracing::info!(cgroup = %dir.display(), "removed the cgroup of an ended lease");
        }
    }
    let (vtx, mut vrx) = mpsc::unbounded_channel();
    // A login host (`--gpu-source none`) has no GPUs and takes no work: it only
    // vouches for its users, through its own certificate.
    let login = cfg.health.source_spec() == allot_health::config::SourceSpec::None;
    let monitor = if login {
        Err("a login host: no GPUs, no work; it vouches for its users".to_string())
    } else {
        health(&cfg, vtx)
    };
    if let Err(m) = &monitor {
        host.config_event(m);
    }
    // Before the socket exists: whoever sees it may signal us, and a SIGHUP that
    // came before its handler would end the agent.
    let mut hup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())?;
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let mut int = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())?;
    // The config is watched before the socket answers: whoever sees the agent up
    // may rewrite its config at once, and that change must not be missed.
    let (cfg_tx, mut cfg_rx) = mpsc::unbounded_channel();
    let _watcher = o.config_path().and_then(|p| watch_config(&p, cfg_tx));
    let (listener, admin_gid) = bind(&cfg)?;
    let (spawned_tx, mut spawned_rx) = mpsc::unbounded_channel::<(String, Reaper)>();
    let shared = Arc::new(Shared {
        host: Mutex::new(host),
        wake: tokio::sync::Notify::new(),
        spawned: spawned_tx,
        health_due: std::sync::atomic::AtomicBool::new(false),
        admin_gid,
        host_size: {
            let mut sys = sysinfo::System::new();
            sys.refresh_memory();
            sys.refresh_cpu_list(sysinfo::CpuRefreshKind::nothing());
            (
                u32::try_from(sys.cpus().len()).unwrap_or(u32::MAX),
                sys.total_memory(),
            )
        },
        sys: Mutex::new(sysinfo::System::new()),
        cpu: Mutex::new(crate::cgroup::CpuMeter::default()),
        host_name,
        uplink: Mutex::new(None),
        monitor: monitor.as_ref().ok().cloned(),
        ttys: Default::default(),
    });
    // The first verdict carries the GPU inventory: take it before answering anyone.
    if monitor.is_ok() {
        if let Ok(Some((v, inv))) = tokio::time::timeout(Duration::from_secs(10), vrx.recv()).await
        {
            shared.host().on_verdict(v, inv, now_ms());
        } else {
            tracing::warn!("no GPU sample within 10 s; serving without an inventory yet");
        }
    }
    let (exit_tx, mut exit_rx) = mpsc::unbounded_channel::<(String, Exit)>();
    tokio::spawn(async move {
        while let Some((id, reaper)) = spawned_rx.recv().await {
            let tx = exit_tx.clone();
            // One parked thread per workload the agent started: wait(2) is the only
            // exact exit status, and the agent must reap its children anyway.
            std::thread::spawn(move || {
                let exit = reaper.wait();
                let _ = tx.send((id, exit));
            });
        }
    });
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let vouch = Arc::new(crate::vouch::Vouch::new(
        &cfg.agent.allocator,
        cfg.agent.state_dir.clone(),
        cfg.agent.min_uid,
    ));
    let server = tokio::spawn(
        tonic::transport::Server::builder()
            // Bigger messages are refused (OUT_OF_RANGE) before they are buffered.
            .add_service(
                AgentLocalServer::new(LocalApi(shared.clone()))
                    .max_decoding_message_size(allot_common::fields::MAX_MESSAGE),
            )
            // The user commands, forwarded to allotd vouching for the caller.
            .add_service(
                pb::workloads_server::WorkloadsServer::from_arc(vouch.clone())
                    .max_decoding_message_size(allot_common::fields::MAX_MESSAGE),
            )
            .add_service(
                pb::org_server::OrgServer::from_arc(vouch.clone())
                    .max_decoding_message_size(allot_common::fields::MAX_MESSAGE),
            )
            .add_service(
                pb::nodes_server::NodesServer::from_arc(vouch)
                    .max_decoding_message_size(allot_common::fields::MAX_MESSAGE),
            )
            .serve_with_incoming_shutdown(
                tokio_stream::wrappers::UnixListenerStream::new(listener),
                async {
                    let _ = stop_rx.await;
                },
            ),
    );
    if !cfg.agent.allocator.is_empty() && !login {
        let facts = crate::uplink::HostFacts {
            cluster: cfg.agent.cluster.clone(),
            gpu_type: cfg.agent.gpu_type.clone(),
            features: cfg.agent.features.clone(),
            advertise: cfg.agent.advertise_addr.clone(),
        };
        tokio::spawn(crate::uplink::run(
            shared.clone(),
            cfg.agent.allocator.clone(),
            facts,
            cfg.agent.state_dir.clone(),
        ));
    }
    if !cfg.agent.metrics_listen.is_empty() {
        let l = tokio::net::TcpListener::bind(&cfg.agent.metrics_listen)
            .await
            .with_context(|| {
                format!(
                    "binding [agent] metrics_listen {}",
                    cfg.agent.metrics_listen
                )
            })?;
        tracing::info!(addr = %cfg.agent.metrics_listen, "serving /metrics");
        tokio::spawn(crate::metrics::serve(l, shared.clone()));
    }
    tracing::info!(socket = %cfg.agent.socket.display(), state_dir = %cfg.agent.state_dir.display(), source = %cfg.health.source, "allot-agent ready");
    allot_common::systemd::notify("READY=1");
    let watchdog = allot_common::systemd::watchdog_interval();
    // Free space is measured at once, then every disk_check_interval (and after a
    // reload, which may have moved the threshold).
    let mut next_disk = tokio::time::Instant::now();
    // Whether leases use their GPUs is read from the samples every health interval.
    let mut next_use = tokio::time::Instant::now();
    loop {
        // Fed from the contract loop: a wedged host lock stops the pings and systemd
        // restarts the agent (workloads stay: KillMode=process).
        if watchdog.is_some() {
            allot_common::systemd::notify("WATCHDOG=1");
        }
        let jobs = shared.host().tick(now_ms());
        for job in jobs {
            let sh = shared.clone();
            tokio::task::spawn_blocking(move || {
                let outcome = allot_checkpoint_hooks::run(&job.target, &job.ladder);
                if let Some(s) = job.supervisor {
                    // It records the exit once the output is drained: a few ms.
                    crate::procid::wait_gone(s, Duration::from_secs(5));
                }
                sh.host().ladder_done(&job.lease, &outcome, now_ms());
                sh.wake.notify_one();
            });
        }
        let write_failed = shared.host().take_disk_check();
        if write_failed {
            // A write failed (a start, a lease's change): the disk is looked at now,
            // and allotd hears of the drain it made.
            check_disk(&cfg, &shared);
            crate::uplink::send(&shared, crate::uplink::health(&shared));
        }
        if shared
            .health_due
            .swap(false, std::sync::atomic::Ordering::AcqRel)
        {
            crate::uplink::send(&shared, crate::uplink::health(&shared));
        }
        crate::uplink::flush(&shared);
        let next = shared.host().next_wakeup(now_ms());
        let sleep = next
            .map_or(Duration::from_secs(3600), |at| {
                Duration::from_millis(u64::try_from(at - now_ms()).unwrap_or(0))
            })
            .min(watchdog.unwrap_or(Duration::MAX));
        tokio::select! {
            _ = tokio::time::sleep(sleep) => {}
            _ = shared.wake.notified() => {}
            Some((id, exit)) = exit_rx.recv() => shared.host().on_exit(&id, &exit, now_ms()),
            Some((v, inv)) = vrx.recv() => {
                shared.host().on_verdict(v, inv, now_ms());
                crate::uplink::send(&shared, crate::uplink::health(&shared));
            }
            _ = tokio::time::sleep_until(next_use), if shared.monitor.is_some() => {
                if let Some(m) = &shared.monitor {
                    let inventory = m.lock().unwrap_or_else(|e| e.into_inner()).inventory();
                    shared.host().on_samples(inventory, now_ms());
                }
                next_use = tokio::time::Instant::now()
                    + Duration::from_secs(cfg.health.interval_s.max(1));
            }
            _ = tokio::time::sleep_until(next_disk) => {
                check_disk(&cfg, &shared);
                next_disk = tokio::time::Instant::now()
                    + Duration::from_secs(cfg.agent.disk_check_interval.max(1));
            }
            _ = hup.recv() => {
                reload(&o, &mut cfg, &shared);
                next_disk = tokio::time::Instant::now();
            }
            Some(()) = cfg_rx.recv() => {
                reload(&o, &mut cfg, &shared);
                next_disk = tokio::time::Instant::now();
            }
            _ = term.recv() => break,
            _ = int.recv() => break,
        }
    }
    // Workloads keep running: the next agent re-adopts them.
    tracing::info!("allot-agent stopping; workloads keep running");
    allot_common::systemd::notify("STOPPING=1");
    let _ = stop_tx.send(());
    let _ = tokio::time::timeout(Duration::from_secs(5), server).await;
    let _ = std::fs::remove_file(&cfg.agent.socket);
    if let Placement::At(base) = &cgroups {
        // Only when no lease cgroup is left in it: running work stays where it is.
        let _ = std::fs::remove_dir(base);
    }
    Ok(())
}

/// One check on the daemon's loop (every `disk_check_interval`, and at once after a
/// write failed): the host's faults set or cleared, allotd told when the verdict
/// changed.
fn check_disk(c: &crate::config::AgentConfig, sh: &crate::shared::Shared) {
    let now_ms = crate::host::now_ms();
    // A failed write is tried again first: it clears only by a write that succeeds.
    let mut changed = sh.host().retry_write(now_ms);
    let was_low = sh.host().disk_low();
    let a = crate::disk::assess(
        &crate::disk::paths(c),
        &crate::disk::Statvfs,
        c.agent.min_free_bytes,
        was_low,
        u64::try_from(now_ms / 1000).unwrap_or(0),
    );
    for e in &a.errors {
        tracing::warn!(error = %e, "cannot measure free space");
    }
    changed |= sh.host().on_disk(a.fault, now_ms);
    if changed {
        crate::uplink::send(sh, crate::uplink::health(sh));
        sh.wake.notify_one();
    }
}
