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
