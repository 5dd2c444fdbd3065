//! The static-priority baseline allot replaces, kept for before/after comparisons
//! (`allot-sim --policy priority`): its settings, and the pass's global
//! priority order and per-team caps.

use super::pass::{block, Pass};
use super::{Scheduler, State};
use crate::ledger::Channel;
use crate::queue::{Aging, Cursor, ProjectQueue, Shape};
use crate::time::Time;
use crate::tree::{GroupId, OrgTree};
use crate::workload::Blocked;
use crate::workload::WorkloadId;

/// The static-priority policy allot replaces, kept for before/after comparisons:
/// one global order by priority then submit time, a concurrent-GPU cap per team for
/// protected work, protected work never preempted, and preemptible (`min_runtime = 0`)
/// work allowed past the cap on idle GPUs.
#[derive(Debug, Clone)]
pub struct Baseline {
    /// Cap per group index; only teams (children of the root) are read.
    pub team_caps: Vec<u64>,
}

impl Scheduler {
    /// Turns this scheduler into the static-priority baseline (no fair share, no
    /// aging, no reservations, protected work never preempted).
    pub fn into_baseline(mut self, b: Baseline) -> Self {
        self.cfg.aging_per_hour = 0;
        self.cfg.max_reservations = 0;
        self.st.protect_forever = true;
        self.baseline = Some(b);
        self
    }
}

impl Pass<'_> {
    /// Funded GPUs each team runs as the pass begins, indexed by group: what the
    /// baseline's caps are counted against.
    pub(super) fn protected_per_team(tree: &OrgTree, st: &State) -> Vec<u64> {
        let mut team_protected = vec![0; tree.len()];
        for &p in tree.projects() {
            team_protected[tree.team_of(p).idx()] += st.ledger.rate(p)[Channel::FundedGpu as usize];
        }
        team_protected
    }

    /// Baseline order: the project whose best workload has the highest priority, then
    /// the earliest submit time, across the whole cluster.
    pub(super) fn pick_by_priority<'q>(
        &self,
        cursors: &mut [Option<Cursor<'q>>],
        queues: &'q [ProjectQueue],
        aging: Aging,
    ) -> Option<GroupId> {
        type Key = (i64, std::cmp::Reverse<Time>, std::cmp::Reverse<WorkloadId>);
        let mut best: Option<(Key, GroupId)> = None;
        for &p in self.tree.projects() {
            if !self.project_active[p.idx()] {
                continue;
            }
            let c = cursors[p.idx()].get_or_insert_with(|| queues[p.idx()].cursor(self.now, aging));
            let key = match c.peek() {
                Some((eff, submit, id)) => (eff, std::cmp::Reverse(submit), std::cmp::Reverse(id)),
                None => (
                    i64::MIN,
                    std::cmp::Reverse(0),
                    std::cmp::Reverse(WorkloadId(0)),
                ),
            };
            if best.as_ref().is_none_or(|b| key > b.0) {
                best = Some((key, p));
            }
        }
        best.map(|b| b.1)
    }

    /// Under the baseline, whether funded work of `gpus` GPUs would take `p`'s team
    /// past its cap; if so that shape of `p` is passed over for the rest of the pass
    /// and the workload is told why.
    pub(super) fn over_team_cap(
        &mut self,
        st: &mut State,
        p: GroupId,
        id: WorkloadId,
        shape: Shape,
        gpus: u64,
    ) -> bool {
        let Some(b) = self.baseline else {
            return false;
        };
        let team = self.tree.team_of(p);
        let cap = b.team_caps.get(team.idx()).copied().unwrap_or(0);
        if self.team_protected[team.idx()] + gpus <= cap {
            return false;
        }
        self.cap_dead.insert((p, shape));
        block(st, id, Blocked::OverCap { cap });
        true
    }
}
