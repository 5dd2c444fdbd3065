//! Where each lease's cgroup goes: one directory per agent under a writable cgroup v2
//! tree (the unit's delegated subtree under systemd's `Delegate=yes`, or any cgroup2
//! mount the agent can write, such as `/sys/fs/cgroup/unified` on hybrid hosts), one
//! directory per lease under it. The agent's directory is named after the host and its
//! state dir, so several agents (a dev cluster, parallel tests) share one mount
//! without touching each other's leases.
//!
//! Where no cgroup can be made the agent falls back to process groups and says so,
//! once in its log and in `allot gpus` ([`Placement::Off`]).

use allot_checkpoint_hooks::cgroup::{mount_point, own_path, Cgroup};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// Where the agent's lease cgroups live, or why there are none.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Placement {
    /// Under this directory (the agent's own, made and writable).
    At(PathBuf),
    /// None: why (shown in `allot gpus`).
    Off(String),
}

impl Placement {
    /// The directory for `lease`, when there is a place for cgroups.
    pub fn lease_dir(&self, lease: &str) -> Option<PathBuf> {
        match self {
            Placement::At(base) => Some(base.join(safe_name(lease))),
            Placement::Off(_) => None,
        }
    }

    /// Why processes are tracked by process group only; `None` when cgroups are used.
    pub fn why_off(&self) -> Option<&str> {
        match self {
            Placement::At(_) => None,
            Placement::Off(why) => Some(why),
        }
    }
}

/// A name the cgroup file system takes: letters, digits, `-`, `_`, `.` kept, the
/// rest `_`; never empty, `.` or `..`.
fn safe_name(s: &str) -> String {
    let n: String = s
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.') {
                c
            } else {
                '_'
            }
        })
        .collect();
    if n.is_empty() || n.chars().all(|c| c == '.') {
        format!("_{n}")
    } else {
        n
    }
}

/// A short stable hash (FNV-1a) of the state dir: two agents of one host name (a
/// dev cluster's) still get directories of their own.
fn short_hash(s: &str) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in s.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    format!("{:08x}", h as u32)
}

/// The agent's directory name under the cgroup root it uses.
pub fn agent_dir_name(host: &str, state_dir: &Path) -> String {
    format!(
        "allot-{}-{}",
        safe_name(host),
        short_hash(&state_dir.display().to_string())
    )
}

/// Finds (and makes) the agent's cgroup directory. `setting` is `[agent] cgroup`:
/// `auto` (the agent's own cgroup v2 directory when it may write there, else the
/// mount's root), `off`, or a directory.
pub fn discover(setting: &str, host: &str, state_dir: &Path) -> Placement {
    let name = agent_dir_name(host, state_dir);
    let parent = match setting {
        "off" => return Placement::Off("[agent] cgroup = \"off\"".into()),
        "auto" | "" => match auto_parent() {
            Ok(p) => p,
            Err(why) => return Placement::Off(why),
        },
        dir => PathBuf::from(dir),
    };
    let base = Cgroup::at(parent.join(&name));
    if let Err(e) = base.create() {
        return Placement::Off(format!(
            "cannot make {}: {e} (on systemd hosts the unit needs Delegate=yes; or set [agent] cgroup to a writable cgroup v2 directory)",
            base.path().display()
        ));
    }
    // Memory and CPU for the leases, where the tree above gives them.
    base.delegate_controllers();
    Placement::At(base.path().to_path_buf())
}

/// The cgroup v2 directory to make the agent's own under: the agent's own cgroup
/// (what systemd delegates with `Delegate=yes`), or, where that is not writable,
/// the mount's root.
fn auto_parent() -> Result<PathBuf, String> {
    let info = std::fs::read_to_string("/proc/self/mountinfo")
        .map_err(|e| format!("cannot read /proc/self/mountinfo: {e}"))?;
    let mount = mount_point(&info).ok_or_else(|| {
        "no cgroup v2 file system is mounted (mount one, or set [agent] cgroup = \"off\")"
            .to_string()
    })?;
    let own = std::fs::read_to_string("/proc/self/cgroup")
        .ok()
        .and_then(|t| own_path(&t))
        .unwrap_or_default();
    let mut own_dir = mount.join(own.trim_start_matches('/'));
    if own_dir.file_name().is_some_and(|n| n == AGENT_LEAF) {
        // Moved there by an earlier run of this process's program: its parent is
        // the delegated directory.
        if let Some(p) = own_dir.parent() {
            own_dir = p.to_path_buf();
        }
    }
    if own_dir != mount && writable(&own_dir) {
        // A delegated subtree (systemd's Delegate=yes): the agent itself moves into a
        // leaf of it, since a cgroup holding processes cannot hand memory and cpu
        // controllers down to the leases (cgroup v2's no-internal-processes rule).
        let leaf = Cgroup::at(own_dir.join(AGENT_LEAF));
        if let Err(e) = leaf
            .create()
            .and_then(|()| leaf.add(i32::try_from(std::process::id()).unwrap_or(0)))
        {
            tracing::warn!(cgroup = %leaf.path().display(), error = %e, "cannot move the agent into its own leaf: leases get no memory or cpu controller");
        }
        Cgroup::at(&own_dir).delegate_controllers();
        Ok(own_dir)
    } else if writable(&own_dir) {
        Ok(own_dir)
    } else if writable(&mount) {
        Ok(mount)
    } else {
        Err(format!(
            "neither {} nor {} is writable (on systemd hosts the unit needs Delegate=yes)",
            own_dir.display(),
            mount.display()
        ))
    }
}

/// The leaf the agent moves itself into under a delegated subtree.
const AGENT_LEAF: &str = "agent";

fn writable(dir: &Path) -> bool {
    nix::unistd::access(dir, nix::unistd::AccessFlags::W_OK).is_ok()
}

/// Ends and removes every lease cgroup under `base` but those in `keep` (the live
/// leases' directories): what a crash between a lease's end and its cleanup left.
/// Returns the directories removed.
pub fn sweep(base: &Path, keep: &BTreeSet<PathBuf>) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(base) else {
        return Vec::new();
    };
    let mut removed = Vec::new();
    for e in entries.flatten() {
        let dir = e.path();
        if !e.file_type().is_ok_and(|t| t.is_dir()) || keep.contains(&dir) {
            continue;
        }
        let cg = Cgroup::at(&dir);
        if cg.populated() && !cg.kill() {
            tracing::warn!(cgroup = %dir.display(), "processes of an ended lease outlive cgroup.kill");
            continue;
        }
        match cg.remove() {
            Ok(()) => removed.push(dir),
            Err(e) => {
                tracing::warn!(cgroup = %dir.display(), error = %e, "cannot remove an ended lease's cgroup")
            }
        }
    }
    removed
}

/// Per-lease CPU use from each lease cgroup's `cpu.stat` between two listings: the
/// whole process tree's, in percent of one CPU (as `top` shows a process).
#[derive(Debug, Default)]
pub struct CpuMeter(std::collections::HashMap<PathBuf, (std::time::Instant, u64)>);

impl CpuMeter {
    /// CPU percent of `dir` since its previous sample (`None` on the first, or
    /// without `cpu.stat`) and its memory (`memory.current`, with the controller).
    pub fn sample(&mut self, dir: &Path, now: std::time::Instant) -> (Option<f64>, Option<u64>) {
        let u = Cgroup::at(dir).usage();
        let pct = u.cpu_usec.and_then(|usec| {
            let prev = self.0.insert(dir.to_path_buf(), (now, usec));
            let (then, before) = prev?;
            cpu_percent(
                now.saturating_duration_since(then),
                usec.saturating_sub(before),
            )
        });
        (pct, u.memory_bytes)
    }

    /// Forgets every cgroup but `live` (ended leases' samples).
    pub fn keep_only(&mut self, live: &BTreeSet<PathBuf>) {
        self.0.retain(|dir, _| live.contains(dir));
    }
}

/// CPU percent of `used_usec` CPU time over `wall`; `None` over too short a time to say.
pub fn cpu_percent(wall: std::time::Duration, used_usec: u64) -> Option<f64> {
    let wall_usec = wall.as_micros();
    (wall_usec >= 10_000).then(|| used_usec as f64 * 100.0 / wall_usec as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_safe_and_agents_apart() {
        assert_eq!(safe_name("w-12/r1 x"), "w-12_r1_x");
        assert_eq!(safe_name(".."), "_..");
        assert_eq!(safe_name(""), "_");
        let a = agent_dir_name("node-1", Path::new("/var/lib/allot/agent"));
        let b = agent_dir_name("node-1", Path::new("/tmp/dev/node-1"));
        assert!(a.starts_with("allot-node-1-") && a != b, "{a} {b}");
        assert_eq!(
            a,
            agent_dir_name("node-1", Path::new("/var/lib/allot/agent"))
        );
        let p = Placement::At("/cg/allot-x".into());
        assert_eq!(p.lease_dir("L-1"), Some(PathBuf::from("/cg/allot-x/L-1")));
        assert_eq!(p.why_off(), None);
        assert_eq!(Placement::Off("no".into()).lease_dir("L-1"), None);
    }

    #[test]
    fn off_is_off_and_an_unwritable_dir_says_why() {
        let off = discover("off", "h", Path::new("/s"));
        assert_eq!(off.why_off(), Some("[agent] cgroup = \"off\""));
        let bad = discover("/proc/no-such-cgroup-dir", "h", Path::new("/s"));
        let why = bad.why_off().expect("cannot be made");
        assert!(
            why.contains("/proc/no-such-cgroup-dir") && why.contains("Delegate=yes"),
            "{why}"
        );
    }

    #[test]
    fn cpu_percent_is_cpu_time_over_wall_time() {
        let s = std::time::Duration::from_secs(2);
        assert_eq!(cpu_percent(s, 3_000_000), Some(150.0));
        assert_eq!(cpu_percent(s, 0), Some(0.0));
        assert_eq!(cpu_percent(std::time::Duration::from_millis(1), 500), None);
        // A fake cgroup: the first sample has nothing to compare with.
        let dir = std::env::temp_dir().join(format!("allot-cpu-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        std::fs::write(dir.join("cpu.stat"), "usage_usec 1000000\nuser_usec 0\n").expect("w");
        std::fs::write(dir.join("memory.current"), "4096\n").expect("w");
        let mut m = CpuMeter::default();
        let t0 = std::time::Instant::now();
        assert_eq!(m.sample(&dir, t0), (None, Some(4096)));
        std::fs::write(dir.join("cpu.stat"), "usage_usec 1500000\n").expect("w");
        assert_eq!(m.sample(&dir, t0 + s), (Some(25.0), Some(4096)));
        m.keep_only(&BTreeSet::new());
        assert_eq!(m.sample(&dir, t0 + s + s).0, None, "forgotten");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn sweep_removes_what_no_live_lease_holds() {
        // A plain directory tree stands in: nothing is populated, rmdir works.
        let base = std::env::temp_dir().join(format!("allot-sweep-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&base);
        for l in ["L-1", "L-2"] {
            std::fs::create_dir_all(base.join(l)).expect("mkdir");
        }
        let keep: BTreeSet<_> = [base.join("L-2")].into();
        assert_eq!(sweep(&base, &keep), vec![base.join("L-1")]);
        assert!(base.join("L-2").is_dir() && !base.join("L-1").exists());
        let _ = std::fs::remove_dir_all(&base);
    }
}
