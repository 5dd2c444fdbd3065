//! One cgroup v2 directory: the whole process tree of a lease, whatever its processes
//! did with sessions and process groups. What the ladder and the supervisor need of
//! it: who is in it, whether anyone is, signalling all of it, killing all of it
//! (`cgroup.kill`, Linux 5.14), limits, usage and OOM kills.
//!
//! Plain files under a path, so the same code runs against a fake tree in a
//! temporary directory (what the unit tests use: the build machines' cgroup mount has
//! no memory or cpu controller).

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// A cgroup v2 directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cgroup {
    dir: PathBuf,
}

/// CPU and memory a cgroup has used, as far as its files tell.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    /// CPU time, microseconds (`cpu.stat` `usage_usec`: present without the controller).
    pub cpu_usec: Option<u64>,
    /// Memory now, bytes (`memory.current`: needs the memory controller).
    pub memory_bytes: Option<u64>,
}

/// Limits to apply where the controllers are enabled.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Limits {
    /// `memory.max`, bytes.
    pub memory_bytes: Option<u64>,
    /// CPU cores, in thousandths (`cpu.max` as quota per 100 ms period).
    pub cpu_millis: Option<u64>,
}

/// How long [`Cgroup::kill`] waits for the tree to empty.
const KILL_WAIT: Duration = Duration::from_secs(5);

impl Cgroup {
    /// The cgroup at `dir` (nothing is read or made).
    pub fn at(dir: impl Into<PathBuf>) -> Cgroup {
        Cgroup { dir: dir.into() }
    }

    /// Its directory.
    pub fn path(&self) -> &Path {
        &self.dir
    }

    /// Makes the directory (an existing one is fine).
    pub fn create(&self) -> std::io::Result<()> {
        match std::fs::create_dir(&self.dir) {
            Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => Err(e),
            _ => Ok(()),
        }
    }

    fn read(&self, file: &str) -> Option<String> {
        std::fs::read_to_string(self.dir.join(file)).ok()
    }

    /// Opens `cgroup.procs` for writing: a child writes `0` to it between fork and
    /// exec to join (opened before the fork, as nothing may be opened after it).
    pub fn procs_file(&self) -> std::io::Result<std::fs::File> {
        std::fs::OpenOptions::new()
            .write(true)
            .open(self.dir.join("cgroup.procs"))
    }

    /// Moves process `pid` into it.
    pub fn add(&self, pid: i32) -> std::io::Result<()> {
        self.procs_file()?.write_all(pid.to_string().as_bytes())
    }

    /// The processes in it (not in its children).
    pub fn procs(&self) -> Vec<i32> {
        self.read("cgroup.procs")
            .map(|s| s.lines().filter_map(|l| l.trim().parse().ok()).collect())
            .unwrap_or_default()
    }

    /// True while any process is in it or below it; a cgroup that is gone holds none.
    pub fn populated(&self) -> bool {
        match self.read("cgroup.events") {
            Some(ev) => ev.lines().any(|l| l.trim() == "populated 1"),
            None => !self.procs().is_empty(),
        }
    }

    /// Sends `signal` to every process in it; how many were signalled.
    pub fn signal(&self, signal: Signal) -> usize {
        self.procs()
            .into_iter()
            .filter(|p| kill(Pid::from_raw(*p), signal).is_ok())
            .count()
    }

    /// Kills every process in it and below, and waits (bounded) until none is left;
    /// true if it emptied. `cgroup.kill` where the kernel has it (no process can
    /// fork away from it); else SIGKILL to each process until none is left.
    pub fn kill(&self) -> bool {
        let start = Instant::now();
        let whole = std::fs::OpenOptions::new()
            .write(true)
            .open(self.dir.join("cgroup.kill"))
            .and_then(|mut f| f.write_all(b"1"))
            .is_ok();
        while self.populated() {
            if start.elapsed() >= KILL_WAIT {
                return false;
            }
            if !whole {
                self.signal(Signal::SIGKILL);
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        true
    }

    /// Removes the directory; a cgroup that is gone already is fine.
    pub fn remove(&self) -> std::io::Result<()> {
        match std::fs::remove_dir(&self.dir) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        }
    }

    /// How many times the kernel's OOM killer killed in it (`memory.events`
    /// `oom_kill`); `None` without the memory controller.
    pub fn oom_kills(&self) -> Option<u64> {
        key_value(&self.read("memory.events")?, "oom_kill")
    }

    /// What it has used.
    pub fn usage(&self) -> Usage {
        Usage {
            cpu_usec: self
                .read("cpu.stat")
                .and_then(|s| key_value(&s, "usage_usec")),
            memory_bytes: self
                .read("memory.current")
                .and_then(|s| s.trim().parse().ok()),
        }
    }

    /// The controllers enabled for it (`cgroup.controllers`).
    pub fn controllers(&self) -> Vec<String> {
        self.read("cgroup.controllers")
            .map(|s| s.split_whitespace().map(String::from).collect())
            .unwrap_or_default()
    }

    /// Enables `memory` and `cpu` for its children where it has them (best effort:
    /// a cgroup with processes of its own cannot, and then its children go without).
    pub fn delegate_controllers(&self) {
        let have = self.controllers();
        for c in ["memory", "cpu"] {
            if have.iter().any(|h| h == c) {
                let _ = std::fs::OpenOptions::new()
                    .write(true)
                    .open(self.dir.join("cgroup.subtree_control"))
                    .and_then(|mut f| f.write_all(format!("+{c}").as_bytes()));
            }
        }
    }

    /// Applies `limits` where the controllers allow; returns the ones that could not
    /// be applied, each with why (said to the user, never silently dropped).
    pub fn set_limits(&self, limits: &Limits) -> Vec<String> {
        let have = self.controllers();
        let mut missed = Vec::new();
        let mut put = |controller: &str, file: &str, value: String| {
            if !have.iter().any(|h| h == controller) {
                missed.push(format!(
                    "{file} not set: the {controller} controller is not available to allot's cgroups on this host"
                ));
            } else if let Err(e) = std::fs::write(self.dir.join(file), &value) {
                missed.push(format!("{file} = {value}: {e}"));
            }
        };
        if let Some(m) = limits.memory_bytes {
            put("memory", "memory.max", m.to_string());
        }
        if let Some(c) = limits.cpu_millis {
            // Quota per 100 ms period: 1000 millis = one core = 100000 µs.
            put("cpu", "cpu.max", format!("{} 100000", (c * 100).max(1000)));
        }
        missed
    }
}

/// The value of `key` in a flat-keyed cgroup file (`key value` lines).
fn key_value(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|l| {
        let (k, v) = l.split_once(' ')?;
        (k == key).then(|| v.trim().parse().ok()).flatten()
    })
}

/// The cgroup v2 mount point, from `/proc/self/mountinfo`'s text.
pub fn mount_point(mountinfo: &str) -> Option<PathBuf> {
    mountinfo.lines().find_map(|l| {
        // "id parent maj:min root mountpoint opts… - fstype source superopts"
        let (left, right) = l.split_once(" - ")?;
        (right.split_whitespace().next()? == "cgroup2")
            .then(|| left.split_whitespace().nth(4).map(unescape))
            .flatten()
    })
}

/// mountinfo escapes space, tab, newline and backslash as octal.
fn unescape(s: &str) -> PathBuf {
    PathBuf::from(
        s.replace("\\040", " ")
            .replace("\\011", "\t")
            .replace("\\012", "\n")
            .replace("\\134", "\\"),
    )
}

/// A process's cgroup v2 path (relative to the mount), from `/proc/PID/cgroup`'s text.
pub fn own_path(proc_cgroup: &str) -> Option<String> {
    proc_cgroup
        .lines()
        .find_map(|l| l.strip_prefix("0::"))
        .map(|p| p.trim().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_and_proc_cgroup_are_read_on_hybrid_and_unified_hosts() {
        let hybrid = "25 24 0:22 / /sys/fs/cgroup ro,nosuid - tmpfs tmpfs ro,mode=755\n\
             35 25 0:30 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n\
             36 25 0:31 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n";
        assert_eq!(
            mount_point(hybrid),
            Some(PathBuf::from("/sys/fs/cgroup/unified"))
        );
        let unified = "30 23 0:26 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n";
        assert_eq!(mount_point(unified), Some(PathBuf::from("/sys/fs/cgroup")));
        assert_eq!(mount_point("30 23 0:26 / /sys rw - sysfs sysfs rw\n"), None);
        assert_eq!(
            mount_point("1 2 0:1 / /odd\\040dir rw - cgroup2 none rw\n"),
            Some(PathBuf::from("/odd dir"))
        );
        assert_eq!(
            own_path("4:memory:/x\n0::/system.slice/allot-agent.service\n").as_deref(),
            Some("/system.slice/allot-agent.service")
        );
        assert_eq!(own_path("4:memory:/x\n"), None);
    }

    #[test]
    fn a_fake_tree_reads_like_a_real_one() {
        let dir = std::env::temp_dir().join(format!("allot-cgroup-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("tmp");
        let cg = Cgroup::at(dir.join("L-1"));
        cg.create().expect("made");
        cg.create().expect("twice is fine");
        assert!(!cg.populated(), "no events file and no procs: empty");
        std::fs::write(cg.path().join("cgroup.events"), "populated 1\nfrozen 0\n").expect("w");
        assert!(cg.populated());
        std::fs::write(
            cg.path().join("memory.events"),
            "low 0\nhigh 0\nmax 3\noom 1\noom_kill 2\n",
        )
        .expect("w");
        assert_eq!(cg.oom_kills(), Some(2));
        std::fs::write(
            cg.path().join("cpu.stat"),
            "usage_usec 1500000\nuser_usec 1000000\n",
        )
        .expect("w");
        std::fs::write(cg.path().join("memory.current"), "4096\n").expect("w");
        assert_eq!(
            cg.usage(),
            Usage {
                cpu_usec: Some(1_500_000),
                memory_bytes: Some(4096)
            }
        );
        // Limits go only where a controller is; the rest is said.
        std::fs::write(cg.path().join("cgroup.controllers"), "memory pids\n").expect("w");
        let missed = cg.set_limits(&Limits {
            memory_bytes: Some(1 << 30),
            cpu_millis: Some(2500),
        });
        assert_eq!(
            std::fs::read_to_string(cg.path().join("memory.max")).expect("written"),
            "1073741824"
        );
        assert_eq!(missed.len(), 1, "{missed:?}");
        assert!(missed[0].contains("cpu controller"), "{missed:?}");
        std::fs::write(cg.path().join("cgroup.controllers"), "memory cpu\n").expect("w");
        assert!(cg
            .set_limits(&Limits {
                memory_bytes: None,
                cpu_millis: Some(2500)
            })
            .is_empty());
        assert_eq!(
            std::fs::read_to_string(cg.path().join("cpu.max")).expect("written"),
            "250000 100000"
        );
        let gone = Cgroup::at(dir.join("none"));
        assert!(!gone.populated());
        assert_eq!(gone.oom_kills(), None);
        assert_eq!(gone.usage(), Usage::default());
        gone.remove().expect("gone is fine");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
