//! The org tree: org → team → project …, each node a weighted share of its parent.
//!
//! Weights are normalised among siblings, so a node's *share* of the whole is the
//! product of its normalised weights down from the root. Leaves are projects; only
//! projects are charged for work.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Index of a node in the org tree. The root is always `GroupId(0)`.
/// The smallest weight a group may have.
pub const MIN_WEIGHT: f64 = 1e-6;
/// The largest weight a group may have. With [`MIN_WEIGHT`], shares stay within 12
/// orders of magnitude of each other, so products down the tree and served ratios
/// never underflow to 0 or overflow to infinity (a weight of 1e308 beside 5e-324 made
/// every share 0 and every ratio NaN).
pub const MAX_WEIGHT: f64 = 1e6;

/// True for a weight a group may have: finite, from [`MIN_WEIGHT`] to [`MAX_WEIGHT`].
pub fn weight_ok(w: f64) -> bool {
    (MIN_WEIGHT..=MAX_WEIGHT).contains(&w)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct GroupId(pub u32);

impl GroupId {
    /// The implicit root of every tree.
    pub const ROOT: GroupId = GroupId(0);
    /// The index as usize, for vectors keyed by group.
    pub fn idx(self) -> usize {
        self.0 as usize
    }
}

/// One node of the tree as configured.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GroupSpec {
    /// Unique name across the whole tree (teams and projects alike).
    pub name: String,
    /// Parent's name; `None` for a child of the root.
    #[serde(default)]
    pub parent: Option<String>,
    /// Weight among siblings; any positive number.
    pub weight: f64,
}

/// A node of the built tree.
#[derive(Debug, Clone)]
pub struct Group {
    /// Unique name.
    pub name: String,
    /// Parent (`None` for the root).
    pub parent: Option<GroupId>,
    /// Configured weight among siblings.
    pub weight: f64,
    /// Children in configuration order.
    pub children: Vec<GroupId>,
    /// Share of the whole cluster: the product of normalised weights from the root.
    pub share: f64,
    /// Path from the root's child down to this node (empty for the root).
    pub path: Vec<GroupId>,
}

/// Why a tree could not be built.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum TreeError {
    /// Two nodes share a name.
    #[error("org tree: group {0:?} is defined twice; names must be unique across the tree")]
    Duplicate(String),
    /// A node names a parent that does not exist (or comes later in the list).
    #[error("org tree: group {name:?} names parent {parent:?}, which is not defined before it")]
    UnknownParent {
        /// The child.
        name: String,
        /// The parent it named.
        parent: String,
    },
    /// A weight outside [`MIN_WEIGHT`, `MAX_WEIGHT`].
    #[error("org tree: group {name:?} has weight {weight}; weights are numbers from 1e-6 to 1e6")]
    BadWeight {
        /// The group.
        name: String,
        /// Its weight.
        weight: f64,
    },
    /// A name that is empty or reserved.
    #[error("org tree: group name {0:?} is empty or reserved (\"root\")")]
    BadName(String),
    /// No groups at all.
    #[error("org tree: no groups defined; add at least one team")]
    Empty,
}

/// The built org tree: immutable shape, shares precomputed.
#[derive(Debug, Clone)]
pub struct OrgTree {
    groups: Vec<Group>,
    by_name: BTreeMap<String, GroupId>,
    projects: Vec<GroupId>,
}

impl OrgTree {
    /// Builds a tree from specs listed parents-first.
    pub fn new(specs: &[GroupSpec]) -> Result<Self, TreeError> {
        if specs.is_empty() {
            return Err(TreeError::Empty);
        }
        let mut groups = vec![Group {
            name: "root".into(),
            parent: None,
            weight: 1.0,
            children: Vec::new(),
            share: 1.0,
            path: Vec::new(),
        }];
        let mut by_name = BTreeMap::new();
        for s in specs {
            if s.name.is_empty() || s.name == "root" {
                return Err(TreeError::BadName(s.name.clone()));
            }
            if !weight_ok(s.weight) {
                return Err(TreeError::BadWeight {
                    name: s.name.clone(),
                    weight: s.weight,
                });
            }
            if by_name.contains_key(&s.name) {
                return Err(TreeError::Duplicate(s.name.clone()));
            }
            let parent = match &s.parent {
                None => GroupId::ROOT,
                Some(p) => *by_name.get(p).ok_or_else(|| TreeError::UnknownParent {
                    name: s.name.clone(),
                    parent: p.clone(),
                })?,
            };
            let id = GroupId(groups.len() as u32);
            let mut path = groups[parent.idx()].path.clone();
            path.push(id);
            groups[parent.idx()].children.push(id);
            groups.push(Group {
                name: s.name.clone(),
                parent: Some(parent),
                weight: s.weight,
                children: Vec::new(),
                share: 0.0,
                path,
            });
            by_name.insert(s.name.clone(), id);
        }
        fill_shares(&mut groups);
        let projects = (1..groups.len())
            .filter(|&i| groups[i].children.is_empty())
            .map(|i| GroupId(i as u32))
            .collect();
        Ok(OrgTree {
            groups,
            by_name,
            projects,
        })
    }

    /// Changes one group's weight (a manager's act); every share is recomputed.
    pub fn set_weight(&mut self, g: GroupId, weight: f64) -> Result<(), TreeError> {
        let name = self.groups[g.idx()].name.clone();
        if g == GroupId::ROOT || !weight_ok(weight) {
            return Err(TreeError::BadWeight { name, weight });
        }
        self.groups[g.idx()].weight = weight;
        fill_shares(&mut self.groups);
        Ok(())
    }

    /// Number of nodes, the root included.
    pub fn len(&self) -> usize {
        self.groups.len()
    }

    /// Always false: a tree has at least the root.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// A node by id.
    pub fn group(&self, g: GroupId) -> &Group {
        &self.groups[g.idx()]
    }

    /// All nodes, root first, parents before children.
    pub fn groups(&self) -> impl Iterator<Item = (GroupId, &Group)> {
        self.groups
            .iter()
            .enumerate()
            .map(|(i, g)| (GroupId(i as u32), g))
    }

    /// Looks a node up by name.
    pub fn find(&self, name: &str) -> Option<GroupId> {
        self.by_name.get(name).copied()
    }

    /// The leaves, which are the projects work is charged to.
    pub fn projects(&self) -> &[GroupId] {
        &self.projects
    }

    /// True if `g` is a leaf.
    pub fn is_project(&self, g: GroupId) -> bool {
        g != GroupId::ROOT && self.groups[g.idx()].children.is_empty()
    }

    /// The children of the root (the teams).
    pub fn teams(&self) -> &[GroupId] {
        &self.groups[0].children
    }

    /// The top-level ancestor (team) of `g`.
    pub fn team_of(&self, g: GroupId) -> GroupId {
        self.groups[g.idx()]
            .path
            .first()
            .copied()
            .unwrap_or(GroupId::ROOT)
    }

    /// The two siblings under the lowest common ancestor of `a` and `b` that contain
    /// them, or `None` when one contains the other (same project, or ancestor).
    pub fn diverging(&self, a: GroupId, b: GroupId) -> Option<(GroupId, GroupId)> {
        let pa = &self.groups[a.idx()].path;
        let pb = &self.groups[b.idx()].path;
        pa.iter()
            .zip(pb.iter())
            .find(|(x, y)| x != y)
            .map(|(x, y)| (*x, *y))
    }
}

/// Parents come first, so one forward sweep fills every share from the weights.
fn fill_shares(groups: &mut [Group]) {
    for i in 0..groups.len() {
        let total: f64 = groups[i]
            .children
            .iter()
            .map(|c| groups[c.idx()].weight)
            .sum();
        let share = groups[i].share;
        for c in groups[i].children.clone() {
            groups[c.idx()].share = share * groups[c.idx()].weight / total;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(name: &str, parent: Option<&str>, weight: f64) -> GroupSpec {
        GroupSpec {
            name: name.into(),
            parent: parent.map(Into::into),
            weight,
        }
    }

    #[test]
    fn shares_are_products_of_normalised_weights() {
        let t = OrgTree::new(&[
            spec("a", None, 3.0),
            spec("b", None, 1.0),
            spec("a1", Some("a"), 1.0),
            spec("a2", Some("a"), 2.0),
        ])
        .expect("valid tree");
        let share = |n: &str| t.group(t.find(n).expect("exists")).share;
        assert!((share("a") - 0.75).abs() < 1e-12);
        assert!((share("b") - 0.25).abs() < 1e-12);
        assert!((share("a1") - 0.25).abs() < 1e-12);
        assert!((share("a2") - 0.5).abs() < 1e-12);
        let names: Vec<_> = t
            .projects()
            .iter()
            .map(|&p| t.group(p).name.as_str())
            .collect();
        assert_eq!(names, ["b", "a1", "a2"]);
        let a1 = t.find("a1").expect("a1");
        let a2 = t.find("a2").expect("a2");
        let b = t.find("b").expect("b");
        assert_eq!(t.diverging(a1, a2), Some((a1, a2)));
        assert_eq!(t.diverging(a1, b), Some((t.find("a").expect("a"), b)));
        assert_eq!(t.diverging(a1, a1), None);
    }

    #[test]
    fn rejects_bad_specs_with_the_name() {
        let e = OrgTree::new(&[spec("a", Some("nope"), 1.0)]).unwrap_err();
        assert!(e.to_string().contains("\"nope\""), "{e}");
        for w in [0.0, -1.0, f64::NAN, f64::INFINITY, 1e308, 5e-324, 2e6, 1e-7] {
            let e = OrgTree::new(&[spec("a", None, w)]).unwrap_err();
            assert!(matches!(e, TreeError::BadWeight { .. }), "{w}");
        }
        for w in [MIN_WEIGHT, 1.0, MAX_WEIGHT] {
            let mut t = OrgTree::new(&[spec("a", None, w)]).expect("in range");
            let a = t.find("a").expect("a");
            assert!(t.set_weight(a, 1e308).is_err());
            assert!(t.set_weight(a, 2.0).is_ok());
        }
        let e = OrgTree::new(&[spec("a", None, 1.0), spec("a", None, 1.0)]).unwrap_err();
        assert_eq!(e, TreeError::Duplicate("a".into()));
        assert_eq!(OrgTree::new(&[]).unwrap_err(), TreeError::Empty);
    }
}
