//! Reading a lease's output for `allot logs`: allotd asks over this host's session
//! (`ReadLog`, answered by `LogChunk`), and a user on the host through the local
//! socket (`allot lease logs`). A file is found by the lease's id in the lease table
//! ([`crate::host::Host::log_source`], [`crate::lease::LeaseRecord::log_path`]),
//! never by a path from a request, so no request can make the agent read anything
//! else.

use crate::lease::{LogSource, LogStream};
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

/// Most bytes one read returns, whatever is asked: a chunk stays far below the
/// 4 MiB message cap of every hop.
pub const MAX_CHUNK: u32 = 1 << 20;

/// Expands an `--output`/`--error` pattern: `%j` the workload, `%r` the run, `%n`
/// the node rank, `%u` the user, `%%` a `%` (allotd checked the pattern; anything
/// else stays as it is).
pub fn expand(pattern: &str, user: &str, workload: &str, run: u32, rank: u32) -> String {
    allot_common::fields::expand_pattern(pattern, |e| match e {
        'j' => Some(workload.to_string()),
        'r' => Some(run.to_string()),
        'n' => Some(rank.to_string()),
        'u' => Some(user.to_string()),
        '%' => Some("%".into()),
        _ => None,
    })
}

/// Whether an `--output`/`--error` pattern names a file of the job's user's own:
/// absolute, or `./…` relative to the job's directory. Such a file is opened as
/// that user (never by root), as `sbatch -o` does, and is not capped; any other
/// name is in the node's log directory.
pub fn users_own(pattern: &str) -> bool {
    pattern.starts_with('/') || pattern.starts_with("./")
}

/// Where a run's `stream` goes: a file of the user's own ([`users_own`]: the
/// expanded pattern, relative ones under `cwd`), or under the log dir, in the directory of the job's
/// user, the submission's pattern, or `<workload>/<run>.<rank>.out|err`. Each user's
/// names are their own, so no one can take a name another user's job will write
/// (workload ids are sequential). A pattern climbing out (`..`, absolute) is refused
/// by allotd; here it is kept inside the user's directory all the same.
#[allow(clippy::too_many_arguments)]
pub fn log_file(
    log_dir: &Path,
    user: &str,
    pattern: &str,
    workload: &str,
    run: u32,
    rank: u32,
    stream: LogStream,
    cwd: &Path,
) -> PathBuf {
    if users_own(pattern) {
        return cwd.join(expand(pattern, user, workload, run, rank));
    }
    let name = if pattern.is_empty() {
        format!("{}/{run}.{rank}.{}", workload, stream.ext())
    } else {
        expand(pattern, user, workload, run, rank)
    };
    let inside = |s: &str| -> PathBuf {
        Path::new(s)
            .components()
            .filter(|c| matches!(c, std::path::Component::Normal(_)))
            .collect()
    };
    log_dir.join(inside(user)).join(inside(&name))
}

/// Up to `max` bytes of `path` from `offset` (at most [`MAX_CHUNK`]), and whether
/// the read reached the end of the file as it was then.
pub fn read_at(path: &Path, offset: u64, max: u32) -> std::io::Result<(Vec<u8>, bool)> {
    read_from(std::fs::File::open(path)?, offset, max)
}

/// Opens a lease's output. A file on a path of the user's own (`--output /…`) may
/// since have been replaced by its user with a link to a file only root may read,
/// or a FIFO that never answers: it is opened without following a last link,
/// without blocking, and read only if it is a regular file its user owns, so the
/// user gets back nothing they did not write. (No identity switch: the agent's
/// threads share one group list.) Files in the agent's own log dir sit in root's
/// directories, which nobody else writes.
fn open_as_owner(src: &LogSource) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
    if !src.users_own {
        return std::fs::File::open(&src.path);
    }
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(nix::libc::O_NOFOLLOW | nix::libc::O_NONBLOCK | nix::libc::O_CLOEXEC)
        .open(&src.path)?;
    let m = f.metadata()?;
    let owner = owner_uid(&src.user);
    if !m.file_type().is_file() || owner != Some(m.uid()) {
        return Err(std::io::Error::new(
            std::io::ErrorKind::PermissionDenied,
            format!(
                "it is no longer a file of {}'s own (replaced since the job wrote it?); read it on the host as that user",
                src.user
            ),
        ));
    }
    Ok(f)
}

/// The uid of a lease's user: its name on this host, or the bare uid a user with
/// no account ran as.
fn owner_uid(user: &str) -> Option<u32> {
    match nix::unistd::User::from_name(user).ok().flatten() {
        Some(u) => Some(u.uid.as_raw()),
        None => user.parse().ok(),
    }
}

fn read_from(mut f: std::fs::File, offset: u64, max: u32) -> std::io::Result<(Vec<u8>, bool)> {
    let len = f.metadata()?.len();
    if offset >= len {
        return Ok((Vec::new(), true));
    }
    f.seek(SeekFrom::Start(offset))?;
    let want = u64::from(max.clamp(1, MAX_CHUNK)).min(len - offset);
    let mut data = Vec::with_capacity(want as usize);
    f.take(want).read_to_end(&mut data)?;
    let eof = offset + data.len() as u64 >= len;
    Ok((data, eof))
}

/// One read of lease `lease`'s `stream` as `src` (what the host holds of it, if
/// anything) locates it. The lease's liveness is taken before the read, so an
/// answer that says "ended" and "end of file" holds everything it wrote.
pub fn read_source(
    lease: &str,
    stream: LogStream,
    src: Option<LogSource>,
    offset: u64,
    max: u32,
) -> Result<(Vec<u8>, bool, bool), String> {
    let name = match stream {
        LogStream::Stdout => "stdout",
        LogStream::Stderr => "stderr",
    };
    let Some(src) = src else {
        return Err(format!("this host holds no lease {lease}"));
    };
    if src.adopted {
        return Err(format!(
            "lease {lease} adopted a process the agent did not start: its output was never captured"
        ));
    }
    match open_as_owner(&src).and_then(|f| read_from(f, offset, max)) {
        Ok((data, eof)) => Ok((data, eof, src.live)),
        // Not written yet (a lease that just started): nothing so far.
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && src.live => {
            Ok((Vec::new(), true, true))
        }
        Err(e) => Err(format!(
            "lease {lease}'s {name} ({}) cannot be read: {e}",
            src.path.display()
        )),
    }
}

/// One read for allotd's `ReadLog`: only leases allotd placed are read for it.
/// `locate` asks the host where the lease's output is (after the id is checked).
pub fn for_allotd(
    lease: &str,
    stream: LogStream,
    locate: impl FnOnce() -> Result<Option<LogSource>, String>,
    offset: u64,
    max: u32,
) -> Result<(Vec<u8>, bool, bool), String> {
    if !crate::lease::from_allocator_id(lease) {
        return Err(format!(
            "{lease:?} is not a lease allotd placed; only those are read for it"
        ));
    }
    let src = locate()?;
    read_source(lease, stream, src, offset, max)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_expand_and_stay_in_the_users_own_directory() {
        assert_eq!(
            expand("t-%j.%r.%n-%u-100%%", "ann", "w7", 2, 1),
            "t-w7.2.1-ann-100%"
        );
        let d = Path::new("/logs");
        let cwd = Path::new("/home/ann/golf");
        let f = |user: &str, pattern: &str, w: &str, run: u32, rank: u32, s: LogStream| {
            log_file(d, user, pattern, w, run, rank, s, cwd)
        };
        assert_eq!(
            f("ann", "", "w7", 2, 1, LogStream::Stderr),
            Path::new("/logs/ann/w7/2.1.err")
        );
        assert_eq!(
            f("ann", "run-%j/%n.out", "w7", 2, 1, LogStream::Stdout),
            Path::new("/logs/ann/run-w7/1.out")
        );
        assert_eq!(
            f("ann", "etc/../../x", "w", 1, 0, LogStream::Stdout),
            Path::new("/logs/ann/etc/x")
        );
        // The user's own files: absolute, or under the job's directory.
        assert_eq!(
            f(
                "ann",
                "/home/ann/logs/%j.out",
                "w7",
                1,
                0,
                LogStream::Stdout
            ),
            Path::new("/home/ann/logs/w7.out")
        );
        assert_eq!(
            f("ann", "./out-%n.log", "w7", 1, 3, LogStream::Stdout),
            Path::new("/home/ann/golf/./out-3.log")
        );
        // Another user's default name, asked for by bob: his own directory's.
        assert_eq!(
            f("bob", "12/1.0.out", "5", 1, 0, LogStream::Stdout),
            Path::new("/logs/bob/12/1.0.out")
        );
        assert_ne!(
            f("bob", "12/1.0.out", "5", 1, 0, LogStream::Stdout),
            f("ann", "", "12", 1, 0, LogStream::Stdout)
        );
    }

    fn tmp(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("allot-logs-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).expect("dir");
        d
    }

    #[test]
    fn reads_follow_the_offset_and_say_when_the_end_is_reached() {
        let d = tmp("offsets");
        let f = d.join("A-1.out");
        std::fs::write(&f, b"hello world").expect("write");
        assert_eq!(read_at(&f, 0, 5).expect("read"), (b"hello".to_vec(), false));
        assert_eq!(
            read_at(&f, 5, 100).expect("read"),
            (b" world".to_vec(), true)
        );
        assert_eq!(read_at(&f, 11, 100).expect("read"), (Vec::new(), true));
        assert_eq!(read_at(&f, 99, 100).expect("read"), (Vec::new(), true));
    }

    #[test]
    fn a_chunk_is_at_most_one_mebibyte_whatever_is_asked() {
        let d = tmp("cap");
        let f = d.join("A-1.out");
        std::fs::write(&f, vec![b'x'; MAX_CHUNK as usize + 10]).expect("write");
        let (data, eof) = read_at(&f, 0, u32::MAX).expect("read");
        assert_eq!(data.len(), MAX_CHUNK as usize);
        assert!(!eof);
    }

    #[test]
    fn unknown_adopted_and_missing_files_are_told_apart() {
        let d = tmp("kinds");
        let src = |live, adopted| LogSource {
            path: d.join("none.out"),
            live,
            adopted,
            user: "u".into(),
            users_own: false,
        };
        let e = read_source("A-3", LogStream::Stdout, None, 0, 10).expect_err("unknown");
        assert!(e.contains("holds no lease A-3"), "{e}");
        let e = read_source("A-3", LogStream::Stdout, Some(src(true, true)), 0, 10)
            .expect_err("adopted");
        assert!(e.contains("never captured"), "{e}");
        // Live and not written yet: nothing so far, more to come.
        let r = read_source("A-3", LogStream::Stdout, Some(src(true, false)), 0, 10);
        assert_eq!(r, Ok((Vec::new(), true, true)));
        let e = read_source("A-3", LogStream::Stderr, Some(src(false, false)), 0, 10)
            .expect_err("ended without a file");
        assert!(e.contains("stderr") && e.contains("none.out"), "{e}");
    }
}
