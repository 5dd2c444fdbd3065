//! `allotd serve`: the allocator service. One [`Server`] holds the state machine and
//! its store behind a mutex; every accepted input is applied, journaled (fsynced)
//! and only then answered; the messages it produces go to the agents' streams. A
//! scheduling loop runs a pass after any change (debounced), at the core's next
//! wake-up and on a timer, and marks silent nodes lost after the grace.

use crate::config::ServerConfig;
use crate::state::{Allocator, Applied, Command, Input, Level, Out};
use crate::store::{Sqlite, Store};
use allot_common::drain::DrainAuthor;
use allot_fairshare::{CoreError, Time};
use allot_proto::v1 as pb;
use anyhow::Context;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, Notify};

/// Wall-clock Unix seconds: the time every input is stamped with.
pub fn now() -> Time {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// The state machine with its store.
pub struct Core {
    /// State.
    pub alloc: Allocator,
    store: Box<dyn Store>,
    /// What allotd acknowledged, outside the database (`acked.rs`).
    marker: crate::acked::Marker,
    /// Journal entries written since the last snapshot.
    since_snapshot: u64,
}

impl Core {
    /// A retired workload's record.
    pub fn retired(&self, id: u64) -> anyhow::Result<Option<crate::state::WorkRec>> {
        match self.store.retired(id)? {
            Some(body) => Ok(Some(serde_json::from_str(&body).with_context(|| {
                format!("the retired record of workload {id} does not read")
            })?)),
            None => Ok(None),
        }
    }

    /// Writes a snapshot of the state as of the last journal entry, retiring the
    /// workloads that ended more than `keep_finished` ago.
    fn snapshot(&mut self, at: Time, keep: &crate::config::ServerSection) -> anyhow::Result<()> {
        let t = Instant::now();
        let (seq, bytes, retired) =
            write_snapshot(&mut self.alloc, self.store.as_mut(), at, keep.keep_finished)?;
        self.since_snapshot = 0;
        match self
            .store
            .prune_runs(at.saturating_sub(keep.history_retention))
        {
            Ok(0) => {}
            Ok(n) => tracing::info!(runs = n, "history past history_retention forgotten"),
            // History is kept longer than asked, never lost: the next snapshot tries again.
            Err(e) => tracing::warn!(error = %e, "history not pruned"),
        }
        tracing::info!(
            seq,
            bytes,
            retired,
            ms = t.elapsed().as_millis() as u64,
            "snapshot taken; the journal below it compacted"
        );
        Ok(())
    }

    /// Runs kept for history that match `q` (see [`Store::runs`]).
    pub fn runs(
        &self,
        q: &crate::history::Query,
    ) -> Result<(Vec<crate::history::RunRow>, bool), crate::store::StoreError> {
        self.store.runs(q)
    }

    /// The audit log's lines about a workload.
    pub fn audit_of(
        &self,
        workload: u64,
        limit: usize,
    ) -> Result<Vec<(Time, String)>, crate::store::StoreError> {
        self.store.audit_of(workload, limit)
    }
}

/// Scheduling-loop figures for `/metrics`.
#[derive(Debug, Default, Clone)]
pub struct LoopStats {
    /// Passes run.
    pub passes: u64,
    /// Seconds spent in passes.
    pub seconds: f64,
    /// The last pass.
    pub last: f64,
}

/// One agent's outbound stream.
pub type Session = mpsc::UnboundedSender<Result<pb::AllocatorMessage, tonic::Status>>;

/// How often every host is sent again what allotd wants stopped there.
const RESYNC: Duration = Duration::from_secs(30);

/// Agents that understand withdrawn revocations and health drains from allotd.
pub const PROTOCOL_DRAINS: u32 = 2;

/// Agents that run a start's batch script (older ones would run its arguments).
pub const PROTOCOL_SCRIPTS: u32 = 4;

/// The agent protocol a start needs, and what it runs that an older agent would
/// not run right: a session's terminal, a batch script.
fn start_needs(cmd: &Command) -> Option<(u32, &'static str)> {
    match cmd {
        Command::Start(s) if s.pty => {
            Some((crate::attach::PROTOCOL_TTY, "give a session a terminal"))
        }
        Command::Start(s) if !s.script.is_empty() => Some((PROTOCOL_SCRIPTS, "run a batch script")),
        _ => None,
    }
}

/// The lease `cmd` is about (a start's; 0 for others).
fn cmd_lease(cmd: &Command) -> u64 {
    match cmd {
        Command::Start(s) => s.lease,
        _ => 0,
    }
}

/// Whether an agent of `protocol` understands `cmd`; an older agent would misread it
/// (a withdrawal as a revocation now, a health drain or hold as its operator's drain).
fn understood(protocol: u32, cmd: &Command) -> bool {
    protocol >= PROTOCOL_DRAINS
        || !matches!(cmd, Command::Withdraw { .. } | Command::Hold { .. })
            && !matches!(cmd, Command::Drain { by, .. } if by == DrainAuthor::Health.as_str())
}

/// The running service.
pub struct Server {
    core: Mutex<Core>,
    /// Config in force.
    pub cfg: ServerConfig,
    /// Open agent streams by node: session number, sender, the agent's protocol.
    pub sessions: Mutex<HashMap<String, (u64, Session, u32)>>,
    /// Wakes the scheduling loop.
    pub kick: Notify,
    /// Loop figures.
    pub stats: Mutex<LoopStats>,
    next_wakeup: Mutex<Option<Time>>,
    session_seq: std::sync::atomic::AtomicU64,
    /// The cluster CA and allotd's certificate.
    pub pki: crate::pki::Pki,
    /// When this process started: a node is lost only after the grace of this
    /// process's own uptime without its agent (the journal's last-seen times are
    /// from before a restart, when the agents could not reach us).
    started: Time,
    /// Open connections and Watch streams, and their caps.
    pub conns: Arc<crate::conns::Conns>,
    /// Log reads waiting for their agents' answers (`allot logs`).
    pub logs: crate::log_relay::LogRelay,
    /// Notices to users (`--notify`), delivered off the commit.
    pub notifier: crate::notify::Notifier,
    /// When pending work may start (`[server] forecast_every`).
    pub forecasts: crate::forecast::Forecasts,
    /// Sessions' terminals attached through agents (`allot attach`).
    pub ttys: crate::attach::TtyRelay,
    /// When each session's keystrokes were last journaled as its use.
    pub(crate) typed: Mutex<HashMap<u64, Time>>,
}

impl Server {
    /// Opens the store, loads the last snapshot and applies the journal after it,
    /// takes a snapshot of the result (so the next start reads no tail, and a
    /// journal an earlier release wrote is compacted), and returns the service.
    pub fn open(cfg: ServerConfig) -> anyhow::Result<Arc<Server>> {
        let mut store = Sqlite::open(&cfg.server.state_dir)?;
        let marker = acknowledged(&cfg, &mut store)?;
        let pki = crate::pki::ensure(&cfg, "allot", now())?;
        let t0 = Instant::now();
        let (alloc, tail) = load(&cfg, &store)?;
        let loaded_ms = t0.elapsed().as_millis() as u64;
        let conns = Arc::new(crate::conns::Conns::new(&cfg.server));
        let cfg_notify = cfg.notify.clone();
        let server = Arc::new(Server {
            core: Mutex::new(Core {
                alloc,
                store: Box::new(store),
                marker,
                since_snapshot: tail,
            }),
            cfg,
            sessions: Mutex::new(HashMap::new()),
            kick: Notify::new(),
            stats: Mutex::new(LoopStats::default()),
            next_wakeup: Mutex::new(None),
            session_seq: std::sync::atomic::AtomicU64::new(1),
            pki,
            started: now(),
            conns,
            logs: Default::default(),
            notifier: crate::notify::Notifier::start(&cfg_notify),
            forecasts: crate::forecast::Forecasts::new(),
            ttys: Default::default(),
            typed: Mutex::new(HashMap::new()),
        });
        if tail > 0 {
            server.snapshot()?;
        }
        tracing::info!(
            tail,
            ms = loaded_ms,
            "state loaded from the last snapshot and the journal after it"
        );
        Ok(server)
    }

    /// Writes a snapshot of the state now, compacting the journal below it.
    pub fn snapshot(&self) -> anyhow::Result<()> {
        let mut c = self.core();
        c.snapshot(now(), &self.cfg.server)
    }

    /// Whether allotd can serve (`/readyz`): its state's lock is taken within 2 s
    /// (a pass holds it for milliseconds; a wedged one is not ready).
    pub fn readiness(&self) -> Result<(), String> {
        let until = Instant::now() + Duration::from_secs(2);
        loop {
            match self.core.try_lock() {
                Ok(_) | Err(std::sync::TryLockError::Poisoned(_)) => return Ok(()),
                Err(std::sync::TryLockError::WouldBlock) if Instant::now() < until => {
                    std::thread::sleep(Duration::from_millis(10));
                }
                Err(std::sync::TryLockError::WouldBlock) => {
                    return Err("the state has been locked for over 2 s".into())
                }
            }
        }
    }

    /// Locks the state (a panic elsewhere must not wedge the service).
    pub fn core(&self) -> MutexGuard<'_, Core> {
        self.core.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Applies, journals and carries out one input. The answer goes back only after
    /// the journal has it on disk.
    pub fn commit(&self, input: Input) -> Result<Applied, CoreError> {
        let applied = self.record(input)?;
        self.dispatch(&applied.outs);
        Ok(applied)
    }

    /// Applies and journals one input, and logs what it says; the commands it
    /// produced are left to the caller to send.
    pub fn record(&self, input: Input) -> Result<Applied, CoreError> {
        let at = now();
        let applied = {
            let mut c = self.core();
            let a = c.alloc.apply(at, &input)?;
            let audit: Vec<(u64, u64, &str)> = a
                .outs
                .iter()
                .filter_map(|o| match o {
                    Out::Audit {
                        workload,
                        lease,
                        text,
                    } => {
                        tracing::info!(workload, lease, "{text}");
                        Some((*workload, *lease, text.as_str()))
                    }
                    Out::Notice {
                        level: Level::Warn,
                        node,
                        text,
                    } => {
                        tracing::warn!(node = %node, "{text}");
                        None
                    }
                    Out::Notice {
                        level: Level::Error,
                        node,
                        text,
                    } => {
                        tracing::error!(node = %node, "{text}");
                        None
                    }
                    Out::Send { .. } | Out::Run(_) | Out::Notify(_) => None,
                })
                .collect();
            let runs: Vec<&crate::history::RunRow> = a
                .outs
                .iter()
                .filter_map(|o| match o {
                    Out::Run(r) => Some(&**r),
                    _ => None,
                })
                .collect();
            let entry = a.changed.then(|| a.record.as_ref().unwrap_or(&input));
            let journaled = match c.store.commit(at, entry, &audit, &runs) {
                Ok(seq) => seq,
                Err(e) => {
                    // Memory now holds what the disk does not: stop, the journal wins.
                    tracing::error!(error = %e, "cannot journal an accepted input; stopping");
                    eprintln!("allotd: {e}");
                    std::process::exit(70);
                }
            };
            if let Some(seq) = journaled {
                // Before the answer: what allotd acknowledges, outside the database.
                let (next_workload, next_lease) = c.alloc.core.next_ids();
                let acked = crate::acked::Acked {
                    seq,
                    next_workload,
                    next_lease,
                    db: 0,
                };
                if let Err(e) = c.marker.record(acked) {
                    tracing::error!(error = %e, "cannot record what was acknowledged; stopping");
                    eprintln!("allotd: {}: {e}", c.marker.path().display());
                    std::process::exit(70);
                }
            }
            drop(audit);
            if entry.is_some() {
                c.since_snapshot += 1;
                if c.since_snapshot >= self.cfg.server.snapshot_every.max(1) {
                    if let Err(e) = c.snapshot(at, &self.cfg.server) {
                        // The journal still holds everything: a snapshot is an
                        // optimisation of start-up, never the only copy.
                        tracing::error!(error = %e, "snapshot not taken; the journal keeps growing");
                    }
                }
            }
            a
        };
        if matches!(input, Input::Schedule) {
            *self.next_wakeup.lock().unwrap_or_else(|e| e.into_inner()) = applied.next_wakeup;
        } else if applied.changed {
            self.kick.notify_one();
        }
        Ok(applied)
    }

    /// Sends each message to its node's stream (a node without one gets it again
    /// when it reconnects and reconciles).
    pub fn dispatch(&self, outs: &[Out]) {
        for o in outs {
            if let Out::Notify(n) = o {
                self.notifier.send((**n).clone());
            }
        }
        let mut refused = Vec::new();
        let sessions = self.sessions.lock().unwrap_or_else(|e| e.into_inner());
        for o in outs {
            if let Out::Send { node, cmd } = o {
                let needs = start_needs(cmd);
                match sessions.get(node) {
                    Some((_, _, protocol)) if needs.is_some_and(|(p, _)| *protocol < p) => {
                        let what = needs.map_or("", |(_, w)| w);
                        refused.push((node.clone(), cmd_lease(cmd), *protocol, what));
                    }
                    Some((_, _, protocol))
                        if *protocol < crate::attach::PROTOCOL_TTY
                            && matches!(cmd, Command::Notice { .. }) =>
                    {
                        tracing::debug!(node = %node, "a session's notice skipped: the agent is too old")
                    }
                    Some((_, tx, protocol)) if understood(*protocol, cmd) => {
                        let _ = tx.send(Ok(crate::wire::command_pb(cmd)));
                    }
                    Some(_) => {
                        tracing::debug!(node = %node, "message skipped: the agent is too old to read it")
                    }
                    None => {
                        tracing::debug!(node = %node, "no stream; the message waits for reconciliation")
                    }
                }
            }
        }
        drop(sessions);
        // An agent too old to run a batch script would run its arguments instead
        // (and one too old for a session would run it without a terminal): its
        // part is refused as the agent itself refuses a start, so the core offers
        // that size elsewhere until the node changes (an upgraded agent registers
        // again).
        for (node, lease, protocol, what) in refused {
            tracing::warn!(node = %node, lease, protocol, "a start refused: the agent is too old to {what}");
            let input = Input::LeaseEnded {
                lease,
                end: allot_fairshare::LeaseEnd::Refused,
                reason: format!(
                    "refused on {node}: its allot-agent is too old to {what}; upgrade it"
                ),
                node,
                exit_code: None,
                signal: None,
                part: true,
                leaving: true,
            };
            if let Err(e) = self.commit(input) {
                tracing::warn!(lease, error = %e, "refusal not applied");
            }
        }
    }

    /// Registers an agent's stream; returns its session number.
    pub fn attach(&self, node: &str, tx: Session, protocol: u32) -> u64 {
        let n = self
            .session_seq
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        self.sessions
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(node.to_string(), (n, tx, protocol));
        n
    }

    /// Sends `m` on agent session `session` of `node` while it is the node's
    /// current one. Holding no sender of its own, the caller leaves a replaced
    /// session's stream to end, so its agent reconnects.
    pub fn answer(&self, node: &str, session: u64, m: pb::AllocatorMessage) {
        let s = self.sessions.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((_, tx, _)) = s.get(node).filter(|(n, _, _)| *n == session) {
            let _ = tx.send(Ok(m));
        }
    }

    /// Held health drains are looked at again (for hosts still connected; one
    /// alone puts its drain in force itself): once the breaker's window has room,
    /// they go through.
    fn recheck_held(&self) {
        let held: Vec<String> = self
            .core()
            .alloc
            .nodes()
            .values()
            .filter(|n| {
                n.connected
                    && n.held.is_some()
                    && !n.drains.contains_key(DrainAuthor::Health.as_str())
            })
            .map(|n| n.spec.name.clone())
            .collect();
        for node in held {
            if let Err(e) = self.commit(Input::RecheckHeld { node: node.clone() }) {
                tracing::warn!(node = %node, error = %e, "held drain not re-checked");
            }
        }
    }

    /// Sessions idle past their protection are told so on their terminals, once
    /// (`Allocator::idle_sessions`).
    fn warn_idle_sessions(&self) {
        let idle = self.core().alloc.idle_sessions(now());
        for lease in idle {
            if let Err(e) = self.commit(Input::SessionIdle { lease }) {
                tracing::warn!(lease, error = %e, "idle session not told");
            }
        }
    }

    /// The connected hosts are sent again what allotd wants stopped
    /// (`Allocator::wanted_stops`): a revocation sent into a session that was
    /// breaking reached nobody, and the job would run on holding its GPUs. Idempotent
    /// on the agent; at most once a `RESYNC`.
    fn resync(&self, last: &mut std::time::Instant) {
        if last.elapsed() < RESYNC {
            return;
        }
        *last = std::time::Instant::now();
        let sends = self.core().alloc.wanted_stops(None);
        self.dispatch(&sends);
    }

    /// Ends node `node`'s stream (it was revoked).
    pub fn cut(&self, node: &str) {
        let session = self
            .sessions
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(node)
            .map(|s| s.0);
        if let Some(s) = session {
            self.detach(node, s);
        }
    }

    /// Forgets an agent's stream (if it is still this session).
    pub fn detach(&self, node: &str, session: u64) {
        let mut s = self.sessions.lock().unwrap_or_else(|e| e.into_inner());
        if s.get(node).is_some_and(|(n, _, _)| *n == session) {
            s.remove(node);
            drop(s);
            self.core().alloc.agent_disconnected(node, now());
        }
    }

    fn pass(&self) {
        let t0 = Instant::now();
        if let Err(e) = self.commit(Input::Schedule) {
            tracing::error!(error = %e, "scheduling pass failed");
        }
        let dt = t0.elapsed().as_secs_f64();
        let mut st = self.stats.lock().unwrap_or_else(|e| e.into_inner());
        st.passes += 1;
        st.seconds += dt;
        st.last = dt;
    }

    /// Nodes silent past the grace are lost: they take no new work
    /// (`Allocator::silent_nodes`, `lost_input`). Their leases end only once their
    /// host has fenced them (`fenced_nodes`, `lost_parts`), so that no workload runs
    /// twice at once. Each input is committed as any other.
    fn mark_lost(&self) {
        let grace = self.cfg.server.lost_grace;
        let lost = self.core().alloc.silent_nodes(now(), self.started, grace);
        for node in lost {
            let fence_s = self
                .core()
                .alloc
                .nodes()
                .get(&node)
                .map_or(0, |n| n.fence_s);
            if fence_s == 0 {
                tracing::warn!(node = %node, grace_s = grace, "agent silent past the grace: node lost; its agent does not fence, so its leases are held until the host reports");
            } else {
                tracing::warn!(node = %node, grace_s = grace, fence_s, "agent silent past the grace: node lost; its leases end once its host has fenced them");
            }
            let _ = self.commit(Allocator::lost_input(&node, grace));
        }
        let fenced = self.core().alloc.fenced_nodes(now(), self.started);
        for node in fenced {
            tracing::warn!(node = %node, "a lost node's fence has passed: its leases end node-lost");
            let parts = self.core().alloc.lost_parts(&node);
            for input in parts {
                let _ = self.commit(input);
            }
        }
    }

    /// The scheduling loop: after changes (debounced 20 ms) and at the core's
    /// wake-up, either no sooner than `min_pass_interval` after the last pass; and
    /// every `schedule_interval`.
    pub async fn schedule_loop(self: Arc<Self>) {
        let watchdog = allot_common::systemd::watchdog_interval();
        // The watchdog is fed from this loop, so a wedged state lock stops the pings.
        let interval = watchdog.unwrap_or(Duration::MAX).min(Duration::from_secs(
            self.cfg.server.schedule_interval.max(1),
        ));
        let min_gap = Duration::from_secs(self.cfg.server.min_pass_interval);
        let mut last_pass = std::time::Instant::now();
        let mut last_resync = std::time::Instant::now();
        loop {
            let wake = *self.next_wakeup.lock().unwrap_or_else(|e| e.into_inner());
            // The core's wake-ups wait out min_pass_interval too (a pass cut short
            // asks for one a second later); the watchdog's interval does not.
            let until = wake
                .map(|w| Duration::from_secs(w.saturating_sub(now())))
                .unwrap_or(interval)
                .max(min_gap.saturating_sub(last_pass.elapsed()))
                .min(interval);
            tokio::select! {
                _ = self.kick.notified() => {
                    let debounce = Duration::from_millis(20)
                        .max(min_gap.saturating_sub(last_pass.elapsed()));
                    tokio::time::sleep(debounce).await;
                }
                _ = tokio::time::sleep(until) => {}
            }
            last_pass = std::time::Instant::now();
            self.mark_lost();
            self.recheck_held();
            self.warn_idle_sessions();
            self.resync(&mut last_resync);
            self.pass();
            if watchdog.is_some() {
                allot_common::systemd::notify("WATCHDOG=1");
            }
        }
    }
}

/// Writes `alloc` as a snapshot at `at` into `store`, moving the workloads that
/// ended more than `keep_finished` ago to the retired records; returns the journal
/// position, the snapshot's size and how many retired. Should the write fail, the
/// retired workloads stay in memory (and the journal keeps everything).
pub fn write_snapshot(
    alloc: &mut Allocator,
    store: &mut dyn Store,
    at: Time,
    keep_finished: u64,
) -> anyhow::Result<(u64, usize, usize)> {
    let retired = alloc.retire(at.saturating_sub(keep_finished));
    let written = serde_json::to_string(&alloc.snapshot())
        .context("encoding a snapshot")
        .and_then(|body| {
            let recs = retired
                .iter()
                .map(|w| Ok((w.id, serde_json::to_string(w)?)))
                .collect::<serde_json::Result<Vec<_>>>()
                .context("encoding a retired workload")?;
            let seq = store.snapshot(at, &body, &recs)?;
            Ok((seq, body.len()))
        });
    match written {
        Ok((seq, bytes)) => Ok((seq, bytes, retired.len())),
        Err(e) => {
            alloc.unretire(retired);
            Err(e)
        }
    }
}

/// Opens what allotd acknowledged and refuses a database whose journal ends before
/// it (its write-ahead log lost or damaged); a state dir without one starts it at
/// the database's position.
pub fn acknowledged(
    cfg: &ServerConfig,
    store: &mut dyn Store,
) -> anyhow::Result<crate::acked::Marker> {
    let dir = &cfg.server.state_dir;
    let id = store.db_id()?;
    let file = dir.join(crate::acked::FILE);
    if crate::acked::Marker::damaged(dir).with_context(|| format!("reading {}", file.display()))? {
        anyhow::bail!(crate::acked::damaged_text(&file));
    }
    if !file.exists() && store.last_seq()? > 0 {
        tracing::warn!(
            file = %file.display(),
            "no record of what allotd acknowledged beside a database that holds a journal (a state dir from before 0.3, or a backup restored here): the lost-log check starts from the database's position"
        );
    }
    let (mut marker, acked) = crate::acked::Marker::open(dir, &id)
        .with_context(|| format!("opening {}", dir.join(crate::acked::FILE).display()))?;
    let mut seq = store.last_seq()?;
    let this = crate::acked::db_hash(&id);
    if let Some(a) = acked {
        if let Some(why) = crate::acked::older(&dir.join("allotd.db"), this, marker.path(), seq, &a)
        {
            anyhow::bail!(why);
        }
        if a.db != this && (a.next_workload, a.next_lease) != (0, 0) {
            // A database started afresh (or put here by hand) where another one gave
            // ids: they are not given again.
            seq = store
                .commit(
                    now(),
                    Some(&Input::IdsAbove {
                        next_workload: a.next_workload,
                        next_lease: a.next_lease,
                        why: "a new state file replaced one that had given ids".into(),
                    }),
                    &[],
                    &[],
                )?
                .unwrap_or(seq);
        }
    }
    if acked.is_none_or(|a| a.db != this) {
        marker
            .record(crate::acked::Acked {
                seq,
                ..Default::default()
            })
            .with_context(|| format!("writing {}", marker.path().display()))?;
    }
    Ok(marker)
}

/// The state the store holds: the last snapshot restored under `cfg`, then the
/// journal after it applied (decisions as recorded; a pass only for entries older
/// releases wrote). Returns it with the number of journal entries applied.
pub fn load(cfg: &ServerConfig, store: &dyn Store) -> anyhow::Result<(Allocator, u64)> {
    let loaded = store.load()?;
    let db = cfg.server.state_dir.join("allotd.db");
    let mut alloc = match &loaded.snapshot {
        Some((seq, at, body)) => {
            let snap: crate::state::Snapshot = serde_json::from_str(body).with_context(|| {
                format!("the snapshot at journal position {seq} in {} does not read: `allotd state check` says more; `allotd state import` restores an export", db.display())
            })?;
            Allocator::restore(cfg, &snap, *at).with_context(|| {
                format!(
                    "the snapshot at journal position {seq} in {} does not fit this config",
                    db.display()
                )
            })?
        }
        None => Allocator::new(cfg).map_err(|e| anyhow::anyhow!("{e}"))?,
    };
    for (seq, at, input) in &loaded.tail {
        if let Err(e) = alloc.apply(*at, input) {
            // The config changed under the journal (a project removed …): say so.
            tracing::warn!(seq, error = %e, "journal entry no longer applies; skipped");
        }
    }
    Ok((alloc, loaded.tail.len() as u64))
}
