//! The words the CLI, the pages and `--state` use for the wire's enums.

use crate::v1::WorkloadState;

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
