//! The user's own terminal while a session is attached: raw mode (every key goes
//! to the session, Ctrl-C included, so that the far terminal makes it a signal
//! for whatever runs in front there), its window size, and the `~.` escape that
//! detaches, as ssh's does.

use std::os::fd::{AsFd, BorrowedFd};

/// The terminal's settings as they were, put back on drop (also on an error's way
/// out), so a session never leaves the user's shell in raw mode.
pub struct Raw {
    saved: nix::sys::termios::Termios,
}

impl Raw {
    /// Raw mode on stdin when it is a terminal; `None` when it is not (piped
    /// input goes through as it is).
    pub fn enter() -> Option<Raw> {
        use nix::sys::termios::{cfmakeraw, tcgetattr, tcsetattr, SetArg};
        let stdin = std::io::stdin();
        let saved = tcgetattr(stdin.as_fd()).ok()?;
        let mut raw = saved.clone();
        cfmakeraw(&mut raw);
        tcsetattr(stdin.as_fd(), SetArg::TCSADRAIN, &raw).ok()?;
        Some(Raw { saved })
    }
}

impl Drop for Raw {
    fn drop(&mut self) {
        let _ = nix::sys::termios::tcsetattr(
            std::io::stdin().as_fd(),
            nix::sys::termios::SetArg::TCSADRAIN,
            &self.saved,
        );
    }
}

/// The window size of the terminal on `fd`: rows, columns; `None` off a terminal.
pub fn size_of(fd: BorrowedFd<'_>) -> Option<(u16, u16)> {
    let ws = rustix::termios::tcgetwinsize(fd).ok()?;
    (ws.ws_row > 0 && ws.ws_col > 0).then_some((ws.ws_row, ws.ws_col))
}

/// This process's window: stdout's, else stdin's.
pub fn size() -> Option<(u16, u16)> {
    size_of(std::io::stdout().as_fd()).or_else(|| size_of(std::io::stdin().as_fd()))
}

/// What the user typed, once the escape is taken out.
#[derive(Debug, PartialEq, Eq)]
pub enum Keys {
    /// Bytes for the session.
    Send(Vec<u8>),
    /// `~.`: detach, leaving the session running.
    Detach,
    /// `~?`: say what the escapes are.
    Help,
}

/// The escape, as ssh's: `~` first on a line, then `.` detaches, `?` lists the
/// escapes and `~` sends one `~`; anything else goes through with the `~`.
#[derive(Debug)]
pub struct Escape {
    line_start: bool,
    tilde: bool,
}

impl Default for Escape {
    fn default() -> Self {
        Escape {
            line_start: true,
            tilde: false,
        }
    }
}

/// What the escapes do, for `~?`.
pub const ESCAPES: &str =
    "\r\nallot escapes (after Enter): ~. detach (the session runs on; `allot attach ID`), ~~ send ~, ~? this\r\n";

impl Escape {
    /// Splits `input` into what goes to the session and the escapes in it, in order.
    pub fn feed(&mut self, input: &[u8]) -> Vec<Keys> {
        let mut out = Vec::new();
        let mut send = Vec::new();
        for &b in input {
            if self.tilde {
                self.tilde = false;
                match b {
                    b'.' => {
                        if !send.is_empty() {
                            out.push(Keys::Send(std::mem::take(&mut send)));
                        }
                        out.push(Keys::Detach);
                        return out;
                    }
                    b'?' => {
                        if !send.is_empty() {
                            out.push(Keys::Send(std::mem::take(&mut send)));
                        }
                        out.push(Keys::Help);
                        self.line_start = true;
                        continue;
                    }
                    b'~' => send.push(b'~'),
                    other => {
                        send.push(b'~');
                        send.push(other);
                    }
                }
                self.line_start = matches!(b, b'\r' | b'\n');
                continue;
            }
            if self.line_start && b == b'~' {
                self.tilde = true;
                continue;
            }
            send.push(b);
            self.line_start = matches!(b, b'\r' | b'\n');
        }
        if !send.is_empty() {
            out.push(Keys::Send(send));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tilde_dot_after_enter_detaches_and_elsewhere_goes_through() {
        let mut e = Escape::default();
        assert_eq!(e.feed(b"ls ~/x\r"), vec![Keys::Send(b"ls ~/x\r".to_vec())]);
        assert_eq!(
            e.feed(b"~."),
            vec![Keys::Detach],
            "~. first on a line detaches"
        );
        let mut e = Escape::default();
        assert_eq!(
            e.feed(b"echo\r~~x~?"),
            vec![Keys::Send(b"echo\r~x~?".to_vec())],
            "~~ sends one ~; a ~ inside a line is plain"
        );
        let mut e = Escape::default();
        // Split across reads: the ~ waits for the next byte.
        assert_eq!(e.feed(b"~"), vec![]);
        assert_eq!(e.feed(b"?"), vec![Keys::Help]);
        assert_eq!(e.feed(b"~q"), vec![Keys::Send(b"~q".to_vec())]);
    }
}
