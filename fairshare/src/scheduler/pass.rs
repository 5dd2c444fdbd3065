//! One ranking pass: pick the best-ranked project, its best workload, try each way of
//! starting it in turn (free GPUs, backfill, preemption, a reservation), repeat.
//!
//! Each way that fails for a shape is remembered (`*_dead`) so the queue cursors pass
//! over later workloads of that shape without trying them again in the same pass.

use super::placement::{backfill_capacity, backfill_placement, free_placement};
use super::{Baseline, Claim, ClaimKind, State};
use crate::config::PolicyConfig;
use crate::decision::{Action, Decisions, StartWhy};
use crate::queue::{Aging, Cursor, ProjectQueue, Shape};
use crate::ratios::neg;
use crate::ratios::Ratios;
use crate::time::Time;
use crate::tree::{GroupId, OrgTree};
use crate::workload::Blocked;
use crate::workload::{NodeGpus, WorkloadId, WorkloadState};
use std::collections::BTreeSet;

/// One ranking pass: pick the best-ranked project, its best workload, try to start
/// it (free GPUs, then backfill, then preemption, then a reservation), repeat.
pub(super) struct Pass<'c> {
    pub(super) baseline: Option<&'c Baseline>,
    pub(super) team_protected: Vec<u64>,
    pub(super) cap_dead: BTreeSet<(GroupId, Shape)>,
    cfg: &'c PolicyConfig,
    pub(super) tree: &'c OrgTree,
    pub(super) now: Time,
    active_children: Vec<u32>,
    pub(super) project_active: Vec<bool>,
    budget_ok: Vec<Option<bool>>,
    free_dead: BTreeSet<Shape>,
    preempt_dead: BTreeSet<(GroupId, Shape)>,
    reserve_dead: BTreeSet<(GroupId, Shape)>,
    backfill_dead: BTreeSet<(GroupId, Shape)>,
    /// GPUs that free occupancy leaves free for protected work (`protected_headroom`).
    headroom: u64,
    /// Free occupancy starts no more this pass: the best-ranked did not fit above the
    /// headroom, and nothing ranked below it may take the GPUs it waits for.
    occupancy_closed: bool,
    plans_left: u32,
    examined: u32,
    /// The pass stopped with work it could not look at (examination or plan limit):
    /// the shell should call again soon.
    pub(super) cut_short: bool,
    /// Reservations held, those made in this pass included.
    reservations: u32,
    /// The most GPUs free on one reserved node whose reservation has not started:
    /// the largest single-node workload backfill could still place.
    backfill_cap: u32,
    /// What gang plans learnt about emptying nodes, until each node changes (the
    /// scheduler's, lent for the pass).
    pub(super) whole_keys: crate::preempt::WholeKeys,
}

/// What a round of the pass could still do besides starting on free GPUs.
struct Room {
    can_preempt: bool,
    can_reserve: bool,
}

/// The workload a round is trying to start, with what each way of starting it reads.
#[derive(Clone, Copy)]
struct Candidate {
    id: WorkloadId,
    project: GroupId,
    funded: bool,
    /// Funded by its user's allowance (its project's budget is spent).
    allowance: bool,
    shape: Shape,
    /// Its allocation (GPUs, CPUs, memory), charged to the ratios when it is placed.
    alloc: [f64; 3],
}

/// What preemption did for a candidate.
enum Preempt {
    /// Victims are being revoked and their GPUs claimed for it.
    Claimed,
    /// A plan was tried and made none, for this reason.
    Refused(Blocked),
    /// Not tried: unfunded, out of plans, or the shape already failed this pass.
    NotTried,
}

/// Records why workload `id` waits.
pub(super) fn block(st: &mut State, id: WorkloadId, why: Blocked) {
    if let Some(w) = st.workloads.get_mut(&id) {
        w.blocked = Some(why);
    }
}

impl<'c> Pass<'c> {
    /// A pass at `now` over the state as it is.
    pub(super) fn new(
        cfg: &'c PolicyConfig,
        tree: &'c OrgTree,
        st: &State,
        now: Time,
        baseline: Option<&'c Baseline>,
    ) -> Self {
        let team_protected = if baseline.is_some() {
            Self::protected_per_team(tree, st)
        } else {
            vec![0; tree.len()]
        };
        let reservations = st
            .claims
            .values()
            .filter(|c| matches!(c.kind, ClaimKind::Reservation { .. }))
            .count() as u32;
        Pass {
            baseline,
            team_protected,
            cap_dead: BTreeSet::new(),
            cfg,
            tree,
            now,
            active_children: vec![0; tree.len()],
            project_active: vec![false; tree.len()],
            budget_ok: vec![None; tree.len()],
            free_dead: BTreeSet::new(),
            preempt_dead: BTreeSet::new(),
            reserve_dead: BTreeSet::new(),
            backfill_dead: BTreeSet::new(),
            headroom: if baseline.is_some() {
                0
            } else {
                cfg.headroom_gpus(st.cluster.total_gpus())
            },
            occupancy_closed: false,
            plans_left: cfg.max_preemption_plans,
            examined: 0,
            cut_short: false,
            reservations,
            backfill_cap: backfill_capacity(st, now),
            whole_keys: Default::default(),
        }
    }

    /// Marks `p` as having work, and its ancestors as having a child with work.
    fn activate(&mut self, p: GroupId) {
        self.project_active[p.idx()] = true;
        let mut g = p;
        while let Some(parent) = self.tree.group(g).parent {
            self.active_children[parent.idx()] += 1;
            if self.active_children[parent.idx()] > 1 {
                break;
            }
            g = parent;
        }
    }

    /// Marks `p` as out of work for this pass, and ancestors left with none.
    fn deactivate(&mut self, p: GroupId) {
        self.project_active[p.idx()] = false;
        let mut g = p;
        while let Some(parent) = self.tree.group(g).parent {
            self.active_children[parent.idx()] -= 1;
            if self.active_children[parent.idx()] > 0 {
                break;
            }
            g = parent;
        }
    }

    /// Whether a project, or some project under a group, still has work this pass.
    fn is_active(&self, g: GroupId) -> bool {
        if self.tree.is_project(g) {
            self.project_active[g.idx()]
        } else {
            self.active_children[g.idx()] > 0
        }
    }

    /// Descends from the root to the lowest-ratio project with work left.
    fn pick(&self, r: &Ratios) -> Option<GroupId> {
        let mut g = GroupId::ROOT;
        while !self.tree.is_project(g) {
            let best = self
                .tree
                .group(g)
                .children
                .iter()
                .copied()
                .filter(|&c| self.is_active(c))
                .min_by(|a, b| r.ratio(*a).total_cmp(&r.ratio(*b)).then(a.cmp(b)))?;
            g = best;
        }
        Some(g)
    }

    /// Starts a lease for `id` (of project `p`) and charges it within the pass.
    #[allow(clippy::too_many_arguments)]
    fn launch(
        &mut self,
        st: &mut State,
        r: &mut Ratios,
        d: &mut Decisions,
        (id, p, funded, allowance): (WorkloadId, GroupId, bool, bool),
        placement: Vec<NodeGpus>,
        backfill_for: Option<WorkloadId>,
        why: StartWhy,
    ) {
        let lease = st.start_lease(
            self.now,
            self.cfg.cooldown,
            id,
            placement,
            (funded, allowance),
            backfill_for,
            why,
        );
        // What it holds as placed: its GPUs weighted by the types it landed on.
        let held = match &lease {
            Action::Start { lease, .. } => st.leases.get(lease).map(|l| (l.alloc(), l.gpus)),
            _ => None,
        };
        d.actions.push(lease);
        if let Some((alloc, gpus)) = held {
            self.charge(r, p, funded, &alloc, gpus);
        }
    }

    /// Counts work placed (or claimed) in this pass: in the ratios at once, and its
    /// `gpus` against the team's cap under the baseline.
    fn charge(&mut self, r: &mut Ratios, p: GroupId, funded: bool, alloc: &[f64; 3], gpus: u32) {
        r.add(self.tree, p, *alloc);
        if funded {
            self.team_protected[self.tree.team_of(p).idx()] += u64::from(gpus);
        }
    }

    /// Whether workload `id` of `p`, of `shape`, runs funded, and whether on its
    /// user's allowance: protected work within the budget (always, under the
    /// baseline), else small short work while its user's allowance lasts; the budget
    /// is read once per project and pass.
    fn funded(&mut self, st: &State, p: GroupId, id: WorkloadId, shape: &Shape) -> (bool, bool) {
        if !shape.protected {
            return (false, false);
        }
        if self.baseline.is_some() {
            return (true, false);
        }
        let now = self.now;
        let tree = self.tree;
        let spent = *self.budget_ok[p.idx()].get_or_insert_with(|| st.budget_spent(tree, p, now));
        if !spent {
            return (true, false);
        }
        let allowance = st
            .workloads
            .get(&id)
            .is_some_and(|w| st.allowance_fits(self.cfg, w, false));
        (allowance, allowance)
    }

    /// Runs the pass: rounds of pick a project, take its next workload that could
    /// start, try it; until nothing can start, no project has work left, or a limit
    /// is reached.
    pub(super) fn run(
        &mut self,
        queues: &[ProjectQueue],
        st: &mut State,
        r: &mut Ratios,
        aging: Aging,
        d: &mut Decisions,
    ) {
        let mut cursors: Vec<Option<Cursor<'_>>> = (0..self.tree.len()).map(|_| None).collect();
        self.activate_projects_with_work(queues);
        while let Some(room) = self.room(st) {
            let Some(p) = self.pick_project(r, &mut cursors, queues, aging) else {
                break;
            };
            let cursor =
                cursors[p.idx()].get_or_insert_with(|| queues[p.idx()].cursor(self.now, aging));
            let Some((id, shape)) = self.next_candidate(cursor, st, p, &room) else {
                self.deactivate(p);
                continue;
            };
            if self.examined >= self.cfg.max_examined {
                self.cut_short = true;
                break;
            }
            self.examined += 1;
            self.consider(st, r, d, p, id, shape);
        }
        d.examined = self.examined;
    }

    /// Every project with queued work takes part in the pass.
    fn activate_projects_with_work(&mut self, queues: &[ProjectQueue]) {
        for &p in self.tree.projects() {
            if !queues[p.idx()].is_empty() {
                self.activate(p);
            }
        }
    }

    /// What the next round could still do; `None` when nothing at all can start (no
    /// free GPU, nothing to preempt or backfill, no reservation to make).
    fn room(&self, st: &State) -> Option<Room> {
        let can_reserve = self.reservations < self.cfg.max_reservations
            && st.pending_gangs > self.reservations as usize;
        let can_preempt = self.plans_left > 0 && st.cluster.largest_clearable_block() > 0;
        if st.cluster.free_total() == 0 && !can_preempt && self.backfill_cap == 0 && !can_reserve {
            return None;
        }
        Some(Room {
            can_preempt,
            can_reserve,
        })
    }

    /// The project served next: the lowest served ratio, or under the baseline the
    /// one whose best workload comes first in the global priority order.
    fn pick_project<'q>(
        &self,
        r: &Ratios,
        cursors: &mut [Option<Cursor<'q>>],
        queues: &'q [ProjectQueue],
        aging: Aging,
    ) -> Option<GroupId> {
        if self.baseline.is_some() {
            self.pick_by_priority(cursors, queues, aging)
        } else {
            self.pick(r)
        }
    }

    /// `p`'s best workload that some way of starting could still place: shapes that
    /// every way has ruled out (in this pass, or by the cluster as it is) are passed
    /// over.
    fn next_candidate(
        &self,
        cursor: &mut Cursor<'_>,
        st: &State,
        p: GroupId,
        room: &Room,
    ) -> Option<(WorkloadId, Shape)> {
        let largest_free = st.cluster.largest_free_block();
        let most_whole = st.cluster.most_whole_free();
        let dead = |s: &Shape| {
            let no_free = self.free_dead.contains(s)
                || (self.occupancy_closed && !s.protected)
                || (s.nodes == 1 && s.gpus > largest_free)
                || (s.nodes > 1 && s.nodes > most_whole);
            let no_backfill =
                s.nodes > 1 || s.gpus > self.backfill_cap || self.backfill_dead.contains(&(p, *s));
            let no_preempt = !s.protected
                || !room.can_preempt
                || self.preempt_dead.contains(&(p, *s))
                || (self.budget_ok[p.idx()] == Some(true) && !self.cfg.allowance_shape(s));
            let no_reserve = s.nodes == 1
                || !s.protected
                || !room.can_reserve
                || self.reserve_dead.contains(&(p, *s));
            self.cap_dead.contains(&(p, *s)) || (no_free && no_backfill && no_preempt && no_reserve)
        };
        cursor.next(dead)
    }

    /// Tries each way of starting workload `id` of project `p` in order; when none
    /// starts it, records what it waits for.
    fn consider(
        &mut self,
        st: &mut State,
        r: &mut Ratios,
        d: &mut Decisions,
        p: GroupId,
        id: WorkloadId,
        shape: Shape,
    ) {
        let Some(w) = st.workloads.get(&id) else {
            return;
        };
        if w.state != WorkloadState::Pending {
            return;
        }
        let (alloc, gpus) = (st.request_alloc(w), u64::from(w.spec.total_gpus()));
        let reserved = match st.claims.get(&id).map(|c| c.kind) {
            Some(ClaimKind::Preemption) => {
                block(st, id, Blocked::WaitingForVictims);
                return;
            }
            Some(ClaimKind::Reservation { start }) => Some(start),
            None => None,
        };
        let (funded, allowance) = self.funded(st, p, id, &shape);
        if funded && self.over_team_cap(st, p, id, shape, gpus) {
            return;
        }
        let c = Candidate {
            id,
            project: p,
            funded,
            allowance,
            shape,
            alloc,
        };
        let held = self.within_headroom(st, &shape);
        if self.try_free(st, r, d, c, reserved, held) {
            return;
        }
        if let Some(start) = reserved {
            block(st, id, Blocked::Reserved { start });
            return;
        }
        if self.try_backfill(st, r, d, c) {
            return;
        }
        let mut blocked = if held {
            Blocked::Headroom {
                free: st.cluster.free_total(),
                kept: self.headroom,
            }
        } else {
            Self::no_room(st, c)
        };
        match self.try_preempt(st, r, c) {
            Preempt::Claimed => return,
            Preempt::Refused(why) => blocked = why,
            Preempt::NotTried => {}
        }
        if let Some(start) = self.try_reserve(st, d, c) {
            blocked = Blocked::Reserved { start };
        }
        block(st, id, blocked);
    }

    /// First way: free GPUs (for a gang holding a reservation too: whole nodes may
    /// have come free elsewhere before it starts; its reservation is then given up),
    /// unless `held` back by the headroom. Returns whether it started.
    fn try_free(
        &mut self,
        st: &mut State,
        r: &mut Ratios,
        d: &mut Decisions,
        c: Candidate,
        reserved: Option<Time>,
        held: bool,
    ) -> bool {
        if self.free_dead.contains(&c.shape) {
            return false;
        }
        if held {
            self.occupancy_closed = true;
            return false;
        }
        let Some(placement) = free_placement(&st.cluster, &c.shape) else {
            self.free_dead.insert(c.shape);
            return false;
        };
        if reserved.is_some() {
            st.drop_claim(c.id);
            self.reservations = self.reservations.saturating_sub(1);
            self.backfill_cap = backfill_capacity(st, self.now);
        }
        let why = StartWhy::Free {
            rank: self.examined,
            ratio: r.ratio(c.project),
        };
        self.launch(
            st,
            r,
            d,
            (c.id, c.project, c.funded, c.allowance),
            placement,
            None,
            why,
        );
        true
    }

    /// Whether free occupancy of `shape` would eat into the GPUs kept free for
    /// protected work: a debug job or a session then starts at once on them instead of
    /// preempting a batch run that started seconds before.
    fn within_headroom(&self, st: &State, shape: &Shape) -> bool {
        !shape.protected
            && (self.occupancy_closed
                || st.cluster.free_total()
                    < self.headroom + u64::from(shape.gpus) * u64::from(shape.nodes))
    }

    /// Second way: backfill on reserved nodes, if it will be out of the way in time.
    /// Returns whether it started.
    fn try_backfill(
        &mut self,
        st: &mut State,
        r: &mut Ratios,
        d: &mut Decisions,
        c: Candidate,
    ) -> bool {
        let s = c.shape;
        if s.nodes != 1 || s.gpus > self.backfill_cap {
            return false;
        }
        if let Some((holder, start, placement)) =
            backfill_placement(st, &s, c.id, c.funded, self.now, self.cfg)
        {
            let why = StartWhy::Backfill {
                reservation_of: holder,
                starts: start,
            };
            self.launch(
                st,
                r,
                d,
                (c.id, c.project, c.funded, c.allowance),
                placement,
                Some(holder),
                why,
            );
            self.backfill_cap = backfill_capacity(st, self.now);
            return true;
        }
        // Same shape and contract, same project: later ones leave no sooner, so stop
        // trying them this pass. Not where predictions decide: another user's or
        // class's run of the same shape may be predicted to leave in time.
        if !self.cfg.backfill_by_prediction {
            self.backfill_dead.insert((c.project, s));
        }
        false
    }

    /// Why `c` waits unless preemption or a reservation does better: unfunded, or no
    /// room of its shape.
    fn no_room(st: &State, c: Candidate) -> Blocked {
        let shape = c.shape;
        if !c.funded && shape.protected {
            Blocked::Unfunded
        } else if shape.nodes > 1 {
            Blocked::NoWholeNodes {
                need: shape.nodes,
                free: st.cluster.most_whole_free(),
            }
        } else {
            Blocked::NoFit {
                need: shape.gpus,
                largest_free: st.cluster.largest_free_block(),
            }
        }
    }

    /// Third way: preemption, for funded work while plans are left: revoke a plan's
    /// victims and claim their GPUs for `c`, which starts once they are gone.
    fn try_preempt(&mut self, st: &mut State, r: &mut Ratios, c: Candidate) -> Preempt {
        let (id, p, shape) = (c.id, c.project, c.shape);
        if !(c.funded && self.plans_left > 0 && !self.preempt_dead.contains(&(p, shape))) {
            if c.funded && self.plans_left == 0 {
                self.cut_short = true;
            }
            return Preempt::NotTried;
        }
        self.plans_left -= 1;
        let plan = match crate::preempt::plan(
            &mut self.whole_keys,
            st,
            self.tree,
            r,
            self.cfg,
            self.now,
            id,
            p,
            &shape,
        ) {
            Ok(plan) => plan,
            Err(why) => {
                self.preempt_dead.insert((p, shape));
                return Preempt::Refused(why);
            }
        };
        for v in &plan.victims {
            if let Some(l) = st.leases.get(&v.lease) {
                r.add(self.tree, l.project, neg(l.alloc()));
                if let (true, Some((gr, gv))) = (l.funded, self.tree.diverging(p, l.project)) {
                    st.recent.push((self.now, gr, gv));
                }
            }
            st.revoke_at(v.lease, self.now, v.why.clone());
        }
        st.add_claim(
            id,
            Claim {
                kind: ClaimKind::Preemption,
                nodes: plan.claim,
                cpu_per_node: shape.cpu,
                mem_per_node: shape.mem,
                allowance: c.allowance,
                funded: c.funded,
            },
        );
        self.charge(r, p, c.funded, &c.alloc, shape.gpus * shape.nodes);
        block(st, id, Blocked::WaitingForVictims);
        Preempt::Claimed
    }

    /// Fourth way: a reservation of whole nodes for a funded gang that cannot start,
    /// from when they come free; returns its start.
    fn try_reserve(&mut self, st: &mut State, d: &mut Decisions, c: Candidate) -> Option<Time> {
        let (id, p, shape) = (c.id, c.project, c.shape);
        // An unfunded gang (its budget is spent) may hold one reservation at a time,
        // and never the last one left, so it does not starve while funded gangs keep
        // theirs.
        let unfunded_held = st
            .claims
            .values()
            .filter(|x| matches!(x.kind, ClaimKind::Reservation { .. }) && !x.funded)
            .count();
        let room = if c.funded {
            self.reservations < self.cfg.max_reservations
        } else {
            self.cfg.unfunded_reservations
                && unfunded_held == 0
                && self.reservations + 1 < self.cfg.max_reservations
        };
        if shape.nodes <= 1 || !shape.protected || !room || self.reserve_dead.contains(&(p, shape))
        {
            return None;
        }
        let Some((nodes, start)) = crate::preempt::reserve(
            st,
            self.now,
            &shape,
            self.cfg.victim_loss(),
            self.cfg.plan_loss_budget(&shape),
            c.funded,
        ) else {
            self.reserve_dead.insert((p, shape));
            return None;
        };
        let claim_nodes: Vec<NodeGpus> = nodes
            .iter()
            .map(|&n| NodeGpus {
                node: n,
                gpus: st.cluster.node(n).all(),
            })
            .collect();
        st.add_claim(
            id,
            Claim {
                kind: ClaimKind::Reservation { start },
                nodes: claim_nodes,
                cpu_per_node: 0,
                mem_per_node: 0,
                allowance: false,
                funded: c.funded,
            },
        );
        self.reservations += 1;
        self.backfill_cap = backfill_capacity(st, self.now);
        d.actions.push(Action::Reserve {
            workload: id,
            nodes,
            start,
        });
        Some(start)
    }
}
