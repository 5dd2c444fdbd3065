//! Reading the kernel log as it grows (`/dev/kmsg`, or any file) and remembering what
//! was already acted on across agent restarts.
//!
//! `/dev/kmsg` replays the whole ring buffer to a new reader, so an agent that
//! restarts would act again on XIDs that a reset has cured since. [`KmsgMemory`]
//! keeps, per GPU and log, the position its last reset cured, in a small file written
//! atomically on each reset: older records of that GPU are history, newer ones (and
//! every record of a GPU never reset) still count, which is what keeps an uncured
//! fault failed across restarts. A position is the record's sequence number in
//! `/dev/kmsg`, and in a plain file (a copy, a dmesg-style log, `allotd dev`'s fake
//! kernel log) the byte offset of the line's end: lines there carry no sequence
//! number, and without one a cleared fault came back at every restart.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fs::File;
use std::io::{self, Read};
use std::os::fd::AsFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

/// The kernel's boot id file.
pub const BOOT_ID: &str = "/proc/sys/kernel/random/boot_id";
/// The kernel log device.
pub use allot_health::config::KMSG;

/// The current boot's id.
pub fn boot_id() -> io::Result<String> {
    Ok(std::fs::read_to_string(BOOT_ID)?.trim().to_string())
}

/// Which log the positions of a [`KmsgMemory`] belong to: the boot, and for a plain
/// file also the file itself (device and inode), whose offsets mean nothing in
/// another file.
pub fn log_identity(path: &Path, boot: &str) -> String {
    use std::os::unix::fs::MetadataExt;
    match std::fs::metadata(path) {
        Ok(m) if m.is_file() => format!("{boot} file:{}:{}", m.dev(), m.ino()),
        _ => boot.to_string(),
    }
}

/// What was already acted on, across agent restarts: per GPU, the kernel-log sequence
/// number up to which its XIDs were cured by a reset, in this boot.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct KmsgMemory {
    /// The log the positions belong to: the boot id, with the file's device and
    /// inode for a plain file ([`log_identity`]).
    pub boot_id: String,
    /// Bus id → the position (sequence number, or byte offset in a plain file) of
    /// the last record read before its latest reset.
    pub reset_through: BTreeMap<String, u64>,
}

impl KmsgMemory {
    /// Loads from `path`; a missing file is a fresh start, a corrupt one an error
    /// naming the file.
    pub fn load(path: &Path) -> io::Result<KmsgMemory> {
        match std::fs::read_to_string(path) {
            Ok(t) => serde_json::from_str(&t).map_err(|e| {
                io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("{}: {e}; delete the file to start afresh", path.display()),
                )
            }),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(KmsgMemory::default()),
            Err(e) => Err(e),
        }
    }

    /// Saves to `path` atomically (write, fsync, rename).
    pub fn save(&self, path: &Path) -> io::Result<()> {
        use std::io::Write;
        let tmp = path.with_extension("tmp");
        let mut f = File::create(&tmp)?;
        f.write_all(
            serde_json::to_string(self)
                .map_err(io::Error::other)?
                .as_bytes(),
        )?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    }

    /// Forgets other boots (and other files): after a reboot every GPU was reset and
    /// sequence numbers start over.
    pub fn for_boot(&mut self, boot_id: &str) {
        if self.boot_id != boot_id {
            self.boot_id = boot_id.to_string();
            self.reset_through.clear();
        }
    }
}

/// Reads records one line at a time from `/dev/kmsg` (one record per read) or a file.
/// Its lines go through one [`allot_health::kmsg::Assembler`] for the reader's life: some
/// XIDs need the lines before them.
pub struct KmsgReader {
    path: PathBuf,
    file: File,
    buf: Vec<u8>,
    pending: Vec<u8>,
    /// Bytes of the lines returned so far (a plain file's position).
    offset: u64,
}

impl KmsgReader {
    /// Opens `path` (usually [`KMSG`]) without blocking reads.
    pub fn open(path: &Path) -> io::Result<Self> {
        let file = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(nix::fcntl::OFlag::O_NONBLOCK.bits())
            .open(path)?;
        Ok(KmsgReader {
            path: path.to_path_buf(),
            file,
            buf: vec![0; 16 * 1024],
            pending: Vec::new(),
            offset: 0,
        })
    }

    /// Where the last line returned ends, in bytes from the start: a plain file's
    /// position of that line (meaningless for `/dev/kmsg`, whose records have
    /// sequence numbers).
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// Waits up to `timeout` for something to read (returns at once for a file).
    pub fn wait(&self, timeout: std::time::Duration) {
        let ms = u16::try_from(timeout.as_millis()).unwrap_or(u16::MAX);
        let mut fds = [nix::poll::PollFd::new(
            self.file.as_fd(),
            nix::poll::PollFlags::POLLIN,
        )];
        let _ = nix::poll::poll(&mut fds, nix::poll::PollTimeout::from(ms));
    }

    /// The next line, or `None` when nothing more is there for now (end of a file, or
    /// no new kernel record).
    pub fn next_line(&mut self) -> io::Result<Option<String>> {
        loop {
            if let Some(i) = self.pending.iter().position(|&b| b == b'\n') {
                let line: Vec<u8> = self.pending.drain(..=i).collect();
                self.offset += line.len() as u64;
                return Ok(Some(String::from_utf8_lossy(&line[..i]).into_owned()));
            }
            match self.file.read(&mut self.buf) {
                Ok(0) if self.pending.is_empty() => return Ok(None),
                Ok(0) => {
                    let rest = std::mem::take(&mut self.pending);
                    self.offset += rest.len() as u64;
                    return Ok(Some(String::from_utf8_lossy(&rest).into_owned()));
                }
                Ok(n) => self.pending.extend_from_slice(&self.buf[..n]),
                // The ring buffer overran the reader: records were lost; go on.
                Err(e) if e.raw_os_error() == Some(32) => continue,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(None),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    return Err(io::Error::new(
                        e.kind(),
                        format!("reading {}: {e}", self.path.display()),
                    ))
                }
            }
        }
    }
}
