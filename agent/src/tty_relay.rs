//! The agent's part of `allot attach`: allotd's `TtyInput` opens a connection to
//! the lease's supervisor (`tty.sock` in the lease's directory, [`crate::tty`]),
//! carries keystrokes, window sizes and notices to it, and sends what the terminal
//! prints back as `TtyOutput` on the allocator stream. Attaches live no longer
//! than the stream they came on; the session itself lives in its supervisor.

use crate::shared::Shared;
use crate::tty::{body_len, Frame};
use allot_proto::v1 as pb;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::mpsc;

/// Most attaches open at once on one host (each holds a connection and a task).
pub const MAX_ATTACHES: usize = 256;
/// Most of those open to the sessions of one user (their own attaches and an
/// admin's): one user's attaches never keep another out of their own session.
pub const MAX_ATTACHES_PER_USER: usize = MAX_ATTACHES / 8;

/// One open attach: whose session, and where its frames go.
struct Open {
    owner: String,
    tx: mpsc::UnboundedSender<Frame>,
}

/// Open attaches by allotd's id.
#[derive(Default)]
pub struct Ttys {
    open: Mutex<HashMap<u64, Open>>,
}

impl Ttys {
    fn open(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Open>> {
        self.open.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The allocator stream ended: its attaches end with it (allotd's callers were
    /// told; they attach again).
    pub fn close_all(&self) {
        self.open().clear();
    }
}

fn output(attach_id: u64, body: pb::TtyOutput) -> pb::AgentMessage {
    pb::AgentMessage {
        body: Some(pb::agent_message::Body::Tty(pb::TtyOutput {
            attach_id,
            ..body
        })),
    }
}

fn closed(attach_id: u64, error: String) -> pb::AgentMessage {
    output(
        attach_id,
        pb::TtyOutput {
            closed: true,
            error,
            ..Default::default()
        },
    )
}

/// The frames one `TtyInput` carries, in order.
fn frames(m: &pb::TtyInput) -> Vec<Frame> {
    let mut f = Vec::new();
    if m.rows > 0 && m.cols > 0 {
        f.push(Frame::Resize(
            u16::try_from(m.rows).unwrap_or(u16::MAX),
            u16::try_from(m.cols).unwrap_or(u16::MAX),
        ));
    }
    if !m.data.is_empty() {
        f.push(Frame::Data(m.data.clone()));
    }
    if !m.notice.is_empty() {
        f.push(Frame::Notice(m.notice.clone()));
    }
    f
}

/// Why one more attach to a session of `owner`'s may not open beside `open`, if
/// it may not: the host's cap, or the owner's share of it.
fn no_room(open: &HashMap<u64, Open>, owner: &str) -> Option<String> {
    if open.len() >= MAX_ATTACHES {
        return Some(format!(
            "this host has {MAX_ATTACHES} attaches open; detach some"
        ));
    }
    let theirs = open.values().filter(|o| o.owner == owner).count();
    (theirs >= MAX_ATTACHES_PER_USER).then(|| {
        format!(
            "{owner}'s sessions on this host have {theirs} attaches open, their share of the host's {MAX_ATTACHES}; detach some"
        )
    })
}

/// One `TtyInput` from allotd.
pub fn on_input(sh: &Arc<Shared>, m: pb::TtyInput) {
    let id = m.attach_id;
    if m.close {
        sh.ttys.open().remove(&id);
        return;
    }
    if !m.open {
        let tx = sh.ttys.open().get(&id).map(|o| o.tx.clone());
        match tx {
            Some(tx) => {
                for f in frames(&m) {
                    let _ = tx.send(f);
                }
            }
            // A notice for whoever looks: a connection of its own, then gone.
            None if id == 0 && !m.notice.is_empty() => {
                let sh = sh.clone();
                let Ok((path, _)) = sh.host().tty_socket(&m.lease_id) else {
                    return;
                };
                tokio::spawn(async move {
                    if let Ok(mut c) = tokio::net::UnixStream::connect(&path).await {
                        let _ = c.write_all(&Frame::Notice(m.notice).encode()).await;
                    }
                });
            }
            None => {}
        }
        return;
    }
    let (path, owner) = match sh.host().tty_socket(&m.lease_id) {
        Ok(p) => p,
        Err(e) => {
            crate::uplink::send(sh, closed(id, e));
            return;
        }
    };
    let (tx, rx) = mpsc::unbounded_channel();
    {
        let mut open = sh.ttys.open();
        if let Some(why) = no_room(&open, &owner) {
            drop(open);
            crate::uplink::send(sh, closed(id, why));
            return;
        }
        open.insert(
            id,
            Open {
                owner,
                tx: tx.clone(),
            },
        );
    }
    for f in frames(&m) {
        let _ = tx.send(f);
    }
    let sh = sh.clone();
    tokio::spawn(async move {
        let lease = m.lease_id;
        let why = match relay(&sh, id, &path, rx).await {
            Ok(()) => return,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                format!("lease {lease} has no terminal (it was not started by `allot run --pty`)")
            }
            Err(e) => format!("lease {lease}'s terminal: {e}"),
        };
        sh.ttys.open().remove(&id);
        crate::uplink::send(&sh, closed(id, why));
    });
}

/// Connects to the supervisor at `path` and relays until either side ends.
async fn relay(
    sh: &Arc<Shared>,
    id: u64,
    path: &std::path::Path,
    mut rx: mpsc::UnboundedReceiver<Frame>,
) -> std::io::Result<()> {
    let conn = tokio::net::UnixStream::connect(path).await?;
    let (mut from, mut to) = conn.into_split();
    // Keystrokes go in while output comes out; the writer ends when allotd closes
    // the attach (or its stream ends), and takes the reader with it.
    let writer = tokio::spawn(async move {
        while let Some(f) = rx.recv().await {
            if to.write_all(&f.encode()).await.is_err() {
                return;
            }
        }
        let _ = to.shutdown().await;
    });
    let result = async {
        loop {
            let mut header = [0u8; 5];
            if let Err(e) = from.read_exact(&mut header).await {
                return if e.kind() == std::io::ErrorKind::UnexpectedEof {
                    Err(std::io::Error::other("the session's supervisor went away"))
                } else {
                    Err(e)
                };
            }
            let mut body = vec![0u8; body_len(header)?];
            from.read_exact(&mut body).await?;
            match Frame::decode(header[0], body) {
                Some(Frame::Data(data)) => crate::uplink::send(
                    sh,
                    output(
                        id,
                        pb::TtyOutput {
                            data,
                            ..Default::default()
                        },
                    ),
                ),
                Some(Frame::Exit(e)) => {
                    crate::uplink::send(
                        sh,
                        output(
                            id,
                            pb::TtyOutput {
                                closed: true,
                                exit_code: e.code,
                                signal: e.signal,
                                ..Default::default()
                            },
                        ),
                    );
                    return Ok(());
                }
                _ => {}
            }
        }
    };
    let r = tokio::select! {
        r = result => r,
        // Detached: nothing more to say.
        _ = writer => Ok(()),
    };
    sh.ttys.open().remove(&id);
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fill(open: &mut HashMap<u64, Open>, owner: &str, n: usize) {
        for _ in 0..n {
            let id = open.len() as u64 + 1;
            let (tx, _) = mpsc::unbounded_channel();
            open.insert(
                id,
                Open {
                    owner: owner.into(),
                    tx,
                },
            );
        }
    }

    #[test]
    fn one_users_attaches_leave_room_for_anothers_own_session() {
        let mut open = HashMap::new();
        fill(&mut open, "mallory", MAX_ATTACHES_PER_USER);
        let why = no_room(&open, "mallory").expect("her share is full");
        assert!(
            why.contains("mallory's sessions") && why.contains("detach some"),
            "{why}"
        );
        assert_eq!(no_room(&open, "bob"), None, "bob attaches to his own");
        // Only a host full of many users' attaches turns everyone away.
        for u in 1..8 {
            fill(&mut open, &format!("u{u}"), MAX_ATTACHES_PER_USER);
        }
        let why = no_room(&open, "bob").expect("the host is full");
        assert!(why.contains("this host has 256 attaches open"), "{why}");
    }
}
