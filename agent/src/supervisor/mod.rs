//! `allot-agent supervise`: one small process per lease, as conmon is per container.
//!
//! The agent starts it (in a session of its own) and sends it a [`Spec`] on stdin;
//! it starts the job in the lease's cgroup as the job's user, answers with the job's
//! identity on one line of stdout ([`Hello`]), then holds the job's output pipes:
//! every byte goes to the log files until the run's cap, then a note and nothing
//! more. When the job's main process exits, whatever else of it is left goes
//! (`cgroup.kill`, or SIGKILL to its process group where no cgroup could be made),
//! and the end ([`Exit`]: code, signal, OOM kills, output cut) is written to the
//! lease's `exit.json` before the supervisor exits. The agent reaps the supervisor
//! and reads that file; an agent restarted meanwhile finds the supervisor still
//! running and the file once it is done, so neither the output nor the exit status
//! depends on the agent being there.

mod terminal;

use crate::fence::Fence;
use crate::procid::ProcId;
use allot_checkpoint_hooks::cgroup::Cgroup;
use allot_checkpoint_hooks::identity::{prepare, Identity, RunAs};
use allot_checkpoint_hooks::{Ladder, Target, DEFAULT_MARKER};
use serde::{Deserialize, Serialize};
use std::io::{Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

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
    /// The supervisor could not start the job, and said why in full.
    #[error("lease {lease}: {why}")]
    Supervisor {
        /// Lease.
        lease: String,
        /// Its words (`cannot start "python": No such file or directory`).
        why: String,
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

impl LaunchError {
    /// Whether the host's file system refused the launch for want of room (ENOSPC, a
    /// quota) or as read-only: the host's fault, not the work's.
    pub fn out_of_room(&self) -> bool {
        let io = match self {
            LaunchError::Io { source, .. } | LaunchError::Spawn { source, .. } => source,
            LaunchError::EmptyCommand(_) | LaunchError::Supervisor { .. } => return false,
        };
        matches!(
            io.raw_os_error().map(nix::errno::Errno::from_raw),
            Some(nix::errno::Errno::ENOSPC | nix::errno::Errno::EDQUOT | nix::errno::Errno::EROFS)
        )
    }
}

/// Where a lease's supervisor writes how it ended.
pub fn exit_file(lease_dir: &Path) -> PathBuf {
    lease_dir.join("exit.json")
}

/// The largest spec the supervisor reads (the environment is capped at 64 KiB).
const MAX_SPEC: u64 = 4 << 20;

/// What the supervisor is to start and where its output goes.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Spec {
    /// Lease id (in messages).
    pub lease: String,
    /// Program and arguments.
    pub argv: Vec<String>,
    /// The job's whole environment.
    pub env: Vec<(String, String)>,
    /// Where it starts; `None`: the supervisor's own directory.
    pub cwd: Option<PathBuf>,
    /// Whom it runs as; `None`: the supervisor's own user.
    pub user: Option<Identity>,
    /// The lease's cgroup, made by the agent; `None`: process groups only.
    pub cgroup: Option<PathBuf>,
    /// Stdout file.
    pub out_log: PathBuf,
    /// Stderr file.
    pub err_log: PathBuf,
    /// Stdout is a file of the user's own: opened as the user, not capped.
    #[serde(default)]
    pub out_users_own: bool,
    /// Stderr is.
    #[serde(default)]
    pub err_users_own: bool,
    /// Bytes of output kept per run (both streams together); the rest is cut.
    pub cap_bytes: u64,
    /// Where the end is written.
    pub exit_file: PathBuf,
    /// A session (`allot run --pty`): the job runs on a terminal this supervisor
    /// holds, and attaches come to this socket; `None`: output pipes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tty_socket: Option<PathBuf>,
    /// The lease's fence ([`crate::fence`]): without word from allotd for its
    /// time, the supervisor runs the lease's ladder itself; `None`: never.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fence: Option<Fence>,
}

/// The supervisor's one line of answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Hello {
    /// The job runs.
    Started {
        /// Its pid (also its session and process group).
        pid: i32,
        /// Its start time in clock ticks since boot.
        start_ticks: u64,
    },
    /// The job could not be started; why.
    Failed(String),
}

/// How a run ended, as its supervisor saw it (`exit.json`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Exit {
    /// Exit status, when it exited by itself.
    pub code: Option<i32>,
    /// The signal that ended it, when one did.
    pub signal: Option<i32>,
    /// Kills by the kernel's OOM killer in its cgroup.
    pub oom_kills: u64,
    /// Its output reached the cap and was cut.
    pub output_cut: bool,
    /// Bytes of output kept.
    pub output_bytes: u64,
    /// Processes of the job still in its cgroup after `cgroup.kill` and its wait
    /// (stuck in the kernel, as on a hung GPU or file system).
    pub survivors: u32,
    /// Set when the supervisor could not tell (it was killed, its file is unreadable).
    pub lost: Option<String>,
    /// Set when the supervisor stopped the job by its fence: why.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fenced: Option<String>,
}

impl Exit {
    /// An end nobody saw.
    pub fn lost(why: impl Into<String>) -> Exit {
        Exit {
            lost: Some(why.into()),
            ..Exit::default()
        }
    }

    /// The end in words, for `allot status` and the event log: "exit code 3",
    /// "killed by SIGKILL", "killed by the kernel's OOM killer", and a cut output.
    pub fn detail(&self) -> String {
        let kills = format!(
            "{} kill{} in its cgroup",
            self.oom_kills,
            if self.oom_kills == 1 { "" } else { "s" }
        );
        let mut s = match (self.code, self.signal) {
            (None, Some(9)) if self.oom_kills > 0 => {
                format!("killed by the kernel's OOM killer ({kills})")
            }
            // A child was the one killed: the job's own end says the rest.
            (Some(c), _) if self.oom_kills > 0 => {
                format!("exit code {c} after the kernel's OOM killer struck ({kills})")
            }
            (Some(c), _) => format!("exit code {c}"),
            (None, Some(sig)) => format!(
                "killed by {}",
                nix::sys::signal::Signal::try_from(sig)
                    .map_or_else(|_| format!("signal {sig}"), |s| s.as_str().to_string())
            ),
            (None, None) => match &self.lost {
                Some(why) => format!("end not seen: {why}"),
                None => "end not seen".into(),
            },
        };
        if let Some(why) = &self.fenced {
            s.push_str(&format!("; {why}"));
        }
        if self.output_cut {
            s.push_str(&format!(
                "; output cut at {} bytes ([agent] max_output_bytes)",
                self.output_bytes
            ));
        }
        if self.survivors > 0 {
            s.push_str(&format!(
                "; {} of its processes outlived cgroup.kill (stuck in the kernel?)",
                self.survivors
            ));
        }
        s
    }
}

/// Reads a supervisor's `exit.json`.
pub fn read_exit(path: &Path) -> Option<Exit> {
    let text = std::fs::read(path).ok()?;
    serde_json::from_slice(&text).ok()
}

/// What the agent holds of a started job.
#[derive(Debug)]
pub struct Started {
    /// The job's identity.
    pub job: ProcId,
    /// The supervisor (the agent's child, to reap).
    pub supervisor: Child,
    /// The supervisor's identity, for an agent that restarts.
    pub supervisor_id: ProcId,
    /// What the user should know of the start (limits not applied, and why).
    pub notes: Vec<String>,
}

/// What a supervisor is called in `ps`: `allot-supervise lease A-7 (workload 7)`.
pub fn process_title(spec: &Spec) -> String {
    let workload = spec
        .env
        .iter()
        .find(|(k, _)| k == "ALLOT_WORKLOAD_ID")
        .map(|(_, v)| format!(" (workload {v})"))
        .unwrap_or_default();
    format!("{TITLE} lease {}{workload}", spec.lease)
}

/// The start of every supervisor's `argv[0]`, and its thread name (15 bytes, the
/// kernel's limit): how `allot-agent` knows it is to supervise.
pub const TITLE: &str = "allot-supervise";

/// Starts a supervisor (`allot-supervise …`) for `spec`; its own diagnostics go to
/// `diag` (appended). Returns once the job runs or could not be started.
pub fn start(program: &Path, spec: &Spec, diag: &Path) -> Result<Started, LaunchError> {
    let io = |path: &Path, source: std::io::Error| LaunchError::Io {
        lease: spec.lease.clone(),
        path: path.display().to_string(),
        source,
    };
    let diag_file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .custom_flags(nix::libc::O_NOFOLLOW)
        .open(diag)
        .map_err(|e| io(diag, e))?;
    use std::os::unix::process::CommandExt;
    let mut child = Command::new(program)
        // What `ps` shows: which lease it holds, and whose; the name also tells
        // `main` to supervise.
        .arg0(process_title(spec))
        .env_clear()
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(diag_file)
        // Apart from the agent's group: a Ctrl-C to a foreground agent, or its
        // stop, is not the job's end.
        .process_group(0)
        .spawn()
        .map_err(|source| LaunchError::Spawn {
            lease: spec.lease.clone(),
            program: program.display().to_string(),
            source,
        })?;
    let spawn_err = |why: String| LaunchError::Supervisor {
        lease: spec.lease.clone(),
        why,
    };
    let sup_pid = i32::try_from(child.id()).unwrap_or(0);
    let supervisor_id = crate::procid::identity(sup_pid).unwrap_or(ProcId {
        pid: sup_pid,
        start_ticks: 0,
    });
    let body = serde_json::to_vec(spec).map_err(|e| spawn_err(e.to_string()))?;
    if let Some(mut stdin) = child.stdin.take() {
        if let Err(e) = stdin.write_all(&body) {
            let _ = child.kill();
            let _ = child.wait();
            return Err(spawn_err(format!(
                "cannot hand the job to its supervisor: {e}"
            )));
        }
    }
    let read = match child.stdout.take() {
        Some(mut out) => read_hello(&mut out),
        None => Err("no pipe from the supervisor".into()),
    };
    let hello = match read {
        Ok(line) => serde_json::from_str::<Hello>(line.trim()).map_err(|e| {
            format!(
                "the supervisor said {:?} ({e}); see {}",
                line.trim(),
                diag.display()
            )
        }),
        Err(why) => {
            // Whatever it is stuck on (a dead file system under the job's working
            // directory), neither it nor the half-started job may linger.
            let _ = nix::sys::signal::killpg(
                nix::unistd::Pid::from_raw(sup_pid),
                nix::sys::signal::Signal::SIGKILL,
            );
            Err(format!("{why}; see {}", diag.display()))
        }
    };
    match hello {
        Ok(Hello::Started { pid, start_ticks }) => Ok(Started {
            job: ProcId { pid, start_ticks },
            supervisor: child,
            supervisor_id,
            notes: Vec::new(),
        }),
        Ok(Hello::Failed(why)) | Err(why) => {
            let _ = child.wait();
            Err(spawn_err(why))
        }
    }
}

/// How long a supervisor may take to say whether the job runs: a working directory
/// on a dead file system must not hang the agent.
const HELLO_WAIT: Duration = Duration::from_secs(30);

/// The supervisor's one line, within [`HELLO_WAIT`].
fn read_hello(out: &mut std::process::ChildStdout) -> Result<String, String> {
    use nix::poll::{poll, PollFd, PollFlags};
    use std::os::fd::AsFd;
    let deadline = Instant::now() + HELLO_WAIT;
    let mut line = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(format!(
                "the supervisor did not say within {}s whether the job runs (a hung working directory or file system?)",
                HELLO_WAIT.as_secs()
            ));
        }
        let ms = u16::try_from(left.as_millis()).unwrap_or(u16::MAX);
        let mut fds = [PollFd::new(out.as_fd(), PollFlags::POLLIN)];
        match poll(&mut fds, ms) {
            Ok(0) | Err(nix::errno::Errno::EINTR) => continue,
            Ok(_) => {}
            Err(e) => return Err(format!("cannot wait for the supervisor: {e}")),
        }
        let n = match out.read(&mut buf) {
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(format!("cannot read the supervisor's answer: {e}")),
        };
        if n == 0 {
            return Err("the supervisor ended without an answer".into());
        }
        line.extend_from_slice(&buf[..n]);
        if let Some(end) = line.iter().position(|b| *b == b'\n') {
            return Ok(String::from_utf8_lossy(&line[..end]).into_owned());
        }
        if line.len() > 64 << 10 {
            return Err("the supervisor's answer is over 64 KiB".into());
        }
    }
}

/// `allot-agent supervise`: runs one job (see the module docs). Its exit status is
/// 0 once `exit.json` is written, 2 when the spec was unusable.
pub fn main() -> std::process::ExitCode {
    // `top` and `ps -o comm` show the thread name, not argv[0].
    let _ = nix::sys::prctl::set_name(c"allot-supervise");
    let mut body = Vec::new();
    let spec: Spec = match std::io::stdin()
        .take(MAX_SPEC)
        .read_to_end(&mut body)
        .map_err(|e| e.to_string())
        .and_then(|_| serde_json::from_slice(&body).map_err(|e| e.to_string()))
    {
        Ok(s) => s,
        Err(e) => {
            hello(&Hello::Failed(format!("unusable supervisor spec: {e}")));
            return std::process::ExitCode::from(2);
        }
    };
    let job = match spawn_job(&spec) {
        Ok(j) => j,
        Err(why) => {
            if let Some(socket) = &spec.tty_socket {
                let _ = std::fs::remove_file(socket);
            }
            hello(&Hello::Failed(why));
            return std::process::ExitCode::from(2);
        }
    };
    let pid = i32::try_from(job.child.id()).unwrap_or(0);
    let start_ticks = allot_checkpoint_hooks::proc_stat(pid).map_or(0, |s| s.start_ticks);
    hello(&Hello::Started { pid, start_ticks });
    shield();
    // From here on nothing is written to stdout: the agent may be gone.
    if let Ok(null) = std::fs::OpenOptions::new().write(true).open("/dev/null") {
        let _ = nix::unistd::dup2_stdout(&null);
    }
    let exit = supervise(&spec, job);
    if let Err(e) = write_exit(&spec.exit_file, &exit) {
        eprintln!(
            "allot supervise {}: cannot write {}: {e}",
            spec.lease,
            spec.exit_file.display()
        );
    }
    std::process::ExitCode::SUCCESS
}

/// Once the job runs (it keeps its own signal mask and OOM score): the supervisor
/// holds the job's output pipes, so its death would kill the job on its next write.
/// A stray SIGTERM, SIGHUP or SIGINT (`systemctl kill`, a closed terminal) stays
/// pending, and the kernel's OOM killer picks the job before its supervisor.
fn shield() {
    use nix::sys::signal::{SigSet, Signal};
    let mut set = SigSet::empty();
    for s in [Signal::SIGTERM, Signal::SIGHUP, Signal::SIGINT] {
        set.add(s);
    }
    // Before the pump threads start, so they inherit the mask.
    if let Err(e) = set.thread_block() {
        eprintln!("allot supervise: cannot block SIGTERM/SIGHUP/SIGINT: {e}");
    }
    // Needs CAP_SYS_RESOURCE (the agent's unit has it); best effort elsewhere.
    let _ = std::fs::write("/proc/self/oom_score_adj", "-1000");
}

fn hello(h: &Hello) {
    let mut out = std::io::stdout().lock();
    let _ = serde_json::to_writer(&mut out, h);
    let _ = out.write_all(b"\n");
    let _ = out.flush();
}

/// Written whole or not at all: a reader never sees half a file.
fn write_exit(path: &Path, exit: &Exit) -> std::io::Result<()> {
    let tmp = path.with_extension("json.tmp");
    std::fs::write(
        &tmp,
        serde_json::to_vec(exit).map_err(std::io::Error::other)?,
    )?;
    std::fs::rename(&tmp, path)
}

/// Opens a log file in the agent's log dir for appending, for the job's user: made
/// new and given to the user, or, when it exists (a rerun, a pattern naming one
/// file for every run), only if it is already that user's and has no other name.
/// So a pattern can never open another user's output, or a file of the agent's.
/// A file of the user's own (`--output /shared/me/%j.out`): opened as the job's
/// user, so the file system decides as it would for them, as `sbatch -o` does;
/// never by root. The supervisor is one thread here, so its file-system identity
/// is switched for the one open and switched back.
fn open_as_user(spec: &Spec, path: &Path) -> Result<std::fs::File, String> {
    use nix::unistd::{getgroups, setfsgid, setfsuid, setgroups, Gid, Uid};
    let open = || {
        std::fs::OpenOptions::new()
            .append(true)
            .create(true)
            .mode(0o644)
            .custom_flags(nix::libc::O_CLOEXEC)
            .open(path)
    };
    let said = |e: std::io::Error, who: &str| {
        format!(
            "cannot open the output {} as {who}: {e}; give --output/--error a path that user can write (its directory must exist)",
            path.display()
        )
    };
    let Some(id) = &spec.user else {
        return open().map_err(|e| said(e, "the agent's user"));
    };
    // `setgroups` changes the whole process's groups: safe only because the
    // supervisor has one thread.
    let before = getgroups().map_err(|e| format!("getgroups: {e}"))?;
    let groups: Vec<Gid> = id.groups.iter().map(|g| Gid::from_raw(*g)).collect();
    setgroups(&groups).map_err(|e| format!("setgroups: {e}"))?;
    let old_gid = setfsgid(Gid::from_raw(id.gid));
    let old_uid = setfsuid(Uid::from_raw(id.uid));
    let opened = open();
    setfsuid(old_uid);
    setfsgid(old_gid);
    let _ = setgroups(&before);
    opened.map_err(|e| said(e, &format!("uid {}", id.uid)))
}

fn open_log(spec: &Spec, path: &Path) -> Result<std::fs::File, String> {
    use std::os::unix::fs::MetadataExt;
    let owner = spec
        .user
        .as_ref()
        .map_or_else(|| nix::unistd::geteuid().as_raw(), |id| id.uid);
    let open = |new: bool| {
        std::fs::OpenOptions::new()
            .append(true)
            .create_new(new)
            .mode(0o640)
            // A link in the last place is never followed (the directories above
            // are the agent's own).
            .custom_flags(nix::libc::O_NOFOLLOW | nix::libc::O_CLOEXEC)
            .open(path)
    };
    let shown = |e: std::io::Error| format!("cannot open the log {}: {e}", path.display());
    match open(true) {
        Ok(f) => {
            if let Some(id) = &spec.user {
                std::os::unix::fs::fchown(&f, Some(id.uid), Some(id.gid)).map_err(shown)?;
            }
            Ok(f)
        }
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            let f = open(false).map_err(shown)?;
            let m = f.metadata().map_err(shown)?;
            if m.uid() != owner || m.nlink() != 1 || !m.is_file() {
                return Err(format!(
                    "the log {} exists and is not this job's user's own file (uid {}, {} link(s)); give --output/--error a name of your own",
                    path.display(),
                    m.uid(),
                    m.nlink()
                ));
            }
            Ok(f)
        }
        Err(e) => Err(shown(e)),
    }
}

type Pipes = (std::process::ChildStdout, std::process::ChildStderr);

/// The started job: its process, its log files, and its terminal when it has one.
struct Job {
    child: Child,
    out: std::fs::File,
    err: std::fs::File,
    terminal: Option<Arc<terminal::Terminal>>,
}

fn spawn_job(spec: &Spec) -> Result<Job, String> {
    let (program, args) = spec
        .argv
        .split_first()
        .ok_or_else(|| "empty command".to_string())?;
    let out = if spec.out_users_own {
        open_as_user(spec, &spec.out_log)?
    } else {
        open_log(spec, &spec.out_log)?
    };
    let err = if spec.err_users_own {
        open_as_user(spec, &spec.err_log)?
    } else {
        open_log(spec, &spec.err_log)?
    };
    let mut cmd = Command::new(program);
    // The cgroup is joined first, while still root: after the switch the user could
    // not write to cgroup.procs. Opened here, as nothing may be opened after fork.
    if let Some(dir) = &spec.cgroup {
        let procs = Cgroup::at(dir)
            .procs_file()
            .map_err(|e| format!("cannot join the lease's cgroup {}: {e}", dir.display()))?;
        // SAFETY: between fork and exec only the write(2) system call runs, on a
        // descriptor opened before the fork, from a buffer that needs no allocation.
        #[allow(unsafe_code)]
        unsafe {
            use std::os::fd::AsRawFd;
            use std::os::unix::process::CommandExt;
            let fd = procs.as_raw_fd();
            cmd.pre_exec(move || {
                // Kept alive by the closure until the child has written.
                let _keep = &procs;
                if nix::libc::write(fd, b"0".as_ptr().cast(), 1) != 1 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
    }
    let run_as = match &spec.user {
        Some(id) => RunAs::User(id.clone()),
        None => RunAs::Agent,
    };
    prepare(&mut cmd, &run_as, true)?;
    if let Some(dir) = &spec.cwd {
        cmd.current_dir(dir);
    }
    cmd.args(args)
        .env_clear()
        .envs(spec.env.iter().map(|(k, v)| (k.as_str(), v.as_str())));
    let terminal = match &spec.tty_socket {
        Some(socket) => {
            let t = Arc::new(terminal::Terminal::open()?);
            if let Some(id) = &spec.user {
                t.give_to(id.uid, id.gid);
            }
            let side = |what| {
                t.job_side()
                    .map(Stdio::from)
                    .map_err(|e| format!("cannot give the job its terminal ({what}): {e}"))
            };
            cmd.stdin(side("stdin")?)
                .stdout(side("stdout")?)
                .stderr(side("stderr")?);
            // SAFETY: between fork and exec only the ioctl(2) system call runs, on
            // the child's stdin (the terminal, put there before pre_exec closures
            // run), after `prepare`'s setsid made the child a session leader.
            #[allow(unsafe_code)]
            unsafe {
                use std::os::unix::process::CommandExt;
                cmd.pre_exec(|| {
                    if nix::libc::ioctl(0, nix::libc::TIOCSCTTY, 0) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    Ok(())
                });
            }
            t.listen(socket)?;
            Some(t)
        }
        None => {
            cmd.stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped());
            None
        }
    };
    let child = cmd
        .spawn()
        .map_err(|e| format!("cannot start {program:?}: {e}"))?;
    Ok(Job {
        child,
        out,
        err,
        terminal,
    })
}

/// The cut: bytes kept so far over both streams, and whether the note was written.
struct Cap {
    limit: u64,
    kept: AtomicU64,
    cut: AtomicBool,
}

impl Cap {
    /// Writes what the cap keeps of `data` to `to`, and the note where it cuts.
    fn write(&self, to: &mut impl Write, data: &[u8]) {
        let (keep, over) = self.take(data.len() as u64);
        let keep = usize::try_from(keep).unwrap_or(data.len());
        if keep > 0 {
            let _ = to.write_all(&data[..keep]);
        }
        if over {
            let _ = to.write_all(
                format!(
                    "\n[allot: output cut at {} bytes ([agent] max_output_bytes); the rest of this run's output was discarded]\n",
                    self.limit
                )
                .as_bytes(),
            );
        }
    }

    /// How much of `n` more bytes may be kept; the first caller over the limit also
    /// gets `true` (it writes the note).
    fn take(&self, n: u64) -> (u64, bool) {
        let mut now = self.kept.load(Ordering::Relaxed);
        loop {
            let room = self.limit.saturating_sub(now);
            let keep = n.min(room);
            match self
                .kept
                .compare_exchange(now, now + keep, Ordering::Relaxed, Ordering::Relaxed)
            {
                Ok(_) => {
                    let over = keep < n && !self.cut.swap(true, Ordering::Relaxed);
                    return (keep, over);
                }
                Err(seen) => now = seen,
            }
        }
    }
}

/// Copies `from` into `to` under the cap; reads on to the end either way, so the
/// job never blocks on a full pipe or dies of a broken one.
fn pump(mut from: impl Read, mut to: std::fs::File, cap: &Cap) {
    let mut buf = vec![0u8; 64 << 10];
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) => return,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => return,
        };
        cap.write(&mut to, &buf[..n]);
    }
}

/// Watches the host's last word from allotd while the job runs; once it is older
/// than the fence, runs the lease's ladder on the job (hook, SIGTERM, SIGKILL, as
/// the agent would for a revocation) and says why in the cell it returns. Nothing
/// here needs the agent: it may be stopped, dead or cut off with the host.
fn watch_fence(spec: &Spec, f: &Fence, pid: i32) -> Arc<OnceLock<String>> {
    let cell = Arc::new(OnceLock::new());
    let started = crate::fence::boot_ms();
    let target = Target {
        lease: spec.lease.clone(),
        pgid: pid,
        cgroup: spec.cgroup.clone(),
        checkpoint_dir: f.checkpoint_dir.clone(),
        env: spec.env.clone(),
        run_as: spec.user.clone().map_or(RunAs::Agent, RunAs::User),
    };
    let ladder = Ladder {
        hook: f.hook.parse().ok(),
        grace: Duration::from_secs(f.grace_s),
        term_grace: Duration::from_secs(f.term_grace_s),
        marker: DEFAULT_MARKER.into(),
        hook_hosts: f.hook_hosts.clone(),
    };
    let (f, said) = (f.clone(), cell.clone());
    std::thread::spawn(move || loop {
        std::thread::sleep(Duration::from_millis(f.check_ms()));
        if f.due(
            crate::fence::read(&f.contact),
            started,
            crate::fence::boot_ms(),
        ) {
            let _ = said.set(f.reason());
            eprintln!("allot supervise {}: {}", target.lease, f.reason());
            let _ = allot_checkpoint_hooks::run(&target, &ladder);
            return;
        }
    });
    cell
}

fn supervise(spec: &Spec, job: Job) -> Exit {
    let Job {
        child: mut job,
        out,
        err,
        terminal,
    } = job;
    let cap = Arc::new(Cap {
        limit: spec.cap_bytes,
        kept: AtomicU64::new(0),
        cut: AtomicBool::new(false),
    });
    let pipes: Option<Pipes> = job.stdout.take().zip(job.stderr.take());
    // Each pump says when its stream has ended.
    let (done_tx, done) = std::sync::mpsc::channel::<()>();
    let mut pumps = 0;
    // A session's terminal is read until the job is over and it falls quiet (the
    // supervisor holds its far side too, so it never reads the end by itself).
    let quiet = Arc::new(AtomicBool::new(false));
    if let Some(t) = &terminal {
        let (t, cap, quiet, done_tx) = (t.clone(), cap.clone(), quiet.clone(), done_tx.clone());
        std::thread::spawn(move || {
            t.pump(out, &cap, &quiet);
            let _ = done_tx.send(());
        });
        pumps += 1;
        drop(err);
    } else if let Some((o, e)) = pipes {
        // The cap keeps the node's disk: a user's own file is theirs to fill.
        let uncapped = Arc::new(Cap {
            limit: u64::MAX,
            kept: AtomicU64::new(0),
            cut: AtomicBool::new(false),
        });
        for (from, to, own) in [
            (Box::new(o) as Box<dyn Read + Send>, out, spec.out_users_own),
            (Box::new(e) as Box<dyn Read + Send>, err, spec.err_users_own),
        ] {
            let cap = Arc::clone(if own { &uncapped } else { &cap });
            let done_tx = done_tx.clone();
            std::thread::spawn(move || {
                pump(from, to, &cap);
                let _ = done_tx.send(());
            });
            pumps += 1;
        }
    }
    let pid = i32::try_from(job.id()).unwrap_or(0);
    let fenced = spec.fence.as_ref().map(|f| watch_fence(spec, f, pid));
    let status = job.wait();
    // The job's main process is its lease: whatever it left behind goes with it.
    let cgroup = spec.cgroup.as_ref().map(Cgroup::at);
    let mut survivors = 0;
    match &cgroup {
        Some(cg) if !cg.kill() => {
            survivors = u32::try_from(cg.procs().len()).unwrap_or(u32::MAX);
            eprintln!(
                "allot supervise {}: {survivors} process(es) left in {} after cgroup.kill",
                spec.lease,
                cg.path().display()
            );
        }
        Some(_) => {}
        None if pid > 0 => {
            let _ = nix::sys::signal::killpg(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
        None => {}
    }
    quiet.store(true, Ordering::Release);
    // Without a cgroup a process that left the group may hold a pipe open for ever:
    // the output it writes later is not waited for.
    let deadline = Instant::now() + Duration::from_secs(2);
    for _ in 0..pumps {
        let left = deadline.saturating_duration_since(Instant::now());
        if done.recv_timeout(left).is_err() {
            break;
        }
    }
    use std::os::unix::process::ExitStatusExt;
    let (code, signal) = match status {
        Ok(s) => (s.code(), s.signal()),
        Err(_) => (None, None),
    };
    if let Some(t) = &terminal {
        if let Some(socket) = &spec.tty_socket {
            let _ = std::fs::remove_file(socket);
        }
        t.ended(crate::tty::Ended { code, signal });
    }
    let exit = Exit {
        code,
        signal,
        oom_kills: cgroup.as_ref().and_then(Cgroup::oom_kills).unwrap_or(0),
        output_cut: cap.cut.load(Ordering::Relaxed),
        output_bytes: cap.kept.load(Ordering::Relaxed),
        survivors,
        lost: None,
        fenced: fenced.and_then(|f| f.get().cloned()),
    };
    // Counted: the lease's cgroup has nothing more to say (one the kill could not
    // empty stays for the agent's sweep).
    if let Some(cg) = &cgroup {
        let _ = cg.remove();
    }
    exit
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cap_keeps_exactly_its_bytes_and_one_note() {
        let cap = Cap {
            limit: 10,
            kept: AtomicU64::new(0),
            cut: AtomicBool::new(false),
        };
        assert_eq!(cap.take(4), (4, false));
        assert_eq!(cap.take(8), (6, true));
        assert_eq!(cap.take(8), (0, false));
        assert_eq!(cap.kept.load(Ordering::Relaxed), 10);
    }

    #[test]
    fn an_end_says_what_ended_it() {
        let e = |code, signal, oom| Exit {
            code,
            signal,
            oom_kills: oom,
            ..Exit::default()
        };
        assert_eq!(e(Some(3), None, 0).detail(), "exit code 3");
        assert_eq!(e(None, Some(9), 0).detail(), "killed by SIGKILL");
        assert_eq!(
            e(None, Some(9), 1).detail(),
            "killed by the kernel's OOM killer (1 kill in its cgroup)"
        );
        assert_eq!(
            e(Some(0), None, 2).detail(),
            "exit code 0 after the kernel's OOM killer struck (2 kills in its cgroup)"
        );
        let cut = Exit {
            output_cut: true,
            output_bytes: 1024,
            ..e(Some(0), None, 0)
        };
        assert_eq!(
            cut.detail(),
            "exit code 0; output cut at 1024 bytes ([agent] max_output_bytes)"
        );
        assert_eq!(
            Exit::lost("the supervisor was killed").detail(),
            "end not seen: the supervisor was killed"
        );
        let back: Exit =
            serde_json::from_str(&serde_json::to_string(&cut).expect("json")).expect("reads back");
        assert_eq!(back, cut);
    }
}
