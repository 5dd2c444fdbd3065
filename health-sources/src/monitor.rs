//! Feeds one round of NVML samples into the policy, including what samples cannot
//! say by themselves: a GPU that disappeared from the device list is lost.

use crate::nvml::GpuReadError;
use allot_health::verdict::{GpuSample, HealthPolicy, Time};
use std::collections::{BTreeMap, BTreeSet};

/// Remembers which GPUs were seen, so one that vanishes is noticed.
#[derive(Debug, Clone, Default)]
pub struct Roster {
    seen: BTreeSet<String>,
    by_index: BTreeMap<u32, String>,
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
                    if let Some(i) = s.index {
                        self.by_index.insert(i, s.pci.clone());
                    }
                    present.insert(s.pci.clone());
                    policy.sample(now, s);
                }
                Err(GpuReadError::Lost { pci, index }) => {
                    // Lost before its bus id could be read: the index says which.
                    if let Some(pci) = pci.or_else(|| self.by_index.get(&index).cloned()) {
                        present.insert(pci.clone());
                        policy.lost(now, &pci);
                        lost.push(pci);
                    }
                }
                // A read that failed otherwise says nothing new: the GPU is still
                // there and keeps its last state.
                Err(GpuReadError::Failed { index, .. }) => {
                    if let Some(pci) = self.by_index.get(&index) {
                        present.insert(pci.clone());
                    }
                }
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
