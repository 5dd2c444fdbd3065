//! The host's fence: a lease of allotd's stops by itself once allotd has not
//! answered the host for `[agent] fence_after`, so that allotd may restart a lost
//! node's work elsewhere and the work still never runs twice at once.
//!
//! The agent sends a heartbeat every few seconds; allotd answers each. The send
//! time of the last one answered (the host's last word from allotd) is written to
//! `STATE_DIR/contact`, on `CLOCK_BOOTTIME`: one clock for every process of the
//! host, which no step of the wall clock moves. Each lease's supervisor reads the
//! file and runs the lease's ladder once it is older than `fence_after`, so a
//! stopped or dead agent fences as surely as a partitioned one. allotd, counting
//! from the last message it had from the host (never earlier than the send of the
//! last heartbeat it answered), waits `fence_s` (the fence and the longest ladder)
//! and a margin before it ends the host's leases node-lost.

use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// The contact file's name in the state dir.
pub const FILE: &str = "contact";

/// How long the ladder's SIGKILL may take to empty the group (the ladder's own
/// bound beyond its two graces).
pub const KILL_WAIT_S: u64 = 5;

/// Milliseconds on `CLOCK_BOOTTIME`.
pub fn boot_ms() -> u64 {
    nix::time::clock_gettime(nix::time::ClockId::CLOCK_BOOTTIME).map_or(0, |t| {
        u64::try_from(t.tv_sec()).unwrap_or(0) * 1000
            + u64::try_from(t.tv_nsec()).unwrap_or(0) / 1_000_000
    })
}

/// Records `at` (boot ms) as the host's last word from allotd: whole or not at all.
pub fn write(state_dir: &Path, at: u64) -> std::io::Result<()> {
    let path = state_dir.join(FILE);
    let tmp = state_dir.join(format!("{FILE}.tmp"));
    std::fs::write(&tmp, format!("{at}\n"))?;
    std::fs::rename(&tmp, &path)
}

/// Whether an allotd has ever answered this host's heartbeats (the file exists).
pub fn answered_before(state_dir: &Path) -> bool {
    state_dir.join(FILE).exists()
}

/// The host's last word from allotd (boot ms), if the file says one.
pub fn read(path: &Path) -> Option<u64> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// How often heartbeats go when the fence is `after_s`: often enough that the last
/// one answered is never much older than the stream's last traffic.
pub fn heartbeat_ms(after_s: u64) -> u64 {
    (after_s.saturating_mul(1000) / 4).clamp(250, 10_000)
}

/// The longest a lease is still running after the host's last word from allotd:
/// the fence, the ladder's checkpoint and SIGTERM graces, and its SIGKILL wait.
pub fn bound_s(after_s: u64, grace_s: u64, term_grace_s: u64) -> u64 {
    after_s
        .saturating_add(grace_s)
        .saturating_add(term_grace_s)
        .saturating_add(KILL_WAIT_S)
}

/// A lease's fence, in its supervisor's spec.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Fence {
    /// The contact file.
    pub contact: PathBuf,
    /// Without word from allotd this long, the lease is stopped.
    pub after_s: u64,
    /// The lease's checkpoint hook (empty: straight to SIGTERM).
    pub hook: String,
    /// How long the checkpoint may take.
    pub grace_s: u64,
    /// How long SIGTERM may take before SIGKILL.
    pub term_grace_s: u64,
    /// Where it writes checkpoints and the marker.
    pub checkpoint_dir: PathBuf,
    /// Hosts an http hook may reach besides loopback.
    pub hook_hosts: Vec<String>,
}

impl Fence {
    /// Whether the fence is due at `now` (boot ms) with the host's last word from
    /// allotd at `contact`. No file, none: no allotd has answered a heartbeat (one
    /// older than the fence ends a lost node's leases itself). A word "from the
    /// future" is from before a reboot (the clock restarts): `started`, the
    /// supervisor's start, stands for it.
    pub fn due(&self, contact: Option<u64>, started: u64, now: u64) -> bool {
        let Some(c) = contact else {
            return false;
        };
        let last = if c <= now { c } else { started };
        now.saturating_sub(last) >= self.after_s.saturating_mul(1000)
    }

    /// The longest this lease runs on after the host's last word from allotd.
    pub fn bound_s(&self) -> u64 {
        bound_s(self.after_s, self.grace_s, self.term_grace_s)
    }

    /// Why the lease was stopped, in words the user reads.
    pub fn reason(&self) -> String {
        format!(
            "fenced: no word from allotd for {}s ([agent] fence_after), so the work may run elsewhere",
            self.after_s
        )
    }

    /// How often the supervisor looks at the contact file.
    pub fn check_ms(&self) -> u64 {
        (self.after_s.saturating_mul(1000) / 4).clamp(100, 2_000)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fence(after_s: u64) -> Fence {
        Fence {
            contact: PathBuf::from("/nonexistent"),
            after_s,
            hook: String::new(),
            grace_s: 3,
            term_grace_s: 2,
            checkpoint_dir: PathBuf::new(),
            hook_hosts: Vec::new(),
        }
    }

    #[test]
    fn the_fence_counts_from_the_last_word_and_never_without_one() {
        let f = fence(10);
        assert!(!f.due(Some(5_000), 0, 14_999));
        assert!(f.due(Some(5_000), 0, 15_000));
        // A later start does not move the last word: the start came before it.
        assert!(f.due(Some(5_000), 9_000, 15_000));
        // No allotd ever answered: never.
        assert!(!f.due(None, 9_000, 1 << 40));
        // A file from before a reboot counts from the supervisor's start.
        assert!(!f.due(Some(99_000), 9_000, 15_000));
        assert!(f.due(Some(99_000), 9_000, 19_000));
    }

    #[test]
    fn the_contact_file_is_read_back_and_garbage_is_no_word() {
        let dir = std::env::temp_dir().join(format!("allot-fence-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        write(&dir, 123_456).expect("written");
        assert_eq!(read(&dir.join(FILE)), Some(123_456));
        std::fs::write(dir.join(FILE), "soon").expect("garbage");
        assert_eq!(read(&dir.join(FILE)), None);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn heartbeats_come_four_times_a_fence_and_at_least_every_ten_seconds() {
        assert_eq!(heartbeat_ms(600), 10_000);
        assert_eq!(heartbeat_ms(4), 1_000);
        assert_eq!(heartbeat_ms(0), 250);
        assert_eq!(bound_s(600, 120, 30), 755);
    }
}
