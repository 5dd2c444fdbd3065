//! A session's terminal, held by its supervisor (`allot run --pty`): the job gets
//! the PTY's far side as its controlling terminal; the supervisor keeps the near
//! side, copies what the job prints into the lease's stdout log (under the cap),
//! into a replay buffer for the next attach, and to every attached agent; and
//! takes keystrokes, window sizes and allot's notices from them. An agent restart
//! only drops its connection: the terminal, and the job on it, stay here.

use super::Cap;
use crate::tty::{read_frame, Ended, Frame, REPLAY_BYTES};
use std::collections::VecDeque;
use std::io::Write;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// How long a write to an attached agent may block before it is dropped: a stuck
/// reader must not stop the job's output.
const CLIENT_WRITE: Duration = Duration::from_secs(5);

/// The window a terminal starts with, until the first attach says its own.
const START_SIZE: (u16, u16) = (24, 80);

/// What the pump and the attach threads share.
struct Screen {
    /// The last [`REPLAY_BYTES`] of output.
    replay: VecDeque<u8>,
    /// Attached agents.
    clients: Vec<UnixStream>,
}

/// The supervisor's side of a session's terminal.
pub struct Terminal {
    master: OwnedFd,
    /// Kept open so that notices can be written on it, and so that the near side
    /// never reads EIO between two programs of the session.
    slave: OwnedFd,
    screen: Arc<Mutex<Screen>>,
}

impl Terminal {
    /// A new PTY of [`START_SIZE`].
    pub fn open() -> Result<Terminal, String> {
        let size = nix::pty::Winsize {
            ws_row: START_SIZE.0,
            ws_col: START_SIZE.1,
            ws_xpixel: 0,
            ws_ypixel: 0,
        };
        let pty = nix::pty::openpty(Some(&size), None)
            .map_err(|e| format!("cannot open a terminal for the session: {e}"))?;
        for fd in [&pty.master, &pty.slave] {
            nix::fcntl::fcntl(
                fd.as_fd(),
                nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::FD_CLOEXEC),
            )
            .map_err(|e| format!("cannot set the terminal's close-on-exec: {e}"))?;
        }
        Ok(Terminal {
            master: pty.master,
            slave: pty.slave,
            screen: Arc::new(Mutex::new(Screen {
                replay: VecDeque::with_capacity(REPLAY_BYTES),
                clients: Vec::new(),
            })),
        })
    }

    /// The far side, for the job's stdin, stdout and stderr.
    pub fn job_side(&self) -> std::io::Result<OwnedFd> {
        self.slave.try_clone()
    }

    /// Gives the far side to `uid`/`gid`, mode 0600: the user's own tools (tmux)
    /// expect their terminal to be theirs; login's 0620 is for the `tty` group's
    /// `write(1)`, and here the group would be the user's, whose other members
    /// must not type into the session.
    pub fn give_to(&self, uid: u32, gid: u32) {
        let _ = nix::unistd::fchown(
            self.slave.as_fd(),
            Some(nix::unistd::Uid::from_raw(uid)),
            Some(nix::unistd::Gid::from_raw(gid)),
        );
        let _ = nix::sys::stat::fchmod(
            self.slave.as_fd(),
            nix::sys::stat::Mode::from_bits_truncate(0o600),
        );
    }

    /// Listens for attaches on `path` (mode 0600: only the agent's user connects),
    /// each on a thread of its own.
    pub fn listen(self: &Arc<Self>, path: &Path) -> Result<(), String> {
        let _ = std::fs::remove_file(path);
        let listener = UnixListener::bind(path).map_err(|e| {
            format!(
                "cannot listen for the session's attaches on {}: {e}",
                path.display()
            )
        })?;
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
            .map_err(|e| format!("cannot restrict {}: {e}", path.display()))?;
        let me = Arc::clone(self);
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                match conn {
                    Ok(c) => me.attach(c),
                    Err(e) => eprintln!("allot supervise: an attach failed: {e}"),
                }
            }
        });
        Ok(())
    }

    /// One attach: the replay first, then live output; its frames on a thread.
    fn attach(self: &Arc<Self>, conn: UnixStream) {
        let _ = conn.set_write_timeout(Some(CLIENT_WRITE));
        let Ok(mut out) = conn.try_clone() else {
            return;
        };
        {
            // Under the lock the pump appends under: nothing printed is missed or
            // shown twice. A peer that only came to leave a notice may be gone
            // already: its frames are read all the same.
            let mut s = self.screen();
            let (a, b) = s.replay.as_slices();
            if Frame::Data([a, b].concat()).write_to(&mut out).is_ok() {
                s.clients.push(out);
            }
        }
        let me = Arc::clone(self);
        std::thread::spawn(move || me.serve(conn));
    }

    /// Carries out an attached agent's frames until it goes.
    fn serve(&self, mut conn: UnixStream) {
        loop {
            match read_frame(&mut conn) {
                Ok(Some(Frame::Data(keys))) => {
                    if nix::unistd::write(self.master.as_fd(), &keys).is_err() {
                        return;
                    }
                }
                Ok(Some(Frame::Resize(rows, cols))) if rows > 0 && cols > 0 => {
                    self.resize(rows, cols)
                }
                Ok(Some(Frame::Notice(text))) => self.notice(&text),
                Ok(Some(_)) => {}
                Ok(None) | Err(_) => return,
            }
        }
    }

    /// Sets the window's size: the kernel tells the foreground program (SIGWINCH).
    fn resize(&self, rows: u16, cols: u16) {
        let size = rustix::termios::Winsize {
            ws_row: rows,
            ws_col: cols,
            ws_xpixel: 0,
            ws_ypixel: 0,
        };
        let _ = rustix::termios::tcsetwinsize(&self.master, size);
    }

    /// Writes a line of allot's on the terminal, as `wall` does: the user sees it
    /// where they type, and the next attach sees it in the replay.
    pub fn notice(&self, text: &str) {
        let line = format!("\r\n[allot] {}\r\n", text.replace(['\r', '\n'], " "));
        let _ = nix::unistd::write(self.slave.as_fd(), line.as_bytes());
    }

    fn screen(&self) -> std::sync::MutexGuard<'_, Screen> {
        self.screen.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Copies the terminal's output to the log (under `cap`), the replay and the
    /// attached agents until `done` is set and nothing more comes for a moment.
    pub fn pump(&self, mut log: std::fs::File, cap: &Cap, done: &AtomicBool) {
        use nix::poll::{poll, PollFd, PollFlags};
        let mut buf = vec![0u8; 64 << 10];
        loop {
            let mut fds = [PollFd::new(self.master.as_fd(), PollFlags::POLLIN)];
            match poll(&mut fds, 100u16) {
                Ok(0) if done.load(Ordering::Acquire) => return,
                Ok(0) | Err(nix::errno::Errno::EINTR) => continue,
                Ok(_) => {}
                Err(_) => return,
            }
            let n = match nix::unistd::read(self.master.as_fd(), &mut buf) {
                Ok(0) => return,
                Ok(n) => n,
                Err(nix::errno::Errno::EINTR | nix::errno::Errno::EAGAIN) => continue,
                // EIO: nothing holds the far side any more.
                Err(_) => return,
            };
            let data = &buf[..n];
            cap.write(&mut log, data);
            let mut s = self.screen();
            s.replay.extend(data);
            let extra = s.replay.len().saturating_sub(REPLAY_BYTES);
            s.replay.drain(..extra);
            let frame = Frame::Data(data.to_vec()).encode();
            s.clients.retain_mut(|c| c.write_all(&frame).is_ok());
        }
    }

    /// Tells every attached agent how the program ended, and lets them go.
    pub fn ended(&self, how: Ended) {
        let frame = Frame::Exit(how).encode();
        let mut s = self.screen();
        for mut c in s.clients.drain(..) {
            let _ = c.write_all(&frame);
            let _ = c.shutdown(std::net::Shutdown::Both);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_far_side_is_its_owners_alone() {
        let t = Terminal::open().expect("a pty");
        let me = nix::unistd::getuid().as_raw();
        let group = nix::unistd::getgid().as_raw();
        t.give_to(me, group);
        let st = nix::sys::stat::fstat(t.slave.as_fd()).expect("fstat");
        assert_eq!(st.st_mode & 0o777, 0o600, "mode {:o}", st.st_mode);
        assert_eq!((st.st_uid, st.st_gid), (me, group));
    }
}
