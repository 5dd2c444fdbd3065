//! A small HTTP/1.1 listener for `/metrics`, health probes and allotd's pages: an
//! axum router on hyper, plain or over TLS, at most so many connections at once, a
//! deadline for the handshake and a request's headers and one for the whole
//! connection, no keep-alive. A client that sends nothing, or reads slowly, is cut
//! off and never holds every slot.

use std::sync::Arc;
use std::time::Duration;

/// What one client may hold.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Most connections served at once; more wait in the listen backlog.
    pub connections: usize,
    /// Longest a client may take to send its request headers.
    pub headers: Duration,
    /// Longest one connection lives, request and answer together.
    pub connection: Duration,
}

/// The limits of a scrape endpoint: 64 at once, 5 s for headers, 30 s in all.
pub const SCRAPE: Limits = Limits {
    connections: 64,
    headers: Duration::from_secs(5),
    connection: Duration::from_secs(30),
};

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

/// Serves `router` on `listener` within `limits` until the task is dropped: over
/// TLS when `tls` is given (a client that does not finish its handshake within the
/// header deadline is dropped), else plain.
pub async fn serve(
    listener: tokio::net::TcpListener,
    router: axum::Router,
    limits: Limits,
    tls: Option<tokio_rustls::TlsAcceptor>,
) {
    let slots = Arc::new(tokio::sync::Semaphore::new(limits.connections));
    loop {
        let Ok(permit) = slots.clone().acquire_owned().await else {
            return;
        };
        let stream = match listener.accept().await {
            Ok((s, _)) => s,
            Err(e) => {
                // Out of descriptors and the like: wait rather than spin.
                tracing::warn!(error = %e, "http: accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let router = router.clone();
        let tls = tls.clone();
        tokio::spawn(async move {
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
            let _ = tokio::time::timeout(limits.connection, work).await;
            drop(permit);
        });
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
