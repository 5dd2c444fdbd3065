//! Where a shape fits: on free GPUs, or as backfill on reserved nodes.

use super::*;

/// Where `shape` fits on free GPUs: best fit for one node, whole nodes for a gang.
pub(super) fn free_placement(c: &Cluster, s: &Shape) -> Option<Vec<NodeGpus>> {
    if s.nodes == 1 {
        if s.gpus > c.largest_free_block() {
            return None;
        }
        let n = c.best_fit(s.gpus, s.cpu, s.mem, &s.sel)?;
        Some(vec![NodeGpus {
            node: n,
            gpus: lowest_bits(c.node(n).free(), s.gpus),
        }])
    } else {
        let nodes = c.whole_nodes(s.nodes, s.gpus, s.cpu, s.mem, &s.sel)?;
        Some(
            nodes
                .into_iter()
                .map(|n| NodeGpus {
                    node: n,
                    gpus: lowest_bits(c.node(n).free(), s.gpus),
                })
                .collect(),
        )
    }
}

/// The most GPUs free on one reserved node whose reservation has not started.
pub(super) fn backfill_capacity(st: &State, now: Time) -> u32 {
    st.claims
        .values()
        .filter(|c| matches!(c.kind, ClaimKind::Reservation { start } if start > now))
        .flat_map(|c| c.nodes.iter())
        .map(|p| {
            let n = st.cluster.node(p.node);
            if n.state == NodeState::Ready {
                (n.healthy & !n.used).count_ones()
            } else {
                0
            }
        })
        .max()
        .unwrap_or(0)
}

/// A reserved node that `id` can use and leave (finish or become preemptible)
/// before the reservation starts; best fit among them.
pub(super) fn backfill_placement(
    st: &State,
    s: &Shape,
    id: WorkloadId,
    funded: bool,
    now: Time,
    cfg: &PolicyConfig,
) -> Option<(WorkloadId, Time, Vec<NodeGpus>)> {
    let w = st.workloads.get(&id)?;
    let hold = protection(w, funded, cfg.cooldown);
    let may_resume = w.spec.resumable || cfg.rules_of_0_4;
    // Looked up only where the key asks for it: backfill is tried on every pass.
    let predicted = cfg
        .backfill_by_prediction
        .then(|| {
            st.run_lengths
                .predict(&w.spec.user, &w.spec.class, w.spec.time_limit, 0)
        })
        .flatten();
    let mut best: Option<(u32, WorkloadId, Time, NodeId)> = None;
    for (holder, c) in &st.claims {
        let ClaimKind::Reservation { start } = c.kind else {
            continue;
        };
        let ends_in_time = w
            .spec
            .time_limit
            .is_some_and(|tl| now.saturating_add(tl) <= start);
        // Work that cannot resume would lose its whole run when the reservation takes
        // the node back: it must end before, not merely become preemptible. Work that
        // can resume is not started either where its run is predicted to outlast the
        // reservation (`runlength.rs`): the reservation would take back what it did
        // since its last checkpoint. Unknown length keeps the rule of protection.
        let outlasts = predicted.is_some_and(|p| now.saturating_add(p) > start);
        let leaves_in_time =
            ends_in_time || (may_resume && now.saturating_add(hold) <= start && !outlasts);
        if start <= now || !leaves_in_time {
            continue;
        }
        for p in &c.nodes {
            let n = st.cluster.node(p.node);
            let avail = if n.state == NodeState::Ready {
                (n.healthy & !n.used).count_ones()
            } else {
                0
            };
            if avail >= s.gpus
                && n.takes(s.gpus, s.cpu, s.mem)
                && st.cluster.admits(p.node, &s.sel)
                && best.is_none_or(|b| avail < b.0)
            {
                best = Some((avail, *holder, start, p.node));
            }
        }
    }
    let (_, holder, start, node) = best?;
    let n = st.cluster.node(node);
    Some((
        holder,
        start,
        vec![NodeGpus {
            node,
            gpus: lowest_bits(n.healthy & !n.used, s.gpus),
        }],
    ))
}
