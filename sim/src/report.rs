//! What a simulation run shows: fairness per team, occupancy, waits, preemptions.

use allot_fairshare::config::MILLI;
use allot_fairshare::time::{Secs, Time, HOUR};
use allot_fairshare::tree::{GroupId, OrgTree};
use serde::Serialize;
use std::collections::BTreeMap;

/// One team's line.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TeamRow {
    /// Team name.
    pub name: String,
    /// Configured share of the cluster.
    pub share: f64,
    /// Ideal GPU-hours (weighted max-min among teams with demand, capped by demand).
    pub entitled_gpu_hours: f64,
    /// GPU-hours actually run, funded and unfunded.
    pub received_gpu_hours: f64,
    /// `min(1, received / entitled)`.
    pub ratio: f64,
    /// GPU-hours it was entitled to at the moment but did not run, by the class of the
    /// work it had waiting (in proportion to that work's GPUs): where its shortfall
    /// waited. Moments served above entitlement are not netted against it, so the sum
    /// is at least `entitled_gpu_hours - received_gpu_hours`.
    pub shortfall_gpu_hours: BTreeMap<String, f64>,
    /// `received_gpu_hours` by the class of the work that ran, funded and unfunded:
    /// where a team served above its entitlement got the extra.
    pub received_by: BTreeMap<String, Received>,
}

/// GPU-hours one class of a team's work ran.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Received {
    /// Charged to the budget (or the user's allowance): protected by its contract.
    pub funded_gpu_hours: f64,
    /// Free occupancy, or protected work whose project's budget was spent.
    pub unfunded_gpu_hours: f64,
}

/// Fairness summary.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Fairness {
    /// Mean of team ratios.
    pub mean_ratio: f64,
    /// Worst team ratio.
    pub min_ratio: f64,
    /// Teams with ratio ≥ 0.95.
    pub teams_at_least_0_95: u32,
}

/// Wait percentiles of one class, seconds (never-started work counts its wait so far).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct WaitStats {
    /// Workloads.
    pub count: u64,
    /// Median.
    pub p50: u64,
    /// 90th percentile.
    pub p90: u64,
    /// 99th percentile.
    pub p99: u64,
}

impl WaitStats {
    /// The percentiles of `waits`.
    fn of(mut waits: Vec<u64>) -> WaitStats {
        waits.sort_unstable();
        WaitStats {
            count: waits.len() as u64,
            p50: pct(&waits, 0.5),
            p90: pct(&waits, 0.9),
            p99: pct(&waits, 0.99),
        }
    }
}

/// Waits of the largest gangs.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct GangWait {
    /// Their size in nodes.
    pub nodes: u32,
    /// Median wait.
    pub p50: u64,
    /// 90th percentile.
    pub p90: u64,
}

/// Hourly samples for plots.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Timeline {
    /// Hour index.
    pub hours: Vec<u64>,
    /// Busy GPUs / capacity, per hour.
    pub occupancy: Vec<f64>,
    /// Per team: share of busy GPUs held, per hour.
    pub team_share: Vec<Vec<f64>>,
}

/// The report of one run; `--json` prints it as one object.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Report {
    /// Policy name.
    pub policy: String,
    /// Scenario name.
    pub scenario: String,
    /// Seed.
    pub seed: u64,
    /// Simulated days.
    pub days: u32,
    /// GPUs installed.
    pub gpus: u64,
    /// Busy GPU-hours / capacity.
    pub occupancy: f64,
    /// Share of busy GPU-hours that ran unfunded.
    pub unallocated_occupancy: f64,
    /// Per team.
    pub teams: Vec<TeamRow>,
    /// Summary.
    pub fairness: Fairness,
    /// Per class.
    pub wait_s: BTreeMap<String, WaitStats>,
    /// Leases revoked for preemption (and reservations) that ended that way.
    pub preemptions: u64,
    /// Leases revoked because their node drained.
    pub drain_revocations: u64,
    /// Work redone after revocations, GPU-hours.
    pub lost_gpu_hours: f64,
    /// The same by cause: `preempted-unfunded` (free occupancy taken back),
    /// `preempted-funded` (rebalancing after a contract), `reservation`, `drain`.
    pub lost_gpu_hours_by: BTreeMap<String, f64>,
    /// Waits of the largest gangs.
    pub largest_gang_wait_s: GangWait,
    /// Waits of small short work (at most [`SMALL_GPUS`] GPUs, at most
    /// [`SHORT_WORK`] of running), whatever its class.
    pub small_short_wait_s: WaitStats,
    /// The same, of the small short work that started funded (within its project's
    /// budget or its user's allowance).
    pub small_short_funded_wait_s: WaitStats,
    /// GPU-hours run (busy), what lost work is measured against.
    pub delivered_gpu_hours: f64,
    /// Workloads submitted.
    pub submitted: u64,
    /// Host faults injected.
    pub faults: u64,
    /// Reservations made.
    pub reservations: u64,
    /// Events processed.
    pub events: u64,
    /// Scheduling passes run.
    pub passes: u64,
    /// Wall-clock seconds the run took (set by the caller; the core has no clock).
    pub sim_wall_s: f64,
    /// How sessions fared, when a class has them (`sessions` in a class).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sessions: Option<SessionFigures>,
    /// Hourly samples, when asked for.
    #[serde(skip)]
    pub timeline: Option<Timeline>,
}

/// Sessions' leases and what preemption did to them (a lease revoked for
/// rebalancing or a reservation that ended that way), by what its user was doing
/// when the core decided it. Funded sessions are the ones use protects; an unfunded
/// one (its project's budget spent, its user's allowance taken) is free occupancy.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct SessionFigures {
    /// Session leases started.
    pub leases: u64,
    /// Funded sessions reclaimed while in an active stretch: a session in use lost.
    pub reclaimed_active: u64,
    /// Funded sessions reclaimed while idle.
    pub reclaimed_idle: u64,
    /// Of those, used again before the checkpoint ladder ended.
    pub returned_during_reclaim: u64,
    /// Unfunded sessions reclaimed while active …
    pub unfunded_reclaimed_active: u64,
    /// … and while idle.
    pub unfunded_reclaimed_idle: u64,
}

impl SessionFigures {
    /// A session's lease ended reclaimed: `funded`, `active` when decided, `back`
    /// (active again) when it ended.
    pub fn reclaimed(&mut self, funded: bool, active: bool, back: bool) {
        let n = match (funded, active) {
            (true, true) => &mut self.reclaimed_active,
            (true, false) => &mut self.reclaimed_idle,
            (false, true) => &mut self.unfunded_reclaimed_active,
            (false, false) => &mut self.unfunded_reclaimed_idle,
        };
        *n += 1;
        if funded && !active && back {
            self.returned_during_reclaim += 1;
        }
    }
}

/// Most GPUs of work counted as small (`small_short_wait_s`).
pub const SMALL_GPUS: u32 = 8;
/// Most running time of work counted as short.
pub const SHORT_WORK: Secs = 30 * 60;

fn round4(x: f64) -> f64 {
    (x * 1e4).round() / 1e4
}

fn pct(sorted: &[u64], p: f64) -> u64 {
    allot_common::stats::percentile(sorted, p).unwrap_or(0)
}

/// Accumulates a run's figures.
pub(crate) struct Builder {
    names: Vec<String>,
    shares: Vec<f64>,
    total_gpus: u64,
    entitled: Vec<f64>,
    received: Vec<f64>,
    /// Workload classes by first appearance; indices of `waiting` and `shortfall`.
    classes: Vec<String>,
    /// Per team and class: GPUs of work waiting to start.
    waiting: Vec<Vec<u64>>,
    /// Per team and class: GPU-seconds of entitlement not run (see [`TeamRow`]).
    shortfall: Vec<Vec<f64>>,
    /// Per team and class: GPU-seconds run, funded and unfunded.
    ran: Vec<Vec<[f64; 2]>>,
    busy_s: f64,
    unfunded_s: f64,
    waits: BTreeMap<String, Vec<u64>>,
    gang_waits: BTreeMap<u32, Vec<u64>>,
    /// Waits of small short work: all, and those that started funded.
    small_short: [Vec<u64>; 2],
    timeline: Option<Timeline>,
    next_sample: Time,
    pub preemptions: u64,
    pub drain_revocations: u64,
    pub lost_gpu_s: u64,
    lost_by: BTreeMap<&'static str, u64>,
    pub submitted: u64,
    pub faults: u64,
    pub reservations: u64,
    pub events: u64,
    pub passes: u64,
    pub sessions: Option<SessionFigures>,
}

impl Builder {
    pub fn new(tree: &OrgTree, teams: &[GroupId], total_gpus: u64, timeline: bool) -> Self {
        Builder {
            names: teams.iter().map(|t| tree.group(*t).name.clone()).collect(),
            shares: teams.iter().map(|t| tree.group(*t).share).collect(),
            total_gpus,
            entitled: vec![0.0; teams.len()],
            received: vec![0.0; teams.len()],
            classes: Vec::new(),
            waiting: vec![Vec::new(); teams.len()],
            shortfall: vec![Vec::new(); teams.len()],
            ran: vec![Vec::new(); teams.len()],
            busy_s: 0.0,
            unfunded_s: 0.0,
            waits: BTreeMap::new(),
            gang_waits: BTreeMap::new(),
            small_short: [Vec::new(), Vec::new()],
            timeline: timeline.then(|| Timeline {
                team_share: vec![Vec::new(); teams.len()],
                ..Timeline::default()
            }),
            next_sample: 0,
            preemptions: 0,
            drain_revocations: 0,
            lost_gpu_s: 0,
            lost_by: BTreeMap::new(),
            submitted: 0,
            faults: 0,
            reservations: 0,
            events: 0,
            passes: 0,
            sessions: None,
        }
    }

    /// Adds the interval [from, to) at constant allocation: `recv`, each team's GPUs
    /// weighted by type in thousandths (`gpu_hour_weight`), `ent` its entitlement in
    /// weighted GPUs, `busy` GPUs.
    pub fn integrate(
        &mut self,
        from: Time,
        to: Time,
        recv: &[u64],
        ent: &[f64],
        busy: u64,
        unfunded: u64,
    ) {
        if to <= from {
            return;
        }
        let dt = (to - from) as f64;
        let held = |i: usize| recv[i] as f64 / MILLI as f64;
        for (i, &ent) in ent.iter().enumerate().take(recv.len()) {
            self.received[i] += held(i) * dt;
            self.entitled[i] += ent * dt;
            let gap = ent - held(i);
            if gap <= 0.0 {
                continue;
            }
            let waiting: u64 = self.waiting[i].iter().sum();
            if waiting > 0 {
                let per_gpu = gap * dt / waiting as f64;
                for (s, &w) in self.shortfall[i].iter_mut().zip(&self.waiting[i]) {
                    *s += per_gpu * w as f64;
                }
            }
        }
        self.busy_s += busy as f64 * dt;
        self.unfunded_s += unfunded as f64 * dt;
        if let Some(tl) = &mut self.timeline {
            while self.next_sample < to {
                if self.next_sample >= from {
                    tl.hours.push(self.next_sample / HOUR);
                    tl.occupancy
                        .push(busy as f64 / self.total_gpus.max(1) as f64);
                    for (i, s) in tl.team_share.iter_mut().enumerate() {
                        s.push(if busy == 0 {
                            0.0
                        } else {
                            held(i) / busy as f64
                        });
                    }
                }
                self.next_sample += HOUR;
            }
        }
    }

    /// The index of workload class `name`, entered on first sight (scenarios have a
    /// handful, so a scan).
    pub fn class_index(&mut self, name: &str) -> usize {
        if let Some(i) = self.classes.iter().position(|c| c == name) {
            return i;
        }
        self.classes.push(name.to_string());
        for v in &mut self.waiting {
            v.push(0);
        }
        for v in &mut self.shortfall {
            v.push(0.0);
        }
        for v in &mut self.ran {
            v.push([0.0; 2]);
        }
        self.classes.len() - 1
    }

    /// `gpus` of `team`'s work of class `class` (an index) begin to wait.
    pub fn wait_begins(&mut self, team: usize, class: usize, gpus: u64) {
        self.waiting[team][class] += gpus;
    }

    /// `gpus` of `team`'s waiting work of class `class` started.
    pub fn wait_ends(&mut self, team: usize, class: usize, gpus: u64) {
        let w = &mut self.waiting[team][class];
        debug_assert!(*w >= gpus, "started more than waited");
        *w = w.saturating_sub(gpus);
    }

    /// A run of `team`'s work of class `class` (an index) held `gpu_s` GPU-seconds,
    /// `funded` or not; told once, when it ends (or when the simulation does).
    pub fn ran(&mut self, team: usize, class: usize, funded: bool, gpu_s: u64) {
        self.ran[team][class][usize::from(!funded)] += gpu_s as f64;
    }

    /// Records work lost to a revocation, by its cause.
    pub fn lost(&mut self, cause: &'static str, gpu_s: u64) {
        self.lost_gpu_s += gpu_s;
        *self.lost_by.entry(cause).or_default() += gpu_s;
    }

    /// Records a first start (or a censored wait at the end).
    pub fn waited(&mut self, class: &str, nodes: u32, wait: Secs) {
        self.waits.entry(class.to_string()).or_default().push(wait);
        self.gang_waits.entry(nodes).or_default().push(wait);
    }

    /// Records the wait of small short work; `funded`: it started funded (`None`:
    /// it never started).
    pub fn small_short_waited(&mut self, wait: Secs, funded: Option<bool>) {
        self.small_short[0].push(wait);
        if funded == Some(true) {
            self.small_short[1].push(wait);
        }
    }

    pub fn finish(
        mut self,
        policy: &str,
        scenario: &str,
        seed: u64,
        days: u32,
        horizon: Time,
    ) -> Report {
        let teams: Vec<TeamRow> = (0..self.names.len())
            .map(|i| {
                let e = self.entitled[i] / 3_600.0;
                let r = self.received[i] / 3_600.0;
                TeamRow {
                    name: self.names[i].clone(),
                    share: round4(self.shares[i]),
                    entitled_gpu_hours: round4(e),
                    received_gpu_hours: round4(r),
                    ratio: round4(if e <= 0.0 { 1.0 } else { (r / e).min(1.0) }),
                    shortfall_gpu_hours: self
                        .classes
                        .iter()
                        .zip(&self.shortfall[i])
                        .filter(|(_, s)| **s > 0.0)
                        .map(|(c, s)| (c.clone(), round4(s / 3_600.0)))
                        .collect(),
                    received_by: self
                        .classes
                        .iter()
                        .zip(&self.ran[i])
                        .filter(|(_, x)| x[0] + x[1] > 0.0)
                        .map(|(c, x)| {
                            let got = Received {
                                funded_gpu_hours: round4(x[0] / 3_600.0),
                                unfunded_gpu_hours: round4(x[1] / 3_600.0),
                            };
                            (c.clone(), got)
                        })
                        .collect(),
                }
            })
            .collect();
        let n = teams.len().max(1) as f64;
        let fairness = Fairness {
            mean_ratio: round4(teams.iter().map(|t| t.ratio).sum::<f64>() / n),
            min_ratio: teams.iter().map(|t| t.ratio).fold(1.0, f64::min),
            teams_at_least_0_95: teams.iter().filter(|t| t.ratio >= 0.95).count() as u32,
        };
        let wait_s = std::mem::take(&mut self.waits)
            .into_iter()
            .map(|(k, v)| (k, WaitStats::of(v)))
            .collect();
        let [small, small_funded] = std::mem::take(&mut self.small_short);
        let largest_gang_wait_s = match self.gang_waits.iter_mut().next_back() {
            Some((&nodes, v)) => {
                v.sort_unstable();
                GangWait {
                    nodes,
                    p50: pct(v, 0.5),
                    p90: pct(v, 0.9),
                }
            }
            None => GangWait {
                nodes: 0,
                p50: 0,
                p90: 0,
            },
        };
        let capacity = self.total_gpus as f64 * horizon as f64;
        Report {
            policy: policy.into(),
            scenario: scenario.into(),
            seed,
            days,
            gpus: self.total_gpus,
            occupancy: round4(self.busy_s / capacity.max(1.0)),
            unallocated_occupancy: round4(if self.busy_s > 0.0 {
                self.unfunded_s / self.busy_s
            } else {
                0.0
            }),
            teams,
            fairness,
            wait_s,
            preemptions: self.preemptions,
            drain_revocations: self.drain_revocations,
            lost_gpu_hours: round4(self.lost_gpu_s as f64 / 3_600.0),
            lost_gpu_hours_by: self
                .lost_by
                .iter()
                .map(|(k, v)| (k.to_string(), round4(*v as f64 / 3_600.0)))
                .collect(),
            largest_gang_wait_s,
            small_short_wait_s: WaitStats::of(small),
            small_short_funded_wait_s: WaitStats::of(small_funded),
            delivered_gpu_hours: round4(self.busy_s / 3_600.0),
            submitted: self.submitted,
            faults: self.faults,
            reservations: self.reservations,
            events: self.events,
            passes: self.passes,
            sim_wall_s: 0.0,
            sessions: self.sessions,
            timeline: self.timeline,
        }
    }
}

impl Report {
    /// The table for people.
    pub fn table(&self) -> String {
        use allot_fairshare::time::format_duration as d;
        let mut s = format!(
            "scenario {} · policy {} · seed {} · {} days · {} GPUs\n\n",
            self.scenario, self.policy, self.seed, self.days, self.gpus
        );
        s += &format!(
            "occupancy {:.1}%  (unallocated {:.1}% of busy)   preemptions {}   drain revocations {}   lost {:.0} GPU-h\n\n",
            self.occupancy * 100.0,
            self.unallocated_occupancy * 100.0,
            self.preemptions,
            self.drain_revocations,
            self.lost_gpu_hours
        );
        if let Some(sf) = &self.sessions {
            s += &format!(
                "sessions {}   funded reclaimed while active {}   while idle {} (used again \
                 before the end {})   unfunded reclaimed while active {}   while idle {}\n\n",
                sf.leases,
                sf.reclaimed_active,
                sf.reclaimed_idle,
                sf.returned_during_reclaim,
                sf.unfunded_reclaimed_active,
                sf.unfunded_reclaimed_idle
            );
        }
        s += &format!(
            "{:<14} {:>7} {:>12} {:>12} {:>11} {:>7} {:>10}  {}\n",
            "team",
            "share",
            "entitled h",
            "received h",
            "unfunded h",
            "ratio",
            "short h",
            "mostly waiting"
        );
        for t in &self.teams {
            let short: f64 = t.shortfall_gpu_hours.values().sum();
            let mostly = t
                .shortfall_gpu_hours
                .iter()
                .max_by(|a, b| a.1.total_cmp(b.1))
                .map_or("-", |(c, _)| c.as_str());
            let unfunded: f64 = t.received_by.values().map(|x| x.unfunded_gpu_hours).sum();
            s += &format!(
                "{:<14} {:>6.1}% {:>12.0} {:>12.0} {:>11.0} {:>7.3} {:>10.0}  {}\n",
                t.name,
                t.share * 100.0,
                t.entitled_gpu_hours,
                t.received_gpu_hours,
                unfunded,
                t.ratio,
                short,
                mostly
            );
        }
        s += &format!(
            "fairness: mean {:.3}, worst {:.3}, {} of {} teams ≥ 0.95\n\n",
            self.fairness.mean_ratio,
            self.fairness.min_ratio,
            self.fairness.teams_at_least_0_95,
            self.teams.len()
        );
        s += &format!(
            "{:<14} {:>8} {:>9} {:>9} {:>9}\n",
            "class", "count", "p50", "p90", "p99"
        );
        for (k, w) in &self.wait_s {
            s += &format!(
                "{:<14} {:>8} {:>9} {:>9} {:>9}\n",
                k,
                w.count,
                d(w.p50),
                d(w.p90),
                d(w.p99)
            );
        }
        s += &format!(
            "largest gangs ({} nodes): wait p50 {}, p90 {}\n",
            self.largest_gang_wait_s.nodes,
            d(self.largest_gang_wait_s.p50),
            d(self.largest_gang_wait_s.p90)
        );
        s += &format!(
            "{} workloads, {} events, {} passes, {} reservations, {} faults, {:.2}s wall\n",
            self.submitted,
            self.events,
            self.passes,
            self.reservations,
            self.faults,
            self.sim_wall_s
        );
        s
    }
}

/// One measure over several seeds.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Spread {
    /// What is measured, as the table names it.
    pub measure: String,
    /// Lowest value.
    pub min: f64,
    /// Median (the mean of the middle two for an even count).
    pub median: f64,
    /// Highest value.
    pub max: f64,
}

/// The same scenario and policy over several seeds: each run and the spread of each
/// measure (`allot-sim --seeds 1-10`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SeedTable {
    /// Policy name.
    pub policy: String,
    /// Scenario name.
    pub scenario: String,
    /// The seeds, in order.
    pub seeds: Vec<u64>,
    /// Min / median / max of each measure.
    pub spread: Vec<Spread>,
    /// Every run.
    pub runs: Vec<Report>,
}

impl Report {
    /// The figures a seed table compares, named: fairness, occupancy, waits of every
    /// class (p90, p99), the largest gangs' p90, preemptions and work lost.
    pub fn measures(&self) -> Vec<(String, f64)> {
        let mut m = vec![
            ("mean ratio".to_string(), self.fairness.mean_ratio),
            ("worst ratio".to_string(), self.fairness.min_ratio),
            ("occupancy".to_string(), self.occupancy),
        ];
        for (class, w) in &self.wait_s {
            m.push((format!("{class} p90 s"), w.p90 as f64));
            m.push((format!("{class} p99 s"), w.p99 as f64));
        }
        m.push((
            format!("{}-node gang p90 s", self.largest_gang_wait_s.nodes),
            self.largest_gang_wait_s.p90 as f64,
        ));
        m.push(("preemptions".to_string(), self.preemptions as f64));
        if let Some(sf) = &self.sessions {
            m.push((
                "sessions reclaimed active".to_string(),
                sf.reclaimed_active as f64,
            ));
            m.push((
                "sessions reclaimed idle".to_string(),
                sf.reclaimed_idle as f64,
            ));
            m.push((
                "unfunded sessions reclaimed active".to_string(),
                sf.unfunded_reclaimed_active as f64,
            ));
            m.push((
                "unfunded sessions reclaimed idle".to_string(),
                sf.unfunded_reclaimed_idle as f64,
            ));
        }
        m.push(("lost GPU-h".to_string(), self.lost_gpu_hours));
        m.push(("wall s".to_string(), self.sim_wall_s));
        m
    }
}

impl SeedTable {
    /// The spread of every measure over `runs` (one per seed, in seed order).
    pub fn new(runs: Vec<Report>) -> Self {
        let first = runs.first();
        let names: Vec<String> = first
            .map(|r| r.measures().into_iter().map(|(k, _)| k).collect())
            .unwrap_or_default();
        let per_run: Vec<Vec<(String, f64)>> = runs.iter().map(Report::measures).collect();
        let spread = names
            .into_iter()
            .map(|name| {
                let mut v: Vec<f64> = per_run
                    .iter()
                    .filter_map(|m| m.iter().find(|(k, _)| *k == name).map(|x| x.1))
                    .collect();
                v.sort_by(f64::total_cmp);
                let n = v.len();
                let median = match n {
                    0 => 0.0,
                    _ if n % 2 == 1 => v[n / 2],
                    _ => (v[n / 2 - 1] + v[n / 2]) / 2.0,
                };
                Spread {
                    measure: name,
                    min: v.first().copied().unwrap_or(0.0),
                    median,
                    max: v.last().copied().unwrap_or(0.0),
                }
            })
            .collect();
        SeedTable {
            policy: first.map(|r| r.policy.clone()).unwrap_or_default(),
            scenario: first.map(|r| r.scenario.clone()).unwrap_or_default(),
            seeds: runs.iter().map(|r| r.seed).collect(),
            spread,
            runs,
        }
    }

    /// The table for people: one row per measure, min / median / max, then a column
    /// per seed.
    pub fn table(&self) -> String {
        let fmt = |name: &str, x: f64| {
            if name.ends_with("ratio") || name == "occupancy" {
                format!("{x:.3}")
            } else if name == "wall s" {
                format!("{x:.1}")
            } else {
                format!("{x:.0}")
            }
        };
        let mut s = format!(
            "scenario {} · policy {} · seeds {}\n\n{:<22} {:>9} {:>9} {:>9}",
            self.scenario,
            self.policy,
            self.seeds
                .iter()
                .map(u64::to_string)
                .collect::<Vec<_>>()
                .join(","),
            "measure",
            "min",
            "median",
            "max"
        );
        for seed in &self.seeds {
            s += &format!(" {:>9}", format!("seed {seed}"));
        }
        s.push('\n');
        for sp in &self.spread {
            s += &format!(
                "{:<22} {:>9} {:>9} {:>9}",
                sp.measure,
                fmt(&sp.measure, sp.min),
                fmt(&sp.measure, sp.median),
                fmt(&sp.measure, sp.max)
            );
            for r in &self.runs {
                let v = r
                    .measures()
                    .into_iter()
                    .find(|(k, _)| *k == sp.measure)
                    .map_or(String::from("-"), |(_, x)| fmt(&sp.measure, x));
                s += &format!(" {v:>9}");
            }
            s.push('\n');
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use allot_fairshare::tree::GroupSpec;

    fn one_team() -> Builder {
        let tree = OrgTree::new(&[GroupSpec {
            name: "a".into(),
            parent: None,
            weight: 1.0,
        }])
        .expect("tree");
        let teams = tree.teams().to_vec();
        Builder::new(&tree, &teams, 16, false)
    }

    #[test]
    fn shortfall_goes_to_the_waiting_classes_by_their_gpus_and_is_not_netted() {
        let mut b = one_team();
        let (batch, debug) = (b.class_index("batch"), b.class_index("debug"));
        assert_eq!(b.class_index("batch"), batch, "a class keeps its index");
        b.wait_begins(0, batch, 6);
        b.wait_begins(0, debug, 2);
        // An hour 8 GPUs short of entitlement: 6 to batch, 2 to debug.
        b.integrate(0, HOUR, &[4_000], &[12.0], 4, 0);
        b.wait_ends(0, debug, 2);
        // An hour 2 short: all of it to batch, which alone waits now.
        b.integrate(HOUR, 2 * HOUR, &[10_000], &[12.0], 10, 0);
        // An hour 8 above entitlement: nothing taken back.
        b.integrate(2 * HOUR, 3 * HOUR, &[12_000], &[4.0], 12, 0);
        let r = b.finish("fairshare", "t", 1, 1, 3 * HOUR);
        let t = &r.teams[0];
        assert_eq!(t.shortfall_gpu_hours.get("batch"), Some(&8.0));
        assert_eq!(t.shortfall_gpu_hours.get("debug"), Some(&2.0));
        assert_eq!(t.entitled_gpu_hours - t.received_gpu_hours, 2.0);
    }

    #[test]
    fn what_ran_is_told_by_class_and_funding() {
        let mut b = one_team();
        let (training, batch) = (b.class_index("training"), b.class_index("batch"));
        b.ran(0, training, true, 8 * HOUR);
        b.ran(0, training, false, 2 * HOUR);
        b.ran(0, batch, false, 3 * HOUR);
        b.class_index("debug");
        let r = b.finish("fairshare", "t", 1, 1, HOUR);
        let by = &r.teams[0].received_by;
        let t = by.get("training").expect("training ran");
        assert_eq!((t.funded_gpu_hours, t.unfunded_gpu_hours), (8.0, 2.0));
        assert_eq!(by.get("batch").map(|x| x.unfunded_gpu_hours), Some(3.0));
        assert!(
            !by.contains_key("debug"),
            "a class that never ran is left out"
        );
        assert!(r.table().contains("unfunded h"));
    }

    #[test]
    fn no_shortfall_without_waiting_work_or_below_entitlement() {
        let mut b = one_team();
        let batch = b.class_index("batch");
        b.integrate(0, HOUR, &[4_000], &[12.0], 4, 0);
        b.wait_begins(0, batch, 8);
        b.integrate(HOUR, 2 * HOUR, &[12_000], &[12.0], 12, 0);
        let r = b.finish("fairshare", "t", 1, 1, 2 * HOUR);
        assert!(r.teams[0].shortfall_gpu_hours.is_empty());
        assert!(r.table().contains("mostly waiting"));
    }
}
