//! Preemption planning and reservations.
//!
//! Victims are only leases that are preemptible now (unfunded, or past protection and
//! cooldown) and not already being revoked. Unfunded leases are free occupancy: any
//! funded requester may take them. A funded victim is taken only if the requester's
//! group, after the start, stays at least `hysteresis` below the victim's group after
//! the stop, compared where their paths in the tree diverge (Kueue's fair-sharing rule),
//! which rules out preemption cycles. Victims are chosen per node so that the freed
//! GPUs fit: unfunded first, then cheapest (GPU-seconds at risk), and the node needing
//! the fewest funded victims and the least lost work wins. No plan, and no reservation,
//! loses more than `max_loss_per_gpu` for each GPU its requester asks.

use crate::cluster::{lowest_bits, NodeId, NodeState};
use crate::config::PolicyConfig;
use crate::queue::Shape;
use crate::ratios::{Ratios, Res};
use crate::time::{Secs, Time};
use crate::tree::{GroupId, OrgTree};
use crate::workload::Blocked;
use crate::workload::{Lease, LeaseId, NodeGpus, RevokeWhy, WorkloadId};

/// What the planner reads of the scheduler's state (which implements it), without
/// the state type.
pub(crate) trait View {
    fn cluster(&self) -> &crate::cluster::Cluster;
    fn lease(&self, id: LeaseId) -> Option<&Lease>;
    fn node_leases(&self, n: NodeId) -> &[NodeLease];
    fn revoking(&self, id: LeaseId) -> bool;
    fn recent_preemptions(&self) -> &[(Time, GroupId, GroupId)];
}

/// A lease as the per-node index keeps it: what a preemption plan reads to rule a
/// node out before it looks the lease up (none of it changes while the lease runs).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct NodeLease {
    /// The lease.
    pub id: LeaseId,
    /// Its project.
    pub project: GroupId,
    /// Whether it runs funded.
    pub funded: bool,
    /// The GPUs it holds on this node.
    pub gpus: u64,
    /// The GPUs it holds in all.
    pub lease_gpus: u32,
    /// Its start.
    pub start: Time,
    /// When it may be preempted (`Lease::preemptible_at`).
    pub preemptible_at: Time,
    /// When its time limit ends it, if it has one.
    pub ends_by: Option<Time>,
    /// Whether its work resumes from a checkpoint.
    pub resumable: bool,
}

impl NodeLease {
    /// `lease`'s entry on a node where it holds `gpus`.
    pub(crate) fn of(lease: &Lease, gpus: u64) -> Self {
        NodeLease {
            id: lease.id,
            project: lease.project,
            funded: lease.funded,
            gpus,
            lease_gpus: lease.gpus,
            start: lease.start,
            preemptible_at: lease.preemptible_at,
            ends_by: lease.ends_by,
            resumable: lease.resumable,
        }
    }

    /// As [`Lease::loss_at`].
    pub fn loss_at(&self, now: Time, checkpoint_loss: Option<crate::time::Secs>) -> u64 {
        crate::workload::work_lost(
            self.lease_gpus,
            self.start,
            self.resumable,
            now,
            checkpoint_loss,
        )
    }
}

/// Most nodes one single-node plan evaluates (fewest clearable GPUs first), so a plan
/// costs the same at 100 nodes and at 10,000.
const PLAN_SCAN_NODES: usize = 64;

/// What gang plans learnt about emptying each node: the funded leases on it and the
/// work they would lose, or `None` when some lease there may not be taken (protected,
/// or already being revoked); kept with the node's stamp, so it holds until the node
/// changes (the core keeps it from pass to pass). A gang plan reads the leases only of
/// nodes that changed since, so its cost follows the churn, not the cluster's size.
#[derive(Debug, Clone, Default)]
pub(crate) struct WholeKeys {
    /// Per node: its stamp when read, and what was read.
    keys: Vec<Option<(u64, WholeKey)>>,
}

/// Funded leases on a node, and the sums that give the work they would lose at any
/// `now` no earlier than the latest start: GPUs and GPUs × start of the leases that
/// cannot resume, the latest start, and the fixed loss of those that can.
type WholeKey = Option<(u32, u64, u128, Time, u64)>;

impl WholeKeys {
    /// Funded victims and their cost if `node` is emptied at `now`, or `None`.
    fn get<V: View>(
        &mut self,
        st: &V,
        node: NodeId,
        now: Time,
        loss: Option<Secs>,
    ) -> Option<(u32, u64)> {
        let c = st.cluster();
        if self.keys.len() < c.len() {
            self.keys.resize(c.len(), None);
        }
        let stamp = c.stamp(node);
        let key = match self.keys[node.idx()] {
            Some((at, key)) if at == stamp => key,
            _ => {
                let key = Self::read(st, node, loss);
                self.keys[node.idx()] = Some((stamp, key));
                key
            }
        };
        let (funded, gpus, gpu_starts, latest, fixed) = key?;
        if latest > now {
            // Not seen in practice (leases start at the core's clock); read afresh.
            return Self::read_at(st, node, now, loss);
        }
        Some((
            funded,
            (u128::from(now) * u128::from(gpus) - gpu_starts) as u64 + fixed,
        ))
    }

    fn read<V: View>(st: &V, node: NodeId, loss: Option<Secs>) -> WholeKey {
        let soft = st.cluster().node(node).soft;
        let (mut funded, mut gpus, mut gpu_starts, mut latest, mut fixed) =
            (0u32, 0u64, 0u128, 0, 0u64);
        for l in st.node_leases(node) {
            if st.revoking(l.id) || l.gpus & soft == 0 {
                return None;
            }
            funded += u32::from(l.funded);
            latest = latest.max(l.start);
            if l.resumable && loss.is_some() {
                fixed += l.loss_at(l.start, loss);
            } else {
                gpus += u64::from(l.lease_gpus);
                gpu_starts += u128::from(l.lease_gpus) * u128::from(l.start);
            }
        }
        Some((funded, gpus, gpu_starts, latest, fixed))
    }

    fn read_at<V: View>(st: &V, node: NodeId, now: Time, loss: Option<Secs>) -> Option<(u32, u64)> {
        let soft = st.cluster().node(node).soft;
        let (mut funded, mut cost) = (0u32, 0u64);
        for l in st.node_leases(node) {
            if st.revoking(l.id) || l.gpus & soft == 0 {
                return None;
            }
            funded += u32::from(l.funded);
            cost += l.loss_at(now, loss);
        }
        Some((funded, cost))
    }
}

/// One lease to revoke, and why.
pub(crate) struct Victim {
    pub lease: LeaseId,
    pub why: RevokeWhy,
}

/// Victims and the GPUs the requester claims.
pub(crate) struct Plan {
    pub victims: Vec<Victim>,
    pub claim: Vec<NodeGpus>,
}

struct NodePlan {
    node: NodeId,
    funded: u32,
    cost: u64,
    victims: Vec<Victim>,
    have: u64,
}

/// Allocation taken from each victim group so far in one plan.
#[derive(Default)]
struct Removed(Vec<(GroupId, Res)>);

impl Removed {
    fn with(&self, g: GroupId, x: Res) -> Res {
        let prior = self.0.iter().find(|e| e.0 == g).map_or([0.0; 3], |e| e.1);
        [prior[0] + x[0], prior[1] + x[1], prior[2] + x[2]]
    }

    fn add(&mut self, g: GroupId, x: Res) {
        let total = self.with(g, x);
        match self.0.iter_mut().find(|e| e.0 == g) {
            Some(e) => e.1 = total,
            None => self.0.push((g, total)),
        }
    }
}

/// One requester's planning context.
struct Planner<'a, V> {
    st: &'a V,
    tree: &'a OrgTree,
    r: &'a Ratios,
    hysteresis: f64,
    loss: Option<Secs>,
    /// Most work the plan may lose (GPU-seconds).
    budget: u64,
    /// The least a plan refused for `budget` would have lost.
    over_budget: std::cell::Cell<Option<u64>>,
    now: Time,
    by: WorkloadId,
    p: GroupId,
    s: &'a Shape,
    req: Res,
    /// Per group: 0 not yet known, 1 no lease of it may be taken, 2 some may.
    takeable: Vec<std::cell::Cell<u8>>,
}

impl<V: View> Planner<'_, V> {
    /// Kueue's rule for a funded victim, given what the plan already takes from its
    /// group: the ratios after, or None when the requester would not stay strictly
    /// `hysteresis` below the victim's group (or both are in one project), or when the
    /// victim's group took from the requester's, directly or round a longer loop,
    /// within the cooldown: later starts in a pass can move ratios past each other, and
    /// that must not turn into ping-pong.
    fn fair(&self, l: &Lease, removed: &Removed) -> Option<(GroupId, f64, f64)> {
        let (gr, gv) = self.tree.diverging(self.p, l.project)?;
        if reaches(self.st.recent_preemptions(), gv, gr) {
            return None;
        }
        let total = removed.with(gv, l.alloc());
        let req_after = self.r.ratio_with(gr, self.req);
        let victim_after = self.r.ratio_with(gv, crate::ratios::neg(total));
        (req_after + self.hysteresis < victim_after).then_some((gv, req_after, victim_after))
    }

    /// Whether [`Self::fair`] could take some lease of `project` (with nothing taken
    /// yet: taking more only lowers the victim's ratio after), known per group once a
    /// plan.
    fn may_take(&self, project: GroupId) -> bool {
        let cell = &self.takeable[project.idx()];
        if cell.get() == 0 {
            let may = self
                .tree
                .diverging(self.p, project)
                .is_some_and(|(gr, gv)| {
                    !reaches(self.st.recent_preemptions(), gv, gr)
                        && self.r.ratio_with(gr, self.req) + self.hysteresis < self.r.ratio(gv)
                });
            cell.set(if may { 2 } else { 1 });
        }
        cell.get() == 2
    }

    /// Whether `node` could give the request room at all, from the node index alone:
    /// its free GPUs and those of leases that may be taken. Rules most nodes out
    /// without looking a lease up; never rules out one that [`Self::node`] would plan.
    fn could_clear(&self, node: NodeId, whole: bool) -> bool {
        let n = self.st.cluster().node(node);
        let mut reach = n.free();
        for e in self.st.node_leases(node) {
            let takeable = e.gpus & n.soft != 0 && (!e.funded || self.may_take(e.project));
            if takeable {
                reach |= e.gpus & n.healthy;
            } else if whole {
                return false;
            }
        }
        reach.count_ones() >= self.s.gpus
    }

    /// Victims on one node that make room for one node's share of the request; with
    /// `whole`, every lease on the node must go.
    fn node(&self, node: NodeId, whole: bool) -> Option<NodePlan> {
        let s = self.s;
        let n = self.st.cluster().node(node);
        // A node that refused this size is not planned for either (no hot loop of
        // zero-victim plans).
        if n.state != NodeState::Ready
            || (n.healthy & n.all()).count_ones() < s.gpus
            || !n.offers(s.gpus)
            || !self.st.cluster().admits(node, &s.sel)
            || !self.could_clear(node, whole)
        {
            return None;
        }
        let mut cands: Vec<(&Lease, u64, u64)> = Vec::new();
        for e in self.st.node_leases(node) {
            let Some(l) = self.st.lease(e.id) else {
                continue;
            };
            let on_node = e.gpus;
            if l.revoke.is_some() || on_node & n.soft == 0 {
                if whole {
                    return None; // a gang needs every lease gone
                }
                continue;
            }
            if !whole && on_node & n.healthy == 0 {
                continue; // frees only failed GPUs
            }
            cands.push((l, l.loss_at(self.now, self.loss), on_node));
        }
        // Free occupancy first, then the least work lost, then the youngest.
        cands.sort_by_key(|(l, cost, _)| (l.funded, *cost, std::cmp::Reverse(l.start), l.id));
        let mut have = n.free();
        let mut cpu_free = n.spec.cpu.saturating_sub(n.cpu_used + n.claimed_cpu);
        let mut mem_free = n.spec.memory_gb.saturating_sub(n.mem_used + n.claimed_mem);
        let mut removed = Removed::default();
        let mut plan = NodePlan {
            node,
            funded: 0,
            cost: 0,
            victims: Vec::new(),
            have: 0,
        };
        for (l, cost, on_node) in cands {
            let done = have.count_ones() >= s.gpus && cpu_free >= s.cpu && mem_free >= s.mem;
            if done && !whole {
                break;
            }
            let (requester_ratio_after, victim_ratio_after) = if l.funded {
                let Some((gv, req_after, victim_after)) = self.fair(l, &removed) else {
                    if whole {
                        return None;
                    }
                    continue;
                };
                removed.add(gv, l.alloc());
                plan.funded += 1;
                (Some(req_after), Some(victim_after))
            } else {
                (None, None)
            };
            have |= on_node & n.healthy;
            cpu_free += l.cpu_per_node;
            mem_free += l.mem_per_node;
            plan.cost += cost;
            plan.victims.push(Victim {
                lease: l.id,
                why: RevokeWhy::Preempted {
                    by: self.by,
                    unfunded: !l.funded,
                    requester_ratio_after,
                    victim_ratio_after,
                },
            });
        }
        let fits = have.count_ones() >= s.gpus && cpu_free >= s.cpu && mem_free >= s.mem;
        plan.have = have;
        fits.then_some(plan)
    }

    /// Whether a plan losing `cost` may be made; remembers the least refused.
    fn within_budget(&self, cost: u64) -> bool {
        if cost <= self.budget {
            return true;
        }
        let least = self.over_budget.get().map_or(cost, |c| c.min(cost));
        self.over_budget.set(Some(least));
        false
    }

    /// Single-node work: the best node among the first few that preemption can clear.
    fn single(&self) -> Option<Plan> {
        let (s, c) = (self.s, self.st.cluster());
        let b = c
            .clearable_nodes(s.gpus)
            .filter(|&node| c.admits(node, &s.sel))
            .take(PLAN_SCAN_NODES)
            .filter_map(|node| self.node(node, false))
            // No victims means free placement failed there for host reasons.
            .filter(|np| !np.victims.is_empty() && self.within_budget(np.cost))
            .min_by_key(|np| (np.funded, np.cost, np.node))?;
        let free = c.node(b.node).free();
        let from_free = lowest_bits(free, s.gpus);
        let rest = s.gpus - from_free.count_ones();
        Some(Plan {
            claim: vec![NodeGpus {
                node: b.node,
                gpus: from_free | lowest_bits(b.have & !free, rest),
            }],
            victims: b.victims,
        })
    }

    /// Gangs: the `k` cheapest nodes of one cluster that preemption can empty.
    ///
    /// A whole-node plan's (funded victims, cost) is known from the node's leases
    /// alone (`WholeKeys`), so nodes are planned in that order and only until `k`
    /// plans hold: the same `k` nodes a plan of every node then sorted would pick.
    fn gang(&self, keys: &mut WholeKeys) -> Option<Plan> {
        let (s, c) = (self.s, self.st.cluster());
        let mut best: Option<(u32, u64, Vec<NodePlan>)> = None;
        for set in c.wholly_clearable() {
            if (set.len() as u32) < s.nodes {
                continue;
            }
            let mut order: Vec<(u32, u64, NodeId)> = set
                .iter()
                .map(|&i| NodeId(i))
                .filter(|&id| {
                    // What `node` refuses whatever the leases, and too small nodes.
                    let n = c.node(id);
                    n.state == NodeState::Ready
                        && (n.healthy & n.all()).count_ones() >= s.gpus
                        && n.offers(s.gpus)
                        && c.admits(id, &s.sel)
                        && n.spec.gpus >= s.gpus
                })
                .filter_map(|id| {
                    keys.get(self.st, id, self.now, self.loss)
                        .map(|(funded, cost)| (funded, cost, id))
                })
                .collect();
            let k = s.nodes as usize;
            if order.len() < k {
                continue;
            }
            // The k cheapest first (keys are unique by node): the rest is sorted only
            // if some of them cannot be planned after all.
            order.select_nth_unstable(k - 1);
            order[..k].sort_unstable();
            let mut plans: Vec<NodePlan> = Vec::with_capacity(k);
            for i in 0..order.len() {
                if i == k {
                    order[k..].sort_unstable();
                }
                let (funded, cost, id) = order[i];
                let Some(np) = self.node(id, true) else {
                    continue;
                };
                debug_assert_eq!((np.funded, np.cost), (funded, cost));
                plans.push(np);
                if plans.len() == s.nodes as usize {
                    break;
                }
            }
            if (plans.len() as u32) < s.nodes {
                continue;
            }
            let funded: u32 = plans.iter().map(|x| x.funded).sum();
            let cost: u64 = plans.iter().map(|x| x.cost).sum();
            if !self.within_budget(cost) {
                continue;
            }
            if best.as_ref().is_none_or(|b| (funded, cost) < (b.0, b.1)) {
                best = Some((funded, cost, plans));
            }
        }
        let (_, _, plans) = best?;
        // A victim spanning several chosen nodes is listed once per node: keep one.
        // Victims were checked node by node; check the chosen set together, so that a
        // group losing leases on several nodes still ends above the requester.
        let mut seen = std::collections::BTreeSet::new();
        let mut removed = Removed::default();
        let mut victims = Vec::new();
        let mut claim = Vec::new();
        for np in plans {
            claim.push(NodeGpus {
                node: np.node,
                gpus: c.node(np.node).all(),
            });
            for v in np.victims {
                if !seen.insert(v.lease) {
                    continue;
                }
                if let Some(l) = self.st.lease(v.lease).filter(|l| l.funded) {
                    let (gv, _, _) = self.fair(l, &removed)?;
                    removed.add(gv, l.alloc());
                }
                victims.push(v);
            }
        }
        Some(Plan { victims, claim })
    }
}

/// True if recent preemption edges lead from `from` to `to`.
fn reaches(edges: &[(Time, GroupId, GroupId)], from: GroupId, to: GroupId) -> bool {
    let mut seen = vec![from];
    let mut stack = vec![from];
    while let Some(g) = stack.pop() {
        if g == to {
            return true;
        }
        for &(_, a, b) in edges {
            if a == g && !seen.contains(&b) {
                seen.push(b);
                stack.push(b);
            }
        }
    }
    false
}

/// Plans a preemption for workload `by` of `shape` in project `p`, or says why none
/// (`NothingPreemptible`, or `PreemptionTooDear` when only plans over the loss bound
/// were found); `keys` is the pass's knowledge of whole nodes (see [`WholeKeys`]).
#[allow(clippy::too_many_arguments)]
pub(crate) fn plan<V: View>(
    keys: &mut WholeKeys,
    st: &V,
    tree: &OrgTree,
    r: &Ratios,
    cfg: &PolicyConfig,
    now: Time,
    by: WorkloadId,
    p: GroupId,
    s: &Shape,
) -> Result<Plan, Blocked> {
    let n = f64::from(s.nodes);
    let planner = Planner {
        st,
        tree,
        r,
        hysteresis: cfg.hysteresis,
        loss: cfg.victim_loss(),
        budget: cfg.plan_loss_budget(s),
        over_budget: std::cell::Cell::new(None),
        now,
        by,
        p,
        s,
        req: [
            f64::from(s.gpus) * n,
            f64::from(s.cpu) * n,
            f64::from(s.mem) * n,
        ],
        takeable: vec![std::cell::Cell::new(0); tree.len()],
    };
    let plan = if s.nodes == 1 {
        planner.single()
    } else {
        planner.gang(keys)
    };
    plan.ok_or(match planner.over_budget.get() {
        Some(least) => Blocked::PreemptionTooDear {
            lost_gpu_s: least,
            most_gpu_s: planner.budget,
        },
        None => Blocked::NothingPreemptible,
    })
}

/// A node a reservation could take: the work it would lose, when it is free, which.
type Reservable = (u64, Time, NodeId);

/// Nodes to reserve for a gang of `shape`, and when the last one is free: per
/// cluster the `k` nodes that make the gang's cost least, where the cost of a set is
/// the gang's GPUs idle-waiting until the set's latest protection lapse plus the work
/// its leases would lose when the reservation takes the nodes back (a lease whose
/// time limit ends first loses nothing; resumable work loses `loss`). So a
/// node running hours of work that cannot resume is reserved only when waiting for
/// others would cost more. For an unfunded gang (`funded` false) a funded lease is
/// never taken: its node is free when its time limit ends it, and a node with a
/// funded lease without one is not reserved. No set losing more than `budget` is
/// reserved (`PolicyConfig::plan_loss_budget`, as for preemption).
pub(crate) fn reserve<V: View>(
    st: &V,
    now: Time,
    s: &Shape,
    loss: Option<Secs>,
    budget: u64,
    funded: bool,
) -> Option<(Vec<NodeId>, Time)> {
    let c = st.cluster();
    let mut per_cluster: Vec<Vec<(Time, u64, NodeId)>> = vec![Vec::new(); c.cluster_names().len()];
    for (id, n) in c.nodes() {
        if n.state != NodeState::Ready
            || n.claimed != 0
            || n.healthy != n.all()
            || n.spec.gpus < s.gpus
            || n.spec.cpu < s.cpu
            || n.spec.memory_gb < s.mem
            || !n.offers(s.gpus)
            || !c.admits(id, &s.sel)
        {
            continue;
        }
        let leases = || st.node_leases(id).iter().filter(|e| !st.revoking(e.id));
        let free_at = |l: &NodeLease| {
            if funded || !l.funded {
                Some(l.preemptible_at)
            } else {
                l.ends_by
            }
        };
        let Some(at) = leases().try_fold(now, |at, l| free_at(l).map(|t| at.max(t))) else {
            continue;
        };
        // Under the rules of 0.4 (no `loss`) the earliest lapse alone decides.
        let lost: u64 = leases()
            .filter(|l| loss.is_some() && l.ends_by.is_none_or(|end| end > at))
            .map(|l| l.loss_at(at, loss))
            .sum();
        per_cluster[n.cluster as usize].push((at, lost, id));
    }
    let k = s.nodes as usize;
    let gang_gpus = u128::from(s.gpus) * k as u128;
    let mut best: Option<(u128, Time, Vec<NodeId>)> = None;
    for mut v in per_cluster {
        if v.len() < k {
            continue;
        }
        // Sweep the start time over the nodes' lapses; keep the k least losses among
        // the nodes free by then (a max-heap of k).
        // Node ids are unique, so the unstable sort gives the same order, faster.
        v.sort_unstable();
        let mut heap: std::collections::BinaryHeap<Reservable> =
            std::collections::BinaryHeap::new();
        let mut sum: u128 = 0;
        let mut here: Option<(u128, Time, Vec<Reservable>)> = None;
        for &(at, lost, id) in &v {
            heap.push((lost, at, id));
            sum += u128::from(lost);
            if heap.len() > k {
                if let Some((l, _, _)) = heap.pop() {
                    sum -= u128::from(l);
                }
            }
            if heap.len() == k && sum <= u128::from(budget) {
                let start = at.max(now + 1);
                let cost = gang_gpus * u128::from(start - now) + sum;
                if here.as_ref().is_none_or(|h| cost < h.0) {
                    here = Some((cost, start, heap.iter().copied().collect()));
                }
            }
        }
        let Some((cost, _, chosen)) = here else {
            continue;
        };
        // The set's start is the latest lapse among the nodes chosen.
        let start = chosen.iter().map(|x| x.1).max().unwrap_or(now).max(now + 1);
        if best.as_ref().is_none_or(|b| (cost, start) < (b.0, b.1)) {
            let mut nodes: Vec<NodeId> = chosen.into_iter().map(|x| x.2).collect();
            nodes.sort();
            best = Some((cost, start, nodes));
        }
    }
    best.map(|(_, t, nodes)| (nodes, t))
}
