//! The state machine's rules, one per test.

use super::hosts::FENCE_MARGIN;
use super::*;
use crate::config::{BreakerSection, ServerConfig, EXAMPLE};
use allot_fairshare::{LeaseEnd, NodeSpec, NodeState, Time, WorkloadSpec, WorkloadState};

pub(super) fn node(i: u32) -> Input {
    Input::AddNode {
        spec: NodeSpec {
            name: format!("n{i}"),
            cluster: "c".into(),
            gpus: 2,
            cpu: 8,
            memory_gb: 64,
            ..Default::default()
        },
        gpu_uuids: vec![format!("GPU-{i}-0"), format!("GPU-{i}-1")],
    }
}

pub(super) fn allocator(nodes: u32) -> Allocator {
    let mut cfg = ServerConfig::parse(EXAMPLE, "example").expect("example");
    cfg.breaker = BreakerSection {
        max_share: 0.5,
        window: 300,
    };
    let mut a = Allocator::new(&cfg).expect("allocator");
    for i in 0..nodes {
        a.apply(0, &node(i)).expect("node");
    }
    a
}

fn health_drain(a: &mut Allocator, at: Time, i: u32) {
    a.apply(
        at,
        &Input::NodeState {
            node: format!("n{i}"),
            state: NodeState::Draining,
            reason: "xid:79".into(),
            by: "health".into(),
            author: String::new(),
        },
    )
    .expect("drain");
}

#[test]
fn the_breaker_holds_automatic_drains_past_the_share_within_the_window() {
    let mut a = allocator(4);
    assert!(a.breaker_allows(10, "n0"));
    health_drain(&mut a, 10, 0);
    assert!(a.breaker_allows(20, "n1"));
    health_drain(&mut a, 20, 1);
    // A third node within 5 minutes would be 75 % of the cluster: held.
    assert!(!a.breaker_allows(30, "n2"));
    // A node already counted does not count twice.
    assert!(a.breaker_allows(30, "n1"));
    // Once the window has passed, drains go through again.
    assert!(a.breaker_allows(10 + 301, "n2") || a.breaker_allows(20 + 301, "n2"));
    // Operators' drains never count.
    let mut a = allocator(2);
    a.apply(
        0,
        &Input::NodeState {
            node: "n0".into(),
            state: NodeState::Draining,
            reason: "maintenance".into(),
            by: "cluster-operator".into(),
            author: String::new(),
        },
    )
    .expect("drain");
    assert!(a.breaker_allows(1, "n1"));
}

#[test]
fn journal_entries_of_0_1_keep_their_requeue_rule() {
    let old = r#"{"kind":"submit","spec":{"project":"p","user":"u","class":"batch","gpus_per_node":1,"nodes":1,"cpu_per_node":0,"mem_per_node_gb":0,"min_runtime":0,"time_limit":null,"resumable":RES,"priority":0},"argv":["x"],"hook":""}"#;
    for (res, no_requeue) in [("false", true), ("true", false)] {
        let Ok(Input::Submit { spec, .. }) = Input::decode(&old.replace("RES", res)) else {
            panic!("a 0.1 submission decodes");
        };
        assert_eq!(spec.no_requeue, no_requeue, "resumable {res}");
    }
    // What this release writes reads back as written.
    let new = old
        .replace("RES", "false")
        .replace(r#""priority":0}"#, r#""priority":0,"no_requeue":false}"#);
    let Ok(Input::Submit { spec, .. }) = Input::decode(&new) else {
        panic!("decodes");
    };
    assert!(!spec.no_requeue);
}

#[test]
fn replaying_the_inputs_rebuilds_the_same_state() {
    let spec = |p: &str, min| WorkloadSpec {
        project: p.into(),
        user: "u".into(),
        class: "batch".into(),
        gpus_per_node: 1,
        nodes: 1,
        cpu_per_node: 0,
        mem_per_node_gb: 0,
        min_runtime: min,
        time_limit: None,
        resumable: true,
        priority: 0,
        no_requeue: false,
        ..Default::default()
    };
    let mut inputs: Vec<(Time, Input)> = (0..2).map(|i| (0, node(i))).collect();
    for k in 0..6u64 {
        inputs.push((
            k,
            Input::Submit {
                spec: spec(if k % 2 == 0 { "demo-a" } else { "demo-b" }, 60 * k),
                argv: vec!["x".into()],
                hook: String::new(),
                cwd: String::new(),
                env: Vec::new(),
                output: String::new(),
                error: String::new(),
                warn: None,
                name: String::new(),
                gates: Default::default(),
                array: None,
                script: String::new(),
                notify: Vec::new(),
                pty: false,
            },
        ));
        inputs.push((k, Input::Schedule));
    }
    inputs.push((
        100,
        Input::LeaseEnded {
            lease: 1,
            end: LeaseEnd::Completed,
            reason: "done".into(),
            node: String::new(),
            exit_code: None,
            signal: None,
            part: false,
            leaving: false,
        },
    ));
    inputs.push((100, Input::Schedule));
    inputs.push((4_000, Input::Schedule));
    let run = |inputs: &[(Time, Input)]| {
        let mut a = allocator(0);
        let mut sent = Vec::new();
        for (t, i) in inputs {
            if let Ok(ap) = a.apply(*t, i) {
                sent.extend(ap.outs);
            }
        }
        let view: Vec<(u64, WorkloadState, Vec<u64>, Vec<String>)> = a
            .workloads()
            .values()
            .map(|w| (w.id, w.state, w.leases.clone(), w.nodes.clone()))
            .collect();
        (
            view,
            sent,
            a.core.usage_gpu_secs(allot_fairshare::GroupId(0), 5_000),
        )
    };
    let (v1, s1, u1) = run(&inputs);
    let (v2, s2, u2) = run(&inputs);
    assert_eq!(v1, v2);
    assert_eq!(s1, s2);
    assert_eq!(u1, u2);
    assert!(u1 > 0.0, "usage was charged");
    assert!(v1.iter().any(|w| w.1 == WorkloadState::Completed));
}

// ---------------------------------------------------------------- health and hosts

fn gpu(index: u32, state: GpuCondition) -> GpuSeen {
    GpuSeen {
        index,
        state,
        lease: String::new(),
    }
}

fn report(i: u32, verdict: Verdict, failed_gpu: Option<u32>) -> Input {
    Input::Health {
        node: format!("n{i}"),
        verdict,
        gpus: (0..2)
            .map(|g| {
                gpu(
                    g,
                    if failed_gpu == Some(g) {
                        GpuCondition::Failed
                    } else {
                        GpuCondition::Healthy
                    },
                )
            })
            .collect(),
        reasons: if verdict == Verdict::Ok {
            String::new()
        } else {
            format!("0000:0{i}:00 xid:79")
        },
        drains: Vec::new(),
    }
}

fn registration(i: u32, running: Vec<u64>, drains: Vec<HostDrain>) -> Input {
    let Input::AddNode { spec, gpu_uuids } = node(i) else {
        unreachable!("node() is an AddNode")
    };
    Input::Register {
        spec,
        gpu_uuids,
        gpus: vec![gpu(0, GpuCondition::Healthy), gpu(1, GpuCondition::Healthy)],
        running,
        drains,
        addr: String::new(),
        highest_workload: 0,
        highest_lease: 0,
        end_strays: true,
        fence_s: 0,
    }
}

/// A registration whose agent fences within `fence_s`.
fn fencing(i: u32, fence_s: u64) -> Input {
    let mut r = registration(i, Vec::new(), Vec::new());
    if let Input::Register { fence_s: f, .. } = &mut r {
        *f = fence_s;
    }
    r
}

fn sends(ap: &Applied, to: &str) -> Vec<Command> {
    ap.outs
        .iter()
        .filter_map(|o| match o {
            Out::Send { node, cmd } if node == to => Some(cmd.clone()),
            _ => None,
        })
        .collect()
}

fn notices(ap: &Applied) -> Vec<(Level, String)> {
    ap.outs
        .iter()
        .filter_map(|o| match o {
            Out::Notice { level, text, .. } => Some((*level, text.clone())),
            _ => None,
        })
        .collect()
}

fn health_cmd(drain: bool, now: bool, reasons: &str) -> Command {
    Command::Drain {
        drain,
        now,
        reason: reasons.into(),
        by: "health".into(),
    }
}

#[test]
fn the_breaker_lets_health_drains_through_then_holds_them_until_the_window_has_room() {
    let mut a = allocator(4);
    for (t, i) in [(10, 0), (20, 1)] {
        let ap = a
            .apply(t, &report(i, Verdict::Drain, None))
            .expect("report");
        assert!(ap.changed, "a drain let through is journaled");
        let n = &a.nodes()[&format!("n{i}")];
        assert_eq!(n.state, NodeState::Draining);
        assert!(n.drains.contains_key("health") && n.held.is_none());
        assert_eq!(
            sends(&ap, &format!("n{i}")),
            vec![health_cmd(true, false, &format!("0000:0{i}:00 xid:79"))]
        );
    }
    // A third host within the window would be 75 % of the cluster: held, and the
    // host told to hold it too; the operator's log says so once.
    let ap = a
        .apply(30, &report(2, Verdict::Drain, None))
        .expect("report");
    assert!(ap.changed, "a hold is journaled");
    let n2 = &a.nodes()["n2"];
    assert_eq!(n2.state, NodeState::Ready);
    assert!(!n2.drains.contains_key("health"));
    assert_eq!(n2.held, Some(("0000:02:00 xid:79".to_string(), false)));
    assert_eq!(
        sends(&ap, "n2"),
        vec![Command::Hold {
            now: false,
            reasons: "0000:02:00 xid:79".into()
        }]
    );
    assert_eq!(a.counters.breaker_held, 1);
    assert!(matches!(&notices(&ap)[..], [(Level::Error, t)] if t.contains("HELD")));
    // The same report again: held again, not counted again, nothing to journal.
    let ap = a
        .apply(40, &report(2, Verdict::Drain, None))
        .expect("report");
    assert!(!ap.changed);
    assert_eq!(a.counters.breaker_held, 1);
    assert!(notices(&ap).is_empty());
    assert_eq!(sends(&ap, "n2").len(), 1);
    // Re-checked while the window is full: still held, nothing journaled.
    let ap = a
        .apply(300, &Input::RecheckHeld { node: "n2".into() })
        .expect("recheck");
    assert!(!ap.changed && ap.outs.is_empty());
    // Once the first two drains are older than the window, it goes through.
    let ap = a
        .apply(321, &Input::RecheckHeld { node: "n2".into() })
        .expect("recheck");
    assert!(ap.changed);
    let n2 = &a.nodes()["n2"];
    assert_eq!(n2.state, NodeState::Draining);
    assert!(n2.held.is_none());
    assert_eq!(
        sends(&ap, "n2"),
        vec![health_cmd(true, false, "0000:02:00 xid:79")]
    );
    // A node with nothing held has nothing to re-check.
    let ap = a
        .apply(322, &Input::RecheckHeld { node: "n3".into() })
        .expect("recheck");
    assert!(!ap.changed && ap.outs.is_empty());
}

#[test]
fn a_drain_now_caused_by_a_failed_gpu_is_downgraded_to_a_drain() {
    // Four nodes: two health drains are within the breaker's share.
    let mut a = allocator(4);
    // GPU 1 failed: the agent ended its lease itself; the others keep their
    // protection (drain at the lapse), and the core stops offering that GPU.
    let ap = a
        .apply(5, &report(0, Verdict::DrainNow, Some(1)))
        .expect("report");
    let n0 = &a.nodes()["n0"];
    assert_eq!(n0.state, NodeState::Draining);
    assert_eq!(
        sends(&ap, "n0"),
        vec![health_cmd(true, false, "0000:00:00 xid:79")]
    );
    let healthy = a.core.cluster().node(n0.id).healthy;
    assert_eq!(healthy & 0b10, 0, "GPU 1 is unhealthy in the core");
    assert_eq!(healthy & 0b01, 0b01, "GPU 0 stays healthy");
    // Without a failed GPU a drain-now stays a drain-now.
    let ap = a
        .apply(6, &report(1, Verdict::DrainNow, None))
        .expect("report");
    assert_eq!(a.nodes()["n1"].state, NodeState::DrainNow);
    assert_eq!(
        sends(&ap, "n1"),
        vec![health_cmd(true, true, "0000:01:00 xid:79")]
    );
    // The GPU comes back healthy: the core offers it again.
    a.apply(7, &report(0, Verdict::Drain, None))
        .expect("report");
    let n0 = &a.nodes()["n0"];
    assert_eq!(a.core.cluster().node(n0.id).healthy & 0b11, 0b11);
}

#[test]
fn an_ok_verdict_lifts_the_health_drain_and_no_other() {
    let mut a = allocator(2);
    a.apply(1, &report(0, Verdict::Drain, None))
        .expect("report");
    a.apply(
        2,
        &Input::NodeState {
            node: "n0".into(),
            state: NodeState::Draining,
            reason: "maintenance".into(),
            by: "cluster-operator".into(),
            author: String::new(),
        },
    )
    .expect("operator drain");
    let ap = a.apply(3, &report(0, Verdict::Ok, None)).expect("report");
    assert!(ap.changed);
    let n0 = &a.nodes()["n0"];
    assert!(!n0.drains.contains_key("health"));
    assert!(n0.drains.contains_key("cluster-operator"));
    assert_eq!(n0.state, NodeState::Draining, "the operator's drain stays");
    assert_eq!(
        sends(&ap, "n0"),
        vec![health_cmd(false, false, "health verdict ok")]
    );
    // Healthy again and again: nothing changes, nothing to journal or send.
    let ap = a.apply(4, &report(0, Verdict::Ok, None)).expect("report");
    assert!(!ap.changed && ap.outs.is_empty());
}

#[test]
fn an_ok_verdict_forgets_a_held_drain() {
    let mut a = allocator(2);
    a.apply(1, &report(0, Verdict::Drain, None))
        .expect("report");
    a.apply(2, &report(1, Verdict::Drain, None))
        .expect("report");
    assert!(
        a.nodes()["n1"].held.is_some(),
        "one of two nodes is the limit"
    );
    let ap = a.apply(3, &report(1, Verdict::Ok, None)).expect("report");
    assert!(ap.changed);
    assert!(a.nodes()["n1"].held.is_none());
    assert_eq!(a.nodes()["n1"].state, NodeState::Ready);
}

#[test]
fn the_hosts_own_drain_is_recorded_and_lifted_from_its_reports() {
    let mut a = allocator(1);
    let mut r = report(0, Verdict::Ok, None);
    let local = HostDrain {
        by: "local-operator".into(),
        author: "alice".into(),
        reason: "bios update".into(),
        now: false,
        held: false,
    };
    if let Input::Health { drains, .. } = &mut r {
        drains.push(local);
    }
    let ap = a.apply(1, &r).expect("report");
    assert!(ap.changed);
    let d = &a.nodes()["n0"].drains["local-operator"];
    assert_eq!(
        (d.reason.as_str(), d.author.as_str()),
        ("bios update", "alice")
    );
    assert_eq!(a.nodes()["n0"].state, NodeState::Draining);
    // The host's own drain is not echoed back to it.
    assert!(sends(&ap, "n0").is_empty());
    assert!(!a.apply(2, &r).expect("report").changed);
    a.apply(3, &report(0, Verdict::Ok, None)).expect("report");
    assert_eq!(a.nodes()["n0"].state, NodeState::Ready);
}

pub(super) fn batch(project: &str) -> Input {
    Input::Submit {
        spec: WorkloadSpec {
            project: project.into(),
            user: "u".into(),
            class: "batch".into(),
            gpus_per_node: 1,
            nodes: 1,
            cpu_per_node: 0,
            mem_per_node_gb: 0,
            min_runtime: 0,
            time_limit: None,
            resumable: true,
            priority: 0,
            no_requeue: false,
            ..Default::default()
        },
        argv: vec!["x".into()],
        hook: String::new(),
        cwd: String::new(),
        env: Vec::new(),
        output: String::new(),
        error: String::new(),
        warn: None,
        name: String::new(),
        gates: Default::default(),
        array: None,
        script: String::new(),
        notify: Vec::new(),
        pty: false,
    }
}

#[test]
fn registration_reconciles_the_leases_both_sides_hold() {
    let mut a = allocator(0);
    let ap = a
        .apply(0, &registration(0, Vec::new(), Vec::new()))
        .expect("new");
    assert!(ap.changed && a.nodes().contains_key("n0"));
    a.apply(1, &batch("demo-a")).expect("submit");
    a.apply(1, &batch("demo-b")).expect("submit");
    a.apply(2, &Input::Schedule).expect("pass");
    let live: Vec<u64> = a.leases_on("n0").into_iter().map(|(l, _)| l).collect();
    assert_eq!(live.len(), 2, "both run on n0's two GPUs");
    let (kept, ended) = (live[0], live[1]);
    a.apply(
        3,
        &Input::LeaseEnded {
            lease: ended,
            end: LeaseEnd::Completed,
            reason: "done".into(),
            node: "n0".into(),
            exit_code: None,
            signal: None,
            part: false,
            leaving: false,
        },
    )
    .expect("ended");
    a.apply(4, &batch("demo-a")).expect("submit");
    a.apply(5, &Input::Schedule).expect("pass");
    let missing = a
        .leases_on("n0")
        .into_iter()
        .map(|(l, _)| l)
        .find(|l| *l != kept)
        .expect("a third lease on n0");
    // The host comes back running `kept`, the lease allotd holds as ended, and one
    // allotd never placed; it lacks `missing`.
    let ap = a
        .apply(6, &registration(0, vec![kept, ended, 999], Vec::new()))
        .expect("register");
    assert!(ap.changed);
    let cmds = sends(&ap, "n0");
    assert_eq!(cmds.len(), 2, "{cmds:?}");
    let Command::Start(s) = &cmds[0] else {
        panic!("the missing lease is started again: {cmds:?}");
    };
    assert_eq!(s.lease, missing);
    assert_eq!(s.gpu_uuids.len(), 1);
    assert_eq!(s.argv, vec!["x".to_string()]);
    // A lease allotd holds as ended is ended on the host too, so its work never
    // runs twice; one allotd never placed is left running and reported.
    assert!(
        matches!(&cmds[1], Command::Revoke { lease, not_before: 0, .. } if *lease == ended),
        "{cmds:?}"
    );
    let n = notices(&ap);
    assert_eq!(n.len(), 1, "{n:?}");
    assert!(n[0].1.contains("A-999") && n[0].1.contains("never placed"));
    // Nothing allotd holds was revoked or ended by it.
    assert_eq!(a.leases_on("n0").len(), 2);
}

#[test]
fn a_node_silent_past_the_grace_is_lost_and_its_parts_end_once_its_host_has_fenced_them() {
    let mut a = allocator(0);
    a.apply(0, &fencing(0, 500)).expect("n0");
    a.apply(0, &fencing(1, 500)).expect("n1");
    a.apply(1, &batch("demo-a")).expect("submit");
    a.apply(2, &Input::Schedule).expect("pass");
    let on: Vec<(String, u64)> = ["n0", "n1"]
        .iter()
        .flat_map(|n| a.leases_on(n).into_iter().map(|(l, _)| (n.to_string(), l)))
        .collect();
    assert_eq!(on.len(), 1, "{on:?}");
    let (node, lease) = on[0].clone();
    let other = if node == "n0" { "n1" } else { "n0" };
    a.agent_connected(other, 0, Vec::new());
    a.agent_heard(&node, 8);
    a.agent_disconnected(&node, 10);
    // Silent for the grace and no more: not lost; past it: lost. The connected
    // node never is, and a process that started later counts from its start.
    assert!(a.silent_nodes(310, 0, 300).is_empty());
    assert_eq!(a.silent_nodes(311, 0, 300), vec![node.clone()]);
    assert!(
        a.silent_nodes(400, 200, 300).is_empty(),
        "counted from the start"
    );
    a.apply(311, &Allocator::lost_input(&node, 300))
        .expect("lost");
    assert_eq!(a.nodes()[&node].state, NodeState::Down);
    assert!(a.silent_nodes(1_000, 0, 300).is_empty(), "down already");
    // Lost, its work is not over: the host may still run it until its fence (500 s
    // after its last word) and the margin have passed, counted from allotd's start
    // at the earliest.
    assert_eq!(
        a.leases_on(&node).len(),
        1,
        "held while the host may run it"
    );
    // From the last message, not the stream's end: nothing later reached the host.
    let over = 8 + 500 + FENCE_MARGIN;
    assert!(a.fenced_nodes(over - 1, 0).is_empty());
    assert_eq!(a.fenced_nodes(over, 0), vec![node.clone()]);
    assert!(
        a.fenced_nodes(over, 100).is_empty(),
        "counted from the start"
    );
    let parts = a.lost_parts(&node);
    assert!(
        matches!(
            parts.as_slice(),
            [Input::LeaseEnded { lease: l, end: LeaseEnd::NodeLost, part: true, leaving: true, .. }] if *l == lease
        ),
        "{parts:?}"
    );
    for p in &parts {
        a.apply(over, p).expect("part ended");
    }
    assert!(a.leases_on(&node).is_empty());
    assert!(
        a.fenced_nodes(over + 1, 0).is_empty(),
        "nothing left to end"
    );
    assert_eq!(
        a.workloads()[&1].state,
        WorkloadState::Pending,
        "resumable: requeued"
    );
}

#[test]
fn a_lost_node_whose_agent_does_not_fence_keeps_its_leases_until_it_reports() {
    let mut a = allocator(0);
    a.apply(0, &registration(0, Vec::new(), Vec::new()))
        .expect("n0");
    a.apply(1, &batch("demo-a")).expect("submit");
    a.apply(2, &Input::Schedule).expect("pass");
    assert_eq!(a.leases_on("n0").len(), 1);
    a.agent_disconnected("n0", 10);
    a.apply(311, &Allocator::lost_input("n0", 300))
        .expect("lost");
    assert!(
        a.fenced_nodes(1 << 40, 0).is_empty(),
        "never: it may still run"
    );
    // A heartbeat's word replaces the registration's, as a reload changes it.
    a.agent_fences("n0", 60);
    assert_eq!(
        a.fenced_nodes(10 + 60 + FENCE_MARGIN, 0),
        vec!["n0".to_string()]
    );
}

#[test]
fn registration_reconciles_drains_and_brings_a_lost_node_back() {
    let mut a = allocator(0);
    a.apply(0, &registration(0, Vec::new(), Vec::new()))
        .expect("new");
    for (state, by, reason) in [
        (NodeState::Draining, "cluster-operator", "maintenance"),
        (NodeState::Down, "lost", "agent silent"),
    ] {
        a.apply(
            1,
            &Input::NodeState {
                node: "n0".into(),
                state,
                reason: reason.into(),
                by: by.into(),
                author: String::new(),
            },
        )
        .expect("drain");
    }
    assert_eq!(a.nodes()["n0"].state, NodeState::Down);
    // The host still holds a health drain that allotd lifted meanwhile.
    let stale = HostDrain {
        by: "health".into(),
        author: "allotd".into(),
        reason: "xid:79".into(),
        now: false,
        held: false,
    };
    let ap = a
        .apply(2, &registration(0, Vec::new(), vec![stale]))
        .expect("register");
    let n0 = &a.nodes()["n0"];
    assert!(!n0.drains.contains_key("lost"), "back from lost");
    assert_eq!(n0.state, NodeState::Draining, "the operator's drain stays");
    assert_eq!(
        sends(&ap, "n0"),
        vec![
            Command::Drain {
                drain: true,
                now: false,
                reason: "maintenance".into(),
                by: "cluster-operator".into(),
            },
            health_cmd(false, false, ""),
        ]
    );
}

/// Applies inputs as allotd does: only those that change something are journaled.
fn run_journaled(a: &mut Allocator, inputs: &[(Time, Input)]) -> Vec<(Time, Input)> {
    let mut journal = Vec::new();
    for (t, i) in inputs {
        if let Ok(ap) = a.apply(*t, i) {
            if ap.changed {
                journal.push((*t, ap.record.unwrap_or_else(|| i.clone())));
            }
        }
    }
    journal
}

type NodeView = (
    NodeState,
    Vec<(String, DrainRec)>,
    Option<(String, bool)>,
    Verdict,
    Vec<GpuSeen>,
    u64,
);

fn node_views(a: &Allocator) -> Vec<NodeView> {
    a.nodes()
        .values()
        .map(|n| {
            (
                n.state,
                n.drains
                    .iter()
                    .map(|(k, d)| (k.clone(), d.clone()))
                    .collect(),
                n.held.clone(),
                n.verdict,
                n.seen.clone(),
                a.core.cluster().node(n.id).healthy,
            )
        })
        .collect()
}

#[test]
fn replaying_the_journal_of_health_and_registrations_rebuilds_the_same_state() {
    let mut inputs: Vec<(Time, Input)> = (0..4)
        .map(|i| (0, registration(i, Vec::new(), Vec::new())))
        .collect();
    inputs.push((1, batch("demo-a")));
    inputs.push((1, Input::Schedule));
    inputs.push((10, report(0, Verdict::Drain, None)));
    inputs.push((11, report(1, Verdict::DrainNow, Some(0))));
    inputs.push((12, report(2, Verdict::Drain, None)));
    inputs.push((13, report(2, Verdict::Drain, None)));
    inputs.push((14, report(3, Verdict::Ok, None)));
    inputs.push((20, Input::RecheckHeld { node: "n2".into() }));
    inputs.push((30, report(0, Verdict::Ok, None)));
    inputs.push((400, Input::RecheckHeld { node: "n2".into() }));
    inputs.push((401, registration(1, Vec::new(), Vec::new())));
    inputs.push((402, report(1, Verdict::Ok, None)));
    inputs.push((403, Input::Schedule));
    let mut live = allocator(0);
    let journal = run_journaled(&mut live, &inputs);
    assert!(
        journal.len() < inputs.len(),
        "unchanged reports are not journaled"
    );
    // Through the journal's own encoding, as allotd reopens it.
    let mut replayed = allocator(0);
    for (t, i) in &journal {
        let text = serde_json::to_string(i).expect("encode");
        let back = Input::decode(&text).expect("decode");
        assert_eq!(&back, i);
        replayed.apply(*t, &back).expect("replays");
    }
    assert_eq!(node_views(&live), node_views(&replayed));
    assert_eq!(live.counters.breaker_held, 1);
    assert_eq!(live.counters.breaker_held, replayed.counters.breaker_held);
    assert_eq!(live.counters.drains, replayed.counters.drains);
    let views = |a: &Allocator| -> Vec<(u64, WorkloadState, Vec<u64>)> {
        a.workloads()
            .values()
            .map(|w| (w.id, w.state, w.leases.clone()))
            .collect()
    };
    assert_eq!(views(&live), views(&replayed));
    // The held drain went through once the window had room.
    assert_eq!(live.nodes()["n2"].state, NodeState::Draining);
}

#[test]
fn the_new_inputs_read_with_their_fields_left_out() {
    let Ok(Input::Health {
        node,
        verdict,
        gpus,
        reasons,
        drains,
    }) = Input::decode(r#"{"kind":"health","node":"n0"}"#)
    else {
        panic!("a bare health entry decodes");
    };
    assert_eq!(node, "n0");
    assert_eq!(verdict, Verdict::Unspecified);
    assert!(gpus.is_empty() && reasons.is_empty() && drains.is_empty());
    let r = Input::decode(
        r#"{"kind":"register","spec":{"name":"n0","cluster":"c","gpus":1,"cpu":1,"memory_gb":1},"gpu_uuids":["GPU-0"]}"#,
    );
    assert!(matches!(r, Ok(Input::Register { running, .. }) if running.is_empty()));
    assert!(matches!(
        Input::decode(r#"{"kind":"recheck-held","node":"n0"}"#),
        Ok(Input::RecheckHeld { .. })
    ));
}

/// A day of work on four nodes: funded and free work, a gang, ends, a drain, a
/// health report and a weight change.
fn busy_day() -> Vec<(Time, Input)> {
    let mut inputs: Vec<(Time, Input)> = (0..4)
        .map(|i| (0, registration(i, Vec::new(), Vec::new())))
        .collect();
    let gang = |nodes| Input::Submit {
        spec: WorkloadSpec {
            project: "demo-b".into(),
            user: "u".into(),
            class: "batch".into(),
            gpus_per_node: 2,
            nodes,
            cpu_per_node: 0,
            mem_per_node_gb: 0,
            min_runtime: 3_600,
            time_limit: None,
            resumable: false,
            priority: 0,
            no_requeue: false,
            ..Default::default()
        },
        argv: vec!["x".into()],
        hook: String::new(),
        cwd: String::new(),
        env: Vec::new(),
        output: String::new(),
        error: String::new(),
        warn: None,
        name: String::new(),
        gates: Default::default(),
        array: None,
        script: String::new(),
        notify: Vec::new(),
        pty: false,
    };
    for k in 0..8u64 {
        let t = 1 + k * 600;
        inputs.push((t, batch(if k % 2 == 0 { "demo-a" } else { "demo-b" })));
        inputs.push((t, gang(1 + (k % 2) as u32)));
        inputs.push((t, Input::Schedule));
    }
    inputs.push((
        5_000,
        Input::LeaseEnded {
            lease: 1,
            end: LeaseEnd::Completed,
            reason: "done".into(),
            node: String::new(),
            exit_code: None,
            signal: None,
            part: false,
            leaving: false,
        },
    ));
    inputs.push((
        5_001,
        Input::NodeState {
            node: "n1".into(),
            state: NodeState::Draining,
            reason: "rack maintenance".into(),
            by: "cluster-operator".into(),
            author: "ops".into(),
        },
    ));
    inputs.push((5_002, report(2, Verdict::Drain, None)));
    inputs.push((
        5_003,
        Input::SetWeight {
            group: "demo-b".into(),
            weight: 3.0,
            by: "boss".into(),
        },
    ));
    inputs.push((5_004, Input::Schedule));
    inputs.push((9_000, Input::Schedule));
    inputs
}

type WorkView = (
    u64,
    WorkloadState,
    Vec<u64>,
    Vec<String>,
    u32,
    String,
    Vec<RunRec>,
);

fn work_views(a: &Allocator) -> Vec<WorkView> {
    a.workloads()
        .values()
        .map(|w| {
            (
                w.id,
                w.state,
                w.leases.clone(),
                w.nodes.clone(),
                w.preemptions,
                w.end_reason.clone(),
                w.runs.clone(),
            )
        })
        .collect()
}

#[test]
fn a_snapshot_at_any_point_plus_the_tail_is_the_live_state() {
    let inputs = busy_day();
    let mut live = allocator(0);
    let journal = run_journaled(&mut live, &inputs);
    assert!(
        journal
            .iter()
            .any(|(_, i)| matches!(i, Input::Decided { .. })),
        "passes are journaled as their decisions"
    );
    assert!(!journal.iter().any(|(_, i)| matches!(i, Input::Schedule)));
    assert!(
        live.core.leases().any(|l| l.revoke.is_some()),
        "a drain revokes"
    );
    assert!(live.core.leases().count() >= 3, "work runs");
    let cfg = ServerConfig::parse(EXAMPLE, "example").expect("example");
    for cut in 0..=journal.len() {
        let mut head = allocator(0);
        for (t, i) in &journal[..cut] {
            head.apply(*t, i).expect("applies");
        }
        // Through the snapshot's own encoding, as allotd reopens it.
        let text = serde_json::to_string(&head.snapshot()).expect("encodes");
        let snap: Snapshot = serde_json::from_str(&text).expect("decodes");
        let mut back = Allocator::restore(&cfg, &snap, 9_000).expect("restores");
        for (t, i) in &journal[cut..] {
            back.apply(*t, i).expect("the tail applies");
        }
        assert_eq!(work_views(&back), work_views(&live), "cut at {cut}");
        assert_eq!(node_views(&back), node_views(&live), "cut at {cut}");
        for n in live.nodes().keys() {
            assert_eq!(back.leases_on(n), live.leases_on(n), "cut at {cut}, {n}");
        }
        assert_eq!(back.core.facts().leases, live.core.facts().leases);
        assert_eq!(back.core.facts().usage, live.core.facts().usage);
        assert_eq!(back.counters.drains, live.counters.drains);
        // The held rendezvous ports are derived again, the same.
        assert_eq!(back.ports, live.ports, "cut at {cut}");
    }
    assert!(
        live.workloads()
            .values()
            .any(|w| w.runs.len() == 1 && w.runs[0].nodes.len() == 2 && w.runs[0].master_port != 0),
        "a gang ran with a rendezvous port"
    );
}

#[test]
fn a_changed_policy_constant_moves_no_lease_of_the_journal() {
    let inputs = busy_day();
    let mut live = allocator(0);
    let journal = run_journaled(&mut live, &inputs);
    // The next release preempts differently and ages faster: the journal's
    // decisions still stand as they were made.
    let mut cfg = ServerConfig::parse(EXAMPLE, "example").expect("example");
    cfg.policy.cooldown = 1;
    cfg.policy.aging_per_hour = 1_000;
    let mut upgraded = Allocator::new(&cfg).expect("allocator");
    for (t, i) in &journal {
        upgraded.apply(*t, i).expect("applies");
    }
    assert_eq!(work_views(&upgraded), work_views(&live));
    assert_eq!(upgraded.core.facts().leases, live.core.facts().leases);
}

#[test]
fn a_snapshot_of_a_later_layout_is_refused_naming_the_version() {
    let cfg = ServerConfig::parse(EXAMPLE, "example").expect("example");
    let snap = Snapshot {
        version: SNAPSHOT_VERSION + 1,
        ..Snapshot::default()
    };
    let Err(e) = Allocator::restore(&cfg, &snap, 0) else {
        panic!("a later layout was taken");
    };
    assert!(
        e.to_string().contains("newer than this allotd reads"),
        "{e}"
    );
}

#[test]
fn retiring_takes_out_only_work_that_ended_before_the_cut() {
    let inputs = busy_day();
    let mut a = allocator(0);
    run_journaled(&mut a, &inputs);
    let ended: Vec<(u64, Time)> = a
        .workloads()
        .values()
        .filter(|w| w.state.is_final())
        .map(|w| (w.id, w.end))
        .collect();
    assert!(!ended.is_empty());
    let live = a.workloads().len() - ended.len();
    let cut = ended.iter().map(|e| e.1).max().unwrap_or(0);
    let gone = a.retire(cut);
    assert!(gone.iter().all(|w| w.state.is_final() && w.end <= cut));
    assert_eq!(gone.len(), ended.len(), "all ended by the cut");
    assert_eq!(a.workloads().len(), live + ended.len() - gone.len());
    let snap = a.snapshot();
    assert!(snap.work.iter().all(|w| !gone.iter().any(|g| g.id == w.id)));
    assert!(snap.core.workloads.iter().all(|w| !w.state.is_final()));
    a.unretire(gone);
    assert_eq!(a.workloads().len(), live + ended.len());
}

#[test]
fn why_work_waits_is_rendered_on_read_for_pending_work_only() {
    let inputs = busy_day();
    let mut a = allocator(0);
    run_journaled(&mut a, &inputs);
    let pending: Vec<u64> = a
        .workloads()
        .values()
        .filter(|w| w.state == WorkloadState::Pending)
        .map(|w| w.id)
        .collect();
    assert!(!pending.is_empty());
    for id in pending {
        assert!(!a.why(9_000, id).0.is_empty(), "workload {id}");
    }
    let running = a
        .workloads()
        .values()
        .find(|w| w.state == WorkloadState::Running)
        .map(|w| w.id)
        .expect("running work");
    assert_eq!(a.why(9_000, running).0, "");
}

#[test]
fn journal_entries_read_with_only_their_identifying_fields() {
    let submit =
        r#"{"kind":"submit","spec":{"project":"demo-a","user":"u","gpus_per_node":1,"nodes":1}}"#;
    let Ok(Input::Submit {
        spec, argv, hook, ..
    }) = Input::decode(submit)
    else {
        panic!("a minimal submission reads");
    };
    assert_eq!(
        (spec.min_runtime, spec.priority, spec.class.as_str()),
        (0, 0, "")
    );
    assert!(argv.is_empty() && hook.is_empty());
    for text in [
        r#"{"kind":"lease-ended","lease":3,"end":"completed"}"#,
        r#"{"kind":"node-state","node":"n0","state":"draining","by":"cluster-operator"}"#,
        r#"{"kind":"register","spec":{"name":"n9","gpus":8}}"#,
        r#"{"kind":"token-revoked","id":"t-1"}"#,
    ] {
        assert!(Input::decode(text).is_ok(), "{text}");
    }
    // What identifies an entry is still required, and named when missing.
    let e = Input::decode(r#"{"kind":"lease-ended","end":"completed"}"#).expect_err("no lease");
    assert!(e.to_string().contains("lease"), "{e}");
}

// ---------------------------------------------------------------- gangs: ranks, ports, ends

/// An allocator whose `MASTER_PORT` range is `lo..=hi`, with `n` registered nodes
/// (2 GPUs each) at addresses 10.0.0.I.
fn with_ports(lo: u16, hi: u16, n: u32) -> Allocator {
    let mut cfg = ServerConfig::parse(EXAMPLE, "example").expect("example");
    cfg.server.master_ports = crate::config::PortRange { low: lo, high: hi };
    let mut a = Allocator::new(&cfg).expect("allocator");
    for i in 0..n {
        let Input::Register {
            spec,
            gpu_uuids,
            gpus,
            ..
        } = registration(i, Vec::new(), Vec::new())
        else {
            unreachable!("registration() is a Register")
        };
        a.apply(
            0,
            &Input::Register {
                spec,
                gpu_uuids,
                gpus,
                running: Vec::new(),
                drains: Vec::new(),
                addr: format!("10.0.0.{i}"),
                highest_workload: 0,
                highest_lease: 0,
                end_strays: true,
                fence_s: 0,
            },
        )
        .expect("registers");
    }
    a
}

fn work(nodes: u32, gpus: u32) -> Input {
    let Input::Submit { mut spec, .. } = batch("demo-a") else {
        unreachable!("batch() is a Submit")
    };
    spec.nodes = nodes;
    spec.gpus_per_node = gpus;
    spec.cpu_per_node = 4;
    spec.mem_per_node_gb = 16;
    Input::Submit {
        spec,
        argv: vec!["torchrun".into(), "train.py".into()],
        hook: String::new(),
        cwd: "/home/u/golf".into(),
        env: vec![("WANDB_PROJECT".into(), "golf".into())],
        output: "out-%j-%n".into(),
        error: String::new(),
        warn: None,
        name: String::new(),
        gates: Default::default(),
        array: None,
        script: String::new(),
        notify: Vec::new(),
        pty: false,
    }
}

/// Every start sent by one apply, by node.
fn starts(ap: &Applied) -> Vec<(String, StartLease)> {
    ap.outs
        .iter()
        .filter_map(|o| match o {
            Out::Send {
                node,
                cmd: Command::Start(s),
            } => Some((node.clone(), (**s).clone())),
            _ => None,
        })
        .collect()
}

fn env_of(s: &StartLease) -> BTreeMap<String, String> {
    s.allot_env().into_iter().collect()
}

#[test]
fn a_gang_starts_in_one_pass_every_part_knowing_the_whole() {
    let mut a = with_ports(29_500, 29_999, 2);
    a.apply(1, &work(2, 2)).expect("submit");
    let ap = a.apply(2, &Input::Schedule).expect("pass");
    let st = starts(&ap);
    // One action, all its hosts: no part is sent before every part is placed.
    assert_eq!(st.len(), 2, "{st:?}");
    let (n0, s0) = &st[0];
    let (n1, s1) = &st[1];
    assert_ne!(n0, n1);
    assert_eq!(s0.lease, s1.lease);
    assert_eq!((s0.rank, s1.rank), (0, 1));
    assert_eq!(s0.nodes, vec![n0.clone(), n1.clone()]);
    assert_eq!(s0.nodes, s1.nodes);
    assert_eq!((s0.run, s1.run), (1, 1));
    let rank0_addr = format!("10.0.0.{}", n0.trim_start_matches('n'));
    assert_eq!(s1.master_addr, rank0_addr, "rank 0's registered address");
    assert_eq!(s0.master_port, s1.master_port);
    assert!((29_500..=29_999).contains(&s0.master_port));
    assert_eq!(s0.cwd, "/home/u/golf");
    assert_eq!(
        s0.env,
        vec![("WANDB_PROJECT".to_string(), "golf".to_string())]
    );
    assert_eq!(s1.output, "out-%j-%n");
    // What the host's cgroup limits the work to.
    assert_eq!((s1.cpu_per_node, s1.mem_per_node_gb), (4, 16));
    let e = env_of(s1);
    let port = s0.master_port.to_string();
    for (k, v) in [
        ("ALLOT_WORKLOAD_ID", "1"),
        ("ALLOT_RUN", "1"),
        ("ALLOT_NODE_RANK", "1"),
        ("NODE_RANK", "1"),
        ("PET_NODE_RANK", "1"),
        ("ALLOT_NNODES", "2"),
        ("PET_NNODES", "2"),
        ("ALLOT_GPUS_PER_NODE", "2"),
        ("PET_NPROC_PER_NODE", "2"),
        ("WORLD_SIZE", "4"),
        ("MASTER_ADDR", rank0_addr.as_str()),
        ("PET_MASTER_ADDR", rank0_addr.as_str()),
        ("MASTER_PORT", port.as_str()),
        ("PET_MASTER_PORT", port.as_str()),
    ] {
        assert_eq!(e.get(k).map(String::as_str), Some(v), "{k}: {e:?}");
    }
    assert_eq!(e["ALLOT_NODELIST"], format!("{n0},{n1}"));
    // The run is kept, and a re-sent start (the host reconnects without it) says
    // the same.
    let w = &a.workloads()[&1];
    assert_eq!(
        w.runs,
        vec![RunRec {
            lease: s0.lease,
            nodes: s0.nodes.clone(),
            master_port: s0.master_port,
            start: 2,
            gpus: 4,
            ..RunRec::default()
        }]
    );
    let again = a
        .apply(
            3,
            &registration(
                n1.trim_start_matches('n').parse().expect("index"),
                Vec::new(),
                Vec::new(),
            ),
        )
        .expect("re-registers");
    let resent = starts(&again);
    assert_eq!(resent.len(), 1);
    assert_eq!(resent[0].1, *s1);
}

#[test]
fn single_node_work_is_rank_0_of_1_on_its_own_address() {
    let mut a = with_ports(29_500, 29_999, 1);
    a.apply(1, &work(1, 1)).expect("submit");
    let st = starts(&a.apply(2, &Input::Schedule).expect("pass"));
    let e = env_of(&st[0].1);
    assert_eq!(
        (
            e["NODE_RANK"].as_str(),
            e["ALLOT_NNODES"].as_str(),
            e["WORLD_SIZE"].as_str()
        ),
        ("0", "1", "1")
    );
    assert_eq!(e["MASTER_ADDR"], "10.0.0.0");
    assert_eq!(e["ALLOT_NODELIST"], "n0");
}

#[test]
fn the_master_port_is_deterministic_and_never_one_a_live_lease_on_rank_0_s_node_holds() {
    // Counted from the lease id, so consecutive leases spread over the range.
    let a = with_ports(40_000, 40_009, 1);
    assert_eq!(a.pick_port("n0", 3), Some(40_003));
    assert_eq!(a.pick_port("n0", 13), Some(40_003));
    assert_eq!(a.pick_port("n0", 3), a.pick_port("n0", 3));

    // A range of one port, two single-GPU leases on one node: the second finds it
    // held and starts without MASTER_PORT, said in the audit and the log.
    let mut a = with_ports(40_000, 40_000, 1);
    a.apply(1, &work(1, 1)).expect("submit");
    a.apply(1, &work(1, 1)).expect("submit");
    let ap = a.apply(2, &Input::Schedule).expect("pass");
    let st = starts(&ap);
    assert_eq!(st.len(), 2);
    assert_eq!(st[0].1.master_port, 40_000);
    assert_eq!(st[1].1.master_port, 0, "exhausted: none");
    let e = env_of(&st[1].1);
    assert!(
        !e.contains_key("MASTER_PORT") && !e.contains_key("PET_MASTER_PORT"),
        "{e:?}"
    );
    let held = ap.outs.iter().any(|o| matches!(o, Out::Audit { text, .. } if text.contains("no rendezvous port free on n0") && text.contains("master_ports")));
    assert!(held, "{:?}", ap.outs);
    assert!(notices(&ap)
        .iter()
        .any(|(l, t)| *l == Level::Warn && t.contains("40000-40000")));
    // Another node's rank 0 may hold the same port meanwhile.
    let mut b = with_ports(40_000, 40_000, 2);
    b.apply(1, &work(1, 2)).expect("submit");
    b.apply(1, &work(1, 2)).expect("submit");
    let st = starts(&b.apply(2, &Input::Schedule).expect("pass"));
    assert_eq!(st.len(), 2);
    assert_ne!(st[0].0, st[1].0);
    assert_eq!((st[0].1.master_port, st[1].1.master_port), (40_000, 40_000));
    // The first lease's end frees its port for the next start on n0.
    let first = st[0].1.lease;
    let node = st[0].0.clone();
    b.apply(
        3,
        &Input::LeaseEnded {
            lease: first,
            end: LeaseEnd::Completed,
            reason: "exited".into(),
            node: node.clone(),
            exit_code: Some(0),
            signal: None,
            part: true,
            leaving: false,
        },
    )
    .expect("ended");
    assert_eq!(b.pick_port(&node, 99), Some(40_000));
}

#[test]
fn the_master_port_is_the_same_on_replay() {
    let inputs: Vec<(Time, Input)> = (1..=6)
        .flat_map(|k| {
            let n = 1 + (k % 2) as u32;
            [(k, work(n, n)), (k, Input::Schedule)]
        })
        .collect();
    let mut live = with_ports(40_000, 40_003, 4);
    let journal = run_journaled(&mut live, &inputs);
    let mut again = with_ports(40_000, 40_003, 4);
    let mut sent = Vec::new();
    for (t, i) in &journal {
        sent.extend(starts(&again.apply(*t, i).expect("replays")));
    }
    assert_eq!(work_views(&again), work_views(&live));
    assert_eq!(again.ports, live.ports);
    assert!(!sent.is_empty() && sent.iter().all(|(_, s)| s.master_port != 0));
}

#[test]
fn when_one_part_fails_every_other_part_is_revoked_naming_it() {
    let mut a = with_ports(29_500, 29_999, 2);
    a.apply(1, &work(2, 2)).expect("submit");
    let st = starts(&a.apply(2, &Input::Schedule).expect("pass"));
    let lease = st[0].1.lease;
    let (rank0, rank1) = (st[0].0.clone(), st[1].0.clone());
    let ap = a
        .apply(
            3,
            &Input::LeaseEnded {
                lease,
                end: LeaseEnd::Failed,
                reason: "exited on n1: exited".into(),
                node: rank1.clone(),
                exit_code: Some(3),
                signal: None,
                part: true,
                leaving: false,
            },
        )
        .expect("ended");
    let why = format!("part on {rank1} (rank 1) ended: failed, exit 3");
    assert_eq!(
        sends(&ap, &rank0),
        vec![Command::Revoke {
            lease,
            not_before: 0,
            why: why.clone()
        }]
    );
    assert!(
        sends(&ap, &rank1).is_empty(),
        "the part that ended is not revoked"
    );
    assert!(ap
        .outs
        .iter()
        .any(|o| matches!(o, Out::Audit { text, .. } if text.contains(&why))));
    assert_eq!(a.workloads()[&1].state, WorkloadState::Failed);
    assert!(a.leases_on(&rank0).is_empty());
    // The run keeps how it ended, and the workload its exit status.
    let w = &a.workloads()[&1];
    assert_eq!(w.exit_code, Some(3));
    let r = &w.runs[0];
    assert_eq!((r.start, r.end, r.gpus), (2, 3, 4));
    assert_eq!(
        (r.end_reason.as_str(), r.exit_code, r.signal),
        ("failed", Some(3), None)
    );
}

#[test]
fn a_part_that_completes_waits_for_the_others() {
    let mut a = with_ports(29_500, 29_999, 2);
    a.apply(1, &work(2, 2)).expect("submit");
    let st = starts(&a.apply(2, &Input::Schedule).expect("pass"));
    let lease = st[0].1.lease;
    let done = |node: &str| Input::LeaseEnded {
        lease,
        end: LeaseEnd::Completed,
        reason: "exited".into(),
        node: node.into(),
        exit_code: Some(0),
        signal: None,
        part: true,
        leaving: false,
    };
    let ap = a.apply(3, &done(&st[1].0)).expect("one part");
    assert!(
        ap.outs.iter().all(|o| !matches!(o, Out::Send { .. })),
        "no revoke: {:?}",
        ap.outs
    );
    assert_eq!(a.workloads()[&1].state, WorkloadState::Running);
    assert!(a.leases_on(&st[1].0).is_empty() && !a.leases_on(&st[0].0).is_empty());
    a.apply(4, &done(&st[0].0)).expect("the last part");
    assert_eq!(a.workloads()[&1].state, WorkloadState::Completed);
    // Journals from before parts existed end the whole lease at the first report.
    let mut old = with_ports(29_500, 29_999, 2);
    old.apply(1, &work(2, 2)).expect("submit");
    old.apply(2, &Input::Schedule).expect("pass");
    let Input::LeaseEnded {
        lease,
        end,
        reason,
        node,
        exit_code,
        ..
    } = done(&st[1].0)
    else {
        unreachable!()
    };
    old.apply(
        3,
        &Input::LeaseEnded {
            lease,
            end,
            reason,
            node,
            exit_code,
            signal: None,
            part: false,
            leaving: false,
        },
    )
    .expect("ends");
    assert_eq!(old.workloads()[&1].state, WorkloadState::Completed);
}

#[test]
fn a_removed_node_counts_nowhere_survives_a_snapshot_and_joins_again_as_new() {
    let mut a = allocator(0);
    for i in 0..3 {
        a.apply(0, &registration(i, Vec::new(), Vec::new()))
            .expect("joins");
    }
    a.apply(1, &batch("demo-a")).expect("submit");
    a.apply(2, &Input::Schedule).expect("pass");
    let busy = a
        .nodes()
        .keys()
        .find(|n| !a.leases_on(n).is_empty())
        .cloned()
        .expect("work runs somewhere");
    let idle = a
        .nodes()
        .keys()
        .find(|n| **n != busy)
        .cloned()
        .expect("an idle node");
    let remove = |node: &str| Input::NodeRemoved {
        node: node.into(),
        by: "root".into(),
    };
    // Work there: refused, naming what to do.
    let e = a.apply(3, &remove(&busy)).unwrap_err().to_string();
    assert!(e.contains("drain it"), "{e}");
    assert_eq!(a.core.cluster().total_gpus(), 6);
    let ap = a.apply(3, &remove(&idle)).expect("removed");
    assert_eq!(a.core.cluster().total_gpus(), 4, "capacity drops");
    assert!(!a.nodes().contains_key(&idle));
    assert!(
        ap.outs
            .iter()
            .any(|o| matches!(o, Out::Audit { text, .. } if text.contains("removed by root"))),
        "audited"
    );
    // Through a snapshot: the hole stays, the capacity too, the work runs on.
    let cfg = ServerConfig::parse(EXAMPLE, "example").expect("example");
    let text = serde_json::to_string(&a.snapshot()).expect("encodes");
    let snap: Snapshot = serde_json::from_str(&text).expect("decodes");
    let mut back = Allocator::restore(&cfg, &snap, 10).expect("restores");
    assert_eq!(back.core.cluster().total_gpus(), 4);
    assert_eq!(back.leases_on(&busy), a.leases_on(&busy));
    assert!(!back.nodes().contains_key(&idle));
    // Its name joins again as a new node, with a new id.
    back.apply(
        11,
        &registration(idle[1..].parse().expect("n<i>"), Vec::new(), Vec::new()),
    )
    .expect("joins again");
    assert_eq!(back.core.cluster().total_gpus(), 6);
    let again = back.nodes()[&idle].id;
    assert_eq!(again.idx(), 3, "ids never move");
    let text = serde_json::to_string(&back.snapshot()).expect("encodes");
    let snap: Snapshot = serde_json::from_str(&text).expect("decodes");
    let twice = Allocator::restore(&cfg, &snap, 12).expect("restores");
    assert_eq!(twice.nodes()[&idle].id, again);
    assert_eq!(twice.core.cluster().total_gpus(), 6);
}

#[test]
fn a_node_known_from_before_types_takes_the_type_it_registers_now() {
    let mut a = allocator(1);
    let typed = |t: &str| {
        let mut i = batch("demo-a");
        if let Input::Submit { spec, .. } = &mut i {
            spec.select.gpu_types = vec![t.into()];
        }
        i
    };
    let e = a
        .apply(0, &typed("h100"))
        .expect_err("no node has a type yet");
    assert!(
        e.to_string().contains("no node has GPU type \"h100\""),
        "{e}"
    );
    let mut r = registration(0, Vec::new(), Vec::new());
    if let Input::Register { spec, .. } = &mut r {
        spec.gpu_type = "h100".into();
        spec.features = vec!["nvlink".into()];
    }
    a.apply(1, &r).expect("registers");
    assert_eq!(a.nodes()["n0"].spec.gpu_type, "h100");
    let id = a
        .apply(2, &typed("h100"))
        .expect("accepted")
        .id
        .expect("id");
    a.apply(3, &Input::Schedule).expect("pass");
    assert_eq!(a.workloads()[&id].state, WorkloadState::Running);
}

#[test]
fn wait_histograms_of_an_earlier_release_read_with_nothing_under_a_minute() {
    let old: WaitHistogram =
        serde_json::from_str(r#"{"buckets":[1,2,3,4,5,6,7,8,9],"sum":100,"count":9}"#)
            .expect("reads");
    assert_eq!(old.buckets, [0, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9]);
    let mut h = WaitHistogram::default();
    h.add(20);
    assert_eq!(
        h.buckets[..5],
        [0, 0, 0, 1, 1],
        "a 20 s wait is under 30 s and 60 s, not under 15 s"
    );
    let again: WaitHistogram =
        serde_json::from_str(&serde_json::to_string(&h).expect("writes")).expect("reads");
    assert_eq!(again.buckets, h.buckets);
    let e = serde_json::from_str::<WaitHistogram>(r#"{"buckets":[1,2]}"#).unwrap_err();
    assert!(e.to_string().contains("9 or 13 wait buckets"), "{e}");
}

#[test]
fn ended_workloads_are_counted_once_by_final_state() {
    let mut a = allocator(1);
    let id = a
        .apply(0, &batch("demo-a"))
        .expect("accepted")
        .id
        .expect("id");
    a.apply(1, &Input::Schedule).expect("pass");
    let lease = a.workloads()[&id].leases[0];
    let end = Input::LeaseEnded {
        lease,
        end: LeaseEnd::Completed,
        reason: "done".into(),
        node: String::new(),
        exit_code: Some(0),
        signal: None,
        part: false,
        leaving: false,
    };
    a.apply(2, &end).expect("ends");
    let _ = a.apply(3, &end);
    assert_eq!(a.counters.finished.get("completed"), Some(&1));
    assert_eq!(a.counters.finished.len(), 1);
}

#[test]
fn a_drains_revocations_are_counted_by_whose_drain() {
    let mut a = allocator(2);
    for _ in 0..2 {
        let mut job = batch("demo-a");
        if let Input::Submit { spec, .. } = &mut job {
            spec.gpus_per_node = 2;
            spec.min_runtime = 3_600;
        }
        a.apply(0, &job).expect("accepted");
    }
    a.apply(1, &Input::Schedule).expect("pass");
    let drain = |node: &str, state, by: &str| Input::NodeState {
        node: node.into(),
        state,
        reason: "test".into(),
        by: by.into(),
        author: String::new(),
    };
    a.apply(2, &drain("n0", NodeState::DrainNow, "health"))
        .expect("a GPU fault");
    a.apply(3, &drain("n1", NodeState::Draining, "cluster-operator"))
        .expect("maintenance");
    a.apply(4, &Input::Schedule).expect("pass");
    let r = &a.counters.revocations;
    assert_eq!(r.get("drain-now:health"), Some(&1), "{r:?}");
    assert_eq!(r.get("drain:operator"), Some(&1), "{r:?}");
}

#[test]
fn an_idle_lease_tells_its_owner_who_asked_and_only_from_its_own_host() {
    let mut a = allocator(2);
    let mut input = batch("demo-a");
    if let Input::Submit { notify, .. } = &mut input {
        *notify = vec!["idle".into()];
    }
    let id = a.apply(0, &input).expect("submit").id.expect("an id");
    a.apply(1, &Input::Schedule).expect("pass");
    let w = &a.workloads()[&id];
    assert_eq!(w.state, allot_fairshare::WorkloadState::Running);
    let lease = *w.leases.last().expect("a lease");
    let host = w.nodes.first().cloned().expect("a node");
    let other = if host == "n0" { "n1" } else { "n0" };
    let idle = |node: &str| Input::LeaseUse {
        lease,
        node: node.into(),
        idle_since: 100,
        gpu_util: 0,
    };
    let notices = |ap: &Applied| -> Vec<Vec<String>> {
        ap.outs
            .iter()
            .filter_map(|o| match o {
                Out::Notify(n) => Some(n.events.clone()),
                _ => None,
            })
            .collect()
    };
    // The level alone: kept (for allot share), no notice and no audit line.
    let busy = Input::LeaseUse {
        lease,
        node: host.clone(),
        idle_since: 0,
        gpu_util: 70,
    };
    let ap = a.apply(60, &busy).expect("applied");
    assert!(ap.changed && notices(&ap).is_empty());
    let tree = a.tree(60);
    let g = tree
        .groups
        .iter()
        .find(|g| g.name == "demo-a")
        .expect("demo-a");
    assert_eq!(g.gpu_util, Some(0.7));
    assert!(
        !a.apply(61, &busy).expect("applied").changed,
        "a repeat is no change"
    );
    let ap = a.apply(3700, &idle(other)).expect("applied");
    assert!(
        notices(&ap).is_empty(),
        "another host does not speak for it"
    );
    let ap = a.apply(3700, &idle(&host)).expect("applied");
    assert_eq!(notices(&ap), vec![vec!["idle".to_string()]]);
    let ap = a.apply(3800, &idle(&host)).expect("applied");
    assert!(notices(&ap).is_empty(), "told once per idle spell");
}

#[test]
fn a_class_protected_by_use_keeps_a_lease_in_use_and_lets_an_idle_one_go() {
    let mut cfg = ServerConfig::parse(EXAMPLE, "example").expect("example");
    cfg.policy.protect_by_use.insert(
        "batch".into(),
        allot_fairshare::config::UseProtection { idle_grace: 1_800 },
    );
    let mut a = Allocator::new(&cfg).expect("allocator");
    a.apply(0, &node(0)).expect("node");
    let mut input = batch("demo-a");
    if let Input::Submit { spec, .. } = &mut input {
        spec.min_runtime = 600;
    }
    let id = a.apply(0, &input).expect("submit").id.expect("an id");
    a.apply(1, &Input::Schedule).expect("pass");
    let w = &a.workloads()[&id];
    let lease = *w.leases.last().expect("a lease");
    let host = w.nodes.first().cloned().expect("a node");
    let at = |a: &Allocator| {
        a.core
            .lease(allot_fairshare::LeaseId(lease))
            .expect("lease")
            .preemptible_at
    };
    let funded = a
        .core
        .lease(allot_fairshare::LeaseId(lease))
        .expect("lease")
        .funded;
    let clock = at(&a);
    let used = |idle_since: Time, gpu_util: u32| Input::LeaseUse {
        lease,
        node: host.clone(),
        idle_since,
        gpu_util,
    };
    assert!(funded, "a fresh project's work is funded");
    assert_eq!(clock, 1 + 600, "before any report: its min runtime");
    a.apply(60, &used(0, 70)).expect("in use");
    assert_eq!(at(&a), Time::MAX, "in use: not taken, however long it runs");
    a.apply(4_000, &used(2_000, 0)).expect("idle");
    assert_eq!(at(&a), 2_000 + 1_800, "idle: protected for the grace");
    a.apply(4_100, &used(0, 80)).expect("busy again");
    assert_eq!(at(&a), Time::MAX);
}

#[test]
fn a_revocation_is_wanted_state_sent_again_on_every_registration() {
    let mut a = allocator(0);
    a.apply(0, &registration(0, Vec::new(), Vec::new()))
        .expect("up");
    a.apply(1, &batch("demo-a")).expect("submit");
    a.apply(1, &batch("demo-b")).expect("submit");
    a.apply(2, &Input::Schedule).expect("pass");
    let live: Vec<u64> = a.leases_on("n0").into_iter().map(|(l, _)| l).collect();
    assert_eq!(live.len(), 2);
    let wid = |lease: u64| {
        a.workloads()
            .values()
            .find(|w| w.leases.contains(&lease))
            .map(|w| w.id)
            .expect("its workload")
    };
    let (cancelled, kept) = (live[0], live[1]);
    // The cancel is sent while the host is away: nobody receives it.
    let id = wid(cancelled);
    a.apply(3, &Input::Cancel { id, by: "u".into() })
        .expect("cancel");
    let revokes = |cmds: Vec<Command>| -> Vec<(u64, Time)> {
        cmds.into_iter()
            .filter_map(|c| match c {
                Command::Revoke {
                    lease, not_before, ..
                } => Some((lease, not_before)),
                _ => None,
            })
            .collect()
    };
    // The host comes back running both: the cancel reaches it now, and again on
    // the next registration, never the lease allotd still wants to run.
    for at in [10, 20] {
        let ap = a
            .apply(at, &registration(0, vec![cancelled, kept], Vec::new()))
            .expect("register");
        assert_eq!(revokes(sends(&ap, "n0")), vec![(cancelled, 3)], "at {at}");
    }
    // The periodic resync sends the same, from the same state.
    let all: Vec<(String, Command)> = a
        .wanted_stops(None)
        .into_iter()
        .filter_map(|o| match o {
            Out::Send { node, cmd } => Some((node, cmd)),
            _ => None,
        })
        .collect();
    assert_eq!(all.len(), 1, "{all:?}");
    assert_eq!(all[0].0, "n0");
    assert!(
        matches!(&all[0].1, Command::Revoke { lease, why, .. } if *lease == cancelled && why.contains("cancel")),
        "{all:?}"
    );
    // Once the host reports it ended, nothing is wanted of it any more.
    a.apply(
        30,
        &Input::LeaseEnded {
            lease: cancelled,
            end: LeaseEnd::Revoked,
            reason: "revoked".into(),
            node: "n0".into(),
            exit_code: None,
            signal: Some(15),
            part: false,
            leaving: false,
        },
    )
    .expect("ended");
    assert!(a.wanted_stops(None).is_empty());
    assert!(a.wanted_stops(Some("n0")).is_empty());
}

#[test]
fn a_submission_to_a_cluster_without_nodes_says_so() {
    let mut a = allocator(0);
    let e = a.apply(0, &batch("demo-a")).expect_err("nowhere to run");
    let text = e.to_string();
    assert!(
        text.contains("the cluster has no nodes yet; start an agent"),
        "{text}"
    );
    assert!(!text.contains("has  together"), "{text}");
}
