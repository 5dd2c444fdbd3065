//! allotd's connections and long-lived streams, bounded so that one client cannot
//! starve the rest: accepted TCP connections are admitted per peer IP and in all
//! (one over either cap is closed at once), each holds its slot until it closes, a
//! connection whose peer sends nothing for `idle_timeout` is closed, and `Watch`
//! streams are counted against their own cap. The counts are `/metrics` gauges.
//!
//! Measured before: 1,100 idle connections with the default 1,024 descriptors left
//! allotd unable to accept anyone (the accept loop spun on EMFILE); 20,000 abandoned
//! Watch streams held 146 MB.

use crate::config::ServerSection;
use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::{Instant, Sleep};
use tokio_stream::Stream;
use tonic::transport::server::{Connected, TcpConnectInfo};

/// Descriptors kept for what is not a client connection: the journal and its WAL,
/// the listeners, `/metrics` scrapes, logs.
const RESERVE_FDS: u64 = 64;
/// How long the accept loop pauses after an error such as EMFILE: the listener
/// stays readable, so retrying at once would spin a core.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);
/// At most one warning per this period for refused connections (an abuser would
/// otherwise write the log for us).
const WARN_EVERY: Duration = Duration::from_secs(10);

/// The counts and caps, shared by the accept loop, every connection and the Watch
/// streams.
pub struct Conns {
    max: usize,
    per_peer: usize,
    idle: Duration,
    max_watch: usize,
    by_peer: Mutex<HashMap<IpAddr, usize>>,
    open: AtomicUsize,
    watch: AtomicUsize,
    refused: AtomicU64,
    idle_closed: AtomicU64,
    /// When the last refusal warning was logged, and refusals since.
    warned: Mutex<(Option<Instant>, u64)>,
}

/// The caps of `[server]`, with `max_connections` lowered to what the descriptor
/// limit `nofile` allows.
pub fn effective_max(s: &ServerSection, nofile: u64) -> usize {
    let room = usize::try_from(nofile.saturating_sub(RESERVE_FDS)).unwrap_or(usize::MAX);
    s.max_connections.min(room.max(1))
}

impl Conns {
    /// Counts with the caps of `[server]` under this process's descriptor limit.
    pub fn new(s: &ServerSection) -> Conns {
        use nix::sys::resource::{getrlimit, Resource};
        let nofile = getrlimit(Resource::RLIMIT_NOFILE).map_or(1024, |(soft, _)| soft);
        Self::with_nofile(s, nofile)
    }

    /// Counts with the caps of `[server]`; `nofile` is the descriptor limit in force.
    pub fn with_nofile(s: &ServerSection, nofile: u64) -> Conns {
        let max = effective_max(s, nofile);
        if max < s.max_connections {
            tracing::warn!(
                max_connections = s.max_connections,
                nofile,
                effective = max,
                "max_connections lowered to the descriptor limit; raise LimitNOFILE"
            );
        }
        Conns {
            max,
            // Kept below the cap in all when that was lowered: one peer never
            // takes every connection.
            per_peer: s.max_connections_per_peer.min(max.saturating_sub(1).max(1)),
            idle: Duration::from_secs(s.idle_timeout.max(1)),
            max_watch: s.max_watch_streams,
            by_peer: Mutex::new(HashMap::new()),
            open: AtomicUsize::new(0),
            watch: AtomicUsize::new(0),
            refused: AtomicU64::new(0),
            idle_closed: AtomicU64::new(0),
            warned: Mutex::new((None, 0)),
        }
    }

    /// Open connections now.
    pub fn open(&self) -> usize {
        self.open.load(Ordering::Relaxed)
    }

    /// Open Watch streams now.
    pub fn watch_streams(&self) -> usize {
        self.watch.load(Ordering::Relaxed)
    }

    /// Connections closed at accept for a cap, since start.
    pub fn refused(&self) -> u64 {
        self.refused.load(Ordering::Relaxed)
    }

    /// Connections closed for idleness, since start.
    pub fn idle_closed(&self) -> u64 {
        self.idle_closed.load(Ordering::Relaxed)
    }

    /// The HTTP/2 ping period: well within the idle timeout, so a live client's
    /// answers keep its quiet streams open.
    pub fn keepalive_interval(&self) -> Duration {
        (self.idle / 3).min(Duration::from_secs(60))
    }

    /// A slot for a connection from `peer`, or `None` when the peer or the server
    /// is at its cap.
    fn admit(self: &Arc<Self>, peer: IpAddr) -> Option<Slot> {
        let mut by_peer = self.by_peer.lock().unwrap_or_else(|e| e.into_inner());
        let n = by_peer.get(&peer).copied().unwrap_or(0);
        let total = self.open.load(Ordering::Relaxed);
        if n >= self.per_peer || total >= self.max {
            drop(by_peer);
            self.refused.fetch_add(1, Ordering::Relaxed);
            self.warn_refused(peer, n, total);
            return None;
        }
        by_peer.insert(peer, n + 1);
        self.open.store(total + 1, Ordering::Relaxed);
        Some(Slot {
            conns: self.clone(),
            peer,
        })
    }

    /// Logs a refusal, at most once per [`WARN_EVERY`] with the count since.
    fn warn_refused(&self, peer: IpAddr, from_peer: usize, total: usize) {
        let mut w = self.warned.lock().unwrap_or_else(|e| e.into_inner());
        w.1 += 1;
        let now = Instant::now();
        if w.0.is_none_or(|at| now.duration_since(at) >= WARN_EVERY) {
            tracing::warn!(
                peer = %peer,
                from_peer,
                per_peer_cap = self.per_peer,
                open = total,
                cap = self.max,
                refused = w.1,
                "connection closed at accept: over max_connections_per_peer or max_connections (refused counts those since the last warning)"
            );
            *w = (Some(now), 0);
        }
    }

    /// A slot for one more Watch stream, or `None` at the cap.
    pub fn watch_slot(self: &Arc<Self>) -> Option<WatchSlot> {
        self.watch
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                (n < self.max_watch).then_some(n + 1)
            })
            .ok()
            .map(|_| WatchSlot(self.clone()))
    }

    /// The Watch cap.
    pub fn max_watch(&self) -> usize {
        self.max_watch
    }
}

/// A connection's place in the counts, given back on drop.
struct Slot {
    conns: Arc<Conns>,
    peer: IpAddr,
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut by_peer = self.conns.by_peer.lock().unwrap_or_else(|e| e.into_inner());
        match by_peer.get_mut(&self.peer) {
            Some(n) if *n > 1 => *n -= 1,
            _ => {
                by_peer.remove(&self.peer);
            }
        }
        self.conns.open.fetch_sub(1, Ordering::Relaxed);
    }
}

/// An open Watch stream's place in the count, given back on drop.
pub struct WatchSlot(Arc<Conns>);

impl Drop for WatchSlot {
    fn drop(&mut self) {
        self.0.watch.fetch_sub(1, Ordering::Relaxed);
    }
}

/// An admitted connection: the socket, its slot, and the idle clock.
pub struct Conn {
    io: TcpStream,
    slot: Slot,
    last_read: Instant,
    /// Fires at or after the idle deadline; moved on lazily, only when it fires
    /// (a read is then a field store, not a timer operation).
    timer: Pin<Box<Sleep>>,
}

impl Conn {
    fn idle_check(&mut self, cx: &mut Context<'_>) -> Poll<io::Error> {
        let idle = self.slot.conns.idle;
        while self.timer.as_mut().poll(cx).is_ready() {
            let deadline = self.last_read + idle;
            if Instant::now() >= deadline {
                self.slot.conns.idle_closed.fetch_add(1, Ordering::Relaxed);
                tracing::debug!(peer = %self.slot.peer, idle_s = idle.as_secs(), "idle connection closed");
                return Poll::Ready(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "no bytes from the peer within server.idle_timeout",
                ));
            }
            self.timer.as_mut().reset(deadline);
        }
        Poll::Pending
    }
}

impl Connected for Conn {
    // The plain TCP info, so that `Request::remote_addr` and anything reading
    // `TcpConnectInfo` see no difference.
    type ConnectInfo = TcpConnectInfo;

    fn connect_info(&self) -> TcpConnectInfo {
        self.io.connect_info()
    }
}

impl AsyncRead for Conn {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let me = self.get_mut();
        let before = buf.filled().len();
        match Pin::new(&mut me.io).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {
                if buf.filled().len() > before {
                    me.last_read = Instant::now();
                }
                Poll::Ready(Ok(()))
            }
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            // Nothing to read: the one moment idleness can be judged (hyper keeps a
            // read pending on every connection, so the timer is always armed).
            Poll::Pending => me.idle_check(cx).map(Err),
        }
    }
}

impl AsyncWrite for Conn {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}

/// The accepted connections tonic serves: admitted ones only, with Nagle's
/// algorithm off (tonic ignores its `tcp_nodelay` with an incoming stream, and a
/// small request would otherwise wait for the peer's delayed ACK) and TCP
/// keepalive on (tonic's `tcp_keepalive` is ignored the same way), so a peer that
/// vanished is found even when nothing is sent.
pub struct Incoming {
    listener: TcpListener,
    conns: Arc<Conns>,
    backoff: Option<Pin<Box<Sleep>>>,
    keepalive: socket2::TcpKeepalive,
}

impl Incoming {
    /// Accepts from `listener` under the caps of `conns`.
    pub fn new(listener: TcpListener, conns: Arc<Conns>) -> Incoming {
        let keepalive = socket2::TcpKeepalive::new()
            .with_time(Duration::from_secs(60))
            .with_interval(Duration::from_secs(10))
            .with_retries(6);
        Incoming {
            listener,
            conns,
            backoff: None,
            keepalive,
        }
    }

    fn wrap(&self, io: TcpStream, slot: Slot) -> Conn {
        if let Err(e) = io.set_nodelay(true) {
            tracing::debug!(error = %e, "TCP_NODELAY not set");
        }
        if let Err(e) = socket2::SockRef::from(&io).set_tcp_keepalive(&self.keepalive) {
            tracing::debug!(error = %e, "TCP keepalive not set");
        }
        let now = Instant::now();
        Conn {
            io,
            slot,
            last_read: now,
            timer: Box::pin(tokio::time::sleep_until(now + self.conns.idle)),
        }
    }
}

impl Stream for Incoming {
    type Item = io::Result<Conn>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let me = self.get_mut();
        loop {
            if let Some(b) = me.backoff.as_mut() {
                if b.as_mut().poll(cx).is_pending() {
                    return Poll::Pending;
                }
                me.backoff = None;
            }
            match me.listener.poll_accept(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Ok((io, peer))) => match me.conns.admit(peer.ip()) {
                    Some(slot) => return Poll::Ready(Some(Ok(me.wrap(io, slot)))),
                    // Dropped: closed at once; the next one is looked at.
                    None => drop(io),
                },
                Poll::Ready(Err(e)) => {
                    // Out of descriptors (or another passing error): the pending
                    // connection stays queued; pause rather than spin, serve on.
                    tracing::warn!(error = %e, "accept failed; pausing 100 ms");
                    me.backoff = Some(Box::pin(tokio::time::sleep(ACCEPT_BACKOFF)));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn section(max: usize, per_peer: usize, watch: usize) -> ServerSection {
        ServerSection {
            max_connections: max,
            max_connections_per_peer: per_peer,
            max_watch_streams: watch,
            ..ServerSection::default()
        }
    }

    #[test]
    fn the_cap_follows_the_descriptor_limit() {
        let s = section(4096, 256, 10);
        assert_eq!(effective_max(&s, 65536), 4096);
        assert_eq!(effective_max(&s, 1024), 1024 - 64);
        assert_eq!(effective_max(&s, 10), 1);
        let c = Conns::with_nofile(&section(4096, 3000, 10), 1024);
        assert_eq!((c.max, c.per_peer), (960, 959));
    }

    #[test]
    fn slots_are_counted_per_peer_and_in_all_and_given_back() {
        let c = Arc::new(Conns::with_nofile(&section(3, 2, 10), 65536));
        let a: IpAddr = [10, 0, 0, 1].into();
        let b: IpAddr = [10, 0, 0, 2].into();
        let a1 = c.admit(a).expect("first of a");
        let a2 = c.admit(a).expect("second of a");
        assert!(c.admit(a).is_none(), "a is at its cap");
        let b1 = c.admit(b).expect("b has its own share");
        assert!(c.admit(b).is_none(), "the server is at its cap");
        assert_eq!((c.open(), c.refused()), (3, 2));
        drop(a1);
        assert_eq!(c.open(), 2);
        let a3 = c.admit(a).expect("a's slot came back");
        drop((a2, a3, b1));
        assert_eq!(c.open(), 0);
        assert!(c.by_peer.lock().expect("lock").is_empty());
    }

    #[test]
    fn watch_slots_stop_at_the_cap_and_come_back() {
        let c = Arc::new(Conns::with_nofile(&section(10, 5, 2), 65536));
        let w1 = c.watch_slot().expect("1");
        let _w2 = c.watch_slot().expect("2");
        assert!(c.watch_slot().is_none());
        assert_eq!(c.watch_streams(), 2);
        drop(w1);
        assert!(c.watch_slot().is_some());
    }

    #[tokio::test(start_paused = true)]
    async fn a_silent_connection_is_closed_after_the_idle_timeout_and_a_talking_one_is_not() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut s = section(10, 5, 10);
        s.idle_timeout = 30;
        let conns = Arc::new(Conns::with_nofile(&s, 65536));
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let mut incoming = Incoming::new(listener, conns.clone());
        let mut talker = TcpStream::connect(addr).await.expect("connect");
        let mut talking = next(&mut incoming).await;
        let _silent_peer = TcpStream::connect(addr).await.expect("connect");
        let mut silent = next(&mut incoming).await;
        assert_eq!(conns.open(), 2);
        let mut buf = [0u8; 8];
        // 20 s, a byte, 20 s: never 30 s without one.
        for _ in 0..2 {
            tokio::time::sleep(Duration::from_secs(20)).await;
            talker.write_all(b"x").await.expect("write");
            assert_eq!(talking.read(&mut buf).await.expect("read"), 1);
        }
        let e = silent.read(&mut buf).await.expect_err("idle");
        assert_eq!(e.kind(), io::ErrorKind::TimedOut);
        assert_eq!(conns.idle_closed(), 1);
        drop(silent);
        assert_eq!(conns.open(), 1);
        // Once the talker falls silent, it goes too: idle_timeout after its last byte.
        let t0 = Instant::now();
        let e = talking.read(&mut buf).await.expect_err("idle");
        assert_eq!(e.kind(), io::ErrorKind::TimedOut);
        assert_eq!(t0.elapsed().as_secs(), 30);
        assert_eq!(conns.idle_closed(), 2);
    }

    async fn next(i: &mut Incoming) -> Conn {
        use tokio_stream::StreamExt;
        i.next().await.expect("a connection").expect("accepted")
    }
}
