//! The sentences people read in the audit log and `allot status`.

use allot_fairshare::{NodeId, NodeState, RevokeWhy, StartWhy, Time};

pub(super) fn revoke_text(why: &RevokeWhy, names: &[String]) -> (String, String) {
    let node = |n: &NodeId| names.get(n.idx()).cloned().unwrap_or_default();
    match why {
        RevokeWhy::Preempted {
            by,
            unfunded,
            requester_ratio_after,
            victim_ratio_after,
        } => (
            "preempted".into(),
            if *unfunded {
                format!(
                    "preempted for workload {}: it ran unfunded (free occupancy)",
                    by.0
                )
            } else {
                format!(
                    "preempted for workload {}: its group would be served {:.2}× after, the requester's {:.2}×",
                    by.0,
                    victim_ratio_after.unwrap_or(0.0),
                    requester_ratio_after.unwrap_or(0.0)
                )
            },
        ),
        RevokeWhy::Reservation { by } => (
            "reservation".into(),
            format!("backfill ends: the reservation of workload {} starts", by.0),
        ),
        RevokeWhy::Drain { node: n } => ("drain".into(), format!("node {} drains", node(n))),
        RevokeWhy::DrainNow { node: n } => (
            "drain-now".into(),
            format!("node {} must be emptied now", node(n)),
        ),
        RevokeWhy::Cancelled => ("cancelled".into(), "cancelled by its user".into()),
        RevokeWhy::Requeued => (
            "requeued".into(),
            "requeued by its owner or an operator: it waits again in the queue".into(),
        ),
    }
}

/// A node state as people read it.
pub fn state_name(s: NodeState) -> &'static str {
    match s {
        NodeState::Ready => "ready",
        NodeState::Draining => "draining",
        NodeState::DrainNow => "drain-now",
        NodeState::Down => "down",
    }
}

/// Why a lease started, for people.
pub(super) fn start_text(why: &StartWhy) -> String {
    match why {
        StartWhy::Free { rank, ratio } => format!(
            "ranked {rank} in the pass, its project served {ratio:.2}× its share, on free GPUs"
        ),
        StartWhy::AfterPreemption => "the victims it preempted have gone".into(),
        StartWhy::Reservation => "its reserved nodes are free".into(),
        StartWhy::Backfill {
            reservation_of,
            starts,
        } => format!(
            "backfill on nodes reserved for workload {} (ends before {starts})",
            reservation_of.0
        ),
    }
}

/// When a revocation acts, as people read it: a wait, never a Unix second.
pub(super) fn revoke_when(at: Time, not_before: Time) -> String {
    if not_before <= at {
        "at once".into()
    } else {
        format!(
            "in {}",
            allot_fairshare::time::format_duration(not_before - at)
        )
    }
}

#[cfg(test)]
mod when_tests {
    use super::revoke_when;

    #[test]
    fn a_revocation_says_when_as_a_wait() {
        assert_eq!(revoke_when(100, 100), "at once");
        assert_eq!(revoke_when(100, 40), "at once");
        let later = revoke_when(1_796_066_000, 1_796_066_469);
        assert!(later.starts_with("in 7m"), "{later}");
        assert!(!later.contains("1796"), "{later}");
    }
}
