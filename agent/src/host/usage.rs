//! Whether each lease uses its GPUs: a lease whose GPUs stay under `idle_below_pct`
//! for `idle_after_ms` is idle, and busy again once they are not; each change is
//! written to the lease's record, so allotd hears it on the lease's stream and the
//! local `allot leases` shows it. Between changes the level itself is written when
//! it moved by [`USE_STEP`] points, at most every [`USE_EVERY_MS`], so allotd's
//! utilisation per team stays current without a write per sample. Read from the
//! health monitor's samples.

use super::Host;
use allot_health::verdict::GpuSample;

/// A lease's utilisation is written again when it moved by this many points.
pub const USE_STEP: u32 = 10;
/// ... and at most this often (ms).
pub const USE_EVERY_MS: i64 = 5 * 60 * 1000;

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
        // (lease, idle since, utilisation, whether idleness changed)
        let mut changed = Vec::new();
        for l in self.leases.values().filter(|l| l.live()) {
            let Some(u) = util(&l.gpus) else {
                continue;
            };
            if u < below {
                let since = *self.low_since.entry(l.id.clone()).or_insert(now_ms);
                if l.idle_since_ms == 0 && now_ms - since >= after {
                    changed.push((l.id.clone(), since, u, true));
                    continue;
                }
            } else {
                self.low_since.remove(&l.id);
                if l.idle_since_ms != 0 {
                    changed.push((l.id.clone(), 0, u, true));
                    continue;
                }
            }
            let said = self.use_said.get(&l.id).copied();
            if u.abs_diff(l.gpu_util_pct) >= USE_STEP
                && said.is_none_or(|t| now_ms - t >= USE_EVERY_MS)
            {
                changed.push((l.id.clone(), l.idle_since_ms, u, false));
            }
        }
        let leases = &self.leases;
        self.low_since
            .retain(|id, _| leases.get(id).is_some_and(|l| l.live()));
        self.use_said
            .retain(|id, _| leases.get(id).is_some_and(|l| l.live()));
        for (id, since, u, news) in changed {
            let Some(l) = self.leases.get_mut(&id) else {
                continue;
            };
            l.idle_since_ms = since;
            l.gpu_util_pct = u;
            self.use_said.insert(id.clone(), now_ms);
            let rec = l.clone();
            if !news {
                self.save(&rec);
                continue;
            }
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
