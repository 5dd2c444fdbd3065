//! Served ratios: how well each group is served against its share.
//!
//! `ratio(g) = (usage over the lookback + current allocation × H) / (share × capacity ×
//! (W + H))`, with H the allocation horizon. The policy takes W = the whole lookback:
//! its comparisons (and the hysteresis) mean what they meant in every release, so a
//! journal replayed by a later release decides as it did. What people read takes W =
//! the covered lookback, the part of the window since usage was first recorded (all
//! of it after a week), so a group receiving exactly its share reads 1.0 from the
//! first hour; only the unit differs, never the order. History dominates (the 7-day
//! window of the design), while the allocation term makes a start or a stop move the
//! ratio at once: one pass cannot hand a group everything before its usage catches
//! up, and a preemption's "after" ratios mean something. With DRF the numerator is
//! the dominant share across GPU, CPU and memory, in GPU units. GPUs are weighted by
//! type (`gpu_hour_weight`) on both sides: usage, allocation and capacity.

use crate::cluster::Cluster;
use crate::config::{PolicyConfig, MILLI};
use crate::ledger::{Channel, Ledger};
use crate::time::Time;
use crate::tree::{GroupId, OrgTree};

/// Resources counted: GPU, CPU, memory.
pub type Res = [f64; 3];

/// Usage and allocation per group, with the pass's own placements added as it goes.
#[derive(Debug, Clone)]
pub struct Ratios {
    usage: Vec<Res>,
    alloc: Vec<Res>,
    share: Vec<f64>,
    cap: Res,
    drf: bool,
    horizon: f64,
    scale: f64,
}

impl Ratios {
    /// Ratios as of `now` over `window` seconds of history (see the module), with
    /// `extra` allocation (claims) added per project.
    pub fn compute(
        cfg: &PolicyConfig,
        tree: &OrgTree,
        ledger: &Ledger,
        cluster: &Cluster,
        (now, window): (Time, f64),
        extra: &[(GroupId, Res)],
    ) -> Self {
        let n = tree.len();
        let mut usage = vec![[0.0; 3]; n];
        let mut alloc = vec![[0.0; 3]; n];
        for &p in tree.projects() {
            let u = ledger.usage(p, now);
            let a = ledger.rate(p);
            let w = Channel::WeightedGpu as usize;
            usage[p.idx()] = [u[w] / MILLI as f64, u[1], u[2]];
            alloc[p.idx()] = [a[w] as f64 / MILLI as f64, a[1] as f64, a[2] as f64];
        }
        for (p, x) in extra {
            for (a, v) in alloc[p.idx()].iter_mut().zip(x) {
                *a += v;
            }
        }
        for i in (1..n).rev() {
            if let Some(parent) = tree.group(GroupId(i as u32)).parent {
                for c in 0..3 {
                    usage[parent.idx()][c] += usage[i][c];
                    alloc[parent.idx()][c] += alloc[i][c];
                }
            }
        }
        let horizon = cfg.allocation_horizon as f64;
        let cap = [
            (cluster.total_weighted() as f64 / MILLI as f64).max(1.0),
            (cluster.total_cpu() as f64).max(1.0),
            (cluster.total_mem() as f64).max(1.0),
        ];
        Ratios {
            usage,
            alloc,
            share: tree.groups().map(|(_, g)| g.share).collect(),
            cap,
            drf: cfg.drf,
            horizon,
            scale: cap[0] * (window + horizon),
        }
    }

    fn value(&self, g: GroupId, extra: Res) -> f64 {
        let i = g.idx();
        let v =
            |c: usize| (self.usage[i][c] + (self.alloc[i][c] + extra[c]) * self.horizon).max(0.0);
        if self.drf {
            (0..3).map(|c| v(c) / self.cap[c]).fold(0.0, f64::max) * self.cap[0]
        } else {
            v(0)
        }
    }

    /// The two sides of `g`'s ratio, in GPU-seconds: what counts as served (usage in
    /// the window plus the allocation held over the horizon; with DRF the dominant
    /// share in GPU units) and its fair part (share × capacity × (window + horizon)).
    pub fn parts(&self, g: GroupId) -> (f64, f64) {
        (self.value(g, [0.0; 3]), self.share[g.idx()] * self.scale)
    }

    /// The served ratio of `g`.
    pub fn ratio(&self, g: GroupId) -> f64 {
        self.ratio_with(g, [0.0; 3])
    }

    /// The served ratio of `g` if its allocation changed by `extra`.
    pub fn ratio_with(&self, g: GroupId, extra: Res) -> f64 {
        self.value(g, extra) / (self.share[g.idx()] * self.scale)
    }

    /// Adds allocation placed in this pass to `project` and its ancestors.
    pub fn add(&mut self, tree: &OrgTree, project: GroupId, x: Res) {
        let mut g = Some(project);
        while let Some(cur) = g {
            for (a, v) in self.alloc[cur.idx()].iter_mut().zip(&x) {
                *a += v;
            }
            g = tree.group(cur).parent;
        }
    }
}

/// The negation of an allocation.
pub(crate) fn neg(x: [f64; 3]) -> [f64; 3] {
    [-x[0], -x[1], -x[2]]
}
