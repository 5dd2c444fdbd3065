//! Trace replay: workloads from a CSV file instead of the scenario's classes.
//!
//! Header columns: `submit_s,duration_s,gpus,nodes,team,project,user,class,
//! min_runtime_s,resumable,priority`, in any order. Required: `submit_s`,
//! `duration_s`, `gpus` (per node), `team`. Defaults for the rest (empty cells too):
//! `nodes` 1; `project` the team; `user` the team; `class` `batch`; `min_runtime_s`,
//! `resumable` and `priority` from the scenario's class of that name (min runtime,
//! resumable when its resumable share is at least one half, its most likely priority),
//! else 0 (unfunded), true, 0.

use super::scenario::{Job, Scenario, ScenarioError};
use allot_fairshare::workload::WorkloadSpec;

const REQUIRED: [&str; 4] = ["submit_s", "duration_s", "gpus", "team"];
const KNOWN: [&str; 11] = [
    "submit_s",
    "duration_s",
    "gpus",
    "nodes",
    "team",
    "project",
    "user",
    "class",
    "min_runtime_s",
    "resumable",
    "priority",
];

/// The parsed trace: jobs by arrival, and every (team, project) it names.
#[derive(Debug, Clone)]
pub struct Trace {
    /// Workloads, sorted by submit time (stable).
    pub jobs: Vec<Job>,
    /// (team, project) pairs in first-seen order.
    pub groups: Vec<(String, String)>,
}

/// Parses a trace; `file` names it in errors, which give the line and column.
pub fn parse(text: &str, file: &str, scenario: &Scenario) -> Result<Trace, ScenarioError> {
    let err = |line: usize, field: &str, message: String| ScenarioError {
        file: file.into(),
        line,
        field: field.into(),
        message,
    };
    let mut records = csv_records(text);
    let Some(first) = records.next() else {
        return Err(err(1, "header", "empty file: expected a CSV header".into()));
    };
    let (header_line, header) = first.map_err(|(ln, m)| err(ln, "header", m))?;
    let header: Vec<String> = header.iter().map(str::to_string).collect();
    for h in &header {
        if !KNOWN.contains(&h.as_str()) {
            return Err(err(
                header_line,
                h,
                format!("unknown column; known columns are {}", KNOWN.join(",")),
            ));
        }
    }
    for r in REQUIRED {
        if !header.iter().any(|h| h == r) {
            return Err(err(
                header_line,
                r,
                "required column is missing from the header".into(),
            ));
        }
    }
    let col = |name: &str| header.iter().position(|h| h == name);
    let cols: Vec<Option<usize>> = KNOWN.iter().map(|k| col(k)).collect();
    let mut jobs = Vec::new();
    let mut groups: Vec<(String, String)> = Vec::new();
    let mut seen = std::collections::BTreeSet::new();
    for rec in records {
        let (ln, cells) = rec.map_err(|(ln, m)| err(ln, "row", m))?;
        csv_row(&cells, header.len()).map_err(|m| err(ln, "row", m))?;
        let get = |k: usize| cols[k].map(|c| &cells[c]).filter(|s| !s.is_empty());
        let num = |k: usize, what: &str| -> Result<Option<u64>, ScenarioError> {
            get(k)
                .map(|s| {
                    s.parse::<u64>().map_err(|_| {
                        err(
                            ln,
                            KNOWN[k],
                            format!("{s:?} is not a whole non-negative number ({what})"),
                        )
                    })
                })
                .transpose()
        };
        let submit = num(0, "seconds")?.ok_or_else(|| err(ln, "submit_s", "is empty".into()))?;
        let work = num(1, "seconds")?.ok_or_else(|| err(ln, "duration_s", "is empty".into()))?;
        let gpus = num(2, "GPUs per node")?.ok_or_else(|| err(ln, "gpus", "is empty".into()))?;
        let nodes = num(3, "nodes")?.unwrap_or(1);
        if gpus == 0 || gpus > 64 || nodes == 0 || nodes > 100_000 {
            return Err(err(
                ln,
                if gpus == 0 || gpus > 64 {
                    "gpus"
                } else {
                    "nodes"
                },
                format!(
                    "gpus = {gpus}, nodes = {nodes}: need 1..=64 GPUs per node and at least 1 node"
                ),
            ));
        }
        let team = get(4)
            .ok_or_else(|| err(ln, "team", "is empty".into()))?
            .to_string();
        let project = get(5).unwrap_or(&team).to_string();
        let user = get(6).unwrap_or(&team).to_string();
        let class = get(7).unwrap_or("batch").to_string();
        let cls = scenario.class(&class);
        let min_runtime = num(8, "seconds")?.unwrap_or(cls.map_or(0, |c| c.min_runtime));
        let resumable = match get(9) {
            None => cls.is_none_or(|c| c.resumable >= 0.5),
            Some("true" | "1" | "yes") => true,
            Some("false" | "0" | "no") => false,
            Some(s) => return Err(err(ln, "resumable", format!("{s:?}: use true or false"))),
        };
        let priority = match get(10) {
            Some(s) => s
                .parse::<i32>()
                .map_err(|_| err(ln, "priority", format!("{s:?} is not an integer")))?,
            None => cls
                .and_then(|c| {
                    c.priority
                        .iter()
                        .max_by(|a, b| a.1.total_cmp(b.1))
                        .and_then(|(k, _)| k.parse().ok())
                })
                .unwrap_or(0),
        };
        let (cpu_per_gpu, mem_per_gpu) = cls.map_or((8, 64), |c| (c.cpu_per_gpu, c.mem_per_gpu_gb));
        if seen.insert((team.clone(), project.clone())) {
            groups.push((team.clone(), project.clone()));
        }
        let gpus = gpus as u32;
        jobs.push(Job {
            submit: (submit as f64 / scenario.load) as u64,
            work: work.max(1),
            spec: WorkloadSpec {
                project,
                user,
                class,
                gpus_per_node: gpus,
                nodes: nodes as u32,
                cpu_per_node: gpus * cpu_per_gpu,
                mem_per_node_gb: gpus * mem_per_gpu,
                min_runtime,
                time_limit: None,
                resumable,
                priority,
                no_requeue: false,
                ..Default::default()
            },
            line: ln,
        });
    }
    jobs.sort_by_key(|j| j.submit);
    Ok(Trace { jobs, groups })
}

/// The records of a CSV text with their 1-based lines: one reader over the whole
/// text (a quoted cell may hold a comma), fields trimmed, blank lines skipped. The
/// line of a record is counted here from its first byte that is not a line ending
/// or blank, so LF and CRLF files count alike and a blank line before a record does
/// not move it. Both trace formats read their files with this; the first record is
/// the header, and [`csv_row`] checks each row against it.
pub(crate) fn csv_records(
    text: &str,
) -> impl Iterator<Item = Result<(usize, csv::StringRecord), (usize, String)>> + '_ {
    let mut reader = csv::ReaderBuilder::new()
        .has_headers(false)
        .flexible(true)
        .trim(csv::Trim::All)
        .from_reader(text.as_bytes());
    let bytes = text.as_bytes();
    // Lines counted up to `counted`: each record's count starts where the last ended.
    let (mut line, mut counted) = (1usize, 0usize);
    let mut line_of = move |from: u64| {
        let mut at = usize::try_from(from)
            .unwrap_or(bytes.len())
            .min(bytes.len());
        while at < bytes.len() && bytes[at].is_ascii_whitespace() {
            at += 1;
        }
        let at = at.max(counted);
        line += bytes[counted..at].iter().filter(|b| **b == b'\n').count();
        counted = at;
        line
    };
    let mut done = false;
    std::iter::from_fn(move || loop {
        if done {
            return None;
        }
        let mut rec = csv::StringRecord::new();
        let start = reader.position().byte();
        match reader.read_record(&mut rec) {
            Ok(false) => return None,
            // A line of blanks only is no record.
            Ok(true) if rec.len() == 1 && rec[0].is_empty() => continue,
            Ok(true) => {
                let at = rec.position().map_or(start, csv::Position::byte);
                return Some(Ok((line_of(at), rec)));
            }
            Err(e) => {
                // The reader cannot go on past a broken record: the error is the last.
                done = true;
                let at = e.position().map_or(start, csv::Position::byte);
                return Some(Err((line_of(at), e.to_string())));
            }
        }
    })
}

/// A row's cells, checked against the header's `width`: the error says how many
/// it has.
pub(crate) fn csv_row(rec: &csv::StringRecord, width: usize) -> Result<(), String> {
    if rec.len() != width {
        return Err(format!("has {} cells, the header has {width}", rec.len()));
    }
    Ok(())
}
