//! How allotd's answers read: JSON objects (the generated types do not derive
//! `Serialize`) and terminal text.
//!
//! Times come as Unix seconds with 0 for "never"; every age shown is computed from
//! them here, and one that cannot be known reads `-` rather than a wrong `0s`.

use crate::duration::{age, exact, iso_utc};
use crate::health_view::{drain_info_json, drain_line, drain_who, gpu_json, verdict};
use crate::table::{self, or_dash};
use allot_proto::v1::{GetTreeResponse, Group, Node, Workload, WorkloadSpec, WorkloadState};
use serde_json::{json, Value};
use std::sync::LazyLock;

/// What a workload without a spec reads as; allotd always sends one.
static NO_SPEC: LazyLock<WorkloadSpec> = LazyLock::new(WorkloadSpec::default);

fn spec(w: &Workload) -> &WorkloadSpec {
    w.spec.as_ref().unwrap_or(&NO_SPEC)
}

pub use allot_proto::names::{forecast_words, workload_state as state_name};

/// Whether a workload in this state is over for good (no run, no requeue ahead).
pub fn is_final(s: WorkloadState) -> bool {
    !matches!(
        s,
        WorkloadState::Pending | WorkloadState::Running | WorkloadState::Unspecified
    )
}

/// The status a command that waited for the workload exits with, as `srun` passes
/// its job's: the job's own exit status; 128 + N when signal N ended it; and for
/// ends with no status of the job's own: 124 timed out (as `timeout`), 130 cancelled
/// (as an interrupt), 75 preempted or its node lost without requeue (`EX_TEMPFAIL`:
/// try again), 1 for any other failure. 0 only for a completed job.
pub fn exit_status(w: &Workload) -> u8 {
    let signalled = |s: i32| u8::try_from(128 + s.clamp(1, 127)).unwrap_or(255);
    match w.state() {
        WorkloadState::Completed => 0,
        WorkloadState::TimedOut => 124,
        WorkloadState::Cancelled => 130,
        WorkloadState::Preempted => 75,
        _ => match (w.exit_code, w.signal) {
            (_, Some(s)) => signalled(s),
            // A status is 0-255 on Unix; a non-zero one never reads as success.
            (Some(c), None) => u8::try_from(c & 0xff).ok().filter(|c| *c != 0).unwrap_or(1),
            (None, None) if w.end_reason == "node-lost" => 75,
            (None, None) => 1,
        },
    }
}

/// The contract a workload got, as one sentence: how long it is protected, what a
/// preemption does to it, and its time limit; free occupancy says how to ask for more.
pub fn contract_text(w: &Workload) -> String {
    let s = spec(w);
    let min = s.min_runtime_s.unwrap_or(0);
    let after = match (s.no_requeue, s.resumable) {
        (true, _) => "ends as preempted, not requeued (--no-requeue)".to_string(),
        (false, true) if s.checkpoint_hook.is_empty() => {
            "is asked to checkpoint (SIGTERM, then SIGKILL after the grace) and requeued, resuming from its checkpoint".into()
        }
        (false, true) => format!(
            "is asked to checkpoint ({}) and requeued, resuming from its checkpoint",
            s.checkpoint_hook
        ),
        (false, false) => "is requeued and restarts from the beginning".into(),
    };
    let mut text = if min == 0 {
        let hint = if s.resumable {
            "add --min-runtime to be protected"
        } else {
            "add --min-runtime or --resumable"
        };
        format!("free occupancy: may be preempted at any time, and then {after}; {hint}")
    } else {
        format!(
            "protected for {}; after that, if preempted, it {after}",
            exact(min)
        )
    };
    match s.time_limit_s {
        Some(t) => text.push_str(&format!("; ends at its time limit, {}", exact(t))),
        None => text.push_str("; no time limit"),
    }
    if !s.class.is_empty() {
        text.push_str(&format!(" (class {})", s.class));
    }
    text
}

/// One line for `allot watch` and `submit --wait`: where the workload is now.
pub fn watch_line(w: &Workload) -> String {
    let state = w.state();
    let run = w.runs.len();
    let what = match state {
        WorkloadState::Pending if run > 0 => format!(
            "pending again after run {run} ({}): {}",
            or_dash(&w.end_reason),
            first_line(&w.explanation)
        ),
        WorkloadState::Pending => format!("pending: {}", first_line(&w.explanation)),
        WorkloadState::Running => format!(
            "running on {} (run {run}, lease {})",
            list(&w.nodes, ","),
            w.lease_ids.last().map_or("-", String::as_str)
        ),
        s => format!(
            "{} ({}), exit status {}",
            state_name(s),
            w.runs
                .last()
                .map_or_else(|| or_dash(&w.end_reason), run_end),
            exit_status(w)
        ),
    };
    format!("workload {}: {what}", w.id)
}

fn first_line(s: &str) -> String {
    or_dash(s.trim().lines().next().unwrap_or("").trim())
}

/// How many times the workload went back to the queue: each run that ended and
/// was followed by another, or by waiting again.
pub fn requeues(w: &Workload) -> usize {
    let ended = w.runs.iter().filter(|r| r.end_unix != 0).count();
    match w.state() {
        WorkloadState::Pending => ended,
        _ => w.runs.len().saturating_sub(1).min(ended),
    }
}

/// One run as JSON.
fn run_json(r: &allot_proto::v1::Run) -> Value {
    json!({
        "run": r.number,
        "lease_id": r.lease_id,
        "nodes": r.nodes,
        "gpus": r.gpus,
        "start_unix": r.start_unix,
        "end_unix": r.end_unix,
        "end_reason": r.end_reason,
        "exit_code": r.exit_code,
        "exit_signal": r.signal,
        "detail": r.detail,
        "idle_since_unix": (r.idle_since_unix > 0).then_some(r.idle_since_unix),
        "gpu_util_pct": r.gpu_util_pct,
    })
}

/// Whether a running run uses its GPUs, as its host last said: `idle for 1h12m
/// (since 14:02), GPUs at 0%`, `in use, GPUs at 85%`; `None` before any word.
fn gpu_use(r: &allot_proto::v1::Run, now: i64) -> Option<String> {
    if r.end_unix != 0 {
        return None;
    }
    let util = r.gpu_util_pct?;
    Some(if r.idle_since_unix > 0 {
        format!(
            "idle for {} (since {}), GPUs at {util}%",
            since(r.idle_since_unix, now),
            when(r.idle_since_unix, now)
        )
    } else {
        format!("in use, GPUs at {util}%")
    })
}

/// How one run ended, for a person: `exited 3`, `killed by signal 9`, `preempted`.
fn run_end(r: &allot_proto::v1::Run) -> String {
    match (r.end_unix, r.exit_code, r.signal) {
        (0, _, _) => "running".into(),
        (_, _, Some(s)) => format!("{} (killed by signal {s})", r.end_reason),
        (_, Some(c), None) => format!("{} (exit {c})", r.end_reason),
        _ => or_dash(&r.end_reason),
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

/// An argv as a shell would take it back (shlex's quoting), so that what `allot
/// status` shows can be pasted; an argument no shell can hold (a NUL) is shown bare.
fn shell_join(argv: &[String]) -> String {
    shlex::try_join(argv.iter().map(String::as_str)).unwrap_or_else(|_| argv.join(" "))
}

/// A list for one text cell, `-` when empty.
fn list(items: &[String], sep: &str) -> String {
    or_dash(&items.join(sep))
}

/// The warning asked for before the time limit, as `--signal` takes it (`USR2@5m`);
/// empty: none.
fn warning(s: &WorkloadSpec) -> String {
    if s.warn_signal.is_empty() {
        String::new()
    } else {
        format!("{}@{}", s.warn_signal, exact(s.warn_before_s))
    }
}

/// A workload as JSON.
pub fn workload_json(w: &Workload) -> Value {
    let s = spec(w);
    let mut v = json!({
        "id": w.id,
        "name": s.name,
        "project": s.project,
        "user": s.user,
        "class": s.class,
        "gpus_per_node": s.gpus_per_node,
        "nodes": s.nodes,
        "cpu_per_node": s.cpu_per_node,
        "mem_per_node_gb": s.mem_per_node_gb,
        "min_runtime_s": s.min_runtime_s.unwrap_or(0),
        "time_limit_s": s.time_limit_s,
        "resumable": s.resumable,
        "priority": s.priority,
        "argv": s.argv,
        "checkpoint_hook": s.checkpoint_hook,
        "signal": warning(s),
        "no_requeue": s.no_requeue,
        "cwd": s.cwd,
        "output": s.output,
        "error": s.error,
        "state": state_name(w.state()),
        "submit_unix": w.submit_unix,
        "start_unix": w.start_unix,
        "end_unix": w.end_unix,
        "end_reason": w.end_reason,
        "explanation": w.explanation,
        "lease_ids": w.lease_ids,
        "node_names": w.nodes,
        "preemptions": w.preemptions,
        "requeues": requeues(w),
        "history": w.history,
        "funded": w.funded,
        "exit_code": w.exit_code,
        "exit_signal": w.signal,
        "exit_status": is_final(w.state()).then(|| exit_status(w)),
        "runs": w.runs.iter().map(run_json).collect::<Vec<_>>(),
    });
    let forecast = json!({
        "p50_unix": w.forecast_p50_unix,
        "p90_unix": w.forecast_p90_unix,
        "at_unix": w.forecast_at_unix,
        "horizon_s": w.forecast_horizon_s,
    });
    v["forecast"] = if w.forecast_at_unix > 0 {
        forecast
    } else {
        Value::Null
    };
    // Past json!'s recursion limit in one literal: the gates and the array apart.
    let gates = json!({
        "array_id": (!w.array_id.is_empty()).then_some(&w.array_id),
        "array_index": (!w.array_id.is_empty()).then_some(w.array_index),
        "gate": w.gate,
        "dependencies": s.dependencies.iter().map(|d| format!("{}:{}", d.kind, d.id)).collect::<Vec<_>>(),
        "singleton": s.singleton,
        "begin_unix": s.begin_unix,
        "held": s.hold,
        "script": s.has_script,
    });
    if let (Some(m), Value::Object(g)) = (v.as_object_mut(), gates) {
        m.extend(g);
    }
    v
}

/// How far ahead of this host's clock allotd's may run before an age is unknown.
const CLOCK_SKEW_S: i64 = 60;

/// Seconds from `from` to `to` for an age cell; `-` when `from` is unset (0: a
/// workload that never started, or a start allotd did not keep) or later than `to`
/// by more than clock skew explains.
fn since(from: i64, to: i64) -> String {
    if from <= 0 || to <= 0 || to.saturating_add(CLOCK_SKEW_S) < from {
        "-".into()
    } else {
        age(u64::try_from(to.saturating_sub(from)).unwrap_or(0))
    }
}

/// The explanation on one line, for a table cell.
fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// The `allot queue` table.
pub fn queue_table(workloads: &[Workload], now: i64) -> String {
    // An array's pending elements fold into one line (`12_[3-99]`), as squeue
    // folds them; its running and ended elements keep a line each.
    let mut rows: Vec<Vec<String>> = Vec::new();
    let mut folded: std::collections::BTreeMap<&str, usize> = std::collections::BTreeMap::new();
    let mut counts: Vec<(u32, u32, u32)> = Vec::new();
    for w in workloads {
        let pending = w.state() == WorkloadState::Pending;
        if pending && !w.array_id.is_empty() {
            if let Some(&row) = folded.get(w.array_id.as_str()) {
                let (lo, hi, n) = &mut counts[row];
                *lo = (*lo).min(w.array_index);
                *hi = (*hi).max(w.array_index);
                *n += 1;
                continue;
            }
            folded.insert(&w.array_id, rows.len());
        }
        counts.push((w.array_index, w.array_index, 1));
        rows.push(queue_row(w, now));
    }
    for (array, row) in folded {
        let (lo, hi, n) = counts[row];
        let r = &mut rows[row];
        r[0] = if lo == hi {
            format!("{array}_{lo}")
        } else {
            format!("{array}_[{lo}-{hi}]")
        };
        if n > 1 {
            r[12] = format!("{n} pending: {}", r[12]);
        }
    }
    table::render(
        &[
            "ID",
            "NAME",
            "PROJECT",
            "USER",
            "CLASS",
            "GPUS",
            "STATE",
            "RUN",
            "WAITED/RAN",
            "START",
            "PREEMPTED",
            "NODES",
            "WHY",
        ],
        &rows,
    )
}

/// One line of `allot queue`.
fn queue_row(w: &Workload, now: i64) -> Vec<String> {
    let s = spec(w);
    let state = w.state();
    let (waited_ran, why) = match state {
        WorkloadState::Pending => (since(w.submit_unix, now), one_line(&w.explanation)),
        WorkloadState::Running => (since(w.start_unix, now), String::new()),
        // Finished: how long the last run took, and how it ended, in the
        // words of whoever ended it.
        _ => (
            since(w.start_unix, w.end_unix),
            w.runs
                .last()
                .filter(|r| !r.detail.is_empty())
                .map_or_else(|| w.end_reason.clone(), |r| r.detail.clone()),
        ),
    };
    let id = if w.array_id.is_empty() {
        w.id.clone()
    } else {
        format!("{}_{}", w.array_id, w.array_index)
    };
    vec![
        id,
        or_dash(&s.name),
        or_dash(&s.project),
        or_dash(&s.user),
        or_dash(&s.class),
        shape(s.gpus_per_node, s.nodes),
        state_name(state).into(),
        w.runs.len().to_string(),
        waited_ran,
        forecast_short(w, now),
        w.preemptions.to_string(),
        list(&w.nodes, ","),
        or_dash(&why),
    ]
}

/// The forecast as `allot queue` shows it: `~40m00s/2h05m` (about / at most),
/// `now`, `>14d00h` past the horizon, `-` with none.
fn forecast_short(w: &Workload, now: i64) -> String {
    if w.state() != WorkloadState::Pending || w.forecast_at_unix == 0 {
        return "-".into();
    }
    let wait = |t: i64| allot_units::format_duration(t.saturating_sub(now).max(0) as u64);
    let beyond = format!(">{}", allot_units::format_duration(w.forecast_horizon_s));
    match (w.forecast_p50_unix, w.forecast_p90_unix) {
        (a, b) if a > 0 && b > 0 && b <= now + 60 => "now".into(),
        (a, b) if a > 0 && b > 0 => format!("~{}/{}", wait(a), wait(b)),
        (a, _) if a > 0 => format!("~{}/{beyond}", wait(a)),
        _ => beyond,
    }
}

/// An instant and how long ago: `2026-11-29T19:20:00Z (3m12s ago)`, `-` if unset.
fn when(unix: i64, now: i64) -> String {
    if unix <= 0 {
        "-".into()
    } else {
        match since(unix, now).as_str() {
            "-" => iso_utc(unix),
            ago => format!("{} ({ago} ago)", iso_utc(unix)),
        }
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
    let min_runtime = match s.min_runtime_s.unwrap_or(0) {
        0 => "0 (preemptible at any time)".into(),
        m => exact(m),
    };
    // What preemption does to it: the contract's other half.
    let requeue = match (s.no_requeue, s.resumable) {
        (true, _) => "no: ends as preempted (--no-requeue)",
        (false, true) => "yes, resumes from its checkpoint",
        (false, false) => "yes, starts over (not --resumable)",
    };
    let mut lines: Vec<(&str, String)> = vec![
        ("id", w.id.clone()),
        ("name", or_dash(&s.name)),
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
    if !w.array_id.is_empty() {
        lines.push((
            "array",
            format!(
                "{}_{} (array {}, index {})",
                w.array_id, w.array_index, w.array_id, w.array_index
            ),
        ));
    }
    if !s.dependencies.is_empty() || s.singleton {
        let mut deps: Vec<String> = s
            .dependencies
            .iter()
            .map(|d| format!("{}:{}", d.kind, d.id))
            .collect();
        if s.singleton {
            deps.push("singleton".into());
        }
        lines.push(("dependencies", deps.join(",")));
    }
    if s.begin_unix > 0 {
        lines.push(("begin", when(s.begin_unix, now)));
    }
    if s.hold {
        lines.push(("held", "yes (allot release lets it go)".into()));
    }
    if s.has_script {
        lines.push((
            "script",
            "a batch script, run by its #! line; its arguments are the command's".into(),
        ));
    }
    lines.extend([
        ("min runtime", min_runtime),
        ("time limit", s.time_limit_s.map_or("none".into(), exact)),
        ("resumable", yes_no(s.resumable).into()),
        ("requeue", requeue.into()),
        ("checkpoint", or_dash(&s.checkpoint_hook)),
        ("warning", or_dash(&warning(s))),
        ("priority", s.priority.to_string()),
        ("submitted", when(w.submit_unix, now)),
        ("started", when(w.start_unix, now)),
    ]);
    if let Some(f) = forecast_words(w, now) {
        lines.push((
            "may start",
            format!("{f} (forecast {})", when(w.forecast_at_unix, now)),
        ));
    }
    // How a run ended belongs to final workloads; a live one that shows one was
    // requeued, and `end reason: node-lost` beside `state: running` read as a contradiction.
    if is_final(state) {
        lines.extend([
            ("ended", when(w.end_unix, now)),
            ("ran", since(w.start_unix, w.end_unix)),
            ("end reason", or_dash(&w.end_reason)),
            ("exit status", exit_status(w).to_string()),
        ]);
    } else if !w.end_reason.is_empty() {
        lines.push(("last run ended", w.end_reason.clone()));
    }
    lines.extend([
        ("nodes", list(&w.nodes, ", ")),
        ("leases", list(&w.lease_ids, ", ")),
        ("preemptions", w.preemptions.to_string()),
        // Every end that put it back in the queue: preemptions, drains, lost nodes
        // and GPUs, refusals (`preemptions` counts the fair-share ones).
        ("requeued", requeues(w).to_string()),
        ("funded", yes_no(w.funded).into()),
    ]);
    if let Some(u) = w.runs.last().and_then(|r| gpu_use(r, now)) {
        lines.push(("gpus", u));
    }
    lines.extend([
        ("command", or_dash(&shell_join(&s.argv))),
        ("directory", or_dash(&s.cwd)),
    ]);
    let width = lines.iter().map(|(k, _)| k.len()).max().unwrap_or(0) + 1;
    let mut out = String::new();
    for (k, v) in &lines {
        out.push_str(&format!("{:width$} {v}\n", format!("{k}:")));
    }
    if !w.runs.is_empty() {
        out.push_str("runs:\n");
        let rows: Vec<Vec<String>> = w
            .runs
            .iter()
            .map(|r| {
                let ran_to = if r.end_unix == 0 { now } else { r.end_unix };
                vec![
                    r.number.to_string(),
                    r.lease_id.clone(),
                    list(&r.nodes, ","),
                    r.gpus.to_string(),
                    if r.start_unix == 0 {
                        "-".into()
                    } else {
                        iso_utc(r.start_unix)
                    },
                    since(r.start_unix, ran_to),
                    run_end(r),
                ]
            })
            .collect();
        let headers = ["RUN", "LEASE", "NODES", "GPUS", "STARTED", "RAN", "END"];
        for l in table::render(&headers, &rows).lines() {
            out.push_str(&format!("  {l}\n"));
        }
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
        "counted_gpu_hours": g.counted_gpu_hours,
        "fair_gpu_hours": g.fair_gpu_hours,
        "gpu_util": g.gpu_util,
    })
}

/// The whole tree as one JSON object.
pub fn tree_json(t: &GetTreeResponse) -> Value {
    json!({
        "window_hours": t.window_hours,
        "capacity_gpus": t.capacity_gpus,
        "weighted_capacity_gpus": t.weighted_capacity_gpus,
        "covered_hours": t.covered_hours,
        "horizon_hours": t.horizon_hours,
        "ranking_window_hours": t.ranking_window_hours,
        "drf": t.drf,
        "groups": t.groups.iter().map(group_json).collect::<Vec<_>>(),
    })
}

/// `allot share`: the window, then the tree, indented by depth, with both sides of
/// every ratio so that a manager can recompute it from the row. One rule of
/// precision per kind: GPU-hours to 0.1, ratios to 0.01, shares to 0.1 %.
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
                g.running_gpus.to_string(),
                format!("{:.1}", g.counted_gpu_hours),
                format!("{:.1}", g.fair_gpu_hours),
                format!("{:.2}", g.ratio),
                g.pending_gpus.to_string(),
                g.gpu_util
                    .map_or_else(|| "-".into(), |u| format!("{:.0}%", u * 100.0)),
            ]
        })
        .collect();
    let h = |x: f64| format!("{}h", num(x));
    // Budgets and ratios count GPUs weighted by type; say so where that differs.
    let weighted = t.weighted_capacity_gpus;
    let (capacity, cap) = if weighted > 0.0 && (weighted - f64::from(t.capacity_gpus)).abs() > 1e-9
    {
        (
            format!(
                "{} GPUs ({} weighted by type)",
                t.capacity_gpus,
                num(weighted)
            ),
            format!("{} weighted GPUs", num(weighted)),
        )
    } else {
        (
            format!("{} GPUs", t.capacity_gpus),
            format!("{} GPUs", t.capacity_gpus),
        )
    };
    let mut out = format!(
        "window: {}, capacity: {capacity}, history covered: {}, horizon: {}\n",
        h(t.window_hours),
        h(t.covered_hours),
        h(t.horizon_hours)
    );
    out.push_str(&table::render(
        &[
            "NAME", "WEIGHT", "SHARE", "BUDGET", "RECEIVED", "RUNNING", "COUNTED", "FAIR", "RATIO",
            "PENDING", "GPU_USE",
        ],
        &rows,
    ));
    // The table is the answer to "why am I waiting"; these lines are how to read it.
    let counted_from = if t.ranking_window_hours > 0.0 {
        format!(
            "usage over the ratio's own {} memory (policy.ranking_lookback, not RECEIVED)",
            h(t.ranking_window_hours)
        )
    } else {
        "RECEIVED".to_string()
    };
    let drf = if t.drf {
        " (the dominant share of GPU, CPU and memory, in GPU-hours)"
    } else {
        ""
    };
    out.push_str(&format!(
        "GPU-hours. BUDGET = SHARE × {cap} × {w}; RECEIVED = usage in the window.\n\
         RATIO = COUNTED / FAIR, lowest served first at each level:\n  \
         COUNTED = {counted_from} + RUNNING × {hz}{drf}\n  \
         FAIR = SHARE × {cap} × ({cov} covered + {hz})\n\
         GPU_USE = how busy the RUNNING GPUs are, by their hosts' last word.\n",
        w = h(t.window_hours),
        hz = h(t.horizon_hours),
        cov = h(t.covered_hours),
    ));
    out
}

/// One group on one line, after `budget set`.
pub fn group_line(g: &Group) -> String {
    format!(
        "{}: weight {}, share {:.1}%, budget {:.1} gpu-h, received {:.1} gpu-h, ratio {:.2}",
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
        "gpu_type": n.gpu_type,
        "features": n.features,
        "state": n.state,
        "connected": n.connected,
        "gpus": n.gpus,
        "free_gpus": n.free_gpus,
        "cpu": n.cpu,
        "memory_gb": n.memory_gb,
        "verdict": verdict(n.verdict()),
        "lease_ids": n.lease_ids,
        "leaving_lease_ids": n.leaving_lease_ids,
        "refused_gpus": n.refused_gpus,
        "drain_reason": n.drain_reason,
        "drains": n.drains.iter().map(drain_info_json).collect::<Vec<_>>(),
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
                or_dash(&n.gpu_type),
                or_dash(&n.features.join(",")),
                or_dash(&n.state),
                yes_no(n.connected).into(),
                format!("{}/{}", n.free_gpus, n.gpus),
                verdict(n.verdict()).into(),
                leases_cell(n),
                drain_cell(n),
            ]
        })
        .collect();
    table::render(
        &[
            "NAME",
            "CLUSTER",
            "TYPE",
            "FEATURES",
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

/// The LEASES cell: leases running, and ended leases whose part here is still being
/// stopped (`2 +1 ending`): their GPUs are not free yet.
fn leases_cell(n: &Node) -> String {
    match n.leaving_lease_ids.len() {
        0 => n.lease_ids.len().to_string(),
        k => format!("{} +{k} ending", n.lease_ids.len()),
    }
}

/// The DRAIN cell: the first drain in force (else the first held one), its kind and
/// reason, and how many more there are: `health (xid:79 on 0000:3b:00) +1`; on a node
/// without a drain, a refusal it is remembered for (`refused 8+ GPUs`).
fn drain_cell(n: &Node) -> String {
    let Some(first) = n.drains.iter().find(|d| !d.held).or(n.drains.first()) else {
        if n.refused_gpus > 0 && n.drain_reason.is_empty() {
            return format!("refused {}+ GPUs", n.refused_gpus);
        }
        // allotd before drains were listed: its one line.
        return or_dash(&n.drain_reason);
    };
    let mut s = drain_who(first);
    if first.held {
        s.push_str(" [held]");
    }
    if n.drains.len() > 1 {
        s.push_str(&format!(" +{}", n.drains.len() - 1));
    }
    s
}

/// `node gpu-07: draining`, then one line per drain, after a drain or undrain.
pub fn node_line(n: &Node) -> String {
    let mut s = format!("node {}: {}", n.name, or_dash(&n.state));
    if n.drains.is_empty() {
        if !n.drain_reason.is_empty() {
            s.push_str(&format!(" ({})", n.drain_reason));
        }
        return s;
    }
    for d in &n.drains {
        s.push_str(&format!("\n  {}", drain_line(d)));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use allot_proto::v1::{DrainInfo, Gpu, GpuState, HostVerdict};

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
                min_runtime_s: Some(28_800),
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
        let mut named = workload(WorkloadState::Failed);
        named.id = "20".into();
        if let Some(s) = named.spec.as_mut() {
            s.name = "sweep-lr".into();
        }
        named.start_unix = NOW - 600;
        named.end_unix = NOW - 540;
        named.end_reason = "failed".into();
        named.runs = vec![allot_proto::v1::Run {
            number: 1,
            end_unix: NOW - 540,
            end_reason: "failed".into(),
            detail: "failed-to-start (cannot start \"python\": No such file or directory) on n1"
                .into(),
            ..Default::default()
        }];
        let mut pending = workload(WorkloadState::Pending);
        (
            pending.forecast_at_unix,
            pending.forecast_p50_unix,
            pending.forecast_p90_unix,
            pending.forecast_horizon_s,
        ) = (NOW - 10, NOW + 2_400, NOW + 7_500, 14 * 86_400);
        let status = status_text(&pending, NOW);
        assert!(
            status.contains("may start:   about 40m00s, at most 2h05m (forecast"),
            "{status}"
        );
        let t = queue_table(&[pending, running, done, named], NOW);
        // Every column, with a name and a run number; a failed start says why and
        // pending work when it may start.
        expect_test::expect![[r#"
            ID  NAME      PROJECT  USER  CLASS  GPUS  STATE      RUN  WAITED/RAN  START          PREEMPTED  NODES  WHY
            17  -         vision   ana   batch  8x2   pending    0    3m12s       ~40m00s/2h05m  0          -      project vision is served 1.30× its share; needs 2 whole nodes
            18  -         vision   ana   batch  8x2   running    0    1h05m       -              1          n1,n2  -
            19  -         vision   ana   batch  8x2   timed-out  0    1h00m       -              0          -      time-limit
            20  sweep-lr  vision   ana   batch  8x2   failed     1    1m00s       -              0          -      failed-to-start (cannot start "python": No such file or directory) on n1
        "#]].assert_eq(&t);

        // Cancelled while pending: it never ran.
        let mut never = workload(WorkloadState::Cancelled);
        never.end_unix = NOW;
        assert!(status_text(&never, NOW).contains("ran:         -\n"));
    }

    #[test]
    fn requeues_count_every_end_that_went_back_to_the_queue() {
        let run = |end: i64| allot_proto::v1::Run {
            end_unix: end,
            ..Default::default()
        };
        let mut w = workload(WorkloadState::Pending);
        w.runs = vec![run(NOW - 60), run(NOW - 10)];
        assert_eq!(requeues(&w), 2, "a drain and a lost node, then waiting");
        let mut w = workload(WorkloadState::Running);
        w.runs = vec![run(NOW - 60), run(0)];
        assert_eq!(requeues(&w), 1);
        let mut w = workload(WorkloadState::Completed);
        w.runs = vec![run(NOW)];
        assert_eq!(requeues(&w), 0);
        assert!(status_text(&w, NOW).contains("requeued:"));
    }

    #[test]
    fn ages_without_a_start_are_unknown_not_zero() {
        let mut w = workload(WorkloadState::Running);
        w.start_unix = 0;
        let row = queue_table(std::slice::from_ref(&w), NOW);
        let cells: Vec<&str> = row
            .lines()
            .nth(1)
            .unwrap_or("")
            .split_whitespace()
            .collect();
        assert_eq!(cells[8], "-", "{row}");
        // A start in the future beyond clock skew is unknown; within it, 0s.
        w.start_unix = NOW + 3_600;
        assert_eq!(since(w.start_unix, NOW), "-");
        assert_eq!(since(NOW + 5, NOW), "0s");
        assert_eq!(since(NOW - 65, NOW), "1m05s");
        // Finished without an end time.
        assert_eq!(since(NOW - 65, 0), "-");
        assert_eq!(when(NOW + 3_600, NOW), "2026-11-29T20:20:00Z");
    }

    #[test]
    fn the_contract_says_what_preemption_does() {
        let mut w = workload(WorkloadState::Pending);
        assert!(status_text(&w, NOW).contains("requeue:     yes, starts over (not --resumable)\n"));
        if let Some(s) = w.spec.as_mut() {
            s.resumable = true;
        }
        assert!(status_text(&w, NOW).contains("requeue:     yes, resumes from its checkpoint\n"));
        if let Some(s) = w.spec.as_mut() {
            s.no_requeue = true;
        }
        assert!(
            status_text(&w, NOW).contains("requeue:     no: ends as preempted (--no-requeue)\n")
        );
        assert_eq!(workload_json(&w)["no_requeue"], true);
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
            "cwd",
            "output",
            "error",
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
    fn share_says_where_a_ratio_remembers_more_and_drf() {
        let t = GetTreeResponse {
            window_hours: 168.0,
            capacity_gpus: 32,
            covered_hours: 168.0,
            horizon_hours: 1.0,
            ranking_window_hours: 720.0,
            drf: true,
            weighted_capacity_gpus: 40.0,
            groups: vec![Group {
                name: "ml".into(),
                weight: 3.0,
                share: 0.75,
                entitled_gpu_hours: 4_032.0,
                served_gpu_hours: 3_000.456,
                ratio: 0.7441,
                depth: 1,
                ..Default::default()
            }],
        };
        let s = share_text(&t);
        assert!(
            s.contains("COUNTED = usage over the ratio's own 720h memory (policy.ranking_lookback, not RECEIVED) + RUNNING × 1h (the dominant share of GPU, CPU and memory, in GPU-hours)"),
            "{s}"
        );
        assert!(
            s.starts_with("window: 168h, capacity: 32 GPUs (40 weighted by type),"),
            "{s}"
        );
        assert!(
            s.contains("BUDGET = SHARE × 40 weighted GPUs × 168h"),
            "{s}"
        );
        let v = tree_json(&t);
        assert_eq!(v["ranking_window_hours"], 720.0);
        assert_eq!(v["weighted_capacity_gpus"], 40.0);
        assert_eq!(
            group_line(&t.groups[0]),
            "ml: weight 3, share 75.0%, budget 4032.0 gpu-h, received 3000.5 gpu-h, ratio 0.74"
        );
    }

    #[test]
    fn nodes_show_every_drain_with_its_author() {
        let drain = |by: &str, author: &str, reason: &str, held: bool| DrainInfo {
            by: by.into(),
            author: author.into(),
            reason: reason.into(),
            now: false,
            since_unix: NOW,
            held,
        };
        let n = Node {
            name: "gpu-07".into(),
            state: "draining".into(),
            drain_reason: "health: xid:79".into(),
            drains: vec![
                drain("health", "gpu-07", "xid:79 on 0000:3b:00", true),
                drain("cluster-operator", "allotd", "swap PSU", false),
                drain("local-operator", "alice", "rack work", false),
            ],
            ..Default::default()
        };
        let t = nodes_table(std::slice::from_ref(&n));
        // The first drain in force leads; the held one is counted.
        assert!(
            t.lines()
                .nth(1)
                .unwrap_or("")
                .ends_with("cluster-operator allotd: swap PSU +2"),
            "{t}"
        );
        assert_eq!(
            node_line(&n),
            "node gpu-07: draining\n  \
             held by allotd's circuit breaker, not in force: health (xid:79 on 0000:3b:00) since 2026-11-29T19:20:00Z, at min-runtime lapse\n  \
             drained by cluster-operator allotd: swap PSU since 2026-11-29T19:20:00Z, at min-runtime lapse\n  \
             drained by local-operator alice: rack work since 2026-11-29T19:20:00Z, at min-runtime lapse"
        );
        let v = node_json(&n);
        assert_eq!(v["drains"][0]["held"], true);
        assert_eq!(v["drains"][2]["author"], "alice");
        let mut only_held = n.clone();
        only_held.drains.truncate(1);
        assert!(nodes_table(&[only_held]).contains("health (xid:79 on 0000:3b:00) [held]"));
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
                "-",
                "-",
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
