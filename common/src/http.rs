//! A small HTTP/1.1 listener for `/metrics` and health probes: an axum router on
//! hyper, at most so many connections at once, a deadline for a request's headers
//! and one for the whole connection, no keep-alive. A scraper that sends nothing,
//! or reads slowly, is cut off and never holds every slot.

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

/// Serves `router` on `listener` within `limits` until the task is dropped.
pub async fn serve(listener: tokio::net::TcpListener, router: axum::Router, limits: Limits) {
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
        let service = hyper_util::service::TowerToHyperService::new(router.clone());
        tokio::spawn(async move {
            let conn = hyper::server::conn::http1::Builder::new()
                .timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(limits.headers)
                .keep_alive(false)
                .serve_connection(hyper_util::rt::TokioIo::new(stream), service);
            let _ = tokio::time::timeout(limits.connection, conn).await;
            drop(permit);
        });
    }
}

/// `GET /metrics` answering what `render` writes (in Prometheus text), run off the
/// async workers since it takes locks; a render that failed is a failed scrape
/// (500), never an empty one. Other routes are added to the router it returns.
pub fn metrics<F>(render: F) -> axum::Router
where
    F: Fn() -> String + Clone + Send + Sync + 'static,
{
    use crate::exposition::CONTENT_TYPE;
    use axum::http::{header, StatusCode};
    axum::Router::new().route(
        "/metrics",
        axum::routing::get(move || {
            let render = render.clone();
            async move {
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
