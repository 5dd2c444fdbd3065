//! Speed of the core, printed as numbers (`cargo bench -p allot-sim`).
//!
//! 1. One scheduling pass at 1,024 nodes × 8 GPUs with 8,000 running leases (60%
//!    funded with an 8 h min runtime, started over the last 3.3 days so some are
//!    preemptible; 40% unfunded) and 20,000 pending workloads of mixed shapes
//!    (1–8 GPUs, gangs of 2–16 nodes, funded and unfunded, 45 projects): each sample
//!    clones the state, then times `schedule(now)` alone. Reported: median and p90 of
//!    the pass that follows 20,000 new submissions (it plans preemptions), and of a
//!    steady pass with nothing new.
//! 2. Deep queues with churn, at 1,024 nodes × 8 GPUs with 100,000 pending and at
//!    10,000 nodes × 8 GPUs with 200,000 pending: the cluster is filled with mixed
//!    shapes (1–8 GPUs, gangs of 2–4 whole nodes, funded and unfunded, 45 projects,
//!    three priority levels, some with time limits), then the queue is filled with the
//!    same mix, so nearly every pending workload could start somewhere once room
//!    frees. Before each timed pass 1% of the leases end (and revoked ones go), the
//!    clock moves 30 s and as many workloads are submitted as started last pass, so the
//!    queue stays deep and every pass has room to fill. Reported: the first pass after
//!    the queue filled, then median, p99 and max of the churn passes, and how many
//!    pending workloads each pass examined (`Decisions::examined`: mean and most),
//!    a digest of all the decisions (to compare builds of the core), and what
//!    explaining every pending workload costs against explaining one.
//! 3. The built-in `ai2` month (1,024 GPUs, 30 days, ~63k workloads), one policy run.
//! 4. `scale`: `scenarios/ai2-100k.toml`, the ai2 month at 12,500 nodes × 8 GPUs
//!    (100,000 GPUs, ~6.1M workloads), under allot's policy: wall time, passes,
//!    events, and what a pass and an event cost on average (`ALLOT_BENCH_DAYS` runs
//!    fewer days). Then the whole Philly trace (`scenarios/philly.toml`, 82k jobs over
//!    109 days) under allot's policy.

use allot_fairshare::time::HOUR;
use allot_fairshare::{
    Action, LeaseEnd, LeaseId, NodeSpec, OrgTree, Scheduler, Time, WorkloadSpec,
};
use allot_sim::{self as sim, rng::Rng, scenario::AI2, PolicyKind, Scenario, SimOptions};
use std::time::Instant;

/// The allocator allot-sim runs on, so the month figures are allot-sim's.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

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
            ..Default::default()
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
        ..Default::default()
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

/// A workload of the churn mix: mostly single-node work of 1–8 GPUs, some gangs.
fn mixed_spec(rng: &mut Rng, projects: &[String]) -> WorkloadSpec {
    let gang = rng.unit() < 0.05;
    let (gpus, nodes) = if gang {
        (8, [2, 3, 4][rng.pick(&[0.5, 0.3, 0.2])])
    } else {
        ([1, 2, 4, 8][rng.pick(&[0.4, 0.3, 0.2, 0.1])], 1)
    };
    let funded = rng.unit() < 0.5;
    WorkloadSpec {
        project: projects[rng.pick(&vec![1.0; projects.len()])].clone(),
        user: "bench".into(),
        class: "bench".into(),
        gpus_per_node: gpus,
        nodes,
        cpu_per_node: gpus * 12,
        mem_per_node_gb: gpus * 200,
        min_runtime: if funded {
            [HOUR, 4 * HOUR, 8 * HOUR][rng.pick(&[0.3, 0.4, 0.3])]
        } else {
            0
        },
        time_limit: [None, Some(2 * HOUR), Some(24 * HOUR)][rng.pick(&[0.6, 0.2, 0.2])],
        resumable: true,
        priority: [0, 5, 10][rng.pick(&[0.6, 0.3, 0.1])],
        no_requeue: false,
        ..Default::default()
    }
}

/// A full cluster of `nodes` × 8 GPUs running the churn mix, with `pending` more of it
/// queued at the returned time.
fn deep_state(nodes: usize, pending: usize) -> (Scheduler, Time, Rng, Vec<String>) {
    let sc = Scenario::parse(AI2, "ai2").expect("ai2 parses");
    let tree = OrgTree::new(&sc.tree_specs(&[]).expect("tree")).expect("tree");
    let projects: Vec<String> = tree
        .projects()
        .iter()
        .map(|p| tree.group(*p).name.clone())
        .collect();
    let specs: Vec<NodeSpec> = (0..nodes)
        .map(|i| NodeSpec {
            name: format!("n{i:05}"),
            cluster: "big".into(),
            gpus: 8,
            cpu: 112,
            memory_gb: 2048,
            ..Default::default()
        })
        .collect();
    let mut s = Scheduler::new(sc.policy.clone(), tree, specs).expect("scheduler");
    let mut rng = Rng::new(7);
    // Fill over 20 hours: each hour a twentieth of the GPUs' worth of work arrives.
    let per_hour = nodes * 8 / 20 / 3;
    for k in 0..20u64 {
        for _ in 0..per_hour {
            let spec = mixed_spec(&mut rng, &projects);
            s.submit(k * HOUR, spec).expect("fits");
        }
        s.schedule(k * HOUR);
    }
    let now = 20 * HOUR;
    while s.pending_len() < pending {
        let spec = mixed_spec(&mut rng, &projects);
        s.submit(now, spec).expect("fits");
    }
    (s, now, rng, projects)
}

/// Ends 1% of the leases (and every revoked one that came due), as a shell would.
fn churn(s: &mut Scheduler, now: Time, rng: &mut Rng, revoked: &mut Vec<(Time, LeaseId)>) {
    let due: Vec<LeaseId> = revoked.iter().filter(|r| r.0 <= now).map(|r| r.1).collect();
    revoked.retain(|r| r.0 > now);
    for lid in due {
        let _ = s.lease_ended(now, lid, LeaseEnd::Revoked);
    }
    let ids: Vec<LeaseId> = s
        .leases()
        .filter(|l| l.revoke.is_none())
        .map(|l| l.id)
        .collect();
    let ends = ids.len() / 100;
    for _ in 0..ends {
        let lid = ids[(rng.next_u64() % ids.len() as u64) as usize];
        let _ = s.lease_ended(now, lid, LeaseEnd::Completed);
    }
}

/// Times `passes` churn passes at `nodes` × 8 GPUs with `pending` queued.
fn deep(nodes: usize, pending: usize, passes: usize) {
    let t0 = Instant::now();
    let (mut s, mut now, mut rng, projects) = deep_state(nodes, pending);
    println!(
        "deep queue: {nodes} nodes x 8 GPUs, {} running leases, {} pending (built in {:.1} s)",
        s.leases().count(),
        s.pending_len(),
        t0.elapsed().as_secs_f64()
    );
    let mut revoked: Vec<(Time, LeaseId)> = Vec::new();
    let note = |d: &allot_fairshare::Decisions, revoked: &mut Vec<(Time, LeaseId)>| {
        let mut starts = 0;
        for a in &d.actions {
            match a {
                Action::Start { .. } => starts += 1,
                Action::Revoke {
                    lease, not_before, ..
                } => revoked.push((*not_before, *lease)),
                _ => {}
            }
        }
        starts
    };
    let t = Instant::now();
    let d = s.schedule(now);
    let first = t.elapsed().as_secs_f64() * 1e3;
    let mut started = note(&d, &mut revoked);
    println!(
        "  first pass after the queue filled: {first:.2} ms ({} examined, {} actions)",
        d.examined,
        d.actions.len()
    );
    let mut digest = Digest::default();
    digest.add(&d);
    let mut times = Vec::with_capacity(passes);
    let (mut examined, mut most, mut actions) = (0u64, 0u32, 0usize);
    for _ in 0..passes {
        now += 30;
        churn(&mut s, now, &mut rng, &mut revoked);
        for _ in 0..started {
            let spec = mixed_spec(&mut rng, &projects);
            s.submit(now, spec).expect("fits");
        }
        let t = Instant::now();
        let d = s.schedule(now);
        times.push(t.elapsed().as_secs_f64() * 1e3);
        started = note(&d, &mut revoked);
        digest.add(&d);
        examined += u64::from(d.examined);
        most = most.max(d.examined);
        actions += d.actions.len();
    }
    let max = times.iter().copied().fold(0.0, f64::max);
    println!(
        "  {passes} churn passes (1% of leases end before each): median {:.2} ms, p99 {:.2} ms, max {max:.2} ms; \
         examined {:.0} per pass on average, at most {most}; {:.0} actions per pass; {} pending at the end",
        percentile(&mut times, 0.5),
        percentile(&mut times, 0.99),
        examined as f64 / passes as f64,
        actions as f64 / passes as f64,
        s.pending_len()
    );
    println!(
        "  decisions digest {:016x} (equal digests: the same decisions, byte for byte)",
        digest.0
    );
    // What a shell pays to explain every pending workload (allotd does after each
    // pass), against one workload's explanation.
    let t = Instant::now();
    let all = s.explain(now);
    let whole = t.elapsed().as_secs_f64() * 1e3;
    let t = Instant::now();
    for e in all.iter().step_by(all.len() / 1000 + 1) {
        s.explain_workload(now, e.workload);
    }
    let one = t.elapsed().as_secs_f64() * 1e3 / (all.len() / (all.len() / 1000 + 1)) as f64;
    println!(
        "  explain: every pending workload ({}) {whole:.1} ms; one workload {:.3} ms",
        all.len(),
        one
    );
}

/// FNV-1a over every pass's decisions as JSON: compares two builds of the core.
struct Digest(u64);

impl Default for Digest {
    fn default() -> Self {
        Digest(0xcbf2_9ce4_8422_2325)
    }
}

impl Digest {
    fn add(&mut self, d: &allot_fairshare::Decisions) {
        let json = serde_json::to_vec(d).expect("decisions serialize");
        for b in json {
            self.0 = (self.0 ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
        }
    }
}

fn main() {
    let only = std::env::args().skip(1).find(|a| !a.starts_with('-'));
    let want = |name: &str| only.as_deref().is_none_or(|o| name.contains(o));
    if want("deep-1k") {
        deep(1024, 100_000, 200);
    }
    if want("deep-10k") {
        deep(10_000, 200_000, 100);
    }
    if want("cycle") {
        cycle();
    }
    if want("ai2") {
        ai2();
    }
    if want("scale") {
        scale();
    }
    if want("parse") {
        parse();
    }
}

/// Reading the whole Philly trace, parsing alone: the speed of reading the file.
fn parse() {
    let (sc, path) = shipped("philly.toml");
    let trace_path = sc.trace_path(&path).expect("philly.toml names its trace");
    let text = std::fs::read_to_string(&trace_path).expect("the trace is shipped");
    let file = trace_path.display().to_string();
    let mut times: Vec<f64> = (0..7)
        .map(|_| {
            let t = Instant::now();
            let tr = allot_sim::trace::parse(&text, &file, &sc).expect("the trace parses");
            std::hint::black_box(tr.jobs.len());
            t.elapsed().as_secs_f64()
        })
        .collect();
    times.sort_by(f64::total_cmp);
    let rows = text.lines().count();
    let mb = text.len() as f64 / 1e6;
    println!(
        "parse: the Philly trace ({rows} lines, {mb:.1} MB): median {:.1} ms, min {:.1} ms ({:.0} MB/s)",
        times[3] * 1e3,
        times[0] * 1e3,
        mb / times[3]
    );
}

/// A scenario shipped under `scenarios/`, with the path its `[trace]` is read from.
fn shipped(file: &str) -> (Scenario, std::path::PathBuf) {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../scenarios")
        .join(file);
    let text = std::fs::read_to_string(&path).expect("the scenario is shipped");
    (Scenario::parse(&text, file).expect("it parses"), path)
}

/// The 100,000-GPU month and the whole Philly trace (figure 4).
fn scale() {
    let (mut sc, _) = shipped("ai2-100k.toml");
    if let Some(days) = std::env::var("ALLOT_BENCH_DAYS")
        .ok()
        .and_then(|d| d.parse().ok())
    {
        sc.days = days;
    }
    let opts = SimOptions {
        policy: PolicyKind::FairShare,
        seed: sc.seed,
        timeline: false,
    };
    let t = Instant::now();
    let jobs = sc.generate(sc.seed);
    let generated = t.elapsed().as_secs_f64();
    let r = sim::run(&sc, jobs, &[], &opts).expect("runs");
    let wall = t.elapsed().as_secs_f64();
    println!(
        "scale: {} days of {} GPUs (pass at most every {} s): {wall:.1} s wall ({generated:.1} s \
         generating), {} workloads, {} events, {} passes; {:.2} ms of run per pass, \
         {:.1} us per event; occupancy {:.3}, mean ratio {:.3}",
        sc.days,
        r.gpus,
        sc.pass_interval,
        r.submitted,
        r.events,
        r.passes,
        (wall - generated) * 1e3 / r.passes.max(1) as f64,
        (wall - generated) * 1e6 / r.events.max(1) as f64,
        r.occupancy,
        r.fairness.mean_ratio
    );
    let (sc, path) = shipped("philly.toml");
    let trace_path = sc.trace_path(&path).expect("philly.toml names its trace");
    let t = Instant::now();
    let text = std::fs::read_to_string(&trace_path).expect("the trace is shipped");
    let tr = allot_sim::trace::parse(&text, &trace_path.display().to_string(), &sc)
        .expect("the trace parses");
    let r = sim::run(&sc, tr.jobs, &tr.groups, &opts).expect("runs");
    println!(
        "philly: the whole trace ({} jobs, {} days) under fairshare: {:.2} s wall ({} events, {} passes)",
        r.submitted,
        sc.days,
        t.elapsed().as_secs_f64(),
        r.events,
        r.passes
    );
}

/// The pass at 20,000 pending (figure 1).
fn cycle() {
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
}

/// The ai2 month under both policies (figure 3).
fn ai2() {
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
