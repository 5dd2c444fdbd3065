//! The allotd process: binds its ports first (a busy port fails at once), runs the
//! gRPC services, the admin socket, `/metrics` and the scheduling loop around one
//! [`Server`], and stops on SIGTERM/SIGINT with the ports released.

use crate::config::ServerConfig;
use crate::serve::Server;
use anyhow::Context;
use std::time::Duration;

/// allotd's ports, bound before anything else starts, so a busy port fails at once.
pub struct Bound {
    /// gRPC.
    pub grpc: tokio::net::TcpListener,
    /// `/metrics`, unless disabled.
    pub metrics: Option<tokio::net::TcpListener>,
    /// The admin socket (`STATE_DIR/admin.sock`, 0600).
    pub admin: tokio::net::UnixListener,
}

/// Where the admin socket of an allotd with `state_dir` is.
pub fn admin_socket_path(state_dir: &std::path::Path) -> std::path::PathBuf {
    state_dir.join("admin.sock")
}

impl Bound {
    /// Binds `server.listen` and `server.metrics_listen` (port 0 picks a free one).
    pub async fn bind(cfg: &ServerConfig) -> anyhow::Result<Bound> {
        let addr: std::net::SocketAddr = cfg.server.listen.parse().context("server.listen")?;
        let grpc = tokio::net::TcpListener::bind(addr).await.with_context(|| {
            format!("binding {addr} (server.listen): is another allotd running? pick another port with --listen")
        })?;
        let metrics = if cfg.server.metrics_listen.is_empty() {
            None
        } else {
            let m = &cfg.server.metrics_listen;
            Some(tokio::net::TcpListener::bind(m).await.with_context(|| {
                format!("binding {m} (server.metrics_listen): the port is taken; pick another or leave it out")
            })?)
        };
        // The gRPC port is ours, so a socket file left here is a dead allotd's.
        std::fs::create_dir_all(&cfg.server.state_dir)
            .with_context(|| format!("creating {}", cfg.server.state_dir.display()))?;
        let path = admin_socket_path(&cfg.server.state_dir);
        let _ = std::fs::remove_file(&path);
        let admin = tokio::net::UnixListener::bind(&path)
            .with_context(|| format!("binding the admin socket {}", path.display()))?;
        std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o600))
            .with_context(|| format!("chmod 600 {}", path.display()))?;
        Ok(Bound {
            grpc,
            metrics,
            admin,
        })
    }
}

/// Serves gRPC (and `/metrics`) until SIGTERM/SIGINT or `stop` resolves.
pub async fn serve(
    cfg: ServerConfig,
    stop: impl std::future::Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let bound = Bound::bind(&cfg).await?;
    serve_bound(cfg, bound, stop).await
}

/// Serves on ports already bound until `stop` resolves; then ends every agent
/// stream (the agents keep their workloads and reconnect later), and returns within
/// a few seconds with every port released.
pub async fn serve_bound(
    cfg: ServerConfig,
    bound: Bound,
    stop: impl std::future::Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let addr = bound.grpc.local_addr()?;
    let token = crate::metrics::metrics_token(&cfg)?;
    let server = Server::open(cfg)?;
    let metrics = match bound.metrics {
        Some(l) => {
            let at = l.local_addr()?.to_string();
            let server = server.clone();
            Some((
                at,
                tokio::spawn(async move {
                    if let Err(e) = crate::metrics::serve(l, server, token).await {
                        tracing::error!(error = %format!("{e:#}"), "the HTTP listener (metrics, pages) stopped");
                    }
                }),
            ))
        }
        None => None,
    };
    let looper = tokio::spawn(server.clone().schedule_loop());
    let forecaster = tokio::spawn(crate::forecast::run(
        server.clone(),
        server.cfg.server.forecast_every,
    ));
    server.kick.notify_one();
    tracing::info!(listen = %addr, metrics = %metrics.as_ref().map_or("-", |m| m.0.as_str()), "allotd ready");
    allot_common::systemd::notify("READY=1");
    let (stopped_tx, stopped_rx) = tokio::sync::oneshot::channel::<()>();
    let (admin_stop_tx, admin_stop_rx) = tokio::sync::oneshot::channel::<()>();
    let admin = tokio::spawn(crate::api::admin_socket(
        server.clone(),
        bound.admin,
        async move {
            let _ = admin_stop_rx.await;
        },
    ));
    let mut grpc = tokio::spawn(crate::api::grpc(server.clone(), bound.grpc, async move {
        let _ = stopped_rx.await;
    }));
    let r = tokio::select! {
        r = &mut grpc => r.context("gRPC task").and_then(|r| r),
        () = stop => {
            tracing::info!("allotd stopping: ending agent streams; workloads keep running");
            allot_common::systemd::notify("STOPPING=1");
            let _ = stopped_tx.send(());
            // Dropping the senders ends each agent's stream; the agents reconnect to
            // the next allotd.
            server.sessions.lock().unwrap_or_else(|e| e.into_inner()).clear();
            // An open attach holds its connection as long as its caller types: it
            // ends too, so the stop takes no grace and the port is free at once.
            server.ttys.close_all();
            match tokio::time::timeout(Duration::from_secs(3), &mut grpc).await {
                Ok(r) => r.context("gRPC task").and_then(|r| r),
                Err(_) => {
                    grpc.abort();
                    // Awaited, so the listener is closed when this returns.
                    let _ = (&mut grpc).await;
                    tracing::warn!("connections still open after 3 s; closed");
                    Ok(())
                }
            }
        }
    };
    looper.abort();
    let _ = looper.await;
    forecaster.abort();
    let _ = forecaster.await;
    // The next start (of this release or a later one) reads this and no tail.
    if let Err(e) = server.snapshot() {
        tracing::error!(error = %e, "no snapshot at stop; the next start applies the journal");
    }
    let _ = admin_stop_tx.send(());
    admin.abort();
    let _ = admin.await;
    if let Some((_, m)) = metrics {
        m.abort();
        let _ = m.await;
    }
    r
}

/// Resolves on SIGTERM or SIGINT.
pub async fn signalled() {
    use tokio::signal::unix::{signal, SignalKind};
    let (Ok(mut t), Ok(mut i)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        return std::future::pending().await;
    };
    tokio::select! {
        _ = t.recv() => {}
        _ = i.recv() => {}
    }
}
