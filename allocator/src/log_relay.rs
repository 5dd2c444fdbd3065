//! The reads of a lease's output allotd sends to agents, each waiting for its
//! `LogChunk`: answered only by the node asked, dropped when its session ends.

use allot_proto::v1 as pb;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use tokio::sync::oneshot;

/// Most bytes asked of an agent at a time (the agent caps its answer there too).
pub const CHUNK: u32 = 1 << 20;
/// Longest error text from an agent that is passed on (it becomes a status message).
const MAX_ERROR: usize = 2048;

/// A read waiting for its answer: the node and session asked, and where the
/// answer goes.
type Waiting = (String, u64, oneshot::Sender<pb::LogChunk>);

/// The reads sent to agents that wait for their `LogChunk`.
#[derive(Default)]
pub struct LogRelay {
    next: AtomicU64,
    waiting: Mutex<HashMap<u64, Waiting>>,
}

impl LogRelay {
    fn waiting(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Waiting>> {
        self.waiting.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A new read of session `session` of `node`: its request id and the answer.
    pub fn ask(&self, node: &str, session: u64) -> (u64, oneshot::Receiver<pb::LogChunk>) {
        let id = self.next.fetch_add(1, Ordering::Relaxed) + 1;
        let (tx, rx) = oneshot::channel();
        self.waiting().insert(id, (node.to_string(), session, tx));
        (id, rx)
    }

    pub fn forget(&self, id: u64) {
        self.waiting().remove(&id);
    }

    /// An answer from `node`: to the read that asked that node for it (a node
    /// cannot answer another node's read), checked for its caps.
    pub fn deliver(&self, node: &str, mut c: pb::LogChunk) {
        let tx = {
            let mut w = self.waiting();
            match w.get(&c.request_id) {
                Some((n, _, _)) if n == node => w.remove(&c.request_id).map(|(_, _, tx)| tx),
                _ => None,
            }
        };
        let Some(tx) = tx else {
            tracing::debug!(node, request = c.request_id, "a log chunk nobody waits for");
            return;
        };
        if c.data.len() > CHUNK as usize {
            c = pb::LogChunk {
                request_id: c.request_id,
                error: format!(
                    "answered {} bytes where at most {CHUNK} were asked",
                    c.data.len()
                ),
                ..Default::default()
            };
        }
        if c.error.len() > MAX_ERROR {
            let mut end = MAX_ERROR;
            while !c.error.is_char_boundary(end) {
                end -= 1;
            }
            c.error.truncate(end);
        }
        // One line: the text becomes a status message.
        c.error = c.error.replace(['\n', '\r'], " ");
        let _ = tx.send(c);
    }

    /// Session `session` of `node` ended: its reads will get no answer.
    pub fn node_gone(&self, node: &str, session: u64) {
        self.waiting()
            .retain(|_, (n, s, _)| !(n == node && *s == session));
    }
}
