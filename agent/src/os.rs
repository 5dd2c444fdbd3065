//! The seam between the host's rules and the operating system: starting workloads,
//! signalling their process groups, knowing a process again (pid and start time, from
//! `/proc`), looking up users, and the clock.
//!
//! [`crate::host::Host`] reaches the system only through [`Os`], so that every rule
//! can be tested without a process, a signal or a sleep (`fake::FakeOs` in unit
//! tests); the daemon gives it [`RealOs`], which is what the host did inline before.

use crate::process::Launch;
use crate::procid::ProcId;
use crate::supervisor::Exit;
use crate::supervisor::LaunchError;
use allot_checkpoint_hooks::{Identity, RunAs};
use nix::sys::signal::Signal;
use std::path::{Path, PathBuf};

#[cfg(test)]
pub mod fake;

/// A user as the host needs one: who a workload runs as.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct User {
    /// Login name.
    pub name: String,
    /// User id.
    pub uid: u32,
    /// Primary group id.
    pub gid: u32,
    /// Home directory (the workload's `HOME`).
    pub home: PathBuf,
    /// Login shell (the workload's `SHELL`).
    pub shell: PathBuf,
    /// Supplementary groups, the primary one included (`getgrouplist`).
    pub groups: Vec<u32>,
}

impl User {
    /// The environment a login gives this user: `HOME`, `USER`, `LOGNAME`, `SHELL`.
    pub fn env(&self) -> Vec<(String, String)> {
        vec![
            ("HOME".into(), self.home.display().to_string()),
            ("USER".into(), self.name.clone()),
            ("LOGNAME".into(), self.name.clone()),
            ("SHELL".into(), self.shell.display().to_string()),
        ]
    }

    /// Its identity for a child process (the switch to it).
    pub fn identity(&self) -> Identity {
        Identity {
            uid: self.uid,
            gid: self.gid,
            groups: self.groups.clone(),
        }
    }
}

/// Waits for a started workload's supervisor and returns how the workload ended.
/// The daemon runs it on a thread of its own.
pub struct Reaper(Box<dyn FnOnce() -> Exit + Send>);

impl Reaper {
    /// A reaper that runs `wait`.
    pub fn new(wait: impl FnOnce() -> Exit + Send + 'static) -> Reaper {
        Reaper(Box::new(wait))
    }

    /// Blocks until the workload has ended; how.
    pub fn wait(self) -> Exit {
        (self.0)()
    }
}

impl std::fmt::Debug for Reaper {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Reaper")
    }
}

/// A workload just started.
#[derive(Debug)]
pub struct Launched {
    /// Its identity, read at once (what every later signal is checked against).
    pub id: ProcId,
    /// Its supervisor's identity (alive while the workload's output is still taken).
    pub supervisor: ProcId,
    /// How to wait for it (the agent is its supervisor's parent and must reap it).
    pub reaper: Reaper,
    /// What the user should know of the start (limits not applied, and why).
    pub notes: Vec<String>,
}

/// What the host asks of the operating system. Implementations must be thread-safe:
/// the host lives behind the daemon's lock and ladders finish on other threads.
pub trait Os: Send + Sync {
    /// Wall-clock Unix milliseconds.
    fn now_ms(&self) -> i64;
    /// Starts a workload in its own session and process group.
    fn launch(&self, l: &Launch) -> Result<Launched, LaunchError>;
    /// The identity of `pid` now, if it exists and has not exited.
    fn identity(&self, pid: i32) -> Option<ProcId>;
    /// The process group `pid` is in.
    fn process_group(&self, pid: i32) -> Option<i32>;
    /// Sends `signal` to every process of group `pgid`.
    fn signal_group(&self, pgid: i32, signal: Signal) -> Result<(), nix::Error>;
    /// Sends a lease's time-limit warning: to every process of its cgroup but a
    /// torchrun launcher (which would shut the gang down on it; its workers run in
    /// sessions of their own, out of its group), or to group `pgid` where the lease
    /// has no cgroup.
    fn signal_warning(&self, cgroup: &str, pgid: i32, signal: Signal) -> Result<(), nix::Error>;
    /// The user id owning `pid`, if it exists.
    fn owner(&self, pid: i32) -> Option<u32>;
    /// The agent's own pid and those of its ancestors up to init: processes a lease
    /// must never hold, since a revocation signals the lease's group.
    fn own_lineage(&self) -> Vec<i32>;
    /// The user called `name`.
    fn user_by_name(&self, name: &str) -> Option<User>;
    /// The user with id `uid`.
    fn user_by_uid(&self, uid: u32) -> Option<User>;
    /// The agent's own effective user id.
    fn euid(&self) -> u32;
    /// Makes a directory and its parents; the directory itself is its owner's only
    /// (0700) and, if this made it, is given to `owner` (uid, gid).
    fn create_private_dir(&self, path: &Path, owner: Option<(u32, u32)>) -> std::io::Result<()>;
    /// Whether work can start in `dir` as `who`: it exists, is a directory, and
    /// `who` may enter it; otherwise why not (see `workdir::check`).
    fn work_dir(&self, dir: &Path, who: &RunAs) -> Result<(), String>;
    /// How a lease's workload ended, as its supervisor wrote it in the lease dir
    /// (`None`: not written, as when the supervisor itself was killed).
    fn read_exit(&self, lease_dir: &Path) -> Option<Exit>;
    /// Whether file `path` exists (a workload's checkpoint marker).
    fn file_exists(&self, path: &Path) -> bool;
    /// Writes `bytes` bytes to a scratch file in `dir`, syncs and removes it: whether
    /// the file system there has room again.
    fn probe_write(&self, dir: &Path, bytes: usize) -> std::io::Result<()>;

    /// True if `p` still names the same live process (not a recycled pid).
    fn is_same(&self, p: ProcId) -> bool {
        self.identity(p.pid) == Some(p)
    }
}

/// Wall-clock Unix milliseconds (the daemon's one clock).
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// The operating system itself: fork/exec, `killpg`, `/proc`, the user database.
#[derive(Debug, Clone, Copy, Default)]
pub struct RealOs;

/// `PPid` of `/proc/PID/status`.
fn parent_of(pid: i32) -> Option<i32> {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix("PPid:"))
        .and_then(|v| v.trim().parse().ok())
}

fn user(u: nix::unistd::User) -> User {
    // Worked out here, in the parent: the child may not allocate or read files
    // between fork and exec. A list that cannot be read leaves the primary group.
    let groups = std::ffi::CString::new(u.name.as_str())
        .ok()
        .and_then(|n| nix::unistd::getgrouplist(&n, u.gid).ok())
        .map_or_else(
            || vec![u.gid.as_raw()],
            |g| g.into_iter().map(|g| g.as_raw()).collect(),
        );
    User {
        name: u.name,
        uid: u.uid.as_raw(),
        gid: u.gid.as_raw(),
        home: u.dir,
        shell: u.shell,
        groups,
    }
}

impl Os for RealOs {
    fn now_ms(&self) -> i64 {
        now_ms()
    }

    fn launch(&self, l: &Launch) -> Result<Launched, LaunchError> {
        let started = crate::process::launch(l)?;
        let notes = started.notes;
        let mut child = started.supervisor;
        let exit_file = crate::supervisor::exit_file(&l.lease_dir);
        Ok(Launched {
            id: started.job,
            supervisor: started.supervisor_id,
            reaper: Reaper::new(move || {
                let status = child.wait();
                crate::supervisor::read_exit(&exit_file).unwrap_or_else(|| {
                    Exit::lost(match status {
                        Ok(s) => format!(
                            "its supervisor ended ({s}) without writing {}",
                            exit_file.display()
                        ),
                        Err(e) => format!("its supervisor could not be waited for: {e}"),
                    })
                })
            }),
            notes,
        })
    }

    fn identity(&self, pid: i32) -> Option<ProcId> {
        crate::procid::identity(pid)
    }

    fn process_group(&self, pid: i32) -> Option<i32> {
        crate::procid::group_and_session(pid).map(|g| g.0)
    }

    fn signal_group(&self, pgid: i32, signal: Signal) -> Result<(), nix::Error> {
        nix::sys::signal::killpg(nix::unistd::Pid::from_raw(pgid), signal)
    }

    fn signal_warning(&self, cgroup: &str, pgid: i32, signal: Signal) -> Result<(), nix::Error> {
        if cgroup.is_empty() {
            return self.signal_group(pgid, signal);
        }
        for pid in allot_checkpoint_hooks::cgroup::Cgroup::at(cgroup).procs() {
            let argv = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            let argv: Vec<&str> = argv
                .split(|b| *b == 0)
                .filter_map(|a| std::str::from_utf8(a).ok())
                .collect();
            if !is_torchrun_launcher(&argv) {
                let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), signal);
            }
        }
        Ok(())
    }

    fn owner(&self, pid: i32) -> Option<u32> {
        use std::os::unix::fs::MetadataExt;
        std::fs::metadata(format!("/proc/{pid}"))
            .ok()
            .map(|m| m.uid())
    }

    fn own_lineage(&self) -> Vec<i32> {
        let mut out = Vec::new();
        let mut pid = i32::try_from(std::process::id()).unwrap_or(0);
        // Bounded: a pid chain cannot be longer than the pid space, but a racing
        // /proc must not keep this loop going.
        while pid > 0 && out.len() < 4_096 && !out.contains(&pid) {
            out.push(pid);
            pid = parent_of(pid).unwrap_or(0);
        }
        out
    }

    fn user_by_name(&self, name: &str) -> Option<User> {
        nix::unistd::User::from_name(name).ok().flatten().map(user)
    }

    fn user_by_uid(&self, uid: u32) -> Option<User> {
        nix::unistd::User::from_uid(uid.into())
            .ok()
            .flatten()
            .map(user)
    }

    fn euid(&self) -> u32 {
        nix::unistd::geteuid().as_raw()
    }

    fn create_private_dir(&self, path: &Path, owner: Option<(u32, u32)>) -> std::io::Result<()> {
        crate::process::create_private_dir(path, owner)
    }

    fn work_dir(&self, dir: &Path, who: &RunAs) -> Result<(), String> {
        crate::workdir::check(dir, who)
    }

    fn read_exit(&self, lease_dir: &Path) -> Option<Exit> {
        crate::supervisor::read_exit(&crate::supervisor::exit_file(lease_dir))
    }

    fn file_exists(&self, path: &Path) -> bool {
        path.is_file()
    }

    fn probe_write(&self, dir: &Path, bytes: usize) -> std::io::Result<()> {
        use std::io::Write;
        let p = dir.join(".write-probe");
        let r = std::fs::File::create(&p).and_then(|mut f| {
            f.write_all(&vec![0u8; bytes])?;
            f.sync_all()
        });
        let _ = std::fs::remove_file(&p);
        r
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn real_os_knows_this_process_and_its_user() {
        let os = RealOs;
        let me = i32::try_from(std::process::id()).expect("pid fits");
        let id = os.identity(me).expect("this process is alive");
        assert!(os.is_same(id));
        assert!(!os.is_same(ProcId {
            pid: me,
            start_ticks: id.start_ticks + 1
        }));
        let u = os.user_by_uid(os.euid()).expect("the agent's user exists");
        assert_eq!(os.user_by_name(&u.name).map(|u| u.uid), Some(os.euid()));
        assert!(u.groups.contains(&u.gid), "{u:?}");
        assert!(u.home.is_absolute(), "{u:?}");
        assert!(os.now_ms() > 1_600_000_000_000);
        assert_eq!(os.owner(me), Some(os.euid()));
        let lineage = os.own_lineage();
        assert_eq!(lineage.first(), Some(&me));
        assert_eq!(lineage.last(), Some(&1), "up to init: {lineage:?}");
    }

    #[test]
    fn real_os_knows_a_users_groups_home_and_shell() {
        let Some((uid, gid)) = allot_test_support::test_user("allot-test-a") else {
            return;
        };
        let extra = allot_test_support::group_id("allot-test-grp").expect("made with the user");
        let u = RealOs.user_by_name("allot-test-a").expect("known");
        assert_eq!((u.uid, u.gid), (uid, gid));
        assert!(
            u.groups.contains(&gid) && u.groups.contains(&extra),
            "{u:?}"
        );
        assert_eq!(u.home, Path::new("/home/allot-test-a"));
        assert_eq!(u.shell, Path::new("/bin/bash"));
        assert_eq!(RealOs.user_by_uid(uid), Some(u));
    }
}

/// Whether `argv` is torchrun's own launcher: `torchrun …`, `python …/torchrun …`, or
/// `python -m torch.distributed.run` (or the older `.launch`).
pub fn is_torchrun_launcher(argv: &[&str]) -> bool {
    let base = |a: &&str| a.rsplit('/').next() == Some("torchrun");
    argv.first().is_some_and(base)
        || argv.get(1).is_some_and(base)
        || argv.windows(2).any(|w| {
            w[0] == "-m" && matches!(w[1], "torch.distributed.run" | "torch.distributed.launch")
        })
}

#[cfg(test)]
mod launcher_tests {
    use super::is_torchrun_launcher;

    #[test]
    fn torchrun_launchers_are_told_from_their_workers() {
        for l in [
            &["torchrun", "train.py"][..],
            &[
                "/venv/bin/python3",
                "/venv/bin/torchrun",
                "--nnodes",
                "2",
                "t.py",
            ],
            &["python", "-m", "torch.distributed.run", "t.py"],
            &["python3", "-u", "-m", "torch.distributed.launch", "t.py"],
        ] {
            assert!(is_torchrun_launcher(l), "{l:?}");
        }
        for w in [
            &["/venv/bin/python3", "-u", "train.py", "--ckpt-dir", "/c"][..],
            &["bash", "job.sh"],
            &["python", "torchrun_helper.py"],
            &[],
        ] {
            assert!(!is_torchrun_launcher(w), "{w:?}");
        }
    }
}
