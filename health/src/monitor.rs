//! Feeds one round of NVML samples into the policy, including what samples cannot
//! say by themselves: a GPU that disappeared from the device list is lost.

use crate::nvml::GpuReadError;
use crate::verdict::{GpuSample, HealthPolicy, Time};
use std::collections::BTreeSet;

/// Remembers which GPUs were seen, so one that vanishes is noticed.
#[derive(Debug, Clone, Default)]
pub struct Roster {
    seen: BTreeSet<String>,
}

impl Roster {
    /// Applies one round of samples at `now`; returns the bus ids reported lost.
    pub fn apply(
        &mut self,
        policy: &mut HealthPolicy,
        now: Time,
        round: Vec<Result<GpuSample, GpuReadError>>,
    ) -> Vec<String> {
        let mut present = BTreeSet::new();
        let mut lost = Vec::new();
        for r in round {
            match r {
                Ok(s) => {
                    present.insert(s.pci.clone());
                    policy.sample(now, s);
                }
                Err(GpuReadError::Lost { pci: Some(pci), .. }) => {
                    present.insert(pci.clone());
                    policy.lost(now, &pci);
                    lost.push(pci);
                }
                // Lost before its bus id could be read: the vanished-GPU check below
                // names it; other read failures leave the last state standing.
                Err(_) => {}
            }
        }
        for pci in self.seen.difference(&present) {
            policy.lost(now, pci);
            lost.push(pci.clone());
        }
        self.seen.extend(present);
        lost
    }
}
