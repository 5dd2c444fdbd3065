//! Free space where the agent writes: its state dir (the lease table, which a full
//! disk turns into "database or disk is full" on every later start) and the lease
//! logs. Below `[agent] min_free_bytes` on any of them the host reports a health
//! fault (`disk-low`) and drains, as on a GPU fault, instead of taking work it would
//! fail; once 10 % more than the threshold is free again the fault clears, like any
//! level condition (the margin keeps a disk hovering at the threshold from
//! draining and undraining on every check).
//!
//! Pure but for [`Statvfs`]: [`assess`] decides from what a [`SpaceReader`] says,
//! so the rule is tested against made-up figures and no test ever fills a disk.

use allot_health::verdict::Reason;
use allot_health::xid::Action;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// The health signal of the condition.
pub const SIGNAL: &str = "disk-low";
/// The health signal of a write the agent could not make (its lease table, a lease's
/// directory or log): whatever the free space says, the host cannot keep work.
pub const WRITE_SIGNAL: &str = "disk-full";
/// Longest reason text: allotd takes reasons of at most 1 KiB.
const MAX_DETAIL: usize = 1000;

/// What a file system says of its space.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Space {
    /// Bytes an unprivileged writer may still use (`f_bavail`): workloads run as
    /// users, and root's reserve is not theirs.
    pub free: u64,
    /// The file system's size.
    pub total: u64,
    /// Which file system (paths on one are reported once).
    pub fsid: u64,
}

/// Reads a path's file system space: the daemon's [`Statvfs`], the tests' fakes.
pub trait SpaceReader {
    /// The space of the file system holding `path`.
    fn space(&self, path: &Path) -> std::io::Result<Space>;
}

/// `statvfs(3)` of the path, or of its nearest existing ancestor (a log dir not
/// made yet is on its parent's file system).
pub struct Statvfs;

impl SpaceReader for Statvfs {
    fn space(&self, path: &Path) -> std::io::Result<Space> {
        let mut p = path;
        while !p.exists() {
            p = p.parent().unwrap_or(Path::new("/"));
        }
        let s = nix::sys::statvfs::statvfs(p).map_err(std::io::Error::from)?;
        let frsize = s.fragment_size() as u64;
        Ok(Space {
            free: (s.blocks_available() as u64).saturating_mul(frsize),
            total: (s.blocks() as u64).saturating_mul(frsize),
            fsid: s.filesystem_id() as u64,
        })
    }
}

/// What one check found.
#[derive(Debug, Clone, PartialEq)]
pub struct Assessment {
    /// The fault to report, if any (one reason naming every low path).
    pub fault: Option<Reason>,
    /// Paths that could not be measured: logged, never a fault by themselves.
    pub errors: Vec<String>,
}

/// Free space at which a fault raised at `min_free` clears.
pub fn clear_at(min_free: u64) -> u64 {
    min_free.saturating_add(min_free / 10)
}

/// Bytes as people read them (`1.5 GiB`).
pub fn human(bytes: u64) -> String {
    const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut v = bytes as f64;
    let mut unit = 0;
    while v >= 1024.0 && unit + 1 < UNITS.len() {
        v /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else {
        format!("{v:.1} {}", UNITS[unit])
    }
}

/// Decides from `paths`' free space: a path is low below `min_free`, or, while the
/// host has the fault (`was_low`), below [`clear_at`]. `min_free` 0 checks nothing.
/// `now` (Unix s) dates a new reason.
pub fn assess(
    paths: &[PathBuf],
    reader: &dyn SpaceReader,
    min_free: u64,
    was_low: bool,
    now: u64,
) -> Assessment {
    let mut out = Assessment {
        fault: None,
        errors: Vec::new(),
    };
    if min_free == 0 {
        return out;
    }
    let limit = if was_low {
        clear_at(min_free)
    } else {
        min_free
    };
    let mut seen = BTreeSet::new();
    let mut low = Vec::new();
    for p in paths {
        match reader.space(p) {
            Err(e) => out.errors.push(format!("{}: {e}", p.display())),
            Ok(s) if !seen.insert(s.fsid) => {}
            Ok(s) if s.free < limit => low.push(format!(
                "{} has {} free of {}",
                p.display(),
                human(s.free),
                human(s.total)
            )),
            Ok(_) => {}
        }
    }
    if !low.is_empty() {
        let mut detail = format!(
                "{}, below [agent] min_free_bytes = {} ({min_free}): no new work here until {} are free; free space there (old output under [agent] log_dir) or lower min_free_bytes in agent.toml",
                low.join("; "),
                human(min_free),
                human(clear_at(min_free))
            );
        // Reasons travel capped (1 KiB); long paths must not cost the report.
        if detail.len() > MAX_DETAIL {
            let mut end = MAX_DETAIL;
            while !detail.is_char_boundary(end) {
                end -= 1;
            }
            detail.truncate(end);
        }
        out.fault = Some(Reason {
            signal: SIGNAL.into(),
            detail,
            action: Some(Action::Drain),
            gpu_only: false,
            since: now,
        });
    }
    out
}

/// The paths the agent writes to on `c`'s settings: the state dir, the lease dirs
/// (checkpoints) under it, and the workloads' log dir.
pub fn paths(c: &crate::config::AgentConfig) -> Vec<PathBuf> {
    vec![
        c.agent.state_dir.clone(),
        c.agent.state_dir.join("leases"),
        c.agent.logs(),
    ]
}

/// The fault a failed write raises: it drains the host until a write succeeds again.
pub fn write_fault(what: &str, now_s: u64) -> Reason {
    let mut detail = format!(
        "this host could not write its state ({what}); it takes no work until a write succeeds again: free space where the agent writes ([agent] state_dir, log_dir)"
    );
    if detail.len() > MAX_DETAIL {
        let mut end = MAX_DETAIL;
        while !detail.is_char_boundary(end) {
            end -= 1;
        }
        detail.truncate(end);
    }
    Reason {
        signal: WRITE_SIGNAL.into(),
        detail,
        action: Some(Action::Drain),
        gpu_only: false,
        since: now_s,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    /// Made-up file systems: path → (free, fsid); every one 100 GiB.
    struct Fake(BTreeMap<PathBuf, (u64, u64)>);

    impl SpaceReader for Fake {
        fn space(&self, path: &Path) -> std::io::Result<Space> {
            self.0
                .get(path)
                .map(|&(free, fsid)| Space {
                    free,
                    total: 100 << 30,
                    fsid,
                })
                .ok_or_else(|| std::io::Error::from(std::io::ErrorKind::NotFound))
        }
    }

    const GIB: u64 = 1 << 30;

    fn paths() -> Vec<PathBuf> {
        vec!["/var/lib/allot/agent".into(), "/var/log/allot".into()]
    }

    fn fake(state: u64, logs: u64) -> Fake {
        Fake(BTreeMap::from([
            (PathBuf::from("/var/lib/allot/agent"), (state, 1)),
            (PathBuf::from("/var/log/allot"), (logs, 2)),
        ]))
    }

    #[test]
    fn enough_space_everywhere_is_no_fault() {
        let a = assess(&paths(), &fake(50 * GIB, 50 * GIB), GIB, false, 7);
        assert_eq!(a.fault, None);
        assert!(a.errors.is_empty());
    }

    #[test]
    fn a_low_path_is_a_drain_naming_the_path_the_space_the_threshold_and_the_fix() {
        let a = assess(&paths(), &fake(50 * GIB, GIB / 2), GIB, false, 7);
        let r = a.fault.expect("a fault");
        assert_eq!(r.signal, "disk-low");
        assert_eq!(r.action, Some(Action::Drain));
        assert!(!r.gpu_only);
        assert_eq!(r.since, 7);
        for words in [
            "/var/log/allot has 512.0 MiB free of 100.0 GiB",
            "min_free_bytes = 1.0 GiB",
            "lower min_free_bytes in agent.toml",
        ] {
            assert!(r.detail.contains(words), "{words:?} not in {}", r.detail);
        }
        assert!(!r.detail.contains("/var/lib/allot/agent"), "{}", r.detail);
    }

    #[test]
    fn the_fault_clears_only_with_a_margin_above_the_threshold() {
        // Just above the threshold: no new fault, but an existing one holds.
        let just_above = GIB + GIB / 20;
        assert!(assess(&paths(), &fake(50 * GIB, just_above), GIB, false, 7)
            .fault
            .is_none());
        assert!(assess(&paths(), &fake(50 * GIB, just_above), GIB, true, 7)
            .fault
            .is_some());
        assert!(
            assess(&paths(), &fake(50 * GIB, clear_at(GIB)), GIB, true, 7)
                .fault
                .is_none()
        );
    }

    #[test]
    fn one_file_system_is_reported_once_and_an_unreadable_path_is_no_fault() {
        let one = Fake(BTreeMap::from([
            (PathBuf::from("/var/lib/allot/agent"), (10, 1)),
            (PathBuf::from("/var/log/allot"), (10, 1)),
        ]));
        let r = assess(&paths(), &one, GIB, false, 7).fault.expect("fault");
        assert_eq!(r.detail.matches(" free of ").count(), 1, "{}", r.detail);
        let a = assess(&["/nowhere".into()], &one, GIB, false, 7);
        assert_eq!(a.fault, None);
        assert_eq!(a.errors.len(), 1);
    }

    #[test]
    fn a_zero_threshold_checks_nothing() {
        assert_eq!(assess(&paths(), &fake(0, 0), 0, true, 7).fault, None);
    }

    #[test]
    fn the_real_reader_measures_the_temp_dir() {
        let s = Statvfs
            .space(&std::env::temp_dir().join("not-made-yet/below"))
            .expect("statvfs");
        assert!(s.total > 0 && s.free <= s.total, "{s:?}");
    }
}
