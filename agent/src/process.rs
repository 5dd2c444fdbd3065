//! Starting workloads, and knowing them again later.
//!
//! A workload runs under a supervisor of its own ([`crate::supervisor`]), in its own
//! cgroup where the host has one for it, in its own session and process group (so
//! the checkpoint ladder can signal all of it, and an agent restart does not take it
//! down), as its user with that user's groups (switched by
//! `allot_checkpoint_hooks::identity`, which `exec:` hooks share), with its GPUs in
//! `CUDA_VISIBLE_DEVICES`/`NVIDIA_VISIBLE_DEVICES`, `ALLOT_LEASE_ID` and
//! `ALLOT_CHECKPOINT_DIR` in its environment, and its output, capped, in its log
//! files. A process is identified by pid *and* start time (`/proc/PID/stat` field
//! 22), so a pid the kernel recycled for something else is never mistaken for it.

use crate::supervisor::{self, exit_file, LaunchError, Spec, Started};
use allot_checkpoint_hooks::cgroup::{Cgroup, Limits};
use allot_checkpoint_hooks::identity::RunAs;
use std::path::{Path, PathBuf};

/// What to start.
#[derive(Debug, Clone)]
pub struct Launch {
    /// Lease id.
    pub lease: String,
    /// Command and arguments; with a script, its arguments.
    pub argv: Vec<String>,
    /// A batch script: written to `lease_dir/job/script`, the user's alone, and run
    /// by its `#!` line (empty: `argv` is the command).
    pub script: String,
    /// GPU UUIDs the lease holds.
    pub gpus: Vec<String>,
    /// Where it checkpoints.
    pub checkpoint_dir: PathBuf,
    /// The lease's own directory (the supervisor's diagnostics and `exit.json`).
    pub lease_dir: PathBuf,
    /// Stdout file.
    pub out_log: PathBuf,
    /// Stderr file.
    pub err_log: PathBuf,
    /// Stdout is a file of the user's own (`--output /…` or `./…`): opened as the
    /// user, uncapped, its directory theirs to have made.
    pub out_users_own: bool,
    /// Stderr is, the same.
    pub err_users_own: bool,
    /// Bytes of output kept per run.
    pub cap_bytes: u64,
    /// The lease's cgroup (made here); `None`: process groups only.
    pub cgroup: Option<PathBuf>,
    /// CPU and memory limits for its cgroup.
    pub limits: Limits,
    /// The program that supervises it (`allot-agent`, run as `allot-agent supervise`).
    pub supervisor: PathBuf,
    /// Whom it runs as: the agent's own user, or (the agent being root) another
    /// user's uid, gid and groups; the checkpoint dir, if made here, is theirs.
    pub run_as: RunAs,
    /// The whole environment, but for the GPU and lease variables added here (later
    /// entries win): nothing of the agent's own leaks in.
    pub env: Vec<(String, String)>,
    /// Where it starts; `None`: the agent's own directory.
    pub cwd: Option<PathBuf>,
    /// A session: on a terminal its supervisor holds ([`crate::tty`]).
    pub pty: bool,
    /// Its fence, for a lease of allotd's; `None`: it is never fenced.
    pub fence: Option<crate::fence::Fence>,
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

/// [`create_dir_owned`], the directory readable by its owner only (0700): a
/// checkpoint holds the job's weights and data, no other user's to read.
pub fn create_private_dir(path: &Path, owner: Option<(u32, u32)>) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    create_dir_owned(path, owner)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o700))
}

/// Makes the agent's log directory `path` (and its parents) so that others may
/// reach a file they are told of but not list the names (0711): one file per
/// workload, so a listing would tell every user's workload ids. A directory this
/// process does not own, or a shared one (sticky, as /tmp), keeps its mode.
pub fn create_log_dir(path: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o711)
        .create(path)?;
    let meta = std::fs::metadata(path)?;
    let ours = meta.uid() == nix::unistd::geteuid().as_raw();
    if ours && meta.mode() & 0o1000 == 0 && meta.mode() & 0o066 != 0 {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o711))?;
    }
    Ok(())
}

/// A batch script at `path`, mode 0700, owned by `owner` (written fresh: a rerun
/// writes the script it was given again).
fn write_script(path: &Path, text: &str, owner: Option<(u32, u32)>) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let _ = std::fs::remove_file(path);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o700)
        .open(path)?;
    f.write_all(text.as_bytes())?;
    f.sync_all()?;
    // The open file, never the path: the directory is the user's, who could swap
    // the name for a link meanwhile.
    if let Some((uid, gid)) = owner {
        std::os::unix::fs::fchown(&f, Some(uid), Some(gid))?;
    }
    Ok(())
}

/// `path` could not be made for lease `l`.
fn io_error(l: &Launch, path: &Path) -> impl FnOnce(std::io::Error) -> LaunchError {
    let (lease, path) = (l.lease.clone(), path.display().to_string());
    move |source| LaunchError::Io {
        lease,
        path,
        source,
    }
}

fn make_dir(l: &Launch, p: &Path, owner: Option<(u32, u32)>) -> Result<(), LaunchError> {
    create_dir_owned(p, owner).map_err(io_error(l, p))
}

/// Starts the workload under its supervisor; returns once it runs.
pub fn launch(l: &Launch) -> Result<Started, LaunchError> {
    if l.argv.is_empty() && l.script.is_empty() {
        return Err(LaunchError::EmptyCommand(l.lease.clone()));
    }
    let user = match &l.run_as {
        RunAs::Agent => None,
        RunAs::User(id) => Some(id.clone()),
        RunAs::Nobody(why) => {
            return Err(LaunchError::Spawn {
                lease: l.lease.clone(),
                program: l.argv.first().cloned().unwrap_or_else(|| "script".into()),
                source: std::io::Error::new(std::io::ErrorKind::PermissionDenied, why.clone()),
            })
        }
    };
    // The workload (and its exec hook) writes checkpoints as its own user.
    let owner = user.as_ref().map(|id| (id.uid, id.gid));
    create_private_dir(&l.checkpoint_dir, owner).map_err(io_error(l, &l.checkpoint_dir))?;
    make_dir(l, &l.lease_dir, None)?;
    // The agent's log dir: made by the agent, the files given to the user; a
    // user's own path is never touched as root.
    for (log, own) in [(&l.out_log, l.out_users_own), (&l.err_log, l.err_users_own)] {
        if let Some(dir) = log.parent().filter(|_| !own) {
            create_log_dir(dir).map_err(io_error(l, dir))?;
        }
    }
    let argv = if l.script.is_empty() {
        l.argv.clone()
    } else {
        // As slurmd keeps a job's script in its spool: in the lease's directory, in a
        // directory only the user reads, executable by its owner.
        let dir = l.lease_dir.join("job");
        create_private_dir(&dir, owner).map_err(io_error(l, &dir))?;
        let path = dir.join("script");
        write_script(&path, &l.script, owner).map_err(io_error(l, &path))?;
        std::iter::once(path.display().to_string())
            .chain(l.argv.iter().cloned())
            .collect()
    };
    let mut notes = Vec::new();
    match &l.cgroup {
        Some(dir) => {
            let cg = Cgroup::at(dir);
            cg.create().map_err(io_error(l, dir))?;
            notes = cg.set_limits(&l.limits);
        }
        None if l.limits != Limits::default() => {
            notes.push("no cgroup for this lease: its cpu and memory limits are not applied".into())
        }
        None => {}
    }
    let gpus = l.gpus.join(",");
    let mut env = l.env.clone();
    env.extend([
        ("CUDA_VISIBLE_DEVICES".to_string(), gpus.clone()),
        ("NVIDIA_VISIBLE_DEVICES".to_string(), gpus),
        ("ALLOT_LEASE_ID".to_string(), l.lease.clone()),
        (
            "ALLOT_CHECKPOINT_DIR".to_string(),
            l.checkpoint_dir.display().to_string(),
        ),
    ]);
    // Later entries win: the supervisor hands them to `Command::envs`.
    let spec = Spec {
        lease: l.lease.clone(),
        argv,
        env,
        cwd: l.cwd.clone(),
        user,
        cgroup: l.cgroup.clone(),
        out_log: l.out_log.clone(),
        err_log: l.err_log.clone(),
        out_users_own: l.out_users_own,
        err_users_own: l.err_users_own,
        cap_bytes: l.cap_bytes,
        exit_file: exit_file(&l.lease_dir),
        tty_socket: l.pty.then(|| crate::tty::socket_path(&l.lease_dir)),
        fence: l.fence.clone(),
    };
    // A spent exit file of an earlier start must not be taken for this one's.
    let _ = std::fs::remove_file(&spec.exit_file);
    let mut started = supervisor::start(&l.supervisor, &spec, &supervisor_log(&l.lease_dir))?;
    started.notes = notes;
    Ok(started)
}

/// Where a lease's supervisor writes its own diagnostics.
pub fn supervisor_log(lease_dir: &Path) -> PathBuf {
    lease_dir.join("supervisor.log")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn a_log_dir_can_be_crossed_not_listed_and_a_shared_one_is_left_alone() {
        let root = std::env::temp_dir().join(format!("allot-logdir-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let mode = |p: &Path| std::fs::metadata(p).expect("meta").permissions().mode() & 0o7777;
        let fresh = root.join("a/logs");
        create_log_dir(&fresh).expect("made");
        assert_eq!(mode(&fresh), 0o711);
        // One an older agent made 0755 is tightened at start.
        let old = root.join("old");
        std::fs::create_dir_all(&old).expect("old");
        std::fs::set_permissions(&old, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        create_log_dir(&old).expect("again");
        assert_eq!(mode(&old), 0o711);
        // A shared directory (sticky, as /tmp) is not the agent's to change.
        let shared = root.join("shared");
        std::fs::create_dir_all(&shared).expect("shared");
        std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o1777)).expect("chmod");
        create_log_dir(&shared).expect("shared kept");
        assert_eq!(mode(&shared), 0o1777);
        let _ = std::fs::remove_dir_all(&root);
    }
}
