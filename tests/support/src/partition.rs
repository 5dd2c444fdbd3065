//! A TCP relay a test can cut, as a network partition cuts: while cut, nothing
//! crosses either way and nothing is closed, so each side learns of it only by its
//! own timeouts. What was sent meanwhile waits, as TCP retransmits it, and crosses
//! once the cut heals (a close too: a side that gave up is seen to have then).

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// The relay; dropped, it stops accepting and closes what it holds.
pub struct Partition {
    /// Where to connect instead of the upstream (`127.0.0.1:PORT`).
    pub addr: String,
    cut: Arc<AtomicBool>,
    stop: Arc<AtomicBool>,
}

impl Partition {
    /// Relays 127.0.0.1:(a free port) to `upstream`.
    pub fn start(upstream: &str) -> Partition {
        let listener = TcpListener::bind("127.0.0.1:0").expect("relay binds");
        listener.set_nonblocking(true).expect("nonblocking");
        let addr = listener.local_addr().expect("addr").to_string();
        let p = Partition {
            addr,
            cut: Arc::new(AtomicBool::new(false)),
            stop: Arc::new(AtomicBool::new(false)),
        };
        let (upstream, cut, stop) = (upstream.to_string(), p.cut.clone(), p.stop.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Acquire) {
                let Ok((down, _)) = listener.accept() else {
                    std::thread::sleep(Duration::from_millis(20));
                    continue;
                };
                let _ = down.set_nonblocking(false);
                let Ok(up) = TcpStream::connect(&upstream) else {
                    continue;
                };
                for (from, to) in [
                    (down.try_clone(), up.try_clone()),
                    (up.try_clone(), down.try_clone()),
                ] {
                    let (Ok(from), Ok(to)) = (from, to) else {
                        continue;
                    };
                    let (cut, stop) = (cut.clone(), stop.clone());
                    std::thread::spawn(move || pump(from, to, &cut, &stop));
                }
            }
        });
        p
    }

    /// Cuts the way: nothing crosses until [`Partition::heal`].
    pub fn cut(&self) {
        self.cut.store(true, Ordering::Release);
    }

    /// Lets what waited, and what follows, through again.
    pub fn heal(&self) {
        self.cut.store(false, Ordering::Release);
    }
}

impl Drop for Partition {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
    }
}

fn pump(mut from: TcpStream, mut to: TcpStream, cut: &AtomicBool, stop: &AtomicBool) {
    let _ = from.set_read_timeout(Some(Duration::from_millis(100)));
    let mut buf = [0u8; 16 * 1024];
    while !stop.load(Ordering::Acquire) {
        // Unread while cut: the sender's kernel holds it, as for a lost route.
        if cut.load(Ordering::Acquire) {
            std::thread::sleep(Duration::from_millis(20));
            continue;
        }
        match from.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                if to.write_all(&buf[..n]).is_err() {
                    break;
                }
            }
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(_) => break,
        }
    }
    let _ = to.shutdown(Shutdown::Both);
    let _ = from.shutdown(Shutdown::Both);
}
