//! The accepted connections tonic serves, each with its slot and its idle clock.

use super::{Conns, Slot};
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
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
/// and read by the connection's idle clock.
pub(super) struct Activity {
    /// Requests open now (a stream is open until its response body is dropped).
    open: AtomicUsize,
    /// Whether any request has begun.
    began: AtomicBool,
    /// When the last request began or ended, in ms since `since`.
    last_ms: AtomicU64,
    since: Instant,
}

impl Activity {
    fn new(since: Instant) -> Activity {
        Activity {
            open: AtomicUsize::new(0),
            began: AtomicBool::new(false),
            last_ms: AtomicU64::new(0),
            since,
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
        if a.open.load(Ordering::Relaxed) > 0 {
            return None;
        }
        if !a.began.load(Ordering::Relaxed) {
            return Some(self.accepted + conns.handshake + conns.first_request);
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
                    let began = self.activity.began.load(Ordering::Relaxed);
                    tracing::debug!(peer = %self.slot.peer, began, "connection closed: no request open");
                    return Poll::Ready(io::Error::new(
                        io::ErrorKind::TimedOut,
                        if began {
                            "no request within server.idle_timeout"
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
        let c = &self.conns;
        Conn {
            io,
            slot,
            activity: Arc::new(Activity::new(now)),
            accepted: now,
            last_read: now,
            graced: None,
            timer: Box::pin(tokio::time::sleep_until(
                now + c.handshake + c.first_request,
            )),
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
            activity.end();
            let read = tokio::time::timeout(Duration::from_secs(20), conn.read(&mut buf)).await;
            assert!(read.is_err(), "kept between requests");
        }
        assert_eq!(conns.idle_closed(), 0);
    }
}
