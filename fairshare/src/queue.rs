//! Pending work per project, ordered by priority plus aging, then submit time.
//!
//! A project's queue is split by *shape* (size and funding kind) and by priority
//! level; inside one level the oldest comes first, which is also the most aged, so a
//! k-way merge of the level heads yields the exact project order at any `now` without
//! re-sorting. Splitting by shape (size and contract) lets a pass skip every workload
//! of a shape that cannot start any more in one step.

use crate::time::Time;
use crate::workload::{WorkloadId, WorkloadSpec};
use std::collections::btree_set;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap};

/// What a workload needs, as far as fitting goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Shape {
    /// Nodes (gang size).
    pub nodes: u32,
    /// GPUs per node.
    pub gpus: u32,
    /// CPU per node.
    pub cpu: u32,
    /// Memory per node.
    pub mem: u32,
    /// Asks for protection (`min_runtime > 0`), so may be funded and may preempt.
    pub protected: bool,
    /// The contract: min runtime and time limit decide where work may backfill.
    pub min_runtime: u64,
    /// Time limit, if any.
    pub time_limit: Option<u64>,
}

impl Shape {
    /// The shape of a spec.
    pub fn of(spec: &WorkloadSpec) -> Shape {
        Shape {
            nodes: spec.nodes,
            gpus: spec.gpus_per_node,
            cpu: spec.cpu_per_node,
            mem: spec.mem_per_node_gb,
            protected: spec.min_runtime > 0,
            min_runtime: spec.min_runtime,
            time_limit: spec.time_limit,
        }
    }
}

type Level = BTreeSet<(Time, WorkloadId)>;

/// One project's pending work.
#[derive(Debug, Clone, Default)]
pub struct ProjectQueue {
    by_shape: BTreeMap<Shape, BTreeMap<i32, Level>>,
    len: usize,
}

impl ProjectQueue {
    /// Adds a workload.
    pub fn insert(&mut self, shape: Shape, priority: i32, submit: Time, id: WorkloadId) {
        if self
            .by_shape
            .entry(shape)
            .or_default()
            .entry(priority)
            .or_default()
            .insert((submit, id))
        {
            self.len += 1;
        }
    }

    /// Removes a workload; false if it was not there.
    pub fn remove(&mut self, shape: Shape, priority: i32, submit: Time, id: WorkloadId) -> bool {
        let Some(levels) = self.by_shape.get_mut(&shape) else {
            return false;
        };
        let Some(level) = levels.get_mut(&priority) else {
            return false;
        };
        let removed = level.remove(&(submit, id));
        if level.is_empty() {
            levels.remove(&priority);
        }
        if levels.is_empty() {
            self.by_shape.remove(&shape);
        }
        if removed {
            self.len -= 1;
        }
        removed
    }

    /// Number pending.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when nothing is pending.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// All pending ids in no particular order.
    pub fn ids(&self) -> impl Iterator<Item = WorkloadId> + '_ {
        self.by_shape
            .values()
            .flat_map(|l| l.values())
            .flat_map(|s| s.iter().map(|&(_, id)| id))
    }

    /// A cursor yielding this project's work best first as of `now`.
    pub fn cursor(&self, now: Time, aging: Aging) -> Cursor<'_> {
        let mut c = Cursor {
            subs: Vec::new(),
            heap: BinaryHeap::new(),
            now,
            aging,
        };
        for (shape, levels) in &self.by_shape {
            for (&prio, level) in levels {
                let idx = c.subs.len();
                c.subs.push(Sub {
                    shape: *shape,
                    prio,
                    iter: level.iter(),
                });
                c.advance(idx);
            }
        }
        c
    }
}

/// How waiting raises priority.
#[derive(Debug, Clone, Copy)]
pub struct Aging {
    /// Points per hour.
    pub per_hour: u32,
    /// Most points.
    pub cap: u32,
}

impl Aging {
    /// Effective priority of work of `priority` submitted at `submit`, at `now`.
    pub fn effective(&self, priority: i32, submit: Time, now: Time) -> i64 {
        let waited = now.saturating_sub(submit);
        let bonus =
            (waited.saturating_mul(u64::from(self.per_hour)) / 3_600).min(u64::from(self.cap));
        i64::from(priority) + bonus as i64
    }
}

struct Sub<'a> {
    shape: Shape,
    prio: i32,
    iter: btree_set::Iter<'a, (Time, WorkloadId)>,
}

#[derive(PartialEq, Eq)]
struct Head {
    eff: i64,
    submit: Time,
    id: WorkloadId,
    sub: usize,
}

impl Ord for Head {
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        // Max-heap: higher effective priority, then earlier submit, then lower id.
        self.eff
            .cmp(&o.eff)
            .then(o.submit.cmp(&self.submit))
            .then(o.id.cmp(&self.id))
    }
}

impl PartialOrd for Head {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}

/// Walks one project's queue in order, skipping shapes the caller has given up on.
pub struct Cursor<'a> {
    subs: Vec<Sub<'a>>,
    heap: BinaryHeap<Head>,
    now: Time,
    aging: Aging,
}

impl Cursor<'_> {
    fn advance(&mut self, idx: usize) {
        let s = &mut self.subs[idx];
        if let Some(&(submit, id)) = s.iter.next() {
            let eff = self.aging.effective(s.prio, submit, self.now);
            self.heap.push(Head {
                eff,
                submit,
                id,
                sub: idx,
            });
        }
    }

    /// The best remaining head: effective priority, submit time, id.
    pub fn peek(&self) -> Option<(i64, Time, WorkloadId)> {
        self.heap.peek().map(|h| (h.eff, h.submit, h.id))
    }

    /// The next workload whose shape `dead` does not reject.
    pub fn next(&mut self, dead: impl Fn(&Shape) -> bool) -> Option<(WorkloadId, Shape)> {
        while let Some(h) = self.heap.pop() {
            let shape = self.subs[h.sub].shape;
            if dead(&shape) {
                continue; // drop the whole level: nothing of this shape can start
            }
            self.advance(h.sub);
            return Some((h.id, shape));
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(gpus: u32) -> Shape {
        Shape {
            nodes: 1,
            gpus,
            cpu: 0,
            mem: 0,
            protected: true,
            min_runtime: 3_600,
            time_limit: None,
        }
    }

    #[test]
    fn merges_priority_and_aging_then_submit() {
        let mut q = ProjectQueue::default();
        q.insert(shape(1), 0, 0, WorkloadId(1)); // old, low priority
        q.insert(shape(2), 5, 3 * 3_600, WorkloadId(2)); // newer, high priority
        q.insert(shape(1), 5, 3 * 3_600, WorkloadId(3)); // same as 2, higher id
        q.insert(shape(4), 0, 3_600, WorkloadId(4));
        let aging = Aging {
            per_hour: 1,
            cap: 100,
        };
        // At 4h: w1 = 0+4, w2 = 5+1, w3 = 5+1, w4 = 0+3.
        let mut c = q.cursor(4 * 3_600, aging);
        let order: Vec<_> = std::iter::from_fn(|| c.next(|_| false).map(|x| x.0 .0)).collect();
        assert_eq!(order, [2, 3, 1, 4]);
        // At 10h: w1 = 10, w2 = w3 = 12, w4 = 9; cap 6 flattens: w1 = 6, w2 = w3 = 11.
        let capped = Aging {
            per_hour: 1,
            cap: 6,
        };
        let mut c = q.cursor(10 * 3_600, capped);
        let order: Vec<_> = std::iter::from_fn(|| c.next(|_| false).map(|x| x.0 .0)).collect();
        assert_eq!(order, [2, 3, 1, 4]);
        // A dead shape is skipped wholesale.
        let mut c = q.cursor(10 * 3_600, aging);
        let order: Vec<_> =
            std::iter::from_fn(|| c.next(|s| s.gpus == 1).map(|x| x.0 .0)).collect();
        assert_eq!(order, [2, 4]);
        assert!(q.remove(shape(1), 0, 0, WorkloadId(1)));
        assert!(!q.remove(shape(1), 0, 0, WorkloadId(1)));
        assert_eq!(q.len(), 3);
    }
}
