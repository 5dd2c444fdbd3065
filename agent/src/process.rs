//! Starting workloads, and knowing them again later.
//!
//! A workload runs in its own session and process group (so the checkpoint ladder can
//! signal all of it, and an agent restart does not take it down), as its user with
//! that user's groups (switched by `allot_checkpoint_hooks::identity`, which `exec:`
//! hooks share), with its GPUs in
//! `CUDA_VISIBLE_DEVICES`/`NVIDIA_VISIBLE_DEVICES`, `ALLOT_LEASE_ID` and
//! `ALLOT_CHECKPOINT_DIR` in its environment, and its output appended to per-lease log
//! files. A process is identified by pid *and* start time (`/proc/PID/stat` field
//! 22), so a pid the kernel recycled for something else is never mistaken for it.

use allot_checkpoint_hooks::identity::{prepare, RunAs};
use allot_checkpoint_hooks::proc_stat;
use std::fs::OpenOptions;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

/// What to start.
#[derive(Debug, Clone)]
pub struct Launch {
    /// Lease id.
    pub lease: String,
    /// Command and arguments.
    pub argv: Vec<String>,
    /// GPU UUIDs the lease holds.
    pub gpus: Vec<String>,
    /// Where it checkpoints.
    pub checkpoint_dir: PathBuf,
    /// Where `<lease>.out` and `<lease>.err` go.
    pub log_dir: PathBuf,
    /// Whom it runs as: the agent's own user, or (the agent being root) another
    /// user's uid, gid and groups; the checkpoint dir, if made here, is theirs.
    pub run_as: RunAs,
    /// The whole environment, but for the GPU and lease variables added here (later
    /// entries win): nothing of the agent's own leaks in.
    pub env: Vec<(String, String)>,
    /// Where it starts; `None`: the agent's own directory.
    pub cwd: Option<PathBuf>,
}

/// A process, as pid plus start time (clock ticks since boot).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcId {
    /// Process id (also its process group and session id when we started it).
    pub pid: i32,
    /// Start time, in clock ticks since boot.
    pub start_ticks: u64,
}

/// Why a workload could not be started.
#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    /// Nothing to run.
    #[error("lease {0}: empty command; give the program and its arguments")]
    EmptyCommand(String),
    /// A directory or log file could not be made.
    #[error("lease {lease}: {path}: {source}")]
    Io {
        /// Lease.
        lease: String,
        /// The path.
        path: String,
        /// Why.
        source: std::io::Error,
    },
    /// The program could not be started.
    #[error("lease {lease}: cannot start {program:?}: {source}")]
    Spawn {
        /// Lease.
        lease: String,
        /// The program.
        program: String,
        /// Why.
        source: std::io::Error,
    },
}

/// The identity of `pid` now, if it exists and has not exited.
pub fn identity(pid: i32) -> Option<ProcId> {
    proc_stat(pid).filter(|s| !s.exited()).map(|s| ProcId {
        pid,
        start_ticks: s.start_ticks,
    })
}

/// True if `p` still names the same live process (not a recycled pid).
pub fn is_same(p: ProcId) -> bool {
    identity(p.pid) == Some(p)
}

/// Process group and session of `pid`.
pub fn group_and_session(pid: i32) -> Option<(i32, i32)> {
    proc_stat(pid).map(|s| (s.pgrp, s.session))
}

fn log_file(l: &Launch, ext: &str) -> Result<std::fs::File, LaunchError> {
    let path = l.log_dir.join(format!("{}.{ext}", l.lease));
    OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .map_err(|source| LaunchError::Io {
            lease: l.lease.clone(),
            path: path.display().to_string(),
            source,
        })
}

/// Makes `path` and its parents; `path` itself, if this made it, is given to `owner`
/// (uid, gid). Only the last directory: its parents hold files the agent writes as
/// root (the logs), which a workload must not be able to swap for links.
pub fn create_dir_owned(path: &Path, owner: Option<(u32, u32)>) -> std::io::Result<()> {
    let made = !path.exists();
    std::fs::create_dir_all(path)?;
    match owner {
        Some((uid, gid)) if made => std::os::unix::fs::chown(path, Some(uid), Some(gid)),
        _ => Ok(()),
    }
}

fn make_dir(l: &Launch, p: &Path, owner: Option<(u32, u32)>) -> Result<(), LaunchError> {
    create_dir_owned(p, owner).map_err(|source| LaunchError::Io {
        lease: l.lease.clone(),
        path: p.display().to_string(),
        source,
    })
}

/// Starts the workload; returns the child (for reaping) and its identity.
pub fn launch(l: &Launch) -> Result<(Child, ProcId), LaunchError> {
    let (program, args) = l
        .argv
        .split_first()
        .ok_or_else(|| LaunchError::EmptyCommand(l.lease.clone()))?;
    let mut cmd = Command::new(program);
    // A session of its own: the workload leads its process group, apart from the
    // agent, and takes its user's identity before exec. First, so that a start with
    // no one to run as leaves nothing behind.
    prepare(&mut cmd, &l.run_as, true).map_err(|why| LaunchError::Spawn {
        lease: l.lease.clone(),
        program: program.clone(),
        source: std::io::Error::new(std::io::ErrorKind::PermissionDenied, why),
    })?;
    // The workload (and its exec hook) writes checkpoints as its own user.
    let owner = match &l.run_as {
        RunAs::User(id) => Some((id.uid, id.gid)),
        _ => None,
    };
    make_dir(l, &l.checkpoint_dir, owner)?;
    make_dir(l, &l.log_dir, None)?;
    let gpus = l.gpus.join(",");
    if let Some(dir) = &l.cwd {
        cmd.current_dir(dir);
    }
    cmd.args(args)
        .env_clear()
        .envs(l.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .env("CUDA_VISIBLE_DEVICES", &gpus)
        .env("NVIDIA_VISIBLE_DEVICES", &gpus)
        .env("ALLOT_LEASE_ID", &l.lease)
        .env("ALLOT_CHECKPOINT_DIR", &l.checkpoint_dir)
        .stdin(Stdio::null())
        .stdout(log_file(l, "out")?)
        .stderr(log_file(l, "err")?);
    let child = cmd.spawn().map_err(|source| LaunchError::Spawn {
        lease: l.lease.clone(),
        program: program.clone(),
        source,
    })?;
    let pid = child.id() as i32;
    // Read at once: the identity that every later signal is checked against. The
    // child cannot be reaped before we wait on it, so even one that has already
    // exited (a zombie) still shows its start time here.
    let id = proc_stat(pid)
        .map(|s| ProcId {
            pid,
            start_ticks: s.start_ticks,
        })
        .ok_or_else(|| LaunchError::Io {
            lease: l.lease.clone(),
            path: format!("/proc/{pid}/stat"),
            source: std::io::Error::other("the new process has no /proc entry"),
        })?;
    Ok((child, id))
}
