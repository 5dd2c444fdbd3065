//! Reproductions of what the properties found, smallest first.

use crate::harness::{run, team, Op, Policy, Prop, Setup, Sub};
use allot_fairshare::time::{Secs, DAY, HOUR, MINUTE};
use allot_fairshare::{
    Action, Decisions, LeaseId, NodeId, NodeSpec, NodeState, OrgTree, PolicyConfig, Scheduler,
    WorkloadSpec,
};

fn nodes_of(gpus: &[u32]) -> Vec<NodeSpec> {
    gpus.iter()
        .enumerate()
        .map(|(i, &gpus)| NodeSpec {
            name: format!("n{i}"),
            cluster: "c".into(),
            gpus,
            cpu: 64,
            memory_gb: 512,
            ..Default::default()
        })
        .collect()
}

fn job_spec(project: &str, nodes: u32, gpus: u32, min_runtime: Secs) -> WorkloadSpec {
    WorkloadSpec {
        project: project.into(),
        user: "u".into(),
        class: "batch".into(),
        gpus_per_node: gpus,
        nodes,
        cpu_per_node: 0,
        mem_per_node_gb: 0,
        min_runtime,
        time_limit: None,
        resumable: true,
        priority: 0,
        no_requeue: false,
        ..Default::default()
    }
}

fn revoked(d: &Decisions) -> Vec<LeaseId> {
    d.actions
        .iter()
        .filter_map(|a| match a {
            Action::Revoke { lease, .. } => Some(*lease),
            _ => None,
        })
        .collect()
}

/// Property 2c, minimal: a funded gang preempting an unfunded gang on two whole nodes
/// revokes the victim's one lease once, although the plan meets it on both nodes.
#[test]

fn a_multi_node_victim_is_revoked_once() {
    let tree = OrgTree::new(&[team("a", 1.0), team("b", 1.0)]).expect("valid tree");
    let mut s = Scheduler::new(PolicyConfig::default(), tree, nodes_of(&[4, 4])).expect("valid");
    let victim = s.submit(0, job_spec("b", 2, 4, 0)).expect("accepted");
    s.schedule(0);
    let lease = s.workload(victim).and_then(|w| w.lease).expect("running");
    s.submit(1, job_spec("a", 2, 4, HOUR)).expect("accepted");
    assert_eq!(revoked(&s.schedule(1)), vec![lease]);
}

/// Marking a GPU unhealthy drops only the claims holding that GPU: a claim elsewhere
/// on the node keeps its victim, rather than the requester planning afresh and
/// revoking a second victim for the same one GPU.
#[test]

fn an_unrelated_gpu_failure_keeps_the_claim() {
    let tree = OrgTree::new(&[team("a", 1.0), team("b", 1.0)]).expect("valid tree");
    let mut s = Scheduler::new(PolicyConfig::default(), tree, nodes_of(&[4])).expect("valid");
    s.set_gpu_health(NodeId(0), 3, false).expect("known GPU");
    for _ in 0..3 {
        s.submit(0, job_spec("b", 1, 1, 0)).expect("accepted");
    }
    s.schedule(0);
    let requester = s.submit(10, job_spec("a", 1, 1, HOUR)).expect("accepted");
    assert_eq!(revoked(&s.schedule(10)).len(), 1);
    s.set_gpu_health(NodeId(0), 3, false).expect("known GPU");
    let again = revoked(&s.schedule(10));
    assert!(again.is_empty(), "second victims {again:?} for one GPU");
    assert!(s.claims().contains_key(&requester), "claim dropped");
}

/// Property 5b under the default policy (7-day window, hysteresis 0.05, 30-minute
/// cooldown, instant checkpoints). At t=33133 a1's W26 preempts a2's W8. At t=33433,
/// as W26's 5-minute min_runtime lapses, newly arrived work of team c preempts three
/// a2 leases and one a1 lease, so a2 ranks below a1; the requeued W8 must still not
/// take W26's GPUs back: a preemptor is protected for the cooldown too.
#[test]

fn a_victim_does_not_take_back_within_the_cooldown() {
    let setup = Setup {
        node_gpus: vec![8, 8, 8],
        two_clusters: false,
        tree: 1,
        weights: [1, 1, 1],
        save: 0,
        policy: Policy {
            lookback: 7 * DAY,
            half_life: false,
            hysteresis: 0.05,
            cooldown: 30 * MINUTE,
            max_reservations: 2,
            max_plans: 16,
            drf: false,
            allowance_gpus: 0,
            max_loss_per_gpu: allot_fairshare::config::DEFAULT_MAX_LOSS_PER_GPU,
            headroom: 0.0,
            drain_grace: 0,
            ranking_lookback: 0,
            b200_weight: 1.0,
        },
    };
    // Projects of tree 1 by index: 0 c, 1 a1, 2 a2, 3 b1.
    let job = |project, gpus, min_runtime, resumable, run| Sub {
        project,
        gpus,
        nodes: 1,
        cpu_per_gpu: 1,
        min_runtime,
        resumable,
        priority: 0,
        run,
        time_limit: None,
        fails: false,
        no_requeue: false,
        gpu_type: None,
        exclude: None,
    };
    let ops = [
        Op::Burst(job(3, 1, 0, true, 33_133), 7),
        Op::Burst(job(2, 2, 300, true, 38_353), 5),
        Op::Advance(1),
        Op::Burst(job(3, 2, 0, false, 19_133), 6),
        Op::Advance(33_132),
        Op::Burst(job(2, 2, 300, false, 3_600), 2),
        Op::Submit(job(2, 1, 300, false, 3_600)),
        Op::Burst(job(1, 2, 300, false, 3_600), 6),
        Op::Burst(job(3, 1, 300, false, 3_600), 4),
        Op::Burst(job(0, 1, 300, false, 3_600), 3),
        Op::Burst(job(0, 1, 300, false, 3_600), 4),
        Op::Advance(300),
    ];
    let sh = run(&setup, &ops);
    assert!(sh.stats.funded_preemptions > 0);
    let v = sh.violations(Prop::Bounce);
    assert!(v.is_empty(), "{}", v.join("\n"));
}

/// Property 5, reservations: at t=300 a's reserved gang takes its three nodes from
/// b's gang (revoked for the reservation). In the next pass, with nothing new but
/// that revoke's end, b's requeued gang reserves the same three nodes from t=600 and
/// b's 2-GPU job preempts a's 1-GPU lease; the pass after, with nothing new at all,
/// the ratios count b's reservation (9 GPUs it does not hold) as b's allocation, so
/// a's requeued job would preempt b back if the ratios counted b's reservation (GPUs
/// it does not hold) as b's allocation; they do not.
#[test]

fn a_reservation_is_not_its_groups_allocation() {
    let setup = Setup {
        node_gpus: vec![4; 6],
        two_clusters: false,
        tree: 2,
        weights: [4, 4, 1],
        save: 0,
        policy: Policy {
            lookback: 2 * HOUR,
            half_life: false,
            hysteresis: 0.05,
            cooldown: 0,
            max_reservations: 1,
            max_plans: 16,
            drf: false,
            allowance_gpus: 0,
            max_loss_per_gpu: allot_fairshare::config::DEFAULT_MAX_LOSS_PER_GPU,
            headroom: 0.0,
            drain_grace: 0,
            ranking_lookback: 0,
            b200_weight: 1.0,
        },
    };
    // Projects of tree 2 by index: 0 a, 1 b.
    let job = |project, gpus, nodes, min_runtime, resumable, run| Sub {
        project,
        gpus,
        nodes,
        cpu_per_gpu: 1,
        min_runtime,
        resumable,
        priority: 0,
        run,
        time_limit: None,
        fails: false,
        no_requeue: false,
        gpu_type: None,
        exclude: None,
    };
    let ops = [
        Op::Node(0, NodeState::Draining),
        Op::Submit(job(1, 1, 2, 2 * HOUR, false, 1_801)),
        Op::Submit(job(0, 1, 1, 0, false, 1)),
        Op::Submit(job(1, 3, 3, 300, true, 600)),
        Op::Submit(job(2, 4, 3, 300, false, 1)),
        Op::Submit(job(2, 1, 1, 300, true, 301)),
        Op::Burst(job(1, 1, 1, 300, false, 600), 4),
        Op::Submit(job(1, 2, 1, 300, false, 1)),
        Op::Advance(1),
        Op::Advance(299),
    ];
    let sh = run(&setup, &ops);
    let v = sh.violations(Prop::Cycle);
    assert!(v.is_empty(), "{}", v.join("\n"));
}

/// Property 5, ties: with hysteresis 0 a funded job preempts only when the victim's
/// ratio after stays strictly above the requester's. At t=30100, in one pass, b takes
/// three leases from team a and a2 takes three from a1; a2's next job must not take
/// one from b at equal ratios (0.0945 both).
#[test]

fn equal_ratios_do_not_preempt_both_ways() {
    let setup = Setup {
        node_gpus: vec![4, 4, 8],
        two_clusters: false,
        tree: 0,
        weights: [2, 2, 1],
        save: 0,
        policy: Policy {
            lookback: 7 * DAY,
            half_life: false,
            hysteresis: 0.0,
            cooldown: 30 * MINUTE,
            max_reservations: 2,
            max_plans: 16,
            drf: false,
            allowance_gpus: 0,
            max_loss_per_gpu: allot_fairshare::config::DEFAULT_MAX_LOSS_PER_GPU,
            headroom: 0.0,
            drain_grace: 0,
            ranking_lookback: 0,
            b200_weight: 1.0,
        },
    };
    // Projects of tree 0 by index: 2 a2, 3 b, 4 a1.
    let job = |project, gpus, run| Sub {
        project,
        gpus,
        nodes: 1,
        cpu_per_gpu: 1,
        min_runtime: 300,
        resumable: false,
        priority: 0,
        run,
        time_limit: None,
        fails: false,
        no_requeue: false,
        gpu_type: None,
        exclude: None,
    };
    let ops = [
        Op::Burst(job(3, 1, 30_482), 3),
        Op::Advance(29_800),
        Op::Burst(job(4, 2, 3_600), 6),
        Op::Burst(job(2, 1, 3_600), 5),
        Op::Burst(job(3, 1, 3_600), 3),
        Op::Advance(300),
    ];
    let sh = run(&setup, &ops);
    let v = sh.violations(Prop::Cycle);
    assert!(v.is_empty(), "{}", v.join("\n"));
}

/// Found by a 20,000-case soak of `funded_preemption_never_cycles`: at t=11307 a
/// reservation's start revokes b's backfill, and the same pass must rank b without
/// those leases, or a preempts b's last lease on an overstated ratio and b takes it
/// back in the next pass.
#[test]
fn ratios_see_the_leases_a_reservation_start_revokes() {
    let setup = Setup {
        node_gpus: vec![8, 4, 4, 8, 8],
        two_clusters: false,
        tree: 2,
        weights: [3, 1, 1],
        save: 0,
        policy: Policy {
            lookback: 7200,
            half_life: true,
            hysteresis: 0.0,
            cooldown: 0,
            max_reservations: 1,
            max_plans: 16,
            drf: false,
            allowance_gpus: 0,
            max_loss_per_gpu: allot_fairshare::config::DEFAULT_MAX_LOSS_PER_GPU,
            headroom: 0.0,
            drain_grace: 0,
            ranking_lookback: 0,
            b200_weight: 1.0,
        },
    };
    let ops: Vec<Op> = vec![
        Op::Burst(
            Sub {
                project: 0,
                gpus: 1,
                nodes: 1,
                cpu_per_gpu: 1,
                min_runtime: 0,
                resumable: false,
                priority: 0,
                run: 4107,
                time_limit: None,
                fails: false,
                no_requeue: false,
                gpu_type: None,
                exclude: None,
            },
            2,
        ),
        Op::Cancel(0),
        Op::Advance(1),
        Op::Submit(Sub {
            project: 0,
            gpus: 1,
            nodes: 2,
            cpu_per_gpu: 1,
            min_runtime: 0,
            resumable: false,
            priority: 0,
            run: 1,
            time_limit: None,
            fails: false,
            no_requeue: false,
            gpu_type: None,
            exclude: None,
        }),
        Op::Submit(Sub {
            project: 0,
            gpus: 1,
            nodes: 2,
            cpu_per_gpu: 1,
            min_runtime: 0,
            resumable: false,
            priority: 0,
            run: 1,
            time_limit: None,
            fails: false,
            no_requeue: false,
            gpu_type: None,
            exclude: None,
        }),
        Op::Submit(Sub {
            project: 2,
            gpus: 2,
            nodes: 2,
            cpu_per_gpu: 1,
            min_runtime: 300,
            resumable: false,
            priority: 0,
            run: 29656,
            time_limit: None,
            fails: false,
            no_requeue: false,
            gpu_type: None,
            exclude: None,
        }),
        Op::Gpu {
            node: 1,
            gpu: 0,
            healthy: false,
            kill: false,
        },
        Op::Advance(4106),
        Op::Submit(Sub {
            project: 0,
            gpus: 2,
            nodes: 1,
            cpu_per_gpu: 1,
            min_runtime: 300,
            resumable: false,
            priority: 0,
            run: 4941,
            time_limit: None,
            fails: false,
            no_requeue: false,
            gpu_type: None,
            exclude: None,
        }),
        Op::Gpu {
            node: 3,
            gpu: 0,
            healthy: false,
            kill: false,
        },
        Op::Submit(Sub {
            project: 0,
            gpus: 1,
            nodes: 2,
            cpu_per_gpu: 1,
            min_runtime: 7200,
            resumable: false,
            priority: 0,
            run: 1,
            time_limit: None,
            fails: false,
            no_requeue: false,
            gpu_type: None,
            exclude: None,
        }),
        Op::Submit(Sub {
            project: 1,
            gpus: 1,
            nodes: 2,
            cpu_per_gpu: 1,
            min_runtime: 300,
            resumable: false,
            priority: 0,
            run: 1,
            time_limit: None,
            fails: false,
            no_requeue: false,
            gpu_type: None,
            exclude: None,
        }),
        Op::Submit(Sub {
            project: 0,
            gpus: 1,
            nodes: 1,
            cpu_per_gpu: 1,
            min_runtime: 0,
            resumable: false,
            priority: 0,
            run: 1,
            time_limit: None,
            fails: false,
            no_requeue: false,
            gpu_type: None,
            exclude: None,
        }),
        Op::Submit(Sub {
            project: 0,
            gpus: 1,
            nodes: 1,
            cpu_per_gpu: 1,
            min_runtime: 300,
            resumable: false,
            priority: 0,
            run: 1,
            time_limit: None,
            fails: false,
            no_requeue: false,
            gpu_type: None,
            exclude: None,
        }),
        Op::Burst(
            Sub {
                project: 2,
                gpus: 3,
                nodes: 1,
                cpu_per_gpu: 1,
                min_runtime: 300,
                resumable: false,
                priority: 0,
                run: 10800,
                time_limit: None,
                fails: false,
                no_requeue: false,
                gpu_type: None,
                exclude: None,
            },
            2,
        ),
        Op::Burst(
            Sub {
                project: 1,
                gpus: 3,
                nodes: 1,
                cpu_per_gpu: 1,
                min_runtime: 7200,
                resumable: true,
                priority: 0,
                run: 7201,
                time_limit: None,
                fails: false,
                no_requeue: false,
                gpu_type: None,
                exclude: None,
            },
            3,
        ),
        Op::Submit(Sub {
            project: 0,
            gpus: 5,
            nodes: 1,
            cpu_per_gpu: 1,
            min_runtime: 0,
            resumable: false,
            priority: 0,
            run: 1,
            time_limit: None,
            fails: false,
            no_requeue: false,
            gpu_type: None,
            exclude: None,
        }),
        Op::Burst(
            Sub {
                project: 2,
                gpus: 3,
                nodes: 1,
                cpu_per_gpu: 1,
                min_runtime: 300,
                resumable: false,
                priority: 0,
                run: 7201,
                time_limit: None,
                fails: false,
                no_requeue: false,
                gpu_type: None,
                exclude: None,
            },
            4,
        ),
        Op::Submit(Sub {
            project: 2,
            gpus: 3,
            nodes: 2,
            cpu_per_gpu: 1,
            min_runtime: 300,
            resumable: false,
            priority: 0,
            run: 1,
            time_limit: None,
            fails: false,
            no_requeue: false,
            gpu_type: None,
            exclude: None,
        }),
        Op::Gpu {
            node: 0,
            gpu: 1,
            healthy: false,
            kill: true,
        },
        Op::Advance(7200),
    ];
    let sh = run(&setup, &ops);
    let v = sh.violations(Prop::Cycle);
    assert!(v.is_empty(), "{}", v.join("\n"));
}

/// Found by a 30,000-case soak: at t=97056 a's funded job preempts b's (a 0.91 after,
/// b 0.99 after), then later starts in the same pass (unfunded victims of b's, a's
/// claims) move a above b, and b would preempt a straight back. Recent preemption
/// edges forbid the reverse edge within the cooldown.
#[test]
fn no_ping_pong_after_later_starts_in_a_pass() {
    let setup = Setup {
        node_gpus: vec![4, 8, 8],
        two_clusters: false,
        tree: 2,
        weights: [1, 1, 1],
        save: 0,
        policy: Policy {
            lookback: 7200,
            half_life: true,
            hysteresis: 0.0,
            cooldown: 1800,
            max_reservations: 0,
            max_plans: 16,
            drf: false,
            allowance_gpus: 0,
            max_loss_per_gpu: allot_fairshare::config::DEFAULT_MAX_LOSS_PER_GPU,
            headroom: 0.0,
            drain_grace: 0,
            ranking_lookback: 0,
            b200_weight: 1.0,
        },
    };
    let ops: Vec<Op> = vec![
        Op::Burst(
            Sub {
                project: 1,
                gpus: 2,
                nodes: 1,
                cpu_per_gpu: 1,
                min_runtime: 300,
                resumable: false,
                priority: 0,
                run: 61895,
                time_limit: None,
                fails: false,
                no_requeue: false,
                gpu_type: None,
                exclude: None,
            },
            3,
        ),
        Op::Advance(3399),
        Op::Burst(
            Sub {
                project: 0,
                gpus: 2,
                nodes: 1,
                cpu_per_gpu: 1,
                min_runtime: 300,
                resumable: false,
                priority: 0,
                run: 91857,
                time_limit: None,
                fails: false,
                no_requeue: false,
                gpu_type: None,
                exclude: None,
            },
            4,
        ),
        Op::Cancel(3),
        Op::Advance(147),
        Op::Burst(
            Sub {
                project: 2,
                gpus: 1,
                nodes: 1,
                cpu_per_gpu: 1,
                min_runtime: 300,
                resumable: true,
                priority: 0,
                run: 15573,
                time_limit: None,
                fails: false,
                no_requeue: false,
                gpu_type: None,
                exclude: None,
            },
            3,
        ),
        Op::Burst(
            Sub {
                project: 2,
                gpus: 1,
                nodes: 1,
                cpu_per_gpu: 1,
                min_runtime: 300,
                resumable: false,
                priority: 0,
                run: 93511,
                time_limit: None,
                fails: false,
                no_requeue: false,
                gpu_type: None,
                exclude: None,
            },
            5,
        ),
        Op::Advance(1469),
        Op::Burst(
            Sub {
                project: 2,
                gpus: 1,
                nodes: 1,
                cpu_per_gpu: 1,
                min_runtime: 0,
                resumable: false,
                priority: 0,
                run: 3600,
                time_limit: None,
                fails: false,
                no_requeue: false,
                gpu_type: None,
                exclude: None,
            },
            2,
        ),
        Op::Burst(
            Sub {
                project: 2,
                gpus: 2,
                nodes: 1,
                cpu_per_gpu: 1,
                min_runtime: 300,
                resumable: false,
                priority: 0,
                run: 3600,
                time_limit: None,
                fails: false,
                no_requeue: false,
                gpu_type: None,
                exclude: None,
            },
            8,
        ),
        Op::Burst(
            Sub {
                project: 1,
                gpus: 1,
                nodes: 1,
                cpu_per_gpu: 1,
                min_runtime: 300,
                resumable: false,
                priority: 0,
                run: 92042,
                time_limit: None,
                fails: false,
                no_requeue: false,
                gpu_type: None,
                exclude: None,
            },
            3,
        ),
        Op::Burst(
            Sub {
                project: 2,
                gpus: 1,
                nodes: 1,
                cpu_per_gpu: 1,
                min_runtime: 300,
                resumable: false,
                priority: 0,
                run: 3600,
                time_limit: None,
                fails: false,
                no_requeue: false,
                gpu_type: None,
                exclude: None,
            },
            4,
        ),
        Op::Burst(
            Sub {
                project: 1,
                gpus: 1,
                nodes: 1,
                cpu_per_gpu: 1,
                min_runtime: 300,
                resumable: true,
                priority: 0,
                run: 45121,
                time_limit: None,
                fails: false,
                no_requeue: false,
                gpu_type: None,
                exclude: None,
            },
            2,
        ),
        Op::Submit(Sub {
            project: 1,
            gpus: 1,
            nodes: 1,
            cpu_per_gpu: 1,
            min_runtime: 300,
            resumable: false,
            priority: 0,
            run: 35162,
            time_limit: None,
            fails: false,
            no_requeue: false,
            gpu_type: None,
            exclude: None,
        }),
        Op::Advance(1),
        Op::Advance(54616),
        Op::Gpu {
            node: 2,
            gpu: 0,
            healthy: false,
            kill: false,
        },
        Op::Advance(9353),
        Op::Burst(
            Sub {
                project: 2,
                gpus: 1,
                nodes: 1,
                cpu_per_gpu: 1,
                min_runtime: 0,
                resumable: false,
                priority: 0,
                run: 3600,
                time_limit: None,
                fails: false,
                no_requeue: false,
                gpu_type: None,
                exclude: None,
            },
            2,
        ),
        Op::Advance(3113),
        Op::Burst(
            Sub {
                project: 1,
                gpus: 1,
                nodes: 1,
                cpu_per_gpu: 1,
                min_runtime: 0,
                resumable: true,
                priority: 0,
                run: 19589,
                time_limit: None,
                fails: false,
                no_requeue: false,
                gpu_type: None,
                exclude: None,
            },
            3,
        ),
        Op::Advance(5370),
        Op::Burst(
            Sub {
                project: 1,
                gpus: 2,
                nodes: 1,
                cpu_per_gpu: 1,
                min_runtime: 300,
                resumable: false,
                priority: 0,
                run: 19589,
                time_limit: None,
                fails: false,
                no_requeue: false,
                gpu_type: None,
                exclude: None,
            },
            2,
        ),
        Op::Gpu {
            node: 0,
            gpu: 0,
            healthy: false,
            kill: false,
        },
        Op::Advance(19588),
    ];
    let sh = run(&setup, &ops);
    let v = sh.violations(Prop::Cycle);
    assert!(v.is_empty(), "{}", v.join("\n"));
}
