//! A property: after any sequence of host reports (registrations and health
//! reports with XIDs and clears), breaker holds and rechecks, and restarts (from a
//! snapshot, or the journal replayed), allotd's pool holds a GPU exactly when its
//! host last said it is usable.

use super::*;
use crate::config::{BreakerSection, ServerConfig, EXAMPLE};
use allot_fairshare::NodeSpec;
use proptest::prelude::*;

const NODES: u32 = 3;
const GPUS: u32 = 4;

/// One step of the sequence.
#[derive(Debug, Clone)]
enum Step {
    /// Node `n`'s agent (re)registers, saying its GPUs are in these conditions.
    Register(u32, Vec<GpuCondition>),
    /// Node `n`'s agent reports them (a failed GPU is an XID; healthy again, a
    /// clear); the verdict follows: drain-now on a failed GPU.
    Health(u32, Vec<GpuCondition>),
    /// The scheduling loop rechecks node `n`'s breaker hold, `dt` seconds on.
    Recheck(u32, u64),
    /// allotd restarts from a snapshot.
    Restart,
    /// allotd restarts by replaying its journal from the beginning.
    Replay,
}

fn condition() -> impl Strategy<Value = GpuCondition> {
    prop_oneof![
        4 => Just(GpuCondition::Healthy),
        1 => Just(GpuCondition::Degraded),
        2 => Just(GpuCondition::Failed),
    ]
}

fn step() -> impl Strategy<Value = Step> {
    let gpus = || proptest::collection::vec(condition(), GPUS as usize);
    prop_oneof![
        2 => (0..NODES, gpus()).prop_map(|(n, g)| Step::Register(n, g)),
        5 => (0..NODES, gpus()).prop_map(|(n, g)| Step::Health(n, g)),
        1 => (0..NODES, 0u64..400).prop_map(|(n, dt)| Step::Recheck(n, dt)),
        1 => Just(Step::Restart),
        1 => Just(Step::Replay),
    ]
}

fn seen(g: &[GpuCondition]) -> Vec<GpuSeen> {
    g.iter()
        .enumerate()
        .map(|(i, s)| GpuSeen {
            index: i as u32,
            state: *s,
            lease: String::new(),
        })
        .collect()
}

fn register(n: u32, g: &[GpuCondition]) -> Input {
    Input::Register {
        spec: NodeSpec {
            name: format!("n{n}"),
            cluster: "default".into(),
            gpus: GPUS,
            cpu: 64,
            memory_gb: 512,
            gpu_type: String::new(),
            features: Vec::new(),
        },
        gpu_uuids: (0..GPUS).map(|i| format!("GPU-{n}-{i}")).collect(),
        gpus: seen(g),
        running: Vec::new(),
        drains: Vec::new(),
        addr: String::new(),
        highest_workload: 0,
        highest_lease: 0,
        end_strays: true,
        fence_s: 0,
    }
}

fn health(n: u32, g: &[GpuCondition]) -> Input {
    let failed = g.contains(&GpuCondition::Failed);
    Input::Health {
        node: format!("n{n}"),
        verdict: if failed {
            Verdict::DrainNow
        } else {
            Verdict::Ok
        },
        gpus: seen(g),
        reasons: if failed {
            "xid 79".into()
        } else {
            String::new()
        },
        drains: Vec::new(),
    }
}

fn config() -> ServerConfig {
    let mut cfg = ServerConfig::parse(EXAMPLE, "example").expect("example");
    // One node of three may drain by health at a time: the rest are held.
    cfg.breaker = BreakerSection {
        max_share: 0.34,
        window: 300,
    };
    cfg
}

/// allotd's pool against the hosts' last word: every GPU of every node.
fn check(a: &Allocator, said: &BTreeMap<u32, Vec<GpuCondition>>, step: usize) {
    for (n, g) in said {
        let rec = &a.nodes()[&format!("n{n}")];
        let healthy = a.core.cluster().node(rec.id).healthy;
        for (i, s) in g.iter().enumerate() {
            let usable = *s != GpuCondition::Failed;
            assert_eq!(
                healthy & (1u64 << i) != 0,
                usable,
                "after step {step}: n{n} GPU {i}: the host says {s:?}, allotd's pool says otherwise (mask {healthy:#b}); seen {:?}",
                rec.seen
            );
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

    #[test]
    fn allotds_pool_holds_a_gpu_exactly_when_its_host_says_it_is_usable(
        steps in proptest::collection::vec(step(), 1..40)
    ) {
        let cfg = config();
        let mut a = Allocator::new(&cfg).expect("allocator");
        let mut journal: Vec<(Time, Input)> = Vec::new();
        let mut said: BTreeMap<u32, Vec<GpuCondition>> = BTreeMap::new();
        let mut at: Time = 1;
        for (k, s) in steps.iter().enumerate() {
            at += 1;
            let input = match s {
                Step::Register(n, g) => {
                    said.insert(*n, g.clone());
                    Some(register(*n, g))
                }
                // A node that never registered is unknown: its report is refused.
                Step::Health(n, g) if said.contains_key(n) => {
                    said.insert(*n, g.clone());
                    Some(health(*n, g))
                }
                Step::Health(..) => None,
                Step::Recheck(n, dt) => {
                    at += dt;
                    said.contains_key(n).then(|| Input::RecheckHeld { node: format!("n{n}") })
                }
                Step::Restart => {
                    a = Allocator::restore(&cfg, &a.snapshot(), at).expect("restores");
                    None
                }
                Step::Replay => {
                    let mut b = Allocator::new(&cfg).expect("allocator");
                    for (t, i) in &journal {
                        b.apply(*t, i).expect("replays");
                    }
                    a = b;
                    None
                }
            };
            if let Some(i) = input {
                a.apply(at, &i).expect("applies");
                journal.push((at, i));
            }
            check(&a, &said, k);
        }
    }
}
