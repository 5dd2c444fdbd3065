//! Every rule of [`Host`], run against [`FakeOs`]: no process is started, no signal
//! sent, no clock read; the store is a real SQLite file in a temporary directory (a
//! restart is a second `Host::open` on it). One file per concern, as in `host/`.

mod adopt;
mod drain;
mod health;
mod ladder;
mod restart;
mod revoke;
mod start;
mod usage;
mod users;

use super::*;
use crate::lease::LeaseState;
use crate::os::fake::FakeOs;
use crate::os::Reaper;
use crate::store::Store;
use crate::supervisor::Exit;
use allot_health::verdict::{GpuVerdict, HostVerdict, Reason};
use allot_health::xid::Action;
use std::path::Path;

/// A supervisor's report of a workload that exited with `code` (`None`: signalled).
pub(super) fn exited(code: Option<i32>) -> Exit {
    Exit {
        code,
        signal: code.is_none().then_some(9),
        ..Exit::default()
    }
}

/// A state directory removed when the test ends.
pub(super) struct Dir(pub PathBuf);

impl Dir {
    pub fn new() -> Dir {
        static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let p = std::env::temp_dir().join(format!("allot-host-unit-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).expect("temp dir");
        Dir(p)
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Root, as the uplink speaks for allotd.
pub(super) const ROOT: Caller = Caller { uid: 0, gid: 0 };
/// An ordinary user the fake knows.
pub(super) const ALICE: Caller = Caller {
    uid: 1000,
    gid: 100,
};

/// GPU `i` of the inventory: bus id `0000:0i:00.0`, UUID `GPU-i`.
pub(super) fn gpu(i: u32) -> GpuSample {
    GpuSample {
        pci: pci(i),
        uuid: uuid(i),
        index: Some(i),
        ..Default::default()
    }
}

/// GPU `i`'s bus id.
pub(super) fn pci(i: u32) -> String {
    format!("0000:0{i}:00.0")
}

/// GPU `i`'s UUID.
pub(super) fn uuid(i: u32) -> String {
    format!("GPU-{i}")
}

/// The settings the tests run under: the defaults, except that root may run work
/// (most tests start as root, as allotd's uplink does; `start.rs` tests the rule).
pub(super) fn settings(dir: &Path) -> Settings {
    Settings {
        checkpoint_root: None,
        default_grace_s: 30,
        term_grace_s: 10,
        fence_after_s: 600,
        warning_before_ms: 60_000,
        warning_signal: Signal::SIGUSR2,
        default_hook: String::new(),
        state_dir: dir.to_path_buf(),
        min_uid: 1000,
        allow_root: true,
        hook_hosts: Vec::new(),
        log_dir: dir.join("logs"),
        max_output_bytes: 1 << 20,
        cgroups: crate::cgroup::Placement::At("/cg/allot-test".into()),
        supervisor: "/usr/bin/allot-agent".into(),
        idle_below_pct: 5,
        idle_after_ms: 3_600_000,
    }
}

/// A command on `gpus` GPUs protected for `min_runtime_s`.
pub(super) fn spec(gpus: u32, min_runtime_s: u64) -> StartSpec {
    StartSpec {
        gpus,
        min_runtime_s,
        argv: vec!["train".into(), "--fast".into()],
        ..Default::default()
    }
}

/// A reason of a verdict.
pub(super) fn reason(signal: &str, action: Option<Action>, gpu_only: bool) -> Reason {
    Reason {
        signal: signal.into(),
        detail: format!("{signal} seen"),
        action,
        gpu_only,
        since: 0,
    }
}

/// A verdict: `host`, `only` GPUs, and per-GPU states with one reason each.
pub(super) fn verdict(
    host: HostVerdict,
    only: &[u32],
    gpus: &[(&str, GpuState, Reason)],
) -> Verdict {
    Verdict {
        host,
        only_gpus: only.iter().map(|i| pci(*i)).collect(),
        gpus: gpus
            .iter()
            .map(|(p, s, r)| GpuVerdict {
                pci: p.to_string(),
                state: *s,
                reasons: vec![r.clone()],
            })
            .collect(),
    }
}

/// The all-clear.
pub(super) fn ok() -> Verdict {
    verdict(HostVerdict::Ok, &[], &[])
}

/// A host of four healthy GPUs on the fake OS.
pub(super) struct T {
    pub h: Host,
    pub os: FakeOs,
    pub dir: Dir,
}

impl T {
    /// A fresh host.
    pub fn new() -> T {
        T::with(|_| {})
    }

    /// A fresh host with changed settings.
    pub fn with(f: impl FnOnce(&mut Settings)) -> T {
        let dir = Dir::new();
        let mut s = settings(&dir.0);
        f(&mut s);
        T::open(FakeOs::new(), dir, s)
    }

    /// Opens the host on `dir` (a restart when it holds a store already), and gives
    /// it the four GPUs, all healthy.
    pub fn open(os: FakeOs, dir: Dir, s: Settings) -> T {
        let store = Store::open(&dir.0).expect("store");
        let now = os.now();
        let mut h = Host::open(store, s, Box::new(os.clone()), now).expect("open");
        h.on_verdict(ok(), (0..4).map(gpu).collect(), now);
        T { h, os, dir }
    }

    /// The agent stops and starts again on the same state (and the same processes).
    pub fn restart(self) -> T {
        let T { h, os, dir } = self;
        let s = h.settings.clone();
        drop(h);
        T::open(os, dir, s)
    }

    /// Lease `id`'s directory (checkpoints, `exit.json`).
    pub fn lease_dir(&self, id: &str) -> PathBuf {
        lease_dir(&self.h.settings, id)
    }

    /// The fake clock.
    pub fn now(&self) -> i64 {
        self.os.now()
    }

    /// Starts `spec` as root; the lease and its reaper.
    pub fn try_start(
        &mut self,
        spec: StartSpec,
    ) -> Result<(LeaseRecord, Option<Reaper>), HostError> {
        let now = self.now();
        self.h.start(spec, ROOT, now)
    }

    /// Starts `spec` as root, which must work.
    pub fn start(&mut self, spec: StartSpec) -> LeaseRecord {
        self.try_start(spec).expect("starts").0
    }

    /// Adopts a new process of the fake that leads its own group.
    pub fn adopt(&mut self, gpus: u32, min_runtime_s: u64) -> LeaseRecord {
        let p = self.os.spawn();
        self.start(StartSpec {
            argv: Vec::new(),
            adopt_pid: Some(p.pid),
            ..spec(gpus, min_runtime_s)
        })
    }

    /// Lease `id` now.
    pub fn lease(&self, id: &str) -> LeaseRecord {
        self.h.lease(id).cloned().expect("lease exists")
    }

    /// Lease `id`'s state now.
    pub fn state(&self, id: &str) -> LeaseState {
        self.lease(id).state
    }

    /// Runs what is due now.
    pub fn tick(&mut self) -> Vec<LadderJob> {
        let now = self.now();
        self.h.tick(now)
    }

    /// A new verdict (the inventory unchanged).
    pub fn verdict(&mut self, v: Verdict) {
        let now = self.now();
        self.h.on_verdict(v, Vec::new(), now);
    }

    /// The messages of every event so far.
    pub fn events(&self) -> Vec<String> {
        self.h
            .events(0)
            .expect("events")
            .into_iter()
            .map(|e| e.message)
            .collect()
    }

    /// The leases as the store holds them (what a restart would read).
    pub fn stored(&self, id: &str) -> Option<LeaseRecord> {
        Store::open(&self.dir.0)
            .expect("store")
            .leases(100)
            .expect("leases")
            .into_iter()
            .find(|l| l.id == id)
    }
}

/// The refusal's message, which must name the state and the fix.
pub(super) fn refusal<T: std::fmt::Debug>(r: Result<T, HostError>) -> String {
    match r {
        Err(HostError::Refused(m)) => m,
        other => panic!("expected a refusal, got {other:?}"),
    }
}

/// The invalid field's name.
pub(super) fn invalid<T: std::fmt::Debug>(r: Result<T, HostError>) -> &'static str {
    match r {
        Err(HostError::Invalid { field, .. }) => field,
        other => panic!("expected an invalid field, got {other:?}"),
    }
}
