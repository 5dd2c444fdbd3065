//! FIFO with EASY backfill, the reference a Slurm site runs (`sched/backfill` with
//! one reservation), kept to judge allot against (`allot-sim --policy fifo-backfill`).
//!
//! One queue for the whole cluster in submit order. A pass starts every workload
//! that fits on free GPUs, in that order, until the first that does not (the head).
//! The head gets a *shadow*: the earliest time at which, counting running leases
//! out by their time limits, it would fit, and the nodes it would take then. Later
//! workloads still start where they fit, if they end (by their own time limit)
//! before the shadow time, or otherwise on nodes the head will not need: so nothing
//! started delays the head, and GPUs idle only where nothing fits. No budgets, no
//! preemption, no aging: work runs until it ends or its node drains.
//!
//! Work with no time limit is taken to run forever, as a Slurm site without a
//! default limit would; the simulator gives it its real duration (perfect
//! estimates, the best case for backfill).

use super::placement::free_placement;
use super::{Scheduler, State};
use crate::cluster::{NodeId, NodeState};
use crate::decision::{Action, Decisions, StartWhy};
use crate::queue::Shape;
use crate::select::Selector;
use crate::time::Time;
use crate::workload::{LeaseId, WorkloadId};
use std::collections::{BTreeMap, BTreeSet};
use std::ops::Bound;

/// What FIFO with EASY backfill keeps besides the core's state.
#[derive(Debug, Clone, Default)]
pub(super) struct Fifo {
    /// Pending work by submit time.
    pub(super) queue: BTreeSet<(Time, WorkloadId)>,
    /// Leases it started, by when their time limits end them (`Time::MAX`: no
    /// limit). Ended leases leave lazily, when a shadow walks past them.
    ends: BTreeSet<(Time, LeaseId)>,
}

/// When the head of the queue would start and where.
struct Shadow {
    head: WorkloadId,
    at: Time,
    nodes: Vec<NodeId>,
}

impl Scheduler {
    /// Turns this scheduler into FIFO with EASY backfill (see the module).
    pub fn into_fifo_backfill(mut self) -> Self {
        self.cfg.aging_per_hour = 0;
        self.cfg.max_reservations = 0;
        self.st.protect_forever = true;
        let mut fifo = Fifo::default();
        for w in self.st.workloads.values() {
            if w.state == crate::workload::WorkloadState::Pending {
                fifo.queue.insert((w.submit, w.id));
            }
        }
        for l in self.st.leases.values() {
            let limit = self
                .st
                .workloads
                .get(&l.workload)
                .and_then(|w| w.spec.time_limit);
            fifo.ends.insert((end_by(l.start, limit), l.id));
        }
        self.fifo = Some(fifo);
        self
    }

    /// One FIFO pass with EASY backfill at `now`.
    pub(super) fn fifo_pass(&mut self, now: Time, d: &mut Decisions) {
        let Some(fifo) = self.fifo.as_mut() else {
            return;
        };
        let cooldown = self.cfg.cooldown;
        let st = &mut self.st;
        let mut shadow: Option<Shadow> = None;
        // The head's nodes, set aside while work that would outlast the shadow is
        // placed: (node, its claimed bits before).
        let mut hidden: Vec<(NodeId, u64)> = Vec::new();
        // Shapes (with what they ask of nodes) found not to fit in this pass.
        type Key = (u32, u32, u32, u32, Selector, bool);
        let mut dead: BTreeSet<Key> = BTreeSet::new();
        let mut examined = 0u32;
        let mut after: Bound<(Time, WorkloadId)> = Bound::Unbounded;
        while let Some(&(submit, id)) = fifo.queue.range((after, Bound::Unbounded)).next() {
            after = Bound::Excluded((submit, id));
            // Nothing free (hidden GPUs count: shorter work may still use them).
            let idle = st.cluster.free_total() == 0 && hidden.is_empty();
            if idle || examined >= self.cfg.max_examined {
                break;
            }
            examined += 1;
            let Some(w) = st.workloads.get(&id) else {
                continue;
            };
            let shape = Shape::of(&w.spec, w.sel);
            let limit = w.spec.time_limit;
            let outlasts = shadow.as_ref().is_some_and(|s| end_by(now, limit) > s.at);
            let key = (
                shape.nodes,
                shape.gpus,
                shape.cpu,
                shape.mem,
                shape.sel,
                outlasts,
            );
            if dead.contains(&key) {
                continue;
            }
            match (&shadow, outlasts, hidden.is_empty()) {
                (Some(s), true, true) => hidden = hide(st, &s.nodes),
                (_, false, false) => show(st, std::mem::take(&mut hidden)),
                _ => {}
            }
            let Some(placement) = free_placement(&st.cluster, &shape) else {
                dead.insert(key);
                if shadow.is_none() {
                    shadow = shadow_of(st, &mut fifo.ends, id, &shape, now);
                }
                continue;
            };
            let why = match &shadow {
                None => StartWhy::Free {
                    rank: examined,
                    ratio: 0.0,
                },
                Some(s) => StartWhy::Backfill {
                    reservation_of: s.head,
                    starts: s.at,
                },
            };
            let a = st.start_lease(
                now,
                cooldown,
                id,
                placement,
                (shape.protected, false),
                None,
                why,
            );
            if let Action::Start { lease, .. } = &a {
                fifo.ends.insert((end_by(now, limit), *lease));
            }
            d.actions.push(a);
        }
        show(st, hidden);
        d.examined = examined;
    }
}

/// When work started at `start` with time limit `limit` ends at the latest.
fn end_by(start: Time, limit: Option<u64>) -> Time {
    limit.map_or(Time::MAX, |l| start.saturating_add(l))
}

/// Sets every free GPU of `nodes` aside; returns what to restore.
fn hide(st: &mut State, nodes: &[NodeId]) -> Vec<(NodeId, u64)> {
    nodes
        .iter()
        .map(|&n| {
            let before = st.cluster.node(n).claimed;
            st.cluster.update(n, |x| x.claimed |= x.healthy & !x.used);
            (n, before)
        })
        .collect()
}

/// Undoes [`hide`].
fn show(st: &mut State, hidden: Vec<(NodeId, u64)>) {
    for (n, before) in hidden {
        st.cluster.update(n, |x| x.claimed = before);
    }
}

/// The earliest time `shape` would fit if running leases end by their time limits,
/// and the nodes it would take; `None` if it would not fit even then. Walks `ends`
/// in order only as far as it must, dropping leases that have ended.
fn shadow_of(
    st: &State,
    ends: &mut BTreeSet<(Time, LeaseId)>,
    head: WorkloadId,
    shape: &Shape,
    now: Time,
) -> Option<Shadow> {
    let c = &st.cluster;
    let usable = |n: NodeId| {
        let x = c.node(n);
        // Only nodes of the types, features and cluster the head asks for.
        (x.state == NodeState::Ready && c.admits(n, &shape.sel))
            .then(|| (x.free().count_ones(), x.healthy.count_ones()))
    };
    // GPUs that leases ending so far give back, per node.
    let mut back: BTreeMap<NodeId, u32> = BTreeMap::new();
    // Gangs take whole nodes of one cluster: those whole now, then those that empty.
    let clusters = c.cluster_names().len().max(1);
    let whole_now: Vec<usize> = (0..clusters)
        .map(|k| c.whole_free_in(k as u16).map_or(0, |s| s.len()))
        .collect();
    let mut emptied: Vec<Vec<NodeId>> = vec![Vec::new(); clusters];
    let need = shape.nodes as usize;
    let mut gone = Vec::new();
    let mut found = None;
    'walk: for &(at, lid) in ends.iter() {
        if at == Time::MAX {
            break;
        }
        let Some(l) = st.leases.get(&lid) else {
            gone.push((at, lid));
            continue;
        };
        for p in &l.placement {
            let Some((free, size)) = usable(p.node) else {
                continue;
            };
            let b = back.entry(p.node).or_default();
            let was = free + *b;
            *b += p.gpus.count_ones();
            let now_free = (free + *b).min(size);
            if shape.nodes == 1 {
                if now_free >= shape.gpus {
                    found = Some((at, vec![p.node]));
                    break 'walk;
                }
            } else if size >= shape.gpus && was < size && now_free == size {
                let k = usize::from(c.node(p.node).cluster);
                emptied[k].push(p.node);
                if whole_now[k] + emptied[k].len() >= need {
                    let mut nodes = emptied[k].clone();
                    if let Some(set) = c.whole_free_in(k as u16) {
                        nodes.extend(set.iter().take(need - nodes.len()).map(|&i| NodeId(i)));
                    }
                    found = Some((at, nodes));
                    break 'walk;
                }
            }
        }
    }
    for g in gone {
        ends.remove(&g);
    }
    let (at, nodes) = found?;
    Some(Shadow {
        head,
        at: at.max(now),
        nodes,
    })
}
