//! A scripted operating system for unit tests: processes are table rows, signals are
//! recorded, time moves when the test says so. Every call except the clock is
//! recorded in order ([`FakeOs::calls`]) so that a test can assert what the host did
//! to the system, and what it did not.

use super::{Launched, Os, Reaper, User};
use crate::process::Launch;
use crate::procid::ProcId;
use crate::supervisor::Exit;
use crate::supervisor::LaunchError;
use nix::sys::signal::Signal;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

/// One call the host made.
#[derive(Debug, Clone)]
pub enum Call {
    /// A workload start.
    Launch(Box<Launch>),
    /// An identity check of a pid.
    Identity(i32),
    /// A process-group look-up.
    ProcessGroup(i32),
    /// A signal to a process group.
    Signal(i32, Signal),
    /// A user look-up by name.
    UserByName(String),
    /// A user look-up by id.
    UserByUid(u32),
    /// The agent's own uid was asked.
    Euid,
    /// A directory was made, for this owner (uid, gid).
    CreateDir(PathBuf, Option<(u32, u32)>),
    /// Who owns a process was asked.
    Owner(i32),
    /// The agent's own lineage was asked.
    Lineage,
    /// A working directory was checked.
    WorkDir(PathBuf),
}

/// A process in the fake's table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Proc {
    /// Start time in ticks.
    pub start_ticks: u64,
    /// Process group.
    pub pgrp: i32,
    /// Not exited.
    pub alive: bool,
    /// The user owning it.
    pub owner: u32,
}

#[derive(Debug)]
struct State {
    now_ms: i64,
    next_pid: i32,
    next_ticks: u64,
    procs: BTreeMap<i32, Proc>,
    users: Vec<User>,
    euid: u32,
    lineage: Vec<i32>,
    fail_launch: Option<std::io::Error>,
    missing_dirs: Vec<PathBuf>,
    /// Each started workload's supervisor, by the workload's pid.
    supervisors: BTreeMap<i32, i32>,
    /// What each lease dir's `exit.json` says.
    exits: BTreeMap<PathBuf, Exit>,
    /// Files written by workloads (checkpoint markers).
    files: std::collections::BTreeSet<PathBuf>,
    /// Directories on a full file system (a probe write there fails).
    full_dirs: Vec<PathBuf>,
    calls: Vec<Call>,
}

/// A user with home `/home/NAME` (`/root` for uid 0), shell `/bin/sh`, in its
/// primary group only.
pub fn fake_user(name: &str, uid: u32, gid: u32) -> User {
    User {
        name: name.into(),
        uid,
        gid,
        home: if uid == 0 {
            "/root".into()
        } else {
            PathBuf::from("/home").join(name)
        },
        shell: "/bin/sh".into(),
        groups: vec![gid],
    }
}

/// A started workload's supervisor has the workload's pid plus this.
pub const SUPERVISOR_PIDS: i32 = 50_000;

/// The agent's own pid in the fake (its parent is init, pid 1).
pub const AGENT_PID: i32 = 42;

/// The fake; clones share one state (keep one, give the host another).
#[derive(Debug, Clone)]
pub struct FakeOs(Arc<Mutex<State>>);

impl Default for FakeOs {
    fn default() -> Self {
        FakeOs::new()
    }
}

impl FakeOs {
    /// Time at 1,000,000 ms, the agent running as root (pid [`AGENT_PID`], child of
    /// init), users `root` (0), `daemon` (1, a system user) and `alice` (1000, group
    /// 100, also in group 44), no other processes.
    pub fn new() -> FakeOs {
        let os = FakeOs(Arc::new(Mutex::new(State {
            now_ms: 1_000_000,
            next_pid: 100,
            next_ticks: 5_000,
            procs: BTreeMap::new(),
            users: vec![
                fake_user("root", 0, 0),
                fake_user("daemon", 1, 1),
                User {
                    groups: vec![100, 44],
                    ..fake_user("alice", 1000, 100)
                },
            ],
            euid: 0,
            lineage: vec![AGENT_PID, 1],
            fail_launch: None,
            missing_dirs: Vec::new(),
            supervisors: BTreeMap::new(),
            exits: BTreeMap::new(),
            files: std::collections::BTreeSet::new(),
            full_dirs: Vec::new(),
            calls: Vec::new(),
        })));
        // Init and the agent itself run, owned by root, each leading its group.
        for pid in [1, AGENT_PID] {
            FakeOs::add(&mut os.state(), pid, pid);
        }
        os
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The clock now.
    pub fn now(&self) -> i64 {
        self.state().now_ms
    }

    /// Sets the clock.
    pub fn set_now(&self, ms: i64) {
        self.state().now_ms = ms;
    }

    /// Moves the clock on; returns the new time.
    pub fn advance(&self, ms: i64) -> i64 {
        let mut s = self.state();
        s.now_ms += ms;
        s.now_ms
    }

    /// A process the agent did not start (to adopt), leading its own group.
    pub fn spawn(&self) -> ProcId {
        let mut s = self.state();
        let pid = s.next_pid;
        s.next_pid += 1;
        Self::add(&mut s, pid, pid)
    }

    /// A process in someone else's group `pgrp`.
    pub fn spawn_in_group(&self, pgrp: i32) -> ProcId {
        let mut s = self.state();
        let pid = s.next_pid;
        s.next_pid += 1;
        Self::add(&mut s, pid, pgrp)
    }

    /// A process of user `uid` leading its own group.
    pub fn spawn_owned_by(&self, uid: u32) -> ProcId {
        let p = self.spawn();
        if let Some(x) = self.state().procs.get_mut(&p.pid) {
            x.owner = uid;
        }
        p
    }

    fn add(s: &mut State, pid: i32, pgrp: i32) -> ProcId {
        s.next_ticks += 1;
        let start_ticks = s.next_ticks;
        s.procs.insert(
            pid,
            Proc {
                start_ticks,
                pgrp,
                alive: true,
                owner: 0,
            },
        );
        ProcId { pid, start_ticks }
    }

    /// `pid` exits (a workload's supervisor with it, as it does once the output is
    /// drained and `exit.json` written).
    pub fn exit(&self, pid: i32) {
        let mut s = self.state();
        let sup = s.supervisors.get(&pid).copied();
        for p in [Some(pid), sup].into_iter().flatten() {
            if let Some(p) = s.procs.get_mut(&p) {
                p.alive = false;
            }
        }
    }

    /// `pid` exits but its supervisor still runs (draining the output).
    pub fn exit_before_supervisor(&self, pid: i32) {
        if let Some(p) = self.state().procs.get_mut(&pid) {
            p.alive = false;
        }
    }

    /// The supervisor of workload `pid`, if the fake started one.
    pub fn supervisor_of(&self, pid: i32) -> Option<i32> {
        self.state().supervisors.get(&pid).copied()
    }

    /// The file system holding `dir` is full (`true`) or has room again.
    pub fn set_full(&self, dir: &Path, full: bool) {
        let mut s = self.state();
        s.full_dirs.retain(|d| d != dir);
        if full {
            s.full_dirs.push(dir.to_path_buf());
        }
    }

    /// A workload writes file `path` (a checkpoint marker).
    pub fn touch(&self, path: &Path) {
        self.state().files.insert(path.to_path_buf());
    }

    /// The supervisor writes `exit` into `lease_dir`'s `exit.json`.
    pub fn write_exit(&self, lease_dir: &Path, exit: Exit) {
        self.state().exits.insert(lease_dir.to_path_buf(), exit);
    }

    /// The kernel gives `pid` to a new, unrelated process (a recycled pid).
    pub fn reuse(&self, pid: i32) -> ProcId {
        let mut s = self.state();
        Self::add(&mut s, pid, pid)
    }

    /// `pid` as the fake knows it.
    pub fn process(&self, pid: i32) -> Option<Proc> {
        self.state().procs.get(&pid).copied()
    }

    /// Adds a user (home `/home/NAME`, shell `/bin/sh`, only its primary group).
    pub fn add_user(&self, name: &str, uid: u32, gid: u32) {
        self.state().users.push(fake_user(name, uid, gid));
    }

    /// The agent runs as `uid`.
    pub fn set_euid(&self, uid: u32) {
        self.state().euid = uid;
    }

    /// The next launch fails to spawn with `message`.
    pub fn fail_next_launch(&self, message: &str) {
        self.state().fail_launch = Some(std::io::Error::other(message.to_string()));
    }

    /// The next launch fails to make its files with the OS error `errno` (ENOSPC).
    pub fn fail_next_launch_errno(&self, errno: i32) {
        self.state().fail_launch = Some(std::io::Error::from_raw_os_error(errno));
    }

    /// `dir` does not exist on this host (every other directory does, and anyone
    /// may enter it).
    pub fn remove_dir(&self, dir: &str) {
        self.state().missing_dirs.push(dir.into());
    }

    /// Every call so far, in order.
    pub fn calls(&self) -> Vec<Call> {
        self.state().calls.clone()
    }

    /// Forgets the calls so far.
    pub fn clear_calls(&self) {
        self.state().calls.clear();
    }

    /// The signals sent so far, as (process group, signal).
    pub fn signals(&self) -> Vec<(i32, Signal)> {
        self.calls()
            .into_iter()
            .filter_map(|c| match c {
                Call::Signal(g, s) => Some((g, s)),
                _ => None,
            })
            .collect()
    }

    /// The workloads started so far.
    pub fn launches(&self) -> Vec<Launch> {
        self.calls()
            .into_iter()
            .filter_map(|c| match c {
                Call::Launch(l) => Some(*l),
                _ => None,
            })
            .collect()
    }

    fn record(&self, c: Call) -> MutexGuard<'_, State> {
        let mut s = self.state();
        s.calls.push(c);
        s
    }
}

impl Os for FakeOs {
    fn now_ms(&self) -> i64 {
        self.now()
    }

    fn launch(&self, l: &Launch) -> Result<Launched, LaunchError> {
        let mut s = self.record(Call::Launch(Box::new(l.clone())));
        if let Some(source) = s.fail_launch.take() {
            return Err(LaunchError::Spawn {
                lease: l.lease.clone(),
                program: l.argv.first().cloned().unwrap_or_default(),
                source,
            });
        }
        if l.argv.is_empty() && l.script.is_empty() {
            return Err(LaunchError::EmptyCommand(l.lease.clone()));
        }
        let pid = s.next_pid;
        s.next_pid += 1;
        let id = Self::add(&mut s, pid, pid);
        // Supervisors from a range of their own: workloads keep the pids tests expect.
        let supervisor = Self::add(&mut s, pid + SUPERVISOR_PIDS, pid + SUPERVISOR_PIDS);
        s.supervisors.insert(pid, supervisor.pid);
        Ok(Launched {
            id,
            supervisor,
            // The test tells the host of the exit itself (`Host::on_exit`).
            reaper: Reaper::new(|| Exit::lost("the fake reaps nothing")),
            notes: Vec::new(),
        })
    }

    fn identity(&self, pid: i32) -> Option<ProcId> {
        let s = self.record(Call::Identity(pid));
        s.procs.get(&pid).filter(|p| p.alive).map(|p| ProcId {
            pid,
            start_ticks: p.start_ticks,
        })
    }

    fn process_group(&self, pid: i32) -> Option<i32> {
        let s = self.record(Call::ProcessGroup(pid));
        s.procs.get(&pid).map(|p| p.pgrp)
    }

    fn signal_group(&self, pgid: i32, signal: Signal) -> Result<(), nix::Error> {
        let s = self.record(Call::Signal(pgid, signal));
        if s.procs.values().any(|p| p.alive && p.pgrp == pgid) {
            Ok(())
        } else {
            Err(nix::Error::ESRCH)
        }
    }

    fn signal_warning(&self, _cgroup: &str, pgid: i32, signal: Signal) -> Result<(), nix::Error> {
        self.signal_group(pgid, signal)
    }

    fn owner(&self, pid: i32) -> Option<u32> {
        let s = self.record(Call::Owner(pid));
        s.procs.get(&pid).map(|p| p.owner)
    }

    fn own_lineage(&self) -> Vec<i32> {
        self.record(Call::Lineage).lineage.clone()
    }

    fn user_by_name(&self, name: &str) -> Option<User> {
        let s = self.record(Call::UserByName(name.into()));
        s.users.iter().find(|u| u.name == name).cloned()
    }

    fn user_by_uid(&self, uid: u32) -> Option<User> {
        let s = self.record(Call::UserByUid(uid));
        s.users.iter().find(|u| u.uid == uid).cloned()
    }

    fn euid(&self) -> u32 {
        self.record(Call::Euid).euid
    }

    fn create_private_dir(&self, path: &Path, owner: Option<(u32, u32)>) -> std::io::Result<()> {
        drop(self.record(Call::CreateDir(path.to_path_buf(), owner)));
        Ok(())
    }

    fn read_exit(&self, lease_dir: &Path) -> Option<Exit> {
        self.state().exits.get(lease_dir).cloned()
    }

    fn file_exists(&self, path: &Path) -> bool {
        self.state().files.contains(path)
    }

    fn probe_write(&self, dir: &Path, _bytes: usize) -> std::io::Result<()> {
        if self.state().full_dirs.iter().any(|d| dir.starts_with(d)) {
            Err(std::io::Error::from_raw_os_error(
                nix::errno::Errno::ENOSPC as i32,
            ))
        } else {
            Ok(())
        }
    }

    fn work_dir(&self, dir: &Path, _who: &allot_checkpoint_hooks::RunAs) -> Result<(), String> {
        let s = self.record(Call::WorkDir(dir.to_path_buf()));
        if s.missing_dirs.iter().any(|d| d == dir) {
            Err(format!("{} does not exist", dir.display()))
        } else {
            Ok(())
        }
    }
}
