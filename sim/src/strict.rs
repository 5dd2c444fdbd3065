//! Strict-order baselines, FIFO and SJF, as the Helios study's simulator runs them
//! (S-Lab-System-Group/HeliosArtifact, `framework/QSSF Service`, `policies/fifo.py`,
//! `policies/sjf.py` and `policies/placer/consolidate.py`).
//!
//! One cluster at a time, from empty, until every job has ended (nothing is cut off at
//! the end of a window). At each distinct event time `t`, in this order:
//! 1. every running job whose end is `t` frees its GPUs;
//! 2. every job submitted at `t` joins the queue (in trace order);
//! 3. one pass walks the queue in policy order and starts each job that
//!    [`place`] can put on the free GPUs, and **stops at the first one it cannot**
//!    (head-of-line blocking, no backfill).
//!
//! The Helios code steps a clock by one second; only arrivals and ends change the
//! state (placement is deterministic and a failed one has no side effects), so doing
//! the three steps at event times only gives the same start for every job.
//!
//! Order: [`Order::Fifo`] by submit time; [`Order::Sjf`] by the job's real duration
//! (an oracle, as in Helios), not preemptive. Both sorts are stable over a queue
//! that arrivals join at the end, so ties go by arrival: submit time, then trace
//! order.
//!
//! A started job runs for its whole duration: queueing delay is `start − submit`, JCT
//! `start + duration − submit`. Pure: no I/O, no clock, no hash-order iteration.

use crate::helios::{HeliosTrace, Job, TraceDrops};
use allot_fairshare::time::{Secs, Time};
use serde::Serialize;
use std::cmp::Reverse;
use std::collections::{BTreeSet, BinaryHeap, VecDeque};

/// Which strict order the queue is walked in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Order {
    /// First come, first served: by submit time.
    Fifo,
    /// Shortest job first: by real duration; ties by arrival.
    Sjf,
}

impl Order {
    /// Its name on the command line and in reports.
    pub fn name(self) -> &'static str {
        match self {
            Order::Fifo => "fifo",
            Order::Sjf => "sjf",
        }
    }
}

/// Where a job of `gpus` GPUs goes on nodes with `free[i]` free GPUs each (every node
/// has `per_node`), as the Helios "consolidate" placer decides: `(node, GPUs)` pairs,
/// or `None` when it does not fit now.
///
/// - Fewer free GPUs in all than `gpus`: no.
/// - `gpus ≤ per_node`: best fit on one node: the node with the fewest free GPUs that
///   still has `gpus`, the lowest index on ties. Never split.
/// - `gpus` a multiple of `per_node`: `gpus / per_node` completely free nodes, the
///   lowest-index ones; no if there are fewer.
/// - Otherwise `⌊gpus / per_node⌋` completely free nodes (lowest index first) and the
///   remainder on the next node in most-free-first order: another completely free
///   node if there is one (lowest index), else the partly used node with the most
///   free GPUs (lowest index on ties); no if that node has fewer free than the
///   remainder (worst fit: Helios does not look further for one that fits).
pub fn place(free: &[u32], per_node: u32, gpus: u32) -> Option<Vec<(usize, u32)>> {
    let total: u64 = free.iter().map(|&f| u64::from(f)).sum();
    if gpus == 0 || total < u64::from(gpus) {
        return None;
    }
    if gpus <= per_node {
        let mut best: Option<usize> = None;
        for (i, &f) in free.iter().enumerate() {
            if f >= gpus && best.is_none_or(|b| f < free[b]) {
                best = Some(i);
            }
        }
        return best.map(|i| vec![(i, gpus)]);
    }
    let whole = (gpus / per_node) as usize;
    let rest = gpus % per_node;
    let mut out: Vec<(usize, u32)> = free
        .iter()
        .enumerate()
        .filter(|(_, &f)| f == per_node)
        .map(|(i, _)| (i, per_node))
        .take(whole)
        .collect();
    if out.len() < whole {
        return None;
    }
    if rest == 0 {
        return Some(out);
    }
    let taken = out.last().map_or(0, |&(i, _)| i + 1);
    // The next node in most-free-first order: a further completely free node, else
    // the most free partly used one.
    let next_full = (taken..free.len()).find(|&i| free[i] == per_node);
    let next = next_full.or_else(|| {
        let mut best: Option<usize> = None;
        for (i, &f) in free.iter().enumerate() {
            if f > 0 && f < per_node && best.is_none_or(|b| f > free[b]) {
                best = Some(i);
            }
        }
        best
    })?;
    if free[next] < rest {
        return None;
    }
    out.push((next, rest));
    Some(out)
}

/// The queue, in policy order.
enum Queue {
    Fifo(VecDeque<usize>),
    /// (duration, arrival index): stable ties.
    Sjf(BTreeSet<(Secs, usize)>),
}

impl Queue {
    fn head(&self) -> Option<usize> {
        match self {
            Queue::Fifo(q) => q.front().copied(),
            Queue::Sjf(q) => q.first().map(|&(_, i)| i),
        }
    }
    fn pop(&mut self) {
        match self {
            Queue::Fifo(q) => {
                q.pop_front();
            }
            Queue::Sjf(q) => {
                q.pop_first();
            }
        }
    }
    fn push(&mut self, i: usize, duration: Secs) {
        match self {
            Queue::Fifo(q) => q.push_back(i),
            Queue::Sjf(q) => {
                q.insert((duration, i));
            }
        }
    }
}

/// Runs one cluster of `nodes` nodes × `per_node` GPUs, from empty, until every job
/// has ended; returns each job's start. `jobs` must be sorted by submit time (ties
/// in trace order), each with 1 to `nodes × per_node` GPUs and a duration of at
/// least 1 s; anything else is refused with the job's line, never run.
pub fn simulate(
    nodes: u32,
    per_node: u32,
    jobs: &[Job],
    order: Order,
) -> Result<Vec<Time>, String> {
    let capacity = u64::from(nodes) * u64::from(per_node);
    for (i, j) in jobs.iter().enumerate() {
        if j.gpus == 0 || u64::from(j.gpus) > capacity {
            return Err(format!(
                "job {} (line {}): {} GPUs on a cluster of {capacity}",
                i, j.line, j.gpus
            ));
        }
        if j.duration == 0 {
            return Err(format!("job {} (line {}): a duration of 0 s", i, j.line));
        }
        if i > 0 && jobs[i - 1].submit > j.submit {
            return Err(format!(
                "job {} (line {}): submitted before the job ahead of it",
                i, j.line
            ));
        }
    }
    let mut free = vec![per_node; nodes as usize];
    let mut start = vec![0; jobs.len()];
    let mut held: Vec<Vec<(usize, u32)>> = vec![Vec::new(); jobs.len()];
    let mut running: BinaryHeap<Reverse<(Time, usize)>> = BinaryHeap::new();
    let mut queue = match order {
        Order::Fifo => Queue::Fifo(VecDeque::new()),
        Order::Sjf => Queue::Sjf(BTreeSet::new()),
    };
    let mut next = 0usize;
    loop {
        let t_arrive = jobs.get(next).map(|j| j.submit);
        let t_end = running.peek().map(|Reverse((t, _))| *t);
        let t = match (t_arrive, t_end) {
            (None, None) => break,
            (Some(a), None) => a,
            (None, Some(e)) => e,
            (Some(a), Some(e)) => a.min(e),
        };
        // 1. Ends at t free their GPUs.
        while let Some(&Reverse((e, i))) = running.peek() {
            if e != t {
                break;
            }
            running.pop();
            for &(n, g) in &held[i] {
                free[n] += g;
            }
            held[i] = Vec::new();
        }
        // 2. Arrivals at t join the queue.
        while let Some(j) = jobs.get(next).filter(|j| j.submit == t) {
            queue.push(next, j.duration);
            next += 1;
        }
        // 3. One pass, stopping at the first job that does not fit.
        while let Some(i) = queue.head() {
            let Some(at) = place(&free, per_node, jobs[i].gpus) else {
                break;
            };
            queue.pop();
            for &(n, g) in &at {
                free[n] -= g;
            }
            held[i] = at;
            start[i] = t;
            running.push(Reverse((t + jobs[i].duration, i)));
        }
    }
    Ok(start)
}

/// Figures of one cluster, or of all jobs together.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Figures {
    /// Jobs simulated.
    pub jobs: u64,
    /// Mean of `start − submit`, seconds.
    pub avg_queue_s: f64,
    /// Mean of `end − submit`, seconds.
    pub avg_jct_s: f64,
    /// Longest wait, seconds.
    pub max_queue_s: Secs,
    /// Jobs that waited at all.
    pub queued_jobs: u64,
    /// When the last job ended, seconds from the trace's origin.
    pub makespan_s: Time,
}

impl Figures {
    fn new(jobs: &[Job], start: &[Time]) -> Figures {
        let mut f = Figures {
            jobs: jobs.len() as u64,
            avg_queue_s: 0.0,
            avg_jct_s: 0.0,
            max_queue_s: 0,
            queued_jobs: 0,
            makespan_s: 0,
        };
        let (mut queue, mut jct) = (0u128, 0u128);
        for (j, &s) in jobs.iter().zip(start) {
            let q = s - j.submit;
            queue += u128::from(q);
            jct += u128::from(q + j.duration);
            f.max_queue_s = f.max_queue_s.max(q);
            f.queued_jobs += u64::from(q > 0);
            f.makespan_s = f.makespan_s.max(s + j.duration);
        }
        f.set_means(queue, jct);
        f
    }

    fn set_means(&mut self, queue: u128, jct: u128) {
        let n = self.jobs.max(1) as f64;
        self.avg_queue_s = round3(queue as f64 / n);
        self.avg_jct_s = round3(jct as f64 / n);
    }
}

fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

/// One cluster's result.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ClusterFigures {
    /// The cluster (a virtual cluster of the trace).
    pub name: String,
    /// Nodes.
    pub nodes: u32,
    /// GPUs per node.
    pub gpus_per_node: u32,
    /// Its figures.
    #[serde(flatten)]
    pub figures: Figures,
}

/// A strict-order run of every cluster of a trace, each separately.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StrictReport {
    /// `fifo` or `sjf`.
    pub policy: &'static str,
    /// The scenario's name.
    pub scenario: String,
    /// The trace file.
    pub trace: String,
    /// The time origin: the first simulated job's submit time (UTC).
    pub origin: String,
    /// Per cluster, in the scenario's order.
    pub clusters: Vec<ClusterFigures>,
    /// Over every job of every cluster (not a mean of the clusters' means).
    pub overall: Figures,
    /// Rows of the trace left out, and why.
    pub dropped: TraceDrops,
    /// Seconds spent reading and parsing the trace (the one figure that varies).
    pub parse_wall_s: f64,
    /// Seconds spent simulating (the one figure that varies).
    pub sim_wall_s: f64,
    /// Each cluster's jobs and their starts (for `--per-job`).
    #[serde(skip)]
    pub starts: Vec<Vec<(Job, Time)>>,
}

/// Simulates every cluster of `trace` separately under `order`.
pub fn run(scenario: &str, trace: &HeliosTrace, order: Order) -> Result<StrictReport, String> {
    let mut clusters = Vec::new();
    let mut starts = Vec::new();
    let mut all: Vec<(Job, Time)> = Vec::new();
    for c in &trace.clusters {
        let s = simulate(c.nodes, c.gpus_per_node, &c.jobs, order)
            .map_err(|e| format!("cluster {}: {e}", c.name))?;
        clusters.push(ClusterFigures {
            name: c.name.clone(),
            nodes: c.nodes,
            gpus_per_node: c.gpus_per_node,
            figures: Figures::new(&c.jobs, &s),
        });
        let pairs: Vec<(Job, Time)> = c.jobs.iter().copied().zip(s).collect();
        all.extend(pairs.iter().copied());
        starts.push(pairs);
    }
    let (jobs, st): (Vec<Job>, Vec<Time>) = all.into_iter().unzip();
    Ok(StrictReport {
        policy: order.name(),
        scenario: scenario.to_string(),
        trace: trace.file.clone(),
        origin: trace.origin_text(),
        clusters,
        overall: Figures::new(&jobs, &st),
        dropped: trace.dropped.clone(),
        parse_wall_s: 0.0,
        sim_wall_s: 0.0,
        starts,
    })
}

impl StrictReport {
    /// The per-cluster table people read.
    pub fn table(&self) -> String {
        let mut s = format!(
            "{}: {} (strict order, head-of-line blocking, consolidated placement), {} clusters simulated separately\n",
            self.scenario,
            self.policy,
            self.clusters.len()
        );
        s += &format!("trace {} (origin {})\n\n", self.trace, self.origin);
        s += &format!(
            "{:<10} {:>5} {:>5} {:>7} {:>12} {:>12} {:>11} {:>7}\n",
            "cluster", "nodes", "gpus", "jobs", "avg queue s", "avg jct s", "max queue s", "waited"
        );
        let row = |name: &str, nodes: String, gpus: String, f: &Figures| {
            format!(
                "{:<10} {:>5} {:>5} {:>7} {:>12.3} {:>12.3} {:>11} {:>7}\n",
                name, nodes, gpus, f.jobs, f.avg_queue_s, f.avg_jct_s, f.max_queue_s, f.queued_jobs
            )
        };
        for c in &self.clusters {
            s += &row(
                &c.name,
                c.nodes.to_string(),
                (c.nodes * c.gpus_per_node).to_string(),
                &c.figures,
            );
        }
        let nodes: u32 = self.clusters.iter().map(|c| c.nodes).sum();
        let gpus: u32 = self
            .clusters
            .iter()
            .map(|c| c.nodes * c.gpus_per_node)
            .sum();
        s += &row("all", nodes.to_string(), gpus.to_string(), &self.overall);
        s += &format!("\ndropped: {}\n", self.dropped.text());
        s += &format!(
            "wall: {:.3} s reading the trace, {:.3} s simulating\n",
            self.parse_wall_s, self.sim_wall_s
        );
        s
    }

    /// Every job's start as CSV: `cluster,line,submit_s,duration_s,gpus,start_s,queue_s`.
    pub fn per_job_csv(&self) -> String {
        let mut s = String::from("cluster,line,submit_s,duration_s,gpus,start_s,queue_s\n");
        for (c, jobs) in self.clusters.iter().zip(&self.starts) {
            for (j, st) in jobs {
                s += &format!(
                    "{},{},{},{},{},{},{}\n",
                    c.name,
                    j.line,
                    j.submit,
                    j.duration,
                    j.gpus,
                    st,
                    st - j.submit
                );
            }
        }
        s
    }
}
