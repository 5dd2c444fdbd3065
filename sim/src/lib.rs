//! The policy simulator: discrete events on a virtual clock, driving the very same
//! [`Scheduler`] the allocator runs.
//!
//! Arrivals come from a scenario's classes or a trace; the engine carries out the
//! core's decisions the way agents would (a revoked lease ends `checkpoint.save` after
//! its `not_before`, losing `checkpoint.lost` of work), injects host faults, and jumps
//! the clock to the next event or wake-up. It integrates each team's received and
//! entitled GPU-hours (the ideal of [`allot_fairshare::entitlement`]) as it goes.

pub mod ablation;
pub mod cli;
pub mod forecast;
pub mod helios;
mod pool;
pub mod report;
pub mod rng;
pub mod scenario;
pub mod strict;
pub mod suite;
pub mod svg;
pub mod trace;

use allot_fairshare::cluster::{NodeId, NodeState};
use allot_fairshare::decision::Action;
use allot_fairshare::entitlement::water_fill;
use allot_fairshare::scheduler::{Baseline, LeaseEnd, Scheduler};
use allot_fairshare::time::{Secs, Time, DAY, HOUR, MINUTE};
use allot_fairshare::tree::{GroupId, OrgTree};
use allot_fairshare::workload::{LeaseId, RevokeWhy, WorkloadId, WorkloadState};
pub use report::{Report, SeedTable, Spread, Timeline};
use rng::Rng;
pub use scenario::{Job, Scenario, ScenarioError};
use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap};

/// Which policy drives the run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PolicyKind {
    /// allot: hierarchical fair share, contracts, preemption, reservations.
    FairShare,
    /// The baseline it replaces: static priorities and per-team caps.
    Priority,
    /// FIFO with EASY backfill, the reference a Slurm site runs (work-conserving, no
    /// preemption), with every job's real duration as its time limit when it has none.
    FifoBackfill,
    /// The same with time limits as users set them ([`user_estimate`]): what a Slurm
    /// site's backfill plans with.
    FifoBackfillUser,
}

impl PolicyKind {
    /// Its name on the command line and in reports.
    pub fn name(self) -> &'static str {
        match self {
            PolicyKind::FairShare => "fairshare",
            PolicyKind::Priority => "priority",
            PolicyKind::FifoBackfill => "fifo-backfill",
            PolicyKind::FifoBackfillUser => "fifo-backfill-user",
        }
    }

    /// The policy a command-line name picks.
    pub fn parse(name: &str) -> Option<PolicyKind> {
        [
            PolicyKind::FairShare,
            PolicyKind::Priority,
            PolicyKind::FifoBackfill,
            PolicyKind::FifoBackfillUser,
        ]
        .into_iter()
        .find(|p| p.name() == name)
    }
}

/// Why a run could not start or go on.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SimError {
    /// A bad scenario or trace.
    #[error(transparent)]
    Input(#[from] ScenarioError),
    /// The core refused something the inputs asked for.
    #[error("{0}")]
    Core(String),
}

/// Options of one run.
#[derive(Debug, Clone)]
pub struct SimOptions {
    /// The policy.
    pub policy: PolicyKind,
    /// Seed (the scenario's unless given).
    pub seed: u64,
    /// Record an hourly timeline for plots.
    pub timeline: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Ev {
    Finish(LeaseId),
    /// A revocation's ladder ends; the number tells it from a withdrawn earlier one.
    RevokeDone(LeaseId, u32),
    Fault(u32, bool),
    Repair(u32),
    Wake,
    /// A session's stretch (active or idle) ends; the number tells it from a stale one.
    SessionFlip(LeaseId, u32),
    /// The agent reports a session idle, `idle_after` into its idle stretch.
    IdleReport(LeaseId, u32),
}

/// A running session's use, as the engine knows it (the core sees only reports).
struct Session {
    spec: std::rc::Rc<scenario::SessionSpec>,
    rng: Rng,
    active: bool,
    /// Start of the current idle stretch.
    idle_since: Time,
    /// The core was told it is idle.
    reported_idle: bool,
    /// Stretches so far: stale events carry an older number.
    stretch: u32,
}

struct Run {
    wid: WorkloadId,
    start: Time,
    gpus: u64,
    /// Its GPUs weighted by type, in thousandths (what its team receives).
    weighted: u64,
    team: usize,
    /// Its class, an index of the report's.
    class: usize,
    funded: bool,
    revoke: Option<RevokeWhy>,
    /// Revocations so far (withdrawn ones included).
    revokes: u32,
    /// For a session revoked for preemption: whether it was in use when decided.
    revoked_active: Option<bool>,
}

/// Faulted nodes whose repair waits for their leases to leave: a host is reset or
/// rebooted once empty (no GPU `used` in the core), so a soft drain's repair starts
/// when its last lease ends.
struct Repairs {
    awaiting: Vec<bool>,
    /// How many of `awaiting` are set: while none, a lease end looks nothing up.
    count: usize,
}

impl Repairs {
    fn new(nodes: usize) -> Self {
        Repairs {
            awaiting: vec![false; nodes],
            count: 0,
        }
    }

    /// `node` faulted: whether its repair starts now (it is empty); else it waits.
    fn fault(&mut self, core: &Scheduler, node: NodeId) -> bool {
        if core.cluster().node(node).used == 0 {
            return true;
        }
        self.awaiting[node.idx()] = true;
        self.count += 1;
        false
    }

    /// Ends `lease` in the core; returns the nodes it left empty that wait for repair.
    fn end_lease(
        &mut self,
        core: &mut Scheduler,
        t: Time,
        lease: LeaseId,
        end: LeaseEnd,
    ) -> Result<Vec<NodeId>, SimError> {
        let waiting: Vec<NodeId> = if self.count == 0 {
            Vec::new()
        } else {
            core.lease(lease)
                .map(|l| l.placement.iter().map(|p| p.node))
                .into_iter()
                .flatten()
                .filter(|n| self.awaiting[n.idx()])
                .collect()
        };
        core.lease_ended(t, lease, end)
            .map_err(|e| SimError::Core(e.to_string()))?;
        let emptied: Vec<NodeId> = waiting
            .into_iter()
            .filter(|&n| core.cluster().node(n).used == 0)
            .collect();
        for n in &emptied {
            self.awaiting[n.idx()] = false;
            self.count -= 1;
        }
        Ok(emptied)
    }
}

struct JobState {
    remaining: Secs,
    first_start: Option<Time>,
    /// Its team (an index of the report's teams) and class (of the report's classes).
    team: usize,
    class: usize,
}

/// Runs a scenario (or the given trace jobs on its clusters and tree).
pub fn run(
    sc: &Scenario,
    jobs: Vec<Job>,
    extra_groups: &[(String, String)],
    opts: &SimOptions,
) -> Result<Report, SimError> {
    run_probed(sc, jobs, extra_groups, opts, None).map(|(r, _)| r)
}

/// [`run`], with a start-time forecast taken by `probe` (see [`forecast`]) and
/// scored against what happened.
pub fn run_probed(
    sc: &Scenario,
    mut jobs: Vec<Job>,
    extra_groups: &[(String, String)],
    opts: &SimOptions,
    mut probe: Option<&mut forecast::Probe>,
) -> Result<(Report, Option<forecast::Score>), SimError> {
    let specs = sc.tree_specs(extra_groups).map_err(SimError::Core)?;
    let tree = OrgTree::new(&specs).map_err(|e| SimError::Core(e.to_string()))?;
    let nodes = sc.nodes();
    let total_gpus: u64 = nodes.iter().map(|n| u64::from(n.gpus)).sum();
    let mut core = Scheduler::new(sc.policy.clone(), tree.clone(), nodes)
        .map_err(|e| SimError::Core(e.to_string()))?;
    if opts.policy == PolicyKind::Priority {
        let caps = tree
            .groups()
            .map(|(_, g)| (g.share * total_gpus as f64 * sc.baseline.cap_factor).round() as u64)
            .collect();
        core = core.into_baseline(Baseline { team_caps: caps });
    }
    match opts.policy {
        PolicyKind::FifoBackfill => {
            core = core.into_fifo_backfill();
            for j in &mut jobs {
                perfect_estimate(j);
            }
        }
        PolicyKind::FifoBackfillUser => {
            core = core.into_fifo_backfill();
            let mut rng = Rng::new(opts.seed ^ 0xE571_3A7E);
            for j in &mut jobs {
                user_estimate(j, &mut rng);
            }
        }
        PolicyKind::FairShare | PolicyKind::Priority => {}
    }
    let horizon = u64::from(sc.days) * DAY;
    let teams: Vec<GroupId> = tree.teams().to_vec();
    let team_index: Vec<usize> = tree
        .groups()
        .map(|(g, _)| {
            teams
                .iter()
                .position(|t| *t == tree.team_of(g))
                .unwrap_or(0)
        })
        .collect();
    let mut heap: BinaryHeap<Reverse<(Time, u64, Ev)>> = BinaryHeap::new();
    let mut seq = 0u64;
    let mut push = |heap: &mut BinaryHeap<Reverse<(Time, u64, Ev)>>, t: Time, ev: Ev| {
        seq += 1;
        heap.push(Reverse((t, seq, ev)));
    };
    // Host faults: Poisson over all nodes.
    let mut frng = Rng::new(opts.seed ^ 0xFA17);
    let n_nodes = core.cluster().len() as f64;
    for (rate, now_kind) in [
        (sc.faults.drain_per_node_day, false),
        (sc.faults.drain_now_per_node_day, true),
    ] {
        if rate <= 0.0 || n_nodes == 0.0 {
            continue;
        }
        let mean_gap = DAY as f64 / (rate * n_nodes);
        let mut t = 0.0;
        loop {
            t += frng.exp(mean_gap);
            if t as Time >= horizon {
                break;
            }
            let node = (frng.unit() * n_nodes) as u32;
            push(&mut heap, t as Time, Ev::Fault(node, now_kind));
        }
    }

    let mut rep = report::Builder::new(&tree, &teams, total_gpus, opts.timeline);
    let mut job_state: Vec<JobState> = Vec::with_capacity(jobs.len());
    let mut running: BTreeMap<LeaseId, Run> = BTreeMap::new();
    let mut wakes: BTreeSet<Time> = BTreeSet::new();
    let mut next_job = 0usize;
    let mut last_t: Time = 0;
    let mut events: u64 = 0;
    let mut ent = vec![0.0; teams.len()];
    let mut recv = vec![0u64; teams.len()];
    let (mut busy, mut busy_unfunded) = (0u64, 0u64);
    let mut down_gpus = 0u64;
    let mut entitlement_dirty = true;
    let mut next_pass: Time = 0;
    let mut repairs = Repairs::new(core.cluster().len());
    // Workloads that arrived since the last pass (for the forecast probe).
    let mut arrived: Vec<WorkloadId> = Vec::new();
    // Classes with sessions, and the sessions running.
    let session_classes: BTreeMap<String, std::rc::Rc<scenario::SessionSpec>> = sc
        .classes
        .iter()
        .filter_map(|c| Some((c.name.clone(), std::rc::Rc::new(c.sessions.clone()?))))
        .collect();
    if !session_classes.is_empty() {
        rep.sessions = Some(report::SessionFigures::default());
    }
    let mut sessions: BTreeMap<LeaseId, Session> = BTreeMap::new();

    loop {
        let t_arrive = jobs
            .get(next_job)
            .map(|j| j.submit)
            .filter(|&t| t < horizon);
        let t_event = heap
            .peek()
            .map(|Reverse((t, _, _))| *t)
            .filter(|&t| t < horizon);
        let t = match (t_arrive, t_event) {
            (None, None) => break,
            (Some(a), None) => a,
            (None, Some(e)) => e,
            (Some(a), Some(e)) => a.min(e),
        };
        rep.integrate(last_t, t, &recv, &ent, busy, busy_unfunded);
        last_t = t;
        // Arrivals at t.
        while let Some(j) = jobs.get_mut(next_job).filter(|j| j.submit == t) {
            events += 1;
            // The engine reads neither name again: the core takes them (a month at
            // 100,000 GPUs submits 6M workloads).
            let (project, user) = (
                std::mem::take(&mut j.spec.project),
                std::mem::take(&mut j.spec.user),
            );
            let mut spec = j.spec.clone();
            (spec.project, spec.user) = (project, user);
            let wid = core.submit(t, spec).map_err(|e| {
                SimError::Core(if j.line > 0 {
                    format!("trace line {}: {e}", j.line)
                } else {
                    format!("workload of class {}: {e}", j.spec.class)
                })
            })?;
            if probe.is_some() {
                arrived.push(wid);
            }
            let team = team_index[core.workload(wid).map_or(0, |w| w.project.idx())];
            let class = rep.class_index(&j.spec.class);
            rep.wait_begins(team, class, u64::from(j.spec.total_gpus()));
            job_state.push(JobState {
                remaining: j.work,
                first_start: None,
                team,
                class,
            });
            next_job += 1;
            entitlement_dirty = true;
        }
        // Other events at t.
        while let Some(&Reverse((et, _, ev))) = heap.peek() {
            if et != t {
                break;
            }
            heap.pop();
            events += 1;
            match ev {
                Ev::Wake => {
                    wakes.remove(&t);
                }
                Ev::Finish(lid) => {
                    let Some(r) = running.remove(&lid) else {
                        continue;
                    };
                    sessions.remove(&lid);
                    let js = &mut job_state[(r.wid.0 - 1) as usize];
                    let ran = t - r.start;
                    let end = if ran < js.remaining {
                        LeaseEnd::TimeLimit
                    } else {
                        LeaseEnd::Completed
                    };
                    js.remaining = js.remaining.saturating_sub(ran);
                    if let Some(p) = probe.as_deref_mut() {
                        p.ran(&jobs[(r.wid.0 - 1) as usize].spec.class, ran);
                    }
                    release(&mut rep, t, &mut recv, &mut busy, &mut busy_unfunded, &r);
                    for n in repairs.end_lease(&mut core, t, lid, end)? {
                        push(&mut heap, t + sc.faults.repair, Ev::Repair(n.0));
                    }
                    entitlement_dirty = true;
                }
                Ev::RevokeDone(lid, n) => {
                    if running
                        .get(&lid)
                        .is_none_or(|r| r.revoke.is_none() || r.revokes != n)
                    {
                        continue;
                    }
                    let Some(r) = running.remove(&lid) else {
                        continue;
                    };
                    let session = sessions.remove(&lid);
                    if let (Some(active), Some(sf)) = (r.revoked_active, rep.sessions.as_mut()) {
                        sf.reclaimed(r.funded, active, session.is_some_and(|x| x.active));
                    }
                    let idx = (r.wid.0 - 1) as usize;
                    let js = &mut job_state[idx];
                    let ran = t - r.start;
                    let resumable = jobs[idx].spec.resumable;
                    let lost = if resumable {
                        ran.min(sc.checkpoint.lost)
                    } else {
                        ran
                    };
                    js.remaining = js.remaining.saturating_sub(ran - lost);
                    let cause = match r.revoke {
                        Some(RevokeWhy::Preempted { unfunded, .. }) => {
                            rep.preemptions += 1;
                            if unfunded {
                                "preempted-unfunded"
                            } else {
                                "preempted-funded"
                            }
                        }
                        Some(RevokeWhy::Reservation { .. }) => {
                            rep.preemptions += 1;
                            "reservation"
                        }
                        Some(RevokeWhy::Drain { .. } | RevokeWhy::DrainNow { .. }) => {
                            rep.drain_revocations += 1;
                            "drain"
                        }
                        _ => "cancelled",
                    };
                    rep.lost(cause, r.gpus * lost);
                    release(&mut rep, t, &mut recv, &mut busy, &mut busy_unfunded, &r);
                    for n in repairs.end_lease(&mut core, t, lid, LeaseEnd::Revoked)? {
                        push(&mut heap, t + sc.faults.repair, Ev::Repair(n.0));
                    }
                    if core
                        .workload(r.wid)
                        .is_some_and(|w| w.state == WorkloadState::Pending)
                    {
                        let js = &job_state[idx];
                        rep.wait_begins(js.team, js.class, r.gpus);
                    }
                    entitlement_dirty = true;
                }
                Ev::Fault(node, now_kind) => {
                    let id = NodeId(node);
                    if core.cluster().node(id).state != NodeState::Ready {
                        continue;
                    }
                    let state = if now_kind {
                        NodeState::DrainNow
                    } else {
                        NodeState::Draining
                    };
                    down_gpus += u64::from(core.cluster().node(id).spec.gpus);
                    core.set_node_state(t, id, state)
                        .map_err(|e| SimError::Core(e.to_string()))?;
                    rep.faults += 1;
                    if repairs.fault(&core, id) {
                        push(&mut heap, t + sc.faults.repair, Ev::Repair(node));
                    }
                    entitlement_dirty = true;
                }
                Ev::SessionFlip(lid, n) => {
                    let Some(x) = sessions.get_mut(&lid).filter(|x| x.stretch == n) else {
                        continue;
                    };
                    x.stretch += 1;
                    if x.active {
                        x.active = false;
                        x.idle_since = t;
                        push(
                            &mut heap,
                            t + x.spec.idle_after,
                            Ev::IdleReport(lid, x.stretch),
                        );
                        let idle = x.spec.idle.sample(&mut x.rng);
                        push(&mut heap, t + idle, Ev::SessionFlip(lid, x.stretch));
                    } else {
                        x.active = true;
                        if std::mem::take(&mut x.reported_idle) {
                            core.lease_use(t, lid, None)
                                .map_err(|e| SimError::Core(e.to_string()))?;
                        }
                        let active = x.spec.active.sample(&mut x.rng);
                        push(&mut heap, t + active, Ev::SessionFlip(lid, x.stretch));
                    }
                }
                Ev::IdleReport(lid, n) => {
                    let Some(x) = sessions
                        .get_mut(&lid)
                        .filter(|x| x.stretch == n && !x.active)
                    else {
                        continue;
                    };
                    x.reported_idle = true;
                    core.lease_use(t, lid, Some(x.idle_since))
                        .map_err(|e| SimError::Core(e.to_string()))?;
                }
                Ev::Repair(node) => {
                    let id = NodeId(node);
                    down_gpus -= u64::from(core.cluster().node(id).spec.gpus).min(down_gpus);
                    core.set_node_state(t, id, NodeState::Ready)
                        .map_err(|e| SimError::Core(e.to_string()))?;
                    entitlement_dirty = true;
                }
            }
        }
        // One pass for everything that happened at t, unless the last was too recent:
        // then one when the interval is up.
        let d = if t < next_pass {
            if wakes.insert(next_pass) {
                push(&mut heap, next_pass, Ev::Wake);
            }
            allot_fairshare::Decisions::default()
        } else {
            next_pass = t + sc.pass_interval;
            rep.passes += 1;
            if let Some(p) = probe.as_deref_mut() {
                p.before_pass(&core, t, &arrived);
                arrived.clear();
            }
            core.schedule(t)
        };
        for a in d.actions {
            match a {
                Action::Start {
                    lease,
                    workload,
                    placement: _,
                    funded,
                    why: _,
                } => {
                    let idx = (workload.0 - 1) as usize;
                    let job = &jobs[idx];
                    let js = &mut job_state[idx];
                    if js.first_start.is_none() {
                        js.first_start = Some(t);
                        if let Some(p) = probe.as_deref_mut() {
                            p.started(workload, t);
                        }
                        rep.waited(&job.spec.class, job.spec.nodes, t - job.submit);
                        if small_short(job) {
                            rep.small_short_waited(t - job.submit, Some(funded));
                        }
                    }
                    let run_for = match job.spec.time_limit {
                        Some(tl) => js.remaining.min(tl),
                        None => js.remaining,
                    }
                    .max(1);
                    let (team, class) = (js.team, js.class);
                    let r = Run {
                        wid: workload,
                        start: t,
                        gpus: u64::from(job.spec.total_gpus()),
                        weighted: core.lease(lease).map_or(0, |l| l.weighted),
                        team,
                        class,
                        funded,
                        revoke: None,
                        revokes: 0,
                        revoked_active: None,
                    };
                    if let Some(spec) = session_classes.get(&job.spec.class) {
                        // A session starts in use, and its agent says so at once.
                        // Its own stream, by workload and start: the same use
                        // whatever else the policy decides.
                        let mut rng =
                            Rng::new(opts.seed ^ 0x5E55_1045).fork(workload.0 ^ (t << 24));
                        let active = spec.active.sample(&mut rng);
                        sessions.insert(
                            lease,
                            Session {
                                spec: spec.clone(),
                                rng,
                                active: true,
                                idle_since: t,
                                reported_idle: false,
                                stretch: 0,
                            },
                        );
                        push(&mut heap, t + active, Ev::SessionFlip(lease, 0));
                        core.lease_use(t, lease, None)
                            .map_err(|e| SimError::Core(e.to_string()))?;
                        if let Some(sf) = rep.sessions.as_mut() {
                            sf.leases += 1;
                        }
                    }
                    rep.wait_ends(team, class, r.gpus);
                    recv[team] += r.weighted;
                    busy += r.gpus;
                    if !funded {
                        busy_unfunded += r.gpus;
                    }
                    running.insert(lease, r);
                    push(&mut heap, t + run_for, Ev::Finish(lease));
                    entitlement_dirty = true;
                }
                Action::Revoke {
                    lease,
                    not_before,
                    why,
                    ..
                } => {
                    if let Some(r) = running.get_mut(&lease) {
                        if r.revoke.is_none() {
                            if matches!(
                                why,
                                RevokeWhy::Preempted { .. } | RevokeWhy::Reservation { .. }
                            ) {
                                r.revoked_active = sessions.get(&lease).map(|x| x.active);
                            }
                            r.revoke = Some(why);
                            r.revokes += 1;
                            push(
                                &mut heap,
                                not_before.max(t) + sc.checkpoint.save,
                                Ev::RevokeDone(lease, r.revokes),
                            );
                        }
                    }
                }
                Action::Withdraw { lease, .. } => {
                    if let Some(r) = running.get_mut(&lease) {
                        r.revoke = None;
                        r.revoked_active = None;
                    }
                }
                Action::Reserve { .. } => rep.reservations += 1,
            }
        }
        if let Some(w) = d.next_wakeup {
            if w > t && w < horizon && wakes.insert(w) {
                push(&mut heap, w, Ev::Wake);
            }
        }
        if entitlement_dirty {
            // In weighted GPUs (`gpu_hour_weight`), GPUs up and wanted counted at the
            // cluster's mean weight: what a team waits for has no type until it runs.
            let mean_weight = core.cluster().total_weighted() as f64
                / allot_fairshare::config::MILLI as f64
                / core.cluster().total_gpus().max(1) as f64;
            let capacity = total_gpus.saturating_sub(down_gpus) as f64 * mean_weight;
            let demand: Vec<f64> = core
                .demand()
                .iter()
                .map(|&x| x as f64 * mean_weight)
                .collect();
            let alloc = water_fill(&tree, capacity, &demand);
            for (i, team) in teams.iter().enumerate() {
                ent[i] = alloc[team.idx()];
            }
            entitlement_dirty = false;
        }
        if events.is_multiple_of(8192) {
            core.forget_finished();
        }
    }
    rep.integrate(last_t, horizon, &recv, &ent, busy, busy_unfunded);
    for r in running.values() {
        rep.ran(r.team, r.class, r.funded, r.gpus * (horizon - r.start));
    }
    for (i, j) in jobs.iter().enumerate().filter(|(_, j)| j.submit < horizon) {
        let started = job_state.get(i).and_then(|s| s.first_start).is_some();
        if !started {
            rep.waited(&j.spec.class, j.spec.nodes, horizon - j.submit);
            if small_short(j) {
                rep.small_short_waited(horizon - j.submit, None);
            }
        }
    }
    rep.submitted = next_job as u64;
    rep.events = events;
    let score = probe.map(|p| {
        let starts: Vec<Option<Time>> = job_state.iter().map(|s| s.first_start).collect();
        p.score(&starts, horizon)
    });
    Ok((
        rep.finish(opts.policy.name(), &sc.name, opts.seed, sc.days, horizon),
        score,
    ))
}

/// Whether `job` counts as small short work in the report.
fn small_short(job: &Job) -> bool {
    job.spec.total_gpus() <= report::SMALL_GPUS && job.work <= report::SHORT_WORK
}

/// Gives `job` its real duration as its time limit when it has none (what EASY
/// backfill plans with), and a min runtime no longer than that.
fn perfect_estimate(job: &mut Job) {
    let limit = job
        .spec
        .time_limit
        .unwrap_or(job.work.max(1))
        .min(allot_fairshare::scheduler::MAX_CONTRACT);
    job.spec.time_limit = Some(limit);
    job.spec.min_runtime = job.spec.min_runtime.min(limit);
}

/// The time limits users set, shortest first: a limit is rounded up to one
/// of these (beyond the last, to whole multiples of it).
const USER_LIMITS: [Secs; 17] = [
    5 * MINUTE,
    10 * MINUTE,
    15 * MINUTE,
    30 * MINUTE,
    HOUR,
    2 * HOUR,
    4 * HOUR,
    6 * HOUR,
    8 * HOUR,
    12 * HOUR,
    DAY,
    2 * DAY,
    3 * DAY,
    5 * DAY,
    7 * DAY,
    14 * DAY,
    30 * DAY,
];

/// Gives `job` a time limit as its user would set one, where it has none: its real
/// duration times a factor drawn uniformly from 1 to 5 (the "f-model" of Mu'alem
/// and Feitelson, "Utilization, predictability, workloads, and user runtime
/// estimates in scheduling the IBM SP2 with backfilling", IEEE TPDS 12(6), 2001),
/// rounded up to a round value, since users pick a few round limits (Tsafrir,
/// Etsion and Feitelson, "Modeling user runtime estimates", JSSPP 2005: the 20
/// most used values cover about 90% of jobs). No job outlives its limit.
pub fn user_estimate(job: &mut Job, rng: &mut Rng) {
    let factor = 1.0 + 4.0 * rng.unit();
    if job.spec.time_limit.is_none() {
        let want = (job.work.max(1) as f64 * factor).ceil() as Secs;
        let last = USER_LIMITS[USER_LIMITS.len() - 1];
        let round = USER_LIMITS
            .iter()
            .copied()
            .find(|&l| l >= want)
            .unwrap_or_else(|| want.div_ceil(last).saturating_mul(last));
        job.spec.time_limit = Some(round);
    }
    // Bounds the limit to the longest contract, as for every baseline job.
    perfect_estimate(job);
}

/// Run `r` ends at `t`: its GPUs leave the team's and the cluster's counts.
fn release(
    rep: &mut report::Builder,
    t: Time,
    recv: &mut [u64],
    busy: &mut u64,
    busy_unfunded: &mut u64,
    r: &Run,
) {
    rep.ran(
        r.team,
        r.class,
        r.funded,
        r.weighted * (t - r.start) / allot_fairshare::config::MILLI,
    );
    recv[r.team] -= r.weighted;
    *busy -= r.gpus;
    if !r.funded {
        *busy_unfunded -= r.gpus;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use allot_fairshare::tree::GroupSpec;
    use allot_fairshare::{NodeSpec, PolicyConfig, WorkloadSpec};

    #[test]
    fn a_user_estimate_is_a_round_limit_no_job_outlives() {
        let mut rng = Rng::new(7);
        let (mut factors, mut seen) = (Vec::new(), BTreeSet::new());
        for work in [1, 59, 600, 3_599, 7_000, 86_400, 40 * DAY] {
            for _ in 0..200 {
                let mut job = Job {
                    submit: 0,
                    work,
                    spec: WorkloadSpec::default(),
                    line: 0,
                };
                user_estimate(&mut job, &mut rng);
                let limit = job.spec.time_limit.expect("a limit");
                assert!(limit >= work, "{work} s outlives its limit {limit} s");
                assert!(
                    USER_LIMITS.contains(&limit) || limit.is_multiple_of(30 * DAY),
                    "{limit} s is no round limit"
                );
                factors.push(limit as f64 / work as f64);
                seen.insert(limit);
            }
        }
        // Over-estimated, and not by one fixed factor: users' limits vary.
        assert!(factors.iter().any(|&f| f > 2.0));
        assert!(seen.len() > 7, "{seen:?}");
        // A limit the job had is kept.
        let mut job = Job {
            submit: 0,
            work: 100,
            spec: WorkloadSpec {
                time_limit: Some(150),
                ..Default::default()
            },
            line: 0,
        };
        user_estimate(&mut job, &mut rng);
        assert_eq!(job.spec.time_limit, Some(150));
    }

    #[test]
    fn a_faulted_host_is_repaired_only_once_its_last_lease_left() {
        let tree = OrgTree::new(&[GroupSpec {
            name: "p".into(),
            parent: None,
            weight: 1.0,
        }])
        .expect("tree");
        let node = NodeSpec {
            name: "n0".into(),
            cluster: "c".into(),
            gpus: 8,
            cpu: 128,
            memory_gb: 2048,
            ..Default::default()
        };
        let mut core = Scheduler::new(PolicyConfig::default(), tree, vec![node]).expect("core");
        let job = WorkloadSpec {
            project: "p".into(),
            user: "u".into(),
            class: "c".into(),
            gpus_per_node: 4,
            nodes: 1,
            cpu_per_node: 0,
            mem_per_node_gb: 0,
            min_runtime: 0,
            time_limit: None,
            resumable: false,
            priority: 0,
            no_requeue: false,
            ..Default::default()
        };
        for _ in 0..2 {
            core.submit(0, job.clone()).expect("submit");
        }
        let leases: Vec<LeaseId> = core
            .schedule(0)
            .actions
            .iter()
            .filter_map(|a| match a {
                Action::Start { lease, .. } => Some(*lease),
                _ => None,
            })
            .collect();
        assert_eq!(leases.len(), 2);
        let mut repairs = Repairs::new(1);
        core.set_node_state(10, NodeId(0), NodeState::Draining)
            .expect("drain");
        assert!(!repairs.fault(&core, NodeId(0)), "two leases still run");
        let first = repairs.end_lease(&mut core, 20, leases[0], LeaseEnd::Completed);
        assert!(first.expect("ended").is_empty(), "one lease still runs");
        let last = repairs.end_lease(&mut core, 30, leases[1], LeaseEnd::Completed);
        assert_eq!(last.expect("ended"), vec![NodeId(0)]);
        assert_eq!(repairs.count, 0, "repaired once");
    }
}
