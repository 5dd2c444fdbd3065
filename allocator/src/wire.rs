//! Every conversion between allotd's own types and `allot.v1` (protobuf): the
//! state machine (`state/`) and the core never see the wire; the service shells
//! (`api.rs`, `admin.rs`, `serve.rs`) call these.

use crate::state::{
    lease_wire, state_name, Command, GpuCondition, GpuReason, GpuReport, GpuSeen, HostDrain,
    NodeRec, TreeView, Verdict, WorkRec,
};
use allot_common::drain::DrainAuthor;
use allot_fairshare::{LeaseEnd, NodeState, WorkloadState};
use allot_proto::v1 as pb;

pub fn state_pb(s: WorkloadState) -> pb::WorkloadState {
    match s {
        WorkloadState::Pending => pb::WorkloadState::Pending,
        WorkloadState::Running => pb::WorkloadState::Running,
        WorkloadState::Completed => pb::WorkloadState::Completed,
        WorkloadState::Failed => pb::WorkloadState::Failed,
        WorkloadState::Cancelled => pb::WorkloadState::Cancelled,
        WorkloadState::Preempted => pb::WorkloadState::Preempted,
        WorkloadState::TimedOut => pb::WorkloadState::TimedOut,
    }
}

fn secs(t: u64) -> i64 {
    i64::try_from(t).unwrap_or(i64::MAX)
}

/// The wire form of a workload, with why it waits (`Allocator::explanation`).
/// A workload as the API shows it; `why` is why it waits, if it does (the
/// explanation and the gate's kind, empty when the policy alone decides).
pub fn workload_pb(w: &WorkRec, why: (String, &str)) -> pb::Workload {
    let (explanation, gate) = why;
    pb::Workload {
        id: w.id.to_string(),
        spec: Some(pb::WorkloadSpec {
            project: w.spec.project.clone(),
            user: w.spec.user.clone(),
            class: w.spec.class.clone(),
            gpus_per_node: w.spec.gpus_per_node,
            nodes: w.spec.nodes,
            cpu_per_node: w.spec.cpu_per_node,
            mem_per_node_gb: w.spec.mem_per_node_gb,
            min_runtime_s: Some(w.spec.min_runtime),
            time_limit_s: w.spec.time_limit,
            resumable: w.spec.resumable,
            priority: w.spec.priority,
            argv: w.argv.clone(),
            checkpoint_hook: w.hook.clone(),
            no_requeue: w.spec.no_requeue,
            cwd: w.cwd.clone(),
            // Kept and sent to the hosts that run it, shown to no one: an
            // environment may hold secrets.
            env: Vec::new(),
            output: w.output.clone(),
            error: w.error.clone(),
            warn_signal: w
                .warn
                .as_ref()
                .map(|x| x.signal.clone())
                .unwrap_or_default(),
            warn_before_s: w.warn.as_ref().map_or(0, |x| x.before_s),
            name: w.name.clone(),
            dependencies: w
                .gates
                .deps
                .iter()
                .map(|d| pb::Dependency {
                    kind: d.kind.as_str().into(),
                    id: d.id.to_string(),
                })
                .collect(),
            singleton: w.gates.singleton,
            begin_unix: secs(w.gates.begin),
            hold: w.gates.hold.is_some(),
            array: String::new(),
            gpu_types: w.spec.select.gpu_types.clone(),
            constraint: w.spec.select.features.clone(),
            cluster: w.spec.select.cluster.clone(),
            nodelist: w.spec.select.nodelist.clone(),
            exclude: w.spec.select.exclude.clone(),
            script: String::new(),
            has_script: !w.script.is_empty(),
            notify: w.notify.clone(),
            pty: w.pty,
        }),
        array_id: w.array.map(|p| p.id.to_string()).unwrap_or_default(),
        array_index: w.array.map_or(0, |p| p.index),
        gate: gate.to_string(),
        // Filled from the latest forecast (`crate::forecast`), pending work only.
        forecast_p50_unix: 0,
        forecast_p90_unix: 0,
        forecast_at_unix: 0,
        forecast_horizon_s: 0,
        state: state_pb(w.state) as i32,
        submit_unix: secs(w.submit),
        explanation,
        lease_ids: w.leases.iter().map(|l| lease_wire(*l)).collect(),
        nodes: w.nodes.clone(),
        preemptions: w.preemptions,
        start_unix: secs(w.start),
        end_unix: secs(w.end),
        funded: w.funded,
        end_reason: w.end_reason.clone(),
        history: Vec::new(),
        exit_code: w.exit_code,
        signal: w.signal,
        runs: w
            .runs
            .iter()
            .enumerate()
            .map(|(i, r)| pb::Run {
                number: u32::try_from(i + 1).unwrap_or(u32::MAX),
                lease_id: lease_wire(r.lease),
                nodes: r.nodes.clone(),
                gpus: r.gpus,
                start_unix: secs(r.start),
                end_unix: secs(r.end),
                end_reason: r.end_reason.clone(),
                exit_code: r.exit_code,
                signal: r.signal,
                detail: r.detail.clone(),
                idle_since_unix: secs(r.idle_since),
                gpu_util_pct: r.gpu_util,
            })
            .collect(),
    }
}

/// The wire form of a command for an agent.
pub fn command_pb(cmd: &Command) -> pb::AllocatorMessage {
    use pb::allocator_message::Body;
    let revoke = |lease: u64, not_before: u64, why: &str, withdraw: bool| {
        Body::Revoke(pb::RevokeCommand {
            lease_id: lease_wire(lease),
            not_before_unix: i64::try_from(not_before).unwrap_or(0),
            why: why.to_string(),
            withdraw,
        })
    };
    let drain = |drain: bool, now: bool, reason: String, by: &str| {
        Body::Drain(pb::DrainCommand {
            drain,
            now,
            reason,
            by: by.to_string(),
            author: "allotd".into(),
        })
    };
    let body = match cmd {
        Command::Start(s) => Body::Start(pb::StartLeaseCommand {
            lease: Some(pb::Lease {
                id: lease_wire(s.lease),
                workload_id: s.workload.to_string(),
                gpu_uuids: s.gpu_uuids.clone(),
                start_unix: i64::try_from(s.start).unwrap_or(0),
                min_runtime_s: s.min_runtime,
                time_limit_s: s.time_limit,
                checkpoint_hook: s.hook.clone(),
                warn_signal: s
                    .warn
                    .as_ref()
                    .map(|w| w.signal.clone())
                    .unwrap_or_default(),
                warn_before_s: s.warn.as_ref().map_or(0, |w| w.before_s),
                ..Default::default()
            }),
            argv: s.argv.clone(),
            user: s.user.clone(),
            env: s.allot_env().into_iter().collect(),
            job_env: s
                .env
                .iter()
                .map(|(name, value)| pb::EnvVar {
                    name: name.clone(),
                    value: value.clone(),
                })
                .collect(),
            cwd: s.cwd.clone(),
            run: s.run,
            rank: s.rank,
            output: s.output.clone(),
            error: s.error.clone(),
            cpu_per_node: s.cpu_per_node,
            mem_per_node_gb: s.mem_per_node_gb,
            script: s.script.clone(),
            pty: s.pty,
        }),
        Command::Revoke {
            lease,
            not_before,
            why,
        } => revoke(*lease, *not_before, why, false),
        Command::Withdraw { lease, why } => revoke(*lease, 0, why, true),
        Command::Drain {
            drain: d,
            now,
            reason,
            by,
        } => drain(*d, *now, reason.clone(), by),
        Command::Hold { now, reasons } => drain(
            false,
            *now,
            format!("held by allotd's circuit breaker: {reasons}"),
            DrainAuthor::Health.as_str(),
        ),
        Command::Notice { lease, text } => Body::Tty(pb::TtyInput {
            lease_id: lease_wire(*lease),
            notice: text.clone(),
            ..Default::default()
        }),
    };
    pb::AllocatorMessage { body: Some(body) }
}

pub fn verdict_pb(v: Verdict) -> pb::HostVerdict {
    match v {
        Verdict::Unspecified => pb::HostVerdict::Unspecified,
        Verdict::Ok => pb::HostVerdict::Ok,
        Verdict::Drain => pb::HostVerdict::Drain,
        Verdict::DrainNow => pb::HostVerdict::DrainNow,
    }
}

pub fn verdict_of(v: i32) -> Verdict {
    match pb::HostVerdict::try_from(v) {
        Ok(pb::HostVerdict::Ok) => Verdict::Ok,
        Ok(pb::HostVerdict::Drain) => Verdict::Drain,
        Ok(pb::HostVerdict::DrainNow) => Verdict::DrainNow,
        _ => Verdict::Unspecified,
    }
}

fn condition_of(state: i32) -> GpuCondition {
    match pb::GpuState::try_from(state) {
        Ok(pb::GpuState::Healthy) => GpuCondition::Healthy,
        Ok(pb::GpuState::Degraded) => GpuCondition::Degraded,
        Ok(pb::GpuState::Failed) => GpuCondition::Failed,
        _ => GpuCondition::Unspecified,
    }
}

fn condition_pb(c: GpuCondition) -> pb::GpuState {
    match c {
        GpuCondition::Unspecified => pb::GpuState::Unspecified,
        GpuCondition::Healthy => pb::GpuState::Healthy,
        GpuCondition::Degraded => pb::GpuState::Degraded,
        GpuCondition::Failed => pb::GpuState::Failed,
    }
}

/// What allotd's rules look at of a reported GPU.
pub fn gpu_seen(g: &pb::Gpu) -> GpuSeen {
    GpuSeen {
        index: g.index,
        state: condition_of(g.state),
        lease: g.lease_id.clone(),
    }
}

/// A reported GPU as allotd keeps it for views.
pub fn gpu_report(g: &pb::Gpu) -> GpuReport {
    GpuReport {
        uuid: g.uuid.clone(),
        index: g.index,
        pci: g.pci.clone(),
        model: g.model.clone(),
        state: condition_of(g.state),
        reasons: g
            .reasons
            .iter()
            .map(|r| GpuReason {
                signal: r.signal.clone(),
                detail: r.detail.clone(),
                action: r.action.clone(),
                gpu_only: r.gpu_only,
                since_unix: r.since_unix,
            })
            .collect(),
        lease: g.lease_id.clone(),
    }
}

fn gpu_pb(g: &GpuReport) -> pb::Gpu {
    pb::Gpu {
        uuid: g.uuid.clone(),
        index: g.index,
        pci: g.pci.clone(),
        model: g.model.clone(),
        state: condition_pb(g.state) as i32,
        reasons: g
            .reasons
            .iter()
            .map(|r| pb::HealthReason {
                signal: r.signal.clone(),
                detail: r.detail.clone(),
                action: r.action.clone(),
                gpu_only: r.gpu_only,
                since_unix: r.since_unix,
            })
            .collect(),
        lease_id: g.lease.clone(),
    }
}

/// The org tree for `allot share`.
pub fn tree_pb(t: TreeView) -> pb::GetTreeResponse {
    pb::GetTreeResponse {
        groups: t
            .groups
            .into_iter()
            .map(|g| pb::Group {
                name: g.name,
                parent: g.parent,
                weight: g.weight,
                share: g.share,
                entitled_gpu_hours: g.entitled_gpu_hours,
                served_gpu_hours: g.served_gpu_hours,
                ratio: g.ratio,
                running_gpus: g.running_gpus,
                pending_gpus: g.pending_gpus,
                project: g.project,
                depth: g.depth,
                counted_gpu_hours: g.counted_gpu_hours,
                fair_gpu_hours: g.fair_gpu_hours,
                gpu_util: g.gpu_util,
            })
            .collect(),
        window_hours: t.window_hours,
        capacity_gpus: t.capacity_gpus,
        weighted_capacity_gpus: t.weighted_capacity_gpus,
        covered_hours: t.covered_hours,
        horizon_hours: t.horizon_hours,
        ranking_window_hours: t.ranking_window_hours,
        drf: t.drf,
    }
}

/// What the agent reported of a drain.
pub fn host_drain(d: &pb::DrainInfo) -> HostDrain {
    HostDrain {
        by: d.by.clone(),
        author: d.author.clone(),
        reason: d.reason.clone(),
        now: d.now,
        held: d.held,
    }
}

/// The wire form of a node's drains: allotd's own and those its agent reported.
fn drains_pb(n: &NodeRec) -> Vec<pb::DrainInfo> {
    let mut v: Vec<pb::DrainInfo> = n
        .drains
        .iter()
        .map(|(by, d)| pb::DrainInfo {
            by: by.clone(),
            author: if !d.author.is_empty() {
                d.author.clone()
            } else if by == DrainAuthor::Health.as_str() {
                "health monitor".into()
            } else {
                "allotd".into()
            },
            reason: d.reason.clone(),
            now: matches!(d.state, NodeState::DrainNow | NodeState::Down),
            since_unix: secs(d.since),
            held: false,
        })
        .collect();
    if let Some((r, now_)) = &n.held {
        v.push(pb::DrainInfo {
            by: DrainAuthor::Health.as_str().into(),
            author: "health monitor".into(),
            reason: r.clone(),
            now: *now_,
            held: true,
            ..Default::default()
        });
    }
    v
}

/// The wire form of a node.
pub fn node_pb(n: &NodeRec, leases: &[(u64, Vec<String>)], free: u32, now_: u64) -> pb::Node {
    // What the core remembers of this node (held parts, a refusal) is added by the
    // caller, which holds the core.
    let drains = drains_pb(n);
    let mut gpu_list: Vec<pb::Gpu> = n.gpus.iter().map(gpu_pb).collect();
    for g in &mut gpu_list {
        // The agent's view names only its own leases; allotd knows its placements.
        if let Some((l, _)) = leases.iter().find(|(_, u)| u.contains(&g.uuid)) {
            g.lease_id = lease_wire(*l);
        }
    }
    pb::Node {
        name: n.spec.name.clone(),
        cluster: n.spec.cluster.clone(),
        state: state_name(n.state).into(),
        connected: n.connected,
        gpus: n.spec.gpus,
        free_gpus: free,
        cpu: n.spec.cpu,
        memory_gb: u64::from(n.spec.memory_gb),
        verdict: verdict_pb(n.verdict) as i32,
        lease_ids: leases.iter().map(|(l, _)| lease_wire(*l)).collect(),
        drain_reason: drains
            .iter()
            .find(|d| !d.held)
            .map(|d| format!("{}: {}", d.by, d.reason))
            .unwrap_or_default(),
        gpu_list,
        // A connected agent is heard from now; its stream would have broken otherwise.
        last_seen_unix: secs(if n.connected { now_ } else { n.last_seen }),
        drains,
        leaving_lease_ids: Vec::new(),
        refused_gpus: 0,
        gpu_type: n.spec.gpu_type.clone(),
        features: n.spec.features.clone(),
    }
}

/// How a lease ended, from its agent's report: allotd's side of the one end enum
/// (`LeaseEnd` on the wire, the core's `LeaseEnd` in the journal).
pub fn end_from_agent(end: pb::LeaseEnd, exit_code: Option<i32>) -> LeaseEnd {
    match end {
        pb::LeaseEnd::Exited if exit_code == Some(0) => LeaseEnd::Completed,
        pb::LeaseEnd::Revoked => LeaseEnd::Revoked,
        pb::LeaseEnd::TimeLimit => LeaseEnd::TimeLimit,
        // The host could not take it (drained, GPU taken): a fact about the node;
        // the work waits again and that node is not offered it until it changes.
        pb::LeaseEnd::Refused => LeaseEnd::Refused,
        // Fenced: its host stopped it, cut off from allotd, so that it could run
        // elsewhere; what allotd does at the fence's end if it has not heard.
        pb::LeaseEnd::GpuLost | pb::LeaseEnd::Vanished | pb::LeaseEnd::Fenced => LeaseEnd::NodeLost,
        pb::LeaseEnd::Exited | pb::LeaseEnd::FailedToStart | pb::LeaseEnd::Unspecified => {
            LeaseEnd::Failed
        }
    }
}

/// From a 0.1 agent, which names the end only in text (`end_reason`).
pub fn end_from_agent_text(end_reason: &str, exit_code: Option<i32>) -> LeaseEnd {
    end_from_agent(pb::LeaseEnd::from_name(end_reason), exit_code)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn agents_name_the_end_by_enum_and_0_1_agents_by_text() {
        use pb::LeaseEnd as E;
        assert_eq!(end_from_agent(E::Exited, Some(0)), LeaseEnd::Completed);
        assert_eq!(end_from_agent(E::Exited, Some(1)), LeaseEnd::Failed);
        assert_eq!(end_from_agent(E::Exited, None), LeaseEnd::Failed);
        assert_eq!(end_from_agent(E::Revoked, None), LeaseEnd::Revoked);
        assert_eq!(end_from_agent(E::TimeLimit, None), LeaseEnd::TimeLimit);
        assert_eq!(end_from_agent(E::GpuLost, None), LeaseEnd::NodeLost);
        assert_eq!(end_from_agent(E::Vanished, None), LeaseEnd::NodeLost);
        assert_eq!(end_from_agent(E::Refused, None), LeaseEnd::Refused);
        assert_eq!(end_from_agent(E::FailedToStart, None), LeaseEnd::Failed);
        assert_eq!(end_from_agent_text("vanished", None), LeaseEnd::NodeLost);
        assert_eq!(end_from_agent_text("refused", None), LeaseEnd::Refused);
        assert_eq!(end_from_agent_text("exploded", Some(0)), LeaseEnd::Failed);
    }
}
