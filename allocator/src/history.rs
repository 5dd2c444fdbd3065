//! The runs allotd keeps for `allot history` (sacct) and `allot usage` (sreport):
//! one [`RunRow`] per ended run (and per workload that ended without one), written
//! in the same transaction as the journal entry that ended it, kept in the store's
//! `runs` table past `keep_finished` for `[server] history_retention`. Usage is
//! summed here from the rows, clipped to the window and its periods.

use crate::state::WorkRec;
use allot_fairshare::WorkloadState;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// One run as history shows it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RunRow {
    /// The workload.
    pub workload: u64,
    /// 1 = its first run; 0: it ended without running.
    pub run: u32,
    /// The lease (0: none).
    pub lease: u64,
    /// Its user.
    pub user: String,
    /// Its project.
    pub project: String,
    /// Its class.
    pub class: String,
    /// Its name.
    pub name: String,
    /// Its array's id (0: none) and its index there.
    pub array: (u64, u32),
    /// Hosts in rank order.
    pub nodes: Vec<String>,
    /// GPUs in all.
    pub gpus: u32,
    /// Started (0: never).
    pub start: u64,
    /// Ended (0: runs still).
    pub end: u64,
    /// How it ended for the workload: `completed`, `failed`, `timed-out`,
    /// `cancelled`, `preempted`, `requeued` (it waits again), `running`.
    pub state: String,
    /// The host's word (`completed`, `revoked`, `node-lost`, ...).
    pub end_reason: String,
    /// Why allotd revoked it, when it did (`preempted`, `drain`, `requeued`, ...).
    pub revoked: String,
    /// Its process's exit status.
    pub exit_code: Option<i32>,
    /// The signal that ended its process.
    pub signal: Option<i32>,
    /// How it ended, in words.
    pub detail: String,
    /// Charged to the project's budget.
    pub funded: bool,
}

impl RunRow {
    /// GPU-seconds it held within `[from, to)`; a running one up to `to`.
    pub fn gpu_secs_within(&self, from: u64, to: u64) -> u64 {
        if self.start == 0 {
            return 0;
        }
        let end = if self.end == 0 { to } else { self.end.min(to) };
        let start = self.start.max(from);
        u64::from(self.gpus) * end.saturating_sub(start)
    }

    /// A preemption (or a reservation's start) ended it.
    pub fn preempted(&self) -> bool {
        matches!(self.revoked.as_str(), "preempted" | "reservation")
    }

    /// A lost node or GPU ended it.
    pub fn lost(&self) -> bool {
        self.end_reason == "node-lost"
    }
}

/// Run `i` of workload `w`, as it ended.
pub fn row_of(w: &WorkRec, i: usize) -> RunRow {
    let r = &w.runs[i];
    let state = match w.state {
        WorkloadState::Pending if r.end != 0 => "requeued".to_string(),
        WorkloadState::Running if i + 1 == w.runs.len() => "running".to_string(),
        WorkloadState::Running | WorkloadState::Pending => "requeued".to_string(),
        s => s.as_str().to_string(),
    };
    RunRow {
        run: u32::try_from(i + 1).unwrap_or(u32::MAX),
        lease: r.lease,
        nodes: r.nodes.clone(),
        gpus: r.gpus,
        start: r.start,
        end: r.end,
        state,
        end_reason: r.end_reason.clone(),
        revoked: r.revoked.clone(),
        exit_code: r.exit_code,
        signal: r.signal,
        detail: r.detail.clone(),
        funded: r.funded,
        ..header(w)
    }
}

/// A workload that ended without running (cancelled while pending, a dependency
/// never met).
pub fn unrun_row(w: &WorkRec) -> RunRow {
    RunRow {
        end: w.end,
        state: w.state.as_str().to_string(),
        end_reason: w.end_reason.clone(),
        ..header(w)
    }
}

fn header(w: &WorkRec) -> RunRow {
    RunRow {
        workload: w.id,
        user: w.spec.user.clone(),
        project: w.spec.project.clone(),
        class: w.spec.class.clone(),
        name: w.name.clone(),
        array: w.array.map_or((0, 0), |p| (p.id, p.index)),
        ..RunRow::default()
    }
}

/// What a history query asks.
#[derive(Debug, Clone, Default)]
pub struct Query {
    /// Only this user's runs.
    pub user: String,
    /// Only this project's runs.
    pub project: String,
    /// Runs that ended at or after (running ones always).
    pub since: u64,
    /// Runs that started before (and ended ones that ended before... any).
    pub until: u64,
    /// Only runs that ended so.
    pub state: String,
    /// At most this many, newest first.
    pub limit: usize,
}

/// One line of a usage report.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct UsageRow {
    /// The period's start.
    pub period: u64,
    /// User, project or team.
    pub key: String,
    /// GPU-seconds received, funded and not.
    pub funded: u64,
    /// See `funded`.
    pub unfunded: u64,
    /// Of runs a preemption ended.
    pub preempted: u64,
    /// Of runs a lost node or GPU ended.
    pub lost: u64,
    /// Runs counted (each in every period it touched).
    pub runs: u32,
}

/// Sums GPU-seconds of `rows` within `[since, until)` by `key` and by period
/// (`per` seconds from `since`; 0: one period), clipping each run to each period.
pub fn usage(
    rows: &[RunRow],
    since: u64,
    until: u64,
    per: u64,
    key: impl Fn(&RunRow) -> String,
) -> Vec<UsageRow> {
    let per = if per == 0 {
        until.saturating_sub(since).max(1)
    } else {
        per
    };
    let mut out: BTreeMap<(u64, String), UsageRow> = BTreeMap::new();
    for r in rows {
        if r.start == 0 || r.start >= until || (r.end != 0 && r.end <= since) {
            continue;
        }
        let first = since + (r.start.max(since) - since) / per * per;
        let mut p = first;
        while p < until {
            let secs = r.gpu_secs_within(p, (p + per).min(until));
            if r.end != 0 && p >= r.end {
                break;
            }
            if secs > 0 {
                let e = out
                    .entry((p, key(r)))
                    .or_insert_with_key(|(period, key)| UsageRow {
                        period: *period,
                        key: key.clone(),
                        ..UsageRow::default()
                    });
                if r.funded {
                    e.funded += secs;
                } else {
                    e.unfunded += secs;
                }
                if r.preempted() {
                    e.preempted += secs;
                }
                if r.lost() {
                    e.lost += secs;
                }
                e.runs += 1;
            }
            p += per;
        }
    }
    out.into_values().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(start: u64, end: u64, gpus: u32, funded: bool) -> RunRow {
        RunRow {
            workload: start,
            run: 1,
            user: "ana".into(),
            project: "vision".into(),
            gpus,
            start,
            end,
            funded,
            state: "completed".into(),
            ..RunRow::default()
        }
    }

    #[test]
    fn usage_clips_each_run_to_the_window_and_its_periods() {
        let day = 86_400;
        // A start of 0 means "never started": the test's days start later.
        let run = |start: u64, end: u64, gpus, funded| {
            run(
                start + 10 * day,
                if end == 0 { 0 } else { end + 10 * day },
                gpus,
                funded,
            )
        };
        let at = |t: u64| t + 10 * day;
        let rows = vec![
            // Half before the window: only the half inside counts.
            run(0, day, 2, true),
            // Across two days.
            run(day + day / 2, 2 * day + day / 2, 4, false),
            // Still running at the window's end.
            run(2 * day, 0, 1, true),
        ];
        let all = usage(&rows, at(day / 2), at(3 * day), 0, |r| r.project.clone());
        assert_eq!(all.len(), 1);
        assert_eq!(all[0].funded, 2 * day / 2 + day);
        assert_eq!(all[0].unfunded, 4 * day);
        let daily = usage(&rows, at(day), at(3 * day), day, |r| r.user.clone());
        let by_day: Vec<(u64, u64)> = daily
            .iter()
            .map(|u| (u.period, u.funded + u.unfunded))
            .collect();
        assert_eq!(
            by_day,
            vec![(at(day), 4 * day / 2), (at(2 * day), 4 * day / 2 + day)]
        );
        // Summed over periods, the same as over the whole window.
        let total: u64 = daily.iter().map(|u| u.funded + u.unfunded).sum();
        let whole = usage(&rows, at(day), at(3 * day), 0, |_| String::new());
        assert_eq!(total, whole[0].funded + whole[0].unfunded);
    }
}
