//! Speed of the core, printed as numbers (`cargo bench -p allot-sim`).
//!
//! 1. One scheduling pass at 1,024 nodes × 8 GPUs with 8,000 running leases (60%
//!    funded with an 8 h min runtime, started over the last 3.3 days so some are
//!    preemptible; 40% unfunded) and 20,000 pending workloads of mixed shapes
//!    (1–8 GPUs, gangs of 2–16 nodes, funded and unfunded, 45 projects): each sample
//!    clones the state, then times `schedule(now)` alone. Reported: median and p90 of
//!    the pass that follows 20,000 new submissions (it plans preemptions), and of a
//!    steady pass with nothing new.
//! 2. The built-in `ai2` month (1,024 GPUs, 30 days, ~63k workloads), one policy run.

use allot_fairshare::time::HOUR;
use allot_fairshare::{NodeSpec, OrgTree, Scheduler, WorkloadSpec};
use allot_sim::{self as sim, rng::Rng, scenario::AI2, PolicyKind, Scenario, SimOptions};
use std::time::Instant;

fn percentile(v: &mut [f64], p: f64) -> f64 {
    allot_common::stats::percentile_of(v, p).unwrap_or(0.0)
}

fn big_state() -> (Scheduler, u64) {
    let sc = Scenario::parse(AI2, "ai2").expect("ai2 parses");
    let tree = OrgTree::new(&sc.tree_specs(&[]).expect("tree")).expect("tree");
    let projects: Vec<String> = tree
        .projects()
        .iter()
        .map(|p| tree.group(*p).name.clone())
        .collect();
    let nodes: Vec<NodeSpec> = (0..1024)
        .map(|i| NodeSpec {
            name: format!("n{i:04}"),
            cluster: "big".into(),
            gpus: 8,
            cpu: 112,
            memory_gb: 2048,
        })
        .collect();
    let mut s = Scheduler::new(sc.policy.clone(), tree, nodes).expect("scheduler");
    let mut rng = Rng::new(42);
    let spec = |rng: &mut Rng, gpus: u32, nodes: u32, funded: bool| WorkloadSpec {
        project: projects[rng.pick(&vec![1.0; projects.len()])].clone(),
        user: "bench".into(),
        class: "bench".into(),
        gpus_per_node: gpus,
        nodes,
        cpu_per_node: gpus * 12,
        mem_per_node_gb: gpus * 200,
        min_runtime: if funded { 8 * HOUR } else { 0 },
        time_limit: None,
        resumable: true,
        priority: [0, 5, 10][rng.pick(&[0.6, 0.3, 0.1])],
        no_requeue: false,
    };
    // 8,000 one-GPU leases, 100 per hour over 80 hours.
    for k in 0..80u64 {
        let t = k * HOUR;
        for _ in 0..100 {
            let funded = rng.unit() < 0.6;
            s.submit(t, spec(&mut rng, 1, 1, funded)).expect("fits");
        }
        s.schedule(t);
    }
    let now = 80 * HOUR;
    assert_eq!(s.leases().count(), 8_000);
    for _ in 0..20_000 {
        let gang = rng.unit() < 0.1;
        let (gpus, nodes) = if gang {
            (8, [2, 4, 8, 16][rng.pick(&[0.4, 0.3, 0.2, 0.1])])
        } else {
            ([1, 2, 4, 8][rng.pick(&[0.4, 0.3, 0.2, 0.1])], 1)
        };
        let funded = rng.unit() < 0.5;
        s.submit(now, spec(&mut rng, gpus, nodes, funded))
            .expect("fits");
    }
    (s, now)
}

fn time_pass(base: &Scheduler, now: u64, samples: usize) -> (Vec<f64>, u32, usize) {
    let mut out = Vec::with_capacity(samples);
    let (mut examined, mut actions) = (0, 0);
    for _ in 0..samples {
        let mut s = base.clone();
        let t = Instant::now();
        let d = s.schedule(now);
        out.push(t.elapsed().as_secs_f64() * 1e3);
        examined = d.examined;
        actions = d.actions.len();
    }
    (out, examined, actions)
}

fn main() {
    let (s, now) = big_state();
    println!(
        "cycle: 1024 nodes x 8 GPUs, {} running leases, {} pending",
        s.leases().count(),
        s.pending_len()
    );
    let (mut first, examined, actions) = time_pass(&s, now, 30);
    println!(
        "  pass after 20k submissions: median {:.2} ms, p90 {:.2} ms ({} examined, {} actions)",
        percentile(&mut first, 0.5),
        percentile(&mut first, 0.9),
        examined,
        actions
    );
    let mut steady_state = s.clone();
    steady_state.schedule(now);
    let (mut steady, examined, actions) = time_pass(&steady_state, now + 1, 30);
    println!(
        "  steady pass (nothing new):  median {:.2} ms, p90 {:.2} ms ({} examined, {} actions)",
        percentile(&mut steady, 0.5),
        percentile(&mut steady, 0.9),
        examined,
        actions
    );
    let sc = Scenario::parse(AI2, "ai2").expect("ai2 parses");
    for policy in [PolicyKind::FairShare, PolicyKind::Priority] {
        let jobs = sc.generate(sc.seed);
        let opts = SimOptions {
            policy,
            seed: sc.seed,
            timeline: false,
        };
        let t = Instant::now();
        let r = sim::run(&sc, jobs, &[], &opts).expect("runs");
        println!(
            "ai2 month, {}: {:.2} s wall ({} workloads, {} events, {} passes)",
            policy.name(),
            t.elapsed().as_secs_f64(),
            r.submitted,
            r.events,
            r.passes
        );
    }
}
