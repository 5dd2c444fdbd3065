//! Nothing killed that should live, nothing ended with the wrong reason: time limits
//! and their opt-in warning, ladders that end while an agent is down, held drains
//! across a restart of allotd, a lost node that comes back, a gang's parts leaving one
//! by one. allotd, real agents and real workloads, driven through the `allot` CLI.

mod support;

use std::time::Duration;
use support::{wait_for, Cluster};

const LONG: Duration = Duration::from_secs(60);

const ONE_PROJECT: &str = "[[group]]\nname = \"demo-a\"\nweight = 1\n";

/// `allot logs ID` (stdout of the latest run).
fn logs(c: &Cluster, id: &str) -> String {
    let out = c.allot(&["logs", id]);
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn a_time_limit_sends_nothing_unasked_and_ends_timed_out() {
    let c = Cluster::start("limits", ONE_PROJECT, 1, 4);
    // A limit of 5 min 2 s: an agent that warned 5 minutes ahead by default killed
    // this `sleep` with SIGUSR2 after 2 s ("failed").
    let short = c.submit(
        &["--project", "demo-a", "--gpus", "1", "--time-limit", "302s"],
        "sleep 4",
    );
    // Reaching the limit ends the work through the ladder, as timed-out.
    let over = c.submit(
        &["--project", "demo-a", "--gpus", "1", "--time-limit", "3s"],
        "sleep 600",
    );
    // A warning asked for arrives, and the end is still timed-out.
    let warned = c.submit(
        &[
            "--project",
            "demo-a",
            "--gpus",
            "1",
            "--time-limit",
            "5s",
            "--signal",
            "USR1@3s",
        ],
        "trap 'echo warned-by-usr1' USR1; while :; do sleep 0.2; done",
    );
    let w = c.wait_state(&over, "timed-out", LONG);
    assert_eq!(w["end_reason"], "time-limit", "{w}");
    let w = c.wait_state(&warned, "timed-out", LONG);
    assert_eq!(w["signal"], "USR1@3s", "{w}");
    assert!(logs(&c, &warned).contains("warned-by-usr1"), "{w}");
    let w = c.wait_state(&short, "completed", LONG);
    assert_eq!(w["end_reason"], "completed", "{w}");
    // A warning without a limit to warn before is refused before it is sent.
    let out = c.allot(&[
        "submit",
        "--project",
        "demo-a",
        "--signal",
        "USR2@1m",
        "--",
        "true",
    ]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("add --time-limit"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Checkpoints 3 s after SIGUSR1, then exits 0 (the hook's marker, then the exit).
const SLOW_CHECKPOINT: &str = r#"trap 'sleep 3; touch "$ALLOT_CHECKPOINT_DIR/checkpoint.done"; exit 0' USR1
while :; do sleep 0.5; done"#;

/// Node `i`'s lease of workload `id` as its agent shows it.
fn agent_lease(c: &Cluster, i: usize, lease: &str) -> serde_json::Value {
    let v = c.agent_json(i, &["leases", "--json"]);
    v.as_array()
        .and_then(|a| a.iter().find(|l| l["id"] == lease))
        .cloned()
        .unwrap_or_default()
}

#[test]
fn a_ladder_that_ends_while_its_agent_is_down_ends_as_the_ladder_would() {
    let mut c = Cluster::start("cutladder", ONE_PROJECT, 2, 2);
    let flags = [
        "--project",
        "demo-a",
        "--gpus",
        "2",
        "--resumable",
        "--checkpoint",
        "signal:USR1",
        "--min-runtime",
        "3s",
    ];
    let drained = c.submit(&flags, SLOW_CHECKPOINT);
    let cancelled = c.submit(&flags, SLOW_CHECKPOINT);
    let d = c.wait_state(&drained, "running", LONG);
    let k = c.wait_state(&cancelled, "running", LONG);
    let ((node, i), (_, j)) = (Cluster::node_of(&d), Cluster::node_of(&k));
    let (dl, kl) = (
        d["lease_ids"][0].as_str().expect("lease").to_string(),
        k["lease_ids"][0].as_str().expect("lease").to_string(),
    );
    assert_ne!(i, j, "one workload per node");
    let out = c.allot(&["nodes", "drain", &node, "--reason", "maintenance"]);
    assert!(out.status.success(), "{out:?}");
    let out = c.allot(&["cancel", &cancelled]);
    assert!(out.status.success(), "{out:?}");
    // Both ladders begin (the drain's at the 3 s lapse); the agents die at once.
    for (n, lease) in [(i, &dl), (j, &kl)] {
        wait_for("the ladder to begin", LONG, || {
            (agent_lease(&c, n, lease)["state"] == "checkpointing").then_some(())
        });
        c.kill9_agent(n);
    }
    // The workloads checkpoint and exit while their agents are down.
    for (n, lease) in [(i, &dl), (j, &kl)] {
        let exit = c
            .node_dir(n)
            .join("state/leases")
            .join(lease)
            .join("exit.json");
        wait_for("the workload to end", LONG, || exit.exists().then_some(()));
    }
    c.start_agent(i, 2);
    c.start_agent(j, 2);
    // The cancel is a cancel, not "completed, exit 0".
    let w = c.wait_state(&cancelled, "cancelled", LONG);
    assert_eq!(w["end_reason"], "revoked", "{w}");
    // The drained work checkpointed: it waits again and resumes on the other node.
    let w = wait_for("the drained work to resume elsewhere", LONG, || {
        let w = c.status(&drained);
        (w["state"] == "running" && w["node_names"][0] != node.as_str()).then_some(w)
    });
    assert_eq!(w["lease_ids"].as_array().map(Vec::len), Some(2), "{w}");
    let ended = agent_lease(&c, i, &dl);
    assert_eq!(
        (&ended["end_reason"], &ended["ended_by"]),
        (&"revoked".into(), &"checkpoint".into()),
        "{ended}"
    );
}
