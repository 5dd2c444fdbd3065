//! How a host's health and drains read, the same on the host (`allot gpus`, `allot
//! drain`) and across the cluster (`allot nodes`).

use crate::duration::iso_utc;
use crate::table::or_dash;
use allot_proto::v1::{DrainInfo, Gpu, GpuState, HostVerdict};
use serde_json::{json, Value};

pub(crate) fn gpu_state(s: GpuState) -> &'static str {
    match s {
        GpuState::Healthy => "healthy",
        GpuState::Degraded => "degraded",
        GpuState::Failed => "failed",
        GpuState::Unspecified => "unknown",
    }
}

/// A host verdict as tables and JSON show it.
pub(crate) fn verdict(v: HostVerdict) -> &'static str {
    match v {
        HostVerdict::Ok => "ok",
        HostVerdict::Drain => "drain",
        HostVerdict::DrainNow => "drain-now",
        HostVerdict::Unspecified => "unknown",
    }
}

/// A drain's author and reason: `health (xid:79 on 0000:3b:00)`,
/// `local-operator alice: rack work`.
pub(crate) fn drain_who(d: &DrainInfo) -> String {
    // A health drain's author is the monitor or the signal, which its reason names.
    match (d.by.as_str(), d.author.trim()) {
        ("health", _) if d.reason.is_empty() => "health".into(),
        ("health", _) => format!("health ({})", d.reason),
        (by, "") => format!("{}: {}", or_dash(by), or_dash(&d.reason)),
        (by, author) => format!("{} {author}: {}", or_dash(by), or_dash(&d.reason)),
    }
}

/// One drain on one line: who and why, since when, how leases end, whether it is
/// held: `drained by local-operator alice: rack work since 2026-…Z, at min-runtime lapse`.
pub(crate) fn drain_line(d: &DrainInfo) -> String {
    let mut s = drain_who(d);
    if d.since_unix > 0 {
        s.push_str(&format!(" since {}", iso_utc(d.since_unix)));
    }
    s.push_str(if d.now {
        ", at once"
    } else {
        ", at min-runtime lapse"
    });
    if d.held {
        format!("held by allotd's circuit breaker, not in force: {s}")
    } else {
        format!("drained by {s}")
    }
}

/// A drain as JSON.
pub(crate) fn drain_info_json(d: &DrainInfo) -> Value {
    json!({
        "by": d.by,
        "author": d.author,
        "reason": d.reason,
        "now": d.now,
        "since_unix": d.since_unix,
        "held": d.held,
    })
}

/// A GPU as JSON; `allot gpus` and `allot nodes` show GPUs the same way.
pub(crate) fn gpu_json(g: &Gpu) -> Value {
    json!({
        "index": g.index,
        "uuid": g.uuid,
        "pci": g.pci,
        "model": g.model,
        "state": gpu_state(g.state()),
        "lease_id": g.lease_id,
        "reasons": g.reasons.iter().map(|r| json!({
            "signal": r.signal,
            "detail": r.detail,
            "action": r.action,
            "gpu_only": r.gpu_only,
            "since_unix": r.since_unix,
        })).collect::<Vec<_>>(),
    })
}
