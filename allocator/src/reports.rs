//! `Workloads.History` and `Org.Usage`: the runs kept in the store
//! ([`crate::history`]) and the runs going on in memory, each filtered to what the
//! caller may see ([`Allocator::sees_run`]), as sacct and sreport answer.

use crate::history::{self, Query, RunRow};
use crate::serve::{now, Server};
use crate::state::{Allocator, Who};
use allot_fairshare::WorkloadState;
use allot_proto::v1 as pb;
use std::collections::BTreeMap;
use tonic::Status;

/// Most runs one history answer holds.
pub const MAX_HISTORY: usize = 10_000;

/// Most stored runs one usage report reads.
pub const MAX_USAGE_RUNS: usize = 2_000_000;

/// The runs going on now (their current run), as history rows.
fn running(alloc: &Allocator) -> Vec<RunRow> {
    alloc
        .workloads()
        .values()
        .filter(|w| w.state == WorkloadState::Running && !w.runs.is_empty())
        .map(|w| history::row_of(w, w.runs.len() - 1))
        .collect()
}

fn time(field: &str, t: i64) -> Result<u64, Status> {
    u64::try_from(t).map_err(|_| {
        Status::invalid_argument(format!(
            "{field}: {t} is before 1970; give a Unix time, or 0"
        ))
    })
}

/// Who may ask for whose runs: a user not managing anything asks for their own.
fn scope(alloc: &Allocator, who: &Who, user: &str) -> Result<String, Status> {
    let me = who.user().unwrap_or_default();
    if alloc.is_operator(who) || alloc.manages_any(who) {
        return Ok(user.to_string());
    }
    if !user.is_empty() && user != me {
        return Err(Status::permission_denied(format!(
            "user: {me} may not see the runs of {user}: only their own, a manager's projects, or an operator's ([roles] operators in allotd.toml)"
        )));
    }
    Ok(me.to_string())
}

/// The stored runs matching `q` that `who` may see, newest first: a manager's are
/// read project by project (their projects, and their own work elsewhere), so the
/// limit counts what they see, not the cluster's.
fn visible_runs(
    c: &crate::serve::Core,
    who: &Who,
    q: &Query,
) -> Result<(Vec<RunRow>, bool), Status> {
    let read = |q: &Query| {
        c.runs(q)
            .map_err(|e| Status::internal(format!("reading history: {e}")))
    };
    if c.alloc.is_operator(who) || !q.user.is_empty() || !q.project.is_empty() {
        return read(q);
    }
    let me = who.user().unwrap_or_default().to_string();
    let mut queries = vec![Query {
        user: me.clone(),
        ..q.clone()
    }];
    let tree = c.alloc.core.tree();
    for &p in tree.projects() {
        let name = &tree.group(p).name;
        if c.alloc.sees_run(who, "", name) {
            queries.push(Query {
                project: name.clone(),
                ..q.clone()
            });
        }
    }
    let mut rows = Vec::new();
    let mut truncated = false;
    for q in &queries {
        let (r, t) = read(q)?;
        rows.extend(r);
        truncated |= t;
    }
    rows.sort_by_key(|r| std::cmp::Reverse((r.end, r.workload, r.run)));
    rows.dedup_by(|a, b| (a.workload, a.run) == (b.workload, b.run));
    if rows.len() > q.limit {
        rows.truncate(q.limit);
        truncated = true;
    }
    Ok((rows, truncated))
}

/// `allot history`.
pub fn history(
    server: &Server,
    who: &Who,
    r: &pb::HistoryRequest,
) -> Result<pb::HistoryResponse, Status> {
    allot_common::fields::check_len("state", &r.state, 32)
        .map_err(|e| Status::invalid_argument(e.to_string()))?;
    let states = [
        "completed",
        "failed",
        "timed-out",
        "cancelled",
        "preempted",
        "requeued",
        "running",
    ];
    if !r.state.is_empty() && !states.contains(&r.state.as_str()) {
        return Err(Status::invalid_argument(format!(
            "state: {:?} is not how a run ends; use one of {}",
            r.state,
            states.join(", ")
        )));
    }
    let limit = match r.limit {
        0 => MAX_HISTORY,
        n => (n as usize).min(MAX_HISTORY),
    };
    let c = server.core();
    let user = scope(&c.alloc, who, &r.user)?;
    let q = Query {
        user,
        project: r.project.clone(),
        since: time("since_unix", r.since_unix)?,
        until: time("until_unix", r.until_unix)?,
        state: r.state.clone(),
        limit,
    };
    let mut rows: Vec<RunRow> = running(&c.alloc)
        .into_iter()
        .filter(|w| q.user.is_empty() || w.user == q.user)
        .filter(|w| q.project.is_empty() || w.project == q.project)
        .filter(|w| q.state.is_empty() || w.state == q.state)
        .filter(|w| q.until == 0 || w.start < q.until)
        .collect();
    let (stored, mut truncated) = visible_runs(&c, who, &q)?;
    rows.extend(stored);
    rows.retain(|w| c.alloc.sees_run(who, &w.user, &w.project));
    if rows.len() > limit {
        rows.truncate(limit);
        truncated = true;
    }
    let at = now();
    Ok(pb::HistoryResponse {
        runs: rows.iter().map(|w| run_pb(w, at)).collect(),
        truncated,
    })
}

fn run_pb(w: &RunRow, now: u64) -> pb::HistoryRun {
    let secs = |t: u64| i64::try_from(t).unwrap_or(i64::MAX);
    pb::HistoryRun {
        workload_id: w.workload.to_string(),
        run: w.run,
        lease_id: if w.lease == 0 {
            String::new()
        } else {
            crate::state::lease_wire(w.lease)
        },
        user: w.user.clone(),
        project: w.project.clone(),
        class: w.class.clone(),
        name: w.name.clone(),
        array_id: if w.array.0 == 0 {
            String::new()
        } else {
            w.array.0.to_string()
        },
        array_index: w.array.1,
        nodes: w.nodes.clone(),
        gpus: w.gpus,
        start_unix: secs(w.start),
        end_unix: secs(w.end),
        state: w.state.clone(),
        end_reason: w.end_reason.clone(),
        revoked: w.revoked.clone(),
        exit_code: w.exit_code,
        signal: w.signal,
        detail: w.detail.clone(),
        funded: w.funded,
        gpu_hours: w.gpu_secs_within(0, now) as f64 / 3600.0,
    }
}

/// `allot usage`.
pub fn usage(
    server: &Server,
    who: &Who,
    r: &pb::UsageRequest,
) -> Result<pb::UsageResponse, Status> {
    let at = now();
    // Nothing is received after now: a window reaching past it ends now.
    let until = match time("until_unix", r.until_unix)? {
        0 => at,
        t => t.min(at),
    };
    let since = match time("since_unix", r.since_unix)? {
        0 => until.saturating_sub(30 * 86_400),
        t => t,
    };
    if since >= until {
        return Err(Status::invalid_argument(
            "since_unix: the window is empty; give a since before until",
        ));
    }
    let per = match r.per.as_str() {
        "" => 0,
        "day" => 86_400,
        "week" => 7 * 86_400,
        other => {
            return Err(Status::invalid_argument(format!(
                "per: {other:?} is not a period; use day or week (or leave it out for the whole window)"
            )))
        }
    };
    if per > 0 && (until - since) / per > 3_660 {
        return Err(Status::invalid_argument(
            "per: more than 3,660 periods; ask for a shorter window or a longer period",
        ));
    }
    let by = match r.by.as_str() {
        "" | "project" => "project",
        "user" => "user",
        "team" => "team",
        other => {
            return Err(Status::invalid_argument(format!(
                "by: {other:?} is not a grouping; use user, project or team"
            )))
        }
    };
    let c = server.core();
    let user = scope(&c.alloc, who, "")?;
    let q = Query {
        user,
        since,
        until,
        limit: MAX_USAGE_RUNS,
        ..Query::default()
    };
    let (mut rows, truncated) = visible_runs(&c, who, &q)?;
    if truncated {
        return Err(Status::resource_exhausted(format!(
            "more than {MAX_USAGE_RUNS} runs in the window; ask for a shorter one"
        )));
    }
    rows.extend(running(&c.alloc));
    rows.retain(|w| c.alloc.sees_run(who, &w.user, &w.project));
    let tree = c.alloc.tree(at);
    drop(c);
    let parent: BTreeMap<&str, &str> = tree
        .groups
        .iter()
        .map(|g| {
            let p = if g.parent.is_empty() {
                &g.name
            } else {
                &g.parent
            };
            (g.name.as_str(), p.as_str())
        })
        .collect();
    let share: BTreeMap<&str, f64> = tree
        .groups
        .iter()
        .map(|g| (g.name.as_str(), g.share))
        .collect();
    let key = |w: &RunRow| match by {
        "user" => w.user.clone(),
        "team" => parent
            .get(w.project.as_str())
            .map_or_else(|| w.project.clone(), |p| (*p).to_string()),
        _ => w.project.clone(),
    };
    let per_secs = if per == 0 { until - since } else { per };
    let hours = |s: u64| s as f64 / 3600.0;
    let rows = history::usage(&rows, since, until, per, key)
        .into_iter()
        .map(|u| {
            let len = per_secs.min(until - u.period);
            let entitled = match by {
                "user" => 0.0,
                _ => {
                    share.get(u.key.as_str()).copied().unwrap_or(0.0)
                        * f64::from(tree.capacity_gpus)
                        * hours(len)
                }
            };
            pb::UsageRow {
                period_unix: i64::try_from(u.period).unwrap_or(i64::MAX),
                gpu_hours: hours(u.funded + u.unfunded),
                funded_gpu_hours: hours(u.funded),
                unfunded_gpu_hours: hours(u.unfunded),
                preempted_gpu_hours: hours(u.preempted),
                lost_gpu_hours: hours(u.lost),
                entitled_gpu_hours: entitled,
                runs: u.runs,
                key: u.key,
            }
        })
        .collect();
    Ok(pb::UsageResponse {
        rows,
        since_unix: i64::try_from(since).unwrap_or(i64::MAX),
        until_unix: i64::try_from(until).unwrap_or(i64::MAX),
    })
}
