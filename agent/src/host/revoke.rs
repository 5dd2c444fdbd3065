//! Revocations: when a revoked lease's ladder may start (the min-runtime lapse, or
//! at once), which drain caused it (so the drain's end withdraws it), and taking a
//! revocation back before its ladder begins.

use super::{Host, HostError};
use crate::contract;
use crate::lease::{LeaseRecord, LeaseState};

impl Host {
    /// Revokes for the allocator: at once when its `not_before` has come (a
    /// drain-now, a cancel, a lapse already past), else at the contract's lapse as
    /// this host measures it from the workload's real start.
    pub fn revoke_until(
        &mut self,
        id: &str,
        not_before_ms: i64,
        why: &str,
        now_ms: i64,
    ) -> Result<LeaseRecord, HostError> {
        let now = not_before_ms <= now_ms;
        self.revoke_inner(id, now, why, "", now_ms, not_before_ms)
            .ok_or_else(|| HostError::NoLease(id.to_string()))
    }

    pub(super) fn revoke_inner(
        &mut self,
        id: &str,
        now: bool,
        why: &str,
        cause: &str,
        now_ms: i64,
        floor_ms: i64,
    ) -> Option<LeaseRecord> {
        let l = self.leases.get_mut(id)?;
        if !matches!(l.state, LeaseState::Running | LeaseState::Revoking) {
            return Some(l.clone());
        }
        let nb = contract::not_before(l, now_ms, now, floor_ms);
        // allotd sends what it wants on every connect and resync: a revocation in
        // force that acts as soon or sooner stays as it is, so a repeat is a no-op.
        if l.state == LeaseState::Revoking && l.not_before_ms.is_some_and(|old| old <= nb) {
            return Some(l.clone());
        }
        // A lease revoked for another reason (a preemption, a cancel) stays revoked
        // when a drain ends, so a drain never claims it.
        l.revoke_cause = if l.state == LeaseState::Revoking && l.revoke_cause.is_empty() {
            String::new()
        } else {
            cause.to_string()
        };
        l.state = LeaseState::Revoking;
        l.not_before_ms = Some(nb);
        l.revoke_why = why.to_string();
        let l = l.clone();
        self.save(&l);
        let wait = (nb - now_ms).max(0) / 1000;
        self.note(
            "contract",
            id,
            "",
            &format!(
                "revoked ({why}); the ladder starts {}",
                if wait == 0 {
                    "now".to_string()
                } else if nb > l.lapse_ms().max(now_ms) {
                    format!("in {wait}s, at the time allotd named")
                } else {
                    format!("in {wait}s, at the min-runtime lapse")
                }
            ),
        );
        Some(l)
    }

    /// Revokes a lease: its ladder starts at the min-runtime lapse (at once with `now`).
    pub fn revoke(
        &mut self,
        id: &str,
        now: bool,
        why: &str,
        now_ms: i64,
    ) -> Result<LeaseRecord, HostError> {
        self.revoke_inner(id, now, why, "", now_ms, 0)
            .ok_or_else(|| HostError::NoLease(id.to_string()))
    }

    pub(super) fn revoke_all(&mut self, now: bool, why: &str, cause: &str, now_ms: i64) {
        let ids = self.live_ids();
        for id in ids {
            self.revoke_inner(&id, now, why, cause, now_ms, 0);
        }
    }

    /// Takes back a revocation whose ladder has not begun: the lease runs on under
    /// its contract. Returns whether it did.
    pub fn withdraw(&mut self, id: &str, why: &str) -> bool {
        let Some(l) = self.leases.get_mut(id) else {
            return false;
        };
        if l.state != LeaseState::Revoking {
            return false;
        }
        l.state = LeaseState::Running;
        l.not_before_ms = None;
        l.revoke_why.clear();
        l.revoke_cause.clear();
        let l = l.clone();
        self.save(&l);
        self.note("contract", id, "", &format!("revocation withdrawn: {why}"));
        true
    }
}
