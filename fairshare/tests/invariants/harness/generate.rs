//! Generated inputs: the proptest strategies for clusters, org trees, policies and
//! operation sequences, and the specs a `Setup` turns into.

use allot_fairshare::config::UsageModelKind;
use allot_fairshare::time::{Secs, DAY, HOUR, MINUTE};
use allot_fairshare::{GroupSpec, NodeSpec, NodeState, PolicyConfig};
use proptest::prelude::*;

/// The world one case runs in.
#[derive(Debug, Clone)]
pub(crate) struct Setup {
    /// GPUs of each node; nodes alternate between two clusters when `two_clusters`.
    pub(crate) node_gpus: Vec<u32>,
    pub(crate) two_clusters: bool,
    /// Which org tree (see `tree_specs`).
    pub(crate) tree: u8,
    /// Team weights, in tree order.
    pub(crate) weights: [u32; 3],
    /// Checkpoint time of a revoked lease.
    pub(crate) save: Secs,
    pub(crate) policy: Policy,
}

#[derive(Debug, Clone)]
pub(crate) struct Policy {
    pub(crate) lookback: Secs,
    pub(crate) half_life: bool,
    pub(crate) hysteresis: f64,
    pub(crate) cooldown: Secs,
    pub(crate) max_reservations: u32,
    pub(crate) max_plans: u32,
    pub(crate) drf: bool,
    pub(crate) allowance_gpus: u32,
    pub(crate) max_loss_per_gpu: Secs,
    /// Share of the GPUs free occupancy leaves free (`protected_headroom`).
    pub(crate) headroom: f64,
    /// How long a soft drain lets work that cannot resume run on.
    pub(crate) drain_grace: Secs,
    /// The ranking's own memory (`ranking_lookback`; 0: the lookback).
    pub(crate) ranking_lookback: Secs,
    /// What an hour of the b200 nodes counts for (`gpu_hour_weight`; h100 weighs 1).
    pub(crate) b200_weight: f64,
}

#[derive(Debug, Clone)]
pub(crate) struct Sub {
    /// Index into the tree's projects (modulo their number).
    pub(crate) project: usize,
    pub(crate) gpus: u32,
    pub(crate) nodes: u32,
    /// CPU cores asked per GPU; nodes have 8 per GPU, so above 8 host room binds.
    pub(crate) cpu_per_gpu: u32,
    pub(crate) min_runtime: Secs,
    pub(crate) resumable: bool,
    pub(crate) priority: i32,
    /// How long one run takes before it exits on its own.
    pub(crate) run: Secs,
    pub(crate) time_limit: Option<Secs>,
    /// Exits with a failure rather than success.
    pub(crate) fails: bool,
    /// Ends as preempted rather than waiting again.
    pub(crate) no_requeue: bool,
    /// Asks for this GPU type (nodes are h100 but every third, b200).
    pub(crate) gpu_type: Option<&'static str>,
    /// Excludes this node (`--exclude`; every setup has n0 and n1).
    pub(crate) exclude: Option<&'static str>,
}

#[derive(Debug, Clone)]
pub(crate) enum Op {
    Submit(Sub),
    /// `n` copies at once, like a job array: what makes groups contend.
    Burst(Sub, u32),
    Advance(Secs),
    /// Index into the workloads submitted so far (modulo their number).
    Cancel(usize),
    /// Hold (true) or release (false) one of them, as a hold, a dependency or an
    /// array's limit would.
    Hold(usize, bool),
    /// Send one of them back to the queue (`allot requeue`).
    Requeue(usize),
    Node(usize, NodeState),
    /// A GPU changes health; `kill` ends the lease on it as the agent would see it die.
    Gpu {
        node: usize,
        gpu: u32,
        healthy: bool,
        kill: bool,
    },
}

fn policy() -> impl Strategy<Value = Policy> {
    (
        prop_oneof![Just(2 * HOUR), Just(DAY), Just(7 * DAY)],
        prop::bool::weighted(0.25),
        prop_oneof![Just(0.0), Just(0.05)],
        prop_oneof![Just(0), Just(30 * MINUTE), Just(2 * HOUR)],
        0u32..=2,
        prop_oneof![1 => Just(1u32), 3 => Just(16u32)],
        prop::bool::weighted(0.25),
        prop_oneof![Just(0u32), Just(2u32), Just(16u32)],
        prop_oneof![1 => Just(10 * MINUTE), 2 => Just(2 * HOUR), 1 => Just(30 * DAY)],
        prop_oneof![2 => Just(0.0), 1 => Just(0.1), 1 => Just(0.25)],
        prop_oneof![Just(0), Just(HOUR), Just(DAY)],
        (
            prop_oneof![2 => Just(0), 1 => Just(4 * DAY)],
            prop_oneof![2 => Just(1.0), 1 => Just(1.6), 1 => Just(2.5)],
        ),
    )
        .prop_map(
            |(
                lookback,
                half_life,
                hysteresis,
                cooldown,
                max_reservations,
                max_plans,
                drf,
                allowance_gpus,
                max_loss_per_gpu,
                headroom,
                drain_grace,
                (ranking_lookback, b200_weight),
            )| {
                Policy {
                    lookback,
                    half_life,
                    hysteresis,
                    cooldown,
                    max_reservations,
                    max_plans,
                    drf,
                    allowance_gpus,
                    max_loss_per_gpu,
                    headroom,
                    drain_grace,
                    ranking_lookback,
                    b200_weight,
                }
            },
        )
}

fn setup() -> impl Strategy<Value = Setup> {
    (
        prop::collection::vec(prop_oneof![Just(4u32), Just(8u32)], 2..=6),
        any::<bool>(),
        0u8..3,
        [1u32..=4, 1u32..=4, 1u32..=4],
        prop_oneof![Just(0u64), Just(30), Just(5 * MINUTE)],
        policy(),
    )
        .prop_map(
            |(node_gpus, two_clusters, tree, weights, save, policy)| Setup {
                node_gpus,
                two_clusters,
                tree,
                weights,
                save,
                policy,
            },
        )
}

fn sub() -> impl Strategy<Value = Sub> {
    (
        sub_untyped(),
        prop_oneof![6 => Just(None), 2 => Just(Some("h100")), 1 => Just(Some("b200"))],
        prop_oneof![8 => Just(None), 1 => Just(Some("n0")), 1 => Just(Some("n1"))],
    )
        .prop_map(|(s, gpu_type, exclude)| Sub {
            gpu_type,
            exclude,
            ..s
        })
}

fn sub_untyped() -> impl Strategy<Value = Sub> {
    (
        0usize..5,
        prop_oneof![4 => 1u32..=2, 2 => 3u32..=4, 1 => 5u32..=8],
        prop_oneof![6 => Just(1u32), 2 => Just(2u32), 1 => Just(3u32)],
        prop_oneof![4 => 1u32..=4, 1 => 5u32..=10],
        prop_oneof![
            3 => Just(0),
            3 => Just(5 * MINUTE),
            2 => Just(30 * MINUTE),
            1 => Just(2 * HOUR),
            1 => Just(8 * HOUR),
        ],
        prop::bool::weighted(0.7),
        -2i32..=2,
        prop_oneof![1 => 1..=10 * MINUTE, 2 => 10 * MINUTE..=3 * HOUR, 2 => 3 * HOUR..=DAY],
        prop_oneof![4 => Just(None), 1 => (MINUTE..=4 * HOUR).prop_map(Some)],
        prop::bool::weighted(0.1),
        prop::bool::weighted(0.2),
    )
        .prop_map(
            |(
                project,
                gpus,
                nodes,
                cpu_per_gpu,
                min_runtime,
                resumable,
                priority,
                run,
                time_limit,
                fails,
                no_requeue,
            )| Sub {
                project,
                gpus,
                nodes,
                cpu_per_gpu,
                min_runtime,
                resumable,
                priority,
                run,
                // The core refuses a min runtime longer than the time limit.
                time_limit: time_limit.map(|t: Secs| t.max(min_runtime)),
                fails,
                no_requeue,
                gpu_type: None,
                exclude: None,
            },
        )
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        10 => sub().prop_map(Op::Submit),
        3 => (sub(), 2u32..=8).prop_map(|(s, n)| Op::Burst(s, n)),
        8 => prop_oneof![3 => 1..10 * MINUTE, 4 => 10 * MINUTE..2 * HOUR, 2 => 2 * HOUR..12 * HOUR]
            .prop_map(Op::Advance),
        2 => (0usize..64).prop_map(Op::Cancel),
        2 => (0usize..64, any::<bool>()).prop_map(|(i, h)| Op::Hold(i, h)),
        1 => (0usize..64).prop_map(Op::Requeue),
        2 => (
            0usize..6,
            prop_oneof![
                3 => Just(NodeState::Ready),
                2 => Just(NodeState::Draining),
                1 => Just(NodeState::DrainNow),
                1 => Just(NodeState::Down),
            ]
        )
            .prop_map(|(n, s)| Op::Node(n, s)),
        1 => (0usize..6, 0u32..8, prop::bool::weighted(0.3), any::<bool>()).prop_map(
            |(node, gpu, healthy, kill)| Op::Gpu {
                node,
                gpu,
                healthy,
                kill
            }
        ),
    ]
}

fn case() -> impl Strategy<Value = (Setup, Vec<Op>)> {
    (setup(), prop::collection::vec(op(), 1..=60))
}

/// Small jobs with short contracts arriving in bursts on two or three nodes: groups
/// swing past each other's served ratios, so funded preemption happens all the time.
fn contended() -> impl Strategy<Value = (Setup, Vec<Op>)> {
    let setup = (
        setup(),
        prop::collection::vec(prop_oneof![3 => Just(4u32), 1 => Just(8u32)], 2..=3),
        prop_oneof![2 => Just(0u64), 1 => Just(30)],
    )
        .prop_map(|(mut s, node_gpus, save)| {
            // On a small cluster one lease moves a served ratio a lot; instant
            // checkpoints put a preemption and its aftermath at one `now`.
            s.node_gpus = node_gpus;
            s.two_clusters = false;
            s.save = save;
            s.policy.max_plans = 16;
            s.policy.cooldown = s.policy.cooldown.max(30 * MINUTE);
            s
        });
    let job = (
        0usize..5,
        1u32..=2,
        prop_oneof![1 => Just(0), 3 => Just(5 * MINUTE), 1 => Just(30 * MINUTE)],
        prop::bool::weighted(0.8),
        HOUR..=2 * DAY,
    )
        .prop_map(|(project, gpus, min_runtime, resumable, run)| Sub {
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
        });
    let op = prop_oneof![
        4 => (job.clone(), 2u32..=8).prop_map(|(s, n)| Op::Burst(s, n)),
        1 => job.prop_map(Op::Submit),
        4 => prop_oneof![3 => 1..10 * MINUTE, 2 => 10 * MINUTE..2 * HOUR, 1 => 2 * HOUR..DAY]
            .prop_map(Op::Advance),
        1 => (0usize..64).prop_map(Op::Cancel),
        1 => (0usize..3, 0u32..8, prop::bool::weighted(0.3)).prop_map(|(node, gpu, healthy)| {
            Op::Gpu {
                node,
                gpu,
                healthy,
                kill: false,
            }
        }),
    ];
    (setup, prop::collection::vec(op, 1..=40))
}

/// Cases without what is known to break property 5 (see
/// `a_reservation_is_not_its_groups_allocation` and
/// `equal_ratios_do_not_preempt_both_ways`): single-node work only, hysteresis above
/// zero.
pub(crate) fn untied_single_node_case() -> impl Strategy<Value = (Setup, Vec<Op>)> {
    any_case().prop_map(|(mut setup, ops)| {
        setup.policy.hysteresis = setup.policy.hysteresis.max(0.05);
        let ops = ops
            .into_iter()
            .map(|op| match op {
                Op::Submit(s) => Op::Submit(Sub { nodes: 1, ..s }),
                Op::Burst(s, n) => Op::Burst(Sub { nodes: 1, ..s }, n),
                op => op,
            })
            .collect();
        (setup, ops)
    })
}

/// Either kind of case: general ones find the odd interaction, contended ones
/// exercise preemption hard.
pub(crate) fn any_case() -> impl Strategy<Value = (Setup, Vec<Op>)> {
    prop_oneof![case(), contended()]
}

/// `cases` per property, unless PROPTEST_CASES asks for a longer soak.
pub(crate) fn config(cases: u32) -> ProptestConfig {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(cases);
    ProptestConfig {
        cases,
        // Shrunk failures are reported in the test output; no files beside the test.
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

pub(super) fn tree_specs(variant: u8, w: [u32; 3]) -> Vec<GroupSpec> {
    let g = |name: &str, parent: Option<&str>, weight: u32| GroupSpec {
        name: name.into(),
        parent: parent.map(Into::into),
        weight: f64::from(weight),
    };
    match variant {
        0 => vec![
            g("a", None, w[0]),
            g("b", None, w[1]),
            g("a1", Some("a"), 1),
            g("a2", Some("a"), 2),
        ],
        1 => vec![
            g("a", None, w[0]),
            g("b", None, w[1]),
            g("c", None, w[2]),
            g("a1", Some("a"), 1),
            g("a2", Some("a"), 1),
            g("b1", Some("b"), 3),
            g("b2", Some("b"), 1),
        ],
        _ => vec![g("a", None, w[0]), g("b", None, w[1])],
    }
}

pub(super) fn node_specs(s: &Setup) -> Vec<NodeSpec> {
    s.node_gpus
        .iter()
        .enumerate()
        .map(|(i, &gpus)| NodeSpec {
            name: format!("n{i}"),
            cluster: if s.two_clusters && i % 2 == 1 {
                "c1".into()
            } else {
                "c0".into()
            },
            gpus,
            cpu: 8 * gpus,
            memory_gb: 64 * gpus,
            gpu_type: if i % 3 == 2 { "b200" } else { "h100" }.into(),
            ..Default::default()
        })
        .collect()
}

pub(super) fn policy_config(p: &Policy) -> PolicyConfig {
    PolicyConfig {
        usage_model: if p.half_life {
            UsageModelKind::HalfLife
        } else {
            UsageModelKind::Window
        },
        lookback: p.lookback,
        hysteresis: p.hysteresis,
        cooldown: p.cooldown,
        max_reservations: p.max_reservations,
        max_preemption_plans: p.max_plans,
        drf: p.drf,
        allowance_gpus: p.allowance_gpus,
        max_loss_per_gpu: p.max_loss_per_gpu,
        protected_headroom: p.headroom,
        drain_grace: p.drain_grace,
        ranking_lookback: p.ranking_lookback,
        gpu_hour_weight: [("b200".to_string(), p.b200_weight)].into(),
        ..PolicyConfig::default()
    }
}
