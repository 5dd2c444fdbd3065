//! State written by earlier releases opens in this one (fixtures under
//! `tests/fixtures/`, made by `tests/fixtures/make.sh` with that release's binaries).

mod support;

use std::collections::BTreeMap;
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
    let now = c.json(&["queue", "--all", "--json"]);
    let now: BTreeMap<String, serde_json::Value> = now
        .as_array()
        .expect("list")
        .iter()
        .map(|w| (w["id"].as_str().unwrap_or("").to_string(), w.clone()))
        .collect();
    assert_eq!(now.len(), before.len(), "{now:?}");
    for w in &before {
        let id = w["id"].as_str().expect("id");
        let n = &now[id];
        // Replay decides what 0.1.0 decided: the same states, runs and nodes (its
        // submissions keep 0.1.0's requeue rule, its undrains theirs).
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
            assert_eq!(n[f], w[f], "workload {id}: {f}");
        }
        // 0.1.0 forgot to count the preemption that ended work for good; it is
        // counted now.
        let fixed = u64::from(w["state"] == "preempted");
        assert_eq!(
            n["preemptions"].as_u64(),
            w["preemptions"].as_u64().map(|p| p.max(fixed)),
            "workload {id}"
        );
    }
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
