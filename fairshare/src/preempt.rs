//! Preemption planning and reservations.
//!
//! Victims are only leases that are preemptible now (unfunded, or past protection and
//! cooldown) and not already being revoked. Unfunded leases are free occupancy: any
//! funded requester may take them. A funded victim is taken only if the requester's
//! group, after the start, stays at least `hysteresis` below the victim's group after
//! the stop, compared where their paths in the tree diverge (Kueue's fair-sharing rule),
//! which rules out preemption cycles. Victims are chosen per node so that the freed
//! GPUs fit: unfunded first, then cheapest (GPU-seconds at risk), and the node needing
//! the fewest funded victims and the least lost work wins.

use crate::cluster::{lowest_bits, NodeId, NodeState};
use crate::config::PolicyConfig;
use crate::queue::Shape;
use crate::ratios::{Ratios, Res};
use crate::scheduler::access::View;
use crate::time::Time;
use crate::tree::{GroupId, OrgTree};
use crate::workload::{Lease, LeaseId, NodeGpus, RevokeWhy, WorkloadId};

/// Most nodes one single-node plan evaluates (fewest clearable GPUs first), so a plan
/// costs the same at 100 nodes and at 10,000.
const PLAN_SCAN_NODES: usize = 64;

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

fn res_of(l: &Lease) -> Res {
    let n = l.placement.len() as f64;
    [
        f64::from(l.gpus),
        f64::from(l.cpu_per_node) * n,
        f64::from(l.mem_per_node) * n,
    ]
}

/// Plans victims on one node for `need` GPUs (and host room), or None.
#[allow(clippy::too_many_arguments)]
fn plan_node<V: View>(
    st: &V,
    tree: &OrgTree,
    r: &Ratios,
    cfg: &PolicyConfig,
    now: Time,
    by: WorkloadId,
    p: GroupId,
    req: Res,
    node: NodeId,
    s: &Shape,
    whole: bool,
) -> Option<NodePlan> {
    let n = st.cluster().node(node);
    if n.state != NodeState::Ready || (n.healthy & n.all()).count_ones() < s.gpus {
        return None;
    }
    let mut cands: Vec<(&Lease, u64)> = Vec::new();
    for &lid in st.node_leases(node) {
        let Some(l) = st.lease(lid) else { continue };
        let on_node = l
            .placement
            .iter()
            .find(|x| x.node == node)
            .map_or(0, |x| x.gpus);
        if l.revoke.is_some() || on_node & n.soft == 0 {
            if whole {
                return None; // a gang needs every lease gone
            }
            continue;
        }
        if !whole && on_node & n.healthy == 0 {
            continue; // frees only failed GPUs
        }
        let cost = u64::from(l.gpus) * now.saturating_sub(l.start);
        cands.push((l, cost));
    }
    cands.sort_by_key(|(l, cost)| (l.funded, *cost, l.id));
    let mut have = n.free();
    let mut cpu_free = n.spec.cpu.saturating_sub(n.cpu_used + n.claimed_cpu);
    let mut mem_free = n.spec.memory_gb.saturating_sub(n.mem_used + n.claimed_mem);
    let mut removed: Vec<(GroupId, Res)> = Vec::new();
    let mut plan = NodePlan {
        node,
        funded: 0,
        cost: 0,
        victims: Vec::new(),
        have: 0,
    };
    for (l, cost) in cands {
        let done = have.count_ones() >= s.gpus && cpu_free >= s.cpu && mem_free >= s.mem;
        if done && !whole {
            break;
        }
        let why = if !l.funded {
            RevokeWhy::Preempted {
                by,
                unfunded: true,
                requester_ratio_after: None,
                victim_ratio_after: None,
            }
        } else {
            let Some((gr, gv)) = tree.diverging(p, l.project) else {
                // Same project: no funded preemption inside a project.
                if whole {
                    return None;
                }
                continue;
            };
            let prior = removed.iter().find(|x| x.0 == gv).map_or([0.0; 3], |x| x.1);
            let v = res_of(l);
            let minus = [-(prior[0] + v[0]), -(prior[1] + v[1]), -(prior[2] + v[2])];
            let req_after = r.ratio_with(gr, req);
            let victim_after = r.ratio_with(gv, minus);
            if req_after + cfg.hysteresis >= victim_after {
                if whole {
                    return None;
                }
                continue;
            }
            match removed.iter_mut().find(|x| x.0 == gv) {
                Some(x) => x.1 = [-minus[0], -minus[1], -minus[2]],
                None => removed.push((gv, v)),
            }
            plan.funded += 1;
            RevokeWhy::Preempted {
                by,
                unfunded: false,
                requester_ratio_after: Some(req_after),
                victim_ratio_after: Some(victim_after),
            }
        };
        let on_node = l
            .placement
            .iter()
            .find(|x| x.node == node)
            .map_or(0, |x| x.gpus);
        have |= on_node & n.healthy;
        cpu_free += l.cpu_per_node;
        mem_free += l.mem_per_node;
        plan.cost += cost;
        plan.victims.push(Victim { lease: l.id, why });
    }
    let fits = have.count_ones() >= s.gpus && cpu_free >= s.cpu && mem_free >= s.mem;
    plan.have = have;
    fits.then_some(plan)
}

/// Plans a preemption for workload `by` of `shape` in project `p`, or None.
#[allow(clippy::too_many_arguments)]
pub(crate) fn plan<V: View>(
    st: &V,
    tree: &OrgTree,
    r: &Ratios,
    cfg: &PolicyConfig,
    now: Time,
    by: WorkloadId,
    p: GroupId,
    s: &Shape,
) -> Option<Plan> {
    let n = f64::from(s.nodes);
    let req = [
        f64::from(s.gpus) * n,
        f64::from(s.cpu) * n,
        f64::from(s.mem) * n,
    ];
    let c = st.cluster();
    if s.nodes == 1 {
        let mut best: Option<NodePlan> = None;
        for node in c.clearable_nodes(s.gpus).take(PLAN_SCAN_NODES) {
            let Some(np) = plan_node(st, tree, r, cfg, now, by, p, req, node, s, false) else {
                continue;
            };
            if np.victims.is_empty() {
                continue; // free placement failed there for host reasons
            }
            let better = best
                .as_ref()
                .is_none_or(|b| (np.funded, np.cost, np.node) < (b.funded, b.cost, b.node));
            if better {
                best = Some(np);
            }
        }
        let b = best?;
        let free = c.node(b.node).free();
        let from_free = lowest_bits(free, s.gpus);
        let rest = s.gpus - from_free.count_ones();
        let claim = from_free | lowest_bits(b.have & !free, rest);
        return Some(Plan {
            victims: b.victims,
            claim: vec![NodeGpus {
                node: b.node,
                gpus: claim,
            }],
        });
    }
    // Gang: k nodes of one cluster that preemption can empty entirely.
    let mut best: Option<(u32, u64, Vec<NodePlan>)> = None;
    for set in c.wholly_clearable() {
        if (set.len() as u32) < s.nodes {
            continue;
        }
        let mut plans: Vec<NodePlan> = set
            .iter()
            .filter_map(|&i| plan_node(st, tree, r, cfg, now, by, p, req, NodeId(i), s, true))
            .filter(|np| c.node(np.node).spec.gpus >= s.gpus)
            .collect();
        if (plans.len() as u32) < s.nodes {
            continue;
        }
        plans.sort_by_key(|np| (np.funded, np.cost, np.node));
        plans.truncate(s.nodes as usize);
        let funded: u32 = plans.iter().map(|x| x.funded).sum();
        let cost: u64 = plans.iter().map(|x| x.cost).sum();
        if best.as_ref().is_none_or(|b| (funded, cost) < (b.0, b.1)) {
            best = Some((funded, cost, plans));
        }
    }
    let (_, _, mut plans) = best?;
    // A victim spanning several chosen nodes is listed once per node: keep one.
    let mut seen = std::collections::BTreeSet::new();
    for np in &mut plans {
        np.victims.retain(|v| seen.insert(v.lease));
    }
    // Victims were checked node by node; check the chosen set together, so that a
    // group losing leases on several nodes still ends at or above the requester.
    let mut removed: Vec<(GroupId, Res)> = Vec::new();
    for np in &plans {
        for v in &np.victims {
            let Some(l) = st.lease(v.lease) else { continue };
            if !l.funded {
                continue;
            }
            let (gr, gv) = tree.diverging(p, l.project)?;
            let x = res_of(l);
            let total = match removed.iter_mut().find(|e| e.0 == gv) {
                Some(e) => {
                    for (a, b) in e.1.iter_mut().zip(x) {
                        *a += b;
                    }
                    e.1
                }
                None => {
                    removed.push((gv, x));
                    x
                }
            };
            if r.ratio_with(gr, req) + cfg.hysteresis
                >= r.ratio_with(gv, [-total[0], -total[1], -total[2]])
            {
                return None;
            }
        }
    }
    let mut victims = Vec::new();
    let mut claim = Vec::new();
    for np in plans {
        claim.push(NodeGpus {
            node: np.node,
            gpus: c.node(np.node).all(),
        });
        victims.extend(np.victims);
    }
    Some(Plan { victims, claim })
}

/// Nodes to reserve for a gang of `shape`: per cluster the `k` nodes whose leases
/// end protection soonest; returns them and when the last one is free.
pub(crate) fn reserve<V: View>(st: &V, now: Time, s: &Shape) -> Option<(Vec<NodeId>, Time)> {
    let c = st.cluster();
    let mut per_cluster: Vec<Vec<(Time, NodeId)>> = vec![Vec::new(); c.cluster_names().len()];
    for (id, n) in c.nodes() {
        if n.state != NodeState::Ready
            || n.claimed != 0
            || n.healthy != n.all()
            || n.spec.gpus < s.gpus
            || n.spec.cpu < s.cpu
            || n.spec.memory_gb < s.mem
        {
            continue;
        }
        let mut at = now;
        for &lid in st.node_leases(id) {
            if let Some(l) = st.lease(lid) {
                if l.revoke.is_none() {
                    at = at.max(l.preemptible_at);
                }
            }
        }
        per_cluster[n.cluster as usize].push((at, id));
    }
    let mut best: Option<(Time, Vec<NodeId>)> = None;
    for mut v in per_cluster {
        if (v.len() as u32) < s.nodes {
            continue;
        }
        v.sort();
        v.truncate(s.nodes as usize);
        let start = v.last().map_or(now, |x| x.0).max(now + 1);
        if best.as_ref().is_none_or(|b| start < b.0) {
            best = Some((start, v.into_iter().map(|x| x.1).collect()));
        }
    }
    best.map(|(t, nodes)| (nodes, t))
}
