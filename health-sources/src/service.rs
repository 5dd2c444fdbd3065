//! The running health monitor the agent embeds: a sampling thread (every
//! `interval_s`, plus DCGM when configured), an NVML event thread (blocking waits), and
//! a kernel-log thread, all feeding one [`HealthPolicy`]; every change of the verdict
//! is sent on a channel.
//!
//! Plain threads, not async: NVML's event wait and `/dev/kmsg` reads block in the
//! kernel, and the policy is cheap enough to share behind a mutex.

use crate::dcgm;
use crate::fake::FakeSource;
use crate::kmsg_reader::{self, KmsgMemory, KmsgReader};
use crate::monitor::Roster;
use crate::nvml::{GpuReadError, Notice, NvmlSource};
use allot_health::config::HealthConfig;
use allot_health::config::SourceSpec;
use allot_health::kmsg::{self, Kind};
use allot_health::verdict::{GpuSample, HealthPolicy, Time, Verdict};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Why the monitor could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// NVML could not be loaded.
    #[error(transparent)]
    Nvml(#[from] crate::nvml::NvmlSourceError),
    /// The fake source's script.
    #[error(transparent)]
    Script(#[from] crate::fake::ScriptError),
    /// A file could not be read.
    #[error("{0}")]
    Io(String),
}

fn now() -> Time {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// One sampling round: per-GPU results, and XIDs the round brought (scripted faults).
type Round = (Vec<Result<GpuSample, GpuReadError>>, Vec<(String, u32)>);

enum Source {
    Nvml(Arc<NvmlSource>),
    Fake(Mutex<FakeSource>, Time),
}

impl Source {
    /// One round; `None` when NVML cannot even count its GPUs (nothing is learnt, and
    /// no GPU should look vanished because of it).
    fn round(&self, t: Time) -> Option<Round> {
        match self {
            Source::Nvml(n) => match n.sample_all() {
                Ok(r) => Some((r, Vec::new())),
                Err(e) => {
                    tracing::warn!(error = %e, "NVML sampling round failed");
                    None
                }
            },
            Source::Fake(f, start) => {
                let mut f = f.lock().unwrap_or_else(|e| e.into_inner());
                let xids = f.advance(t.saturating_sub(*start));
                Some((f.sample_all(), xids))
            }
        }
    }
}

struct Shared {
    policy: Mutex<(HealthPolicy, Roster, Option<Verdict>)>,
    tx: Mutex<Sender<Verdict>>,
    stop: AtomicBool,
    /// Wakes naps at once on stop (they hold `naps` while they wait).
    naps: Mutex<()>,
    wake: std::sync::Condvar,
    /// Highest kernel-log position (sequence number, or a plain file's offset) of a
    /// record acted on so far (0: none).
    last_seq: AtomicU64,
    memory: Mutex<KmsgMemory>,
    memo: PathBuf,
}

impl Shared {
    /// Runs `f` on the policy and sends the verdict if it changed.
    fn update(&self, f: impl FnOnce(&mut HealthPolicy, &mut Roster)) {
        let mut g = self.policy.lock().unwrap_or_else(|e| e.into_inner());
        let (policy, roster, last) = &mut *g;
        f(policy, roster);
        let v = policy.verdict();
        if last.as_ref() != Some(&v) {
            *last = Some(v.clone());
            let _ = self.tx.lock().unwrap_or_else(|e| e.into_inner()).send(v);
        }
    }
}

/// The running monitor; dropping it stops the threads it can stop.
pub struct HealthMonitor {
    shared: Arc<Shared>,
    threads: Vec<JoinHandle<()>>,
    /// Every new verdict, as it changes.
    pub updates: Receiver<Verdict>,
}

impl HealthMonitor {
    /// Starts sampling per `cfg`; `state_dir` keeps the kernel-log memory.
    pub fn start(cfg: &HealthConfig, state_dir: &Path) -> Result<Self, StartError> {
        let source = match cfg.source_spec() {
            SourceSpec::Nvml(lib) => {
                Source::Nvml(Arc::new(NvmlSource::open(lib.as_deref().map(Path::new))?))
            }
            SourceSpec::None => {
                return Err(StartError::Io(
                    "no GPU source (`none`: a login host, which runs no work)".into(),
                ))
            }
            SourceSpec::Fake(n, script) => {
                let (text, name) = match script {
                    Some(p) => (
                        std::fs::read_to_string(&p)
                            .map_err(|e| StartError::Io(format!("{p}: {e}")))?,
                        p,
                    ),
                    None => (String::new(), "(no script)".into()),
                };
                Source::Fake(Mutex::new(FakeSource::new(n, &text, &name)?), now())
            }
        };
        let (tx, updates) = channel();
        let memo = state_dir.join("kmsg-resets.json");
        let mut memory = KmsgMemory::load(&memo).unwrap_or_else(|e| {
            tracing::warn!(error = %e, "kernel-log memory unreadable; treating every XID of this boot as new");
            KmsgMemory::default()
        });
        let boot = kmsg_reader::boot_id().unwrap_or_default();
        memory.for_boot(&kmsg_reader::log_identity(Path::new(&cfg.kmsg), &boot));
        // A plain file cut or rewritten in place (same inode) no longer has the lines
        // its offsets pointed at.
        let len = std::fs::metadata(&cfg.kmsg)
            .ok()
            .filter(std::fs::Metadata::is_file)
            .map(|m| m.len());
        if len.is_some_and(|len| memory.reset_through.values().any(|p| *p > len)) {
            memory.reset_through.clear();
        }
        let mut policy = HealthPolicy::new(cfg.thresholds.clone(), cfg.catalog());
        for (pci, seq) in &memory.reset_through {
            policy.gpu_reset(pci, Some(*seq));
        }
        let shared = Arc::new(Shared {
            policy: Mutex::new((policy, Roster::default(), None)),
            tx: Mutex::new(tx),
            stop: AtomicBool::new(false),
            naps: Mutex::new(()),
            wake: std::sync::Condvar::new(),
            last_seq: AtomicU64::new(0),
            memory: Mutex::new(memory),
            memo,
        });
        let mut threads = Vec::new();
        let source = Arc::new(source);
        if let Source::Nvml(n) = &*source {
            let (n, sh) = (n.clone(), shared.clone());
            threads.push(std::thread::spawn(move || events(&n, &sh)));
        }
        {
            let (src, sh, interval) = (source.clone(), shared.clone(), cfg.interval_s.max(1));
            let dcgm_url = cfg.dcgm_url.clone();
            threads.push(std::thread::spawn(move || {
                sampler(&src, &sh, interval, dcgm_url)
            }));
        }
        if !cfg.kmsg.is_empty() && Path::new(&cfg.kmsg).exists() {
            let (path, sh) = (PathBuf::from(&cfg.kmsg), shared.clone());
            threads.push(std::thread::spawn(move || follow_kmsg(&path, &sh)));
        }
        Ok(HealthMonitor {
            shared,
            threads,
            updates,
        })
    }

    /// The verdict now.
    pub fn verdict(&self) -> Verdict {
        let g = self.shared.policy.lock().unwrap_or_else(|e| e.into_inner());
        g.0.verdict()
    }

    /// The GPUs as last sampled (UUID, bus id, index, model …).
    pub fn inventory(&self) -> Vec<GpuSample> {
        let g = self.shared.policy.lock().unwrap_or_else(|e| e.into_inner());
        g.0.inventory()
    }

    /// Prometheus text for `/metrics` (see [`allot_health::verdict::HealthPolicy::metrics`]).
    pub fn metrics(
        &self,
        hostname: &str,
        holder: &dyn Fn(&str) -> Vec<(&'static str, String)>,
    ) -> String {
        let g = self.shared.policy.lock().unwrap_or_else(|e| e.into_inner());
        g.0.metrics(hostname, holder)
    }

    /// The GPU was reset (or the operator says it is fine): its conditions end, and
    /// the kernel-log records read so far are history for it, across restarts.
    pub fn gpu_reset(&self, pci: &str) {
        let seq = self.shared.last_seq.load(Ordering::SeqCst);
        let seq = (seq > 0).then_some(seq);
        self.shared.update(|p, _| p.gpu_reset(pci, seq));
        if let Some(seq) = seq {
            let mut m = self.shared.memory.lock().unwrap_or_else(|e| e.into_inner());
            // Never back: a reset read while the log is still being caught up with
            // must not bring back what an earlier one cured.
            let at = m.reset_through.entry(pci.to_string()).or_insert(0);
            *at = (*at).max(seq);
            if let Err(e) = m.save(&self.shared.memo) {
                tracing::warn!(error = %e, file = %self.shared.memo.display(), "cannot save the kernel-log memory");
            }
        }
    }
}

impl Drop for HealthMonitor {
    fn drop(&mut self) {
        {
            // Under the naps' lock, so no nap can miss the wake-up.
            let _g = self.shared.naps.lock().unwrap_or_else(|e| e.into_inner());
            self.shared.stop.store(true, Ordering::SeqCst);
            self.shared.wake.notify_all();
        }
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// Sleeps up to `d`, waking at once on stop; true if stopping.
fn nap(sh: &Shared, d: Duration) -> bool {
    let g = sh.naps.lock().unwrap_or_else(|e| e.into_inner());
    let _ = sh
        .wake
        .wait_timeout_while(g, d, |_| !sh.stop.load(Ordering::SeqCst));
    sh.stop.load(Ordering::SeqCst)
}

fn sampler(src: &Source, sh: &Shared, interval: u64, dcgm_url: Option<String>) {
    let mut gauge = dcgm::XidGauge::default();
    // One client for every scrape: its connection stays open between rounds.
    let client = reqwest::blocking::Client::builder()
        .timeout(Duration::from_secs(5))
        .build();
    loop {
        let t = now();
        let Some((mut round, xids)) = src.round(t) else {
            if nap(sh, Duration::from_secs(interval)) {
                return;
            }
            continue;
        };
        let mut dcgm_xids = Vec::new();
        if let Some(url) = &dcgm_url {
            let fetched = match &client {
                Ok(c) => dcgm::fetch_with(c, url),
                Err(_) => dcgm::fetch(url, Duration::from_secs(5)),
            };
            match fetched {
                Ok(text) => {
                    let gpus = dcgm::parse(&text);
                    for s in round.iter_mut().flatten() {
                        if let Some(d) = gpus.get(&s.pci) {
                            dcgm::fold(s, d);
                        }
                    }
                    dcgm_xids = gauge.changes(&gpus);
                }
                Err(e) => tracing::warn!(error = %e, "dcgm scrape failed; NVML alone this round"),
            }
        }
        sh.update(|p, roster| {
            for (pci, x) in xids.iter().chain(&dcgm_xids) {
                p.xid(t, pci, *x, "scripted or DCGM", None);
            }
            roster.apply(p, t, round);
        });
        if nap(sh, Duration::from_secs(interval)) {
            return;
        }
    }
}

fn events(n: &NvmlSource, sh: &Shared) {
    let Ok(mut w) = n.watch() else {
        tracing::warn!("NVML events unavailable; relying on sampling and the kernel log");
        return;
    };
    while !sh.stop.load(Ordering::SeqCst) {
        match w.wait(200) {
            Ok(Some(Notice::Xid { pci, xid })) => {
                let x = xid.map_or(999, |x| x as u32);
                tracing::warn!(gpu = %pci, xid = x, "XID from NVML event");
                sh.update(|p, _| p.xid(now(), &pci, x, "NVML event", None));
            }
            Ok(Some(Notice::Changed { pci })) => {
                let count = n.count().unwrap_or(0);
                let fresh: Vec<_> = (0..count)
                    .map(|i| n.sample(i))
                    .filter(|r| r.as_ref().is_ok_and(|s| s.pci == pci))
                    .collect();
                sh.update(|p, _| {
                    for s in fresh.into_iter().flatten() {
                        p.sample(now(), s);
                    }
                });
            }
            Ok(None) => {}
            Err(e) => {
                tracing::warn!(error = %e, "NVML event wait failed");
                if nap(sh, Duration::from_secs(1)) {
                    return;
                }
            }
        }
    }
}

fn follow_kmsg(path: &Path, sh: &Shared) {
    let Ok(mut r) = KmsgReader::open(path) else {
        tracing::warn!(path = %path.display(), "cannot read the kernel log; XIDs come from NVML only");
        return;
    };
    let plain = std::fs::metadata(path).is_ok_and(|m| m.is_file());
    // Some notices name their GPU only in an earlier line.
    let mut lines = kmsg::Assembler::new();
    while !sh.stop.load(Ordering::SeqCst) {
        let line = match r.next_line() {
            Ok(Some(line)) => line,
            Ok(None) => {
                // /dev/kmsg blocks in poll until the kernel logs (200 ms at most, to
                // notice a stop); a plain file is always readable, so it is re-read
                // after a nap instead.
                if plain {
                    if nap(sh, Duration::from_millis(200)) {
                        return;
                    }
                } else {
                    r.wait(Duration::from_millis(200));
                }
                continue;
            }
            Err(e) => {
                tracing::warn!(error = %e, "kernel log unreadable; XIDs come from NVML only");
                return;
            }
        };
        let Some(e) = lines.push(&line) else {
            continue;
        };
        // A plain file's lines carry no sequence number (or one from elsewhere): its
        // own position is the offset, so a reset there is remembered too.
        let pos = if plain { Some(r.offset()) } else { e.seq };
        if let Some(pos) = pos {
            sh.last_seq.fetch_max(pos, Ordering::SeqCst);
        }
        tracing::warn!(pci = %e.pci, xid = e.xid, kind = ?e.kind, "XID from the kernel log");
        sh.update(|p, _| match e.kind {
            Kind::Xid => p.xid(now(), &e.pci, e.xid, &e.message, pos),
            Kind::Sxid => p.switch_error(now(), &e.pci, e.xid, &e.message),
        });
    }
}
