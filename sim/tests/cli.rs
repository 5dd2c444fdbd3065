//! `allot-sim` as users run it: the real binary, its output and exit codes (and
//! `allotd simulate`, its alias for one release, in `allocator/tests/`).

use std::process::Command;

fn allot_sim(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_allot-sim"))
        .args(args)
        .output()
        .expect("allot-sim runs");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn without_wall(json: &str) -> serde_json::Value {
    let mut v: serde_json::Value = serde_json::from_str(json).expect("one JSON object");
    v.as_object_mut().expect("an object").remove("sim_wall_s");
    v
}

#[test]
fn json_is_byte_identical_across_runs_apart_from_wall_time() {
    let args = ["--days", "4", "--json"];
    let (c1, a, _) = allot_sim(&args);
    let (c2, b, _) = allot_sim(&args);
    assert_eq!((c1, c2), (0, 0));
    assert_eq!(a.lines().count(), 1, "one object on one line");
    let strip = |s: &str| {
        let i = s.find("\"sim_wall_s\"").expect("has sim_wall_s");
        let j = s[i..].find([',', '}']).expect("ends") + i;
        format!("{}{}", &s[..i], &s[j..])
    };
    assert_eq!(strip(&a), strip(&b));
    let v = without_wall(&a);
    for key in [
        "policy",
        "seed",
        "days",
        "gpus",
        "occupancy",
        "unallocated_occupancy",
        "teams",
        "fairness",
        "wait_s",
        "preemptions",
        "lost_gpu_hours",
        "largest_gang_wait_s",
        "events",
    ] {
        assert!(v.get(key).is_some(), "report has {key}");
    }
    assert_eq!(v["policy"], "fairshare");
    assert_eq!(v["days"], 4);
    assert_eq!(v["gpus"], 1024);
    let team = &v["teams"][0];
    for key in ["name", "entitled_gpu_hours", "received_gpu_hours", "ratio"] {
        assert!(team.get(key).is_some(), "team row has {key}");
    }
    for key in ["count", "p50", "p90", "p99"] {
        assert!(
            v["wait_s"]["debug"].get(key).is_some(),
            "wait stats have {key}"
        );
    }
}

#[test]
fn table_for_people_and_baseline_policy() {
    let (code, out, _) = allot_sim(&["--days", "2", "--policy", "priority"]);
    assert_eq!(code, 0);
    assert!(out.contains("policy priority"), "{out}");
    assert!(out.contains("fairness: mean"), "{out}");
    let (code, _, err) = allot_sim(&["--policy", "lottery"]);
    assert_eq!(code, 2);
    assert!(err.contains("--policy \"lottery\""), "{err}");
}

#[test]
fn bad_files_fail_with_file_line_and_field() {
    let dir = std::env::temp_dir().join(format!("allot-sim-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let sc = dir.join("bad.toml");
    std::fs::write(
        &sc,
        "name = \"x\"\n\n[[clusters]]\nname = \"c\"\nnodes = -4\ngpus_per_node = 8\n",
    )
    .expect("write");
    let (code, _, err) = allot_sim(&["--scenario", sc.to_str().expect("utf8")]);
    assert_eq!(code, 2);
    assert!(err.contains("bad.toml:5:"), "{err}");
    let tr = dir.join("t.csv");
    std::fs::write(&tr, "submit_s,duration_s,gpus,team\n0,60,1,a\n1,60,x,a\n").expect("write");
    let (code, _, err) = allot_sim(&["--trace", tr.to_str().expect("utf8")]);
    assert_eq!(code, 2);
    assert!(err.contains("t.csv:3: gpus:"), "{err}");
    let (code, _, err) = allot_sim(&["--scenario", "/nonexistent/x.toml"]);
    assert_eq!(code, 2);
    assert!(err.contains("--scenario /nonexistent/x.toml"), "{err}");
    let svg = dir.join("plots");
    let (code, _, _) = allot_sim(&["--days", "1", "--svg", svg.to_str().expect("utf8")]);
    assert_eq!(code, 0);
    for f in ["team-share.svg", "occupancy.svg", "wait-cdf.svg"] {
        let body = std::fs::read_to_string(svg.join(f)).expect("plot written");
        assert!(
            body.starts_with("<svg") && body.contains("<polyline"),
            "{f}"
        );
    }
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn suite_runs_every_scenario_under_four_policies_and_judges_allots() {
    let dir = std::env::temp_dir().join(format!("allot-sim-suite-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    // Two days of a light ai2 (extends the built-in, arrivals × 0.3), and one left
    // out of --quick.
    std::fs::write(
        dir.join("a.toml"),
        "extends = \"ai2\"\nname = \"tiny\"\ndays = 2\nload = 0.3\n",
    )
    .expect("write");
    std::fs::write(
        dir.join("b.toml"),
        "extends = \"a.toml\"\nname = \"heavy\"\n[suite]\nquick = false\n",
    )
    .expect("write");
    let d = dir.to_str().expect("utf8");
    let (code, out, err) = allot_sim(&["suite", "--dir", d, "--quick", "--json"]);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).expect("one JSON object");
    let scenarios = v["scenarios"].as_array().expect("scenarios");
    assert_eq!(scenarios.len(), 1, "--quick leaves heavy out");
    let tiny = &scenarios[0];
    assert_eq!(tiny["scenario"], "tiny");
    assert_eq!(tiny["seeds"], serde_json::json!([1, 2]));
    let policies: Vec<&str> = tiny["runs"]
        .as_array()
        .expect("runs")
        .iter()
        .map(|r| r[0].as_str().expect("name"))
        .collect();
    assert_eq!(
        policies,
        [
            "fairshare",
            "priority",
            "fifo-backfill",
            "fifo-backfill-user"
        ]
    );
    for r in tiny["runs"].as_array().expect("runs") {
        assert_eq!(r[1].as_array().expect("per seed").len(), 2);
        let occ = r[1][0]["occupancy"].as_f64().expect("occupancy");
        assert!(occ > 0.0 && occ <= 1.0, "{occ}");
    }
    let verdicts: Vec<&str> = tiny["verdicts"]
        .as_array()
        .expect("verdicts")
        .iter()
        .map(|v| v["target"].as_str().expect("target"))
        .collect();
    for t in [
        "occupancy ≥ 0.97 × FIFO+backfill's",
        "worst team ≥ 0.92",
        "lost ≤ priority's",
    ] {
        assert!(verdicts.contains(&t), "{verdicts:?}");
    }
    // The table for people, and a policy key tried everywhere.
    let (code, out, err) = allot_sim(&[
        "suite",
        "--dir",
        d,
        "--seeds",
        "3",
        "--policies",
        "fairshare",
        "--set",
        "protected_headroom=0",
    ]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("--set protected_headroom=0"), "{out}");
    assert!(
        out.contains("== heavy (seeds 3)") && out.contains("== tiny"),
        "{out}"
    );
    assert!(out.contains("summary: targets met"), "{out}");
    // Variants judged against the defaults: the default's own value changes nothing.
    let variants = dir.with_extension("variants.toml");
    std::fs::write(
        &variants,
        "same = { hysteresis = 0.05 }\nnoaging = { aging_per_hour = 0 }\n",
    )
    .expect("write");
    let v = variants.to_str().expect("utf8");
    let (code, out, err) = allot_sim(&[
        "suite",
        "--dir",
        d,
        "--seeds",
        "1-2",
        "--only",
        "tiny",
        "--variants",
        v,
        "--json",
    ]);
    assert_eq!(code, 0, "{err}");
    let j: serde_json::Value = serde_json::from_str(&out).expect("one JSON object");
    let js = j["judgements"].as_array().expect("judgements");
    assert_eq!(js.len(), 2);
    let same = js.iter().find(|x| x["name"] == "same").expect("same");
    assert_eq!(same["verdict"], "no effect", "{same}");
    assert_eq!(same["keys"], "hysteresis = 0.05");
    std::fs::write(&variants, "broken = 3\n").expect("write");
    let (code, _, err) = allot_sim(&["suite", "--dir", d, "--variants", v]);
    assert_eq!(code, 2);
    assert!(err.contains("broken = { key = value }"), "{err}");
    std::fs::write(&variants, "bad = { hysteresis = -1 }\n").expect("write");
    let (code, _, err) = allot_sim(&["suite", "--dir", d, "--variants", v]);
    assert_eq!(code, 2);
    assert!(err.contains("bad") && err.contains("hysteresis"), "{err}");
    std::fs::remove_file(&variants).ok();
    // Bad input names the flag and the fix.
    let (code, _, err) = allot_sim(&["suite", "--dir", d, "--set", "protected_headroom=2"]);
    assert_eq!(code, 2);
    assert!(err.contains("policy.protected_headroom = 2"), "{err}");
    let (code, _, err) = allot_sim(&["suite", "--dir", d, "--set", "headroom=0"]);
    assert_eq!(code, 2);
    assert!(err.contains("headroom"), "{err}");
    let (code, _, err) = allot_sim(&["suite", "--dir", d, "--policies", "lottery"]);
    assert_eq!(code, 2);
    assert!(err.contains("\"lottery\" is not one"), "{err}");
    std::fs::write(dir.join("c.toml"), "extends = \"missing.toml\"\n").expect("write");
    let (code, _, err) = allot_sim(&["suite", "--dir", d]);
    assert_eq!(code, 2);
    assert!(
        err.contains("missing.toml") && err.contains("extends"),
        "{err}"
    );
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn fifo_backfill_runs_a_month_and_keeps_the_gpus_busy() {
    let (code, out, err) = allot_sim(&["--days", "3", "--policy", "fifo-backfill", "--json"]);
    assert_eq!(code, 0, "{err}");
    let v = without_wall(&out);
    assert_eq!(v["policy"], "fifo-backfill");
    assert_eq!(v["preemptions"], 0, "FIFO+backfill preempts nothing");
    let occ = v["occupancy"].as_f64().expect("occupancy");
    assert!(
        occ > 0.9,
        "ai2's backlog keeps a work-conserving queue busy: {occ}"
    );
}
