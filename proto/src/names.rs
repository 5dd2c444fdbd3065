//! The words the CLI, the pages and `--state` use for what the wire says.

use crate::v1::{Workload, WorkloadState};

/// A workload state as `--state` takes it (`pending`, `timed-out`, ...).
pub fn workload_state(s: WorkloadState) -> &'static str {
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

/// A pending workload's forecast start in words (`about 40m00s, at most 2h05m`),
/// as waits from `now`; `None` before allotd has one.
pub fn forecast_words(w: &Workload, now: i64) -> Option<String> {
    (w.state() == WorkloadState::Pending && w.forecast_at_unix > 0).then(|| {
        let t = |u: i64| (u > 0).then_some(u);
        allot_units::start_words(
            now,
            t(w.forecast_p50_unix),
            t(w.forecast_p90_unix),
            w.forecast_horizon_s,
        )
    })
}
