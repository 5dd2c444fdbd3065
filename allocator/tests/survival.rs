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
    // A warning without a limit to warn before (none asked, none from the class)
    // is refused by allotd before anything starts.
    let out = c.allot(&[
        "submit",
        "--project",
        "demo-a",
        "--signal",
        "USR2@1m",
        "--",
        "true",
    ]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("class batch has none; add --time-limit"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Checkpoints 3 s after SIGUSR1, then exits 0 (the hook's marker, then the exit);
/// says at once that the signal came (`got-usr1`).
const SLOW_CHECKPOINT: &str = r#"trap 'touch "$ALLOT_CHECKPOINT_DIR/got-usr1"; sleep 3; touch "$ALLOT_CHECKPOINT_DIR/checkpoint.done"; exit 0' USR1
while :; do sleep 0.5; done"#;

/// Node `i`'s lease `lease` as its agent shows it (null while the agent is down).
fn agent_lease(c: &Cluster, i: usize, lease: &str) -> serde_json::Value {
    let out = c.agent_allot(i, &["leases", "--all", "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
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
    // Each ladder begins (the drain's at the 3 s lapse, the cancel's at once) and
    // signals its workload; its agent dies at once.
    for (n, lease, ask) in [
        (
            i,
            &dl,
            vec!["nodes", "drain", &node, "--reason", "maintenance"],
        ),
        (j, &kl, vec!["cancel", &cancelled]),
    ] {
        let out = c.allot(&ask);
        assert!(out.status.success(), "{out:?}");
        let got = c
            .node_dir(n)
            .join("state/leases")
            .join(lease)
            .join("checkpoint/got-usr1");
        wait_for("the ladder's signal", LONG, || got.exists().then_some(()));
        assert_eq!(agent_lease(&c, n, lease)["state"], "checkpointing");
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

#[test]
fn a_revoked_gangs_parts_hold_their_gpus_until_each_has_ended() {
    // Ranks other than 0 take 5 s to leave on SIGTERM (a torchrun gang closing),
    // and are given the time: the test watches them leave.
    let c = Cluster::start_with_agents("gangparts", ONE_PROJECT, 4, 2, "term_grace = \"20s\"\n");
    let id = c.submit(
        &[
            "--project",
            "demo-a",
            "--nodes",
            "3",
            "--gpus",
            "2",
            "--min-runtime",
            "2s",
            "--resumable",
        ],
        r#"if [ "$ALLOT_NODE_RANK" != 0 ]; then trap 'sleep 5; exit 0' TERM; fi
while :; do sleep 0.2; done"#,
    );
    let w = c.wait_state(&id, "running", LONG);
    let first: Vec<String> = w["node_names"]
        .as_array()
        .expect("nodes")
        .iter()
        .filter_map(|n| n.as_str().map(str::to_string))
        .collect();
    let rank0 = first[0].clone();
    let out = c.allot(&["nodes", "drain", &rank0, "--reason", "maintenance"]);
    assert!(out.status.success(), "{out:?}");
    // Rank 0 ends at once; the others are still leaving: their GPUs are not free.
    let held = wait_for("the other parts to be held", LONG, || {
        let nodes = c.json(&["nodes", "--json"]);
        let ending: Vec<String> = nodes
            .as_array()
            .into_iter()
            .flatten()
            .filter(|n| {
                n["leaving_lease_ids"]
                    .as_array()
                    .is_some_and(|l| !l.is_empty())
            })
            .filter_map(|n| n["name"].as_str().map(str::to_string))
            .collect();
        (!ending.is_empty()).then_some((ending, nodes))
    });
    for name in &held.0 {
        let n = held
            .1
            .as_array()
            .and_then(|a| a.iter().find(|n| n["name"] == name.as_str()));
        assert_eq!(
            n.map(|n| n["free_gpus"].clone()),
            Some(0.into()),
            "{}",
            held.1
        );
    }
    // The gang starts again once every old part has ended, on the three ready nodes,
    // and no host refuses it.
    let w = wait_for("the gang to run again", LONG, || {
        let w = c.status(&id);
        (w["state"] == "running" && w["lease_ids"].as_array().map(Vec::len) == Some(2)).then_some(w)
    });
    let again: Vec<&str> = w["node_names"]
        .as_array()
        .expect("nodes")
        .iter()
        .filter_map(|n| n.as_str())
        .collect();
    assert!(!again.contains(&rank0.as_str()), "{w}");
    let history = w["history"].to_string();
    assert!(!history.contains("refused"), "{history}");
    assert!(history.contains("its GPUs are free"), "{history}");
}

#[test]
fn a_lost_node_that_comes_back_never_runs_its_work_twice() {
    let mut c = Cluster::start_with("lostback", "lost_grace = \"3s\"", ONE_PROJECT, 2, 1);
    let id = c.submit(
        &["--project", "demo-a", "--gpus", "1", "--resumable"],
        "trap 'exit 0' TERM; while :; do sleep 0.2; done",
    );
    let w = c.wait_state(&id, "running", LONG);
    let (node, i) = Cluster::node_of(&w);
    let lease = w["lease_ids"][0].as_str().expect("lease").to_string();
    wait_for("the workload to run on its host", LONG, || {
        (agent_lease(&c, i, &lease)["state"] == "running").then_some(())
    });
    // Its agent goes silent past the grace: the node is lost, the work requeued
    // (and started again on the other node, the only free one).
    c.kill9_agent(i);
    let w = wait_for("the work to be requeued and run elsewhere", LONG, || {
        let w = c.status(&id);
        (w["state"] == "running" && w["node_names"][0] != node.as_str()).then_some(w)
    });
    assert_eq!(w["lease_ids"].as_array().map(Vec::len), Some(2), "{w}");
    // The agent comes back, its workload still running: allotd ends that copy.
    c.start_agent(i, 1);
    let ended = wait_for("the returning lease to be ended", LONG, || {
        let l = agent_lease(&c, i, &lease);
        (l["state"] == "ended").then_some(l)
    });
    assert_eq!(ended["end_reason"], "revoked", "{ended}");
    assert!(
        ended["revoke_why"]
            .as_str()
            .unwrap_or("")
            .contains("never runs twice"),
        "{ended}"
    );
    let w = c.status(&id);
    assert_eq!(w["state"], "running", "{w}");
    let history = w["history"].to_string();
    assert!(
        history.contains(&format!("node {node} came back running {lease}")),
        "{history}"
    );
    // Its GPU is free again once that copy is gone, and counted so.
    wait_for("the GPU free again", LONG, || {
        (c.node_view(i)["free_gpus"] == 1).then_some(())
    });
}

const TWO_PROJECTS: &str =
    "[[group]]\nname = \"demo-a\"\nweight = 1\n[[group]]\nname = \"demo-b\"\nweight = 1\n";

/// Workload `id`'s latest lease once its host runs it: (lease, pid).
fn running_on_host(c: &Cluster, id: &str) -> (String, i32) {
    let w = c.wait_state(id, "running", LONG);
    let lease = w["lease_ids"]
        .as_array()
        .and_then(|l| l.last())
        .and_then(|l| l.as_str())
        .expect("a lease")
        .to_string();
    let pid = wait_for("the host to run it", LONG, || {
        let l = agent_lease(c, 0, &lease);
        let pid = l["pid"].as_i64().unwrap_or(0);
        (l["state"] == "running" && pid > 0).then_some(pid as i32)
    });
    (lease, pid)
}

fn alive(pid: i32) -> bool {
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None).is_ok()
}

#[test]
fn what_allotd_asks_while_an_agent_is_away_is_done_when_it_returns() {
    // Each way allotd takes work back, asked while the host's agent is down: the
    // process must be gone within its ladder once the agent is back, not run on
    // holding its GPUs until someone asks again.
    let mut c = Cluster::start("away", TWO_PROJECTS, 1, 2);
    let ladder = Duration::from_secs(20); // 3 s checkpoint grace + 2 s term, with room
    let check = |c: &mut Cluster, what: &str, id: &str, ask: &dyn Fn(&Cluster)| {
        let (lease, pid) = running_on_host(c, id);
        c.kill9_agent(0);
        ask(c);
        assert!(alive(pid), "{what}: nobody has told the host yet");
        c.start_agent(0, 2);
        wait_for(&format!("{what}: {lease}'s process gone"), ladder, || {
            (!alive(pid)).then_some(())
        });
        let l = wait_for(&format!("{what}: {lease} ended"), ladder, || {
            let l = agent_lease(c, 0, &lease);
            (l["state"] == "ended").then_some(l)
        });
        assert_eq!(l["end_reason"], "revoked", "{what}: {l}");
    };
    // A cancel.
    let a = c.submit(&["--project", "demo-a", "--gpus", "1"], "sleep 600");
    check(&mut c, "cancel", &a, &|c| {
        let out = c.allot(&["cancel", &a]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    });
    c.wait_state(&a, "cancelled", LONG);
    // A requeue: the work runs again, after the first run has gone.
    let b = c.submit(
        &["--project", "demo-a", "--gpus", "1", "--resumable"],
        "sleep 600",
    );
    check(&mut c, "requeue", &b, &|c| {
        let out = c.allot(&["requeue", &b]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    });
    running_on_host(&c, &b);
    let out = c.allot(&["cancel", &b]);
    assert!(out.status.success());
    c.wait_state(&b, "cancelled", LONG);
    // A preemption: free occupancy gives way to funded work submitted meanwhile.
    let free = c.submit(
        &["--project", "demo-b", "--gpus", "2", "--resumable"],
        "sleep 600",
    );
    let funded = std::cell::RefCell::new(String::new());
    check(&mut c, "preemption", &free, &|c| {
        *funded.borrow_mut() = c.submit(
            &["--project", "demo-a", "--gpus", "2", "--min-runtime", "1h"],
            "sleep 600",
        );
        c.wait_passes(2);
    });
    let funded = funded.into_inner();
    running_on_host(&c, &funded);
    assert_eq!(c.status(&free)["preemptions"], 1);
    for id in [&funded, &free] {
        let out = c.allot(&["cancel", id]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    c.wait_state(&funded, "cancelled", LONG);
    // A drain-now by the cluster's operator.
    let d = c.submit(&["--project", "demo-a", "--gpus", "1"], "sleep 600");
    check(&mut c, "drain", &d, &|c| {
        let out = c.allot(&["nodes", "drain", "node-0", "--reason", "fan", "--now"]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    });
}
