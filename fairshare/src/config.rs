//! Policy settings, each with its default and why.

use crate::ledger::UsageModel;
use crate::time::{de_duration, Secs, DAY, HOUR, MINUTE};
use serde::Deserialize;

/// Default lookback: 7 days of usage.
pub const DEFAULT_WINDOW: Secs = 7 * DAY;
/// Default ranking memory: 0, the lookback itself (one window for budgets and ratios).
pub const DEFAULT_RANKING_LOOKBACK: Secs = 0;
/// Default weight of current allocation in the served ratio: 1 day, so that starting
/// work moves a group's ratio at once (one burst cannot take everything) while history
/// still dominates.
pub const DEFAULT_ALLOCATION_HORIZON: Secs = DAY;
/// Default aging: one priority point per hour of waiting …
pub const DEFAULT_AGING_PER_HOUR: u32 = 1;
/// … up to this many points (and never past the top of its band, see below).
pub const DEFAULT_AGING_CAP: u32 = 24;
/// Default width of a priority band (debug 20, interactive 10, batch 0): aging lifts
/// waiting work above fresh work of its own band but never into the next, so a
/// day-old backlog of batch does not outrank debug work (at 100,000 GPUs every debug
/// job then waited 5 h for its own aging behind it).
pub const DEFAULT_PRIORITY_BAND: u32 = 10;
/// Default hysteresis between served ratios before funded work is preempted.
pub const DEFAULT_HYSTERESIS: f64 = 0.05;
/// Default protection after a preempted workload restarts.
pub const DEFAULT_COOLDOWN: Secs = 30 * MINUTE;
/// Preemption plans per pass (each scans the candidate victims once).
pub const DEFAULT_MAX_PREEMPTION_PLANS: u32 = 16;
/// Gangs holding reservations at once.
pub const DEFAULT_MAX_RESERVATIONS: u32 = 2;
/// Work a resumable lease is taken to lose when revoked: the checkpoint ladder asks
/// it to save first, so at most the time since its last periodic checkpoint.
pub const DEFAULT_CHECKPOINT_LOSS: Secs = 10 * MINUTE;
/// Most work one preemption may throw away, per GPU it gains for the requester:
/// 30 min, so that a 1-GPU request may take a resumable lease of up to 3 GPUs
/// (10 min each) and a gang one per GPU it asks, but nobody's request discards a
/// non-resumable run. Chosen on the suite (`docs/policy/suite.md`): against 2 h, on
/// seeds 1–5, it lost a quarter less work on ai2, under faults and on philly-384,
/// three fifths less on philly-light, and raised the Philly replays' worst or mean
/// teams, nothing worse beyond the seeds' spread; 15 min and 1 h were worse.
pub const DEFAULT_MAX_LOSS_PER_GPU: Secs = 30 * MINUTE;
/// GPUs of small, short work each user may run funded after the project's budget is
/// spent (a debug allowance outside the budget): 16, each job on one node (two
/// 8-GPU debug runs at once), so a person whose team spent its week still debugs
/// in seconds.
pub const DEFAULT_ALLOWANCE_GPUS: u32 = 16;
/// The longest time limit work may declare to run on the allowance: debug runs and
/// interactive sessions, not training.
pub const DEFAULT_ALLOWANCE_MAX_TIME: Secs = 8 * HOUR;
/// Whether a gang whose project's budget is spent may hold a reservation (one at a
/// time, never the last free one): it then takes back only free occupancy when the
/// reservation starts and waits for funded leases to end by their time limits, so
/// a 16-node gang waits hours, not days, once its team has spent its week.
pub const DEFAULT_UNFUNDED_RESERVATIONS: bool = true;
/// Whether resumable backfill on a reserved node must be predicted to end before the
/// reservation starts: a run predicted to outlast it would lose, when the
/// reservation takes the node back, what it did since its last checkpoint. Off: on
/// philly-384 and llm-lab (seeds 1-2) it lost more work, not less (philly-384
/// 20.1k → 22.4k GPU-h); the reservations' losses come from the nodes they take,
/// not from the backfill on them (docs/policy/suite.md).
pub const DEFAULT_BACKFILL_BY_PREDICTION: bool = false;
/// Share of the GPUs kept free for protected work arriving (debug runs, sessions,
/// training): free occupancy (min runtime 0) starts only while 1% stays free. At 2–3×
/// demand every GPU that frees is otherwise taken by the batch backlog within the
/// pass, and each debug job then preempts a batch run, most of them minutes old: in
/// the ai2 month 42,000 preemptions; with 1% kept free 9,000, debug starts in seconds
/// instead of after a victim's checkpoint, and occupancy stays above 98%. Kept on the
/// suite (`docs/policy/suite.md`): 0 lost more work on ai2 and the LLM lab; 2% lost
/// less on ai2 but, with the 30-minute loss bound, cost the LLM lab's worst seed.
pub const DEFAULT_PROTECTED_HEADROOM: f64 = 0.01;
/// How long a soft drain (`Draining`) lets work that cannot checkpoint run on: a day,
/// like Slurm's DRAIN, which lets jobs finish. Resumable work is asked to checkpoint
/// when its min runtime lapses; revoking a non-resumable run at once threw its whole
/// run away (one 16-node gang, 2,400 GPU-hours, in an ai2 month).
pub const DEFAULT_DRAIN_GRACE: Secs = DAY;
/// Workloads looked at per pass, like Slurm's `default_queue_depth`, so a pass stays
/// cheap with tens of thousands pending.
pub const DEFAULT_MAX_EXAMINED: u32 = 2_000;

/// The ledger's unit for weighted GPUs: a thousandth, so weights such as 1.6 count
/// exactly in integers.
pub const MILLI: u64 = 1000;
/// The lightest a GPU type may weigh …
pub const MIN_GPU_WEIGHT: f64 = 0.01;
/// … and the heaviest.
pub const MAX_GPU_WEIGHT: f64 = 100.0;

/// How the core ranks, funds, preempts and reserves.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PolicyConfig {
    /// `window` (hard sliding window) or `half-life` (exponential decay).
    pub usage_model: UsageModelKind,
    /// Window length, or the half-life.
    #[serde(deserialize_with = "de_duration")]
    pub lookback: Secs,
    /// How far back the served ratios that rank groups look (same model), when it
    /// is not the lookback: budgets keep the lookback, ranking remembers longer, so
    /// a team short last week still goes first this week. 0: the lookback.
    #[serde(deserialize_with = "de_duration")]
    pub ranking_lookback: Secs,
    /// How much current allocation weighs in the served ratio (see DEFAULT).
    #[serde(deserialize_with = "de_duration")]
    pub allocation_horizon: Secs,
    /// Priority points gained per hour of waiting.
    pub aging_per_hour: u32,
    /// Most points aging adds.
    pub aging_cap: u32,
    /// Width of a priority band; aging never lifts work into the next (0: no bands).
    pub priority_band: u32,
    /// Ratio margin the requester must stay under the victim's group by.
    pub hysteresis: f64,
    /// Protection after a preempted workload restarts.
    #[serde(deserialize_with = "de_duration")]
    pub cooldown: Secs,
    /// Count CPU and memory too: usage is the dominant share (DRF).
    pub drf: bool,
    /// Preemption plans per pass.
    pub max_preemption_plans: u32,
    /// Gangs holding reservations at once.
    pub max_reservations: u32,
    /// Workloads examined per pass.
    pub max_examined: u32,
    /// Work a resumable lease loses when revoked (what victim choice weighs).
    #[serde(deserialize_with = "de_duration")]
    pub checkpoint_loss: Secs,
    /// Most work a preemption may lose per GPU it gains (GPU-seconds lost ÷ GPUs
    /// claimed); plans that would lose more are not made.
    #[serde(deserialize_with = "de_duration")]
    pub max_loss_per_gpu: Secs,
    /// GPUs per user of small, short protected work funded outside a spent budget
    /// (0 turns the allowance off).
    pub allowance_gpus: u32,
    /// The longest time limit such work may declare.
    #[serde(deserialize_with = "de_duration")]
    pub allowance_max_time: Secs,
    /// Whether an unfunded gang may hold a reservation (see the default).
    pub unfunded_reservations: bool,
    /// Whether backfill on a reserved node must be predicted to end before the
    /// reservation starts (its user's last runs, `runlength.rs`), not merely to pass
    /// its protection by then.
    pub backfill_by_prediction: bool,
    /// Share of the GPUs kept free for protected work: free occupancy does not start
    /// where it would leave fewer free (see the default).
    pub protected_headroom: f64,
    /// How long a soft drain lets work that cannot checkpoint run on before it is
    /// revoked (see the default).
    #[serde(deserialize_with = "de_duration")]
    pub drain_grace: Secs,
    /// What an hour of each GPU type counts for, against an hour of a type not
    /// listed (1.0): `{ h100 = 1.0, b200 = 1.6 }`. Usage and entitlement alike are
    /// in these units, so a team entitled to 10% of a mixed cluster receives 10% of
    /// its weighted capacity, whichever types it runs on.
    pub gpu_hour_weight: std::collections::BTreeMap<String, f64>,
    /// Decide by the rules of 0.4 and earlier (no allowance, no unfunded
    /// reservations, no priority bands, no bound on the work a plan loses, victims and
    /// reserved nodes by GPU-time and lapse alone, backfill by lapse): only for
    /// re-running the passes those releases journaled as `Schedule`, so that replaying
    /// them decides what was decided. Never read from a file.
    #[serde(skip)]
    pub rules_of_0_4: bool,
    /// Classes whose leases are protected by use, not the clock (sessions):
    /// `[policy.protect_by_use.interactive]` with `idle_grace = "30m"`. Such a lease
    /// is protected by its min runtime from its start as any other; once its agent
    /// reports on its use ([`crate::Scheduler::lease_use`]) it is protected while in
    /// use, and idle for `idle_grace` it may be taken like any lapsed lease (see
    /// `docs/policy/sessions.md`). None by default.
    pub protect_by_use: std::collections::BTreeMap<String, UseProtection>,
}

/// How a class protected by use lets its leases go (`policy.protect_by_use`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UseProtection {
    /// How long a lease stays protected after it went idle (no terminal input and
    /// its GPUs idle, as its agent reports).
    #[serde(deserialize_with = "de_duration")]
    pub idle_grace: Secs,
}

/// Which usage model.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum UsageModelKind {
    /// Hard sliding window (default).
    Window,
    /// Exponential half-life.
    HalfLife,
}

impl Default for PolicyConfig {
    fn default() -> Self {
        PolicyConfig {
            usage_model: UsageModelKind::Window,
            lookback: DEFAULT_WINDOW,
            ranking_lookback: DEFAULT_RANKING_LOOKBACK,
            allocation_horizon: DEFAULT_ALLOCATION_HORIZON,
            aging_per_hour: DEFAULT_AGING_PER_HOUR,
            aging_cap: DEFAULT_AGING_CAP,
            priority_band: DEFAULT_PRIORITY_BAND,
            hysteresis: DEFAULT_HYSTERESIS,
            cooldown: DEFAULT_COOLDOWN,
            drf: false,
            max_preemption_plans: DEFAULT_MAX_PREEMPTION_PLANS,
            max_reservations: DEFAULT_MAX_RESERVATIONS,
            max_examined: DEFAULT_MAX_EXAMINED,
            checkpoint_loss: DEFAULT_CHECKPOINT_LOSS,
            max_loss_per_gpu: DEFAULT_MAX_LOSS_PER_GPU,
            allowance_gpus: DEFAULT_ALLOWANCE_GPUS,
            allowance_max_time: DEFAULT_ALLOWANCE_MAX_TIME,
            unfunded_reservations: DEFAULT_UNFUNDED_RESERVATIONS,
            backfill_by_prediction: DEFAULT_BACKFILL_BY_PREDICTION,
            protected_headroom: DEFAULT_PROTECTED_HEADROOM,
            drain_grace: DEFAULT_DRAIN_GRACE,
            gpu_hour_weight: std::collections::BTreeMap::new(),
            rules_of_0_4: false,
            protect_by_use: std::collections::BTreeMap::new(),
        }
    }
}

impl PolicyConfig {
    /// These settings under the rules of 0.4 and earlier (see `rules_of_0_4`).
    pub fn as_of_0_4(&self) -> PolicyConfig {
        PolicyConfig {
            allowance_gpus: 0,
            unfunded_reservations: false,
            backfill_by_prediction: false,
            protected_headroom: 0.0,
            drain_grace: 0,
            ranking_lookback: 0,
            rules_of_0_4: true,
            ..self.clone()
        }
    }

    /// The idle grace of `class` when its leases are protected by use.
    pub fn idle_grace(&self, class: &str) -> Option<Secs> {
        self.protect_by_use.get(class).map(|u| u.idle_grace)
    }

    /// GPUs of `total` that free occupancy leaves free (`protected_headroom`).
    pub fn headroom_gpus(&self, total: u64) -> u64 {
        (self.protected_headroom * total as f64).floor() as u64
    }

    /// The band aging stays inside; none under the rules of 0.4 (aging by the cap
    /// alone).
    pub fn aging_band(&self) -> u32 {
        if self.rules_of_0_4 {
            0
        } else {
            self.priority_band
        }
    }

    /// Most GPU-seconds a preemption or reservation for work of `shape` may lose;
    /// unbounded under the rules of 0.4.
    pub fn plan_loss_budget(&self, shape: &crate::queue::Shape) -> u64 {
        if self.rules_of_0_4 {
            u64::MAX
        } else {
            self.max_loss_per_gpu
                .saturating_mul(u64::from(shape.gpus) * u64::from(shape.nodes))
        }
    }

    /// What a resumable victim is taken to lose (see `Lease::loss_at`); `None` under
    /// the rules of 0.4.
    pub fn victim_loss(&self) -> Option<Secs> {
        (!self.rules_of_0_4).then_some(self.checkpoint_loss)
    }

    /// Whether work of `shape` may run on the allowance: protected, one node, at most
    /// `allowance_gpus`, with a time limit no longer than `allowance_max_time`.
    pub fn allowance_shape(&self, shape: &crate::queue::Shape) -> bool {
        shape.protected
            && shape.nodes == 1
            && shape.gpus <= self.allowance_gpus
            && shape
                .time_limit
                .is_some_and(|tl| tl <= self.allowance_max_time)
    }

    /// GPU-hour weights by type in thousandths (what the ledger counts in); a type
    /// not listed weighs 1.
    pub fn gpu_weights_milli(&self) -> std::collections::BTreeMap<String, u32> {
        self.gpu_hour_weight
            .iter()
            .map(|(t, w)| (t.clone(), (w * MILLI as f64).round() as u32))
            .collect()
    }

    /// The ledger model these settings describe.
    pub fn usage(&self) -> UsageModel {
        self.model_over(self.lookback)
    }

    /// The model of the ranking's own ledger, when its memory differs from the
    /// lookback's (`ranking_lookback`); `None`: ratios read the budget's ledger.
    pub fn ranking_usage(&self) -> Option<UsageModel> {
        (self.ranking_lookback != 0 && self.ranking_lookback != self.lookback)
            .then(|| self.model_over(self.ranking_lookback))
    }

    /// `usage_model` over `secs`.
    fn model_over(&self, secs: Secs) -> UsageModel {
        match self.usage_model {
            UsageModelKind::Window => UsageModel::Window { secs },
            UsageModelKind::HalfLife => UsageModel::HalfLife { secs },
        }
    }

    /// Checks ranges; the error names the field and the fix.
    pub fn validate(&self) -> Result<(), String> {
        if self.lookback < HOUR {
            return Err(format!(
                "policy.lookback = {}s is too short; use at least 1h (default 7d)",
                self.lookback
            ));
        }
        if self.ranking_lookback != 0 && self.ranking_lookback < HOUR {
            return Err(format!(
                "policy.ranking_lookback = {}s is too short; use at least 1h, or 0 (the \
                 lookback)",
                self.ranking_lookback
            ));
        }
        if !(self.hysteresis.is_finite() && self.hysteresis >= 0.0) {
            return Err(format!(
                "policy.hysteresis = {}; use a non-negative number such as 0.05",
                self.hysteresis
            ));
        }
        if !(0.0..=0.5).contains(&self.protected_headroom) {
            return Err(format!(
                "policy.protected_headroom = {}; use a share of the GPUs between 0 and 0.5 \
                 such as 0.01 (1%)",
                self.protected_headroom
            ));
        }
        for (t, w) in &self.gpu_hour_weight {
            if t.is_empty() || t.chars().any(|c| c.is_uppercase() || c.is_whitespace()) {
                return Err(format!(
                    "policy.gpu_hour_weight has the type {t:?}; name types as nodes report \
                     them, in lower case (h100, b200)"
                ));
            }
            if !(w.is_finite() && (MIN_GPU_WEIGHT..=MAX_GPU_WEIGHT).contains(w)) {
                return Err(format!(
                    "policy.gpu_hour_weight.{t} = {w}; use a weight between {MIN_GPU_WEIGHT} \
                     and {MAX_GPU_WEIGHT} (1.0: an hour counts as an hour)"
                ));
            }
        }
        for (class, u) in &self.protect_by_use {
            if !crate::workload::CLASSES.contains(&class.as_str()) {
                return Err(format!(
                    "policy.protect_by_use.{class}: not a workload class; use one of {}",
                    crate::workload::CLASSES.join(", ")
                ));
            }
            if u.idle_grace > crate::time::MAX_CONTRACT {
                return Err(format!(
                    "policy.protect_by_use.{class}.idle_grace = {}s; use at most 365d",
                    u.idle_grace
                ));
            }
        }
        if self.max_examined == 0 {
            return Err("policy.max_examined = 0 would never schedule; use at least 1".into());
        }
        Ok(())
    }
}
