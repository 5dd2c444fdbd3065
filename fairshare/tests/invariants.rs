//! Property tests of the scheduler's invariants.
//!
//! A small shell plays the agents: it remembers every lease a `Start` hands out, ends a
//! revoked lease `save` seconds after `max(now, not_before)`, lets leases finish on
//! their own, takes nodes down and GPUs out, and calls `schedule(now)` after every
//! input and at every event and wake-up. Proptest drives it with random clusters, org
//! trees, policies and operation sequences; every pass is checked against the
//! invariants below, and each property test fails only on its own kind of violation,
//! so one broken rule does not hide behind another.
//!
//! The shell's own bookkeeping (which GPUs its agents hold, which workloads it saw
//! end) is the reference: a core that agrees with itself but not with the agents
//! still fails.

use allot_fairshare::config::UsageModelKind;
use allot_fairshare::scheduler::ClaimKind;
use allot_fairshare::time::{Secs, Time, DAY, HOUR, MINUTE};
use allot_fairshare::workload::NodeGpus;
use allot_fairshare::{
    Action, CoreError, Decisions, GroupId, GroupSpec, Lease, LeaseEnd, LeaseId, NodeId, NodeSpec,
    NodeState, OrgTree, PolicyConfig, RevokeWhy, Scheduler, StartWhy, WorkloadId, WorkloadSpec,
    WorkloadState,
};
use proptest::prelude::*;
use proptest::strategy::ValueTree;
use proptest::test_runner::{RngAlgorithm, TestRng, TestRunner};
use std::collections::{BTreeMap, BTreeSet};

// ---------------------------------------------------------------------------------
// Generated inputs
// ---------------------------------------------------------------------------------

/// The world one case runs in.
#[derive(Debug, Clone)]
struct Setup {
    /// GPUs of each node; nodes alternate between two clusters when `two_clusters`.
    node_gpus: Vec<u32>,
    two_clusters: bool,
    /// Which org tree (see `tree_specs`).
    tree: u8,
    /// Team weights, in tree order.
    weights: [u32; 3],
    /// Checkpoint time of a revoked lease.
    save: Secs,
    policy: Policy,
}

#[derive(Debug, Clone)]
struct Policy {
    lookback: Secs,
    half_life: bool,
    hysteresis: f64,
    cooldown: Secs,
    max_reservations: u32,
    max_plans: u32,
    drf: bool,
}

#[derive(Debug, Clone)]
struct Sub {
    /// Index into the tree's projects (modulo their number).
    project: usize,
    gpus: u32,
    nodes: u32,
    /// CPU cores asked per GPU; nodes have 8 per GPU, so above 8 host room binds.
    cpu_per_gpu: u32,
    min_runtime: Secs,
    resumable: bool,
    priority: i32,
    /// How long one run takes before it exits on its own.
    run: Secs,
    time_limit: Option<Secs>,
    /// Exits with a failure rather than success.
    fails: bool,
    /// Ends as preempted rather than waiting again.
    no_requeue: bool,
}

#[derive(Debug, Clone)]
enum Op {
    Submit(Sub),
    /// `n` copies at once, like a job array: what makes groups contend.
    Burst(Sub, u32),
    Advance(Secs),
    /// Index into the workloads submitted so far (modulo their number).
    Cancel(usize),
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
    )
        .prop_map(
            |(lookback, half_life, hysteresis, cooldown, max_reservations, max_plans, drf)| {
                Policy {
                    lookback,
                    half_life,
                    hysteresis,
                    cooldown,
                    max_reservations,
                    max_plans,
                    drf,
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
fn untied_single_node_case() -> impl Strategy<Value = (Setup, Vec<Op>)> {
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
fn any_case() -> impl Strategy<Value = (Setup, Vec<Op>)> {
    prop_oneof![case(), contended()]
}

/// `cases` per property, unless PROPTEST_CASES asks for a longer soak.
fn config(cases: u32) -> ProptestConfig {
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

fn tree_specs(variant: u8, w: [u32; 3]) -> Vec<GroupSpec> {
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

fn node_specs(s: &Setup) -> Vec<NodeSpec> {
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
        })
        .collect()
}

fn policy_config(p: &Policy) -> PolicyConfig {
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
        ..PolicyConfig::default()
    }
}

// ---------------------------------------------------------------------------------
// The shell
// ---------------------------------------------------------------------------------

/// Which invariant a violation breaks; each property test looks at one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Prop {
    /// No GPU held twice; starts only on ready nodes, healthy GPUs, within host room.
    Exclusive,
    /// Protected leases are only taken back the ways the contract allows.
    Protection,
    /// Restarted preempted work gets its cooldown.
    Cooldown,
    /// Gangs start whole, on one cluster.
    Gang,
    /// Funded preemptions form no cycle between two pieces of news and keep the
    /// hysteresis.
    Cycle,
    /// No workload takes GPUs back from the one that took them, within the cooldown.
    Bounce,
    /// Claims set aside usable GPUs for one pending workload each.
    Claims,
    /// A lease is revoked again only to make it sooner, or to cancel it.
    Revokes,
    /// Every workload is accounted for, in the state its history implies.
    Books,
}

#[derive(Debug, Clone, Copy)]
enum Ev {
    End(LeaseId, LeaseEnd),
    Wake,
}

/// A lease as the agents hold it.
#[derive(Debug, Clone)]
struct Live {
    workload: WorkloadId,
    project: GroupId,
    start: Time,
    placement: Vec<NodeGpus>,
    gpus: u64,
}

#[derive(Debug, Clone)]
struct Job {
    run: Secs,
    time_limit: Option<Secs>,
    fails: bool,
}

/// What the generated cases exercised, so that the properties are not vacuous.
#[derive(Debug, Clone, Default)]
struct Stats {
    starts_free: u64,
    starts_after_preemption: u64,
    starts_reservation: u64,
    starts_backfill: u64,
    gang_starts: u64,
    funded_preemptions: u64,
    unfunded_preemptions: u64,
    reservation_revokes: u64,
    drain_revokes: u64,
    drain_now_revokes: u64,
    cancel_revokes: u64,
    reserves: u64,
    requeues: u64,
    node_lost: u64,
}

impl Stats {
    fn add(&mut self, o: &Stats) {
        self.starts_free += o.starts_free;
        self.starts_after_preemption += o.starts_after_preemption;
        self.starts_reservation += o.starts_reservation;
        self.starts_backfill += o.starts_backfill;
        self.gang_starts += o.gang_starts;
        self.funded_preemptions += o.funded_preemptions;
        self.unfunded_preemptions += o.unfunded_preemptions;
        self.reservation_revokes += o.reservation_revokes;
        self.drain_revokes += o.drain_revokes;
        self.drain_now_revokes += o.drain_now_revokes;
        self.cancel_revokes += o.cancel_revokes;
        self.reserves += o.reserves;
        self.requeues += o.requeues;
        self.node_lost += o.node_lost;
    }
}

/// Passes honoured for bare wake-ups within one `advance`: a pass cut short asks for
/// `now + 1`, which an honest shell would follow second by second for hours.
const MAX_WAKE_PASSES: u32 = 64;

struct Shell {
    sch: Scheduler,
    cooldown: Secs,
    hysteresis: f64,
    save: Secs,
    now: Time,
    seq: u64,
    events: BTreeMap<(Time, u64), Ev>,
    wakes: BTreeSet<Time>,
    live: BTreeMap<LeaseId, Live>,
    /// Every lease ever started, as the core described it right after the start.
    seen: BTreeMap<LeaseId, Lease>,
    jobs: BTreeMap<WorkloadId, Job>,
    ids: Vec<WorkloadId>,
    finals: BTreeMap<WorkloadId, WorkloadState>,
    last_revoke: BTreeMap<LeaseId, RevokeWhy>,
    /// Earliest `not_before` each revoked lease was given.
    revoked_at: BTreeMap<LeaseId, Time>,
    log: Vec<(Time, Decisions)>,
    bad: Vec<(Prop, String)>,
    /// Funded preemption edges (requester group → victim group) since the core last
    /// heard anything but a revoked lease's end at this instant.
    edges: BTreeSet<(GroupId, GroupId)>,
    edges_at: Time,
    /// (when, requester, victim) of every funded preemption.
    funded_preemptions: Vec<(Time, WorkloadId, WorkloadId)>,
    /// (project, start, end, GPUs) of every ended lease.
    served: Vec<(GroupId, Time, Time, u64)>,
    stats: Stats,
    /// Whole-book checks after every pass; the long convergence run skips them.
    books: bool,
}

impl Shell {
    fn new(cfg: PolicyConfig, tree: OrgTree, nodes: Vec<NodeSpec>, save: Secs) -> Self {
        Shell {
            cooldown: cfg.cooldown,
            hysteresis: cfg.hysteresis,
            sch: Scheduler::new(cfg, tree, nodes).expect("valid scheduler"),
            save,
            now: 0,
            seq: 0,
            events: BTreeMap::new(),
            wakes: BTreeSet::new(),
            live: BTreeMap::new(),
            seen: BTreeMap::new(),
            jobs: BTreeMap::new(),
            ids: Vec::new(),
            finals: BTreeMap::new(),
            last_revoke: BTreeMap::new(),
            revoked_at: BTreeMap::new(),
            log: Vec::new(),
            bad: Vec::new(),
            edges_at: 0,
            edges: BTreeSet::new(),
            funded_preemptions: Vec::new(),
            served: Vec::new(),
            stats: Stats::default(),
            books: true,
        }
    }

    fn for_setup(s: &Setup) -> Self {
        let tree = OrgTree::new(&tree_specs(s.tree, s.weights)).expect("valid tree");
        Shell::new(policy_config(&s.policy), tree, node_specs(s), s.save)
    }

    fn fail(&mut self, p: Prop, msg: String) {
        // The first few say it all; a broken rule repeats on every pass after.
        if self.bad.iter().filter(|b| b.0 == p).count() < 8 {
            self.bad.push((p, format!("t={}: {msg}", self.now)));
        }
    }

    fn violations(&self, p: Prop) -> Vec<&str> {
        self.bad
            .iter()
            .filter(|b| b.0 == p)
            .map(|b| b.1.as_str())
            .collect()
    }

    /// The core hears something besides a revoked lease's end: ratios may move, so
    /// preemptions before it no longer bound the ones after it.
    fn news(&mut self) {
        self.edges.clear();
    }

    fn push(&mut self, t: Time, ev: Ev) {
        self.seq += 1;
        self.events.insert((t, self.seq), ev);
    }

    fn apply(&mut self, op: &Op) {
        match op {
            Op::Submit(s) => self.submit(s),
            Op::Burst(s, n) => {
                for _ in 0..*n {
                    self.submit(s);
                }
            }
            Op::Advance(dt) => self.advance(*dt),
            Op::Cancel(i) => self.cancel(*i),
            Op::Node(n, state) => self.node(*n, *state),
            Op::Gpu {
                node,
                gpu,
                healthy,
                kill,
            } => self.gpu(*node, *gpu, *healthy, *kill),
        }
    }

    fn submit(&mut self, s: &Sub) {
        let projects = self.sch.tree().projects();
        let p = projects[s.project % projects.len()];
        let spec = WorkloadSpec {
            project: self.sch.tree().group(p).name.clone(),
            user: "u".into(),
            class: "batch".into(),
            gpus_per_node: s.gpus,
            nodes: s.nodes,
            cpu_per_node: s.gpus * s.cpu_per_gpu,
            mem_per_node_gb: s.gpus * 16,
            min_runtime: s.min_runtime,
            time_limit: s.time_limit,
            resumable: s.resumable,
            priority: s.priority,
            no_requeue: s.no_requeue,
        };
        self.submit_spec(
            spec,
            Job {
                run: s.run,
                time_limit: s.time_limit,
                fails: s.fails,
            },
        );
        self.pass();
    }

    fn submit_spec(&mut self, spec: WorkloadSpec, job: Job) -> Option<WorkloadId> {
        self.news();
        // Refused only when no cluster has enough nodes that could ever hold it.
        let c = self.sch.cluster();
        let fits = c.cluster_names().iter().enumerate().any(|(ci, _)| {
            let holders = c
                .nodes()
                .filter(|(_, n)| {
                    usize::from(n.cluster) == ci
                        && n.spec.gpus >= spec.gpus_per_node
                        && n.spec.cpu >= spec.cpu_per_node
                        && n.spec.memory_gb >= spec.mem_per_node_gb
                })
                .count();
            holders >= spec.nodes as usize
        });
        match self.sch.submit(self.now, spec.clone()) {
            Ok(id) => {
                if !fits {
                    self.fail(Prop::Books, format!("accepted {spec:?}, which never fits"));
                }
                self.ids.push(id);
                self.jobs.insert(id, job);
                Some(id)
            }
            Err(CoreError::Impossible { .. }) if !fits => None,
            Err(e) => {
                self.fail(Prop::Books, format!("refused {spec:?}: {e}"));
                None
            }
        }
    }

    fn cancel(&mut self, i: usize) {
        self.news();
        if self.ids.is_empty() {
            return;
        }
        let id = self.ids[i % self.ids.len()];
        let running = self.live.values().any(|l| l.workload == id);
        let ended = self.finals.contains_key(&id);
        match self.sch.cancel(self.now, id) {
            Ok(()) if ended => self.fail(Prop::Books, format!("cancelled {id:?} after it ended")),
            Ok(()) => {
                if !running {
                    self.finals.insert(id, WorkloadState::Cancelled);
                }
            }
            Err(CoreError::AlreadyEnded(_)) if ended => {}
            Err(e) => self.fail(Prop::Books, format!("cancel {id:?}: {e}")),
        }
        self.pass();
    }

    fn node(&mut self, n: usize, state: NodeState) {
        self.news();
        let node = NodeId((n % self.sch.cluster().len()) as u32);
        if let Err(e) = self.sch.set_node_state(self.now, node, state) {
            self.fail(Prop::Books, format!("set_node_state {node:?}: {e}"));
        }
        if state == NodeState::Down {
            let lost: Vec<LeaseId> = self
                .live
                .iter()
                .filter(|(_, l)| l.placement.iter().any(|p| p.node == node))
                .map(|(id, _)| *id)
                .collect();
            for lid in lost {
                self.end_lease(lid, LeaseEnd::NodeLost);
            }
        }
        self.pass();
    }

    fn gpu(&mut self, n: usize, gpu: u32, healthy: bool, kill: bool) {
        self.news();
        let node = NodeId((n % self.sch.cluster().len()) as u32);
        let gpu = gpu % self.sch.cluster().node(node).spec.gpus;
        if let Err(e) = self.sch.set_gpu_health(node, gpu, healthy) {
            self.fail(Prop::Books, format!("set_gpu_health {node:?}/{gpu}: {e}"));
        }
        if !healthy && kill {
            let hit: Vec<LeaseId> = self
                .live
                .iter()
                .filter(|(_, l)| {
                    l.placement
                        .iter()
                        .any(|p| p.node == node && p.gpus & (1 << gpu) != 0)
                })
                .map(|(id, _)| *id)
                .collect();
            for lid in hit {
                self.end_lease(lid, LeaseEnd::NodeLost);
            }
        }
        self.pass();
    }

    /// Moves the clock to `now + dt`, ending leases and honouring wake-ups on the way.
    fn advance(&mut self, dt: Secs) {
        let target = self.now + dt;
        let mut wake_passes = 0;
        while let Some((&(t, _), _)) = self.events.first_key_value() {
            if t > target {
                break;
            }
            self.now = t;
            let mut ended = false;
            while let Some(e) = self.events.first_entry() {
                if e.key().0 != t {
                    break;
                }
                match e.remove() {
                    Ev::End(lid, end) => {
                        ended |= self.live.contains_key(&lid);
                        self.end_lease(lid, end);
                    }
                    Ev::Wake => {
                        self.wakes.remove(&t);
                    }
                }
            }
            if !ended {
                wake_passes += 1;
            }
            if ended || wake_passes <= MAX_WAKE_PASSES {
                self.pass();
            }
        }
        self.now = target;
        self.pass();
    }

    fn end_lease(&mut self, lid: LeaseId, end: LeaseEnd) {
        let Some(l) = self.live.remove(&lid) else {
            return; // ended already: a revoke and the exit raced, the first one won
        };
        self.served.push((l.project, l.start, self.now, l.gpus));
        if end != LeaseEnd::Revoked {
            self.news();
        }
        let requeue = self
            .sch
            .workload(l.workload)
            .is_some_and(|w| !w.spec.no_requeue);
        let cancelled = matches!(self.last_revoke.get(&lid), Some(RevokeWhy::Cancelled));
        let expect = match end {
            LeaseEnd::Completed => WorkloadState::Completed,
            LeaseEnd::Failed => WorkloadState::Failed,
            LeaseEnd::TimeLimit => WorkloadState::TimedOut,
            LeaseEnd::Revoked | LeaseEnd::NodeLost | LeaseEnd::Refused if cancelled => {
                WorkloadState::Cancelled
            }
            LeaseEnd::Refused => WorkloadState::Pending,
            LeaseEnd::Revoked | LeaseEnd::NodeLost if requeue => WorkloadState::Pending,
            LeaseEnd::Revoked => WorkloadState::Preempted,
            LeaseEnd::NodeLost => WorkloadState::Failed,
        };
        if end == LeaseEnd::NodeLost {
            self.stats.node_lost += 1;
        }
        match self.sch.lease_ended(self.now, lid, end) {
            Ok(s) => {
                if s != expect {
                    self.fail(
                        Prop::Books,
                        format!(
                            "{lid:?} of {:?} ended {end:?} (last revoke {:?}): core says {s:?}, \
                             expected {expect:?}",
                            l.workload,
                            self.last_revoke.get(&lid)
                        ),
                    );
                }
                if s == WorkloadState::Pending {
                    self.stats.requeues += 1;
                }
                if s.is_final() {
                    self.finals.insert(l.workload, s);
                }
            }
            Err(e) => self.fail(
                Prop::Books,
                format!("the agents held {lid:?} but the core refused its end: {e}"),
            ),
        }
    }

    /// One scheduling pass, carried out and checked.
    fn pass(&mut self) {
        let d = self.sch.schedule(self.now);
        for a in &d.actions {
            match a {
                Action::Start {
                    lease,
                    workload,
                    placement,
                    funded,
                    why,
                } => self.on_start(*lease, *workload, placement, *funded, why),
                Action::Revoke {
                    lease,
                    workload,
                    not_before,
                    why,
                } => self.on_revoke(*lease, *workload, *not_before, why),
                Action::Reserve {
                    workload,
                    nodes,
                    start,
                } => self.on_reserve(*workload, nodes, *start),
                Action::Withdraw { lease, .. } => self.on_withdraw(*lease),
            }
        }
        if let Some(w) = d.next_wakeup {
            if w > self.now && self.wakes.insert(w) {
                self.push(w, Ev::Wake);
            }
        }
        self.check_exclusive();
        self.check_claims();
        if self.books {
            self.check_books();
        }
        self.log.push((self.now, d));
    }

    fn on_start(
        &mut self,
        lid: LeaseId,
        wid: WorkloadId,
        placement: &[NodeGpus],
        funded: bool,
        why: &StartWhy,
    ) {
        let now = self.now;
        match why {
            StartWhy::Free { .. } => self.stats.starts_free += 1,
            StartWhy::AfterPreemption => self.stats.starts_after_preemption += 1,
            StartWhy::Reservation => self.stats.starts_reservation += 1,
            StartWhy::Backfill { .. } => self.stats.starts_backfill += 1,
        }
        let Some(w) = self.sch.workload(wid).cloned() else {
            self.fail(Prop::Books, format!("{lid:?} starts unknown {wid:?}"));
            return;
        };
        let Some(lease) = self.sch.lease(lid).cloned() else {
            self.fail(
                Prop::Books,
                format!("{lid:?} started but the core has no such lease"),
            );
            return;
        };
        let spec = &w.spec;

        // Gang shape: k distinct nodes of one cluster, exactly gpus_per_node on each.
        if spec.nodes > 1 {
            self.stats.gang_starts += 1;
        }
        let c = self.sch.cluster();
        let nodes: BTreeSet<NodeId> = placement.iter().map(|p| p.node).collect();
        let clusters: BTreeSet<u16> = placement.iter().map(|p| c.node(p.node).cluster).collect();
        let per_node_ok = placement
            .iter()
            .all(|p| p.gpus.count_ones() == spec.gpus_per_node);
        if placement.len() != spec.nodes as usize
            || nodes.len() != placement.len()
            || clusters.len() != 1
            || !per_node_ok
        {
            self.fail(
                Prop::Gang,
                format!(
                    "{wid:?} asks {}×{} GPUs, {why:?} placed it on {placement:?}",
                    spec.nodes, spec.gpus_per_node
                ),
            );
        }

        // Only ready nodes, healthy GPUs the node has, and none an agent still holds.
        let c = self.sch.cluster();
        let mut bad = Vec::new();
        for p in placement {
            let n = c.node(p.node);
            if n.state != NodeState::Ready {
                bad.push(format!("{:?} is {:?}", p.node, n.state));
            }
            if p.gpus & !n.all() != 0 || p.gpus & !n.healthy != 0 {
                bad.push(format!(
                    "{:?} GPUs {:#b} outside healthy {:#b}",
                    p.node, p.gpus, n.healthy
                ));
            }
            for (other, l) in &self.live {
                let clash = l
                    .placement
                    .iter()
                    .any(|q| q.node == p.node && q.gpus & p.gpus != 0);
                if clash {
                    bad.push(format!(
                        "{:?} GPUs {:#b} still held by {other:?} of {:?}",
                        p.node, p.gpus, l.workload
                    ));
                }
            }
        }
        if let Some((other, _)) = self.live.iter().find(|(_, l)| l.workload == wid) {
            bad.push(format!("{wid:?} already runs as {other:?}"));
        }
        for b in bad {
            self.fail(
                Prop::Exclusive,
                format!("start {lid:?} of {wid:?} ({why:?}): {b}"),
            );
        }

        // Funding is the contract: only work that asks for protection gets it.
        if funded != lease.funded || (funded && spec.min_runtime == 0) {
            self.fail(
                Prop::Protection,
                format!(
                    "{lid:?} of {wid:?} started funded={funded} (lease says {}) with \
                     min_runtime {}",
                    lease.funded, spec.min_runtime
                ),
            );
        }
        if funded && lease.preemptible_at < now + spec.min_runtime {
            self.fail(
                Prop::Protection,
                format!(
                    "{lid:?} protected only until {} though min_runtime is {}",
                    lease.preemptible_at, spec.min_runtime
                ),
            );
        }
        if funded && w.last_preempted.is_some() && lease.preemptible_at < now + self.cooldown {
            self.fail(
                Prop::Cooldown,
                format!(
                    "{wid:?} was preempted at {:?} and restarts ({why:?}) as {lid:?} \
                     preemptible at {}, before the cooldown of {}s ends at {}",
                    w.last_preempted,
                    lease.preemptible_at,
                    self.cooldown,
                    now + self.cooldown
                ),
            );
        }

        let job = self
            .jobs
            .get(&wid)
            .cloned()
            .expect("submitted through the shell");
        let (len, end) = match job.time_limit {
            Some(tl) if tl < job.run => (tl, LeaseEnd::TimeLimit),
            _ if job.fails => (job.run, LeaseEnd::Failed),
            _ => (job.run, LeaseEnd::Completed),
        };
        self.push(now + len.max(1), Ev::End(lid, end));
        self.live.insert(
            lid,
            Live {
                workload: wid,
                project: w.project,
                start: now,
                placement: placement.to_vec(),
                gpus: placement
                    .iter()
                    .map(|p| u64::from(p.gpus.count_ones()))
                    .sum(),
            },
        );
        self.seen.insert(lid, lease);
    }

    fn on_revoke(&mut self, lid: LeaseId, wid: WorkloadId, not_before: Time, why: &RevokeWhy) {
        let now = self.now;
        let Some(l) = self.sch.lease(lid).or_else(|| self.seen.get(&lid)).cloned() else {
            self.fail(Prop::Books, format!("revoke of {lid:?}, never started"));
            return;
        };
        if l.workload != wid {
            self.fail(Prop::Books, format!("revoke of {lid:?} names {wid:?}"));
        }
        let prior = self.revoked_at.get(&lid).copied();
        let news = prior.is_none_or(|p| not_before < p) || *why == RevokeWhy::Cancelled;
        if !news {
            self.fail(
                Prop::Revokes,
                format!(
                    "{lid:?} of {wid:?} revoked again ({why:?}, from {not_before}) though \
                     already revoked from {prior:?}"
                ),
            );
        }
        self.revoked_at
            .insert(lid, prior.map_or(not_before, |p| p.min(not_before)));
        let protected = l.funded && l.preemptible_at > now;
        match why {
            RevokeWhy::Preempted {
                by,
                unfunded,
                requester_ratio_after,
                victim_ratio_after,
            } => {
                if *unfunded {
                    self.stats.unfunded_preemptions += 1;
                } else {
                    self.stats.funded_preemptions += 1;
                }
                if protected || *unfunded == l.funded {
                    self.fail(
                        Prop::Protection,
                        format!(
                            "{lid:?} (funded={}, preemptible at {}) preempted by {by:?} \
                             (unfunded={unfunded})",
                            l.funded, l.preemptible_at
                        ),
                    );
                }
                let requester_funded = self
                    .sch
                    .workload(*by)
                    .is_some_and(|w| w.spec.min_runtime > 0);
                if !requester_funded {
                    self.fail(
                        Prop::Protection,
                        format!("{by:?} asks for no protection yet preempted {lid:?}"),
                    );
                }
                if !*unfunded {
                    self.funded_preemption(
                        *by,
                        &l,
                        requester_ratio_after.unwrap_or(f64::NAN),
                        victim_ratio_after.unwrap_or(f64::NAN),
                    );
                }
            }
            RevokeWhy::Reservation { by } => {
                self.stats.reservation_revokes += 1;
                if protected {
                    self.fail(
                        Prop::Protection,
                        format!(
                            "{lid:?} protected until {} revoked for the reservation of {by:?}",
                            l.preemptible_at
                        ),
                    );
                }
            }
            RevokeWhy::Drain { .. } => {
                self.stats.drain_revokes += 1;
                if not_before < l.protected_until {
                    self.fail(
                        Prop::Protection,
                        format!(
                            "drain revokes {lid:?} from {not_before}, inside its min-runtime \
                             (until {})",
                            l.protected_until
                        ),
                    );
                }
            }
            RevokeWhy::DrainNow { .. } => self.stats.drain_now_revokes += 1,
            RevokeWhy::Cancelled => self.stats.cancel_revokes += 1,
        }
        if self.live.contains_key(&lid) {
            self.last_revoke.insert(lid, why.clone());
            self.push(
                not_before.max(now) + self.save,
                Ev::End(lid, LeaseEnd::Revoked),
            );
        }
    }

    /// A drain ended: its revocation is taken back and the lease runs on.
    fn on_withdraw(&mut self, lid: LeaseId) {
        let now = self.now;
        // Only a drain's revocation, and only once every node of the lease is ready.
        let ready = self.sch.lease(lid).is_some_and(|l| {
            l.placement
                .iter()
                .all(|p| self.sch.cluster().node(p.node).state == NodeState::Ready)
        });
        let ok = ready
            && matches!(
                self.last_revoke.get(&lid),
                Some(RevokeWhy::Drain { .. } | RevokeWhy::DrainNow { .. })
            );
        if !ok {
            self.fail(
                Prop::Revokes,
                format!(
                    "{lid:?} withdrawn at {now}, but its revocation was {:?} from {:?}",
                    self.last_revoke.get(&lid),
                    self.revoked_at.get(&lid)
                ),
            );
        }
        self.events
            .retain(|_, e| !matches!(e, Ev::End(l, LeaseEnd::Revoked) if *l == lid));
        self.revoked_at.remove(&lid);
        self.last_revoke.remove(&lid);
    }

    fn funded_preemption(
        &mut self,
        by: WorkloadId,
        victim: &Lease,
        req_after: f64,
        vic_after: f64,
    ) {
        let now = self.now;
        let tree = self.sch.tree();
        let Some(req_project) = self.sch.workload(by).map(|w| w.project) else {
            self.fail(Prop::Cycle, format!("preempted by unknown {by:?}"));
            return;
        };
        // Where the two paths diverge is where the fair-share rule compares them; the
        // same project on both ends is a self-loop.
        let (gr, gv) = tree
            .diverging(req_project, victim.project)
            .unwrap_or((req_project, req_project));
        let names = (tree.group(gr).name.clone(), tree.group(gv).name.clone());
        if self.edges_at != now {
            self.edges.clear();
            self.edges_at = now;
        }
        if gr == gv || reaches(&self.edges, gv, gr) {
            self.fail(
                Prop::Cycle,
                format!(
                    "{by:?} in {} preempts {:?} in {}, closing a cycle over {:?}",
                    names.0, victim.workload, names.1, self.edges
                ),
            );
        }
        self.edges.insert((gr, gv));
        // Written so that a NaN ratio fails too.
        let apart = req_after + self.hysteresis <= vic_after + 1e-12;
        if !apart {
            self.fail(
                Prop::Cycle,
                format!(
                    "{by:?} preempts {:?} with requester ratio after {req_after} and victim \
                     ratio after {vic_after}, inside hysteresis {}",
                    victim.workload, self.hysteresis
                ),
            );
        }
        let bounced = self
            .funded_preemptions
            .iter()
            .find(|(t, a, b)| *a == victim.workload && *b == by && now < t + self.cooldown)
            .copied();
        if let Some((t, _, _)) = bounced {
            self.fail(
                Prop::Bounce,
                format!(
                    "{by:?} preempts {:?}, which preempted it at {t}, within the cooldown of {}s",
                    victim.workload, self.cooldown
                ),
            );
        }
        self.funded_preemptions.push((now, by, victim.workload));
    }

    fn on_reserve(&mut self, wid: WorkloadId, nodes: &[NodeId], start: Time) {
        self.stats.reserves += 1;
        let Some(w) = self.sch.workload(wid) else {
            self.fail(Prop::Books, format!("reservation for unknown {wid:?}"));
            return;
        };
        let c = self.sch.cluster();
        let distinct: BTreeSet<NodeId> = nodes.iter().copied().collect();
        let clusters: BTreeSet<u16> = nodes.iter().map(|&n| c.node(n).cluster).collect();
        let fit = nodes.iter().all(|&n| {
            let n = c.node(n);
            n.state == NodeState::Ready && n.spec.gpus >= w.spec.gpus_per_node
        });
        if nodes.len() != w.spec.nodes as usize
            || distinct.len() != nodes.len()
            || clusters.len() != 1
            || !fit
            || start <= self.now
        {
            let nodes_wanted = w.spec.nodes;
            self.fail(
                Prop::Gang,
                format!("reservation for {wid:?} ({nodes_wanted} nodes) on {nodes:?} at {start}"),
            );
        }
    }

    /// After every pass: the core's leases are disjoint, fit their nodes' host room,
    /// and are exactly the ones the agents hold.
    fn check_exclusive(&mut self) {
        let c = self.sch.cluster();
        let mut used: BTreeMap<NodeId, (u64, u32, u32)> = BTreeMap::new();
        let mut bad = Vec::new();
        for l in self.sch.leases() {
            for p in &l.placement {
                let e = used.entry(p.node).or_default();
                if e.0 & p.gpus != 0 {
                    bad.push(format!(
                        "{:?} GPUs {:#b} leased twice",
                        p.node,
                        e.0 & p.gpus
                    ));
                }
                e.0 |= p.gpus;
                e.1 += l.cpu_per_node;
                e.2 += l.mem_per_node;
            }
        }
        for (node, (_, cpu, mem)) in &used {
            let n = c.node(*node);
            if *cpu > n.spec.cpu || *mem > n.spec.memory_gb {
                bad.push(format!(
                    "{node:?} holds {cpu} cores / {mem} GB of {:?}",
                    n.spec
                ));
            }
        }
        let core: BTreeSet<LeaseId> = self.sch.leases().map(|l| l.id).collect();
        let agents: BTreeSet<LeaseId> = self.live.keys().copied().collect();
        if core != agents {
            bad.push(format!("core leases {core:?}, agents hold {agents:?}"));
        }
        for b in bad {
            self.fail(Prop::Exclusive, b);
        }
    }

    /// After every pass: each claim holds GPUs for one pending workload, on ready
    /// nodes and healthy GPUs no other claim holds, shaped like the workload; the GPUs
    /// of a preemption claim are free or held by leases being revoked.
    fn check_claims(&mut self) {
        let c = self.sch.cluster();
        let mut bad = Vec::new();
        let mut held: BTreeMap<NodeId, u64> = BTreeMap::new();
        for (id, claim) in self.sch.claims() {
            let Some(w) = self.sch.workload(*id) else {
                bad.push(format!("claim for unknown {id:?}"));
                continue;
            };
            if w.state != WorkloadState::Pending {
                bad.push(format!("claim for {id:?}, which is {:?}", w.state));
            }
            let nodes: BTreeSet<NodeId> = claim.nodes.iter().map(|p| p.node).collect();
            if claim.nodes.len() != w.spec.nodes as usize || nodes.len() != claim.nodes.len() {
                bad.push(format!(
                    "claim of {id:?} on {:?} for {} nodes",
                    claim.nodes, w.spec.nodes
                ));
            }
            let preemption = claim.kind == ClaimKind::Preemption;
            for p in &claim.nodes {
                let n = c.node(p.node);
                if n.state != NodeState::Ready || p.gpus & !n.healthy != 0 {
                    bad.push(format!(
                        "claim of {id:?} holds {:?} GPUs {:#b}; node {:?}, healthy {:#b}",
                        p.node, p.gpus, n.state, n.healthy
                    ));
                }
                // A single-node claim takes exactly what it needs; a gang's, whole nodes.
                let want = if w.spec.nodes == 1 {
                    p.gpus.count_ones() == w.spec.gpus_per_node
                } else {
                    p.gpus == n.all()
                };
                if !want {
                    bad.push(format!(
                        "claim of {id:?} holds {:#b} on {:?} for {}×{} GPUs",
                        p.gpus, p.node, w.spec.nodes, w.spec.gpus_per_node
                    ));
                }
                let e = held.entry(p.node).or_default();
                if *e & p.gpus != 0 {
                    bad.push(format!(
                        "{:?} GPUs {:#b} claimed twice",
                        p.node,
                        *e & p.gpus
                    ));
                }
                *e |= p.gpus;
                if preemption {
                    for l in self.sch.leases() {
                        let overlap = l
                            .placement
                            .iter()
                            .any(|q| q.node == p.node && q.gpus & p.gpus != 0);
                        if overlap && l.revoke.is_none() {
                            bad.push(format!(
                                "claim of {id:?} on {:?} overlaps {:?}, which is not revoked",
                                p.node, l.id
                            ));
                        }
                    }
                }
            }
        }
        for b in bad {
            self.fail(Prop::Claims, b);
        }
    }

    /// After every pass: every submitted workload is known, in a state its history
    /// implies, and the counts add up.
    fn check_books(&mut self) {
        let mut bad = Vec::new();
        let (mut pending, mut running, mut ended) = (0usize, 0usize, 0usize);
        let mut demand = vec![0u64; self.sch.tree().len()];
        for &id in &self.ids {
            let Some(w) = self.sch.workload(id) else {
                bad.push(format!("{id:?} disappeared"));
                continue;
            };
            match w.state {
                WorkloadState::Pending => {
                    pending += 1;
                    if w.lease.is_some() {
                        bad.push(format!("pending {id:?} holds {:?}", w.lease));
                    }
                }
                WorkloadState::Running => {
                    running += 1;
                    let ok = w
                        .lease
                        .and_then(|l| self.sch.lease(l))
                        .is_some_and(|l| l.workload == id);
                    if !ok {
                        bad.push(format!("running {id:?} has lease {:?}", w.lease));
                    }
                }
                _ => ended += 1,
            }
            if !w.state.is_final() {
                demand[w.project.idx()] += u64::from(w.spec.total_gpus());
            }
            match self.finals.get(&id) {
                Some(f) if *f != w.state => {
                    bad.push(format!("{id:?} ended {f:?} but is now {:?}", w.state));
                }
                None if w.state.is_final() => {
                    bad.push(format!("{id:?} is {:?} though nothing ended it", w.state));
                }
                _ => {}
            }
        }
        if pending != self.sch.pending_len() {
            bad.push(format!(
                "{pending} workloads pending, pending_len says {}",
                self.sch.pending_len()
            ));
        }
        let leases = self.sch.leases().count();
        if running != leases || running != self.live.len() {
            bad.push(format!(
                "{running} running, {leases} core leases, {} held by agents",
                self.live.len()
            ));
        }
        if pending + running + ended != self.ids.len() {
            bad.push(format!(
                "{pending} + {running} + {ended} != {} submitted",
                self.ids.len()
            ));
        }
        for &p in self.sch.tree().projects() {
            if self.sch.demand()[p.idx()] != demand[p.idx()] {
                bad.push(format!(
                    "demand of {} is {}, its live work wants {}",
                    self.sch.tree().group(p).name,
                    self.sch.demand()[p.idx()],
                    demand[p.idx()]
                ));
            }
        }
        for b in bad {
            self.fail(Prop::Books, b);
        }
    }
}

/// True when `to` is reachable from `from` over `edges`.
fn reaches(edges: &BTreeSet<(GroupId, GroupId)>, from: GroupId, to: GroupId) -> bool {
    let mut stack = vec![from];
    let mut seen = BTreeSet::new();
    while let Some(g) = stack.pop() {
        if g == to {
            return true;
        }
        if seen.insert(g) {
            stack.extend(
                edges
                    .range((g, GroupId(0))..)
                    .take_while(|e| e.0 == g)
                    .map(|e| e.1),
            );
        }
    }
    false
}

fn run(setup: &Setup, ops: &[Op]) -> Shell {
    let mut sh = Shell::for_setup(setup);
    sh.pass();
    for op in ops {
        sh.apply(op);
    }
    sh
}

fn assert_clean(sh: &Shell, p: Prop) -> Result<(), TestCaseError> {
    let v = sh.violations(p);
    prop_assert!(v.is_empty(), "{p:?} violated:\n{}", v.join("\n"));
    Ok(())
}

// ---------------------------------------------------------------------------------
// Properties
// ---------------------------------------------------------------------------------

proptest! {
    #![proptest_config(config(128))]

    /// Property 1: no GPU is leased twice (core leases disjoint, each start on GPUs
    /// no agent holds), starts only on ready nodes and healthy GPUs, host room never
    /// exceeded, and the core's leases are exactly the agents'.
    #[test]
    fn no_gpu_is_ever_leased_twice((setup, ops) in any_case()) {
        assert_clean(&run(&setup, &ops), Prop::Exclusive)?;
    }

    /// Property 2: protected leases are taken back only as the contract allows:
    /// preemption and reservations take unfunded or lapsed leases, a drain waits for
    /// min-runtime, only drain-now and cancel revoke protected work at once; funding
    /// needs min_runtime > 0 and only funded work preempts.
    #[test]
    fn protected_leases_are_never_preempted((setup, ops) in any_case()) {
        assert_clean(&run(&setup, &ops), Prop::Protection)?;
    }

    /// Property 3: gangs are all-or-nothing: k distinct nodes of one cluster, exactly
    /// gpus_per_node on each; reservations name k ready nodes of one cluster.
    #[test]
    fn gangs_start_whole_on_one_cluster((setup, ops) in any_case()) {
        assert_clean(&run(&setup, &ops), Prop::Gang)?;
    }

    /// Property 4: the same inputs give the same decisions, pass for pass.
    #[test]
    fn decisions_are_deterministic((setup, ops) in any_case()) {
        let a = run(&setup, &ops);
        let b = run(&setup, &ops);
        prop_assert_eq!(a.log.len(), b.log.len());
        for (x, y) in a.log.iter().zip(&b.log) {
            prop_assert_eq!(x, y);
            prop_assert_eq!(format!("{x:?}"), format!("{y:?}"));
        }
        prop_assert_eq!(a.sch.explain(a.now), b.sch.explain(b.now));
    }

    /// Property 6, conservation: every accepted workload stays known; pending +
    /// running + ended = submitted; pending_len, leases and demand agree with the
    /// workloads; each state is the one its history implies; final states stay final.
    #[test]
    fn every_workload_is_accounted_for((setup, ops) in any_case()) {
        assert_clean(&run(&setup, &ops), Prop::Books)?;
    }
}

// What these catch shows up in a few percent of contended cases only; more cases
// make a regression fail the first run rather than one run in five.
proptest! {
    #![proptest_config(config(256))]

    /// Property 1b: claims set aside only usable GPUs, for one pending workload each,
    /// and a preemption claim only GPUs that are free or being given back.
    #[test]
    fn claims_hold_only_usable_gpus((setup, ops) in any_case()) {
        assert_clean(&run(&setup, &ops), Prop::Claims)?;
    }

    /// Property 2b: a preempted workload that restarts funded is protected for the
    /// cooldown, whichever way it restarts (free, after preemption, reservation).
    #[test]
    fn restarted_preempted_work_gets_its_cooldown((setup, ops) in any_case()) {
        assert_clean(&run(&setup, &ops), Prop::Cooldown)?;
    }

    /// Property 5: funded preemptions at one instant, with nothing but revoked leases'
    /// ends reported between them, form no cycle among the groups they compare (where
    /// requester's and victim's paths diverge), and respect the hysteresis they
    /// report.
    #[test]
    fn funded_preemption_never_cycles((setup, ops) in any_case()) {
        assert_clean(&run(&setup, &ops), Prop::Cycle)?;
    }

    /// Property 5b: no bounce: B never takes from A within the cooldown after A took
    /// from B.
    #[test]
    fn funded_preemption_never_bounces_back((setup, ops) in any_case()) {
        assert_clean(&run(&setup, &ops), Prop::Bounce)?;
    }

    /// Property 2c: a lease is revoked again only to take it sooner or to cancel it;
    /// anything else is a duplicate the agents must filter and the ratios may count
    /// twice.
    #[test]
    fn leases_are_revoked_once((setup, ops) in any_case()) {
        assert_clean(&run(&setup, &ops), Prop::Revokes)?;
    }
}

proptest! {
    #![proptest_config(config(512))]

    /// Property 5 where the core keeps it today: single-node work, hysteresis > 0.
    /// The regression it guards (victims still counted in the ratios, so one group
    /// overshoots and the other preempts back at once) showed in about one contended
    /// case in 40.
    #[test]
    fn funded_single_node_preemption_never_cycles((setup, ops) in untied_single_node_case()) {
        assert_clean(&run(&setup, &ops), Prop::Cycle)?;
    }
}

/// The generated cases reach every kind of start, revoke and reservation, so the
/// properties above are not vacuously true.
#[test]
fn generated_cases_exercise_every_path() {
    let mut runner =
        TestRunner::new_with_rng(config(64), TestRng::deterministic_rng(RngAlgorithm::ChaCha));
    let strategy = any_case();
    let mut total = Stats::default();
    for _ in 0..64 {
        let (setup, ops) = strategy
            .new_tree(&mut runner)
            .expect("strategy generates")
            .current();
        total.add(&run(&setup, &ops).stats);
    }
    let s = &total;
    let counts = [
        ("free starts", s.starts_free),
        ("starts after preemption", s.starts_after_preemption),
        ("reservation starts", s.starts_reservation),
        ("backfill starts", s.starts_backfill),
        ("gang starts", s.gang_starts),
        ("funded preemptions", s.funded_preemptions),
        ("unfunded preemptions", s.unfunded_preemptions),
        ("reservation revokes", s.reservation_revokes),
        ("drain revokes", s.drain_revokes),
        ("drain-now revokes", s.drain_now_revokes),
        ("cancel revokes", s.cancel_revokes),
        ("reservations", s.reserves),
        ("requeues", s.requeues),
        ("node losses", s.node_lost),
    ];
    let missing: Vec<_> = counts.iter().filter(|c| c.1 == 0).collect();
    assert!(missing.is_empty(), "never reached: {missing:?} in {s:?}");
}

// ---------------------------------------------------------------------------------
// Convergence
// ---------------------------------------------------------------------------------

/// SplitMix64: job lengths for the convergence runs, the same on every machine.
struct Mix(u64);

impl Mix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next() % (hi - lo + 1)
    }
}

/// Runs saturated 1-GPU demand from every project for `days` on two 8-GPU nodes and
/// returns each group's share of capacity served over the second half, beside its
/// weight share.
fn long_run_shares(
    specs: &[GroupSpec],
    min_runtime: Secs,
    days: u64,
    seed: u64,
) -> BTreeMap<String, (f64, f64)> {
    let tree = OrgTree::new(specs).expect("valid tree");
    let nodes = (0..2)
        .map(|i| NodeSpec {
            name: format!("n{i}"),
            cluster: "c".into(),
            gpus: 8,
            cpu: 64,
            memory_gb: 512,
        })
        .collect();
    let mut sh = Shell::new(PolicyConfig::default(), tree.clone(), nodes, 30);
    sh.books = false;
    let capacity = sh.sch.cluster().total_gpus();
    let projects: Vec<GroupId> = tree.projects().to_vec();
    let mut rng = Mix(seed);
    let end = days * DAY;
    while sh.now < end {
        // Keep every project's queue well past what the cluster can run.
        for &p in &projects {
            while sh.sch.demand()[p.idx()] < 2 * capacity + 8 {
                let run = rng.range(20 * MINUTE, 40 * MINUTE);
                let spec = WorkloadSpec {
                    project: tree.group(p).name.clone(),
                    user: "u".into(),
                    class: "batch".into(),
                    gpus_per_node: 1,
                    nodes: 1,
                    cpu_per_node: 1,
                    mem_per_node_gb: 1,
                    min_runtime,
                    time_limit: None,
                    resumable: true,
                    priority: 0,
                    no_requeue: false,
                };
                let job = Job {
                    run,
                    time_limit: None,
                    fails: false,
                };
                sh.submit_spec(spec, job).expect("accepted");
            }
        }
        sh.advance(10 * MINUTE);
    }
    assert!(
        sh.bad.is_empty(),
        "invariants broken on the way: {:#?}",
        sh.bad
    );
    let from = end / 2;
    let mut got = vec![0.0; tree.len()];
    let still: Vec<(GroupId, Time, Time, u64)> = sh
        .live
        .values()
        .map(|l| (l.project, l.start, end, l.gpus))
        .collect();
    for (project, s, e, g) in sh.served.iter().chain(&still) {
        let overlap = (*e.min(&end)).saturating_sub(*s.max(&from));
        // Charged to the project and every group above it.
        for &a in &tree.group(*project).path {
            got[a.idx()] += (overlap * g) as f64;
        }
    }
    let window = (capacity * (end - from)) as f64;
    tree.groups()
        .skip(1)
        .map(|(g, group)| (group.name.clone(), (got[g.idx()] / window, group.share)))
        .collect()
}

fn team(name: &str, weight: f64) -> GroupSpec {
    GroupSpec {
        name: name.into(),
        parent: None,
        weight,
    }
}

fn project(name: &str, parent: &str, weight: f64) -> GroupSpec {
    GroupSpec {
        name: name.into(),
        parent: Some(parent.into()),
        weight,
    }
}

fn assert_converges(specs: &[GroupSpec], min_runtime: Secs, seed: u64) {
    // Under 7 days, so that no budget (share × capacity × lookback) runs out while
    // every group gets its share; a skewed split would spend some and blur the result.
    let shares = long_run_shares(specs, min_runtime, 4, seed);
    for (name, (got, want)) in &shares {
        assert!(
            (got - want).abs() <= 0.02,
            "{name} got {got:.4} of capacity, its weight share is {want:.4}: {shares:?}"
        );
    }
}

/// Property 7: saturated unfunded demand at 3:1 settles at 3:1 of capacity.
#[test]
fn unfunded_demand_converges_to_weights_three_to_one() {
    assert_converges(&[team("a", 3.0), team("b", 1.0)], 0, 1);
}

/// Property 7: saturated funded demand (10-minute contracts) at 1:1:2 settles at
/// 1:1:2, and the 2 splits 1:3 between its two projects.
#[test]
fn funded_demand_converges_to_weights_one_one_two() {
    assert_converges(
        &[
            team("a", 1.0),
            team("b", 1.0),
            team("c", 2.0),
            project("c1", "c", 1.0),
            project("c2", "c", 3.0),
        ],
        10 * MINUTE,
        2,
    );
}

// ---------------------------------------------------------------------------------
// Reproductions of what the properties found, smallest first
// ---------------------------------------------------------------------------------

fn nodes_of(gpus: &[u32]) -> Vec<NodeSpec> {
    gpus.iter()
        .enumerate()
        .map(|(i, &gpus)| NodeSpec {
            name: format!("n{i}"),
            cluster: "c".into(),
            gpus,
            cpu: 64,
            memory_gb: 512,
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
