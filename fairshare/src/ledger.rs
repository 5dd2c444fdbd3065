//! The usage ledger: what each project consumed over the lookback window.
//!
//! Exact, not sampled: each project keeps its cumulative consumption as a
//! piecewise-linear function of time (a breakpoint wherever its allocation changes),
//! so usage over `[now - W, now]` is two lookups, `C(now) - C(now - W)`, each a binary
//! search, and an update is O(1) amortised. Breakpoints older than the window are
//! pruned. The exponential half-life model (Slurm's and Kueue's) keeps one decayed
//! sum per project instead.

use crate::time::{Secs, Time};
use crate::tree::GroupId;
use serde::{Deserialize, Serialize};
use std::collections::VecDeque;

/// What the ledger measures, per project.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Channel {
    /// GPUs held (funded and unfunded).
    Gpu = 0,
    /// CPU cores held.
    Cpu = 1,
    /// Memory held, in GB.
    Mem = 2,
    /// GPUs held by funded leases.
    FundedGpu = 3,
    /// GPUs held, each weighted by its type's `gpu_hour_weight`, in thousandths:
    /// what served ratios count.
    WeightedGpu = 4,
    /// Weighted GPUs held by funded leases, in thousandths: what the budget is
    /// charged.
    WeightedFundedGpu = 5,
}

/// Number of channels.
pub const CHANNELS: usize = 6;

/// Channels a record of an earlier release has (no weighted ones).
const CHANNELS_BEFORE_WEIGHTS: usize = 4;

/// Allocation rates per channel (units held at once).
pub type Rates = [i64; CHANNELS];

/// How old usage is forgotten.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", tag = "model")]
pub enum UsageModel {
    /// Hard sliding window: usage older than `secs` counts for nothing.
    Window {
        /// Window length in seconds.
        secs: Secs,
    },
    /// Exponential decay: usage `secs` old counts half.
    HalfLife {
        /// Half-life in seconds.
        secs: Secs,
    },
}

impl UsageModel {
    /// The length of history the model weighs, in seconds: the window itself, or the
    /// integral of the decay kernel (half-life / ln 2).
    pub fn effective_secs(&self) -> f64 {
        match *self {
            UsageModel::Window { secs } => secs as f64,
            UsageModel::HalfLife { secs } => secs as f64 / std::f64::consts::LN_2,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
struct Point {
    t: Time,
    #[serde(deserialize_with = "channels::de")]
    cum: [u64; CHANNELS],
    #[serde(deserialize_with = "channels::de")]
    rate: [u64; CHANNELS],
}

/// Records of releases before GPU weights have four channels: their weighted ones
/// are the GPUs they count, at weight 1 (every type weighed 1 then).
mod channels {
    use super::{Channel, CHANNELS, CHANNELS_BEFORE_WEIGHTS};
    use crate::config::MILLI;
    use serde::{de::Error, Deserialize, Deserializer};

    /// A count the ledger keeps, scaled to thousandths.
    pub trait Milli: Copy + Default {
        fn milli(self) -> Self;
    }
    impl Milli for u64 {
        fn milli(self) -> Self {
            self.saturating_mul(MILLI)
        }
    }
    impl Milli for f64 {
        fn milli(self) -> Self {
            self * MILLI as f64
        }
    }

    pub fn de<'de, D, T>(d: D) -> Result<[T; CHANNELS], D::Error>
    where
        D: Deserializer<'de>,
        T: Milli + Deserialize<'de>,
    {
        let v = Vec::<T>::deserialize(d)?;
        let mut out = [T::default(); CHANNELS];
        match v.len() {
            CHANNELS => out.copy_from_slice(&v),
            CHANNELS_BEFORE_WEIGHTS => {
                out[..CHANNELS_BEFORE_WEIGHTS].copy_from_slice(&v);
                out[Channel::WeightedGpu as usize] = v[Channel::Gpu as usize].milli();
                out[Channel::WeightedFundedGpu as usize] = v[Channel::FundedGpu as usize].milli();
            }
            n => {
                return Err(D::Error::invalid_length(
                    n,
                    &"4 or 6 usage channels (GPU, CPU, memory, funded GPU, weighted)",
                ))
            }
        }
        Ok(out)
    }
}

/// One project's usage record: what a snapshot keeps of the ledger (opaque
/// outside it; serde defaults so a record of an earlier release reads).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct ProjectLedger {
    points: VecDeque<Point>,
    #[serde(deserialize_with = "channels::de")]
    decayed: [f64; CHANNELS],
    decayed_at: Time,
    #[serde(deserialize_with = "channels::de")]
    rate: [u64; CHANNELS],
}

impl ProjectLedger {
    fn cum_at(&self, t: Time) -> [u64; CHANNELS] {
        // Index of the last point at or before t. Almost every read is of now (past
        // the last point) or of the window's start (within the first two: add_rate
        // drops the points before it), so those are looked at first.
        let n = self.points.len();
        let i = if self.points.back().is_none_or(|p| p.t <= t) {
            n
        } else if self.points[0].t > t {
            0
        } else if n < 2 || self.points[1].t > t {
            1
        } else {
            self.points.partition_point(|p| p.t <= t)
        };
        if i == 0 {
            // Before the first point nothing is known: a record that has dropped older
            // points (one restored into a longer window) counts none of what they held.
            return self.points.front().map_or([0; CHANNELS], |p| p.cum);
        }
        let p = &self.points[i - 1];
        let dt = t - p.t;
        std::array::from_fn(|c| p.cum[c] + p.rate[c] * dt)
    }
}

/// Per-project usage over the lookback, exact for the window model.
#[derive(Debug, Clone)]
pub struct Ledger {
    model: UsageModel,
    projects: Vec<ProjectLedger>,
    /// When the first usage was recorded: the window is only covered from then on.
    since: Option<Time>,
}

impl Ledger {
    /// A ledger with room for `groups` groups (indexed by `GroupId`).
    pub fn new(model: UsageModel, groups: usize) -> Self {
        Ledger {
            model,
            projects: vec![ProjectLedger::default(); groups],
            since: None,
        }
    }

    /// The model in force.
    pub fn model(&self) -> UsageModel {
        self.model
    }

    /// Changes what `g` holds from `now` on by `delta` (positive on start, negative on
    /// end). Times must not go backwards per project.
    pub fn add_rate(&mut self, g: GroupId, now: Time, delta: Rates) {
        let model = self.model;
        self.since.get_or_insert(now);
        let p = &mut self.projects[g.idx()];
        let new_rate: [u64; CHANNELS] =
            std::array::from_fn(|c| p.rate[c].saturating_add_signed(delta[c]));
        match model {
            UsageModel::Window { secs } => {
                let cum = p.cum_at(now);
                match p.points.back_mut() {
                    Some(last) if last.t == now => last.rate = new_rate,
                    _ => p.points.push_back(Point {
                        t: now,
                        cum,
                        rate: new_rate,
                    }),
                }
                let horizon = now.saturating_sub(secs);
                while p.points.len() >= 2 && p.points[1].t <= horizon {
                    p.points.pop_front();
                }
            }
            UsageModel::HalfLife { secs } => {
                p.decayed = decay(p.decayed, p.rate, now - p.decayed_at.min(now), secs);
                p.decayed_at = now;
            }
        }
        p.rate = new_rate;
    }

    /// Resource-seconds `g` consumed over the lookback as of `now` (decayed for the
    /// half-life model), per channel.
    pub fn usage(&self, g: GroupId, now: Time) -> [f64; CHANNELS] {
        let p = &self.projects[g.idx()];
        match self.model {
            UsageModel::Window { secs } => {
                let hi = p.cum_at(now);
                let lo = p.cum_at(now.saturating_sub(secs));
                std::array::from_fn(|c| (hi[c] - lo[c]) as f64)
            }
            UsageModel::HalfLife { secs } => {
                decay(p.decayed, p.rate, now - p.decayed_at.min(now), secs)
            }
        }
    }

    /// `g`'s record, for a snapshot.
    pub fn project(&self, g: GroupId) -> &ProjectLedger {
        &self.projects[g.idx()]
    }

    /// Puts back `g`'s record from a snapshot.
    pub fn restore(&mut self, g: GroupId, record: ProjectLedger) {
        if let Some(p) = self.projects.get_mut(g.idx()) {
            *p = record;
        }
    }

    /// When usage was first recorded (`None` before any).
    pub fn since(&self) -> Option<Time> {
        self.since
    }

    /// Puts back when usage was first recorded, from a snapshot.
    pub fn set_since(&mut self, since: Option<Time>) {
        self.since = since;
    }

    /// How much of the lookback has history as of `now`, in seconds: the window, or
    /// the part of it since usage was first recorded (for the half-life model, the
    /// kernel's integral over that part). The served ratios people read divide by
    /// this, so a group receiving exactly its share reads 1.0 on a fresh cluster too.
    pub fn covered_secs(&self, now: Time) -> f64 {
        let age = self.since.map_or(0, |s| now.saturating_sub(s)) as f64;
        match self.model {
            UsageModel::Window { secs } => age.min(secs as f64),
            UsageModel::HalfLife { .. } => {
                let tau = self.model.effective_secs();
                tau * (1.0 - (-age / tau).exp())
            }
        }
    }

    /// What `g` holds right now, per channel.
    pub fn rate(&self, g: GroupId) -> [u64; CHANNELS] {
        self.projects[g.idx()].rate
    }
}

/// Decayed sums after `dt` seconds at constant `rate`: `U·d + r·τ·(1−d)`.
fn decay(u: [f64; CHANNELS], rate: [u64; CHANNELS], dt: Secs, half_life: Secs) -> [f64; CHANNELS] {
    let tau = half_life as f64 / std::f64::consts::LN_2;
    let d = (-(dt as f64) / tau).exp();
    std::array::from_fn(|c| u[c] * d + rate[c] as f64 * tau * (1.0 - d))
}

#[cfg(test)]
mod tests {
    use super::*;

    const G: GroupId = GroupId(1);

    fn gpus(n: i64) -> Rates {
        [n, 0, 0, 0, n * 1000, 0]
    }

    #[test]
    fn window_usage_is_exact_across_breakpoints() {
        let mut l = Ledger::new(UsageModel::Window { secs: 100 }, 2);
        l.add_rate(G, 0, gpus(4)); // 4 GPUs from t=0
        l.add_rate(G, 50, gpus(-2)); // 2 GPUs from t=50
        l.add_rate(G, 120, gpus(-2)); // none from t=120
        assert_eq!(l.usage(G, 50)[0], 200.0);
        assert_eq!(l.usage(G, 100)[0], 4.0 * 50.0 + 2.0 * 50.0);
        // Window [30, 130]: 4*20 + 2*70 + 0*10.
        assert_eq!(l.usage(G, 130)[0], 80.0 + 140.0);
        // Window [200, 300]: nothing left.
        assert_eq!(l.usage(G, 300)[0], 0.0);
    }

    #[test]
    fn a_pruned_record_in_a_longer_window_counts_only_what_it_kept() {
        let mut short = Ledger::new(UsageModel::Window { secs: 100 }, 2);
        short.add_rate(G, 0, gpus(8)); // 8 GPUs over [0, 100) …
        short.add_rate(G, 100, gpus(-8));
        short.add_rate(G, 300, gpus(1)); // … dropped here; 1 GPU from t=300
        let mut long = Ledger::new(UsageModel::Window { secs: 1_000 }, 2);
        long.restore(G, short.project(G).clone());
        assert_eq!(long.usage(G, 310)[0], 10.0, "not the 800 the record forgot");
        // A record that kept everything is read whole.
        let mut whole = Ledger::new(UsageModel::Window { secs: 1_000 }, 2);
        whole.add_rate(G, 0, gpus(8));
        whole.add_rate(G, 100, gpus(-8));
        assert_eq!(whole.usage(G, 310)[0], 800.0);
    }

    #[test]
    fn window_prunes_old_breakpoints() {
        let mut l = Ledger::new(UsageModel::Window { secs: 10 }, 2);
        for t in 0..1000 {
            l.add_rate(G, t, gpus(if t % 2 == 0 { 1 } else { -1 }));
        }
        assert!(
            l.projects[1].points.len() <= 12,
            "{}",
            l.projects[1].points.len()
        );
        // Alternating 1/0 per second: 5 GPU-seconds in any 10 s window.
        assert_eq!(l.usage(G, 999)[0], 5.0);
    }

    #[test]
    fn the_covered_window_grows_from_the_first_usage_to_the_lookback() {
        let mut l = Ledger::new(UsageModel::Window { secs: 100 }, 2);
        assert_eq!(l.covered_secs(50), 0.0);
        l.add_rate(G, 1_000, gpus(2));
        assert_eq!(l.covered_secs(1_000), 0.0);
        assert_eq!(l.covered_secs(1_040), 40.0);
        assert_eq!(l.covered_secs(5_000), 100.0);
        // Usage over the covered part is exactly rate × covered.
        assert_eq!(l.usage(G, 1_040)[0], 2.0 * l.covered_secs(1_040));
        let mut h = Ledger::new(UsageModel::HalfLife { secs: 3600 }, 2);
        h.add_rate(G, 0, gpus(1));
        let tau = 3600.0 / std::f64::consts::LN_2;
        assert!((h.covered_secs(3600) - tau / 2.0).abs() < 1e-6);
        assert!((h.usage(G, 3600)[0] - h.covered_secs(3600)).abs() < 1e-6);
    }

    #[test]
    fn half_life_halves() {
        let mut l = Ledger::new(UsageModel::HalfLife { secs: 3600 }, 2);
        l.add_rate(G, 0, gpus(1));
        l.add_rate(G, 1000, gpus(-1));
        let at_stop = l.usage(G, 1000)[0];
        assert!(at_stop > 900.0 && at_stop < 1000.0, "{at_stop}");
        let later = l.usage(G, 1000 + 3600)[0];
        assert!((later - at_stop / 2.0).abs() < 1e-6, "{later} vs {at_stop}");
    }

    #[test]
    fn a_record_of_an_earlier_release_counts_its_gpus_at_weight_one() {
        let old = r#"{"points":[{"t":0,"cum":[0,0,0,0],"rate":[2,16,64,2]},
            {"t":100,"cum":[200,1600,6400,200],"rate":[2,16,64,2]}],
            "decayed":[0,0,0,0],"decayed_at":0,"rate":[2,16,64,2]}"#;
        let rec: ProjectLedger = serde_json::from_str(old).expect("reads");
        let mut l = Ledger::new(UsageModel::Window { secs: 1000 }, 2);
        l.restore(G, rec.clone());
        let u = l.usage(G, 100);
        assert_eq!(u[Channel::Gpu as usize], 200.0);
        assert_eq!(u[Channel::WeightedGpu as usize], 200_000.0);
        assert_eq!(u[Channel::WeightedFundedGpu as usize], 200_000.0);
        assert_eq!(l.rate(G)[Channel::WeightedGpu as usize], 2000);
        let again: ProjectLedger =
            serde_json::from_str(&serde_json::to_string(&rec).expect("writes")).expect("reads");
        assert_eq!(
            again, rec,
            "a migrated record round-trips with six channels"
        );
        let bad = r#"{"rate":[1,2,3]}"#;
        let e = serde_json::from_str::<ProjectLedger>(bad)
            .unwrap_err()
            .to_string();
        assert!(e.contains("usage channels"), "{e}");
    }
}
