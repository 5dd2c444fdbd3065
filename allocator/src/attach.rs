//! `allot attach` (and `allot run --pty`): a session's terminal, relayed. The
//! caller's stream comes to allotd, which checks the right (the owner; an admin),
//! finds the session's node and lease, and opens an attach there over the agent's
//! session (`TtyInput`, protocol 5); what the terminal prints comes back as
//! `TtyOutput` and goes to the caller. Keystrokes are the session's use: allotd
//! notes them ([`Server::keystrokes`]) so that the policy protects a session
//! while it is typed into. A caller that goes, or an agent that does, ends the
//! attach and nothing else: the session runs on in its supervisor.

use crate::serve::Server;
use crate::state::{lease_wire, Input};
use allot_fairshare::WorkloadState;
use allot_proto::v1 as pb;
use std::collections::HashMap;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use tokio::sync::mpsc;
use tokio_stream::Stream;
use tonic::{Status, Streaming};

/// Agents that give sessions a terminal (see `Register.protocol`).
pub const PROTOCOL_TTY: u32 = 5;
/// Most keystroke bytes one message may carry.
pub const MAX_KEYS: usize = 64 << 10;
/// Output messages queued for a caller who reads slower than the session prints;
/// past them the attach ends (attaching again replays the last 64 KiB).
const QUEUE: usize = 256;
/// A session's keystrokes are journaled as its use at most this often (seconds),
/// and at most every quarter of its class's idle grace: the grace is minutes, a
/// keystroke a moment.
pub const INPUT_EVERY: u64 = 10;

type Tx = mpsc::Sender<Result<pb::AttachOutput, Status>>;

/// What an Attach call answers with.
pub type AttachStream = Pin<Box<dyn Stream<Item = Result<pb::AttachOutput, Status>> + Send>>;

/// One open attach: where it runs and where its output goes.
struct Open {
    node: String,
    session: u64,
    tx: Tx,
}

/// The attaches open through agents.
#[derive(Default)]
pub struct TtyRelay {
    next: AtomicU64,
    open: Mutex<HashMap<u64, Open>>,
}

impl TtyRelay {
    fn open(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Open>> {
        self.open.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// What `node` says of one of its attaches (only the node asked answers).
    pub fn deliver(&self, node: &str, o: pb::TtyOutput) {
        let mut open = self.open();
        let Some(a) = open.get(&o.attach_id).filter(|a| a.node == node) else {
            return;
        };
        if o.closed {
            let tx = open.remove(&o.attach_id).map(|a| a.tx);
            drop(open);
            let Some(tx) = tx else { return };
            let last = if o.error.is_empty() {
                Ok(pb::AttachOutput {
                    data: o.data,
                    ended: true,
                    exit_code: o.exit_code,
                    signal: o.signal,
                    ..Default::default()
                })
            } else {
                Err(Status::failed_precondition(format!(
                    "{node}: {}",
                    o.error.replace(['\n', '\r'], " ")
                )))
            };
            let _ = tx.try_send(last);
            return;
        }
        let sent = a.tx.try_send(Ok(pb::AttachOutput {
            data: o.data,
            ..Default::default()
        }));
        if let Err(mpsc::error::TrySendError::Full(_)) = sent {
            // The caller is not reading: its attach ends here, the session goes on.
            if let Some(a) = open.remove(&o.attach_id) {
                let _ = a.tx.try_send(Err(Status::resource_exhausted(
                    "the terminal printed faster than this connection took it; `allot attach` again (it shows the last 64 KiB)",
                )));
            }
        }
    }

    /// allotd is stopping: every attach ends now, saying so, rather than hold its
    /// connection open through the shutdown's grace; the sessions run on.
    pub fn close_all(&self) {
        let gone: Vec<Open> = std::mem::take(&mut *self.open()).into_values().collect();
        for a in gone {
            let _ = a.tx.try_send(Err(Status::unavailable(
                "allotd is stopping; the session runs on: `allot attach` again once allotd is back",
            )));
        }
    }

    /// `node`'s session `session` ended: its attaches end, the sessions run on.
    pub fn node_gone(&self, node: &str, session: u64) {
        let gone: Vec<Open> = {
            let mut open = self.open();
            let (gone, kept) = std::mem::take(&mut *open)
                .into_iter()
                .partition(|(_, a)| a.node == node && a.session == session);
            *open = kept;
            gone.into_values().collect()
        };
        for a in gone {
            let _ = a.tx.try_send(Err(Status::unavailable(format!(
                "{node}'s agent disconnected; the session runs on there: `allot attach` again once it is back (`allot nodes`)"
            ))));
        }
    }
}

/// Why workload `w` cannot be attached to now, in words naming the fix.
fn not_attachable(w: &crate::state::WorkRec) -> Option<String> {
    let id = w.id;
    if !w.pty {
        return Some(format!(
            "id: workload {id} has no terminal (it was submitted without --pty); `allot logs -f {id}` follows its output"
        ));
    }
    match w.state {
        WorkloadState::Running => None,
        WorkloadState::Pending => Some(format!(
            "id: workload {id} has not started; `allot status {id}` says why it waits (`allot run` waits and attaches by itself)"
        )),
        s => Some(format!(
            "id: workload {id} has ended ({}: {}); `allot logs {id}` shows what it printed",
            s.as_str(),
            w.end_reason
        )),
    }
}

/// Opens an attach to workload `id` for `owner` (the right already checked), the
/// caller's first message being `first` and the rest coming on `keys`.
pub fn open(
    server: Arc<Server>,
    owner: &str,
    id: u64,
    first: pb::AttachInput,
    mut keys: Streaming<pb::AttachInput>,
) -> Result<AttachStream, Status> {
    let (node, lease, every) = {
        let c = server.core();
        let w = c.alloc.workloads().get(&id).ok_or_else(|| {
            Status::not_found(format!(
                "id: no workload {id} running; `allot queue` lists them"
            ))
        })?;
        if let Some(why) = not_attachable(w) {
            return Err(Status::failed_precondition(why));
        }
        let run = w
            .runs
            .last()
            .filter(|r| r.end == 0 && !r.nodes.is_empty())
            .ok_or_else(|| {
                Status::failed_precondition(format!(
                    "id: workload {id} is between runs; attach again in a moment"
                ))
            })?;
        let every = c
            .alloc
            .core
            .config()
            .idle_grace(&w.spec.class)
            .map_or(INPUT_EVERY, |g| (g / 4).clamp(1, INPUT_EVERY));
        (run.nodes[0].clone(), run.lease, every)
    };
    let lease_id = lease_wire(lease);
    let link = server
        .sessions
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get(&node)
        .cloned();
    let Some((session, out, protocol)) = link else {
        return Err(Status::unavailable(format!(
            "{node} is not connected; the session runs on there: `allot attach {id}` again once it is back (`allot nodes`)"
        )));
    };
    if protocol < PROTOCOL_TTY {
        return Err(Status::failed_precondition(format!(
            "{node}'s agent is older than sessions (protocol {protocol}, {PROTOCOL_TTY} needed); upgrade allot-agent there"
        )));
    }
    check_keys(&first)?;
    let slot = server.conns.watch_slot(owner).map_err(|why| {
        Status::resource_exhausted(format!(
            "attach: {why} (watch, logs and attach together); detach some"
        ))
    })?;
    let attach_id = server.ttys.next.fetch_add(1, Ordering::Relaxed) + 1;
    let (tx, rx) = mpsc::channel(QUEUE);
    let _ = tx.try_send(Ok(pb::AttachOutput {
        node: node.clone(),
        lease_id: lease_id.clone(),
        ..Default::default()
    }));
    server.ttys.open().insert(
        attach_id,
        Open {
            node: node.clone(),
            session,
            tx: tx.clone(),
        },
    );
    let to_node = move |m: pb::TtyInput| {
        out.send(Ok(pb::AllocatorMessage {
            body: Some(pb::allocator_message::Body::Tty(pb::TtyInput {
                attach_id,
                lease_id: lease_id.clone(),
                ..m
            })),
        }))
        .is_ok()
    };
    if !first.data.is_empty() {
        server.keystrokes(lease, every);
    }
    to_node(pb::TtyInput {
        open: true,
        data: first.data,
        rows: first.rows,
        cols: first.cols,
        ..Default::default()
    });
    let relay = server.clone();
    tokio::spawn(async move {
        // Held while the attach lasts: it counts among the caller's streams.
        let _slot = slot;
        loop {
            let m = tokio::select! {
                () = tx.closed() => break,
                m = keys.message() => m,
            };
            let m = match m {
                Ok(Some(m)) => m,
                // Detached (or the connection was lost): the session runs on.
                Ok(None) | Err(_) => break,
            };
            if let Err(e) = check_keys(&m) {
                let _ = tx.send(Err(e)).await;
                break;
            }
            if !m.data.is_empty() {
                relay.keystrokes(lease, every);
            }
            let sent = to_node(pb::TtyInput {
                data: m.data,
                rows: m.rows,
                cols: m.cols,
                ..Default::default()
            });
            if !sent {
                break;
            }
        }
        relay.ttys.open().remove(&attach_id);
        to_node(pb::TtyInput {
            close: true,
            ..Default::default()
        });
    });
    Ok(Box::pin(tokio_stream::wrappers::ReceiverStream::new(rx)))
}

fn check_keys(m: &pb::AttachInput) -> Result<(), Status> {
    if m.data.len() > MAX_KEYS {
        return Err(Status::invalid_argument(format!(
            "data: {} bytes of keystrokes in one message, at most {MAX_KEYS}",
            m.data.len()
        )));
    }
    if m.rows > u32::from(u16::MAX) || m.cols > u32::from(u16::MAX) {
        return Err(Status::invalid_argument(format!(
            "rows, cols: a window of {}x{} is past 65535",
            m.rows, m.cols
        )));
    }
    Ok(())
}

impl Server {
    /// Lease `lease`'s session was typed into: its use, journaled at most every
    /// `every` seconds.
    pub fn keystrokes(&self, lease: u64, every: u64) {
        let at = crate::serve::now();
        {
            let mut last = self.typed.lock().unwrap_or_else(|e| e.into_inner());
            if last
                .get(&lease)
                .is_some_and(|t| at.saturating_sub(*t) < every)
            {
                return;
            }
            // Forgotten with the lease: a map of live sessions only.
            last.retain(|l, t| *l == lease || at.saturating_sub(*t) < 86_400);
            last.insert(lease, at);
        }
        if let Err(e) = self.commit(Input::Typed { lease }) {
            tracing::debug!(lease, error = %e, "a session's keystrokes not recorded");
        }
    }
}
