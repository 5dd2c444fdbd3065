//! The contract of a lease, as pure functions of the lease and the time: what is due
//! now, and when the next thing is due. The daemon sleeps until that instant and
//! carries out what this module says.

use crate::lease::{LeaseRecord, LeaseState};

/// Settings that shape every contract on the host.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Terms {
    /// Send the time-limit warning this long before the limit (ms).
    pub warning_before_ms: i64,
}

/// Something the contract asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Due {
    /// Warn the workload that its time limit comes soon.
    Warn,
    /// The time limit is reached: run the ladder now.
    TimeLimit,
    /// A revocation's `not_before` is reached: run the ladder now.
    Revoke,
}

fn ms(s: u64) -> i64 {
    i64::try_from(s.saturating_mul(1000)).unwrap_or(i64::MAX)
}

/// How long before its time limit `l` is warned: its own `--signal`, else the host's
/// default (0: no warning).
fn warning_before_ms(l: &LeaseRecord, t: Terms) -> i64 {
    if l.warn_signal.is_empty() {
        t.warning_before_ms
    } else {
        ms(l.warn_before_s)
    }
}

/// The instants at which `l` next needs attention, with what is due then; earliest
/// first. Empty when the lease is ended or its ladder is running.
pub fn schedule(l: &LeaseRecord, t: Terms) -> Vec<(i64, Due)> {
    if !matches!(l.state, LeaseState::Running | LeaseState::Revoking) {
        return Vec::new();
    }
    let mut out = Vec::new();
    if let Some(limit) = l.time_limit_s {
        let end = l.start_ms.saturating_add(ms(limit));
        let before = warning_before_ms(l, t);
        if !l.warned && before > 0 {
            out.push((end.saturating_sub(before), Due::Warn));
        }
        out.push((end, Due::TimeLimit));
    }
    if let (LeaseState::Revoking, Some(nb)) = (l.state, l.not_before_ms) {
        out.push((nb, Due::Revoke));
    }
    out.sort();
    out
}

/// What is due at `now_ms`: the time limit wins over a revocation (its end reason
/// is the truer one). A warning not yet sent when the limit has come (the agent was
/// down through both) goes first: the work asked for it, and its ladder follows.
pub fn due(l: &LeaseRecord, t: Terms, now_ms: i64) -> Vec<Due> {
    let due: Vec<Due> = schedule(l, t)
        .into_iter()
        .filter(|(at, _)| *at <= now_ms)
        .map(|(_, d)| d)
        .collect();
    if due.contains(&Due::TimeLimit) {
        return due.into_iter().filter(|d| *d != Due::Revoke).collect();
    }
    due
}

/// The earliest instant any of `leases` needs attention.
pub fn next_wakeup<'a>(leases: impl IntoIterator<Item = &'a LeaseRecord>, t: Terms) -> Option<i64> {
    leases
        .into_iter()
        .filter_map(|l| schedule(l, t).first().map(|(at, _)| *at))
        .min()
}

/// When a revocation asked at `now_ms` may act: at once when `now`, else at the
/// min-runtime lapse (never earlier than asked, never later than an earlier ask).
pub fn not_before(l: &LeaseRecord, now_ms: i64, now: bool, floor_ms: i64) -> i64 {
    let asked = if now {
        now_ms
    } else {
        // The later of the lapse this host measured and the time allotd named (a
        // drain gives work that cannot resume its grace on top of the lapse).
        l.lapse_ms().max(now_ms).max(floor_ms)
    };
    l.not_before_ms.map_or(asked, |prev| prev.min(asked))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lease::LeaseState;

    fn lease() -> LeaseRecord {
        LeaseRecord {
            id: "L-1".into(),
            workload_id: "L-1".into(),
            gpus: vec!["GPU-a".into()],
            user: "root".into(),
            argv: vec!["true".into()],
            pid: 10,
            start_ticks: 5,
            adopted: false,
            start_ms: 1_000_000,
            min_runtime_s: 600,
            time_limit_s: None,
            hook: "signal:USR1".into(),
            grace_s: 120,
            state: LeaseState::Running,
            ..Default::default()
        }
    }

    const T: Terms = Terms {
        warning_before_ms: 60_000,
    };

    #[test]
    fn a_running_lease_without_limit_needs_nothing() {
        assert!(schedule(&lease(), T).is_empty());
        assert_eq!(next_wakeup([&lease()], T), None);
    }

    #[test]
    fn revocation_waits_for_the_lapse_unless_now() {
        let mut l = lease();
        let asked = 1_000_000 + 5_000;
        assert_eq!(not_before(&l, asked, false, 0), 1_600_000);
        assert_eq!(not_before(&l, asked, true, 0), asked);
        // After the lapse, a plain revoke acts at once.
        assert_eq!(not_before(&l, 2_000_000, false, 0), 2_000_000);
        // allotd's later time wins over the lapse (a drain's grace for work that
        // cannot resume): one time, said once, on both sides.
        assert_eq!(not_before(&l, asked, false, 87_000_000), 87_000_000);
        // A later, gentler request never postpones an earlier one.
        l.not_before_ms = Some(1_100_000);
        assert_eq!(not_before(&l, asked, false, 0), 1_100_000);
        assert_eq!(not_before(&l, asked, false, 87_000_000), 1_100_000);
        l.state = LeaseState::Revoking;
        assert!(due(&l, T, 1_099_999).is_empty());
        assert_eq!(due(&l, T, 1_100_000), vec![Due::Revoke]);
    }

    #[test]
    fn time_limit_warns_then_ends_and_wins_over_revoke() {
        let mut l = lease();
        l.time_limit_s = Some(3_600);
        let end = 1_000_000 + 3_600_000;
        assert_eq!(
            schedule(&l, T),
            vec![(end - 60_000, Due::Warn), (end, Due::TimeLimit)]
        );
        assert_eq!(due(&l, T, end - 60_000), vec![Due::Warn]);
        // An agent down through the warning and the limit sends the warning first.
        assert_eq!(due(&l, T, end + 5_000), vec![Due::Warn, Due::TimeLimit]);
        l.warned = true;
        assert_eq!(next_wakeup([&l], T), Some(end));
        assert_eq!(due(&l, T, end + 5_000), vec![Due::TimeLimit]);
        l.state = LeaseState::Revoking;
        l.not_before_ms = Some(end - 1);
        assert_eq!(due(&l, T, end), vec![Due::TimeLimit]);
    }

    #[test]
    fn a_leases_own_warning_wins_and_none_is_sent_unasked() {
        let mut l = lease();
        l.time_limit_s = Some(3_600);
        let end = 1_000_000 + 3_600_000;
        let off = Terms {
            warning_before_ms: 0,
        };
        // No warning asked, none by default: only the limit itself.
        assert_eq!(schedule(&l, off), vec![(end, Due::TimeLimit)]);
        // Asked for: its own lead, whatever the host's default.
        l.warn_signal = "USR1".into();
        l.warn_before_s = 300;
        assert_eq!(
            schedule(&l, off),
            vec![(end - 300_000, Due::Warn), (end, Due::TimeLimit)]
        );
        assert_eq!(schedule(&l, T)[0], (end - 300_000, Due::Warn));
    }

    #[test]
    fn ladders_and_ended_leases_have_no_timers() {
        let mut l = lease();
        l.time_limit_s = Some(10);
        l.state = LeaseState::Checkpointing;
        assert!(schedule(&l, T).is_empty());
        l.state = LeaseState::Ended;
        assert!(due(&l, T, i64::MAX).is_empty());
    }
}
