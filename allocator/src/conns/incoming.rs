//! The accepted connections tonic serves, each with its slot and its idle clock.

use super::{Conns, Slot};
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::{Instant, Sleep};
use tokio_stream::Stream;
use tonic::transport::server::Connected;

/// How long the accept loop pauses after an error such as EMFILE: the listener
/// stays readable, so retrying at once would spin a core.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);
/// Bytes that came just before an idle deadline may be a request hyper has not
/// handed over yet: the deadline is put off this long, once per deadline.
const ARRIVAL_GRACE: Duration = Duration::from_secs(1);

/// What the requests of one connection did, written by [`super::TrackRequests`]
/// and read by the connection's idle clock; and whether it has authenticated or
/// was evicted, written by [`super::Conns`].
pub(crate) struct Activity {
    /// Its slot in the admission table.
    id: AtomicU64,
    /// Requests open now (a stream is open until its response body is dropped).
    open: AtomicUsize,
    /// Whether any request has begun.
    began: AtomicBool,
    /// Whether a request showed a valid credential: no longer pending.
    authed: AtomicBool,
    /// Whether a newcomer took its slot: to be closed at once.
    evicted: AtomicBool,
    /// The task reading the connection, woken when it is evicted.
    reader: Mutex<Option<Waker>>,
    /// When the last request began or ended, in ms since `since`.
    last_ms: AtomicU64,
    since: Instant,
}

impl Activity {
    pub(super) fn new(since: Instant) -> Activity {
        Activity {
            id: AtomicU64::new(0),
            open: AtomicUsize::new(0),
            began: AtomicBool::new(false),
            authed: AtomicBool::new(false),
            evicted: AtomicBool::new(false),
            reader: Mutex::new(None),
            last_ms: AtomicU64::new(0),
            since,
        }
    }

    pub(super) fn set_id(&self, id: u64) {
        self.id.store(id, Ordering::Relaxed);
    }

    pub(super) fn id(&self) -> u64 {
        self.id.load(Ordering::Relaxed)
    }

    pub(super) fn authed(&self) -> bool {
        self.authed.load(Ordering::Acquire)
    }

    pub(super) fn set_authed(&self) {
        self.authed.store(true, Ordering::Release);
    }

    pub(super) fn evicted(&self) -> bool {
        self.evicted.load(Ordering::Acquire)
    }

    /// Closes the connection at its next read: its slot was given to a newcomer.
    pub(super) fn evict(&self) {
        self.evicted.store(true, Ordering::Release);
        let waker = self.reader.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(w) = waker {
            w.wake();
        }
    }

    /// Remembers the task to wake on eviction (only while pending: an
    /// authenticated connection is never evicted).
    fn watch_for_eviction(&self, cx: &Context<'_>) {
        let mut r = self.reader.lock().unwrap_or_else(|e| e.into_inner());
        if !r.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
            *r = Some(cx.waker().clone());
        }
    }

    fn stamp(&self) {
        let ms = u64::try_from(self.since.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.last_ms.store(ms, Ordering::Relaxed);
    }

    /// A request began.
    pub(super) fn begin(&self) {
        self.open.fetch_add(1, Ordering::Relaxed);
        self.began.store(true, Ordering::Relaxed);
        self.stamp();
    }

    /// A request ended (its response sent or abandoned).
    pub(super) fn end(&self) {
        self.stamp();
        self.open.fetch_sub(1, Ordering::Relaxed);
    }
}

/// What tonic puts in each request's extensions for a connection (wrapped in
/// `TlsConnectInfo` under TLS): the connection's activity. tonic's
/// `Request::remote_addr` and `peer_certs` look for its own `TcpConnectInfo`, so
/// they find nothing: certificates are read with [`super::peer_certs`].
#[derive(Clone)]
pub struct ConnInfo {
    pub(super) activity: Arc<Activity>,
}

/// An admitted connection: the socket, its slot, and the idle clock.
pub struct Conn {
    io: TcpStream,
    slot: Slot,
    activity: Arc<Activity>,
    accepted: Instant,
    last_read: Instant,
    /// The deadline the arrival grace was given for, if it was.
    graced: Option<Instant>,
    /// Fires at or after the idle deadline; moved on lazily, only when it fires
    /// (a read is then a field store, not a timer operation).
    timer: Pin<Box<Sleep>>,
}

impl Conn {
    /// When the connection is idle, if nothing changes: never while a request is
    /// open; before the first, the handshake and first-request deadlines; then
    /// `idle_timeout` after the last request began or ended.
    fn deadline(&self) -> Option<Instant> {
        let conns = &self.slot.conns;
        let a = &self.activity;
        if !a.authed() {
            // Whatever it has open: a request that never shows a credential (its
            // headers sent, never a body) keeps no slot.
            return Some(self.accepted + conns.auth_deadline());
        }
        if a.open.load(Ordering::Relaxed) > 0 {
            return None;
        }
        Some(a.since + Duration::from_millis(a.last_ms.load(Ordering::Relaxed)) + conns.idle)
    }

    fn idle_check(&mut self, cx: &mut Context<'_>) -> Poll<io::Error> {
        let conns = self.slot.conns.clone();
        while self.timer.as_mut().poll(cx).is_ready() {
            let now = Instant::now();
            let next = match self.deadline() {
                None => now + conns.idle,
                Some(d) if now < d => d,
                Some(d) if self.graced != Some(d) && now < self.last_read + ARRIVAL_GRACE => {
                    self.graced = Some(d);
                    now + ARRIVAL_GRACE
                }
                Some(_) => {
                    conns.idle_closed.fetch_add(1, Ordering::Relaxed);
                    let a = &self.activity;
                    let (began, authed) = (a.began.load(Ordering::Relaxed), a.authed());
                    tracing::debug!(peer = %self.slot.peer, began, authed, "connection closed by its deadline");
                    return Poll::Ready(io::Error::new(
                        io::ErrorKind::TimedOut,
                        if authed {
                            "no request within server.idle_timeout"
                        } else if began {
                            "not authenticated within server.handshake_timeout + first_request_timeout"
                        } else {
                            "no request within server.first_request_timeout"
                        },
                    ));
                }
            };
            self.timer.as_mut().reset(next);
        }
        Poll::Pending
    }
}

/// The error an evicted connection ends with.
fn evicted() -> io::Error {
    io::Error::new(
        io::ErrorKind::ConnectionAborted,
        "not authenticated, and its slot was given to a newcomer (server.max_connections)",
    )
}

impl Connected for Conn {
    type ConnectInfo = ConnInfo;

    fn connect_info(&self) -> ConnInfo {
        ConnInfo {
            activity: self.activity.clone(),
        }
    }
}

impl AsyncRead for Conn {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let me = self.get_mut();
        if me.activity.evicted() {
            return Poll::Ready(Err(evicted()));
        }
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
            Poll::Pending => {
                if !me.activity.authed() {
                    me.activity.watch_for_eviction(cx);
                    if me.activity.evicted() {
                        return Poll::Ready(Err(evicted()));
                    }
                }
                me.idle_check(cx).map(Err)
            }
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

    fn wrap(&self, io: TcpStream, slot: Slot, now: Instant) -> Conn {
        if let Err(e) = io.set_nodelay(true) {
            tracing::debug!(error = %e, "TCP_NODELAY not set");
        }
        if let Err(e) = socket2::SockRef::from(&io).set_tcp_keepalive(&self.keepalive) {
            tracing::debug!(error = %e, "TCP keepalive not set");
        }
        let deadline = now + self.conns.auth_deadline();
        Conn {
            io,
            activity: slot.activity.clone(),
            slot,
            accepted: now,
            last_read: now,
            graced: None,
            timer: Box::pin(tokio::time::sleep_until(deadline)),
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
                Poll::Ready(Ok((io, peer))) => match me.conns.admit(peer.ip(), Instant::now()) {
                    Some(slot) => {
                        let now = slot.activity.since;
                        return Poll::Ready(Some(Ok(me.wrap(io, slot, now))));
                    }
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
    use super::super::tests::section;
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    async fn next(i: &mut Incoming) -> Conn {
        use tokio_stream::StreamExt;
        i.next().await.expect("a connection").expect("accepted")
    }

    /// A listener under `s`'s caps, and its address.
    async fn listen(
        s: &crate::config::ServerSection,
    ) -> (Incoming, Arc<Conns>, std::net::SocketAddr) {
        let conns = Arc::new(Conns::with_nofile(s, 65536));
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        (Incoming::new(listener, conns.clone()), conns, addr)
    }

    #[tokio::test(start_paused = true)]
    async fn bytes_without_a_request_keep_nothing_open() {
        let mut s = section(10, 5, 10);
        (s.handshake_timeout, s.first_request_timeout) = (10, 10);
        let (mut incoming, conns, addr) = listen(&s).await;
        let mut talker = TcpStream::connect(addr).await.expect("connect");
        let mut talking = next(&mut incoming).await;
        let t0 = Instant::now();
        // A byte every 3 s (a trickled handshake, pings) begins no request: closed
        // at the handshake and first-request deadlines, 20 s after accept, and
        // never later than one arrival grace past them.
        let mut buf = [0u8; 8];
        let e = loop {
            talker.write_all(b"x").await.expect("write");
            assert_eq!(talking.read(&mut buf).await.expect("the byte"), 1);
            // Then waiting for more, as hyper always does.
            match tokio::time::timeout(Duration::from_secs(3), talking.read(&mut buf)).await {
                Err(_) => {}
                Ok(Ok(n)) => panic!("{n} bytes nobody sent"),
                Ok(Err(e)) => break e,
            }
        };
        assert_eq!(e.kind(), io::ErrorKind::TimedOut);
        assert!(e.to_string().contains("first_request_timeout"), "{e}");
        let after = t0.elapsed();
        assert!(
            after >= Duration::from_secs(20) && after <= Duration::from_secs(21),
            "{after:?}"
        );
        assert_eq!(conns.idle_closed(), 1);
        drop(talking);
        assert_eq!(conns.open(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn an_open_request_keeps_the_connection_and_idleness_counts_from_its_end() {
        let mut s = section(10, 5, 10);
        s.idle_timeout = 30;
        let (mut incoming, conns, addr) = listen(&s).await;
        let _peer = TcpStream::connect(addr).await.expect("connect");
        let mut conn = next(&mut incoming).await;
        let activity = conn.connect_info().activity;
        activity.begin();
        conns.authenticate(&activity, "ana").expect("share");
        // A stream open for 10 minutes with nothing on the wire: kept.
        let mut buf = [0u8; 8];
        let read = tokio::time::timeout(Duration::from_secs(600), conn.read(&mut buf)).await;
        assert!(read.is_err(), "still open while a request is");
        activity.end();
        let t0 = Instant::now();
        let e = conn.read(&mut buf).await.expect_err("idle");
        assert_eq!(e.kind(), io::ErrorKind::TimedOut);
        assert!(e.to_string().contains("idle_timeout"), "{e}");
        // At the next look after the deadline: the timer was armed for the stream.
        let after = t0.elapsed();
        assert!(
            after >= Duration::from_secs(30) && after <= Duration::from_secs(60),
            "{after:?}"
        );
        assert_eq!(conns.idle_closed(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn requests_now_and_then_keep_a_connection_open() {
        let mut s = section(10, 5, 10);
        s.idle_timeout = 30;
        let (mut incoming, conns, addr) = listen(&s).await;
        let _peer = TcpStream::connect(addr).await.expect("connect");
        let mut conn = next(&mut incoming).await;
        let activity = conn.connect_info().activity;
        let mut buf = [0u8; 8];
        // A short request every 20 s for 5 minutes: never 30 s without one.
        for _ in 0..15 {
            activity.begin();
            conns.authenticate(&activity, "ana").expect("share");
            activity.end();
            let read = tokio::time::timeout(Duration::from_secs(20), conn.read(&mut buf)).await;
            assert!(read.is_err(), "kept between requests");
        }
        assert_eq!(conns.idle_closed(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn an_open_request_without_a_credential_keeps_no_slot() {
        let mut s = section(10, 5, 10);
        (s.handshake_timeout, s.first_request_timeout, s.idle_timeout) = (5, 5, 300);
        let (mut incoming, conns, addr) = listen(&s).await;
        let _peer = TcpStream::connect(addr).await.expect("connect");
        let mut conn = next(&mut incoming).await;
        let activity = conn.connect_info().activity;
        let t0 = Instant::now();
        // Headers of a request that never sends its body (or its credential).
        activity.begin();
        let mut buf = [0u8; 8];
        let e = conn.read(&mut buf).await.expect_err("closed");
        assert_eq!(e.kind(), io::ErrorKind::TimedOut);
        assert!(e.to_string().contains("not authenticated"), "{e}");
        let after = t0.elapsed();
        assert!(
            after >= Duration::from_secs(10) && after <= Duration::from_secs(11),
            "{after:?}"
        );
        drop(conn);
        assert_eq!((conns.open(), conns.pending()), (0, 0));
    }

    #[tokio::test]
    async fn an_evicted_connection_ends_its_waiting_read_at_once() {
        let s = section(3, 1, 10);
        let (mut incoming, conns, addr) = listen(&s).await;
        let from = |a: &str| {
            let sock = tokio::net::TcpSocket::new_v4().expect("socket");
            sock.bind(format!("{a}:0").parse().expect("addr"))
                .expect("bind");
            sock.connect(addr)
        };
        let _a = from("127.0.0.1").await.expect("connect");
        let mut first = next(&mut incoming).await;
        let reading = tokio::spawn(async move {
            let mut buf = [0u8; 8];
            let t0 = Instant::now();
            (
                first.read(&mut buf).await.expect_err("evicted"),
                t0.elapsed(),
            )
        });
        tokio::task::yield_now().await;
        // An authenticated second and a pending third fill the server; a fourth,
        // from another prefix, takes the slot of the oldest pending connection of
        // the heaviest prefix: the first's.
        let _b = from("127.0.0.2").await.expect("connect");
        let second = next(&mut incoming).await;
        conns
            .authenticate(&second.connect_info().activity, "ana")
            .expect("share");
        let _c = from("127.0.0.3").await.expect("connect");
        let _third = next(&mut incoming).await;
        let _d = from("127.0.1.1").await.expect("connect");
        let _fourth = next(&mut incoming).await;
        let (e, after) = reading.await.expect("reader");
        assert_eq!(e.kind(), io::ErrorKind::ConnectionAborted, "{e}");
        assert!(after < Duration::from_secs(1), "{after:?}");
        assert_eq!((conns.open(), conns.evicted()), (3, 1));
    }
}
