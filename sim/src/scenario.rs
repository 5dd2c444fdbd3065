//! Scenario files (TOML): clusters, the org tree, workload classes, faults,
//! checkpoint cost, policy settings. Errors name the file, the line and the field.

use super::rng::Rng;
use allot_fairshare::cluster::NodeSpec;
use allot_fairshare::config::PolicyConfig;
use allot_fairshare::time::{de_duration, de_opt_duration, Secs, Time, DAY, HOUR};
use allot_fairshare::tree::GroupSpec;
use allot_fairshare::workload::WorkloadSpec;
use serde::Deserialize;
use std::collections::BTreeMap;

/// The built-in scenario modelled on the published setting.
pub const AI2: &str = include_str!("ai2.toml");

/// The longest `pass_interval` a scenario may ask for.
pub const MAX_PASS_INTERVAL: Secs = HOUR;

/// A scenario file that could not be used: file, line, field and fix, like every
/// config error.
pub type ScenarioError = allot_common::config_error::ConfigError;

/// One cluster: identical nodes.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterSpec {
    /// Name; gangs never span clusters.
    pub name: String,
    /// Node count.
    pub nodes: u32,
    /// GPUs per node.
    pub gpus_per_node: u32,
    /// CPU cores per node.
    #[serde(default = "default_cpu")]
    pub cpu_per_node: u32,
    /// Memory per node, GB.
    #[serde(default = "default_mem")]
    pub memory_gb_per_node: u32,
    /// Its GPUs' type (`h100`, `b300`), as agents report it; empty: not said.
    #[serde(default)]
    pub gpu_type: String,
}

fn default_cpu() -> u32 {
    128
}
fn default_mem() -> u32 {
    2048
}
fn one() -> f64 {
    1.0
}

/// A project inside a team.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProjectSpec {
    /// Unique name.
    pub name: String,
    /// Weight among the team's projects.
    #[serde(default = "one")]
    pub weight: f64,
}

/// A team: a child of the root, optionally split into projects.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TeamSpec {
    /// Unique name.
    pub name: String,
    /// Weight among teams.
    pub weight: f64,
    /// Multiplier on the team's share of every class's arrivals (1 = demand follows
    /// share).
    #[serde(default = "one")]
    pub demand: f64,
    /// Projects; none means the team itself is the project.
    #[serde(default)]
    pub projects: Vec<ProjectSpec>,
    /// Users submitting its work, each workload from one drawn at random (1: the
    /// single user `TEAM-user`; more: `TEAM-user1` …). Per-user limits such as the
    /// debug allowance follow.
    #[serde(default = "one_user")]
    pub users: u32,
}

fn one_user() -> u32 {
    1
}

/// Most users a scenario's team may have.
pub const MAX_USERS: u32 = 100_000;

/// How long a run takes.
#[derive(Debug, Clone, Deserialize)]
#[serde(tag = "dist", rename_all = "kebab-case", deny_unknown_fields)]
pub enum DurationDist {
    /// Log-normal around `median` with shape `sigma`, clipped to [min, max].
    Lognormal {
        /// Median.
        #[serde(deserialize_with = "de_duration")]
        median: Secs,
        /// Shape.
        sigma: f64,
        /// Lower clip.
        #[serde(default, deserialize_with = "de_duration")]
        min: Secs,
        /// Upper clip.
        #[serde(deserialize_with = "de_duration")]
        max: Secs,
    },
    /// Exponential with `mean`, clipped to [min, max].
    Exp {
        /// Mean.
        #[serde(deserialize_with = "de_duration")]
        mean: Secs,
        /// Lower clip.
        #[serde(default, deserialize_with = "de_duration")]
        min: Secs,
        /// Upper clip.
        #[serde(deserialize_with = "de_duration")]
        max: Secs,
    },
    /// Uniform in [min, max].
    Uniform {
        /// Lower bound.
        #[serde(deserialize_with = "de_duration")]
        min: Secs,
        /// Upper bound.
        #[serde(deserialize_with = "de_duration")]
        max: Secs,
    },
}

impl DurationDist {
    pub(crate) fn sample(&self, rng: &mut Rng) -> Secs {
        let (v, lo, hi) = match *self {
            DurationDist::Lognormal {
                median,
                sigma,
                min,
                max,
            } => ((median as f64) * (sigma * rng.normal()).exp(), min, max),
            DurationDist::Exp { mean, min, max } => (rng.exp(mean as f64), min, max),
            DurationDist::Uniform { min, max } => {
                (min as f64 + rng.unit() * (max - min) as f64, min, max)
            }
        };
        (v.round() as Secs).clamp(lo.max(1), hi.max(1))
    }
}

/// A stream of similar workloads.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClassSpec {
    /// Class label.
    pub name: String,
    /// Poisson arrivals per hour, whole cluster.
    pub arrivals_per_hour: f64,
    /// GPUs per node → probability weight.
    pub gpus: BTreeMap<String, f64>,
    /// Nodes → probability weight (default: always 1).
    #[serde(default)]
    pub nodes: BTreeMap<String, f64>,
    /// Run length.
    pub duration: DurationDist,
    /// Protected time; 0 = unfunded, always preemptible.
    #[serde(deserialize_with = "de_duration")]
    pub min_runtime: Secs,
    /// Optional time limit.
    #[serde(default, deserialize_with = "de_opt_duration")]
    pub time_limit: Option<Secs>,
    /// Share of workloads that can checkpoint and resume (0..=1).
    #[serde(default = "one")]
    pub resumable: f64,
    /// Priority → probability weight (default: always 0).
    #[serde(default)]
    pub priority: BTreeMap<String, f64>,
    /// CPU cores per GPU requested.
    #[serde(default = "default_cpu_per_gpu")]
    pub cpu_per_gpu: u32,
    /// GB of memory per GPU requested.
    #[serde(default = "default_mem_per_gpu")]
    pub mem_per_gpu_gb: u32,
    /// GPU type asked (`--gpu-type`) → probability weight; `any` asks none
    /// (default: always any).
    #[serde(default)]
    pub gpu_types: BTreeMap<String, f64>,
    /// Interactive sessions: while a lease of this class runs, its user alternates
    /// active and idle stretches, which the engine reports to the core as an agent
    /// would (`Scheduler::lease_use`). None: the class's work has no use to report.
    #[serde(default)]
    pub sessions: Option<SessionSpec>,
}

/// `sessions = { active = …, idle = …, idle_after = "15m" }`: how a session is used.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SessionSpec {
    /// How long a stretch of use lasts (terminal input, or its GPUs busy); each lease
    /// starts with one.
    pub active: DurationDist,
    /// How long a stretch without use lasts.
    pub idle: DurationDist,
    /// How long the agent waits without input and with idle GPUs before it reports
    /// the session idle (since its last use); use is reported at once.
    #[serde(default = "default_idle_after", deserialize_with = "de_duration")]
    pub idle_after: Secs,
}

fn default_idle_after() -> Secs {
    15 * 60
}

fn default_cpu_per_gpu() -> u32 {
    8
}
fn default_mem_per_gpu() -> u32 {
    64
}

/// Host faults, per node per day.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Faults {
    /// Rate of `drain` verdicts (resumable leases end at their min-runtime lapse, the
    /// others when they finish or `policy.drain_grace` later).
    #[serde(default)]
    pub drain_per_node_day: f64,
    /// Rate of `drain-now` verdicts (leases end at once).
    #[serde(default)]
    pub drain_now_per_node_day: f64,
    /// Time the repair (reset or reboot plus checks) takes; it starts once the node's
    /// last lease has left.
    #[serde(default = "default_repair", deserialize_with = "de_duration")]
    pub repair: Secs,
}

fn default_repair() -> Secs {
    4 * HOUR
}

impl Default for Faults {
    fn default() -> Self {
        Faults {
            drain_per_node_day: 0.0,
            drain_now_per_node_day: 0.0,
            repair: default_repair(),
        }
    }
}

/// What a preemption costs.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Checkpoint {
    /// From revocation to the GPUs being free (the checkpoint ladder).
    #[serde(default = "default_save", deserialize_with = "de_duration")]
    pub save: Secs,
    /// Work lost per preemption of resumable work (since the last checkpoint).
    #[serde(default = "default_lost", deserialize_with = "de_duration")]
    pub lost: Secs,
}

fn default_save() -> Secs {
    60
}
fn default_lost() -> Secs {
    600
}

impl Default for Checkpoint {
    fn default() -> Self {
        Checkpoint {
            save: default_save(),
            lost: default_lost(),
        }
    }
}

/// Settings of the static-priority baseline.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BaselineSpec {
    /// A team's concurrent-GPU cap for protected work, as a multiple of its share of
    /// the GPUs.
    #[serde(default = "one")]
    pub cap_factor: f64,
}

impl Default for BaselineSpec {
    fn default() -> Self {
        BaselineSpec { cap_factor: 1.0 }
    }
}

/// A scenario as written.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Scenario {
    /// Name, shown in reports.
    pub name: String,
    /// Simulated days.
    #[serde(default = "default_days")]
    pub days: u32,
    /// Seed for every random draw.
    #[serde(default)]
    pub seed: u64,
    /// At most one scheduling pass per this much simulated time, as `allotd` with
    /// `server.min_pass_interval`; 0 (the default) runs a pass at every event's
    /// second, as `allotd` does with its 20 ms debounce.
    #[serde(default, deserialize_with = "de_duration")]
    pub pass_interval: Secs,
    /// Policy settings (defaults as in `PolicyConfig`).
    #[serde(default)]
    pub policy: PolicyConfig,
    /// Clusters.
    pub clusters: Vec<ClusterSpec>,
    /// Teams of the org tree.
    #[serde(default)]
    pub teams: Vec<TeamSpec>,
    /// Workload classes.
    #[serde(default)]
    pub classes: Vec<ClassSpec>,
    /// Host faults.
    #[serde(default)]
    pub faults: Faults,
    /// Preemption cost.
    #[serde(default)]
    pub checkpoint: Checkpoint,
    /// Baseline settings.
    #[serde(default)]
    pub baseline: BaselineSpec,
    /// The trace this scenario replays, if it names one.
    #[serde(default)]
    pub trace: Option<TraceSpec>,
    /// Offered load against the scenario as written: every class's arrivals, or a
    /// trace's arrival rate (submit times ÷ `load`), times this. 1 leaves it.
    #[serde(default = "one")]
    pub load: f64,
    /// How `allot-sim suite` runs it.
    #[serde(default)]
    pub suite: SuiteSpec,
}

/// `[suite]`: how `allot-sim suite` runs a scenario.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SuiteSpec {
    /// Part of `--quick` (the suite CI runs).
    #[serde(default = "yes")]
    pub quick: bool,
    /// Its seeds when the suite's are not given (a range or list, as `--seeds`).
    #[serde(default)]
    pub seeds: Option<String>,
    /// The wall time one run of allot's policy must stay under, seconds.
    #[serde(default)]
    pub max_wall_s: Option<f64>,
    /// Targets the default policy is known to miss here (their names as the suite
    /// prints them, or the start of one): `--strict` fails only on the others, and
    /// on a known miss that is met now (the list must stay true).
    #[serde(default)]
    pub known_misses: Vec<String>,
}

fn yes() -> bool {
    true
}

impl Default for SuiteSpec {
    fn default() -> Self {
        SuiteSpec {
            quick: true,
            seeds: None,
            max_wall_s: None,
            known_misses: Vec::new(),
        }
    }
}

/// Deepest chain of `extends` a scenario may have.
const MAX_EXTENDS: usize = 4;

/// `over` laid on `base`: tables merge key by key, anything else (arrays of tables
/// included) replaces.
fn overlay(base: &mut toml::Table, over: toml::Table) {
    for (k, v) in over {
        match (base.get_mut(&k), v) {
            (Some(toml::Value::Table(b)), toml::Value::Table(o)) => overlay(b, o),
            (_, v) => {
                base.insert(k, v);
            }
        }
    }
}

/// The text of the scenario `text` (read from `file`) with the one it `extends`
/// merged under it: `extends = "ai2"` (built-in) or a path relative to `file`.
fn resolve_extends(text: &str, file: &str, depth: usize) -> Result<String, ScenarioError> {
    let table: toml::Table = allot_common::config_error::from_toml(text, file, "(syntax)")?;
    let Some(base) = table.get("extends") else {
        return Ok(text.to_string());
    };
    let pos = allot_common::config_error::Positions::new(text, file);
    let Some(base) = base.as_str() else {
        return Err(pos.error(
            "extends",
            "must be a string: \"ai2\" or a scenario file's path",
        ));
    };
    if depth >= MAX_EXTENDS {
        return Err(pos.error(
            "extends",
            format!("more than {MAX_EXTENDS} scenarios extend each other; extend one that extends nothing"),
        ));
    }
    let (base_text, base_file) = if base == "ai2" {
        (AI2.to_string(), "ai2 (built-in)".to_string())
    } else {
        let dir = std::path::Path::new(file)
            .parent()
            .unwrap_or(std::path::Path::new(""));
        let path = dir.join(base);
        let text = std::fs::read_to_string(&path).map_err(|e| {
            pos.error(
                "extends",
                format!("{}: cannot read it ({e}); name a scenario file relative to this one, or \"ai2\"", path.display()),
            )
        })?;
        (text, path.display().to_string())
    };
    let base_text = resolve_extends(&base_text, &base_file, depth + 1)?;
    let mut merged: toml::Table =
        allot_common::config_error::from_toml(&base_text, &base_file, "(syntax)")?;
    let mut over = table;
    over.remove("extends");
    // A trace path is relative to the file that names it: the base's, made absolute.
    if let Some(toml::Value::Table(tr)) = merged.get_mut("trace") {
        if let Some(toml::Value::String(p)) = tr.get_mut("path") {
            let dir = std::path::Path::new(&base_file)
                .parent()
                .filter(|d| !d.as_os_str().is_empty())
                .unwrap_or(std::path::Path::new("."));
            let dir = std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_path_buf());
            *p = dir.join(&*p).display().to_string();
        }
    }
    overlay(&mut merged, over);
    toml::to_string(&merged).map_err(|e| pos.error("extends", format!("cannot merge: {e}")))
}

/// How a scenario's trace is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum TraceFormat {
    /// allot's own CSV ([`crate::trace`]): replayed through the policy core.
    Allot,
    /// The Helios study's raw CSV ([`crate::helios`]): one strict-order run
    /// ([`crate::strict`]) per cluster.
    Helios,
}

/// `[trace]`: the trace a scenario replays.
///
/// - `path`: the CSV, relative to the scenario file's directory (`--trace` overrides
///   it).
/// - `format`: `allot` (default) or `helios`.
/// - `from`, `to`: the submit window, `YYYY-MM-DD HH:MM:SS` UTC, both inclusive;
///   jobs outside it are left out (`helios` only).
/// - `clusters_separately`: each `[[clusters]]` table is its own system with its own
///   queue (a job runs on the cluster its trace row names); required for `helios`,
///   which is how the Helios study simulates Philly's virtual clusters.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TraceSpec {
    /// The CSV, relative to the scenario file.
    pub path: String,
    /// Its format.
    #[serde(default = "default_format")]
    pub format: TraceFormat,
    /// First submit time kept (UTC).
    #[serde(default)]
    pub from: Option<String>,
    /// Last submit time kept (UTC).
    #[serde(default)]
    pub to: Option<String>,
    /// Each cluster simulated on its own.
    #[serde(default)]
    pub clusters_separately: bool,
}

fn default_format() -> TraceFormat {
    TraceFormat::Allot
}

fn default_days() -> u32 {
    30
}

/// One workload to submit at `submit`, needing `work` seconds of running.
#[derive(Debug, Clone, PartialEq)]
pub struct Job {
    /// Arrival.
    pub submit: Time,
    /// Seconds of running it needs.
    pub work: Secs,
    /// What is submitted.
    pub spec: WorkloadSpec,
    /// Line in the trace file it came from (0 when generated).
    pub line: usize,
}

impl Scenario {
    /// Parses and checks a scenario; `file` names it in errors.
    ///
    /// A scenario may `extends = "ai2"` or another scenario file (relative to
    /// `file`): its tables are laid over that one's (arrays such as `[[classes]]`
    /// replace theirs).
    pub fn parse(text: &str, file: &str) -> Result<Scenario, ScenarioError> {
        let text = resolve_extends(text, file, 0)?;
        let s: Scenario = allot_common::config_error::from_toml(&text, file, "(syntax)")?;
        s.check(&text, file)?;
        Ok(s)
    }

    fn check(&self, text: &str, file: &str) -> Result<(), ScenarioError> {
        // `path` is where the parser saw the value (`classes.2.resumable`); `field`
        // what people read (`classes[2] (debug).resumable`).
        let pos = allot_common::config_error::Positions::new(text, file);
        let err = |path: &str, field: String, message: String| {
            pos.error_at(&field, pos.line(path), message)
        };
        self.policy
            .validate()
            .map_err(|m| err("policy", "policy".into(), m))?;
        if self.days == 0 {
            return Err(err("days", "days".into(), "must be at least 1".into()));
        }
        if !(self.load.is_finite() && self.load > 0.0 && self.load <= 100.0) {
            return Err(err(
                "load",
                "load".into(),
                format!(
                    "{}: use a factor above 0 and at most 100 (1 leaves the arrivals as written)",
                    self.load
                ),
            ));
        }
        if self.pass_interval > MAX_PASS_INTERVAL {
            return Err(err(
                "pass_interval",
                "pass_interval".into(),
                format!(
                    "{} s: at most 1h (work would wait that long for a pass); 0 runs one at every event",
                    self.pass_interval
                ),
            ));
        }
        if self.clusters.is_empty() {
            return Err(err(
                "clusters",
                "clusters".into(),
                "add at least one [[clusters]] table".into(),
            ));
        }
        for (i, c) in self.clusters.iter().enumerate() {
            let needle = format!("clusters.{i}.name");
            if c.nodes == 0 || c.gpus_per_node == 0 || c.gpus_per_node > 64 {
                return Err(err(
                    &needle,
                    format!("clusters[{i}]"),
                    format!(
                        "nodes = {}, gpus_per_node = {}: need at least 1 node and 1 to 64 GPUs per node",
                        c.nodes, c.gpus_per_node
                    ),
                ));
            }
        }
        for (i, c) in self.classes.iter().enumerate() {
            let path = |f: &str| format!("classes.{i}.{f}");
            let at = |f: &str| format!("classes[{i}] ({}).{f}", c.name);
            if !(c.arrivals_per_hour.is_finite() && c.arrivals_per_hour >= 0.0) {
                return Err(err(
                    &path("arrivals_per_hour"),
                    at("arrivals_per_hour"),
                    "must be a non-negative number".into(),
                ));
            }
            if !(0.0..=1.0).contains(&c.resumable) {
                return Err(err(
                    &path("resumable"),
                    at("resumable"),
                    "is a share: use a number from 0 to 1".into(),
                ));
            }
            for (field, map) in [
                ("gpus", &c.gpus),
                ("nodes", &c.nodes),
                ("priority", &c.priority),
            ] {
                for (k, w) in map {
                    let ok_key = if field == "priority" {
                        k.parse::<i32>().is_ok()
                    } else {
                        k.parse::<u32>().is_ok_and(|n| n > 0)
                    };
                    if !(ok_key && w.is_finite() && *w >= 0.0) {
                        return Err(err(
                            &path(field),
                            at(field),
                            format!(
                                "entry {k} = {w}: keys are {} and weights non-negative numbers",
                                if field == "priority" {
                                    "integers"
                                } else {
                                    "positive integers"
                                }
                            ),
                        ));
                    }
                }
            }
            for (t, w) in &c.gpu_types {
                let known = t == "any" || self.clusters.iter().any(|k| k.gpu_type == *t);
                if !(known && w.is_finite() && *w >= 0.0) {
                    return Err(err(
                        &path("gpu_types"),
                        at("gpu_types"),
                        format!(
                            "entry {t} = {w}: keys are GPU types a [[clusters]] table has \
                             (gpu_type), or any, and weights non-negative numbers"
                        ),
                    ));
                }
            }
            if c.gpus.is_empty() {
                return Err(err(
                    &path("gpus"),
                    at("gpus"),
                    "give at least one size, e.g. { 1 = 0.5, 8 = 0.5 }".into(),
                ));
            }
        }
        if let Some(tr) = &self.trace {
            self.check_trace(tr, &err)?;
        }
        for (j, t) in self.teams.iter().enumerate() {
            if !(t.demand.is_finite() && t.demand >= 0.0) {
                return Err(err(
                    &format!("teams.{j}.demand"),
                    format!("teams ({}).demand", t.name),
                    "must be a non-negative number".into(),
                ));
            }
            if !(1..=MAX_USERS).contains(&t.users) {
                return Err(err(
                    &format!("teams.{j}.users"),
                    format!("teams ({}).users", t.name),
                    format!("{}: use 1 to {MAX_USERS}", t.users),
                ));
            }
        }
        if self.trace.is_some() && self.teams.is_empty() {
            // The trace names the teams (allot) or has none (helios).
            return Ok(());
        }
        self.tree_specs(&[])
            .and_then(|specs| {
                allot_fairshare::tree::OrgTree::new(&specs)
                    .map(|_| ())
                    .map_err(|e| e.to_string())
            })
            .map_err(|m| err("teams", "teams".into(), m))
    }

    fn check_trace(
        &self,
        tr: &TraceSpec,
        err: &dyn Fn(&str, String, String) -> ScenarioError,
    ) -> Result<(), ScenarioError> {
        if tr.path.trim().is_empty() {
            return Err(err(
                "trace.path",
                "trace.path".into(),
                "name the CSV file, relative to this scenario".into(),
            ));
        }
        let mut bounds = Vec::new();
        for (key, v) in [("from", &tr.from), ("to", &tr.to)] {
            let Some(v) = v else { continue };
            if tr.format != TraceFormat::Helios {
                return Err(err(
                    &format!("trace.{key}"),
                    format!("trace.{key}"),
                    "a submit window applies to format = \"helios\" only".into(),
                ));
            }
            let t = allot_common::utc::parse_time(v).ok_or_else(|| {
                err(
                    &format!("trace.{key}"),
                    format!("trace.{key}"),
                    format!("{v:?} is not a time: write YYYY-MM-DD HH:MM:SS (UTC)"),
                )
            })?;
            bounds.push(t);
        }
        if let [from, to] = bounds[..] {
            if from > to {
                return Err(err(
                    "trace.to",
                    "trace.to".into(),
                    "is before trace.from".into(),
                ));
            }
        }
        if tr.format == TraceFormat::Helios {
            if !tr.clusters_separately {
                return Err(err(
                    "trace.format",
                    "trace.clusters_separately".into(),
                    "a helios trace runs each cluster on its own: set clusters_separately = true"
                        .into(),
                ));
            }
            for (i, c) in self.clusters.iter().enumerate() {
                if self.clusters[..i].iter().any(|o| o.name == c.name) {
                    return Err(err(
                        &format!("clusters.{i}.name"),
                        format!("clusters[{i}].name"),
                        format!("{:?} names two clusters; the trace's rows name one", c.name),
                    ));
                }
            }
        } else if tr.clusters_separately {
            return Err(err(
                "trace.clusters_separately",
                "trace.clusters_separately".into(),
                "only format = \"helios\" runs clusters separately".into(),
            ));
        }
        Ok(())
    }

    /// The scenario's trace file, resolved against the directory of the scenario
    /// file `scenario_file` (a built-in scenario: the working directory).
    pub fn trace_path(&self, scenario_file: &std::path::Path) -> Option<std::path::PathBuf> {
        let tr = self.trace.as_ref()?;
        let dir = scenario_file.parent().unwrap_or(std::path::Path::new(""));
        Some(dir.join(&tr.path))
    }

    /// Node list of all clusters.
    pub fn nodes(&self) -> Vec<NodeSpec> {
        let mut out = Vec::new();
        for c in &self.clusters {
            for i in 0..c.nodes {
                out.push(NodeSpec {
                    name: format!("{}-{:04}", c.name, i),
                    cluster: c.name.clone(),
                    gpus: c.gpus_per_node,
                    cpu: c.cpu_per_node,
                    memory_gb: c.memory_gb_per_node,
                    gpu_type: c.gpu_type.clone(),
                    ..Default::default()
                });
            }
        }
        out
    }

    /// The org tree, with `extra` (team, project) pairs from a trace added: unknown
    /// teams get the mean team weight (equal shares), unknown projects weight 1.
    pub fn tree_specs(&self, extra: &[(String, String)]) -> Result<Vec<GroupSpec>, String> {
        type Team = (String, f64, Vec<(String, f64)>);
        let mut teams: Vec<Team> = self
            .teams
            .iter()
            .map(|t| {
                (
                    t.name.clone(),
                    t.weight,
                    t.projects
                        .iter()
                        .map(|p| (p.name.clone(), p.weight))
                        .collect(),
                )
            })
            .collect();
        let mean = if teams.is_empty() {
            1.0
        } else {
            teams.iter().map(|t| t.1).sum::<f64>() / teams.len() as f64
        };
        for (team, project) in extra {
            let i = match teams.iter().position(|t| t.0 == *team) {
                Some(i) => i,
                None => {
                    teams.push((team.clone(), mean, Vec::new()));
                    teams.len() - 1
                }
            };
            if project != team && !teams[i].2.iter().any(|p| p.0 == *project) {
                teams[i].2.push((project.clone(), 1.0));
            }
        }
        if teams.is_empty() {
            return Err("no teams: add [[teams]] or replay a trace".into());
        }
        let mut specs = Vec::new();
        for (name, weight, _) in &teams {
            specs.push(GroupSpec {
                name: name.clone(),
                parent: None,
                weight: *weight,
            });
        }
        for (name, _, projects) in &teams {
            for (p, w) in projects {
                specs.push(GroupSpec {
                    name: p.clone(),
                    parent: Some(name.clone()),
                    weight: *w,
                });
            }
        }
        Ok(specs)
    }

    /// The class named `name`, if any.
    pub fn class(&self, name: &str) -> Option<&ClassSpec> {
        self.classes.iter().find(|c| c.name == name)
    }

    /// Draws every workload of the run from the classes, sorted by arrival.
    pub fn generate(&self, seed: u64) -> Vec<Job> {
        let horizon = u64::from(self.days) * DAY;
        let mut root = Rng::new(seed);
        let total_w: f64 = self.teams.iter().map(|t| t.weight).sum();
        let team_w: Vec<f64> = self
            .teams
            .iter()
            .map(|t| t.weight / total_w.max(f64::MIN_POSITIVE) * t.demand)
            .collect();
        let mut jobs: Vec<(Time, usize, u64, Job)> = Vec::new();
        for (ci, c) in self.classes.iter().enumerate() {
            let mut rng = root.fork(ci as u64);
            if c.arrivals_per_hour <= 0.0 || team_w.iter().sum::<f64>() <= 0.0 {
                continue;
            }
            let (gk, gw) = weighted_keys::<u32>(&c.gpus);
            let (nk, nw) = if c.nodes.is_empty() {
                (vec![1], vec![1.0])
            } else {
                weighted_keys::<u32>(&c.nodes)
            };
            let (pk, pw) = if c.priority.is_empty() {
                (vec![0], vec![1.0])
            } else {
                weighted_keys::<i32>(&c.priority)
            };
            let (tk, tw): (Vec<&String>, Vec<f64>) = c.gpu_types.iter().unzip();
            let mean_gap = 3_600.0 / (c.arrivals_per_hour * self.load);
            let mut t = 0.0;
            let mut seq = 0u64;
            loop {
                t += rng.exp(mean_gap);
                let submit = t as Time;
                if submit >= horizon {
                    break;
                }
                let team = &self.teams[rng.pick(&team_w)];
                let project = if team.projects.is_empty() {
                    team.name.clone()
                } else {
                    let w: Vec<f64> = team.projects.iter().map(|p| p.weight).collect();
                    team.projects[rng.pick(&w)].name.clone()
                };
                let gpus = gk[rng.pick(&gw)];
                let nodes = nk[rng.pick(&nw)];
                let work = c.duration.sample(&mut rng);
                let resumable = rng.unit() < c.resumable;
                let priority = pk[rng.pick(&pw)];
                // Drawn last, and only for several users, so a one-user scenario's
                // month stays what it was.
                let user = if team.users > 1 {
                    format!(
                        "{}-user{}",
                        team.name,
                        1 + rng.next_u64() % u64::from(team.users)
                    )
                } else {
                    format!("{}-user", team.name)
                };
                // After the user, and only where asked, for the same reason.
                let gpu_types = if tk.is_empty() {
                    Vec::new()
                } else {
                    match tk[rng.pick(&tw)].as_str() {
                        "any" => Vec::new(),
                        t => vec![t.to_string()],
                    }
                };
                seq += 1;
                jobs.push((
                    submit,
                    ci,
                    seq,
                    Job {
                        submit,
                        work,
                        spec: WorkloadSpec {
                            project,
                            user,
                            class: c.name.clone(),
                            gpus_per_node: gpus,
                            nodes,
                            cpu_per_node: gpus * c.cpu_per_gpu,
                            mem_per_node_gb: gpus * c.mem_per_gpu_gb,
                            min_runtime: c.min_runtime,
                            time_limit: c.time_limit,
                            resumable,
                            priority,
                            no_requeue: false,
                            select: allot_fairshare::select::Select {
                                gpu_types,
                                ..Default::default()
                            },
                        },
                        line: 0,
                    },
                ));
            }
        }
        jobs.sort_by_key(|j| (j.0, j.1, j.2));
        jobs.into_iter().map(|j| j.3).collect()
    }
}

fn weighted_keys<K: std::str::FromStr>(m: &BTreeMap<String, f64>) -> (Vec<K>, Vec<f64>) {
    m.iter()
        .filter_map(|(k, w)| k.parse::<K>().ok().map(|k| (k, *w)))
        .unzip()
}
