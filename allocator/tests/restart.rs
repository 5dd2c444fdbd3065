//! allotd restarts (kill -9, SIGTERM) with work of every kind running and an
//! operator's drain in force: nothing running is touched, no workload gets a second
//! lease, the drain holds; SIGTERM returns every port within seconds.

mod support;

use std::collections::BTreeMap;
use std::time::Duration;
use support::{port_free, Cluster};

const LONG: Duration = Duration::from_secs(60);

const TWO_PROJECTS: &str =
    "[[group]]\nname = \"demo-a\"\nweight = 1\n[[group]]\nname = \"demo-b\"\nweight = 1\n";

/// What must not change across a restart: each workload's state, leases and nodes.
fn views(c: &Cluster, ids: &[String]) -> BTreeMap<String, (String, String, String)> {
    ids.iter()
        .map(|id| {
            let w = c.status(id);
            (
                id.clone(),
                (
                    w["state"].to_string(),
                    w["lease_ids"].to_string(),
                    w["node_names"].to_string(),
                ),
            )
        })
        .collect()
}

fn drains(c: &Cluster) -> Vec<(String, String, String)> {
    let nodes = c.json(&["nodes", "--json"]);
    nodes
        .as_array()
        .expect("nodes")
        .iter()
        .flat_map(|n| {
            n["drains"]
                .as_array()
                .cloned()
                .unwrap_or_default()
                .into_iter()
                .map(|d| {
                    (
                        n["name"].as_str().unwrap_or_default().to_string(),
                        d["by"].as_str().unwrap_or_default().to_string(),
                        d["reason"].as_str().unwrap_or_default().to_string(),
                    )
                })
        })
        .collect()
}

/// After a restart: the agents are back, two passes have run, and every workload
/// still has its one lease and its process.
fn unchanged(
    c: &Cluster,
    ids: &[String],
    before: &BTreeMap<String, (String, String, String)>,
    pids: &BTreeMap<(usize, String), i64>,
    drained: &[(String, String, String)],
    how: &str,
) {
    c.wait_connected(4);
    c.wait_passes(2);
    assert_eq!(&views(c, ids), before, "after {how}");
    for id in ids {
        let leases = c.status(id)["lease_ids"].as_array().map_or(0, Vec::len);
        assert_eq!(leases, 1, "workload {id} holds one lease after {how}");
    }
    assert_eq!(&c.agent_pids(), pids, "the same processes after {how}");
    for pid in pids.values() {
        assert!(
            nix::sys::signal::kill(nix::unistd::Pid::from_raw(*pid as i32), None).is_ok(),
            "pid {pid} lives after {how}"
        );
    }
    assert_eq!(drains(c), drained, "the operator's drain holds after {how}");
}

#[test]
fn restarts_touch_no_running_work_and_sigterm_frees_the_ports_in_seconds() {
    let mut c = Cluster::start_with("restart-all", "lost_grace = \"5m\"", TWO_PROJECTS, 4, 2);
    let gang = c.submit(
        &[
            "--project",
            "demo-b",
            "--gpus",
            "2",
            "--nodes",
            "2",
            "--min-runtime",
            "1h",
        ],
        "sleep 600",
    );
    c.wait_state(&gang, "running", LONG);
    let funded = c.submit(
        &[
            "--project",
            "demo-a",
            "--gpus",
            "2",
            "--min-runtime",
            "1h",
            "--resumable",
        ],
        "sleep 600",
    );
    c.wait_state(&funded, "running", LONG);
    let fixed = c.submit(
        &["--project", "demo-a", "--gpus", "1", "--min-runtime", "1h"],
        "sleep 600",
    );
    c.wait_state(&fixed, "running", LONG);
    let free = c.submit(
        &["--project", "demo-b", "--gpus", "1", "--resumable"],
        "sleep 600",
    );
    let f = c.wait_state(&free, "running", LONG);
    assert_eq!(f["funded"], false, "{f}");
    let ids = vec![gang, funded.clone(), fixed, free];
    // The operator drains the funded job's node: its lease runs on to the lapse.
    let node = c.status(&funded)["node_names"][0]
        .as_str()
        .expect("node")
        .to_string();
    let n = c.json(&[
        "nodes",
        "drain",
        &node,
        "--reason",
        "rack maintenance",
        "--json",
    ]);
    assert_eq!(n["state"], "draining", "{n}");
    let before = views(&c, &ids);
    let pids = c.agent_pids();
    assert_eq!(
        pids.len(),
        5,
        "four workloads, the gang on two hosts: {pids:?}"
    );
    let drained = drains(&c);
    assert_eq!(drained.len(), 1, "{drained:?}");

    c.kill9_server();
    c.start_server();
    unchanged(&c, &ids, &before, &pids, &drained, "kill -9");

    let (took, status) = c.term_server();
    assert!(
        status.success(),
        "allotd exits cleanly on SIGTERM: {status}"
    );
    assert!(
        took < Duration::from_secs(5),
        "SIGTERM with 4 agents connected took {took:?}"
    );
    assert!(port_free(&c.addr), "the gRPC port is free at once");
    assert!(port_free(&c.metrics), "the metrics port is free at once");
    c.start_server();
    unchanged(&c, &ids, &before, &pids, &drained, "SIGTERM");
}

/// `allotd state …` with the given args and this cluster's config.
fn state(c: &Cluster, args: &[&str]) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_allotd"))
        .arg("state")
        .args(args)
        .arg("--config")
        .arg(&c.config)
        .output()
        .expect("allotd runs")
}

#[test]
fn an_export_imported_over_the_state_brings_every_workload_back() {
    let mut c = Cluster::start("state-io", TWO_PROJECTS, 1, 2);
    let run = c.submit(
        &["--project", "demo-a", "--gpus", "2", "--min-runtime", "1h"],
        "sleep 600",
    );
    c.wait_state(&run, "running", LONG);
    let wait = c.submit(&["--project", "demo-b", "--gpus", "2"], "sleep 600");
    let ids = vec![run, wait];
    let before = views(&c, &ids);
    let export = c.dir.join("export.json");
    // Beside a running allotd: check and export read; import is refused.
    let out = state(&c, &["export", "--out", export.to_str().expect("utf-8")]);
    assert!(out.status.success(), "{out:?}");
    let out = state(&c, &["check"]);
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(out.status.success() && text.contains("state ok"), "{out:?}");
    assert!(text.contains("2 workloads (1 running)"), "{text}");
    let out = state(&c, &["import", export.to_str().expect("utf-8")]);
    assert!(!out.status.success(), "import beside a running allotd");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("stop it first"),
        "{out:?}"
    );
    let (_, status) = c.term_server();
    assert!(status.success());
    // Work goes on meanwhile; the import replaces what allotd would have read.
    let out = state(&c, &["import", export.to_str().expect("utf-8")]);
    assert!(out.status.success(), "{out:?}");
    assert!(
        std::fs::read_dir(c.dir.join("allotd"))
            .expect("state dir")
            .filter_map(Result::ok)
            .any(|e| e
                .file_name()
                .to_string_lossy()
                .starts_with("allotd.db.replaced-")),
        "the replaced file is kept aside"
    );
    c.start_server();
    assert_eq!(views(&c, &ids), before);
    // The way back from a damaged file: allotd refuses it, the import restores.
    let (_, status) = c.term_server();
    assert!(status.success());
    std::fs::write(c.dir.join("allotd/allotd.db"), b"").expect("emptied");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_allotd"))
        .args(["serve", "--config"])
        .arg(&c.config)
        .output()
        .expect("allotd runs");
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(!out.status.success(), "allotd started on an empty file");
    assert!(err.contains("allotd state import"), "{err}");
    let out = state(&c, &["import", export.to_str().expect("utf-8")]);
    assert!(out.status.success(), "{out:?}");
    c.start_server();
    assert_eq!(views(&c, &ids), before);
    // An export that is not one is refused naming the file, and nothing moves.
    std::fs::write(&export, "{\"core\": 7}").expect("write");
    let (_, status) = c.term_server();
    assert!(status.success());
    let out = state(&c, &["import", export.to_str().expect("utf-8")]);
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(
        !out.status.success() && err.contains("export.json"),
        "{err}"
    );
    c.start_server();
    assert_eq!(views(&c, &ids), before);
}

#[test]
fn finished_work_retires_from_memory_yet_status_still_finds_it_for_its_owner_only() {
    let mut c = Cluster::start_with("retire", "keep_finished = \"1s\"", TWO_PROJECTS, 1, 2);
    let done = c.submit(&["--project", "demo-a", "--gpus", "1"], "true");
    c.wait_state(&done, "completed", LONG);
    let live = c.submit(&["--project", "demo-a", "--gpus", "1"], "sleep 600");
    c.wait_state(&live, "running", LONG);
    let history = c.status(&done)["history"].clone();
    // The snapshot taken at stop retires what ended more than a second ago.
    std::thread::sleep(Duration::from_millis(2_100));
    let (_, status) = c.term_server();
    assert!(status.success());
    c.start_server();
    let all = c.json(&["queue", "--all", "--json"]);
    let listed: Vec<&str> = all
        .as_array()
        .expect("list")
        .iter()
        .filter_map(|w| w["id"].as_str())
        .collect();
    assert_eq!(listed, vec![live.as_str()], "only live work is in memory");
    let w = c.status(&done);
    assert_eq!(w["state"], "completed", "{w}");
    assert_eq!(w["history"], history, "its audit lines are kept");
    // Rights hold for a retired workload too.
    let out = c.allotd(&["tokens", "create", "--user", "mallory"]);
    assert!(out.status.success(), "{out:?}");
    let token = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let out = std::process::Command::new(support::sibling("allot", "allot-cli"))
        .args(["status", &done])
        .env("ALLOT_SERVER", format!("https://{}", c.addr))
        .env("ALLOT_TOKEN", token)
        .env("ALLOT_CA", c.ca())
        .output()
        .expect("allot runs");
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(!out.status.success(), "mallory sees another's work");
    assert!(err.contains("may not see workload"), "{err}");
}

#[test]
fn a_journal_entry_that_does_not_read_is_named_and_can_be_dropped() {
    let mut c = Cluster::start("bad-entry", TWO_PROJECTS, 1, 2);
    let (_, status) = c.term_server();
    assert!(status.success());
    // Two submissions after the stop's snapshot, as a crash would leave them; the
    // first is damaged on disk.
    let db = rusqlite::Connection::open(c.dir.join("allotd/allotd.db")).expect("db");
    for body in [
        "{\"kind\":\"submit\",\"spec\":{\"project\":",
        "{\"kind\":\"set-weight\",\"group\":\"demo-a\",\"weight\":5.0}",
    ] {
        db.execute(
            "INSERT INTO journal (at, input) VALUES (strftime('%s','now'), ?1)",
            [body],
        )
        .expect("insert");
    }
    let seq: i64 = db
        .query_row("SELECT min(seq) FROM journal", [], |r| r.get(0))
        .expect("seq");
    drop(db);
    let err = serve_refused(&c, "a damaged entry");
    assert!(
        err.contains("allotd.db") && err.contains(&format!("entry {seq}")),
        "{err}"
    );
    let out = state(&c, &["check"]);
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(!out.status.success(), "{text}");
    assert!(
        text.contains(&format!("journal entry {seq} does not read")),
        "{text}"
    );
    let out = state(&c, &["drop", &seq.to_string()]);
    assert!(out.status.success(), "{out:?}");
    c.start_server();
    // The entry after it applied: nothing else was lost.
    let tree = c.json(&["share", "--json"]);
    let a = tree["groups"]
        .as_array()
        .and_then(|g| g.iter().find(|g| g["name"] == "demo-a"))
        .cloned()
        .unwrap_or_default();
    assert_eq!(a["weight"], 5.0, "{tree}");
}

#[test]
fn a_snapshot_that_does_not_read_is_named_with_its_file() {
    let mut c = Cluster::start("bad-snapshot", TWO_PROJECTS, 0, 0);
    let (_, status) = c.term_server();
    assert!(status.success());
    let path = c.dir.join("allotd/allotd.db");
    let db = rusqlite::Connection::open(&path).expect("db");
    let n = db
        .execute(
            "UPDATE snapshot SET body = '{\"version\":' WHERE seq = (SELECT max(seq) FROM snapshot)",
            [],
        )
        .expect("damage");
    assert_eq!(n, 1, "the stop wrote a snapshot");
    drop(db);
    let err = serve_refused(&c, "a damaged snapshot");
    assert!(
        err.contains(&format!("in {} does not read", path.display())),
        "{err}"
    );
}

/// `allotd serve` on `c`'s state, which must refuse to start on `what`: its stderr.
fn serve_refused(c: &Cluster, what: &str) -> String {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_allotd"))
        .args(["serve", "--config"])
        .arg(&c.config)
        .output()
        .expect("allotd runs");
    assert!(!out.status.success(), "allotd started on {what}");
    String::from_utf8_lossy(&out.stderr).to_string()
}
