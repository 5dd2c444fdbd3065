//! Pending work per project, ordered by priority plus aging, then submit time.
//!
//! A project's queue is split by *shape* (size and funding kind) and by priority
//! level; inside one level the oldest comes first, which is also the most aged, so a
//! k-way merge of the level heads yields the exact project order at any `now` without
//! re-sorting. Splitting by shape (size and contract) lets a pass skip every workload
//! of a shape that cannot start any more in one step.

use crate::time::Time;
use crate::workload::{WorkloadId, WorkloadSpec};
use std::cmp::Reverse;
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
    /// The nodes it may run on besides size (GPU types, features, cluster).
    pub sel: crate::select::Selector,
}

impl Shape {
    /// The shape of a spec.
    pub fn of(spec: &WorkloadSpec, sel: crate::select::Selector) -> Shape {
        Shape {
            nodes: spec.nodes,
            gpus: spec.gpus_per_node,
            cpu: spec.cpu_per_node,
            mem: spec.mem_per_node_gb,
            protected: spec.min_runtime > 0,
            min_runtime: spec.min_runtime,
            time_limit: spec.time_limit,
            sel,
        }
    }
}

type Level = BTreeSet<(Time, WorkloadId)>;

/// One project's pending work.
///
/// Besides the levels, each priority keeps the first (oldest) workload of every shape
/// in submit order (`heads`): inside one priority the best workload is simply the
/// oldest, so a cursor merges one stream per priority and opens a shape's level only
/// when it takes that shape's first workload. Building a cursor costs the number of
/// priorities, and each step a logarithm, however many workloads and shapes wait.
#[derive(Debug, Clone, Default)]
pub struct ProjectQueue {
    by_shape: BTreeMap<Shape, BTreeMap<i32, Level>>,
    heads: BTreeMap<i32, BTreeSet<(Time, WorkloadId, Shape)>>,
    len: usize,
}

impl ProjectQueue {
    /// Adds a workload.
    pub fn insert(&mut self, shape: Shape, priority: i32, submit: Time, id: WorkloadId) {
        let level = self
            .by_shape
            .entry(shape)
            .or_default()
            .entry(priority)
            .or_default();
        let head = level.first().copied();
        if !level.insert((submit, id)) {
            return;
        }
        self.len += 1;
        if head.is_none_or(|h| (submit, id) < h) {
            let heads = self.heads.entry(priority).or_default();
            if let Some((t, old)) = head {
                heads.remove(&(t, old, shape));
            }
            heads.insert((submit, id, shape));
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
        let was_head = level.first() == Some(&(submit, id));
        let removed = level.remove(&(submit, id));
        if was_head {
            if let Some(heads) = self.heads.get_mut(&priority) {
                heads.remove(&(submit, id, shape));
                if let Some(&(t, next)) = level.first() {
                    heads.insert((t, next, shape));
                }
                if heads.is_empty() {
                    self.heads.remove(&priority);
                }
            }
        }
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
            queue: self,
            streams: Vec::with_capacity(self.heads.len()),
            subs: Vec::new(),
            heap: BinaryHeap::with_capacity(self.heads.len()),
            now,
            aging,
        };
        for (&prio, heads) in &self.heads {
            let mut firsts = heads.iter();
            let first = firsts.next();
            c.streams.push(Stream {
                prio,
                firsts,
                first,
                later: BinaryHeap::new(),
            });
            c.offer(c.streams.len() - 1);
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
    /// Width of a priority band (0: no bands): aging lifts work at most to the top of
    /// its own band, never into the next.
    pub band: u32,
}

impl Aging {
    /// Effective priority of work of `priority` submitted at `submit`, at `now`.
    pub fn effective(&self, priority: i32, submit: Time, now: Time) -> i64 {
        let waited = now.saturating_sub(submit);
        let bonus =
            (waited.saturating_mul(u64::from(self.per_hour)) / 3_600).min(u64::from(self.cap));
        let raised = i64::from(priority) + bonus as i64;
        if self.band == 0 {
            return raised;
        }
        let band = i64::from(self.band);
        let top = i64::from(priority).div_euclid(band) * band + band - 1;
        raised.min(top)
    }
}

/// The rest of one shape's level, opened when its first workload was taken.
struct Sub<'a> {
    shape: Shape,
    iter: btree_set::Range<'a, (Time, WorkloadId)>,
}

/// One priority's work in submit order: the shapes' first workloads not yet reached
/// (`first`, then `firsts`), and the next workload of each shape already taken from
/// (`later`: submit, id, index into `Cursor::subs`).
struct Stream<'a> {
    prio: i32,
    firsts: btree_set::Iter<'a, (Time, WorkloadId, Shape)>,
    first: Option<&'a (Time, WorkloadId, Shape)>,
    later: BinaryHeap<Reverse<(Time, WorkloadId, usize)>>,
}

impl Stream<'_> {
    /// The oldest workload left in this priority.
    fn best(&self) -> Option<(Time, WorkloadId)> {
        let a = self.first.map(|&(t, id, _)| (t, id));
        let b = self.later.peek().map(|Reverse((t, id, _))| (*t, *id));
        match (a, b) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }
}

#[derive(PartialEq, Eq)]
struct Head {
    eff: i64,
    submit: Time,
    id: WorkloadId,
    stream: usize,
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
    queue: &'a ProjectQueue,
    streams: Vec<Stream<'a>>,
    subs: Vec<Sub<'a>>,
    /// Each stream's best, at most one entry per stream.
    heap: BinaryHeap<Head>,
    now: Time,
    aging: Aging,
}

impl Cursor<'_> {
    /// Puts stream `idx`'s best (if any) in the heap.
    fn offer(&mut self, idx: usize) {
        let s = &self.streams[idx];
        if let Some((submit, id)) = s.best() {
            let eff = self.aging.effective(s.prio, submit, self.now);
            self.heap.push(Head {
                eff,
                submit,
                id,
                stream: idx,
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
            let s = &mut self.streams[h.stream];
            // Take the stream's best, which `h` is, from wherever it waits.
            let from_first = s
                .first
                .is_some_and(|&(t, id, _)| (t, id) == (h.submit, h.id));
            let (shape, sub) = if from_first {
                let shape = s.first.map(|x| x.2).expect("checked");
                s.first = s.firsts.next();
                (shape, None)
            } else {
                let Some(Reverse((_, _, sub))) = s.later.pop() else {
                    continue;
                };
                (self.subs[sub].shape, Some(sub))
            };
            let prio = s.prio;
            // A dead shape is dropped whole: nothing of it can start.
            let alive = !dead(&shape);
            if alive {
                let sub = sub.unwrap_or_else(|| {
                    let level = &self.queue.by_shape[&shape][&prio];
                    let iter = level.range((
                        std::ops::Bound::Excluded((h.submit, h.id)),
                        std::ops::Bound::Unbounded,
                    ));
                    self.subs.push(Sub { shape, iter });
                    self.subs.len() - 1
                });
                if let Some(&(t, id)) = self.subs[sub].iter.next() {
                    self.streams[h.stream].later.push(Reverse((t, id, sub)));
                }
            }
            self.offer(h.stream);
            if alive {
                return Some((h.id, shape));
            }
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
            sel: Default::default(),
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
            band: 0,
        };
        // At 4h: w1 = 0+4, w2 = 5+1, w3 = 5+1, w4 = 0+3.
        let mut c = q.cursor(4 * 3_600, aging);
        let order: Vec<_> = std::iter::from_fn(|| c.next(|_| false).map(|x| x.0 .0)).collect();
        assert_eq!(order, [2, 3, 1, 4]);
        // At 10h: w1 = 10, w2 = w3 = 12, w4 = 9; cap 6 flattens: w1 = 6, w2 = w3 = 11.
        let capped = Aging {
            per_hour: 1,
            cap: 6,
            band: 0,
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

    #[test]
    fn cursor_matches_a_full_sort_after_inserts_and_removes() {
        let mut x = 0x9e37_79b9_7f4a_7c15_u64;
        let mut rand = |n: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % n
        };
        let mut q = ProjectQueue::default();
        let mut all = Vec::new();
        for i in 0..3_000u64 {
            let (sh, prio, submit) = (
                shape(1 + rand(4) as u32),
                [0, 5, 10][rand(3) as usize],
                rand(40) * 1_800,
            );
            q.insert(sh, prio, submit, WorkloadId(i));
            all.push((sh, prio, submit, WorkloadId(i)));
            if rand(3) == 0 {
                let k = rand(all.len() as u64) as usize;
                let (sh, prio, submit, id) = all.swap_remove(k);
                assert!(q.remove(sh, prio, submit, id));
            }
        }
        assert_eq!(q.len(), all.len());
        let aging = Aging {
            per_hour: 1,
            cap: 8,
            band: 10,
        };
        let now = 40 * 1_800;
        let mut want: Vec<_> = all
            .iter()
            .map(|&(sh, prio, submit, id)| (-aging.effective(prio, submit, now), submit, id, sh))
            .collect();
        want.sort_by_key(|w| (w.0, w.1, w.2));
        let mut c = q.cursor(now, aging);
        let got: Vec<_> = std::iter::from_fn(|| c.next(|_| false).map(|x| x.0)).collect();
        assert_eq!(got, want.iter().map(|w| w.2).collect::<Vec<_>>());
        // Dead shapes are passed over, the rest keeps its order.
        let mut c = q.cursor(now, aging);
        let got: Vec<_> = std::iter::from_fn(|| c.next(|s| s.gpus % 2 == 0).map(|x| x.0)).collect();
        let alive: Vec<_> = want
            .iter()
            .filter(|w| w.3.gpus % 2 == 1)
            .map(|w| w.2)
            .collect();
        assert_eq!(got, alive);
    }
}
