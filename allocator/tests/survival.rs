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
fn a_lost_node_whose_agent_does_not_fence_keeps_its_work_until_it_returns() {
    // `fence_after = 0`: the host never stops work for want of allotd, so allotd
    // cannot know the first run is over and never starts a second.
    let mut c = Cluster::prepare("lostback", "lost_grace = \"3s\"", ONE_PROJECT);
    c.agent_extra = "fence_after = 0\n".into();
    c.start_agents(2, 1);
    let id = c.submit(
        &["--project", "demo-a", "--gpus", "1", "--resumable"],
        "trap 'exit 0' TERM; while :; do sleep 0.2; done",
    );
    let w = c.wait_state(&id, "running", LONG);
    let (node, i) = Cluster::node_of(&w);
    let lease = w["lease_ids"][0].as_str().expect("lease").to_string();
    let pid = wait_for("the workload to run on its host", LONG, || {
        let l = agent_lease(&c, i, &lease);
        (l["state"] == "running").then(|| l["pid"].as_i64().unwrap_or(0) as i32)
    });
    c.kill9_agent(i);
    wait_for("the node to be lost", LONG, || {
        (c.node_view(i)["state"] == "down").then_some(())
    });
    // Passes go by; the work stays where it is, held: the other node's GPU idles.
    c.wait_passes(5);
    let w = c.status(&id);
    assert_eq!(w["state"], "running", "{w}");
    assert_eq!(w["lease_ids"].as_array().map(Vec::len), Some(1), "{w}");
    assert!(alive(pid), "the host still runs it");
    // The agent comes back: the same run goes on, nothing ended.
    c.start_agent(i, 1);
    c.wait_connected(2);
    let l = agent_lease(&c, i, &lease);
    assert_eq!(l["state"], "running", "{l}");
    let w = c.status(&id);
    assert_eq!(w["state"], "running", "{w}");
    assert_eq!(w["node_names"][0], node.as_str(), "{w}");
    assert_eq!(w["lease_ids"].as_array().map(Vec::len), Some(1), "{w}");
    assert!(alive(pid));
}

/// How a test cuts a host off from allotd.
#[derive(Clone, Copy, Debug)]
enum CutOff {
    /// The network between them drops every byte (the test's relay).
    Partition,
    /// The host's agent is stopped (SIGSTOP): its workloads run on.
    StoppedAgent,
}

/// A host cut off from allotd `how`: its work stops by its fence, and only then does
/// allotd run it elsewhere. At no instant do two runs of the workload exist: each
/// run writes its pid to `run-N.pid`, and the test looks every 50 ms.
fn fenced_before_it_runs_elsewhere(tag: &str, how: CutOff) {
    let mut c = Cluster::prepare(
        tag,
        "lost_grace = \"3s\"\nidle_timeout = \"10s\"",
        ONE_PROJECT,
    );
    // Fenced 4 s after the last word from allotd, by a 3 s + 2 s ladder.
    c.agent_extra = "fence_after = \"4s\"\n".into();
    let relay = allot_test_support::partition::Partition::start(&c.addr);
    c.agent_route.insert(0, relay.addr.clone());
    // Node 0 alone first, so that the first run is there.
    c.start_agents(1, 1);
    let runs = c.dir.join("runs");
    std::fs::create_dir_all(&runs).expect("runs dir");
    let id = c.submit(
        &["--project", "demo-a", "--gpus", "1", "--resumable"],
        &format!(
            "echo $$ > {}/run-$ALLOT_RUN.pid; trap 'exit 0' TERM; while :; do sleep 0.2; done",
            runs.display()
        ),
    );
    let (lease, first) = running_on_host(&c, &id);
    c.agents.push(None);
    c.start_agent(1, 1);
    c.wait_connected(2);
    let agent = c.agent_pid(0).expect("agent 0 runs");
    let signal_agent = |sig| {
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(agent), sig).expect("signals the agent")
    };
    match how {
        CutOff::Partition => relay.cut(),
        CutOff::StoppedAgent => signal_agent(nix::sys::signal::Signal::SIGSTOP),
    }
    let live = || -> Vec<(String, i32)> {
        let mut v: Vec<(String, i32)> = std::fs::read_dir(&runs)
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| {
                let name = e.file_name().to_string_lossy().into_owned();
                let pid = std::fs::read_to_string(e.path())
                    .ok()?
                    .trim()
                    .parse()
                    .ok()?;
                Some((name, pid))
            })
            .filter(|(_, pid)| alive(*pid))
            .collect();
        v.sort();
        v
    };
    let t0 = std::time::Instant::now();
    let mut first_gone = None;
    let second = loop {
        let now = live();
        assert!(now.len() <= 1, "{how:?}: two runs at once: {now:?}");
        if first_gone.is_none() && !alive(first) {
            first_gone = Some(t0.elapsed());
        }
        if let Some((name, pid)) = now.iter().find(|(n, _)| n != "run-1.pid") {
            break (name.clone(), *pid);
        }
        assert!(
            t0.elapsed() < Duration::from_secs(150),
            "{how:?}: no second run in 150 s; live: {now:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    let rerun = t0.elapsed();
    let first_gone = first_gone.expect("the first run ended before the second began");
    eprintln!("{how:?}: first run fenced after {first_gone:?}, second run began after {rerun:?}");
    assert_eq!(second.0, "run-2.pid");
    let w = c.status(&id);
    assert_eq!(w["state"], "running", "{w}");
    assert_eq!(w["node_names"][0], "node-1", "{w}");
    let history = w["history"].to_string();
    assert!(history.contains("node node-0 lost"), "{history}");
    // The host comes back and says how its run ended: by its fence.
    match how {
        CutOff::Partition => relay.heal(),
        CutOff::StoppedAgent => signal_agent(nix::sys::signal::Signal::SIGCONT),
    }
    let l = wait_for(
        &format!("{how:?}: the host to say how {lease} ended"),
        LONG,
        || {
            let l = agent_lease(&c, 0, &lease);
            (l["state"] == "ended").then_some(l)
        },
    );
    assert_eq!(l["end_reason"], "fenced", "{l}");
    assert!(
        l["ended_by"]
            .as_str()
            .unwrap_or("")
            .contains("no word from allotd for 4s"),
        "{l}"
    );
    c.wait_connected(2);
    // The second run goes on untouched.
    assert!(alive(second.1));
    assert_eq!(c.status(&id)["state"], "running");
}

#[test]
fn a_partitioned_host_stops_its_work_before_it_runs_anywhere_else() {
    fenced_before_it_runs_elsewhere("fence-cut", CutOff::Partition);
}

#[test]
fn a_host_whose_agent_is_stopped_stops_its_work_before_it_runs_anywhere_else() {
    fenced_before_it_runs_elsewhere("fence-stop", CutOff::StoppedAgent);
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
