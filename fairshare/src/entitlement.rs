//! The ideal allocation: hierarchical weighted max-min fairness (water-filling) of the
//! capacity among groups that have demand, capped by their demand.
//!
//! Integrated over time this is a group's *entitled* GPU-hours, the yardstick every
//! fairness figure is measured against.

use crate::tree::{GroupId, OrgTree};

/// Splits `capacity` among the tree's groups given each project's demand (indexed by
/// `GroupId`; values on inner nodes are ignored). Returns the allocation of every
/// group, inner nodes being the sum of their children.
pub fn water_fill(tree: &OrgTree, capacity: f64, project_demand: &[f64]) -> Vec<f64> {
    let n = tree.len();
    let mut demand = vec![0.0; n];
    // Children have larger ids than parents: one backward sweep sums demand upward.
    for i in (1..n).rev() {
        let g = GroupId(i as u32);
        if tree.is_project(g) {
            demand[i] = project_demand.get(i).copied().unwrap_or(0.0).max(0.0);
        }
        if let Some(p) = tree.group(g).parent {
            demand[p.idx()] += demand[i];
        }
    }
    let mut alloc = vec![0.0; n];
    alloc[0] = capacity.min(demand[0]);
    for i in 0..n {
        let children = &tree.group(GroupId(i as u32)).children;
        if !children.is_empty() {
            split(tree, children, alloc[i], &demand, &mut alloc);
        }
    }
    alloc
}

/// Weighted max-min split of `amount` among `children`, capped by demand.
fn split(tree: &OrgTree, children: &[GroupId], amount: f64, demand: &[f64], alloc: &mut [f64]) {
    let mut active: Vec<GroupId> = children
        .iter()
        .copied()
        .filter(|c| demand[c.idx()] > 0.0)
        .collect();
    let mut remaining = amount;
    loop {
        let total_w: f64 = active.iter().map(|c| tree.group(*c).weight).sum();
        if active.is_empty() || total_w <= 0.0 {
            return;
        }
        let before = active.len();
        active.retain(|c| {
            let fair = remaining * tree.group(*c).weight / total_w;
            if demand[c.idx()] <= fair {
                alloc[c.idx()] = demand[c.idx()];
                false
            } else {
                true
            }
        });
        if active.len() == before {
            for c in &active {
                alloc[c.idx()] = remaining * tree.group(*c).weight / total_w;
            }
            return;
        }
        let capped: f64 = children
            .iter()
            .filter(|c| !active.contains(c))
            .map(|c| alloc[c.idx()])
            .sum();
        remaining = (amount - capped).max(0.0);
    }
}
