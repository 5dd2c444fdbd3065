//! `/metrics` on `[agent] metrics_listen` (off unless set): every GPU under
//! dcgm-exporter's names and labels, each labelled with the lease, workload and
//! user that hold it (what dcgm-exporter's pod mapping is on Kubernetes), so a
//! GPU's utilisation joins the job it serves; the health policy's own state and XID
//! counters; and the agent's leases.

use crate::shared::Shared;
use allot_common::exposition::{Exposition, Kind};
use std::collections::BTreeMap;
use std::sync::Arc;

/// Who holds each GPU, by UUID: (lease, workload, user) of its live lease; and how
/// many leases are live (one listing of the host's leases per scrape).
fn holders(sh: &Shared) -> (BTreeMap<String, (String, String, String)>, usize) {
    let mut by_gpu = BTreeMap::new();
    let live: Vec<_> = sh
        .host()
        .leases()
        .into_iter()
        .filter(|l| l.live())
        .collect();
    for l in &live {
        for g in &l.gpus {
            by_gpu.insert(
                g.clone(),
                (l.id.clone(), l.workload_id.clone(), l.user.clone()),
            );
        }
    }
    (by_gpu, live.len())
}

/// The whole exposition.
pub fn render(sh: &Shared) -> String {
    let (held, live) = holders(sh);
    let label = |uuid: &str| {
        held.get(uuid)
            .map_or_else(Vec::new, |(lease, workload, user)| {
                vec![
                    ("lease", lease.clone()),
                    ("workload", workload.clone()),
                    ("user", user.clone()),
                ]
            })
    };
    let monitor = sh.monitor.as_ref();
    let gpus = monitor.map(|m| {
        m.lock()
            .unwrap_or_else(|e| e.into_inner())
            .metrics(&sh.host_name, &label)
    });
    let inventory = monitor.map_or_else(Vec::new, |m| {
        m.lock().unwrap_or_else(|e| e.into_inner()).inventory()
    });
    let mut e = Exposition::new();
    // Per lease, the mean utilisation of its GPUs: what an idle-lease alert reads
    // without a join.
    let mut per_lease: BTreeMap<(&str, &str), (u64, u64)> = BTreeMap::new();
    for s in &inventory {
        if let (Some((lease, workload, _)), Some(u)) = (held.get(&s.uuid), s.utilization_pct) {
            let slot = per_lease.entry((lease, workload)).or_default();
            slot.0 += u64::from(u);
            slot.1 += 1;
        }
    }
    e.family(
        "allot_lease_gpu_utilization_ratio",
        "Mean utilisation of a lease's GPUs on this host at the last sample, 0 to 1.",
        Kind::Gauge,
    );
    for ((lease, workload), (sum, n)) in &per_lease {
        e.sample(
            "allot_lease_gpu_utilization_ratio",
            &[
                ("lease", lease),
                ("workload", workload),
                ("Hostname", &sh.host_name),
            ],
            *sum as f64 / 100.0 / (*n).max(1) as f64,
        );
    }
    e.single(
        "allot_agent_leases",
        "Leases live on this host.",
        Kind::Gauge,
        live,
    );
    e.single(
        "allot_agent_allocator_connected",
        "1 while the stream to allotd is up.",
        Kind::Gauge,
        u8::from(
            sh.uplink
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .is_some(),
        ),
    );
    e.family(
        "allot_agent_build_info",
        "The agent's version (always 1).",
        Kind::Gauge,
    )
    .sample(
        "allot_agent_build_info",
        &[("version", env!("CARGO_PKG_VERSION"))],
        1,
    );
    allot_common::process::Process::read().write(&mut e);
    let mut body = gpus.unwrap_or_default();
    body.push_str(&e.finish());
    body
}

/// The routes: `GET /metrics`, anything else 404 naming it.
fn router(sh: Arc<Shared>) -> axum::Router {
    // The host lock and the monitor's are taken off the async workers.
    allot_common::http::metrics(move || render(&sh), None)
        .fallback(|| async { (axum::http::StatusCode::NOT_FOUND, "try /metrics\n") })
}

/// Serves `/metrics` on `listener` until the task is dropped.
pub async fn serve(listener: tokio::net::TcpListener, sh: Arc<Shared>) {
    allot_common::http::serve(listener, router(sh), allot_common::http::SCRAPE, None).await;
}
