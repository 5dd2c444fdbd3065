//! Reading the kernel log as it grows (`/dev/kmsg`, or any file) and remembering what
//! was already acted on across agent restarts.
//!
//! `/dev/kmsg` replays the whole ring buffer to a new reader, so an agent that
//! restarts would drain a GPU again for an XID it already handled (and that a reset
//! may have cured since). [`Seen`] keeps the boot id and the last kmsg sequence number
//! acted on, in a small file written atomically: records at or below it, in the same
//! boot, are history.

use serde::{Deserialize, Serialize};
use std::fs::File;
use std::io::{self, Read};
use std::path::{Path, PathBuf};

/// The kernel's boot id file.
pub const BOOT_ID: &str = "/proc/sys/kernel/random/boot_id";
/// The kernel log device.
pub const KMSG: &str = "/dev/kmsg";

/// The current boot's id.
pub fn boot_id() -> io::Result<String> {
    Ok(std::fs::read_to_string(BOOT_ID)?.trim().to_string())
}

/// What was already acted on.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Seen {
    /// Boot the sequence numbers belong to.
    pub boot_id: String,
    /// Last kmsg sequence number acted on.
    pub last_seq: Option<u64>,
}

impl Seen {
    /// Loads from `path`; a missing file is a fresh start, a corrupt one an error
    /// naming the file.
    pub fn load(path: &Path) -> io::Result<Seen> {
        match std::fs::read_to_string(path) {
            Ok(t) => serde_json::from_str(&t).map_err(|e| {
                io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("{}: {e}; delete the file to start afresh", path.display()),
                )
            }),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(Seen::default()),
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

    /// True if a record of `boot_id` with `seq` is new, and remembers it.
    pub fn fresh(&mut self, boot_id: &str, seq: Option<u64>) -> bool {
        if self.boot_id != boot_id {
            self.boot_id = boot_id.to_string();
            self.last_seq = None;
        }
        match seq {
            Some(s) if self.last_seq.is_some_and(|l| s <= l) => false,
            Some(s) => {
                self.last_seq = Some(s);
                true
            }
            None => true,
        }
    }
}

/// Reads records one line at a time from `/dev/kmsg` (one record per read) or a file.
pub struct KmsgReader {
    path: PathBuf,
    file: File,
    buf: Vec<u8>,
    pending: Vec<u8>,
}

impl KmsgReader {
    /// Opens `path` (usually [`KMSG`]).
    pub fn open(path: &Path) -> io::Result<Self> {
        Ok(KmsgReader {
            path: path.to_path_buf(),
            file: File::open(path)?,
            buf: vec![0; 16 * 1024],
            pending: Vec::new(),
        })
    }

    /// The next line, or `None` at the end of a regular file. On `/dev/kmsg` this
    /// blocks until the kernel logs something.
    pub fn next_line(&mut self) -> io::Result<Option<String>> {
        loop {
            if let Some(i) = self.pending.iter().position(|&b| b == b'\n') {
                let line: Vec<u8> = self.pending.drain(..=i).collect();
                return Ok(Some(String::from_utf8_lossy(&line[..i]).into_owned()));
            }
            match self.file.read(&mut self.buf) {
                Ok(0) if self.pending.is_empty() => return Ok(None),
                Ok(0) => {
                    let rest = std::mem::take(&mut self.pending);
                    return Ok(Some(String::from_utf8_lossy(&rest).into_owned()));
                }
                Ok(n) => self.pending.extend_from_slice(&self.buf[..n]),
                // The ring buffer overran the reader: records were lost; go on.
                Err(e) if e.raw_os_error() == Some(32) => continue,
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
