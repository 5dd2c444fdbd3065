//! Nothing killed that should live, nothing ended with the wrong reason: time limits
//! and their opt-in warning, ladders that end while an agent is down, held drains
//! across a restart of allotd, a lost node that comes back, a gang's parts leaving one
//! by one. allotd, real agents and real workloads, driven through the `allot` CLI.

mod support;

use std::time::Duration;
use support::Cluster;

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
