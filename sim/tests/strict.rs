//! The Helios study's baselines: strict FIFO and SJF with head-of-line blocking and
//! consolidated placement, the Helios trace reader, and the committed Philly
//! per-VC scenario against the figures of the study's own simulator.

use allot_sim::helios;
use allot_sim::helios::Job;
use allot_sim::strict::{self, place, simulate, Order};
use allot_sim::Scenario;

fn job(submit: u64, duration: u64, gpus: u32) -> Job {
    Job {
        submit,
        duration,
        gpus,
        line: 0,
    }
}

fn starts(nodes: u32, jobs: &[Job], order: Order) -> Vec<u64> {
    simulate(nodes, 8, jobs, order).expect("runs")
}

#[test]
fn a_blocked_head_blocks_a_small_job_that_would_fit() {
    // 6 of 8 GPUs busy until 100; a 4-GPU job heads the queue, a 1-GPU job behind
    // it would fit the 2 free GPUs but waits: no backfill.
    let jobs = [job(0, 100, 6), job(1, 10, 4), job(2, 10, 1)];
    // Under SJF too: equal durations keep arrival order, so the 4-GPU job heads.
    for order in [Order::Fifo, Order::Sjf] {
        assert_eq!(starts(1, &jobs, order), vec![0, 100, 100], "{order:?}");
    }
    // Shorter behind a blocked head: SJF puts it first, then it fits at once.
    let jobs = [job(0, 100, 6), job(1, 50, 4), job(2, 10, 1)];
    assert_eq!(starts(1, &jobs, Order::Fifo), vec![0, 100, 100]);
    assert_eq!(starts(1, &jobs, Order::Sjf), vec![0, 100, 2]);
}

#[test]
fn sjf_orders_by_real_duration_and_ties_by_arrival() {
    // The node is full until 10; then one 8-GPU job at a time.
    let jobs = [
        job(0, 10, 8),
        job(1, 50, 8),
        job(2, 20, 8),
        job(3, 20, 8),
        job(3, 5, 8),
        job(3, 20, 8),
    ];
    // 5 s first, then the three 20 s jobs in arrival order (submit, then file), then 50.
    assert_eq!(starts(1, &jobs, Order::Sjf), vec![0, 75, 15, 35, 10, 55]);
    assert_eq!(starts(1, &jobs, Order::Fifo), vec![0, 10, 60, 80, 100, 105]);
}

#[test]
fn ends_free_gpus_before_arrivals_and_arrivals_join_before_the_pass() {
    // Ends at 10 free the node for a job arriving at 10.
    assert_eq!(
        starts(1, &[job(0, 10, 8), job(10, 5, 8)], Order::Fifo),
        vec![0, 10]
    );
    // At 10: j0 ends, j2 arrives, then one pass. FIFO: j1 (waiting since 5) takes
    // the node and blocks j2. SJF: j2 (1 s) is first, and j1 no longer fits.
    let jobs = [job(0, 10, 8), job(5, 10, 8), job(10, 1, 1)];
    assert_eq!(starts(1, &jobs, Order::Fifo), vec![0, 10, 20]);
    assert_eq!(starts(1, &jobs, Order::Sjf), vec![0, 11, 10]);
}

#[test]
fn consolidated_placement_follows_the_helios_placer() {
    // Up to a node: best fit, ties to the lower index, never split.
    assert_eq!(place(&[8, 3, 5, 3], 8, 3), Some(vec![(1, 3)]));
    assert_eq!(place(&[8, 3, 5, 3], 8, 4), Some(vec![(2, 4)]));
    assert_eq!(place(&[8, 3, 5, 3], 8, 6), Some(vec![(0, 6)]));
    assert_eq!(
        place(&[4, 4, 4, 0], 8, 5),
        None,
        "12 free, but no node has 5"
    );
    // Multiples of 8: whole free nodes, lowest index first.
    assert_eq!(place(&[8, 7, 7, 8, 8], 8, 16), Some(vec![(0, 8), (3, 8)]));
    assert_eq!(place(&[8, 7, 7, 7], 8, 16), None, "29 free, one whole node");
    // The remainder: the next whole free node if any...
    assert_eq!(place(&[3, 8, 5, 8, 8], 8, 12), Some(vec![(1, 8), (3, 4)]));
    // ...else the partly used node with the most free GPUs (worst fit), lowest index
    // on ties.
    assert_eq!(place(&[8, 2, 6, 3], 8, 10), Some(vec![(0, 8), (2, 2)]));
    assert_eq!(place(&[6, 8, 6, 3], 8, 12), Some(vec![(1, 8), (0, 4)]));
    assert_eq!(
        place(&[8, 3, 2, 0], 8, 12),
        None,
        "no node takes the 4 left"
    );
    assert_eq!(place(&[7, 7, 7], 8, 12), None, "no whole free node");
    // Fewer free GPUs than asked: no.
    assert_eq!(place(&[8, 1], 8, 10), None);
}

#[test]
fn a_placed_gang_holds_and_frees_the_same_gpus() {
    // 2 nodes: a 12-GPU job (8 + 4) then a 4-GPU job fits beside it; a 16-GPU job
    // waits until both end.
    let jobs = [
        job(0, 100, 12),
        job(1, 50, 4),
        job(2, 10, 16),
        job(3, 10, 1),
    ];
    assert_eq!(starts(2, &jobs, Order::Fifo), vec![0, 1, 100, 110]);
}

#[test]
fn jobs_that_cannot_run_are_refused_not_hung() {
    assert!(simulate(1, 8, &[job(0, 10, 9)], Order::Fifo)
        .unwrap_err()
        .contains("9 GPUs on a cluster of 8"));
    assert!(simulate(1, 8, &[job(0, 0, 1)], Order::Sjf)
        .unwrap_err()
        .contains("duration of 0"));
    assert!(simulate(1, 8, &[job(5, 1, 1), job(1, 1, 1)], Order::Fifo)
        .unwrap_err()
        .contains("submitted before"));
}

const SCENARIO: &str = r#"
name = "tiny"
[trace]
path = "t.csv"
format = "helios"
from = "2017-10-01 00:00:00"
to = "2017-10-31 23:59:59"
clusters_separately = true
[[clusters]]
name = "a"
nodes = 1
gpus_per_node = 8
[[clusters]]
name = "b"
nodes = 2
gpus_per_node = 8
"#;

fn tiny() -> Scenario {
    Scenario::parse(SCENARIO, "tiny.toml").expect("parses")
}

#[test]
fn rows_that_cannot_run_are_dropped_and_counted() {
    let csv = "timestamp,duration,num_gpus,gpu_time,cluster\n\
        2017-10-01 00:00:10,100.0,8,800.0,a\n\
        2017-10-01 00:00:11,50.0,1,50.0,a\n\
        2017-10-01 00:00:12,10.0,16,160.0,b\n\
        2017-10-01 00:00:13,10.0,1,10.0,zz\n\
        2017-10-01 00:00:14,10.0,9,90.0,a\n\
        2017-10-01 00:00:15,0.0,1,0.0,a\n\
        2017-10-01 00:00:16,-3.0,1,0.0,b\n\
        2017-10-01 00:00:16,0.4,1,0.0,b\n\
        2017-10-01 00:00:17,10.0,0,0.0,a\n\
        2017-09-30 23:59:59,10.0,1,10.0,a\n\
        2017-11-01 00:00:00,10.0,1,10.0,b\n\
        2017-10-01 00:00:20,7.9,2,15.8,b\n\
        \n";
    let t = helios::parse(csv, "t.csv", &tiny()).expect("reads");
    assert_eq!(t.dropped.no_gpus, 1);
    assert_eq!(t.dropped.unknown_cluster, 1);
    assert_eq!(t.dropped.before_window, 1);
    assert_eq!(t.dropped.after_window, 1);
    assert_eq!(t.dropped.no_duration, 3);
    assert_eq!(t.dropped.too_many_gpus, 1);
    assert_eq!(t.origin_text(), "2017-10-01 00:00:10 UTC");
    let a = &t.clusters[0];
    assert_eq!(
        a.jobs,
        vec![
            Job {
                submit: 0,
                duration: 100,
                gpus: 8,
                line: 2
            },
            Job {
                submit: 1,
                duration: 50,
                gpus: 1,
                line: 3
            },
        ]
    );
    // 7.9 s is cut to 7 s, as the study's input step does.
    assert_eq!(t.clusters[1].jobs[1].duration, 7);
    let r = strict::run("tiny", &t, Order::Fifo).expect("runs");
    assert_eq!(r.clusters[0].figures.jobs, 2);
    assert_eq!(r.clusters[0].figures.avg_queue_s, 49.5); // (0 + 99) / 2
    assert_eq!(r.overall.jobs, 4);
    assert!(r.table().contains("8 rows: 1 no GPUs, 1 unknown cluster"));
}

#[test]
fn bad_lines_name_the_file_line_and_field() {
    let sc = tiny();
    let head = "timestamp,duration,num_gpus,gpu_time,cluster\n2017-10-01 00:00:10,1,1,1,a\n";
    for (row, want) in [
        (
            "2017-10-32 00:00:00,1,1,1,a",
            "t.csv:3: timestamp: \"2017-10-32 00:00:00\" is not a time",
        ),
        (
            "2017-10-01 00:00:00,ten,1,1,a",
            "t.csv:3: duration: \"ten\" is not a number",
        ),
        (
            "2017-10-01 00:00:00,1,1.5,1,a",
            "t.csv:3: num_gpus: \"1.5\" is not a whole number",
        ),
        ("2017-10-01 00:00:00,1,1,1,", "t.csv:3: cluster: is empty"),
        (
            "2017-10-01 00:00:00,1,1,a",
            "t.csv:3: row: has 4 cells, the header has 5",
        ),
    ] {
        let e = helios::parse(&format!("{head}{row}\n"), "t.csv", &sc)
            .unwrap_err()
            .to_string();
        assert!(e.starts_with(want), "{e}");
    }
    let e = helios::parse("timestamp,duration,cluster\n", "t.csv", &sc)
        .unwrap_err()
        .to_string();
    assert_eq!(
        e,
        "t.csv:1: num_gpus: required column is missing from the header"
    );
    let e = helios::parse("timestamp,duration,num_gpus,cluster,colour\n", "t.csv", &sc)
        .unwrap_err()
        .to_string();
    assert!(e.starts_with("t.csv:1: colour: unknown column"), "{e}");
    // The artifact's cluster_log.csv names are accepted.
    let t = helios::parse(
        "user,vc,jobname,gpu_num,state,submit_time,duration\nu,a,j,2,Pass,2017-10-02 00:00:00,60\n",
        "log.csv",
        &sc,
    )
    .expect("reads");
    assert_eq!(t.clusters[0].jobs.len(), 1);
}

#[test]
fn scenario_trace_tables_are_checked() {
    let e = Scenario::parse(
        &SCENARIO.replace("clusters_separately = true", ""),
        "s.toml",
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("trace.clusters_separately"), "{e}");
    let e = Scenario::parse(
        &SCENARIO.replace("2017-10-31 23:59:59", "2017-10-31"),
        "s.toml",
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.starts_with("s.toml:7: trace.to: \"2017-10-31\" is not a time"),
        "{e}"
    );
    let e = Scenario::parse(
        &SCENARIO.replace("2017-10-31 23:59:59", "2017-09-01 00:00:00"),
        "s.toml",
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("trace.to: is before trace.from"), "{e}");
    let e = Scenario::parse(&SCENARIO.replace("name = \"b\"", "name = \"a\""), "s.toml")
        .unwrap_err()
        .to_string();
    assert!(e.contains("names two clusters"), "{e}");
    // An allot-format trace: no window, no separate clusters; its path is resolved
    // against the scenario's directory.
    let allot = SCENARIO
        .replace("format = \"helios\"", "format = \"allot\"")
        .replace("clusters_separately = true", "");
    let e = Scenario::parse(&allot, "s.toml").unwrap_err().to_string();
    assert!(
        e.contains("trace.from: a submit window applies to format = \"helios\" only"),
        "{e}"
    );
    let allot = allot
        .replace("from = \"2017-10-01 00:00:00\"", "")
        .replace("to = \"2017-10-31 23:59:59\"", "");
    let sc = Scenario::parse(&allot, "s.toml").expect("parses");
    assert_eq!(
        sc.trace_path(std::path::Path::new("scenarios/s.toml")),
        Some(std::path::PathBuf::from("scenarios/t.csv"))
    );
}

/// The Helios artifact's simulator (HeliosArtifact bdaae109, `framework/QSSF
/// Service`, consolidate placer, TZ=UTC) on the committed input: average queueing
/// delay per VC, FIFO then SJF.
const HELIOS: [(&str, f64, f64); 11] = [
    ("6214e9", 5.757, 5.757),
    ("7f04ca", 0.0, 0.0),
    ("11cb48", 242.685, 189.386),
    ("b436b2", 22.761, 21.559),
    ("ee9e8c", 0.0, 0.0),
    ("e13805", 0.0, 0.0),
    ("6c71a0", 0.501, 0.501),
    ("2869ce", 11343.368, 5144.505),
    ("ed69ec", 4.076, 4.076),
    ("103959", 246.208, 44.367),
    ("0e4a51", 0.0, 0.0),
];
const HELIOS_ALL: (f64, f64) = (104.906, 62.746);

#[test]
fn philly_per_vc_lands_within_ten_percent_of_the_helios_simulator() {
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/../scenarios");
    let file = format!("{root}/philly-vc.toml");
    let text = std::fs::read_to_string(&file).expect("the scenario is committed");
    let sc = Scenario::parse(&text, &file).expect("parses");
    // One cluster per line of the quota file, 8 GPUs a node.
    let quota = std::fs::read_to_string(format!("{root}/philly/vc_quota_nodes.csv"))
        .expect("the quota file is committed");
    let want: Vec<(String, u32)> = quota
        .lines()
        .skip(1)
        .filter_map(|l| l.split_once(','))
        .map(|(vc, n)| (vc.to_string(), n.trim().parse().expect("a number")))
        .collect();
    let got: Vec<(String, u32)> = sc
        .clusters
        .iter()
        .map(|c| (c.name.clone(), c.nodes))
        .collect();
    assert_eq!(got, want);
    assert!(sc.clusters.iter().all(|c| c.gpus_per_node == 8));
    let path = sc.trace_path(std::path::Path::new(&file)).expect("a trace");
    let csv = std::fs::read_to_string(&path).expect("the trace is committed");
    let t = helios::parse(&csv, "philly_raw.csv", &sc).expect("reads");
    assert_eq!(t.origin_text(), "2017-10-01 00:00:45 UTC");
    assert_eq!(t.dropped.unknown_cluster, 18);
    assert_eq!(t.dropped.before_window, 5_649);
    assert_eq!(t.dropped.after_window, 8_077);
    assert_eq!(t.dropped.total(), 82_247 - 68_503);
    let within = |got: f64, want: f64| (got - want).abs() <= 0.10 * want;
    for (order, all) in [(Order::Fifo, HELIOS_ALL.0), (Order::Sjf, HELIOS_ALL.1)] {
        let r = strict::run(&sc.name, &t, order).expect("runs");
        assert_eq!(r.overall.jobs, 68_503);
        assert!(
            within(r.overall.avg_queue_s, all),
            "{order:?} overall {} vs {all}",
            r.overall.avg_queue_s
        );
        for (c, (vc, fifo, sjf)) in r.clusters.iter().zip(HELIOS) {
            assert_eq!(c.name, vc);
            let want = if order == Order::Fifo { fifo } else { sjf };
            assert!(
                within(c.figures.avg_queue_s, want),
                "{order:?} {vc}: {} vs {want}",
                c.figures.avg_queue_s
            );
        }
        // SJF ties never matter here: the same start for every job, so the same
        // means. FIFO ties in file order, not pandas' unstable order: 104.611.
        if order == Order::Sjf {
            assert_eq!(r.overall.avg_queue_s, all);
        } else {
            assert_eq!(r.overall.avg_queue_s, 104.611);
        }
    }
}
