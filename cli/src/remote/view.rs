//! How allotd's answers read: JSON objects (the generated types do not derive
//! `Serialize`) and terminal text.

use crate::duration::{age, exact, iso_utc};
use crate::local::{gpu_json, verdict};
use crate::table::{self, or_dash};
use allot_proto::v1::{GetTreeResponse, Group, Node, Workload, WorkloadSpec, WorkloadState};
use serde_json::{json, Value};
use std::sync::LazyLock;

/// What a workload without a spec reads as; allotd always sends one.
static NO_SPEC: LazyLock<WorkloadSpec> = LazyLock::new(WorkloadSpec::default);

fn spec(w: &Workload) -> &WorkloadSpec {
    w.spec.as_ref().unwrap_or(&NO_SPEC)
}

/// A workload state as `--state` takes it.
pub fn state_name(s: WorkloadState) -> &'static str {
    match s {
        WorkloadState::Pending => "pending",
        WorkloadState::Running => "running",
        WorkloadState::Completed => "completed",
        WorkloadState::Failed => "failed",
        WorkloadState::Cancelled => "cancelled",
        WorkloadState::Preempted => "preempted",
        WorkloadState::TimedOut => "timed-out",
        WorkloadState::Unspecified => "unknown",
    }
}

/// `8x2` (per node × nodes) or `4` for one node.
fn shape(gpus_per_node: u32, nodes: u32) -> String {
    if nodes > 1 {
        format!("{gpus_per_node}x{nodes}")
    } else {
        gpus_per_node.to_string()
    }
}

/// `1 GPU`, `4 GPUs`, `16 GPUs on 2 nodes`.
pub fn gpu_count(gpus_per_node: u32, nodes: u32) -> String {
    let total = u64::from(gpus_per_node) * u64::from(nodes.max(1));
    let s = if total == 1 { "" } else { "s" };
    if nodes > 1 {
        format!("{total} GPU{s} on {nodes} nodes")
    } else {
        format!("{total} GPU{s}")
    }
}

/// A number without trailing zeros: `168`, `2.5`, `0.33`.
fn num(f: f64) -> String {
    let s = format!("{f:.2}");
    let s = s.trim_end_matches('0').trim_end_matches('.');
    if s == "-0" {
        "0".into()
    } else {
        s.into()
    }
}

fn yes_no(b: bool) -> &'static str {
    if b {
        "yes"
    } else {
        "no"
    }
}

/// An argv as a shell would take it back: arguments with blanks or quotes are
/// single-quoted, so that what `allot status` shows can be pasted.
fn shell_join(argv: &[String]) -> String {
    let safe = |a: &str| {
        !a.is_empty()
            && a.chars()
                .all(|c| c.is_ascii_alphanumeric() || "_-+=:,./@%".contains(c))
    };
    argv.iter()
        .map(|a| {
            if safe(a) {
                a.clone()
            } else {
                format!("'{}'", a.replace('\'', r"'\''"))
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// A list for one text cell, `-` when empty.
fn list(items: &[String], sep: &str) -> String {
    or_dash(&items.join(sep))
}

/// A workload as JSON.
pub fn workload_json(w: &Workload) -> Value {
    let s = spec(w);
    json!({
        "id": w.id,
        "project": s.project,
        "user": s.user,
        "class": s.class,
        "gpus_per_node": s.gpus_per_node,
        "nodes": s.nodes,
        "cpu_per_node": s.cpu_per_node,
        "mem_per_node_gb": s.mem_per_node_gb,
        "min_runtime_s": s.min_runtime_s,
        "time_limit_s": s.time_limit_s,
        "resumable": s.resumable,
        "priority": s.priority,
        "argv": s.argv,
        "checkpoint_hook": s.checkpoint_hook,
        "state": state_name(w.state()),
        "submit_unix": w.submit_unix,
        "start_unix": w.start_unix,
        "end_unix": w.end_unix,
        "end_reason": w.end_reason,
        "explanation": w.explanation,
        "lease_ids": w.lease_ids,
        "node_names": w.nodes,
        "preemptions": w.preemptions,
        "history": w.history,
        "funded": w.funded,
    })
}

/// Seconds from `from` to `to` for an age cell; `-` when `from` is unset.
fn since(from: i64, to: i64) -> String {
    if from <= 0 {
        "-".into()
    } else {
        age(u64::try_from(to - from).unwrap_or(0))
    }
}

/// The explanation on one line, for a table cell.
fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// The `allot queue` table.
pub fn queue_table(workloads: &[Workload], now: i64) -> String {
    let rows: Vec<Vec<String>> = workloads
        .iter()
        .map(|w| {
            let s = spec(w);
            let state = w.state();
            let (waited_ran, why) = match state {
                WorkloadState::Pending => (since(w.submit_unix, now), one_line(&w.explanation)),
                WorkloadState::Running => (since(w.start_unix, now), String::new()),
                // Finished: how long the last run took, and how it ended.
                _ if w.end_unix >= w.start_unix => {
                    (since(w.start_unix, w.end_unix), w.end_reason.clone())
                }
                _ => ("-".into(), w.end_reason.clone()),
            };
            vec![
                w.id.clone(),
                or_dash(&s.project),
                or_dash(&s.user),
                or_dash(&s.class),
                shape(s.gpus_per_node, s.nodes),
                state_name(state).into(),
                waited_ran,
                w.preemptions.to_string(),
                list(&w.nodes, ","),
                or_dash(&why),
            ]
        })
        .collect();
    table::render(
        &[
            "ID",
            "PROJECT",
            "USER",
            "CLASS",
            "GPUS",
            "STATE",
            "WAITED/RAN",
            "PREEMPTED",
            "NODES",
            "WHY",
        ],
        &rows,
    )
}

/// An instant and how long ago: `2026-11-29T19:20:00Z (3m12s ago)`, `-` if unset.
fn when(unix: i64, now: i64) -> String {
    if unix <= 0 {
        "-".into()
    } else {
        format!("{} ({} ago)", iso_utc(unix), since(unix, now))
    }
}

/// `allot status`: one `key: value` line each, then why it waits.
pub fn status_text(w: &Workload, now: i64) -> String {
    let s = spec(w);
    let state = w.state();
    let total = u64::from(s.gpus_per_node) * u64::from(s.nodes.max(1));
    let gpus = if s.nodes > 1 {
        format!("{} ({total} in all)", shape(s.gpus_per_node, s.nodes))
    } else {
        total.to_string()
    };
    let min_runtime = if s.min_runtime_s == 0 {
        "0 (preemptible at any time)".into()
    } else {
        exact(s.min_runtime_s)
    };
    let mut lines: Vec<(&str, String)> = vec![
        ("id", w.id.clone()),
        ("project", or_dash(&s.project)),
        ("user", or_dash(&s.user)),
        ("class", or_dash(&s.class)),
        ("state", state_name(state).into()),
        ("gpus", gpus),
    ];
    // Only what was asked for: 0 means allotd's default, which it does not report.
    if s.cpu_per_node > 0 {
        lines.push(("cpus", format!("{} per node", s.cpu_per_node)));
    }
    if s.mem_per_node_gb > 0 {
        lines.push(("memory", format!("{}G per node", s.mem_per_node_gb)));
    }
    lines.extend([
        ("min runtime", min_runtime),
        ("time limit", s.time_limit_s.map_or("none".into(), exact)),
        ("resumable", yes_no(s.resumable).into()),
        ("checkpoint", or_dash(&s.checkpoint_hook)),
        ("priority", s.priority.to_string()),
        ("submitted", when(w.submit_unix, now)),
        ("started", when(w.start_unix, now)),
        ("ended", when(w.end_unix, now)),
        ("end reason", or_dash(&w.end_reason)),
        ("nodes", list(&w.nodes, ", ")),
        ("leases", list(&w.lease_ids, ", ")),
        ("preemptions", w.preemptions.to_string()),
        ("funded", yes_no(w.funded).into()),
        ("command", or_dash(&shell_join(&s.argv))),
    ]);
    let width = lines.iter().map(|(k, _)| k.len()).max().unwrap_or(0) + 1;
    let mut out = String::new();
    for (k, v) in &lines {
        out.push_str(&format!("{:width$} {v}\n", format!("{k}:")));
    }
    if state == WorkloadState::Pending && !w.explanation.trim().is_empty() {
        out.push_str("why:\n");
        for l in w.explanation.trim().lines() {
            out.push_str(&format!("  {l}\n"));
        }
    }
    if !w.history.is_empty() {
        out.push_str("history:\n");
        for l in &w.history {
            // allotd stamps each line with Unix seconds; people read UTC.
            let line = match l
                .split_once(' ')
                .and_then(|(t, rest)| Some((t.parse::<i64>().ok()?, rest)))
            {
                Some((t, rest)) => format!("{} {rest}", crate::duration::iso_utc(t)),
                None => l.clone(),
            };
            out.push_str(&format!("  {line}\n"));
        }
    }
    out
}

/// A fair-share group as JSON.
pub fn group_json(g: &Group) -> Value {
    json!({
        "name": g.name,
        "parent": g.parent,
        "weight": g.weight,
        "share": g.share,
        "entitled_gpu_hours": g.entitled_gpu_hours,
        "served_gpu_hours": g.served_gpu_hours,
        "ratio": g.ratio,
        "running_gpus": g.running_gpus,
        "pending_gpus": g.pending_gpus,
        "project": g.project,
        "depth": g.depth,
    })
}

/// The whole tree as one JSON object.
pub fn tree_json(t: &GetTreeResponse) -> Value {
    json!({
        "window_hours": t.window_hours,
        "capacity_gpus": t.capacity_gpus,
        "groups": t.groups.iter().map(group_json).collect::<Vec<_>>(),
    })
}

/// `allot share`: the window, then the tree, indented by depth.
pub fn share_text(t: &GetTreeResponse) -> String {
    let rows: Vec<Vec<String>> = t
        .groups
        .iter()
        .map(|g| {
            vec![
                format!(
                    "{}{}",
                    "  ".repeat(g.depth.saturating_sub(1) as usize),
                    g.name
                ),
                num(g.weight),
                format!("{:.1}%", g.share * 100.0),
                format!("{:.1}", g.entitled_gpu_hours),
                format!("{:.1}", g.served_gpu_hours),
                format!("{:.2}", g.ratio),
                g.running_gpus.to_string(),
                g.pending_gpus.to_string(),
            ]
        })
        .collect();
    let mut out = format!(
        "window: {}h, capacity: {} GPUs\n",
        num(t.window_hours),
        t.capacity_gpus
    );
    out.push_str(&table::render(
        &[
            "NAME",
            "WEIGHT",
            "SHARE",
            "ENTITLED(gpu-h)",
            "RECEIVED(gpu-h)",
            "RATIO",
            "RUNNING",
            "PENDING",
        ],
        &rows,
    ));
    // The table is the answer to "why am I waiting"; this line is how to read it.
    out.push_str("ratio = received / entitled; at each level the lowest ratio is served first\n");
    out
}

/// One group on one line, after `budget set`.
pub fn group_line(g: &Group) -> String {
    format!(
        "{}: weight {}, share {:.1}%, entitled {:.1} gpu-h, received {:.1} gpu-h, ratio {:.2}",
        g.name,
        num(g.weight),
        g.share * 100.0,
        g.entitled_gpu_hours,
        g.served_gpu_hours,
        g.ratio
    )
}

/// A node as JSON.
pub fn node_json(n: &Node) -> Value {
    json!({
        "name": n.name,
        "cluster": n.cluster,
        "state": n.state,
        "connected": n.connected,
        "gpus": n.gpus,
        "free_gpus": n.free_gpus,
        "cpu": n.cpu,
        "memory_gb": n.memory_gb,
        "verdict": verdict(n.verdict()),
        "lease_ids": n.lease_ids,
        "drain_reason": n.drain_reason,
        "last_seen_unix": n.last_seen_unix,
        "gpu_list": n.gpu_list.iter().map(gpu_json).collect::<Vec<_>>(),
    })
}

/// The `allot nodes` table.
pub fn nodes_table(nodes: &[Node]) -> String {
    let rows: Vec<Vec<String>> = nodes
        .iter()
        .map(|n| {
            vec![
                n.name.clone(),
                or_dash(&n.cluster),
                or_dash(&n.state),
                yes_no(n.connected).into(),
                format!("{}/{}", n.free_gpus, n.gpus),
                verdict(n.verdict()).into(),
                n.lease_ids.len().to_string(),
                or_dash(&n.drain_reason),
            ]
        })
        .collect();
    table::render(
        &[
            "NAME",
            "CLUSTER",
            "STATE",
            "CONNECTED",
            "FREE/GPUS",
            "VERDICT",
            "LEASES",
            "DRAIN",
        ],
        &rows,
    )
}

/// `node gpu-07: draining (operator: swap PSU)`, after a drain or undrain.
pub fn node_line(n: &Node) -> String {
    let mut s = format!("node {}: {}", n.name, or_dash(&n.state));
    if !n.drain_reason.is_empty() {
        s.push_str(&format!(" ({})", n.drain_reason));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use allot_proto::v1::{Gpu, GpuState, HostVerdict};

    const NOW: i64 = 1_795_980_000;

    fn workload(state: WorkloadState) -> Workload {
        Workload {
            id: "17".into(),
            spec: Some(WorkloadSpec {
                project: "vision".into(),
                user: "ana".into(),
                class: "batch".into(),
                gpus_per_node: 8,
                nodes: 2,
                mem_per_node_gb: 64,
                min_runtime_s: 28_800,
                argv: vec![
                    "python".into(),
                    "train.py".into(),
                    "--note".into(),
                    "it's big".into(),
                ],
                ..Default::default()
            }),
            state: state as i32,
            submit_unix: NOW - 192,
            explanation: "project vision is served 1.30× its share;\nneeds 2 whole nodes".into(),
            ..Default::default()
        }
    }

    #[test]
    fn queue_rows_say_how_long_and_why() {
        let mut running = workload(WorkloadState::Running);
        running.id = "18".into();
        running.start_unix = NOW - 3_900;
        running.nodes = vec!["n1".into(), "n2".into()];
        running.preemptions = 1;
        let mut done = workload(WorkloadState::TimedOut);
        done.id = "19".into();
        done.start_unix = NOW - 7_200;
        done.end_unix = NOW - 3_600;
        done.end_reason = "time-limit".into();
        let t = queue_table(&[workload(WorkloadState::Pending), running, done], NOW);
        let lines: Vec<Vec<&str>> = t.lines().map(|l| l.split_whitespace().collect()).collect();
        assert_eq!(lines[0][6], "WAITED/RAN");
        assert_eq!(
            lines[1][..9],
            ["17", "vision", "ana", "batch", "8x2", "pending", "3m12s", "0", "-"]
        );
        assert!(
            t.lines()
                .nth(1)
                .unwrap_or("")
                .ends_with("served 1.30× its share; needs 2 whole nodes"),
            "{t}"
        );
        assert_eq!(
            lines[2],
            ["18", "vision", "ana", "batch", "8x2", "running", "1h05m", "1", "n1,n2", "-"]
        );
        assert_eq!(
            lines[3][5..],
            ["timed-out", "1h00m", "0", "-", "time-limit"]
        );
    }

    #[test]
    fn status_reads_as_key_value_lines_then_why() {
        let t = status_text(&workload(WorkloadState::Pending), NOW);
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines[0], "id:          17");
        assert!(lines.contains(&"gpus:        8x2 (16 in all)"), "{t}");
        assert!(lines.contains(&"memory:      64G per node"), "{t}");
        assert!(lines.contains(&"min runtime: 8h"), "{t}");
        assert!(lines.contains(&"time limit:  none"), "{t}");
        assert!(
            lines.contains(&"submitted:   2026-11-29T19:16:48Z (3m12s ago)"),
            "{t}"
        );
        assert!(lines.contains(&"started:     -"), "{t}");
        assert!(
            lines.contains(&r"command:     python train.py --note 'it'\''s big'"),
            "{t}"
        );
        assert!(!t.contains("cpus:"), "{t}");
        let why = lines.iter().position(|l| *l == "why:").expect("why");
        assert_eq!(
            lines[why + 1..],
            [
                "  project vision is served 1.30× its share;",
                "  needs 2 whole nodes"
            ]
        );
        let running = status_text(&workload(WorkloadState::Running), NOW);
        assert!(!running.contains("why:"), "{running}");
    }

    #[test]
    fn workload_json_has_the_documented_fields() {
        let mut w = workload(WorkloadState::TimedOut);
        w.nodes = vec!["n1".into()];
        let v = workload_json(&w);
        assert_eq!(v["state"], "timed-out");
        assert_eq!(v["time_limit_s"], Value::Null);
        assert_eq!(v["nodes"], 2);
        assert_eq!(v["node_names"][0], "n1");
        assert_eq!(v["mem_per_node_gb"], 64);
        for k in [
            "id",
            "project",
            "user",
            "class",
            "gpus_per_node",
            "cpu_per_node",
            "min_runtime_s",
            "resumable",
            "priority",
            "argv",
            "checkpoint_hook",
            "submit_unix",
            "start_unix",
            "end_unix",
            "end_reason",
            "explanation",
            "lease_ids",
            "preemptions",
            "funded",
        ] {
            assert!(v.get(k).is_some(), "missing {k}");
        }
        // A workload without a spec still renders.
        let bare = Workload::default();
        assert_eq!(workload_json(&bare)["state"], "unknown");
        assert!(queue_table(std::slice::from_ref(&bare), NOW).contains("unknown"));
        assert!(status_text(&bare, NOW).contains("command:"));
    }

    #[test]
    fn share_indents_by_depth_and_rounds_for_people() {
        let t = GetTreeResponse {
            window_hours: 168.0,
            capacity_gpus: 32,
            groups: vec![
                Group {
                    name: "ml".into(),
                    weight: 3.0,
                    share: 0.75,
                    entitled_gpu_hours: 4_032.0,
                    served_gpu_hours: 3_000.456,
                    ratio: 0.7441,
                    running_gpus: 24,
                    pending_gpus: 16,
                    depth: 1,
                    ..Default::default()
                },
                Group {
                    name: "vision".into(),
                    parent: "ml".into(),
                    weight: 0.5,
                    share: 1.0 / 3.0,
                    depth: 2,
                    project: true,
                    ..Default::default()
                },
            ],
        };
        let s = share_text(&t);
        let lines: Vec<&str> = s.lines().collect();
        assert_eq!(lines[0], "window: 168h, capacity: 32 GPUs");
        assert!(
            lines[1].starts_with("NAME      WEIGHT  SHARE  ENTITLED(gpu-h)"),
            "{s}"
        );
        assert_eq!(
            lines[2].split_whitespace().collect::<Vec<_>>(),
            ["ml", "3", "75.0%", "4032.0", "3000.5", "0.74", "24", "16"]
        );
        assert!(lines[3].starts_with("  vision  0.5     33.3%"), "{s}");
        assert!(lines[4].starts_with("ratio = received / entitled"), "{s}");
        let v = tree_json(&t);
        assert_eq!(v["window_hours"], 168.0);
        assert_eq!(v["groups"][1]["parent"], "ml");
        assert_eq!(v["groups"][1]["project"], true);
        assert_eq!(
            group_line(&t.groups[0]),
            "ml: weight 3, share 75.0%, entitled 4032.0 gpu-h, received 3000.5 gpu-h, ratio 0.74"
        );
    }

    #[test]
    fn nodes_show_free_of_total_and_why_drained() {
        let n = Node {
            name: "gpu-07".into(),
            cluster: "a".into(),
            state: "draining".into(),
            connected: true,
            gpus: 8,
            free_gpus: 3,
            verdict: HostVerdict::DrainNow as i32,
            lease_ids: vec!["L-1".into(), "L-2".into()],
            drain_reason: "operator: swap PSU".into(),
            gpu_list: vec![Gpu {
                uuid: "GPU-a".into(),
                state: GpuState::Failed as i32,
                ..Default::default()
            }],
            ..Default::default()
        };
        let t = nodes_table(std::slice::from_ref(&n));
        let row: Vec<&str> = t.lines().nth(1).unwrap_or("").split_whitespace().collect();
        assert_eq!(
            row,
            [
                "gpu-07",
                "a",
                "draining",
                "yes",
                "3/8",
                "drain-now",
                "2",
                "operator:",
                "swap",
                "PSU"
            ]
        );
        assert_eq!(node_line(&n), "node gpu-07: draining (operator: swap PSU)");
        let v = node_json(&n);
        assert_eq!(v["verdict"], "drain-now");
        assert_eq!(v["gpu_list"][0]["state"], "failed");
        let ready = Node {
            name: "gpu-08".into(),
            state: "ready".into(),
            ..Default::default()
        };
        assert_eq!(node_line(&ready), "node gpu-08: ready");
        assert_eq!(node_json(&ready)["verdict"], "unknown");
    }

    #[test]
    fn small_helpers() {
        assert_eq!(gpu_count(1, 1), "1 GPU");
        assert_eq!(gpu_count(4, 1), "4 GPUs");
        assert_eq!(gpu_count(8, 2), "16 GPUs on 2 nodes");
        assert_eq!(num(168.0), "168");
        assert_eq!(num(2.5), "2.5");
        assert_eq!(num(1.0 / 3.0), "0.33");
        assert_eq!(num(0.0), "0");
        assert_eq!(
            shell_join(&["a".into(), String::new(), "b c".into()]),
            "a '' 'b c'"
        );
    }
}
