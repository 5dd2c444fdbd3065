//! A session's terminal between its supervisor and the agent: the supervisor holds
//! the PTY and listens on `tty.sock` in the lease's directory (the agent's own,
//! mode 0600); the agent connects once per attach and relays (see
//! [`crate::tty_relay`]). Frames are a kind byte, a big-endian u32 length and the
//! payload, so either side can be rewritten without the other.

use serde::{Deserialize, Serialize};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

/// Most bytes one frame carries; a longer one ends the connection.
pub const MAX_FRAME: usize = 1 << 20;
/// Output kept for the next attach (what was printed while nobody watched).
pub const REPLAY_BYTES: usize = 64 << 10;

/// What a frame carries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Frame {
    /// Keystrokes (to the supervisor) or output (from it).
    Data(Vec<u8>),
    /// The window's size: rows, columns.
    Resize(u16, u16),
    /// A line from allot, written on the terminal for whoever looks.
    Notice(String),
    /// The program ended (the last frame).
    Exit(Ended),
}

/// How a session's program ended, as its last frame says.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ended {
    /// Its exit status, when it exited.
    pub code: Option<i32>,
    /// The signal that ended it, when one did.
    pub signal: Option<i32>,
}

const DATA: u8 = 1;
const RESIZE: u8 = 2;
const NOTICE: u8 = 3;
const EXIT: u8 = 4;

impl Frame {
    /// The frame as written on the socket.
    pub fn encode(&self) -> Vec<u8> {
        let (kind, body): (u8, Vec<u8>) = match self {
            Frame::Data(d) => (DATA, d.clone()),
            Frame::Resize(r, c) => (RESIZE, [r.to_be_bytes(), c.to_be_bytes()].concat()),
            Frame::Notice(t) => (NOTICE, t.as_bytes().to_vec()),
            Frame::Exit(e) => (EXIT, serde_json::to_vec(e).unwrap_or_default()),
        };
        let len = u32::try_from(body.len()).unwrap_or(u32::MAX);
        let mut out = Vec::with_capacity(5 + body.len());
        out.push(kind);
        out.extend_from_slice(&len.to_be_bytes());
        out.extend_from_slice(&body);
        out
    }

    /// A frame from its kind and payload; `None` for a kind this side does not know
    /// (skipped, so that a newer peer may add kinds).
    pub fn decode(kind: u8, body: Vec<u8>) -> Option<Frame> {
        match kind {
            DATA => Some(Frame::Data(body)),
            RESIZE if body.len() == 4 => Some(Frame::Resize(
                u16::from_be_bytes([body[0], body[1]]),
                u16::from_be_bytes([body[2], body[3]]),
            )),
            NOTICE => Some(Frame::Notice(String::from_utf8_lossy(&body).into_owned())),
            EXIT => serde_json::from_slice(&body).ok().map(Frame::Exit),
            _ => None,
        }
    }

    /// Writes the frame in one write (frames from several threads never interleave).
    pub fn write_to(&self, w: &mut impl Write) -> std::io::Result<()> {
        w.write_all(&self.encode())
    }
}

/// The header's length field, checked against [`MAX_FRAME`].
pub fn body_len(header: [u8; 5]) -> std::io::Result<usize> {
    let len = u32::from_be_bytes([header[1], header[2], header[3], header[4]]) as usize;
    if len > MAX_FRAME {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("a terminal frame of {len} bytes (at most {MAX_FRAME})"),
        ));
    }
    Ok(len)
}

/// Reads the next frame; `Ok(None)` at the end of the stream. Unknown kinds are
/// skipped.
pub fn read_frame(r: &mut impl Read) -> std::io::Result<Option<Frame>> {
    loop {
        let mut header = [0u8; 5];
        match r.read_exact(&mut header) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
            Err(e) => return Err(e),
        }
        let mut body = vec![0u8; body_len(header)?];
        r.read_exact(&mut body)?;
        if let Some(f) = Frame::decode(header[0], body) {
            return Ok(Some(f));
        }
    }
}

/// Where a lease's supervisor listens for attaches.
pub fn socket_path(lease_dir: &Path) -> PathBuf {
    lease_dir.join("tty.sock")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_read_back_as_written_and_unknown_kinds_are_skipped() {
        let frames = [
            Frame::Data(b"echo hi\r".to_vec()),
            Frame::Resize(40, 120),
            Frame::Notice("idle for 31m".into()),
            Frame::Exit(Ended {
                code: Some(3),
                signal: None,
            }),
        ];
        let mut wire = vec![9, 0, 0, 0, 2, b'?', b'?'];
        for f in &frames {
            wire.extend(f.encode());
        }
        let mut r = &wire[..];
        let mut back = Vec::new();
        while let Some(f) = read_frame(&mut r).expect("reads") {
            back.push(f);
        }
        assert_eq!(back, frames);
    }

    #[test]
    fn an_oversized_frame_is_refused_before_it_is_read() {
        let mut wire = vec![DATA];
        wire.extend_from_slice(&(MAX_FRAME as u32 + 1).to_be_bytes());
        let e = read_frame(&mut &wire[..]).expect_err("refused");
        assert!(e.to_string().contains("at most"), "{e}");
    }
}
