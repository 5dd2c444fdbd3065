//! A process, known by pid *and* start time (`/proc/PID/stat` field 22), so a pid
//! the kernel recycled for something else is never mistaken for it.

use allot_checkpoint_hooks::proc_stat;

/// A process, as pid plus start time (clock ticks since boot).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcId {
    /// Process id (also its process group and session id when we started it).
    pub pid: i32,
    /// Start time, in clock ticks since boot.
    pub start_ticks: u64,
}

/// The identity of `pid` now, if it exists and has not exited.
pub fn identity(pid: i32) -> Option<ProcId> {
    proc_stat(pid).filter(|s| !s.exited()).map(|s| ProcId {
        pid,
        start_ticks: s.start_ticks,
    })
}

/// Waits until process `p` is gone (or is no longer itself), for at most `limit`.
pub fn wait_gone(p: ProcId, limit: std::time::Duration) {
    let until = std::time::Instant::now() + limit;
    while identity(p.pid) == Some(p) && std::time::Instant::now() < until {
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

/// True if `p` still names the same live process (not a recycled pid).
pub fn is_same(p: ProcId) -> bool {
    identity(p.pid) == Some(p)
}

/// Process group and session of `pid`.
pub fn group_and_session(pid: i32) -> Option<(i32, i32)> {
    proc_stat(pid).map(|s| (s.pgrp, s.session))
}
