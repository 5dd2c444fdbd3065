//! Every conversion between the agent's own types and `allot.v1` (protobuf): the
//! rules in `host/` and `lease.rs` never see the wire.

use crate::host::{Drain, GpuView, Host};
use crate::lease::{LeaseEnd, LeaseRecord, LeaseState, LogStream};
use allot_health::verdict::{GpuState, HostVerdict};
use allot_proto::v1 as pb;

fn secs(ms: i64) -> i64 {
    ms.div_euclid(1000)
}

/// The wire form of a lease.
pub fn lease_pb(l: &LeaseRecord) -> pb::Lease {
    pb::Lease {
        id: l.id.clone(),
        workload_id: l.workload_id.clone(),
        gpu_uuids: l.gpus.clone(),
        start_unix: secs(l.start_ms),
        min_runtime_s: l.min_runtime_s,
        time_limit_s: l.time_limit_s,
        checkpoint_hook: l.hook.clone(),
        grace_s: l.grace_s,
        warn_signal: l.warn_signal.clone(),
        warn_before_s: l.warn_before_s,
        state: match l.state {
            LeaseState::Starting => pb::LeaseState::Starting,
            LeaseState::Running => pb::LeaseState::Running,
            LeaseState::Revoking => pb::LeaseState::Revoking,
            LeaseState::Checkpointing => pb::LeaseState::Checkpointing,
            LeaseState::Ended => pb::LeaseState::Ended,
        } as i32,
        not_before_unix: l.not_before_ms.map_or(0, secs),
        ended_by: l.ended_by.clone(),
        steps: l
            .steps
            .iter()
            .map(|s| pb::LeaseStep {
                rung: s.rung.clone(),
                took_ms: s.took_ms,
                note: s.note.clone(),
            })
            .collect(),
        pid: u32::try_from(l.pid).unwrap_or(0),
        start_unix_ms: l.start_ms,
        cpu_pct: 0.0,
        rss_bytes: 0,
        user: l.user.clone(),
        end: end_pb(l.end_kind()) as i32,
        end_reason: l.end_reason.clone(),
        exit_code: l.exit_code,
        ended_unix: secs(l.ended_ms),
        revoke_why: l.revoke_why.clone(),
        adopted: l.adopted,
        cgroup: l.cgroup.clone(),
        end_detail: l.end_detail.clone(),
        term_signal: l.signal,
        idle_since_unix: l.idle_since_ms / 1000,
        gpu_util_pct: l.gpu_util_pct,
    }
}

/// The wire form of a health reason.
pub fn reason_pb(r: &allot_health::verdict::Reason) -> pb::HealthReason {
    pb::HealthReason {
        signal: r.signal.clone(),
        detail: r.detail.clone(),
        action: r
            .action
            .map(|a| {
                serde_json::to_value(a)
                    .ok()
                    .and_then(|v| v.as_str().map(str::to_string))
                    .unwrap_or_default()
            })
            .unwrap_or_default(),
        gpu_only: r.gpu_only,
        since_unix: i64::try_from(r.since).unwrap_or(0),
    }
}

/// The wire form of a GPU.
pub fn gpu_pb(g: &GpuView) -> pb::Gpu {
    pb::Gpu {
        uuid: g.sample.uuid.clone(),
        index: g.sample.index.unwrap_or(0),
        pci: g.sample.pci.clone(),
        model: g.sample.name.clone().unwrap_or_default(),
        state: match g.state {
            GpuState::Healthy => pb::GpuState::Healthy,
            GpuState::Degraded => pb::GpuState::Degraded,
            GpuState::Failed => pb::GpuState::Failed,
        } as i32,
        reasons: g.reasons.iter().map(reason_pb).collect(),
        lease_id: g.lease.clone().unwrap_or_default(),
    }
}

/// The wire form of a host verdict.
pub fn verdict_pb(v: HostVerdict) -> pb::HostVerdict {
    match v {
        HostVerdict::Ok => pb::HostVerdict::Ok,
        HostVerdict::Drain => pb::HostVerdict::Drain,
        HostVerdict::DrainNow => pb::HostVerdict::DrainNow,
    }
}

/// Every drain of the host, in force or held, on the wire.
pub fn drains_pb(h: &Host) -> Vec<pb::DrainInfo> {
    h.drains().into_iter().map(drain_info).collect()
}

fn drain_info(d: &Drain) -> pb::DrainInfo {
    pb::DrainInfo {
        by: d.by.clone(),
        author: d.author.clone(),
        reason: d.reason.clone(),
        now: d.now,
        since_unix: secs(d.at_ms),
        held: d.held,
    }
}

/// The host's drains as `allot gpus` and a drain's answer show them.
pub fn drain_pb(h: &Host) -> pb::DrainResponse {
    let drains: Vec<Drain> = h.drains().into_iter().cloned().collect();
    drain_response(&drains)
}

/// The answer to a drain or undrain: `drains` (in force or held), the first in
/// force named.
pub fn drain_response(drains: &[Drain]) -> pb::DrainResponse {
    let first = drains.iter().find(|d| !d.held);
    pb::DrainResponse {
        draining: first.is_some(),
        reason: first.map(|d| d.reason.clone()).unwrap_or_default(),
        now: first.is_some_and(|d| d.now),
        by: first.map(|d| d.by.clone()).unwrap_or_default(),
        drains: drains.iter().map(drain_info).collect(),
    }
}

/// The wire form of a line of the event log.
pub fn event_pb(e: crate::store::Event) -> pb::Event {
    pb::Event {
        at_unix: secs(e.at_ms),
        kind: e.kind,
        lease_id: e.lease,
        gpu: e.gpu,
        message: e.message,
    }
}

/// The wire form of how a lease ended.
pub fn end_pb(e: LeaseEnd) -> pb::LeaseEnd {
    match e {
        LeaseEnd::Unspecified => pb::LeaseEnd::Unspecified,
        LeaseEnd::Exited => pb::LeaseEnd::Exited,
        LeaseEnd::Revoked => pb::LeaseEnd::Revoked,
        LeaseEnd::TimeLimit => pb::LeaseEnd::TimeLimit,
        LeaseEnd::GpuLost => pb::LeaseEnd::GpuLost,
        LeaseEnd::Vanished => pb::LeaseEnd::Vanished,
        LeaseEnd::Refused => pb::LeaseEnd::Refused,
        LeaseEnd::FailedToStart => pb::LeaseEnd::FailedToStart,
        LeaseEnd::Fenced => pb::LeaseEnd::Fenced,
    }
}

/// The stream a wire value names (unspecified reads as stdout).
pub fn stream_of(v: i32) -> LogStream {
    match pb::LogStream::try_from(v) {
        Ok(pb::LogStream::Stderr) => LogStream::Stderr,
        _ => LogStream::Stdout,
    }
}

/// allotd's answer to a `ReadLog`: the bytes, or why there are none.
pub fn log_chunk(request_id: u64, read: Result<(Vec<u8>, bool, bool), String>) -> pb::LogChunk {
    match read {
        Ok((data, eof, lease_live)) => pb::LogChunk {
            request_id,
            data,
            eof,
            lease_live,
            error: String::new(),
        },
        Err(error) => pb::LogChunk {
            request_id,
            error,
            ..Default::default()
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_end_keeps_its_name_on_the_wire() {
        // Rows store the name and older allotds read it from `end_reason`: the
        // agent's names and the wire's must stay the same words.
        for name in [
            "",
            "exited",
            "revoked",
            "time-limit",
            "gpu-lost",
            "vanished",
            "refused",
            "failed-to-start",
            "fenced",
        ] {
            let e = LeaseEnd::from_name(name);
            assert_eq!(e.name(), name);
            assert_eq!(end_pb(e).name(), name);
        }
        assert_eq!(LeaseEnd::from_name("exploded"), LeaseEnd::Unspecified);
    }
}
