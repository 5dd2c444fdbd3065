//! Health: the verdict's effect on leases (a failed GPU's lease ends as `gpu-lost`
//! and its group is killed; a GPU-only verdict revokes just those GPUs' leases; a
//! host-wide one drains the host) and the GPUs as the CLI shows them.

use super::{Drain, GpuView, Host, HEALTH};
use crate::lease::LeaseEnd;
use allot_health::verdict::{GpuSample, GpuState, HostVerdict, Reason, Verdict};
use nix::sys::signal::Signal;
use std::collections::{BTreeMap, BTreeSet};

/// What the host's verdict is made of: the health monitor's verdict and the host's
/// own conditions, kept apart so that either can change without the other.
#[derive(Debug, Default)]
pub(crate) struct HostFaults {
    /// The monitor's last verdict.
    gpu: Option<Verdict>,
    /// A file system the agent writes is nearly full.
    disk: Option<Reason>,
    /// A write the agent needed failed (`disk-full`): cleared by one that succeeds.
    write: Option<Reason>,
}

/// How much a write that lifts the `disk-full` fault must be able to write.
const PROBE_BYTES: usize = 1 << 20;

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

    /// The host's own conditions in force (a file system nearly full, a write that
    /// failed).
    pub fn host_reasons(&self) -> Vec<Reason> {
        self.faults
            .disk
            .iter()
            .chain(&self.faults.write)
            .cloned()
            .collect()
    }

    /// Whether the disk check found too little free space last time.
    pub fn disk_low(&self) -> bool {
        self.faults.disk.is_some()
    }

    /// A write the host needed failed (`what`, with its error): it drains itself
    /// (`disk-full`) until a write succeeds again, and the daemon checks the disk at
    /// once. Returns whether the verdict changed.
    pub(crate) fn write_failed(&mut self, what: &str, now_ms: i64) -> bool {
        self.check_disk = true;
        if self.faults.write.is_some() {
            return false;
        }
        let r = crate::disk::write_fault(what, u64::try_from(now_ms / 1000).unwrap_or(0));
        self.note("health", "", "", &format!("{}: {}", r.signal, r.detail));
        self.faults.write = Some(r);
        self.apply_verdict(now_ms);
        true
    }

    /// While a write has failed: tries one (a probe in the settings table); one that
    /// succeeds clears the fault. Also takes up the failures `save` recorded. Returns
    /// whether the verdict changed.
    pub fn retry_write(&mut self, now_ms: i64) -> bool {
        let failed = self
            .failed_write
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        let mut changed = match failed {
            Some(what) => self.write_failed(&what, now_ms),
            None => false,
        };
        if self.faults.write.is_some() {
            // A write of some size where the lease table is, not a small row that an
            // SQLite log grown earlier still has room for; then the table itself.
            let room = self
                .os
                .probe_write(&self.settings.state_dir, PROBE_BYTES)
                .is_ok();
            let probe = now_ms.to_string();
            if room && self.store.set("write-probe", Some(&probe)).is_ok() {
                // What could not be written meanwhile is written now: every lease it
                // holds, ended ones too (one that ended while the disk was full).
                let all: Vec<_> = self.leases.values().cloned().collect();
                for l in &all {
                    if self.store.put_lease(l).is_err() {
                        return changed;
                    }
                }
                self.faults.write = None;
                self.note(
                    "health",
                    "",
                    "",
                    &format!("{}: writes succeed again", crate::disk::WRITE_SIGNAL),
                );
                self.apply_verdict(now_ms);
                changed = true;
            }
        }
        changed
    }

    /// Whether a write failed since the daemon last asked: it checks the disk at once.
    pub fn take_disk_check(&mut self) -> bool {
        let recorded = self
            .failed_write
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_some();
        std::mem::take(&mut self.check_disk) || recorded
    }

    /// A new health verdict (and the GPUs as last sampled).
    pub fn on_verdict(&mut self, v: Verdict, inventory: Vec<GpuSample>, now_ms: i64) {
        if !inventory.is_empty() {
            self.inventory = inventory;
        }
        self.faults.gpu = Some(v);
        self.apply_verdict(now_ms);
    }

    /// The disk check's finding (see `crate::disk`): a fault drains the host as a
    /// health fault does, its end lifts that drain like any level condition's.
    /// Returns whether the host's verdict changed (allotd is to hear of it).
    pub fn on_disk(&mut self, fault: Option<Reason>, now_ms: i64) -> bool {
        // The first wording stays while the condition holds: a reason that changed
        // with every byte written would re-drain and re-report on each check.
        if fault.is_some() == self.faults.disk.is_some() {
            return false;
        }
        match &fault {
            Some(r) => self.note("health", "", "", &format!("{}: {}", r.signal, r.detail)),
            None => self.note(
                "health",
                "",
                "",
                &format!("{}: enough free space again", crate::disk::SIGNAL),
            ),
        }
        self.faults.disk = fault;
        self.apply_verdict(now_ms);
        true
    }

    /// The monitor's verdict with the host's own conditions: each of those drains
    /// the whole host.
    fn merged_verdict(&self) -> Option<Verdict> {
        // Without a monitor's verdict the host's own conditions make one (and their
        // end makes an empty one, which lifts what they asked).
        let mut v = match &self.faults.gpu {
            Some(v) => v.clone(),
            None if self.faults.disk.is_some()
                || self.faults.write.is_some()
                || self.verdict.is_some() =>
            {
                Verdict {
                    host: HostVerdict::Ok,
                    only_gpus: Vec::new(),
                    gpus: Vec::new(),
                }
            }
            None => return None,
        };
        for d in self.faults.disk.iter().chain(&self.faults.write) {
            let wants = match d.action {
                Some(allot_health::xid::Action::DrainNow) => HostVerdict::DrainNow,
                _ => HostVerdict::Drain,
            };
            v.host = v.host.max(wants);
            v.only_gpus.clear();
        }
        Some(v)
    }

    /// Acts on the merged verdict.
    fn apply_verdict(&mut self, now_ms: i64) {
        let Some(v) = self.merged_verdict() else {
            return;
        };
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
            .chain(
                self.faults
                    .disk
                    .iter()
                    .chain(&self.faults.write)
                    .map(|r| format!("{}: {}", r.signal, r.detail)),
            )
            .collect::<Vec<_>>()
            .join(", ");
        if v.host == HostVerdict::Ok {
            // allotd's hold goes with the fault, seen while allotd is there; alone
            // (a restart's first verdicts may read ok before the kernel log is read
            // again) it is kept: the same fault is the same decision.
            if self.defer_health {
                self.set_allotd_hold(None);
            }
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
                self.revoke_inner(&id, now, &format!("health: {summary}"), "", now_ms, 0);
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
            // A drain allotd let through stays through when its reasons change; one
            // its breaker held stays held for the same reasons, allotd away or not.
            held: (self.defer_health && self.health_drain.as_ref().is_none_or(|h| h.held))
                || self.allotd_hold.as_deref() == Some(summary.as_str()),
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
                let who = if self.held_by_allotd() {
                    "allotd's circuit breaker held it"
                } else {
                    "allotd's circuit breaker decides"
                };
                self.note(
                    "drain",
                    "",
                    "",
                    &format!("health verdict {verdict}: {summary}; {who} (the host keeps serving its healthy GPUs meanwhile)"),
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
