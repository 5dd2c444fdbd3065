//! What keeps a pending workload out of the queue besides the policy: a hold, its
//! dependencies, a begin time, its array's limit on running elements. The core only
//! knows held or not ([`Scheduler::hold`](allot_fairshare::Scheduler::hold)); why is
//! here. Gates are settled inside [`Allocator::apply`], so replay settles them the
//! same way at the same times; the indexes that find whom an event concerns are
//! derived, never journaled.

use super::out::Applied;
use super::{Allocator, WorkRec};
use allot_fairshare::{Time, WorkloadId, WorkloadState};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};

/// How a dependency is met, as Slurm's `--dependency` kinds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum DepKind {
    /// Once the other has started (or ended).
    After,
    /// Once the other has ended, however.
    Afterany,
    /// Once the other has completed; never if it ends otherwise.
    Afterok,
    /// Once the other has ended other than completed; never if it completes.
    Afternotok,
}

impl DepKind {
    /// The word on the command line and in views.
    pub fn as_str(self) -> &'static str {
        match self {
            DepKind::After => "after",
            DepKind::Afterany => "afterany",
            DepKind::Afterok => "afterok",
            DepKind::Afternotok => "afternotok",
        }
    }

    /// Reads `after`, `afterany`, `afterok`, `afternotok`.
    pub fn parse(s: &str) -> Option<DepKind> {
        Some(match s {
            "after" => DepKind::After,
            "afterany" => DepKind::Afterany,
            "afterok" => DepKind::Afterok,
            "afternotok" => DepKind::Afternotok,
            _ => return None,
        })
    }
}

/// One dependency: a kind and the workload it waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Dep {
    /// How it is met.
    pub kind: DepKind,
    /// On which workload.
    pub id: u64,
}

/// A hold and whose it is: a user's hold is released by the owner or an operator,
/// an operator's only by an operator (Slurm's user and admin holds).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HoldRec {
    /// Who held it.
    pub by: String,
    /// Held by an operator (not the owner).
    #[serde(default)]
    pub operator: bool,
}

/// Where an element of an array stands in it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ArrayPos {
    /// The array's id: its first element's workload id.
    pub id: u64,
    /// This element's index (`ALLOT_ARRAY_INDEX`).
    pub index: u32,
    /// At most this many elements run (or wait in the queue) at once; 0: no limit.
    #[serde(default)]
    pub limit: u32,
}

/// What keeps a workload out of the queue (kept in snapshots).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Gates {
    /// A hold in force.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hold: Option<HoldRec>,
    /// Dependencies, all to be met.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub deps: Vec<Dep>,
    /// Waits until no earlier workload of its user with its name is left.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub singleton: bool,
    /// Not before this time, Unix s (0: none).
    #[serde(skip_serializing_if = "is_zero")]
    pub begin: Time,
}

fn is_zero(t: &Time) -> bool {
    *t == 0
}

impl Gates {
    /// No gate at all.
    pub fn is_open(&self) -> bool {
        *self == Gates::default()
    }
}

/// Why a workload is gated, for views.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Gated {
    /// Held.
    Held(HoldRec),
    /// A dependency not met yet.
    Dependency(Dep),
    /// An earlier workload of the same name and user is left.
    Singleton(u64),
    /// Its begin time has not come.
    Begin(Time),
    /// Its array runs as many as it may.
    ArrayLimit {
        /// The array.
        array: u64,
        /// Its limit.
        limit: u32,
    },
}

impl Gated {
    /// The reason in a word (`held`, `dependency`, ...), for metrics and filters.
    pub fn kind(&self) -> &'static str {
        match self {
            Gated::Held(_) => "held",
            Gated::Dependency(_) => "dependency",
            Gated::Singleton(_) => "singleton",
            Gated::Begin(_) => "begin-time",
            Gated::ArrayLimit { .. } => "array-limit",
        }
    }

    /// The reason in words, with what lifts it.
    pub fn text(&self) -> String {
        match self {
            Gated::Held(h) if h.operator => format!(
                "held by operator {} (an operator's `allot release` lets it go)",
                h.by
            ),
            Gated::Held(h) => format!("held by {} (`allot release` lets it go)", h.by),
            Gated::Dependency(d) => match d.kind {
                DepKind::After => format!("waiting for workload {} to start (after)", d.id),
                DepKind::Afterany => format!("waiting for workload {} to end (afterany)", d.id),
                DepKind::Afterok => {
                    format!("waiting for workload {} to complete (afterok)", d.id)
                }
                DepKind::Afternotok => {
                    format!(
                        "waiting for workload {} to fail or be stopped (afternotok)",
                        d.id
                    )
                }
            },
            Gated::Singleton(other) => {
                format!("singleton: workload {other} of the same name and user has not ended")
            }
            Gated::Begin(t) => format!(
                "begins at {} UTC (--begin)",
                allot_common::utc::format_time(i64::try_from(*t).unwrap_or(i64::MAX))
            ),
            Gated::ArrayLimit { array, limit } => format!(
                "array {array} has {limit} element(s) running or queued, its limit (%{limit})"
            ),
        }
    }
}

/// Whom an event concerns: derived from the workloads, rebuilt on restore.
#[derive(Debug, Default)]
pub(super) struct GateIndex {
    /// Workload → the pending workloads depending on it.
    dependents: BTreeMap<u64, BTreeSet<u64>>,
    /// Array id → its elements.
    pub(super) arrays: BTreeMap<u64, Vec<u64>>,
    /// (user, name) → its workloads not ended, for singletons.
    names: BTreeMap<(String, String), BTreeSet<u64>>,
    /// (user, name) → its singletons not ended: whom an end of that name concerns.
    singletons: BTreeMap<(String, String), BTreeSet<u64>>,
    /// Begin times of gated workloads.
    begins: BTreeSet<(Time, u64)>,
}

impl GateIndex {
    fn add(&mut self, w: &WorkRec) {
        if let Some(p) = w.array {
            let els = self.arrays.entry(p.id).or_default();
            if els.last().is_none_or(|l| *l < w.id) {
                els.push(w.id);
            }
        }
        if w.state.is_final() {
            return;
        }
        for d in &w.gates.deps {
            self.dependents.entry(d.id).or_default().insert(w.id);
        }
        if !w.name.is_empty() {
            let key = (w.spec.user.clone(), w.name.clone());
            if w.gates.singleton {
                self.singletons.entry(key.clone()).or_default().insert(w.id);
            }
            self.names.entry(key).or_default().insert(w.id);
        }
        if w.gates.begin != 0 {
            self.begins.insert((w.gates.begin, w.id));
        }
    }
}

/// A dependency's verdict given the other workload as it is.
enum DepVerdict {
    Met,
    Waiting,
    Never(String),
}

fn verdict(d: Dep, other: Option<&WorkRec>) -> DepVerdict {
    let Some(o) = other else {
        // Retired long after it ended: only an `afterok`/`afternotok` needed to know how.
        return match d.kind {
            DepKind::After | DepKind::Afterany => DepVerdict::Met,
            _ => DepVerdict::Never(format!(
                "{}:{}: workload {} is no longer known",
                d.kind.as_str(),
                d.id,
                d.id
            )),
        };
    };
    let ended = o.state.is_final();
    let ok = o.state == WorkloadState::Completed;
    match d.kind {
        DepKind::After if ended || !o.runs.is_empty() => DepVerdict::Met,
        DepKind::Afterany if ended => DepVerdict::Met,
        DepKind::Afterok if ok => DepVerdict::Met,
        DepKind::Afterok if ended => DepVerdict::Never(format!(
            "afterok:{}: workload {} ended {}",
            d.id,
            d.id,
            state_word(o)
        )),
        DepKind::Afternotok if ok => {
            DepVerdict::Never(format!("afternotok:{}: workload {} completed", d.id, d.id))
        }
        DepKind::Afternotok if ended => DepVerdict::Met,
        _ => DepVerdict::Waiting,
    }
}

fn state_word(w: &WorkRec) -> String {
    let s = w.state.as_str();
    match (&w.end_reason, w.exit_code) {
        (r, Some(c)) if !r.is_empty() => format!("{s} ({r}, exit {c})"),
        (r, None) if !r.is_empty() => format!("{s} ({r})"),
        _ => s.to_string(),
    }
}

impl Allocator {
    /// Rebuilds the gate index from the workloads.
    pub(super) fn index_gates(&mut self) {
        let mut ix = GateIndex::default();
        for w in self.work.values() {
            ix.add(w);
        }
        self.gate_ix = ix;
    }

    /// Indexes a new workload.
    pub(super) fn index_gate(&mut self, id: u64) {
        if let Some(w) = self.work.get(&id) {
            self.gate_ix.add(w);
        }
    }

    /// The elements of array `id` still in memory, in index order.
    pub fn array_elements(&self, id: u64) -> Vec<u64> {
        self.gate_ix.arrays.get(&id).cloned().unwrap_or_default()
    }

    /// Element `index` of array `array`, if it is still in memory.
    pub fn array_element(&self, array: u64, index: u32) -> Option<u64> {
        self.gate_ix.arrays.get(&array)?.iter().copied().find(|e| {
            self.work
                .get(e)
                .and_then(|w| w.array)
                .is_some_and(|p| p.index == index)
        })
    }

    /// Why workload `id` is kept out of the queue at `at`, if it is: the first gate
    /// in force (hold, dependency, singleton, begin time, array limit). Cheap: a
    /// pending element the core holds with no gate of its own is held by its array's
    /// limit (settling keeps it so), so nothing counts the array here.
    pub fn gated(&self, at: Time, id: u64) -> Option<Gated> {
        let w = self.work.get(&id)?;
        if w.state != WorkloadState::Pending {
            return None;
        }
        if let Some(g) = self.own_gate(at, w) {
            return Some(g);
        }
        let held = self.core.workload(WorkloadId(id)).is_some_and(|c| c.held);
        match w.array {
            Some(p) if held && p.limit > 0 => Some(Gated::ArrayLimit {
                array: p.id,
                limit: p.limit,
            }),
            _ => None,
        }
    }

    /// The gate of `w`'s own in force at `at` (its array's limit aside).
    fn own_gate(&self, at: Time, w: &WorkRec) -> Option<Gated> {
        if let Some(h) = &w.gates.hold {
            return Some(Gated::Held(h.clone()));
        }
        for d in &w.gates.deps {
            if !matches!(verdict(*d, self.work.get(&d.id)), DepVerdict::Met) {
                return Some(Gated::Dependency(*d));
            }
        }
        if w.gates.singleton {
            let earlier = self
                .gate_ix
                .names
                .get(&(w.spec.user.clone(), w.name.clone()))
                .and_then(|ids| {
                    ids.range(..w.id)
                        .find(|o| self.work.get(o).is_some_and(|o| !o.state.is_final()))
                });
            if let Some(o) = earlier {
                return Some(Gated::Singleton(*o));
            }
        }
        if w.gates.begin > at {
            return Some(Gated::Begin(w.gates.begin));
        }
        None
    }

    /// Elements of array `array` running or in the queue (not held by the core).
    fn array_active(&self, array: u64) -> usize {
        self.gate_ix.arrays.get(&array).map_or(0, |els| {
            els.iter()
                .filter_map(|e| self.work.get(e))
                .filter(|e| self.in_queue_or_running(e))
                .count()
        })
    }

    /// Whether a workload counts against its array's limit: running, or pending and
    /// not held by the core.
    fn in_queue_or_running(&self, w: &WorkRec) -> bool {
        match w.state {
            WorkloadState::Running => true,
            WorkloadState::Pending => self
                .core
                .workload(WorkloadId(w.id))
                .is_some_and(|c| !c.held),
            _ => false,
        }
    }

    /// The first dependency of `id` that can never be met, in words.
    fn doomed(&self, id: u64) -> Option<String> {
        let w = self.work.get(&id)?;
        w.gates
            .deps
            .iter()
            .find_map(|d| match verdict(*d, self.work.get(&d.id)) {
                DepVerdict::Never(why) => Some(why),
                _ => None,
            })
    }

    /// Whom a change of workload `id`'s state concerns: itself, its dependents, the
    /// first held elements of its array that could take room it leaves, and the
    /// singletons of its name.
    pub(super) fn concerned(&self, at: Time, id: u64) -> Vec<u64> {
        let mut out = vec![id];
        let Some(w) = self.work.get(&id) else {
            return out;
        };
        if let Some(d) = self.gate_ix.dependents.get(&id) {
            out.extend(d.iter().copied());
        }
        if let Some(p) = w.array {
            // Only the first few held elements can take the room an end leaves.
            let room = if p.limit == 0 {
                usize::MAX
            } else {
                p.limit as usize
            };
            if let Some(els) = self.gate_ix.arrays.get(&p.id) {
                out.extend(
                    els.iter()
                        .copied()
                        .filter(|e| self.core.workload(WorkloadId(*e)).is_some_and(|c| c.held))
                        .filter(|e| {
                            self.work
                                .get(e)
                                .is_some_and(|w| self.own_gate(at, w).is_none())
                        })
                        .take(room),
                );
            }
        }
        if !w.name.is_empty() {
            if let Some(ids) = self
                .gate_ix
                .singletons
                .get(&(w.spec.user.clone(), w.name.clone()))
            {
                out.extend(ids.iter().copied());
            }
        }
        out
    }

    /// Workloads whose begin time has come by `at`.
    fn begins_due(&mut self, at: Time) -> Vec<u64> {
        let mut due = Vec::new();
        while let Some(&(t, id)) = self.gate_ix.begins.first() {
            if t > at {
                break;
            }
            self.gate_ix.begins.pop_first();
            due.push(id);
        }
        due
    }

    /// The earliest begin time still ahead of `at`.
    pub(super) fn next_begin(&self, at: Time) -> Option<Time> {
        self.gate_ix
            .begins
            .iter()
            .map(|(t, _)| *t)
            .find(|t| *t > at)
    }

    /// Settles the gates of `ids` (and of those their changes concern, in turn) and
    /// of the workloads whose begin time has come: a workload whose dependency can
    /// never be met ends, cancelled with the reason; one with no gate left joins the
    /// queue; one gated again (held, requeued past its array's limit) leaves it.
    /// Lower ids first, so an array's elements start in index order.
    /// Returns whether anything changed.
    pub(super) fn settle(&mut self, at: Time, ids: Vec<u64>, a: &mut Applied) -> bool {
        let mut any = false;
        let mut todo: BTreeSet<u64> = ids.into_iter().collect();
        todo.extend(self.begins_due(at));
        // Elements running or queued per array, counted once per settling and kept
        // as elements flip: an array of 10,000 settles in linear time.
        let mut active: BTreeMap<u64, usize> = BTreeMap::new();
        while let Some(id) = todo.pop_first() {
            let Some(w) = self.work.get(&id) else {
                continue;
            };
            if w.state != WorkloadState::Pending {
                continue;
            }
            if let Some(why) = self.doomed(id) {
                if self.core.cancel(at, WorkloadId(id)).is_ok() {
                    any = true;
                    self.sync(at, id, "dependency-never-satisfied");
                    self.ended_unrun(at, id, a);
                    a.audit(
                        id,
                        0,
                        format!("ended: its dependency can never be met: {why}"),
                    );
                    todo.extend(self.concerned(at, id));
                    self.unindex_ended(id);
                }
                continue;
            }
            // A dependency met stays met (the other has started or ended for good):
            // it is dropped, so the other's retiring from memory later changes nothing.
            self.prune_met(id);
            let Some(w) = self.work.get(&id) else {
                continue;
            };
            let own = self.own_gate(at, w).is_some();
            let queued = self.core.workload(WorkloadId(id)).is_some_and(|c| !c.held);
            let array = w.array.filter(|p| p.limit > 0);
            let over = match array {
                Some(p) => {
                    let n = *active
                        .entry(p.id)
                        .or_insert_with(|| self.array_active(p.id));
                    // The others running or queued, this one aside.
                    n.saturating_sub(usize::from(queued)) >= p.limit as usize
                }
                None => false,
            };
            // Pending was checked above, so neither call can be refused.
            let flipped = if own || over {
                self.core.hold(at, WorkloadId(id))
            } else {
                self.core.release(at, WorkloadId(id))
            }
            .unwrap_or(false);
            if let (true, Some(p)) = (flipped, array) {
                let n = active.entry(p.id).or_default();
                *n = if queued { n.saturating_sub(1) } else { *n + 1 };
            }
            any |= flipped;
        }
        any
    }

    /// Drops the dependencies of `id` that are met for good.
    fn prune_met(&mut self, id: u64) {
        let Some(deps) = self.work.get(&id).map(|w| w.gates.deps.clone()) else {
            return;
        };
        let keep: Vec<Dep> = deps
            .into_iter()
            .filter(|d| !matches!(verdict(*d, self.work.get(&d.id)), DepVerdict::Met))
            .collect();
        if let Some(w) = self.work.get_mut(&id) {
            w.gates.deps = keep;
        }
    }

    /// Workload `id` changed (started, ended, went back to the queue, was held,
    /// released or updated): settles what that concerns.
    pub(super) fn changed(&mut self, at: Time, id: u64, a: &mut Applied) {
        let concerned = self.concerned(at, id);
        self.unindex_ended(id);
        self.settle(at, concerned, a);
    }

    /// A workload ended: it no longer keeps singletons of its name waiting.
    pub(super) fn unindex_ended(&mut self, id: u64) {
        let Some(w) = self.work.get(&id) else {
            return;
        };
        if !w.state.is_final() || w.name.is_empty() {
            return;
        }
        let key = (w.spec.user.clone(), w.name.clone());
        for ix in [&mut self.gate_ix.names, &mut self.gate_ix.singletons] {
            if let Some(ids) = ix.get_mut(&key) {
                ids.remove(&id);
                if ids.is_empty() {
                    ix.remove(&key);
                }
            }
        }
        self.gate_ix.dependents.remove(&id);
    }

    /// How many pending workloads each gate keeps out of the queue, by kind.
    pub fn gated_counts(&self, at: Time) -> BTreeMap<&'static str, u64> {
        let mut counts = BTreeMap::new();
        for w in self.work.values() {
            if w.state != WorkloadState::Pending {
                continue;
            }
            if self.core.workload(WorkloadId(w.id)).is_some_and(|c| c.held) {
                if let Some(g) = self.gated(at, w.id) {
                    *counts.entry(g.kind()).or_default() += 1;
                }
            }
        }
        counts
    }
}
