//! A small HTTP/1.1 listener for `/metrics`, health probes and allotd's pages: an
//! axum router on hyper, plain or over TLS, at most so many connections at once and
//! a share of them per peer address and per /24 (/64) ([`crate::admission`]: a
//! newcomer from a lighter peer takes the oldest slot of the heaviest), a deadline
//! for the handshake and a request's headers, one for its body, one for the whole
//! connection, no keep-alive. A client that sends nothing, or sends or reads
//! slowly, is cut off and never holds every slot, nor delays a probe.

use std::sync::Arc;
use std::time::Duration;

/// What one client may hold.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Most connections served at once; one more from a peer that holds no more
    /// than the heaviest takes that one's oldest slot, else it is closed at once.
    pub connections: usize,
    /// Most of those from one address (a prefix holds four times as many).
    pub per_peer: usize,
    /// Longest a client may take to send its request headers, and then its body.
    pub headers: Duration,
    /// Longest one connection lives, request and answer together.
    pub connection: Duration,
}

/// The limits of a scrape endpoint: 64 at once, 8 per address, 5 s for headers
/// and 5 s for a body, 30 s in all.
pub const SCRAPE: Limits = Limits {
    connections: 64,
    per_peer: 8,
    headers: Duration::from_secs(5),
    connection: Duration::from_secs(30),
};

/// Most bytes of a request body: the pages' forms are a few hundred.
pub const MAX_BODY: usize = 64 << 10;

/// The peer address of the connection a request came on (an extension of every
/// request [`serve`] hands its router).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Peer(pub std::net::SocketAddr);

impl Limits {
    /// The admission caps these limits make.
    fn caps(&self) -> crate::admission::Caps {
        let per_peer = self.per_peer.clamp(1, self.connections.max(1));
        crate::admission::Caps {
            max: self.connections.max(1),
            per_peer,
            per_prefix: (4 * per_peer).min(self.connections.max(1)),
            // Nothing authenticates at the listener: every connection is pending.
            per_identity: 0,
        }
    }
}

/// Why a TLS listener could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// The certificate or key PEM does not parse.
    #[error("{what}: {message}")]
    Pem {
        /// Which of the two.
        what: &'static str,
        /// The parser's word.
        message: String,
    },
    /// rustls refused the pair.
    #[error("certificate and key: {0}")]
    Config(String),
}

/// A TLS acceptor for HTTP/1.1 with this certificate chain and key (PEM).
pub fn tls_acceptor(cert_pem: &str, key_pem: &str) -> Result<tokio_rustls::TlsAcceptor, TlsError> {
    use tokio_rustls::rustls;
    use tokio_rustls::rustls::pki_types::pem::PemObject;
    use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let certs = CertificateDer::pem_slice_iter(cert_pem.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| TlsError::Pem {
            what: "certificate",
            message: e.to_string(),
        })?;
    if certs.is_empty() {
        return Err(TlsError::Pem {
            what: "certificate",
            message: "no certificate in the PEM".into(),
        });
    }
    let key = PrivateKeyDer::from_pem_slice(key_pem.as_bytes()).map_err(|e| TlsError::Pem {
        what: "key",
        message: e.to_string(),
    })?;
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let mut cfg = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError::Config(e.to_string()))?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .map_err(|e| TlsError::Config(e.to_string()))?;
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(tokio_rustls::TlsAcceptor::from(std::sync::Arc::new(cfg)))
}

/// The connections holding slots; each one's handle ends it when it is evicted.
type Slots = Arc<std::sync::Mutex<crate::admission::Table<Arc<tokio::sync::Notify>>>>;

/// A slot, given back when the connection's task ends.
struct Slot {
    slots: Slots,
    id: u64,
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.slots
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .release(self.id);
    }
}

/// Serves `router` on `listener` within `limits` until the task is dropped: over
/// TLS when `tls` is given (a client that does not finish its handshake within the
/// header deadline is dropped), else plain. Every request carries its [`Peer`].
pub async fn serve(
    listener: tokio::net::TcpListener,
    router: axum::Router,
    limits: Limits,
    tls: Option<tokio_rustls::TlsAcceptor>,
) {
    let slots: Slots = Arc::new(std::sync::Mutex::new(crate::admission::Table::new(
        limits.caps(),
    )));
    let body_deadline = limits.headers;
    let router = router.layer(axum::middleware::from_fn(
        move |req: axum::extract::Request, next: axum::middleware::Next| {
            whole_body_within(body_deadline, req, next)
        },
    ));
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(s) => s,
            Err(e) => {
                // Out of descriptors and the like: wait rather than spin.
                tracing::warn!(error = %e, "http: accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let end = Arc::new(tokio::sync::Notify::new());
        let admitted = slots
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .admit(peer.ip(), end.clone());
        let id = match admitted {
            crate::admission::Admitted::In { id, evicted } => {
                if let Some(e) = evicted {
                    e.notify_one();
                }
                id
            }
            crate::admission::Admitted::Refused(over) => {
                tracing::debug!(peer = %peer, cap = over.setting(), "http: connection refused");
                continue;
            }
        };
        let slot = Slot {
            slots: slots.clone(),
            id,
        };
        let router = router.clone().layer(axum::Extension(Peer(peer)));
        let tls = tls.clone();
        tokio::spawn(async move {
            let _slot = slot;
            let work = async move {
                match tls {
                    None => one_connection(stream, router, limits).await,
                    Some(acceptor) => {
                        if let Ok(Ok(s)) =
                            tokio::time::timeout(limits.headers, acceptor.accept(stream)).await
                        {
                            one_connection(s, router, limits).await;
                        }
                    }
                }
            };
            tokio::select! {
                _ = tokio::time::timeout(limits.connection, work) => {}
                () = end.notified() => {}
            }
        });
    }
}

/// Reads a request's whole body (at most [`MAX_BODY`]) within `deadline` before
/// the handler sees it: a body trickled byte by byte is answered 408 then.
async fn whole_body_within(
    deadline: Duration,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    use axum::http::StatusCode;
    use axum::response::IntoResponse;
    let (parts, body) = req.into_parts();
    match tokio::time::timeout(deadline, axum::body::to_bytes(body, MAX_BODY)).await {
        Ok(Ok(bytes)) => {
            next.run(axum::extract::Request::from_parts(
                parts,
                axum::body::Body::from(bytes),
            ))
            .await
        }
        Ok(Err(_)) => (
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("a request body is at most {MAX_BODY} bytes\n"),
        )
            .into_response(),
        Err(_) => (
            StatusCode::REQUEST_TIMEOUT,
            format!(
                "the request body took more than {} s\n",
                deadline.as_secs_f32()
            ),
        )
            .into_response(),
    }
}

/// One request on one connection (plain or TLS), within the header deadline.
async fn one_connection<S>(stream: S, router: axum::Router, limits: Limits)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let service = hyper_util::service::TowerToHyperService::new(router);
    let _ = hyper::server::conn::http1::Builder::new()
        .timer(hyper_util::rt::TokioTimer::new())
        .header_read_timeout(limits.headers)
        .keep_alive(false)
        .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
        .await;
}

/// Whether two secrets are equal, in time that does not depend on where they differ.
fn same_secret(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// `GET /metrics` answering what `render` writes (in Prometheus text), run off the
/// async workers since it takes locks; a render that failed is a failed scrape
/// (500), never an empty one. With `token`, a scrape must bring
/// `Authorization: Bearer TOKEN` (Prometheus' `authorization: credentials_file`)
/// or is refused with 401. Other routes are added to the router it returns.
pub fn metrics<F>(render: F, token: Option<std::sync::Arc<str>>) -> axum::Router
where
    F: Fn() -> String + Clone + Send + Sync + 'static,
{
    use crate::exposition::CONTENT_TYPE;
    use axum::http::{header, StatusCode};
    axum::Router::new().route(
        "/metrics",
        axum::routing::get(move |headers: axum::http::HeaderMap| {
            let render = render.clone();
            let token = token.clone();
            async move {
                if let Some(want) = token {
                    let shown = headers
                        .get(header::AUTHORIZATION)
                        .and_then(|v| v.to_str().ok())
                        .and_then(|v| v.strip_prefix("Bearer "))
                        .unwrap_or("");
                    if !same_secret(shown.trim().as_bytes(), want.as_bytes()) {
                        return (
                            StatusCode::UNAUTHORIZED,
                            [(header::CONTENT_TYPE, CONTENT_TYPE)],
                            "metrics need `Authorization: Bearer TOKEN` with the token in [server] metrics_token_file\n".to_string(),
                        );
                    }
                }
                match tokio::task::spawn_blocking(render).await {
                    Ok(body) => (StatusCode::OK, [(header::CONTENT_TYPE, CONTENT_TYPE)], body),
                    Err(e) => (
                        StatusCode::INTERNAL_SERVER_ERROR,
                        [(header::CONTENT_TYPE, CONTENT_TYPE)],
                        format!("metrics could not be rendered: {e}\n"),
                    ),
                }
            }
        }),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A connection from `ip` (any of 127.0.0.0/8) to `to`.
    async fn from(ip: [u8; 4], to: std::net::SocketAddr) -> tokio::net::TcpStream {
        let s = tokio::net::TcpSocket::new_v4().expect("socket");
        s.bind((std::net::Ipv4Addr::from(ip), 0).into())
            .expect("bind a loopback address");
        s.connect(to).await.expect("connect")
    }

    async fn answer(mut s: tokio::net::TcpStream) -> String {
        use tokio::io::AsyncReadExt;
        let mut out = Vec::new();
        let _ = s.read_to_end(&mut out).await;
        String::from_utf8_lossy(&out).into_owned()
    }

    #[tokio::test]
    async fn slow_bodies_from_many_addresses_never_delay_a_probe() {
        use tokio::io::AsyncWriteExt;
        let router = axum::Router::new()
            .route("/healthz", axum::routing::get(|| async { "ok\n" }))
            .route(
                "/login",
                axum::routing::post(|body: String| async move { body }),
            );
        let l = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = l.local_addr().expect("addr");
        let limits = Limits {
            headers: Duration::from_secs(2),
            ..SCRAPE
        };
        let server = tokio::spawn(serve(l, router, limits, None));
        // 80 POSTs from 10 addresses of one /24, each sending one byte of the
        // thousand its headers promise, and then nothing.
        let mut slow = Vec::new();
        for i in 0..80u8 {
            let mut s = from([127, 0, 0, 2 + i % 10], addr).await;
            let _ = s
                .write_all(b"POST /login HTTP/1.1\r\nhost: x\r\ncontent-length: 1000\r\n\r\nt")
                .await;
            slow.push(s);
        }
        for probe in 0..5 {
            let t = std::time::Instant::now();
            let mut s = from([127, 0, 0, 1], addr).await;
            s.write_all(b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n")
                .await
                .expect("write");
            let r = tokio::time::timeout(Duration::from_secs(1), answer(s))
                .await
                .expect("the probe is answered within a second");
            assert!(
                r.starts_with("HTTP/1.1 200") && r.ends_with("ok\n"),
                "probe {probe}: {r}"
            );
            assert!(t.elapsed() < Duration::from_secs(1), "{:?}", t.elapsed());
        }
        // The slow ones: closed at once (over a share), or answered 408 once the
        // body deadline passed; none holds on.
        let t = std::time::Instant::now();
        let mut timed_out = 0;
        for s in slow {
            let r = tokio::time::timeout(Duration::from_secs(10), answer(s))
                .await
                .expect("every slow POST ends");
            timed_out += usize::from(r.starts_with("HTTP/1.1 408"));
        }
        assert!(
            timed_out >= 1 && t.elapsed() < Duration::from_secs(10),
            "{timed_out}"
        );
        server.abort();
    }

    #[test]
    fn the_caps_share_the_slots_by_peer_and_prefix() {
        let c = SCRAPE.caps();
        assert_eq!((c.max, c.per_peer, c.per_prefix), (64, 8, 32));
        let tiny = Limits {
            connections: 4,
            per_peer: 16,
            ..SCRAPE
        }
        .caps();
        assert_eq!((tiny.max, tiny.per_peer, tiny.per_prefix), (4, 4, 4));
    }

    #[test]
    fn secrets_compare_equal_only_when_equal() {
        assert!(same_secret(b"abc", b"abc"));
        assert!(!same_secret(b"abc", b"abd"));
        assert!(!same_secret(b"abc", b"abcd"));
        assert!(!same_secret(b"", b"a"));
    }

    #[test]
    fn a_pem_that_is_not_one_is_refused_naming_which() {
        let e = tls_acceptor("nothing", "nothing")
            .err()
            .map(|e| e.to_string());
        assert!(
            e.as_deref().is_some_and(|e| e.starts_with("certificate")),
            "{e:?}"
        );
    }
}
