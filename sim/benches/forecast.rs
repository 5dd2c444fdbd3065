//! What a start-time forecast ([`Scheduler::forecast`]) costs at the size allotd
//! asks it every ~30 s (`cargo bench -p allot-sim --bench forecast`): 1,000 nodes ×
//! 8 GPUs, full (mixed shapes, funded and unfunded, a third of them with a time
//! limit, started over the last two days), and 5,000 pending (topped up to) workloads of the same
//! mix (5% gangs of 2–4 nodes) over the ai2 tree's projects. Reported: median and
//! most of 5 forecasts of every pending workload, and of one workload's.

use allot_fairshare::time::HOUR;
use allot_fairshare::{
    ForecastOptions, LeaseEnd, LeaseId, NodeSpec, OrgTree, Scheduler, WorkloadSpec,
};
use allot_sim::{rng::Rng, scenario::AI2, Scenario};
use std::time::Instant;

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn spec(rng: &mut Rng, projects: &[String], gang_share: f64) -> WorkloadSpec {
    let gang = rng.unit() < gang_share;
    let (gpus, nodes) = if gang {
        (8, [2, 3, 4][rng.pick(&[0.5, 0.3, 0.2])])
    } else {
        ([1, 2, 4, 8][rng.pick(&[0.4, 0.3, 0.2, 0.1])], 1)
    };
    let funded = rng.unit() < 0.5;
    let time_limit = [None, Some(4 * HOUR), Some(24 * HOUR)][rng.pick(&[0.67, 0.17, 0.16])];
    WorkloadSpec {
        project: projects[rng.pick(&vec![1.0; projects.len()])].clone(),
        user: "bench".into(),
        class: ["batch", "training"][usize::from(funded)].into(),
        gpus_per_node: gpus,
        nodes,
        cpu_per_node: gpus * 12,
        mem_per_node_gb: gpus * 200,
        min_runtime: if funded {
            HOUR.min(time_limit.unwrap_or(HOUR))
        } else {
            0
        },
        time_limit,
        resumable: true,
        no_requeue: false,
        ..Default::default()
    }
}

fn state() -> (Scheduler, u64) {
    let sc = Scenario::parse(AI2, "ai2").expect("ai2 parses");
    let tree = OrgTree::new(&sc.tree_specs(&[]).expect("tree")).expect("tree");
    let projects: Vec<String> = tree
        .projects()
        .iter()
        .map(|p| tree.group(*p).name.clone())
        .collect();
    let nodes: Vec<NodeSpec> = (0..1000)
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
    let mut rng = Rng::new(7);
    // Fill the cluster, then over two days end 1/24 of the leases an hour and submit
    // as many, so leases started at many times.
    for _ in 0..4_000 {
        s.submit(0, spec(&mut rng, &projects, 0.0)).expect("fits");
    }
    s.schedule(0);
    for h in 1..48u64 {
        let ids: Vec<LeaseId> = s.leases().map(|l| l.id).collect();
        for (i, id) in ids.iter().enumerate() {
            if i % 24 == (h % 24) as usize {
                s.lease_ended(h * HOUR, *id, LeaseEnd::Completed)
                    .expect("lease");
                s.submit(h * HOUR, spec(&mut rng, &projects, 0.0))
                    .expect("fits");
            }
        }
        s.schedule(h * HOUR);
    }
    let now = 48 * HOUR;
    let pending = s.pending_len();
    for _ in 0..5_000usize.saturating_sub(pending) {
        s.submit(now, spec(&mut rng, &projects, 0.05))
            .expect("fits");
    }
    s.schedule(now);
    (s, now + 30)
}

fn main() {
    let (s, now) = state();
    let pending = s.pending_len();
    let running = s.leases().count();
    let opts = ForecastOptions::default();
    let mut all = Vec::new();
    let mut out = None;
    for _ in 0..5 {
        let t = Instant::now();
        out = Some(s.forecast(now, &opts));
        all.push(t.elapsed().as_secs_f64());
    }
    let f = out.unwrap_or_default();
    let within = f.values().filter(|x| x.p90.is_some()).count();
    let one = f.keys().last().copied();
    let mut single = Vec::new();
    for _ in 0..5 {
        let t = Instant::now();
        let _ = s.forecast_workloads(now, one.as_slice(), &opts);
        single.push(t.elapsed().as_secs_f64());
    }
    all.sort_by(f64::total_cmp);
    single.sort_by(f64::total_cmp);
    println!(
        "forecast, 1,000 × 8 GPUs, {running} leases, {pending} pending: every workload median {:.0} ms, most {:.0} ms ({within} of {} within 14 d); the last-queued one alone median {:.0} ms",
        all[2] * 1e3,
        all[4] * 1e3,
        f.len(),
        single[2] * 1e3,
    );
}
