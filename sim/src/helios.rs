//! The Helios study's raw trace format, read for [`crate::strict`]'s per-cluster runs.
//!
//! Header `timestamp,duration,num_gpus,gpu_time,cluster` (columns in any order; the
//! Helios artifact's `cluster_log.csv` names `submit_time`, `gpu_num` and `vc` are
//! accepted too). `timestamp` is `YYYY-MM-DD HH:MM:SS`, read as UTC (the study's
//! simulator used the machine's local zone; its figures are reproduced under
//! `TZ=UTC`). `duration` is seconds, a fraction cut to whole seconds as the study's
//! input step did (`astype(int)`). `num_gpus` is a whole number. `cluster` names one
//! of the scenario's `[[clusters]]` (a virtual cluster, VC). Other columns
//! (`gpu_time`, `user`, `jobname`, `state`) are ignored.
//!
//! A row that cannot be read (a cell that is not a time or a number, a missing
//! cell) is an error naming `file:line` and the field. A row that reads but cannot
//! be simulated is left out and counted in [`TraceDrops`], in this order of causes:
//! no GPUs (`num_gpus ≤ 0`), a cluster the scenario does not have, submitted before
//! the window's `from` or after its `to` (both UTC, inclusive), a duration under one
//! second, more GPUs than its cluster has. (The Helios code drops the first three and
//! loops for ever on the other two.)
//!
//! Times are seconds from the origin: the first simulated job's submit time, shared
//! by all clusters. Each cluster's jobs are in submit order, ties in file order (the
//! Helios code's ties follow pandas' unstable sort: on the Philly input FIFO's mean
//! wait moves by 0.3% between the two).

use crate::scenario::{Scenario, ScenarioError};
use allot_fairshare::time::{Secs, Time};
use serde::Serialize;

/// One job of one cluster.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Job {
    /// Submit time, seconds from the trace's origin.
    pub submit: Time,
    /// Seconds it runs once started (at least 1).
    pub duration: Secs,
    /// GPUs it asks for (at least 1, at most the cluster's).
    pub gpus: u32,
    /// Line in the trace file (0 when made up).
    pub line: usize,
}

/// One cluster's jobs.
#[derive(Debug, Clone, PartialEq)]
pub struct ClusterJobs {
    /// The scenario's cluster name (the VC id).
    pub name: String,
    /// Nodes.
    pub nodes: u32,
    /// GPUs per node.
    pub gpus_per_node: u32,
    /// Its jobs, by submit time, ties in file order.
    pub jobs: Vec<Job>,
}

/// Rows of the trace that were read but are not simulated.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct TraceDrops {
    /// `num_gpus` of 0 or less.
    pub no_gpus: u64,
    /// A `cluster` the scenario has no `[[clusters]]` table for.
    pub unknown_cluster: u64,
    /// Submitted before the window.
    pub before_window: u64,
    /// Submitted after the window.
    pub after_window: u64,
    /// A duration under one second.
    pub no_duration: u64,
    /// More GPUs than the cluster has in all.
    pub too_many_gpus: u64,
}

impl TraceDrops {
    /// All rows left out.
    pub fn total(&self) -> u64 {
        self.no_gpus
            + self.unknown_cluster
            + self.before_window
            + self.after_window
            + self.no_duration
            + self.too_many_gpus
    }

    /// `18 unknown cluster, 5649 before the window, …` (causes that occurred).
    pub fn text(&self) -> String {
        let parts: Vec<String> = [
            (self.no_gpus, "no GPUs"),
            (self.unknown_cluster, "unknown cluster"),
            (self.before_window, "before the window"),
            (self.after_window, "after the window"),
            (self.no_duration, "no duration"),
            (self.too_many_gpus, "more GPUs than the cluster"),
        ]
        .iter()
        .filter(|(n, _)| *n > 0)
        .map(|(n, why)| format!("{n} {why}"))
        .collect();
        if parts.is_empty() {
            "none".into()
        } else {
            format!("{} rows: {}", self.total(), parts.join(", "))
        }
    }
}

/// A parsed Helios trace, split by cluster.
#[derive(Debug, Clone, PartialEq)]
pub struct HeliosTrace {
    /// The file, as named in errors and reports.
    pub file: String,
    /// Unix second of the origin (`None` when no job is simulated).
    pub origin: Option<i64>,
    /// Every scenario cluster, in the scenario's order (empty ones too).
    pub clusters: Vec<ClusterJobs>,
    /// Rows left out.
    pub dropped: TraceDrops,
}

impl HeliosTrace {
    /// The origin as `YYYY-MM-DD HH:MM:SS UTC`.
    pub fn origin_text(&self) -> String {
        self.origin.map_or_else(
            || "none: no job".into(),
            |t| format!("{} UTC", allot_common::utc::format_time(t)),
        )
    }
}

const COLUMNS: [(&str, &[&str]); 4] = [
    ("timestamp", &["timestamp", "submit_time"]),
    ("duration", &["duration"]),
    ("num_gpus", &["num_gpus", "gpu_num"]),
    ("cluster", &["cluster", "vc"]),
];
const IGNORED: [&str; 4] = ["gpu_time", "user", "jobname", "state"];

/// Reads a Helios trace for `scenario`'s clusters and `[trace]` window; `file` names
/// it in errors.
pub fn parse(text: &str, file: &str, scenario: &Scenario) -> Result<HeliosTrace, ScenarioError> {
    let err = |line: usize, field: &str, message: String| ScenarioError {
        file: file.into(),
        line,
        field: field.into(),
        message,
    };
    let window = scenario.trace.as_ref();
    let bound = |s: &Option<String>| s.as_deref().and_then(allot_common::utc::parse_time);
    let from = window.and_then(|w| bound(&w.from));
    let to = window.and_then(|w| bound(&w.to));
    let mut records = crate::trace::csv_records(text);
    let Some(first) = records.next() else {
        return Err(err(1, "header", "empty file: expected a CSV header".into()));
    };
    let (header_line, header) = first.map_err(|(ln, m)| err(ln, "header", m))?;
    let header: Vec<String> = header.iter().map(str::to_string).collect();
    let known = || {
        let mut k: Vec<&str> = COLUMNS.iter().map(|c| c.0).collect();
        k.extend(IGNORED);
        k.join(",")
    };
    let mut cols = [usize::MAX; 4];
    for (i, h) in header.iter().enumerate() {
        match COLUMNS
            .iter()
            .position(|(_, names)| names.contains(&h.as_str()))
        {
            Some(c) if cols[c] != usize::MAX => {
                return Err(err(
                    header_line,
                    h,
                    format!("a second {} column", COLUMNS[c].0),
                ))
            }
            Some(c) => cols[c] = i,
            None if IGNORED.contains(&h.as_str()) => {}
            None => {
                return Err(err(
                    header_line,
                    h,
                    format!("unknown column; the Helios format has {}", known()),
                ))
            }
        }
    }
    for (c, &at) in cols.iter().enumerate() {
        if at == usize::MAX {
            return Err(err(
                header_line,
                COLUMNS[c].0,
                "required column is missing from the header".into(),
            ));
        }
    }
    let mut dropped = TraceDrops::default();
    // (cluster index, unix submit, duration, gpus, line)
    let mut rows: Vec<(usize, i64, u64, u32, usize)> = Vec::new();
    for rec in records {
        let (ln, cells) = rec.map_err(|(ln, m)| err(ln, "row", m))?;
        crate::trace::csv_row(&cells, header.len()).map_err(|m| err(ln, "row", m))?;
        let cell = |c: usize| -> Result<&str, ScenarioError> {
            let s = &cells[cols[c]];
            if s.is_empty() {
                Err(err(ln, COLUMNS[c].0, "is empty".into()))
            } else {
                Ok(s)
            }
        };
        let ts = cell(0)?;
        let submit = allot_common::utc::parse_time(ts).ok_or_else(|| {
            err(
                ln,
                "timestamp",
                format!("{ts:?} is not a time: write YYYY-MM-DD HH:MM:SS (UTC)"),
            )
        })?;
        let d = cell(1)?;
        let duration = d
            .parse::<f64>()
            .ok()
            .filter(|x| x.is_finite())
            .ok_or_else(|| err(ln, "duration", format!("{d:?} is not a number of seconds")))?;
        let g = cell(2)?;
        let gpus = g
            .parse::<i64>()
            .map_err(|_| err(ln, "num_gpus", format!("{g:?} is not a whole number")))?;
        let vc = cell(3)?;
        if gpus <= 0 {
            dropped.no_gpus += 1;
            continue;
        }
        let Some(ci) = scenario.clusters.iter().position(|c| c.name == vc) else {
            dropped.unknown_cluster += 1;
            continue;
        };
        if from.is_some_and(|f| submit < f) {
            dropped.before_window += 1;
            continue;
        }
        if to.is_some_and(|t| submit > t) {
            dropped.after_window += 1;
            continue;
        }
        // Whole seconds, cut as the study's input step did.
        let secs = duration.trunc();
        if secs < 1.0 {
            dropped.no_duration += 1;
            continue;
        }
        let c = &scenario.clusters[ci];
        if gpus as u64 > u64::from(c.nodes) * u64::from(c.gpus_per_node) {
            dropped.too_many_gpus += 1;
            continue;
        }
        rows.push((ci, submit, secs as u64, gpus as u32, ln));
    }
    let origin = rows.iter().map(|r| r.1).min();
    let mut clusters: Vec<ClusterJobs> = scenario
        .clusters
        .iter()
        .map(|c| ClusterJobs {
            name: c.name.clone(),
            nodes: c.nodes,
            gpus_per_node: c.gpus_per_node,
            jobs: Vec::new(),
        })
        .collect();
    let t0 = origin.unwrap_or(0);
    for (ci, submit, duration, gpus, line) in rows {
        clusters[ci].jobs.push(Job {
            submit: (submit - t0) as Time,
            duration,
            gpus,
            line,
        });
    }
    for c in &mut clusters {
        c.jobs.sort_by_key(|j| j.submit);
    }
    Ok(HeliosTrace {
        file: file.into(),
        origin,
        clusters,
        dropped,
    })
}
