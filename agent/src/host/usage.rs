//! Whether each lease uses its GPUs: a lease whose GPUs stay under `idle_below_pct`
//! for `idle_after_ms` is idle, and busy again once they are not; each change is
//! written to the lease's record, so allotd hears it on the lease's stream and the
//! local `allot leases` shows it. Read from the health monitor's samples.

use super::Host;
use allot_health::verdict::GpuSample;

impl Host {
    /// Takes the latest samples (every health interval, whether or not the verdict
    /// changed) and looks at every live lease's GPUs in them.
    pub fn on_samples(&mut self, inventory: Vec<GpuSample>, now_ms: i64) {
        if !inventory.is_empty() {
            self.inventory = inventory;
        }
        self.watch_use(now_ms);
    }

    fn watch_use(&mut self, now_ms: i64) {
        let (below, after) = (self.settings.idle_below_pct, self.settings.idle_after_ms);
        if after <= 0 {
            return;
        }
        let util = |gpus: &[String]| -> Option<u32> {
            let seen: Vec<u32> = gpus
                .iter()
                .filter_map(|g| self.inventory.iter().find(|s| s.uuid == *g))
                .filter_map(|s| s.utilization_pct)
                .collect();
            (!seen.is_empty()).then(|| seen.iter().sum::<u32>() / seen.len() as u32)
        };
        let mut changed = Vec::new();
        for l in self.leases.values().filter(|l| l.live()) {
            let Some(u) = util(&l.gpus) else {
                continue;
            };
            if u < below {
                let since = *self.low_since.entry(l.id.clone()).or_insert(now_ms);
                if l.idle_since_ms == 0 && now_ms - since >= after {
                    changed.push((l.id.clone(), since, u));
                }
            } else {
                self.low_since.remove(&l.id);
                if l.idle_since_ms != 0 {
                    changed.push((l.id.clone(), 0, u));
                }
            }
        }
        let leases = &self.leases;
        self.low_since
            .retain(|id, _| leases.get(id).is_some_and(|l| l.live()));
        for (id, since, u) in changed {
            let Some(l) = self.leases.get_mut(&id) else {
                continue;
            };
            l.idle_since_ms = since;
            l.gpu_util_pct = u;
            let rec = l.clone();
            let words = if since == 0 {
                format!("busy again: its GPUs at {u}%")
            } else {
                format!(
                    "idle for {}: its GPUs at {u}%",
                    allot_units::format_duration(((now_ms - since) / 1000).max(0) as u64)
                )
            };
            self.note("lease", &id, "", &words);
            self.save(&rec);
        }
    }
}
