//! `/metrics` in Prometheus text on its own port: queue and running GPUs per
//! project, served ratio per tree node, queue waits per class, revocations by
//! reason, drains, the breaker, scheduling-cycle time, connected agents, open
//! connections and Watch streams.

use crate::serve::{now, Server};
use crate::state::WAIT_BUCKETS;
use std::fmt::Write;
use std::sync::Arc;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn esc(s: &str) -> String {
    s.replace('\\', "\\\\").replace('"', "\\\"")
}

/// The whole exposition.
pub fn render(server: &Server) -> String {
    let mut o = String::new();
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
    let c = server.core();
    let a = &c.alloc;
    let tree = a.tree(now());
    let _ = writeln!(o, "# HELP allot_pending_gpus GPUs asked for by pending workloads.\n# TYPE allot_pending_gpus gauge");
    for g in tree.groups.iter().filter(|g| g.project) {
        let _ = writeln!(
            o,
            "allot_pending_gpus{{project=\"{}\"}} {}",
            esc(&g.name),
            g.pending_gpus
        );
    }
    let _ = writeln!(o, "# HELP allot_running_gpus GPUs held by running workloads.\n# TYPE allot_running_gpus gauge");
    for g in tree.groups.iter().filter(|g| g.project) {
        let _ = writeln!(
            o,
            "allot_running_gpus{{project=\"{}\"}} {}",
            esc(&g.name),
            g.running_gpus
        );
    }
    let _ = writeln!(o, "# HELP allot_served_ratio Usage over entitlement per tree node (1 = its share).\n# TYPE allot_served_ratio gauge");
    for g in &tree.groups {
        let _ = writeln!(
            o,
            "allot_served_ratio{{group=\"{}\"}} {:.6}",
            esc(&g.name),
            g.ratio
        );
    }
    let _ = writeln!(o, "# HELP allot_queue_wait_seconds Submit-to-start wait per class.\n# TYPE allot_queue_wait_seconds histogram");
    for (class, h) in &a.counters.waits {
        for (b, n) in WAIT_BUCKETS.iter().zip(h.buckets) {
            let _ = writeln!(
                o,
                "allot_queue_wait_seconds_bucket{{class=\"{}\",le=\"{b}\"}} {n}",
                esc(class)
            );
        }
        let _ = writeln!(
            o,
            "allot_queue_wait_seconds_bucket{{class=\"{}\",le=\"+Inf\"}} {}\nallot_queue_wait_seconds_sum{{class=\"{}\"}} {}\nallot_queue_wait_seconds_count{{class=\"{}\"}} {}",
            esc(class),
            h.count,
            esc(class),
            h.sum,
            esc(class),
            h.count
        );
    }
    let _ = writeln!(o, "# HELP allot_revocations_total Leases revoked, by reason.\n# TYPE allot_revocations_total counter");
    for (k, v) in &a.counters.revocations {
        let _ = writeln!(o, "allot_revocations_total{{reason=\"{k}\"}} {v}");
    }
    let _ = writeln!(
        o,
        "# HELP allot_drains_total Node drains, by who asked.\n# TYPE allot_drains_total counter"
    );
    for (k, v) in &a.counters.drains {
        let _ = writeln!(o, "allot_drains_total{{by=\"{k}\"}} {v}");
    }
    let _ = writeln!(o, "# HELP allot_breaker_held_total Automatic drains held by the circuit breaker.\n# TYPE allot_breaker_held_total counter\nallot_breaker_held_total {}", a.counters.breaker_held);
    let _ = writeln!(o, "# HELP allot_schedule_cycle_seconds Scheduling pass duration.\n# TYPE allot_schedule_cycle_seconds summary\nallot_schedule_cycle_seconds_sum {:.6}\nallot_schedule_cycle_seconds_count {}", stats.seconds, stats.passes);
    let _ = writeln!(o, "# HELP allot_schedule_last_cycle_seconds The last pass.\n# TYPE allot_schedule_last_cycle_seconds gauge\nallot_schedule_last_cycle_seconds {:.6}", stats.last);
    let _ = writeln!(o, "# HELP allot_agents_connected Agents with an open stream.\n# TYPE allot_agents_connected gauge\nallot_agents_connected {connected}");
    let conns = &server.conns;
    let _ = writeln!(o, "# HELP allotd_connections Open gRPC connections (CLI, agents, anyone).\n# TYPE allotd_connections gauge\nallotd_connections {}", conns.open());
    let _ = writeln!(o, "# HELP allotd_connections_refused_total Connections closed at accept: over server.max_connections_per_peer, max_connections_per_prefix or max_connections.\n# TYPE allotd_connections_refused_total counter\nallotd_connections_refused_total {}", conns.refused());
    let _ = writeln!(o, "# HELP allotd_connections_idle_closed_total Connections closed with no request open: none begun within server.handshake_timeout and first_request_timeout, or none for server.idle_timeout.\n# TYPE allotd_connections_idle_closed_total counter\nallotd_connections_idle_closed_total {}", conns.idle_closed());
    let _ = writeln!(o, "# HELP allotd_watch_streams Open Watch and followed Logs streams.\n# TYPE allotd_watch_streams gauge\nallotd_watch_streams {}", conns.watch_streams());
    let pending = a.core.pending_len();
    let _ = writeln!(o, "# HELP allot_pending_workloads Workloads waiting.\n# TYPE allot_pending_workloads gauge\nallot_pending_workloads {pending}");
    o
}

/// A minimal HTTP/1.1 responder: `GET /metrics`, anything else 404.
pub async fn serve(listener: tokio::net::TcpListener, server: Arc<Server>) {
    loop {
        let Ok((mut s, _)) = listener.accept().await else {
            continue;
        };
        let server = server.clone();
        tokio::spawn(async move {
            let mut buf = [0u8; 2048];
            let Ok(n) = s.read(&mut buf).await else {
                return;
            };
            let req = String::from_utf8_lossy(&buf[..n]);
            let (status, body) = if req.starts_with("GET /metrics") {
                ("200 OK", render(&server))
            } else {
                ("404 Not Found", "try /metrics\n".to_string())
            };
            let head = format!(
                "HTTP/1.1 {status}\r\ncontent-type: text/plain; version=0.0.4\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
                body.len()
            );
            let _ = s.write_all(head.as_bytes()).await;
            let _ = s.write_all(body.as_bytes()).await;
        });
    }
}
