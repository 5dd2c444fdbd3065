//! Drains, by author: the host operator's (`drain`/`undrain`, kept), allotd's
//! cluster drain (kept), and health's (from the verdict; held while allotd's
//! circuit breaker decides). A lease a drain revoked remembers the drain's kind, and
//! once no drain holds the host its revocation is withdrawn.

use super::{Drain, Host, HostError, CLUSTER, HEALTH, HOLD_KEY, LOCAL};
use crate::lease::LeaseState;

impl Drain {
    /// An operator drain as 0.1 stored it: allotd's drains were marked by their reason.
    pub(super) fn migrate(mut self) -> Drain {
        if self.by == "operator" {
            match self.reason.strip_prefix("allocator: ") {
                Some(r) => {
                    self.reason = r.to_string();
                    self.by = CLUSTER.into();
                    self.author = "allotd".into();
                }
                None => self.by = LOCAL.into(),
            }
        }
        self
    }
}

impl Host {
    /// The drain in force that people see first: health's (a fault), then the
    /// host operator's, then the cluster operator's.
    pub fn drain_state(&self) -> Option<&Drain> {
        self.drains().into_iter().find(|d| !d.held)
    }

    /// Every drain of the host, in force or held.
    pub fn drains(&self) -> Vec<&Drain> {
        [&self.health_drain, &self.local_drain, &self.cluster_drain]
            .into_iter()
            .flatten()
            .collect()
    }

    /// While allotd is connected, host-wide health drains wait for its circuit
    /// breaker (a fleet-wide false alarm must not empty the fleet); alone, the host
    /// drains itself.
    pub fn set_defer_health(&mut self, defer: bool, now_ms: i64) {
        self.defer_health = defer;
        if defer {
            return;
        }
        if self.held_by_allotd() {
            // allotd decided: a restart of allotd must not undo its decision.
            if let Some(d) = &self.health_drain {
                let why = format!(
                    "allotd is away: the health drain its circuit breaker held stays held until allotd says otherwise: {}",
                    d.reason
                );
                self.note("drain", "", "", &why);
            }
            return;
        }
        // Alone again, and allotd never decided on this drain: it takes effect here.
        self.enforce_health_drain(
            None,
            "allotd is away: the held health drain takes effect",
            now_ms,
        );
    }

    /// Whether the health drain now held is one allotd's breaker held (same reasons).
    pub(super) fn held_by_allotd(&self) -> bool {
        self.health_drain
            .as_ref()
            .is_some_and(|d| d.held && self.allotd_hold.as_deref() == Some(d.reason.as_str()))
    }

    /// Remembers (or forgets) that allotd's breaker held the health drain of
    /// `reasons`; kept across restarts.
    pub(super) fn set_allotd_hold(&mut self, reasons: Option<String>) {
        if self.allotd_hold == reasons {
            return;
        }
        let v = reasons
            .as_ref()
            .map(|r| serde_json::to_string(r).unwrap_or_default());
        if let Err(e) = self.store.set(HOLD_KEY, v.as_deref()) {
            tracing::warn!(error = %e, "cannot record allotd's hold of the health drain");
        }
        self.allotd_hold = reasons;
    }

    /// The health drain held for allotd's breaker comes into force (`now` overrides
    /// how it revokes): no new leases, every lease revoked. False if none was held.
    pub(super) fn enforce_health_drain(
        &mut self,
        now: Option<bool>,
        why: &str,
        now_ms: i64,
    ) -> bool {
        let Some(d) = self.health_drain.as_mut().filter(|d| d.held) else {
            return false;
        };
        d.held = false;
        self.set_allotd_hold(None);
        let Some(d) = self.health_drain.as_mut() else {
            return false;
        };
        d.now = now.unwrap_or(d.now);
        let (now, summary) = (d.now, d.reason.clone());
        self.note("drain", "", "", &format!("{why}: {summary}"));
        self.revoke_all(now, &format!("health: {summary}"), HEALTH, now_ms);
        true
    }

    fn save_drain(&self, key: &str, d: Option<&Drain>) -> Result<(), HostError> {
        let v = d.map(|d| serde_json::to_string(d).unwrap_or_default());
        Ok(self.store.set(key, v.as_deref())?)
    }

    /// A drain of `kind` ended: once no drain holds the host, every revocation a
    /// drain queued is withdrawn (whichever drain it was attributed to).
    pub(super) fn drain_ended(&mut self, kind: &str) {
        if self.drain_state().is_some() {
            return;
        }
        let ids: Vec<String> = self
            .leases
            .values()
            .filter(|l| l.state == LeaseState::Revoking && !l.revoke_cause.is_empty())
            .map(|l| l.id.clone())
            .collect();
        for id in ids {
            self.withdraw(&id, &format!("the {kind} drain ended"));
        }
    }

    /// The host operator drains the host: no new leases; every lease is revoked at
    /// its lapse (at once with `now`).
    pub fn drain(
        &mut self,
        reason: &str,
        now: bool,
        author: &str,
        now_ms: i64,
    ) -> Result<Drain, HostError> {
        if reason.trim().is_empty() {
            return Err(HostError::Invalid {
                field: "reason",
                message: "say why (it is kept and shown), e.g. --reason \"rack maintenance\""
                    .into(),
            });
        }
        let d = Drain {
            reason: reason.to_string(),
            now,
            by: LOCAL.into(),
            author: author.to_string(),
            at_ms: now_ms,
            held: false,
        };
        self.save_drain("drain", Some(&d))?;
        self.local_drain = Some(d.clone());
        self.note(
            "drain",
            "",
            "",
            &format!(
                "drained by the host operator {author}{}: {reason}",
                if now { " (now)" } else { "" }
            ),
        );
        self.revoke_all(now, &format!("drain: {reason}"), LOCAL, now_ms);
        Ok(d)
    }

    /// Ends the host operator's drain (a health drain stays while the verdict says
    /// so, a cluster drain until allotd lifts it); revocations the drain queued
    /// whose ladder has not begun are withdrawn when nothing else drains the host.
    pub fn undrain(&mut self) -> Result<Option<Drain>, HostError> {
        self.save_drain("drain", None)?;
        if self.local_drain.take().is_some() {
            self.note("drain", "", "", "undrained by the host operator");
            self.drain_ended(LOCAL);
        }
        Ok(self.drain_state().cloned())
    }

    /// allotd drains or lifts: a cluster operator's drain, or a health drain its
    /// circuit breaker let through.
    pub fn allocator_drain(
        &mut self,
        kind: &str,
        drain: bool,
        now: bool,
        reason: &str,
        now_ms: i64,
    ) -> Result<(), HostError> {
        match (kind, drain) {
            (HEALTH, true) => {
                self.enforce_health_drain(
                    Some(now),
                    "allotd's circuit breaker let the health drain through",
                    now_ms,
                );
            }
            // allotd's breaker holds the drain: the host keeps serving its healthy
            // GPUs, and what the drain revoked runs on. (The host lifts its health
            // drain itself, when its verdict is ok again.)
            (HEALTH, false) => {
                if !self.defer_health {
                    return Ok(());
                }
                // allotd's decision, whether the drain waited for it or was in force.
                let reasons = self.health_drain.as_ref().map(|d| d.reason.clone());
                if reasons.is_some() {
                    self.set_allotd_hold(reasons);
                }
                let Some(d) = self.health_drain.as_mut().filter(|d| !d.held) else {
                    return Ok(());
                };
                d.held = true;
                self.note(
                    "drain",
                    "",
                    "",
                    &format!("health drain held by allotd: {reason}"),
                );
                self.drain_ended(HEALTH);
            }
            (_, true) => {
                let d = Drain {
                    reason: reason.to_string(),
                    now,
                    by: CLUSTER.into(),
                    author: "allotd".into(),
                    at_ms: now_ms,
                    held: false,
                };
                if self.cluster_drain.as_ref().map(|c| (&c.reason, c.now))
                    == Some((&d.reason, d.now))
                {
                    return Ok(());
                }
                self.save_drain("cluster-drain", Some(&d))?;
                self.cluster_drain = Some(d);
                self.note(
                    "drain",
                    "",
                    "",
                    &format!(
                        "drained by a cluster operator through allotd{}: {reason}",
                        if now { " (now)" } else { "" }
                    ),
                );
                self.revoke_all(now, &format!("drain: {reason}"), CLUSTER, now_ms);
            }
            (_, false) => {
                self.save_drain("cluster-drain", None)?;
                if self.cluster_drain.take().is_some() {
                    self.note(
                        "drain",
                        "",
                        "",
                        "undrained by a cluster operator through allotd",
                    );
                    self.drain_ended(CLUSTER);
                }
            }
        }
        Ok(())
    }
}
