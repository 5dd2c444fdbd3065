//! A program on a terminal of the test's own (as a user's `allot run --pty` is):
//! keys typed into it, its window resized, its output waited for by content.

use std::io::Write;
use std::os::fd::{AsFd, OwnedFd};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// What the program printed, and whether it has closed its terminal.
#[derive(Default)]
struct Screen {
    bytes: Vec<u8>,
    closed: bool,
}

/// A program on a PTY.
pub struct Pty {
    master: OwnedFd,
    child: Child,
    screen: Arc<(Mutex<Screen>, Condvar)>,
    /// Where the next [`Pty::expect`] searches from.
    cursor: usize,
}

fn set_size(fd: &OwnedFd, rows: u16, cols: u16) {
    let ws = rustix::termios::Winsize {
        ws_row: rows,
        ws_col: cols,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    rustix::termios::tcsetwinsize(fd, ws).expect("resizing the terminal");
}

impl Pty {
    /// Starts `cmd` as the session leader of a new terminal of `rows` × `cols`.
    pub fn spawn(mut cmd: Command, rows: u16, cols: u16) -> Pty {
        let ws = nix::pty::Winsize {
            ws_row: rows,
            ws_col: cols,
            ws_xpixel: 0,
            ws_ypixel: 0,
        };
        let pty = nix::pty::openpty(Some(&ws), None).expect("openpty");
        let side = || Stdio::from(pty.slave.try_clone().expect("dup the terminal"));
        cmd.stdin(side()).stdout(side()).stderr(side());
        // SAFETY: between fork and exec only setsid(2) and ioctl(2) run, on the
        // child's own stdin (the terminal).
        #[allow(unsafe_code)]
        unsafe {
            use std::os::unix::process::CommandExt;
            cmd.pre_exec(|| {
                nix::unistd::setsid()?;
                if nix::libc::ioctl(0, nix::libc::TIOCSCTTY, 0) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child = cmd.spawn().expect("the program starts on its terminal");
        drop(pty.slave);
        let screen = Arc::new((Mutex::new(Screen::default()), Condvar::new()));
        let reader = pty.master.try_clone().expect("dup the master");
        let s = Arc::clone(&screen);
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            loop {
                let n = nix::unistd::read(reader.as_fd(), &mut buf).unwrap_or(0);
                let (m, cv) = &*s;
                let mut g = m.lock().unwrap_or_else(|e| e.into_inner());
                if n == 0 {
                    g.closed = true;
                    cv.notify_all();
                    return;
                }
                g.bytes.extend_from_slice(&buf[..n]);
                cv.notify_all();
            }
        });
        Pty {
            master: pty.master,
            child,
            screen,
            cursor: 0,
        }
    }

    /// Types `keys`.
    pub fn send(&mut self, keys: &[u8]) {
        let mut f = std::fs::File::from(self.master.try_clone().expect("dup the master"));
        f.write_all(keys).expect("typing into the terminal");
    }

    /// A second keyboard on the same terminal, for a thread that types.
    pub fn keyboard(&self) -> std::fs::File {
        std::fs::File::from(self.master.try_clone().expect("dup the master"))
    }

    /// Resizes the window (the kernel tells the program, SIGWINCH).
    pub fn resize(&self, rows: u16, cols: u16) {
        set_size(&self.master, rows, cols);
    }

    /// Everything printed so far, as text.
    pub fn text(&self) -> String {
        let g = self.screen.0.lock().unwrap_or_else(|e| e.into_inner());
        String::from_utf8_lossy(&g.bytes).into_owned()
    }

    /// Waits until `text` is printed after the last match; moves past it. Returns
    /// when it came, or `None` by the deadline (or when the terminal closed first).
    pub fn wait_for(&mut self, text: &str, limit: Duration) -> Option<Instant> {
        let until = Instant::now() + limit;
        let (m, cv) = &*self.screen;
        let mut g = m.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            let from = self.cursor.min(g.bytes.len());
            if let Some(at) = find(&g.bytes[from..], text.as_bytes()) {
                self.cursor = from + at + text.len();
                return Some(Instant::now());
            }
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() || g.closed {
                return None;
            }
            g = cv
                .wait_timeout(g, left)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    /// What is printed from here up to `text`, once `text` is (moving past it).
    pub fn until(&mut self, text: &str, limit: Duration) -> String {
        let from = self.cursor;
        self.expect(text, limit);
        let g = self.screen.0.lock().unwrap_or_else(|e| e.into_inner());
        let end = self.cursor.saturating_sub(text.len()).max(from);
        String::from_utf8_lossy(&g.bytes[from..end]).into_owned()
    }

    /// [`Pty::wait_for`], or the test fails showing what was printed.
    pub fn expect(&mut self, text: &str, limit: Duration) {
        if self.wait_for(text, limit).is_none() {
            panic!(
                "{text:?} not printed within {limit:?}; the terminal shows:\n{}",
                self.text()
            );
        }
    }

    /// Waits for the program's end, within `limit`: its terminal closes when it
    /// exits (nothing else of it holds the terminal), then it is reaped.
    pub fn wait(&mut self, limit: Duration) -> ExitStatus {
        let until = Instant::now() + limit;
        {
            let (m, cv) = &*self.screen;
            let mut g = m.lock().unwrap_or_else(|e| e.into_inner());
            while !g.closed {
                let left = until.saturating_duration_since(Instant::now());
                assert!(
                    !left.is_zero(),
                    "the program did not end within {limit:?}; it printed:\n{}",
                    String::from_utf8_lossy(&g.bytes)
                );
                g = cv
                    .wait_timeout(g, left)
                    .unwrap_or_else(|e| e.into_inner())
                    .0;
            }
        }
        self.child.wait().expect("reaping the program")
    }

    /// Ends the program as a lost connection would (SIGKILL).
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Pty {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len().max(1)).position(|w| w == needle)
}
