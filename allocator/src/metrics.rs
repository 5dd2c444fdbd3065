//! `/metrics` in Prometheus text on its own port: queue and running GPUs per
//! project, served ratio per tree node, queue waits per class, revocations by
//! reason, drains, the breaker, scheduling-cycle time, connected agents, open
//! connections and Watch streams.
//!
//! The numbers are copied out under the state's lock ([`Numbers::read`]) and
//! written after it is released; the HTTP side is `allot_common::http` (a cap on
//! connections and deadlines on each, so a silent scraper holds nothing).

use crate::serve::{now, Server};
use crate::state::{Counters, GroupView, WAIT_BUCKETS};
use allot_common::exposition::{Exposition, Kind};
use std::sync::Arc;

/// What one scrape shows, copied from the server.
pub struct Numbers {
    groups: Vec<GroupView>,
    counters: Counters,
    stats: crate::serve::LoopStats,
    connected: usize,
    pending: usize,
    gated: std::collections::BTreeMap<&'static str, u64>,
    gpu_seconds: std::collections::BTreeMap<String, [u64; 2]>,
    notifications: [u64; 3],
    connections: (usize, u64, u64, usize),
    /// Unauthenticated connections open, and evicted since start.
    unauthenticated: (usize, u64),
    /// Nodes by scheduling state, and how many of them have their agent connected.
    nodes: std::collections::BTreeMap<&'static str, (u64, u64)>,
    /// The last forecast: how long it took (ms), when it ran.
    forecast: (u64, u64),
}

impl Numbers {
    /// Copies the numbers out (the state's lock is held only for this).
    pub fn read(server: &Server) -> Numbers {
        let stats = server
            .stats
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        let connected = server
            .sessions
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .len();
        let c = &server.conns;
        let connections = (c.open(), c.refused(), c.idle_closed(), c.watch_streams());
        let unauthenticated = (c.pending(), c.evicted());
        let n = &server.notifier.counts;
        let notifications = [
            n.sent.load(std::sync::atomic::Ordering::Relaxed),
            n.failed.load(std::sync::atomic::Ordering::Relaxed),
            n.dropped.load(std::sync::atomic::Ordering::Relaxed),
        ];
        let core = server.core();
        let mut nodes: std::collections::BTreeMap<&'static str, (u64, u64)> =
            ["ready", "draining", "drain-now", "down"]
                .into_iter()
                .map(|s| (s, (0, 0)))
                .collect();
        for n in core.alloc.nodes().values() {
            let slot = nodes.entry(crate::state::state_name(n.state)).or_default();
            slot.0 += 1;
            slot.1 += u64::from(n.connected);
        }
        Numbers {
            forecast: server.forecasts.last(),
            nodes,
            notifications,
            groups: core.alloc.tree(now()).groups,
            counters: core.alloc.counters.clone(),
            stats,
            connected,
            pending: core.alloc.core.pending_len(),
            gated: core.alloc.gated_counts(now()),
            gpu_seconds: core.alloc.gpu_seconds(now()),
            connections,
            unauthenticated,
        }
    }

    /// The exposition.
    pub fn render(&self) -> String {
        let mut e = Exposition::new();
        let projects = || self.groups.iter().filter(|g| g.project);
        e.labelled(
            "allot_pending_gpus",
            "GPUs asked for by pending workloads.",
            Kind::Gauge,
            "project",
            projects().map(|g| (g.name.as_str(), g.pending_gpus)),
        );
        e.labelled(
            "allot_running_gpus",
            "GPUs held by running workloads.",
            Kind::Gauge,
            "project",
            projects().map(|g| (g.name.as_str(), g.running_gpus)),
        );
        e.labelled(
            "allot_served_ratio",
            "Usage over entitlement per tree node (1 = its share).",
            Kind::Gauge,
            "group",
            self.groups
                .iter()
                .map(|g| (g.name.as_str(), format!("{:.6}", g.ratio))),
        );
        let wait = "allot_queue_wait_seconds";
        e.family(wait, "Submit-to-start wait per class.", Kind::Histogram);
        for (class, h) in &self.counters.waits {
            for (b, n) in WAIT_BUCKETS.iter().zip(h.buckets) {
                e.sample(
                    "allot_queue_wait_seconds_bucket",
                    &[("class", class), ("le", &b.to_string())],
                    n,
                );
            }
            e.sample(
                "allot_queue_wait_seconds_bucket",
                &[("class", class), ("le", "+Inf")],
                h.count,
            );
            e.sample("allot_queue_wait_seconds_sum", &[("class", class)], h.sum);
            e.sample(
                "allot_queue_wait_seconds_count",
                &[("class", class)],
                h.count,
            );
        }
        // A drain's revocations say whose drain (`drain-now:health` is a GPU fault);
        // snapshots of earlier releases kept the reason alone.
        e.family(
            "allot_revocations_total",
            "Leases revoked, by reason and, for drains, by cause (health, lost, operator).",
            Kind::Counter,
        );
        for (k, v) in &self.counters.revocations {
            let (reason, cause) = k.split_once(':').unwrap_or((k, ""));
            let mut labels = vec![("reason", reason)];
            if !cause.is_empty() {
                labels.push(("cause", cause));
            }
            e.sample("allot_revocations_total", &labels, v);
        }
        e.labelled(
            "allot_drains_total",
            "Node drains, by who asked.",
            Kind::Counter,
            "by",
            self.counters.drains.iter().map(|(k, v)| (k.as_str(), v)),
        );
        e.single(
            "allot_breaker_held_total",
            "Automatic drains held by the circuit breaker.",
            Kind::Counter,
            self.counters.breaker_held,
        );
        e.family(
            "allot_schedule_cycle_seconds",
            "Scheduling pass duration.",
            Kind::Summary,
        )
        .sample(
            "allot_schedule_cycle_seconds_sum",
            &[],
            format_args!("{:.6}", self.stats.seconds),
        )
        .sample("allot_schedule_cycle_seconds_count", &[], self.stats.passes);
        e.single(
            "allot_schedule_last_cycle_seconds",
            "The last pass.",
            Kind::Gauge,
            format_args!("{:.6}", self.stats.last),
        );
        e.single(
            "allot_agents_connected",
            "Agents with an open stream.",
            Kind::Gauge,
            self.connected,
        );
        let (open, refused, idle, watches) = self.connections;
        e.single(
            "allot_connections",
            "Open gRPC connections (CLI, agents, anyone).",
            Kind::Gauge,
            open,
        );
        e.single(
            "allot_connections_unauthenticated",
            "Open gRPC connections no request has authenticated yet (a token or a node certificate).",
            Kind::Gauge,
            self.unauthenticated.0,
        );
        e.single("allot_connections_refused_total", "Connections closed at accept: over server.max_connections_per_peer, max_connections_per_prefix or max_connections, with no heavier holder of unauthenticated slots to take from.", Kind::Counter, refused);
        e.single("allot_connections_evicted_total", "Unauthenticated connections closed to give their slot to a newcomer from a lighter address or prefix.", Kind::Counter, self.unauthenticated.1);
        e.single("allot_connections_idle_closed_total", "Connections closed by a deadline: not authenticated within server.handshake_timeout and first_request_timeout, or no request open for server.idle_timeout.", Kind::Counter, idle);
        e.single(
            "allot_watch_streams",
            "Open Watch and followed Logs streams.",
            Kind::Gauge,
            watches,
        );
        e.single(
            "allot_pending_workloads",
            "Workloads waiting in the queue.",
            Kind::Gauge,
            self.pending,
        );
        e.family(
            "allot_gpu_seconds_total",
            "GPU-seconds received per project, funded or not (ended runs and the running ones so far): increase() over a window is usage, as allot usage reports it.",
            Kind::Counter,
        );
        for (project, [funded, unfunded]) in &self.gpu_seconds {
            e.sample(
                "allot_gpu_seconds_total",
                &[("project", project), ("funded", "true")],
                funded,
            );
            e.sample(
                "allot_gpu_seconds_total",
                &[("project", project), ("funded", "false")],
                unfunded,
            );
        }
        e.labelled(
            "allot_notifications_total",
            "Notices to users (--notify): delivered, given up after every attempt, dropped with the queue full.",
            Kind::Counter,
            "result",
            ["sent", "failed", "dropped"]
                .into_iter()
                .zip(self.notifications),
        );
        e.labelled(
            "allot_nodes",
            "Nodes by scheduling state.",
            Kind::Gauge,
            "state",
            self.nodes.iter().map(|(k, v)| (*k, v.0)),
        );
        e.labelled(
            "allot_nodes_connected",
            "Nodes whose agent has its stream open, by scheduling state.",
            Kind::Gauge,
            "state",
            self.nodes.iter().map(|(k, v)| (*k, v.1)),
        );
        e.labelled(
            "allot_workloads_finished_total",
            "Workloads ended, by final state.",
            Kind::Counter,
            "state",
            self.counters.finished.iter().map(|(k, v)| (k.as_str(), v)),
        );
        e.family(
            "allot_build_info",
            "allotd's version (always 1).",
            Kind::Gauge,
        )
        .sample(
            "allot_build_info",
            &[("version", env!("CARGO_PKG_VERSION"))],
            1,
        );
        e.labelled(
            "allot_gated_workloads",
            "Pending workloads kept out of the queue, by gate (held, dependency, singleton, begin-time, array-limit).",
            Kind::Gauge,
            "gate",
            self.gated.iter().map(|(k, v)| (*k, v)),
        );
        e.single(
            "allot_forecast_seconds",
            "How long the last start-time forecast of pending work took.",
            Kind::Gauge,
            format!("{:.3}", self.forecast.0 as f64 / 1000.0),
        );
        e.single(
            "allot_forecast_timestamp_seconds",
            "When the last start-time forecast ran (0: not yet).",
            Kind::Gauge,
            self.forecast.1,
        );
        allot_common::process::Process::read().write(&mut e);
        e.finish()
    }
}

/// The routes: `GET /metrics` (behind `token` when one is set), `/healthz` (the
/// process answers), `/readyz` (its state does); anything else 404 naming them.
fn router(server: Arc<Server>, token: Option<Arc<str>>) -> axum::Router {
    use axum::http::StatusCode;
    let ready = server.clone();
    // The copy takes the state's lock.
    allot_common::http::metrics(move || Numbers::read(&server).render(), token)
        .route("/healthz", axum::routing::get(|| async { "ok\n" }))
        .route(
            "/readyz",
            axum::routing::get(move || {
                let server = ready.clone();
                async move {
                    // Ready when the state answers: a wedged lock or a store that
                    // stopped taking writes is not.
                    match tokio::task::spawn_blocking(move || server.readiness()).await {
                        Ok(Ok(())) => (StatusCode::OK, "ready\n".to_string()),
                        Ok(Err(why)) => (
                            StatusCode::SERVICE_UNAVAILABLE,
                            format!("not ready: {why}\n"),
                        ),
                        Err(e) => (StatusCode::SERVICE_UNAVAILABLE, format!("not ready: {e}\n")),
                    }
                }
            }),
        )
        .fallback(|| async { (StatusCode::NOT_FOUND, "try /metrics, /healthz or /readyz\n") })
}

/// The bearer token `[server] metrics_token_file` holds, if one is set: a file
/// others may read, or an empty one, is refused.
pub fn metrics_token(cfg: &crate::config::ServerConfig) -> anyhow::Result<Option<Arc<str>>> {
    use anyhow::Context;
    use std::os::unix::fs::PermissionsExt;
    let path = &cfg.server.metrics_token_file;
    if path.as_os_str().is_empty() {
        return Ok(None);
    }
    let meta = std::fs::metadata(path)
        .with_context(|| format!("server.metrics_token_file {}", path.display()))?;
    if meta.permissions().mode() & 0o004 != 0 {
        anyhow::bail!(
            "server.metrics_token_file {}: anyone on this host may read it; chmod 640 it (owner allot, group prometheus)",
            path.display()
        );
    }
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("server.metrics_token_file {}", path.display()))?;
    let token = text.trim();
    if token.is_empty() || token.len() > 4096 || token.contains(char::is_whitespace) {
        anyhow::bail!(
            "server.metrics_token_file {}: give one token of 1 to 4096 characters without spaces (e.g. `openssl rand -hex 32`)",
            path.display()
        );
    }
    Ok(Some(Arc::from(token)))
}

/// A request whose `Host` is not one of allotd's names or an address is refused:
/// a page whose name was rebound to allotd's address (DNS rebinding) reads
/// nothing, `/metrics` included.
async fn only_our_names(
    names: Arc<[String]>,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    use axum::response::IntoResponse;
    let host = req
        .headers()
        .get(axum::http::header::HOST)
        .and_then(|v| v.to_str().ok())
        .or_else(|| req.uri().authority().map(|a| a.as_str()))
        .unwrap_or("");
    if allot_common::net::host_is_ours(host, &names) {
        return next.run(req).await;
    }
    tracing::info!(host, "http: a request for another host's name refused");
    (
        axum::http::StatusCode::MISDIRECTED_REQUEST,
        format!(
            "Host {host:?} is not one of allotd's names; reach it by its address or a name in [tls] names\n"
        ),
    )
        .into_response()
}

/// Serves `/metrics`, the probes and (unless `[server] web = false`) the web pages
/// on `listener` until the task is dropped: plain HTTP on a loopback address, TLS
/// with allotd's certificate on any other.
pub async fn serve(
    listener: tokio::net::TcpListener,
    server: Arc<Server>,
    token: Option<Arc<str>>,
) -> anyhow::Result<()> {
    let loopback = listener.local_addr()?.ip().is_loopback();
    let tls = if loopback {
        None
    } else {
        Some(allot_common::http::tls_acceptor(
            &server.pki.server_cert,
            &server.pki.server_key,
        )?)
    };
    let mut routes = router(server.clone(), token);
    if server.cfg.server.web {
        routes = routes.merge(crate::web::router(server.clone(), !loopback));
    }
    let names: Arc<[String]> = crate::pki::server_names(&server.cfg).into();
    let routes = routes.layer(axum::middleware::from_fn(
        move |req: axum::extract::Request, next: axum::middleware::Next| {
            only_our_names(names.clone(), req, next)
        },
    ));
    allot_common::http::serve(listener, routes, allot_common::http::SCRAPE, tls).await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A `/metrics` server on a fresh state dir; the dir goes with the returned guard.
    const SHORT: allot_common::http::Limits = allot_common::http::Limits {
        connections: 4,
        per_peer: 4,
        headers: std::time::Duration::from_millis(300),
        connection: std::time::Duration::from_secs(20),
    };

    async fn metrics_server() -> (std::net::SocketAddr, std::path::PathBuf) {
        let (server, dir) = open_server();
        let l = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = l.local_addr().expect("addr");
        tokio::spawn(allot_common::http::serve(
            l,
            router(server, None),
            SHORT,
            None,
        ));
        (addr, dir)
    }

    fn open_server() -> (Arc<Server>, std::path::PathBuf) {
        let dir = std::env::temp_dir().join(format!(
            "allot-metrics-test-{}-{}",
            std::process::id(),
            rand_suffix()
        ));
        let mut cfg = crate::config::ServerConfig::parse(crate::config::EXAMPLE, "example")
            .expect("the example config parses");
        cfg.server.state_dir = dir.join("allotd");
        (Server::open(cfg).expect("server"), dir)
    }

    async fn get_with(addr: std::net::SocketAddr, path: &str, header: &str) -> String {
        // A TLS port answers a plain request with an alert, or closes.
        raw(
            addr,
            &format!("GET {path} HTTP/1.1\r\nhost: x\r\n{header}\r\n"),
        )
        .await
    }

    #[tokio::test]
    async fn metrics_behind_a_token_refuse_a_scrape_without_it() {
        let (server, dir) = open_server();
        let l = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = l.local_addr().expect("addr");
        let token: Arc<str> = Arc::from("s3cret-token");
        tokio::spawn(allot_common::http::serve(
            l,
            router(server, Some(token)),
            SHORT,
            None,
        ));
        for header in [
            "",
            "authorization: Bearer wrong\r\n",
            "authorization: s3cret-token\r\n",
        ] {
            let r = get_with(addr, "/metrics", header).await;
            assert!(r.starts_with("HTTP/1.1 401"), "{header:?}: {r}");
            assert!(r.contains("metrics_token_file"), "{r}");
        }
        let r = get_with(addr, "/metrics", "authorization: Bearer s3cret-token\r\n").await;
        assert!(
            r.starts_with("HTTP/1.1 200") && r.contains("allot_build_info"),
            "{r}"
        );
        // The probes stay open: a load balancer brings no token.
        let r = get_with(addr, "/healthz", "").await;
        assert!(r.starts_with("HTTP/1.1 200"), "{r}");
        let _ = std::fs::remove_dir_all(dir);
    }

    #[tokio::test]
    async fn the_listener_speaks_tls_with_allotds_certificate_when_asked() {
        use tokio_rustls::rustls;
        use tokio_rustls::rustls::pki_types::pem::PemObject;
        let (server, dir) = open_server();
        let acceptor =
            allot_common::http::tls_acceptor(&server.pki.server_cert, &server.pki.server_key)
                .expect("allotd's pair makes an acceptor");
        let mut roots = rustls::RootCertStore::empty();
        roots
            .add(
                rustls::pki_types::CertificateDer::from_pem_slice(
                    server.pki.ca.cert_pem.as_bytes(),
                )
                .expect("CA"),
            )
            .expect("root");
        let l = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = l.local_addr().expect("addr");
        tokio::spawn(allot_common::http::serve(
            l,
            router(server, None),
            SHORT,
            Some(acceptor),
        ));
        let cfg = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .expect("versions")
        .with_root_certificates(roots)
        .with_no_client_auth();
        let tcp = tokio::net::TcpStream::connect(addr).await.expect("connect");
        let name = rustls::pki_types::ServerName::try_from("localhost").expect("name");
        let mut tls = tokio_rustls::TlsConnector::from(Arc::new(cfg))
            .connect(name, tcp)
            .await
            .expect("a TLS handshake verified by the cluster CA");
        tls.write_all(b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n")
            .await
            .expect("write");
        let mut out = Vec::new();
        let _ = tls.read_to_end(&mut out).await;
        let out = String::from_utf8_lossy(&out);
        assert!(
            out.starts_with("HTTP/1.1 200") && out.ends_with("ok\n"),
            "{out}"
        );
        // Plain HTTP to it gets no page.
        let plain = get_with(addr, "/healthz", "").await;
        assert!(!plain.contains("200"), "{plain}");
        let _ = std::fs::remove_dir_all(dir);
    }

    fn rand_suffix() -> u64 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64)
    }

    async fn get(addr: std::net::SocketAddr, path: &str) -> String {
        get_with(addr, path, "").await
    }

    #[tokio::test]
    async fn silent_scrapers_are_cut_off_and_never_hold_every_slot() {
        let (addr, dir) = metrics_server().await;
        // Every slot and more taken by clients that send nothing: each is closed
        // at the header deadline, long before the connection's.
        let mut silent = Vec::new();
        for _ in 0..SHORT.connections * 2 {
            silent.push(tokio::net::TcpStream::connect(addr).await.expect("connect"));
        }
        for s in &mut silent {
            let mut buf = [0u8; 256];
            let n = tokio::time::timeout(SHORT.connection / 2, s.read(&mut buf))
                .await
                .expect("closed before the connection deadline")
                .unwrap_or(0);
            // hyper may answer 408 before closing; either way the slot is free.
            assert!(
                n == 0 || buf.starts_with(b"HTTP/1.1 408"),
                "{:?}",
                &buf[..n]
            );
        }
        let body = get(addr, "/metrics").await;
        assert!(body.starts_with("HTTP/1.1 200"), "{body}");
        assert!(
            body.contains("content-type: text/plain; version=0.0.4"),
            "{body}"
        );
        assert!(
            body.contains("# TYPE allot_pending_workloads gauge\nallot_pending_workloads 0\n"),
            "{body}"
        );
        for line in [
            "allot_build_info{version=",
            "# TYPE process_resident_memory_bytes gauge",
            "allot_nodes{state=\"ready\"} 0",
            "# TYPE allot_workloads_finished_total counter",
            "# TYPE allot_connections gauge",
        ] {
            assert!(body.contains(line), "{line} missing: {body}");
        }
        assert!(!body.contains("allotd_"), "one prefix: {body}");
        let health = get(addr, "/healthz").await;
        assert!(
            health.starts_with("HTTP/1.1 200") && health.ends_with("ok\n"),
            "{health}"
        );
        let ready = get(addr, "/readyz").await;
        assert!(
            ready.starts_with("HTTP/1.1 200") && ready.ends_with("ready\n"),
            "{ready}"
        );
        let other = get(addr, "/other").await;
        assert!(
            other.starts_with("HTTP/1.1 404")
                && other.ends_with("try /metrics, /healthz or /readyz\n"),
            "{other}"
        );
        let _ = std::fs::remove_dir_all(dir);
    }

    /// One raw request (`text`, without the blank line) to `addr`; the answer.
    async fn raw(addr: std::net::SocketAddr, text: &str) -> String {
        let mut s = tokio::net::TcpStream::connect(addr).await.expect("connect");
        s.write_all(text.as_bytes()).await.expect("write");
        let mut out = Vec::new();
        let _ = s.read_to_end(&mut out).await;
        String::from_utf8_lossy(&out).into_owned()
    }

    /// A login form `form` posted to `addr` with extra `headers` (each ending in
    /// CRLF); the answer.
    async fn post_login(addr: std::net::SocketAddr, headers: &str, form: &str) -> String {
        raw(
            addr,
            &format!(
                "POST /login HTTP/1.1\r\nhost: {addr}\r\n{headers}content-type: application/x-www-form-urlencoded\r\ncontent-length: {}\r\n\r\n{form}",
                form.len()
            ),
        )
        .await
    }

    #[tokio::test]
    async fn another_hosts_name_cross_origin_posts_and_sniffing_are_refused() {
        let (server, dir) = open_server();
        let l = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = l.local_addr().expect("addr");
        tokio::spawn(serve(l, server, None));
        // DNS rebinding: a page of evil.example.com, its name rebound to 127.0.0.1.
        let r = raw(
            addr,
            "GET /metrics HTTP/1.1\r\nhost: evil.example.com:9470\r\n\r\n",
        )
        .await;
        assert!(
            r.starts_with("HTTP/1.1 421") && r.contains("[tls] names"),
            "{r}"
        );
        assert!(!r.contains("allot_build_info"), "{r}");
        let ours = format!("GET /healthz HTTP/1.1\r\nhost: {addr}\r\n\r\n");
        assert!(raw(addr, &ours).await.starts_with("HTTP/1.1 200"));
        // A login posted by a page of another port (login CSRF), or another site.
        let form = "token=allot_x&csrf=login_y";
        for header in [
            "origin: http://127.0.0.1:8888\r\n".to_string(),
            "origin: null\r\n".into(),
            "sec-fetch-site: same-site\r\n".into(),
            format!("origin: http://{addr}\r\nsec-fetch-site: cross-site\r\n"),
        ] {
            let r = post_login(addr, &header, form).await;
            assert!(
                r.starts_with("HTTP/1.1 403") && r.contains("another"),
                "{header}: {r}"
            );
        }
        // Its own page's POST reaches the login (refused there: no login cookie).
        let same = format!("origin: http://{addr}\r\nsec-fetch-site: same-origin\r\n");
        let r = post_login(addr, &same, form).await;
        assert!(
            r.starts_with("HTTP/1.1 403") && r.contains("this login form expired"),
            "{r}"
        );
        assert!(
            r.to_ascii_lowercase().contains("set-cookie: allot_login="),
            "{r}"
        );
        // Failed logins from one address: ten a minute, then it waits.
        let page = raw(
            addr,
            &format!("GET /login HTTP/1.1\r\nhost: {addr}\r\n\r\n"),
        )
        .await;
        let secret = page
            .split("allot_login=")
            .nth(1)
            .and_then(|r| r.split(';').next())
            .expect("a login cookie")
            .to_string();
        let mut codes = Vec::new();
        for _ in 0..=crate::web::LOGIN_TRIES {
            let form = format!("token=allot_not-a-token&csrf={secret}");
            let r = post_login(addr, &format!("cookie: allot_login={secret}\r\n"), &form).await;
            codes.push(r.get(9..12).unwrap_or("").to_string());
            if codes.len() == 1 + crate::web::LOGIN_TRIES as usize {
                assert!(r.contains("failed logins from this address"), "{r}");
                assert!(r.to_ascii_lowercase().contains("retry-after:"), "{r}");
            }
        }
        let mut want = vec!["401".to_string(); crate::web::LOGIN_TRIES as usize];
        want.push("429".into());
        assert_eq!(codes, want);
        // A run's log (here: no session) is never sniffed, and runs nothing.
        let r = raw(
            addr,
            &format!("GET /workload/1/log HTTP/1.1\r\nhost: {addr}\r\n\r\n"),
        )
        .await;
        let lower = r.to_ascii_lowercase();
        assert!(lower.contains("x-content-type-options: nosniff"), "{r}");
        assert!(
            lower.contains("content-security-policy: default-src 'none'"),
            "{r}"
        );
        let _ = std::fs::remove_dir_all(dir);
    }
}
