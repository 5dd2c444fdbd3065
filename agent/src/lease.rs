//! A lease as the agent holds it: what runs on which GPUs, under which contract, and
//! how it ended. Stored as one JSON row per lease (see `store.rs`).

use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// Whether a lease id is one the allocator gives (`A-…`; local leases are the
/// operator's business).
pub fn from_allocator_id(id: &str) -> bool {
    id.starts_with("A-")
}

/// One of a lease's two output streams.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogStream {
    /// Standard output.
    Stdout,
    /// Standard error.
    Stderr,
}

impl LogStream {
    /// The extension of its file in the lease dir before 0.6 (`out`, `err`).
    pub fn ext(self) -> &'static str {
        match self {
            LogStream::Stdout => "out",
            LogStream::Stderr => "err",
        }
    }
}

/// How a lease ended. Stored by [`LeaseEnd::name`] (the form 0.1 agents wrote and
/// sent as `end_reason`), so rows and older allotds read the same words.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeaseEnd {
    /// Not ended, or a name this release does not know.
    Unspecified,
    /// Its process exited on its own (the exit code says how).
    Exited,
    /// Ended by a revocation's ladder.
    Revoked,
    /// Ended at its time limit.
    TimeLimit,
    /// A GPU it held failed.
    GpuLost,
    /// Its process was gone when the agent looked (a restart, a reboot).
    Vanished,
    /// The host would not take it (drained, a GPU taken).
    Refused,
    /// The host took it and could not start it.
    FailedToStart,
    /// Its supervisor stopped it: no word from allotd for `fence_after`.
    Fenced,
}

impl LeaseEnd {
    const ALL: [LeaseEnd; 8] = [
        LeaseEnd::Exited,
        LeaseEnd::Revoked,
        LeaseEnd::TimeLimit,
        LeaseEnd::GpuLost,
        LeaseEnd::Vanished,
        LeaseEnd::Refused,
        LeaseEnd::FailedToStart,
        LeaseEnd::Fenced,
    ];

    /// The name people read: `exited`, `revoked`, `time-limit`, `gpu-lost`,
    /// `vanished`, `refused`, `failed-to-start`, `fenced`; empty when unspecified.
    pub fn name(self) -> &'static str {
        match self {
            LeaseEnd::Unspecified => "",
            LeaseEnd::Exited => "exited",
            LeaseEnd::Revoked => "revoked",
            LeaseEnd::TimeLimit => "time-limit",
            LeaseEnd::GpuLost => "gpu-lost",
            LeaseEnd::Vanished => "vanished",
            LeaseEnd::Refused => "refused",
            LeaseEnd::FailedToStart => "failed-to-start",
            LeaseEnd::Fenced => "fenced",
        }
    }

    /// The end named by [`LeaseEnd::name`]; unspecified for any other text.
    pub fn from_name(name: &str) -> LeaseEnd {
        Self::ALL
            .into_iter()
            .find(|e| e.name() == name)
            .unwrap_or(LeaseEnd::Unspecified)
    }
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// Where a lease's output is, as the host holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogSource {
    /// The file.
    pub path: PathBuf,
    /// The lease has not ended: the file may still grow.
    pub live: bool,
    /// Started by something else: the agent captured none of its output.
    pub adopted: bool,
    /// The user it runs as (who may read it on the host).
    pub user: String,
    /// On a path of the user's own (`--output /…` or `./…`), not in the agent's
    /// log dir: read as that user.
    pub users_own: bool,
}

/// Where a lease is in its life.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum LeaseState {
    /// Recorded, the process not yet started.
    #[default]
    Starting,
    /// Running under its contract.
    Running,
    /// Asked to end; waits for `not_before`.
    Revoking,
    /// The checkpoint ladder is running.
    Checkpointing,
    /// Over.
    Ended,
}

impl LeaseState {
    /// Lower-case name, as the CLI shows it.
    pub fn as_str(self) -> &'static str {
        match self {
            LeaseState::Starting => "starting",
            LeaseState::Running => "running",
            LeaseState::Revoking => "revoking",
            LeaseState::Checkpointing => "checkpointing",
            LeaseState::Ended => "ended",
        }
    }
}

/// One rung of the ladder that ended the lease, and how long it took (a field an
/// older row lacks reads as its default).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct StepRecord {
    /// `checkpoint`, `term`, `kill`, `exited`.
    pub rung: String,
    /// Milliseconds on this rung.
    pub took_ms: u64,
    /// What was seen.
    pub note: String,
}

/// A lease and its workload (`Default`: a new lease, nothing started or ended).
/// Fields added later read as their defaults from older rows.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct LeaseRecord {
    /// Lease id.
    pub id: String,
    /// Workload id (the lease id for local leases).
    pub workload_id: String,
    /// GPUs by UUID.
    pub gpus: Vec<String>,
    /// The user it runs as.
    pub user: String,
    /// The command (empty when adopted).
    pub argv: Vec<String>,
    /// Process id (0 before the start); also its process group and session.
    pub pid: i32,
    /// The process's start time in clock ticks since boot: with `pid`, its identity.
    pub start_ticks: u64,
    /// Started by something else and adopted by pid.
    pub adopted: bool,
    /// Start, Unix milliseconds.
    pub start_ms: i64,
    /// Protected for this long from the start.
    pub min_runtime_s: u64,
    /// Ends at start + this.
    pub time_limit_s: Option<u64>,
    /// The checkpoint hook spec (`signal:USR1`, `exec:…`, `http:…`; empty: none).
    pub hook: String,
    /// How long a checkpoint may take.
    pub grace_s: u64,
    /// Gone within this many seconds of the host's last word from allotd: its
    /// supervisor fences it ([`crate::fence::bound_s`]); 0: it is not fenced.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub fence_s: u64,
    /// State.
    pub state: LeaseState,
    /// While revoking: the ladder starts at this Unix millisecond.
    pub not_before_ms: Option<i64>,
    /// Who revoked it and why.
    pub revoke_why: String,
    /// The drain kind whose drain revoked it (`local-operator`, `cluster-operator`,
    /// `health`), so that the revocation is withdrawn when that drain ends; empty
    /// for any other revocation.
    pub revoke_cause: String,
    /// The time-limit warning was sent.
    pub warned: bool,
    /// The warning this lease asked for before its time limit (a signal name);
    /// empty: the host's default (`[agent] time_limit_warning`, off unless set).
    pub warn_signal: String,
    /// How long before the time limit its own warning goes, seconds.
    pub warn_before_s: u64,
    /// When allotd started it, Unix s (0: a local lease, or a row from before):
    /// with the id, what tells a start re-sent from an id given again.
    pub allotd_start_s: i64,
    /// Why the ladder runs (`revoked`, `time-limit`), kept for the end reason.
    pub ladder_reason: String,
    /// The rung that ended it.
    pub ended_by: String,
    /// How it ended, by [`LeaseEnd::name`] (the stored form since 0.1).
    pub end_reason: String,
    /// Exit status, when the agent saw it.
    pub exit_code: Option<i32>,
    /// End, Unix milliseconds (0 while live).
    pub ended_ms: i64,
    /// The ladder's steps.
    pub steps: Vec<StepRecord>,
    /// Where it started (absolute); empty: the agent's own directory.
    pub cwd: String,
    /// Which run of its workload (from 1; 0 for local leases and older rows).
    pub run: u32,
    /// This host's rank in its gang (from 0).
    pub rank: u32,
    /// Stdout file pattern (`%j`, `%r`, `%n`); empty: the agent's default.
    pub output: String,
    /// Stderr file pattern; empty: the agent's default.
    pub error: String,
    /// Where the lease's stdout goes (absolute); empty: `<lease dir>/<id>.out`, as before 0.6.
    pub out_log: String,
    /// Where the lease's stderr goes (absolute); empty: `<lease dir>/<id>.err`, as before 0.6.
    pub err_log: String,
    /// Its cgroup (absolute); empty: its process group only.
    pub cgroup: String,
    /// Its supervisor's pid (0: none, as for adopted leases and rows before 0.7).
    pub supervisor_pid: i32,
    /// Its supervisor's start time in clock ticks since boot.
    pub supervisor_ticks: u64,
    /// The signal that ended it, when one did.
    pub signal: Option<i32>,
    /// Kills by the kernel's OOM killer in its cgroup.
    pub oom_kills: u64,
    /// Its output reached `[agent] max_output_bytes` and was cut.
    pub output_cut: bool,
    /// How it ended, in words (exit code, signal, OOM, cut output), for the user.
    pub end_detail: String,
    /// Its GPUs have been under `[agent] idle_below` since then, Unix ms, for at
    /// least `idle_after` (0: in use).
    pub idle_since_ms: i64,
    /// The mean utilisation of its GPUs when it was last found idle or busy, %.
    pub gpu_util_pct: u32,
}

impl LeaseRecord {
    /// How it ended (unspecified while live).
    pub fn end_kind(&self) -> LeaseEnd {
        LeaseEnd::from_name(&self.end_reason)
    }

    /// The file `stream` of this lease goes to: the recorded path, or for a row
    /// written before 0.6 (none recorded) its old place in `lease_dir`.
    pub fn log_path(&self, stream: LogStream, lease_dir: &Path) -> PathBuf {
        let recorded = match stream {
            LogStream::Stdout => &self.out_log,
            LogStream::Stderr => &self.err_log,
        };
        if recorded.is_empty() {
            lease_dir.join(format!("{}.{}", self.id, stream.ext()))
        } else {
            PathBuf::from(recorded)
        }
    }

    /// Not ended.
    pub fn live(&self) -> bool {
        self.state != LeaseState::Ended
    }

    /// When its protection lapses (Unix ms).
    pub fn lapse_ms(&self) -> i64 {
        self.start_ms.saturating_add(
            i64::try_from(self.min_runtime_s.saturating_mul(1000)).unwrap_or(i64::MAX),
        )
    }

    /// Its process's identity (pid and start time).
    pub fn proc_id(&self) -> crate::procid::ProcId {
        crate::procid::ProcId {
            pid: self.pid,
            start_ticks: self.start_ticks,
        }
    }

    /// Its supervisor's identity, when it has one.
    pub fn supervisor_id(&self) -> Option<crate::procid::ProcId> {
        (self.supervisor_pid > 0).then_some(crate::procid::ProcId {
            pid: self.supervisor_pid,
            start_ticks: self.supervisor_ticks,
        })
    }

    /// Records how its workload ended, as its supervisor saw it.
    pub fn record_exit(&mut self, e: &crate::supervisor::Exit) {
        self.exit_code = e.code;
        self.signal = e.signal;
        self.oom_kills = e.oom_kills;
        self.output_cut = e.output_cut;
        self.end_detail = e.detail();
    }

    /// Ends it now as its supervisor saw it end: exited, or fenced when the
    /// supervisor stopped it for want of word from allotd.
    pub fn end_by_exit(&mut self, now_ms: i64, e: &crate::supervisor::Exit) {
        match &e.fenced {
            Some(why) => self.end(now_ms, LeaseEnd::Fenced, why),
            None => self.end(now_ms, LeaseEnd::Exited, "exited"),
        }
    }

    /// The process group the ladder signals (each workload leads its own).
    pub fn pgid(&self) -> i32 {
        self.pid
    }

    /// Ends it now, `how` (kept by its name, as 0.1 agents wrote it).
    pub fn end(&mut self, now_ms: i64, how: LeaseEnd, by: &str) {
        self.state = LeaseState::Ended;
        self.ended_ms = now_ms;
        self.end_reason = how.name().into();
        self.ended_by = by.into();
        self.not_before_ms = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_row_without_log_paths_reads_from_the_old_place() {
        let old: LeaseRecord = serde_json::from_str(r#"{"id":"A-7"}"#).expect("an old row");
        let dir = Path::new("/var/lib/allot/agent/leases/A-7");
        assert_eq!(old.log_path(LogStream::Stdout, dir), dir.join("A-7.out"));
        assert_eq!(old.log_path(LogStream::Stderr, dir), dir.join("A-7.err"));
        let new = LeaseRecord {
            out_log: "/logs/7.out".into(),
            err_log: "/logs/7.err".into(),
            ..old
        };
        assert_eq!(
            new.log_path(LogStream::Stdout, dir),
            Path::new("/logs/7.out")
        );
        assert_eq!(
            new.log_path(LogStream::Stderr, dir),
            Path::new("/logs/7.err")
        );
    }
}
