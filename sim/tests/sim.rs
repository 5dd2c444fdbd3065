//! The simulator: the ai2 month meets the design's targets and the baseline shows
//! what it fixes; runs are deterministic; bad scenarios and traces are named.

use allot_sim::{self as sim, scenario::AI2, trace, PolicyKind, Report, Scenario, SimOptions};

fn run(sc: &Scenario, policy: PolicyKind) -> Report {
    let jobs = sc.generate(sc.seed);
    let opts = SimOptions {
        policy,
        seed: sc.seed,
        timeline: false,
    };
    sim::run(sc, jobs, &[], &opts).expect("runs")
}

fn ai2() -> Scenario {
    Scenario::parse(AI2, "ai2").expect("the built-in scenario parses")
}

#[test]
fn ai2_meets_the_targets_and_beats_the_baseline() {
    let sc = ai2();
    let fair = run(&sc, PolicyKind::FairShare);
    assert!(
        fair.fairness.mean_ratio >= 0.95,
        "mean {}",
        fair.fairness.mean_ratio
    );
    assert!(
        fair.fairness.min_ratio >= 0.90,
        "worst {}",
        fair.fairness.min_ratio
    );
    assert!(fair.occupancy >= 0.95, "occupancy {}", fair.occupancy);
    assert!(
        fair.wait_s["debug"].p90 <= 300,
        "debug p90 {}",
        fair.wait_s["debug"].p90
    );
    assert_eq!(fair.teams.len(), 15);
    let base = run(&sc, PolicyKind::Priority);
    assert!(
        base.fairness.min_ratio < fair.fairness.min_ratio - 0.2,
        "baseline worst {}",
        base.fairness.min_ratio
    );
    assert!(
        base.largest_gang_wait_s.p50 > 10 * fair.largest_gang_wait_s.p50.max(60),
        "baseline starves gangs: {:?} vs {:?}",
        base.largest_gang_wait_s,
        fair.largest_gang_wait_s
    );
}

fn small() -> Scenario {
    let text = AI2
        .replace("nodes = 128", "nodes = 16")
        .replace("days = 30", "days = 3")
        .replace("arrivals_per_hour = 45", "arrivals_per_hour = 6")
        .replace("arrivals_per_hour = 25", "arrivals_per_hour = 4")
        .replace("arrivals_per_hour = 16", "arrivals_per_hour = 2")
        .replace(
            "nodes = { 1 = 0.35, 2 = 0.25, 4 = 0.20, 8 = 0.15, 16 = 0.05 }",
            "nodes = { 1 = 0.5, 2 = 0.3, 4 = 0.2 }",
        )
        .replace("drain_per_node_day = 0.01", "drain_per_node_day = 0.1");
    Scenario::parse(&text, "small").expect("parses")
}

#[test]
fn same_seed_same_report_other_seed_other_report() {
    let sc = small();
    let a = run(&sc, PolicyKind::FairShare);
    let b = run(&sc, PolicyKind::FairShare);
    assert_eq!(a, b);
    assert_eq!(
        serde_json::to_string(&a).expect("json"),
        serde_json::to_string(&b).expect("json")
    );
    assert!(a.faults > 0, "faults are injected");
    let mut other = sc.clone();
    other.seed += 1;
    assert_ne!(run(&other, PolicyKind::FairShare).events, a.events);
}

#[test]
fn scenario_errors_name_file_line_and_field() {
    let e = Scenario::parse(
        "name = \"x\"\n[[clusters]]\nname = \"c\"\nnodez = 3\n",
        "bad.toml",
    )
    .unwrap_err();
    let msg = e.to_string();
    assert!(msg.starts_with("bad.toml:4: nodez:"), "{msg}");
    let e = Scenario::parse("name = \"x\"\ndays = \"lots\"\n", "bad.toml").unwrap_err();
    assert_eq!((e.line, e.file.as_str()), (2, "bad.toml"), "{e}");
    let bad_class = AI2.replace("resumable = 0.9", "resumable = 9");
    let e = Scenario::parse(&bad_class, "ai2.toml").unwrap_err();
    assert!(
        e.field.contains("training") && e.field.ends_with("resumable"),
        "{e}"
    );
    // The line the parser saw the value on, not the first line naming the class.
    assert!(
        e.line > 0
            && bad_class
                .lines()
                .nth(e.line - 1)
                .is_some_and(|l| l.trim() == "resumable = 9"),
        "{e}"
    );
    let bad_dur = AI2.replace("min_runtime = \"8h\"", "min_runtime = \"8 hours\"");
    let e = Scenario::parse(&bad_dur, "ai2.toml").unwrap_err();
    assert!(e.message.contains("invalid duration"), "{e}");
    assert!(
        AI2.lines()
            .nth(e.line - 1)
            .is_some_and(|l| l.contains("min_runtime")),
        "{e}"
    );
}

#[test]
fn trace_errors_name_the_line_and_column() {
    let sc = ai2();
    let t = "submit_s,duration_s,gpus,team\n0,60,1,a\n5,sixty,1,a\n";
    let e = trace::parse(t, "t.csv", &sc).unwrap_err();
    assert_eq!((e.line, e.field.as_str()), (3, "duration_s"), "{e}");
    assert!(e.to_string().starts_with("t.csv:3: duration_s:"), "{e}");
    let e = trace::parse("submit_s,gpus,team\n", "t.csv", &sc).unwrap_err();
    assert_eq!(e.field, "duration_s");
    let e = trace::parse("submit_s,duration_s,gpus,team,colour\n", "t.csv", &sc).unwrap_err();
    assert_eq!(e.field, "colour");
    let e = trace::parse("submit_s,duration_s,gpus,team\n0,1,1\n", "t.csv", &sc).unwrap_err();
    assert_eq!((e.line, e.field.as_str()), (2, "row"));
    let e = trace::parse(
        "submit_s,duration_s,gpus,team,resumable\n0,1,1,a,maybe\n",
        "t.csv",
        &sc,
    )
    .unwrap_err();
    assert_eq!(e.field, "resumable");
    // CSV as spreadsheets write it: a quoted cell holds a comma, blank lines are
    // skipped, and an error still names the line it is on.
    let t = "submit_s,duration_s,gpus,team\n\n0,60,1,\"a,b\"\n   \n5,sixty,1,a\n";
    let e = trace::parse(t, "t.csv", &sc).unwrap_err();
    assert_eq!((e.line, e.field.as_str()), (5, "duration_s"), "{e}");
    let tr = trace::parse(
        "submit_s,duration_s,gpus,team\n0,60,1,\"a,b\"\n",
        "t.csv",
        &sc,
    )
    .expect("a quoted comma is part of its cell");
    assert_eq!(tr.groups[0].0, "a,b");
    // CRLF lines, as the shipped Philly trace has them: lines still counted right.
    let crlf = "submit_s,duration_s,gpus,team\r\n0,60,1,a\r\n\r\n5,sixty,1,a\r\n";
    let e = trace::parse(crlf, "t.csv", &sc).unwrap_err();
    assert_eq!((e.line, e.field.as_str()), (4, "duration_s"), "{e}");
}

#[test]
fn trace_replay_uses_class_defaults_and_equal_shares_for_new_teams() {
    let mut sc = ai2();
    sc.days = 1;
    let t = "submit_s,duration_s,gpus,nodes,team,class\n\
             0,3600,8,2,newteam,training\n\
             10,600,1,,alpha-llm-team,debug\n\
             20,7200,4,1,newteam,\n";
    let tr = trace::parse(t, "t.csv", &sc).expect("parses");
    assert_eq!(tr.jobs.len(), 3);
    assert_eq!(
        tr.jobs[0].spec.min_runtime,
        8 * 3600,
        "training's min runtime"
    );
    assert_eq!(tr.jobs[1].spec.nodes, 1, "empty nodes cell defaults to 1");
    assert_eq!(tr.jobs[2].spec.class, "batch");
    assert_eq!(tr.jobs[2].spec.min_runtime, 0, "batch is unfunded");
    let specs = sc.tree_specs(&tr.groups).expect("tree");
    let newteam = specs.iter().find(|g| g.name == "newteam").expect("added");
    let mean = sc.teams.iter().map(|t| t.weight).sum::<f64>() / sc.teams.len() as f64;
    assert_eq!(newteam.weight, mean);
    let opts = SimOptions {
        policy: PolicyKind::FairShare,
        seed: 1,
        timeline: true,
    };
    let r = sim::run(&sc, tr.jobs, &tr.groups, &opts).expect("runs");
    assert_eq!(r.submitted, 3);
    assert_eq!(
        r.wait_s["training"].p50, 0,
        "an idle cluster starts it at once"
    );
    let tl = r.timeline.expect("timeline asked for");
    assert_eq!(tl.hours.len(), 24);
}

#[test]
fn trace_jobs_that_cannot_fit_stop_the_run_with_their_line() {
    let mut sc = ai2();
    sc.days = 1;
    let tr = trace::parse(
        "submit_s,duration_s,gpus,nodes,team\n0,60,8,500,a\n",
        "t.csv",
        &sc,
    )
    .expect("parses");
    let opts = SimOptions {
        policy: PolicyKind::FairShare,
        seed: 1,
        timeline: false,
    };
    let e = sim::run(&sc, tr.jobs, &tr.groups, &opts).unwrap_err();
    assert!(
        e.to_string().starts_with("trace line 2: nodes = 500"),
        "{e}"
    );
}

#[test]
fn every_shipped_scenario_parses() {
    for (file, text) in [
        (
            "scenarios/philly.toml",
            include_str!("../../scenarios/philly.toml"),
        ),
        ("sim/src/ai2.toml", AI2),
        (
            "scenarios/ai2-100k.toml",
            include_str!("../../scenarios/ai2-100k.toml"),
        ),
        (
            "scenarios/philly-vc.toml",
            include_str!("../../scenarios/philly-vc.toml"),
        ),
    ] {
        let sc = Scenario::parse(text, file).unwrap_or_else(|e| panic!("{e}"));
        assert!(!sc.clusters.is_empty(), "{file}");
    }
    // The suite's scenarios extend others by path: read them where they lie.
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../scenarios/suite");
    let mut names = Vec::new();
    for e in std::fs::read_dir(&dir).expect("scenarios/suite") {
        let path = e.expect("entry").path();
        let text = std::fs::read_to_string(&path).expect("readable");
        let sc =
            Scenario::parse(&text, &path.display().to_string()).unwrap_or_else(|e| panic!("{e}"));
        if let Some(tr) = sc.trace_path(&path) {
            assert!(
                tr.exists(),
                "{}: trace {} is committed",
                path.display(),
                tr.display()
            );
        }
        names.push(sc.name);
    }
    names.sort();
    let expected = [
        "ai2",
        "ai2-100k",
        "ai2-mixed",
        "ai2-sessions",
        "faults",
        "light-month",
        "llm-lab",
        "philly-1024-6x",
        "philly-2x",
        "philly-384",
        "philly-light",
        "philly-vcs",
    ];
    assert_eq!(names, expected);
}

#[test]
fn load_scales_arrivals_and_extends_lays_tables_over_the_base() {
    let base = Scenario::parse(AI2, "ai2").expect("ai2");
    let light = Scenario::parse("extends = \"ai2\"\nload = 0.5\ndays = 3\n", "x.toml")
        .expect("extends ai2");
    assert_eq!(
        light.teams.len(),
        base.teams.len(),
        "teams come from the base"
    );
    assert_eq!(light.days, 3, "scalars laid over");
    let full = Scenario::parse("extends = \"ai2\"\ndays = 3\n", "y.toml").expect("extends");
    let (n_light, n_full) = (
        light.generate(1).len() as f64,
        full.generate(1).len() as f64,
    );
    assert!(
        (n_light / n_full - 0.5).abs() < 0.05,
        "half the arrivals: {n_light} of {n_full}"
    );
    // A trace's submit times are divided by the load: arrivals twice as fast.
    let t = "submit_s,duration_s,gpus,team\n0,60,1,alpha-llm-team\n3600,60,1,alpha-llm-team\n";
    let twice = Scenario::parse("extends = \"ai2\"\nload = 2\n", "v.toml").expect("load 2");
    let submits: Vec<u64> = trace::parse(t, "t.csv", &twice)
        .expect("parses")
        .jobs
        .iter()
        .map(|j| j.submit)
        .collect();
    assert_eq!(submits, [0, 1_800]);
    let e = Scenario::parse("extends = \"ai2\"\nload = 0\n", "z.toml").unwrap_err();
    assert!(e.to_string().contains("load"), "{e}");
    let e = Scenario::parse("extends = 3\n", "w.toml").unwrap_err();
    assert!(e.to_string().contains("extends"), "{e}");
}

#[test]
fn a_seed_table_spreads_every_measure_and_lost_work_adds_up_by_cause() {
    let sc = small();
    let runs: Vec<Report> = [1u64, 2, 3]
        .iter()
        .map(|&seed| {
            let opts = SimOptions {
                policy: PolicyKind::FairShare,
                seed,
                timeline: false,
            };
            sim::run(&sc, sc.generate(seed), &[], &opts).expect("runs")
        })
        .collect();
    for r in &runs {
        for t in &r.teams {
            let short: f64 = t.shortfall_gpu_hours.values().sum();
            let net = t.entitled_gpu_hours - t.received_gpu_hours;
            assert!(short + 1e-3 >= net, "{}: shortfall {short} < {net}", t.name);
            for class in t.shortfall_gpu_hours.keys() {
                assert!(
                    ["debug", "interactive", "training", "batch"].contains(&class.as_str()),
                    "{class}"
                );
            }
            // What ran, by class and funding, is all that was received.
            let by_class: f64 = t
                .received_by
                .values()
                .map(|x| x.funded_gpu_hours + x.unfunded_gpu_hours)
                .sum();
            assert!(
                (by_class - t.received_gpu_hours).abs() < 1e-2,
                "{}: {by_class} by class, {} received",
                t.name,
                t.received_gpu_hours
            );
            // Batch has no contract: it never runs funded.
            if let Some(b) = t.received_by.get("batch") {
                assert_eq!(b.funded_gpu_hours, 0.0, "{}", t.name);
            }
        }
        // The backlog that keeps the cluster saturated is where shortfalls wait.
        let of = |c: &str| -> f64 {
            r.teams
                .iter()
                .filter_map(|t| t.shortfall_gpu_hours.get(c))
                .sum()
        };
        assert!(of("batch") > of("debug") + of("interactive") + of("training"));
        let by_cause: f64 = r.lost_gpu_hours_by.values().sum();
        assert!(
            (by_cause - r.lost_gpu_hours).abs() < 1e-3,
            "{:?} vs {}",
            r.lost_gpu_hours_by,
            r.lost_gpu_hours
        );
    }
    let mut means: Vec<f64> = runs.iter().map(|r| r.fairness.mean_ratio).collect();
    means.sort_by(f64::total_cmp);
    let t = sim::SeedTable::new(runs);
    assert_eq!(t.seeds, vec![1, 2, 3]);
    let mean = t
        .spread
        .iter()
        .find(|s| s.measure == "mean ratio")
        .expect("mean ratio measured");
    assert_eq!(
        (mean.min, mean.median, mean.max),
        (means[0], means[1], means[2])
    );
    assert!(t.table().contains("seed 3"), "{}", t.table());
}

#[test]
fn a_pass_interval_batches_events_into_fewer_passes_and_work_still_runs() {
    let every_event = small();
    let mut batched = small();
    batched.pass_interval = 600;
    let a = run(&every_event, PolicyKind::FairShare);
    let b = run(&batched, PolicyKind::FairShare);
    let most = u64::from(batched.days) * 86_400 / 600 + 1;
    assert!(b.passes <= most, "{} passes, at most {most}", b.passes);
    assert!(b.passes * 3 < a.passes, "{} vs {}", b.passes, a.passes);
    assert_eq!(a.submitted, b.submitted);
    // Batching delays starts, it does not stop them: the cluster stays busy.
    assert!(
        b.occupancy > 0.8 * a.occupancy,
        "{} vs {}",
        b.occupancy,
        a.occupancy
    );
    let e = Scenario::parse(
        &AI2.replace("seed = 20241", "seed = 20241\npass_interval = \"2h\""),
        "slow.toml",
    )
    .unwrap_err();
    assert!(e.to_string().contains("pass_interval"), "{e}");
    assert!(e.to_string().contains("at most 1h"), "{e}");
}

#[test]
fn a_team_of_several_users_spreads_its_work_over_them() {
    let text = AI2.replace(
        "name = \"juliet\"\nweight = 5\ndemand = 0.5",
        "name = \"juliet\"\nweight = 5\ndemand = 0.5\nusers = 3",
    );
    let sc = Scenario::parse(&text, "users.toml").expect("parses");
    let mut users = std::collections::BTreeSet::new();
    for j in sc
        .generate(sc.seed)
        .iter()
        .filter(|j| j.spec.project == "juliet")
    {
        users.insert(j.spec.user.clone());
    }
    let want: std::collections::BTreeSet<String> =
        (1..=3).map(|k| format!("juliet-user{k}")).collect();
    assert_eq!(users, want);
    // One user (the default) keeps the name, and the month, of before.
    assert!(Scenario::parse(AI2, "ai2")
        .expect("parses")
        .generate(1)
        .iter()
        .all(|j| j.spec.user.ends_with("-user")));
    let e = Scenario::parse(&text.replace("users = 3", "users = 0"), "users.toml").unwrap_err();
    assert!(e.to_string().contains("teams (juliet).users"), "{e}");
}

#[test]
fn a_class_may_ask_only_for_a_gpu_type_some_cluster_has() {
    let text = "extends = \"ai2\"\n[[clusters]]\nname = \"c\"\nnodes = 2\ngpus_per_node = 8\ngpu_type = \"b300\"\n[[classes]]\nname = \"x\"\narrivals_per_hour = 1\ngpus = { 8 = 1.0 }\nduration = { dist = \"uniform\", min = \"1h\", max = \"2h\" }\nmin_runtime = \"0s\"\ngpu_types = { TYPE = 1.0 }\n";
    let ok = Scenario::parse(&text.replace("TYPE", "b300"), "x.toml").expect("b300 exists");
    assert!(ok
        .generate(1)
        .iter()
        .all(|j| j.spec.select.gpu_types == ["b300"]));
    assert_eq!(ok.nodes()[0].gpu_type, "b300");
    let e = Scenario::parse(&text.replace("TYPE", "a100"), "x.toml")
        .unwrap_err()
        .to_string();
    assert!(e.contains("gpu_types") && e.contains("a100"), "{e}");
}

/// `small` with interactive sessions used in stretches; protected by use when `rule`.
fn small_sessions(rule: bool) -> Scenario {
    let mut text = AI2
        .replace("nodes = 128", "nodes = 16")
        .replace("days = 30", "days = 3")
        .replace("arrivals_per_hour = 45", "arrivals_per_hour = 12")
        .replace("arrivals_per_hour = 25", "arrivals_per_hour = 4")
        .replace("arrivals_per_hour = 16", "arrivals_per_hour = 4")
        .replace(
            "nodes = { 1 = 0.35, 2 = 0.25, 4 = 0.20, 8 = 0.15, 16 = 0.05 }",
            "nodes = { 1 = 0.5, 2 = 0.3, 4 = 0.2 }",
        )
        .replace(
            "time_limit = \"8h\"",
            "time_limit = \"8h\"\nsessions = { active = { dist = \"exp\", mean = \"30m\", max = \"4h\" }, \
             idle = { dist = \"exp\", mean = \"40m\", max = \"4h\" }, idle_after = \"10m\" }",
        );
    if rule {
        text += "\n[policy.protect_by_use.interactive]\nidle_grace = \"20m\"\n";
    }
    Scenario::parse(&text, "small-sessions").expect("parses")
}

#[test]
fn sessions_protected_by_use_are_never_reclaimed_while_active() {
    let with = run(&small_sessions(true), PolicyKind::FairShare);
    let s = with.sessions.clone().expect("sessions are counted");
    assert!(s.leases > 0, "{s:?}");
    assert_eq!(s.reclaimed_active, 0, "{s:?}");
    assert_eq!(with, run(&small_sessions(true), PolicyKind::FairShare));
    let without = run(&small_sessions(false), PolicyKind::FairShare);
    let c = without.sessions.expect("sessions are counted");
    assert!(c.leases > 0, "{c:?}");
    assert!(run(&small(), PolicyKind::FairShare).sessions.is_none());
}
