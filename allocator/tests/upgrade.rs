//! State written by earlier releases opens in this one (fixtures under
//! `tests/fixtures/`, made by `tests/fixtures/make.sh` with that release's binaries).

mod support;

use support::Cluster;

const DEV_GROUPS: &str = "[[group]]\nname = \"research\"\nweight = 3\n[[group]]\nname = \"demo-a\"\nparent = \"research\"\nweight = 1\n[[group]]\nname = \"platform\"\nweight = 1\n[[group]]\nname = \"demo-b\"\nparent = \"platform\"\nweight = 1\n";

#[test]
fn the_0_1_0_journal_opens_with_every_workload_and_the_operator_drain() {
    let fixture =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/0.1.0-cbf7145");
    let c = Cluster::from_state("upgrade-0.1.0", DEV_GROUPS, &fixture.join("allotd.db"));
    let before: Vec<serde_json::Value> = serde_json::from_str(
        &std::fs::read_to_string(fixture.join("queue.json")).expect("queue.json"),
    )
    .expect("json");
    // Finished work may have retired from memory (server.keep_finished): `status`
    // finds every workload either way.
    let listed = c.json(&["queue", "--all", "--json"]);
    assert!(listed.as_array().map_or(0, Vec::len) <= before.len());
    let compare = |c: &Cluster, when: &str| {
        for w in &before {
            let id = w["id"].as_str().expect("id");
            let n = c.status(id);
            // Replay decides what 0.1.0 decided: the same states, runs and nodes
            // (its submissions keep 0.1.0's requeue rule, its undrains theirs).
            for f in [
                "project",
                "user",
                "gpus_per_node",
                "nodes",
                "min_runtime_s",
                "argv",
                "state",
                "lease_ids",
                "node_names",
            ] {
                assert_eq!(n[f], w[f], "workload {id}: {f} ({when})");
            }
            // 0.1.0 forgot to count the preemption that ended work for good; it
            // is counted now.
            let fixed = u64::from(w["state"] == "preempted");
            assert_eq!(
                n["preemptions"].as_u64(),
                w["preemptions"].as_u64().map(|p| p.max(fixed)),
                "workload {id} ({when})"
            );
        }
    };
    compare(&c, "first start");
    // The cluster operator's drain (journaled as `operator` by 0.1.0) is kept, with
    // its author kind as this release names it.
    let nodes = c.json(&["nodes", "--json"]);
    let drained = nodes
        .as_array()
        .expect("nodes")
        .iter()
        .find(|n| n["state"] == "draining")
        .cloned()
        .unwrap_or_default();
    assert_eq!(drained["drains"][0]["by"], "cluster-operator", "{nodes}");
    assert_eq!(
        drained["drains"][0]["reason"], "fixture: rack maintenance",
        "{nodes}"
    );
}

#[test]
fn after_the_upgrade_a_changed_policy_constant_moves_no_lease_and_no_usage() {
    let fixture =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/0.1.0-cbf7145");
    let mut c = Cluster::from_state("upgrade-policy", DEV_GROUPS, &fixture.join("allotd.db"));
    let view = |c: &Cluster| {
        let mut v = Vec::new();
        for w in c
            .json(&["queue", "--all", "--json"])
            .as_array()
            .expect("list")
        {
            let id = w["id"].as_str().expect("id");
            let s = c.status(id);
            v.push((
                id.to_string(),
                s["state"].clone(),
                s["lease_ids"].clone(),
                s["node_names"].clone(),
            ));
        }
        v
    };
    let before = view(&c);
    let share = |c: &Cluster| -> Vec<(String, u64, u64)> {
        c.json(&["share", "--json"])["groups"]
            .as_array()
            .expect("groups")
            .iter()
            .map(|g| {
                (
                    g["name"].as_str().unwrap_or_default().to_string(),
                    g["running_gpus"].as_u64().unwrap_or(0),
                    g["pending_gpus"].as_u64().unwrap_or(0),
                )
            })
            .collect()
    };
    let shares = share(&c);
    // Usage as 0.1.0 left it: running GPUs and pending demand by group, as its
    // own `allot share --json` said.
    let fixture_share: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(fixture.join("share.json")).expect("share.json"),
    )
    .expect("json");
    for g in fixture_share["groups"].as_array().expect("groups") {
        let name = g["name"].as_str().expect("name");
        let now = shares.iter().find(|s| s.0 == name).expect("group");
        assert_eq!(
            (now.1, now.2),
            (
                g["running_gpus"].as_u64().unwrap_or(0),
                g["pending_gpus"].as_u64().unwrap_or(0)
            ),
            "group {name}"
        );
    }
    let (_, status) = c.term_server();
    assert!(status.success());
    // The next release ages and cools down differently: what the state file says
    // ran where still does.
    let mut cfg = std::fs::read_to_string(&c.config).expect("config");
    cfg.push_str("\n[policy]\ncooldown = \"1s\"\naging_per_hour = 1000\nhysteresis = 0.0\n");
    std::fs::write(&c.config, cfg).expect("config");
    c.start_server();
    assert_eq!(view(&c), before);
    assert_eq!(share(&c), shares);
}
