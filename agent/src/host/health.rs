//! Health: the verdict's effect on leases (a failed GPU's lease ends as `gpu-lost`
//! and its group is killed; a GPU-only verdict revokes just those GPUs' leases; a
//! host-wide one drains the host) and the GPUs as the CLI shows them.

use super::{Drain, GpuView, Host, HEALTH};
use allot_health::verdict::{GpuSample, GpuState, HostVerdict, Verdict};
use allot_proto::v1::LeaseEnd;
use nix::sys::signal::Signal;
use std::collections::{BTreeMap, BTreeSet};

impl Host {
    /// An operator cleared a GPU's sticky health conditions (after a reset or repair).
    pub fn gpu_cleared(&self, pci: &str, index: u32, who: &str, reason: &str) {
        self.note(
            "health",
            "",
            pci,
            &format!("GPU {index} cleared by {who}: {reason}"),
        );
    }

    /// Every GPU with its health and lease.
    pub fn gpus(&self) -> Vec<GpuView> {
        let holder: BTreeMap<&str, &str> = self
            .leases
            .values()
            .filter(|l| l.live())
            .flat_map(|l| l.gpus.iter().map(move |g| (g.as_str(), l.id.as_str())))
            .collect();
        self.inventory
            .iter()
            .map(|s| {
                let v = self
                    .verdict
                    .as_ref()
                    .and_then(|v| v.gpus.iter().find(|g| g.pci == s.pci));
                GpuView {
                    sample: s.clone(),
                    state: v.map_or(GpuState::Healthy, |g| g.state),
                    reasons: v.map(|g| g.reasons.clone()).unwrap_or_default(),
                    lease: holder.get(s.uuid.as_str()).map(|l| l.to_string()),
                }
            })
            .collect()
    }

    /// The host verdict (health only).
    pub fn host_verdict(&self) -> HostVerdict {
        self.verdict.as_ref().map_or(HostVerdict::Ok, |v| v.host)
    }

    /// A new health verdict (and the GPUs as last sampled).
    pub fn on_verdict(&mut self, v: Verdict, inventory: Vec<GpuSample>, now_ms: i64) {
        if !inventory.is_empty() {
            self.inventory = inventory;
        }
        let changed = self.verdict.as_ref() != Some(&v);
        self.verdict = Some(v.clone());
        if !changed {
            return;
        }
        for g in &v.gpus {
            if let Some(r) = g.reasons.first() {
                self.note(
                    "health",
                    "",
                    &g.pci,
                    &format!("{:?}: {}: {}", g.state, r.signal, r.detail).to_lowercase(),
                );
            }
        }
        // A lease on a GPU that failed cannot finish: end it and kill the workload now.
        let failed: BTreeSet<String> = v
            .gpus
            .iter()
            .filter(|g| g.state == GpuState::Failed)
            .map(|g| g.pci.clone())
            .collect();
        let doomed = self.live_leases_on(&failed);
        for id in doomed {
            self.kill_lost(&id, now_ms);
        }
        let known: BTreeSet<&str> = self.inventory.iter().map(|g| g.pci.as_str()).collect();
        let summary = v
            .gpus
            .iter()
            .filter(|g| g.reasons.iter().any(|r| r.action.is_some()))
            .map(|g| {
                format!(
                    "{} {}",
                    g.pci,
                    g.reasons.first().map_or("", |r| r.signal.as_str())
                )
            })
            .collect::<Vec<_>>()
            .join(", ");
        if v.host == HostVerdict::Ok {
            self.held_gpus.clear();
            if self.health_drain.take().is_some() {
                self.note(
                    "drain",
                    "",
                    "",
                    "health verdict ok again: health drain lifted",
                );
                self.drain_ended(HEALTH);
            }
            return;
        }
        if !v.only_gpus.is_empty() {
            // Only those GPUs' leases end; the rest of the host keeps working.
            let now = v.host == HostVerdict::DrainNow;
            self.held_gpus = v.only_gpus.iter().cloned().collect();
            let ids = self.live_leases_on(&self.held_gpus);
            for id in ids {
                self.revoke_inner(&id, now, &format!("health: {summary}"), "", now_ms);
            }
            return;
        }
        // A drain-now whose cause is a GPU already handled above (its lease killed)
        // leaves the others their protection; one from elsewhere (an NVSwitch) does not.
        let now = v.host == HostVerdict::DrainNow
            && v.gpus.iter().any(|g| {
                g.reasons
                    .iter()
                    .any(|r| r.action == Some(allot_health::xid::Action::DrainNow))
                    && !known.contains(g.pci.as_str())
            });
        let d = Drain {
            reason: summary.clone(),
            now,
            by: HEALTH.into(),
            author: "health monitor".into(),
            at_ms: now_ms,
            // A drain allotd let through stays through when its reasons change.
            held: self.defer_health && self.health_drain.as_ref().is_none_or(|h| h.held),
        };
        if self.health_drain.as_ref().map(|h| (&h.reason, h.now)) != Some((&d.reason, d.now)) {
            let verdict = match v.host {
                HostVerdict::DrainNow => "drain-now",
                _ => "drain",
            };
            let deferred = d.held;
            // Recorded held, then put in force unless allotd's breaker is to decide.
            self.health_drain = Some(Drain { held: true, ..d });
            if deferred {
                self.note(
                    "drain",
                    "",
                    "",
                    &format!("health verdict {verdict}: {summary}; allotd's circuit breaker decides (the host keeps serving its healthy GPUs meanwhile)"),
                );
            } else {
                self.enforce_health_drain(
                    None,
                    &format!("drained by the health verdict ({verdict})"),
                    now_ms,
                );
            }
        }
    }

    fn kill_lost(&mut self, id: &str, now_ms: i64) {
        let Some(l) = self.leases.get_mut(id) else {
            return;
        };
        if self.os.is_same(l.proc_id()) {
            let _ = self.os.signal_group(l.pgid(), Signal::SIGKILL);
        }
        l.end(now_ms, LeaseEnd::GpuLost, "kill");
        let l = l.clone();
        self.save(&l);
        self.note(
            "lease",
            id,
            &l.gpus.join(","),
            "ended as failed: its GPU is gone; workload killed",
        );
    }
}
