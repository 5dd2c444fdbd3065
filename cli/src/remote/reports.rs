//! How `allot history` and `allot usage` read: a table, one JSON array, or CSV with
//! a header (for spreadsheets and `sacct --parsable` habits).

use crate::duration::{age, iso_utc};
use crate::table::{self, or_dash};
use allot_proto::v1::{HistoryRun, UsageResponse, UsageRow};
use serde_json::{json, Value};

fn time(t: i64) -> String {
    if t <= 0 {
        String::new()
    } else {
        iso_utc(t)
    }
}

fn id(r: &HistoryRun) -> String {
    if r.array_id.is_empty() {
        r.workload_id.clone()
    } else {
        format!("{}_{}", r.array_id, r.array_index)
    }
}

fn exit(r: &HistoryRun) -> String {
    match (r.exit_code, r.signal) {
        (Some(c), _) => c.to_string(),
        (None, Some(s)) => format!("signal {s}"),
        _ => String::new(),
    }
}

/// One run as JSON.
pub fn run_json(r: &HistoryRun) -> Value {
    json!({
        "workload_id": r.workload_id,
        "run": r.run,
        "lease_id": r.lease_id,
        "array_id": (!r.array_id.is_empty()).then_some(&r.array_id),
        "array_index": (!r.array_id.is_empty()).then_some(r.array_index),
        "user": r.user,
        "project": r.project,
        "class": r.class,
        "name": r.name,
        "nodes": r.nodes,
        "gpus": r.gpus,
        "start_unix": r.start_unix,
        "end_unix": r.end_unix,
        "state": r.state,
        "end_reason": r.end_reason,
        "revoked": r.revoked,
        "exit_code": r.exit_code,
        "signal": r.signal,
        "detail": r.detail,
        "funded": r.funded,
        "gpu_hours": r.gpu_hours,
    })
}

const RUN_HEADERS: [&str; 13] = [
    "ID",
    "RUN",
    "NAME",
    "USER",
    "PROJECT",
    "GPUS",
    "NODES",
    "START",
    "END",
    "ELAPSED",
    "STATE",
    "EXIT",
    "GPU_HOURS",
];

fn run_cells(r: &HistoryRun) -> Vec<String> {
    let elapsed = match (r.start_unix, r.end_unix) {
        (s, e) if s > 0 && e >= s => age(u64::try_from(e - s).unwrap_or(0)),
        _ => String::new(),
    };
    vec![
        id(r),
        r.run.to_string(),
        r.name.clone(),
        r.user.clone(),
        r.project.clone(),
        r.gpus.to_string(),
        r.nodes.join(","),
        time(r.start_unix),
        time(r.end_unix),
        elapsed,
        if r.revoked.is_empty() || r.state == r.revoked {
            r.state.clone()
        } else {
            format!("{} ({})", r.state, r.revoked)
        },
        exit(r),
        format!("{:.2}", r.gpu_hours),
    ]
}

/// The history table.
pub fn runs_table(runs: &[HistoryRun]) -> String {
    let rows: Vec<Vec<String>> = runs
        .iter()
        .map(|r| run_cells(r).into_iter().map(|c| or_dash(&c)).collect())
        .collect();
    table::render(&RUN_HEADERS, &rows)
}

/// One CSV field, quoted when it must be.
fn field(s: &str) -> String {
    if s.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_string()
    }
}

fn csv_line(cells: &[String]) -> String {
    let mut l = cells.iter().map(|c| field(c)).collect::<Vec<_>>().join(",");
    l.push('\n');
    l
}

/// History as CSV: the table's columns, times as ISO 8601.
pub fn runs_csv(runs: &[HistoryRun]) -> String {
    let mut out = csv_line(&RUN_HEADERS.map(|h| h.to_lowercase()));
    for r in runs {
        out.push_str(&csv_line(&run_cells(r)));
    }
    out
}

/// One usage row as JSON.
pub fn usage_json(u: &UsageRow) -> Value {
    json!({
        "period_unix": u.period_unix,
        "key": u.key,
        "gpu_hours": u.gpu_hours,
        "funded_gpu_hours": u.funded_gpu_hours,
        "unfunded_gpu_hours": u.unfunded_gpu_hours,
        "preempted_gpu_hours": u.preempted_gpu_hours,
        "lost_gpu_hours": u.lost_gpu_hours,
        "entitled_gpu_hours": u.entitled_gpu_hours,
        "runs": u.runs,
    })
}

fn usage_cells(u: &UsageRow) -> Vec<String> {
    vec![
        time(u.period_unix),
        u.key.clone(),
        format!("{:.1}", u.gpu_hours),
        format!("{:.1}", u.funded_gpu_hours),
        format!("{:.1}", u.unfunded_gpu_hours),
        format!("{:.1}", u.preempted_gpu_hours),
        format!("{:.1}", u.lost_gpu_hours),
        format!("{:.1}", u.entitled_gpu_hours),
        u.runs.to_string(),
    ]
}

fn usage_headers(by: &str) -> [String; 9] {
    [
        "PERIOD".into(),
        by.to_uppercase(),
        "GPU_HOURS".into(),
        "FUNDED".into(),
        "UNFUNDED".into(),
        "PREEMPTED".into(),
        "LOST".into(),
        "ENTITLED".into(),
        "RUNS".into(),
    ]
}

/// The usage table, with the window above it.
pub fn usage_table(r: &UsageResponse, by: &str) -> String {
    let headers = usage_headers(by);
    let h: Vec<&str> = headers.iter().map(String::as_str).collect();
    let rows: Vec<Vec<String>> = r.rows.iter().map(usage_cells).collect();
    format!(
        "GPU-hours from {} to {}\n{}",
        iso_utc(r.since_unix),
        iso_utc(r.until_unix),
        table::render(&h, &rows)
    )
}

/// Usage as CSV.
pub fn usage_csv(rows: &[UsageRow], by: &str) -> String {
    let mut out = csv_line(&usage_headers(by).map(|h| h.to_lowercase()));
    for u in rows {
        out.push_str(&csv_line(&usage_cells(u)));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn csv_quotes_what_needs_it() {
        assert_eq!(field("plain"), "plain");
        assert_eq!(field("a,b"), "\"a,b\"");
        assert_eq!(field("say \"hi\""), "\"say \"\"hi\"\"\"");
    }
}
