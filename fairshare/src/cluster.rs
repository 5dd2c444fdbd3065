//! Nodes and their GPUs: what is healthy, leased, claimed, and where work fits.
//!
//! GPUs of a node are bits of a `u64` mask (at most 64 per node). Two indexes keep
//! placement cheap at thousands of nodes: schedulable nodes bucketed by free-GPU count
//! (best fit is the first node of the smallest bucket that fits) and, per cluster,
//! nodes that are wholly free (what gangs need).

use crate::config::MILLI;
use crate::select::{NodeList, Registry, Select, Selector, MAX_NODE_LISTS};
use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;

/// Index of a node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct NodeId(pub u32);

impl NodeId {
    /// The index as usize.
    pub fn idx(self) -> usize {
        self.0 as usize
    }
}

/// A set of GPUs on one node, as bits.
pub type GpuMask = u64;

/// Most GPUs a node may have.
pub const MAX_GPUS_PER_NODE: u32 = 64;

/// A node as configured or registered.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct NodeSpec {
    /// Host name, unique.
    pub name: String,
    /// The cluster it belongs to; gangs never span clusters.
    #[serde(default)]
    pub cluster: String,
    /// Number of GPUs (1..=64).
    pub gpus: u32,
    /// CPU cores.
    #[serde(default)]
    pub cpu: u32,
    /// Memory in GB.
    #[serde(default)]
    pub memory_gb: u32,
    /// Its GPUs' type (`h100`; [`crate::select::gpu_type_of`] of the model); empty:
    /// not said.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub gpu_type: String,
    /// Its features (`nvlink`, `ib`), as its agent's config lists them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub features: Vec<String>,
}

/// Whether a node takes new work.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum NodeState {
    /// Schedulable.
    Ready,
    /// No new leases; running leases are revoked at their min-runtime lapse.
    Draining,
    /// No new leases; running leases are revoked at once.
    DrainNow,
    /// Gone: unreachable or powered off. Its leases are ended by whoever saw it go.
    Down,
}

/// One node's live state.
#[derive(Debug, Clone)]
pub struct Node {
    /// Configuration.
    pub spec: NodeSpec,
    /// Index into `Cluster::cluster_names`.
    pub cluster: u16,
    /// Scheduling state.
    pub state: NodeState,
    /// GPUs that are healthy.
    pub healthy: GpuMask,
    /// GPUs held by leases.
    pub used: GpuMask,
    /// GPUs set aside for one pending workload (a preemption claim or a reservation).
    pub claimed: GpuMask,
    /// GPUs held by leases that may be preempted now (unfunded, or past protection)
    /// and are not already being revoked.
    pub soft: GpuMask,
    /// CPU cores held by leases.
    pub cpu_used: u32,
    /// CPU cores set aside by preemption claims.
    pub claimed_cpu: u32,
    /// Memory set aside by preemption claims, GB.
    pub claimed_mem: u32,
    /// Memory held by leases, GB.
    pub mem_used: u32,
    /// The node refused a start of this many GPUs: work of this size or larger is not
    /// offered there until its state changes (`u32::MAX`: none refused).
    pub refused_from: u32,
    /// Taken out of the cluster by an operator: down for good, counted nowhere, its
    /// name free for a node that joins later. Its id stays so that ids never move.
    pub removed: bool,
    /// Its GPU type's bit in the cluster's registry (0: none said).
    pub type_bit: u64,
    /// Its features' bits.
    pub feature_bits: u64,
    /// What an hour of one of its GPUs counts for, in thousandths
    /// (`gpu_hour_weight` of its type).
    pub weight: u32,
}

impl Node {
    /// All GPU bits of this node.
    pub fn all(&self) -> GpuMask {
        mask_of(self.spec.gpus)
    }

    /// GPUs free for general placement: healthy, unleased, unclaimed, node ready.
    pub fn free(&self) -> GpuMask {
        if self.state == NodeState::Ready {
            self.healthy & !self.used & !self.claimed
        } else {
            0
        }
    }

    /// True when every GPU is healthy, free and unclaimed on a ready node.
    pub fn wholly_free(&self) -> bool {
        self.state == NodeState::Ready && self.free() == self.all() && self.cpu_used == 0
    }

    /// GPUs that are free or could be freed by preemption now.
    pub fn clearable(&self) -> GpuMask {
        if self.state == NodeState::Ready {
            self.healthy & !self.claimed & (!self.used | self.soft)
        } else {
            0
        }
    }

    /// True when preemption could empty the whole node.
    pub fn wholly_clearable(&self) -> bool {
        self.state == NodeState::Ready && self.claimed == 0 && self.clearable() == self.all()
    }

    /// True when `cpu` cores and `mem` GB still fit beside what leases hold and
    /// claims set aside.
    pub fn fits_host(&self, cpu: u32, mem: u32) -> bool {
        self.cpu_used + self.claimed_cpu + cpu <= self.spec.cpu
            && self.mem_used + self.claimed_mem + mem <= self.spec.memory_gb
    }

    /// True unless the node refused work of `gpus` GPUs (or fewer) since it last changed.
    pub fn offers(&self, gpus: u32) -> bool {
        gpus < self.refused_from
    }

    /// Whether work of `gpus` GPUs, `cpu` cores and `mem` GB may be placed here beside
    /// what it holds: room for the host share, and no refusal of that size.
    pub fn takes(&self, gpus: u32, cpu: u32, mem: u32) -> bool {
        self.fits_host(cpu, mem) && self.offers(gpus)
    }

    /// What it is, as far as fitting goes.
    pub fn kind(&self) -> NodeKind {
        NodeKind {
            cluster: self.cluster,
            gpus: self.spec.gpus,
            cpu: self.spec.cpu,
            memory_gb: self.spec.memory_gb,
            type_bit: self.type_bit,
            feature_bits: self.feature_bits,
        }
    }

    /// Whether work that asks `sel` may run here (type, features, cluster).
    pub fn matches(&self, sel: &Selector) -> bool {
        sel.admits(self.cluster, self.type_bit, self.feature_bits)
    }

    /// Something about the node changed: every size is offered again.
    pub fn forget_refusals(&mut self) {
        self.refused_from = u32::MAX;
    }
}

/// The mask with the low `n` bits set.
pub fn mask_of(n: u32) -> GpuMask {
    if n >= 64 {
        u64::MAX
    } else {
        (1u64 << n) - 1
    }
}

/// The lowest `n` bits set in `from` (fewer if it has fewer).
pub fn lowest_bits(from: GpuMask, n: u32) -> GpuMask {
    let mut out = 0;
    let mut rest = from;
    for _ in 0..n {
        if rest == 0 {
            break;
        }
        let bit = rest & rest.wrapping_neg();
        out |= bit;
        rest &= !bit;
    }
    out
}

fn list(names: &[String]) -> String {
    if names.is_empty() {
        "none".into()
    } else {
        names.join(", ")
    }
}

/// What a node is, as far as fitting goes: its cluster, size, GPU type and features.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct NodeKind {
    /// Index into `Cluster::cluster_names`.
    pub cluster: u16,
    /// GPUs.
    pub gpus: u32,
    /// CPU cores.
    pub cpu: u32,
    /// Memory in GB.
    pub memory_gb: u32,
    /// Its GPU type's bit.
    pub type_bit: u64,
    /// Its features' bits.
    pub feature_bits: u64,
}

/// Why a node list was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ClusterError {
    /// GPU count outside 1..=64.
    #[error("node {name:?}: gpus = {gpus}; a node has 1 to 64 GPUs")]
    BadGpuCount {
        /// Node.
        name: String,
        /// Its count.
        gpus: u32,
    },
    /// Two nodes with one name.
    #[error("node {0:?} is defined twice; host names must be unique")]
    Duplicate(String),
    /// More distinct GPU types or features than a cluster tells apart.
    #[error(
        "node {name:?}: {what} {value:?} would be the 65th distinct one; allot tells 64 apart"
    )]
    TooManyNames {
        /// Node.
        name: String,
        /// `GPU type` or `feature`.
        what: &'static str,
        /// The name.
        value: String,
    },
    /// A node still holding or promised GPUs cannot leave the cluster.
    #[error("node {0:?} still holds leases or claims; drain it and wait for its work to end (or for it to be declared lost) before removing it")]
    Busy(String),
}

/// All nodes, with the indexes placement uses.
#[derive(Debug, Clone)]
pub struct Cluster {
    nodes: Vec<Node>,
    by_name: std::collections::BTreeMap<String, u32>,
    cluster_names: Vec<String>,
    gpu_types: Registry,
    features: Registry,
    by_free: Vec<BTreeSet<u32>>,
    whole_free: Vec<BTreeSet<u32>>,
    by_clearable: Vec<BTreeSet<u32>>,
    whole_clearable: Vec<BTreeSet<u32>>,
    /// Nodes counted by (cluster, GPUs, CPU, memory): what a submission's fit check
    /// reads, so that it costs the same at 100 nodes and at 10,000.
    kinds: std::collections::BTreeMap<NodeKind, u32>,
    /// Per node, when it last changed (`changes` at the time): lets a pass keep what
    /// it learnt about a node until the node changes.
    stamps: Vec<u64>,
    changes: u64,
    free_total: u64,
    total_gpus: u64,
    total_cpu: u64,
    total_mem: u64,
    /// `gpu_hour_weight` by type, in thousandths (empty: every type weighs 1).
    weights: std::collections::BTreeMap<String, u32>,
    /// GPUs across all nodes, each weighted, in thousandths.
    total_weighted: u64,
    /// The node lists work asked for (`Selector::nodes` indexes it, plus one).
    node_lists: Vec<NodeList>,
}

impl Cluster {
    /// Builds the node table; every node starts ready and healthy.
    pub fn new(specs: Vec<NodeSpec>) -> Result<Self, ClusterError> {
        let mut c = Cluster {
            nodes: Vec::with_capacity(specs.len()),
            by_name: std::collections::BTreeMap::new(),
            cluster_names: Vec::new(),
            gpu_types: Registry::default(),
            features: Registry::default(),
            by_free: vec![BTreeSet::new()],
            whole_free: Vec::new(),
            by_clearable: vec![BTreeSet::new()],
            whole_clearable: Vec::new(),
            kinds: std::collections::BTreeMap::new(),
            stamps: Vec::with_capacity(specs.len()),
            changes: 0,
            free_total: 0,
            total_gpus: 0,
            total_cpu: 0,
            total_mem: 0,
            weights: std::collections::BTreeMap::new(),
            total_weighted: 0,
            node_lists: Vec::new(),
        };
        for spec in specs {
            c.add(spec)?;
        }
        Ok(c)
    }

    /// Adds a node (at build time or when one joins later); it starts ready and
    /// healthy.
    pub fn add(&mut self, spec: NodeSpec) -> Result<NodeId, ClusterError> {
        if spec.gpus == 0 || spec.gpus > MAX_GPUS_PER_NODE {
            return Err(ClusterError::BadGpuCount {
                name: spec.name,
                gpus: spec.gpus,
            });
        }
        if self.find(&spec.name).is_some() {
            return Err(ClusterError::Duplicate(spec.name));
        }
        let (type_bit, feature_bits) = self.learn(&spec.name, &spec.gpu_type, &spec.features)?;
        let cluster = match self.cluster_names.iter().position(|c| *c == spec.cluster) {
            Some(i) => i,
            None => {
                self.cluster_names.push(spec.cluster.clone());
                self.whole_free.push(BTreeSet::new());
                self.whole_clearable.push(BTreeSet::new());
                self.cluster_names.len() - 1
            }
        } as u16;
        let slots = spec.gpus as usize + 1;
        if self.by_free.len() < slots {
            self.by_free.resize(slots, BTreeSet::new());
            self.by_clearable.resize(slots, BTreeSet::new());
        }
        let weight = self.weight_of_type(&spec.gpu_type);
        self.total_gpus += u64::from(spec.gpus);
        self.total_weighted += u64::from(spec.gpus) * u64::from(weight);
        self.total_cpu += u64::from(spec.cpu);
        self.total_mem += u64::from(spec.memory_gb);
        let all = mask_of(spec.gpus);
        *self
            .kinds
            .entry(NodeKind {
                cluster,
                gpus: spec.gpus,
                cpu: spec.cpu,
                memory_gb: spec.memory_gb,
                type_bit,
                feature_bits,
            })
            .or_default() += 1;
        self.by_name
            .insert(spec.name.clone(), self.nodes.len() as u32);
        self.nodes.push(Node {
            spec,
            cluster,
            state: NodeState::Ready,
            healthy: all,
            used: 0,
            claimed: 0,
            soft: 0,
            cpu_used: 0,
            claimed_cpu: 0,
            claimed_mem: 0,
            mem_used: 0,
            refused_from: u32::MAX,
            removed: false,
            type_bit,
            feature_bits,
            weight,
        });
        let i = self.nodes.len() - 1;
        self.changes += 1;
        self.stamps.push(self.changes);
        self.index(i);
        Ok(NodeId(i as u32))
    }

    /// Takes a node out for good: it stops counting in totals and kinds, is never
    /// placed on, and its name may join again as a new node. Refused while it holds
    /// leases or claims.
    pub fn remove(&mut self, id: NodeId) -> Result<(), ClusterError> {
        let n = &self.nodes[id.idx()];
        if n.removed {
            return Ok(());
        }
        if n.used != 0 || n.claimed != 0 || n.cpu_used != 0 || n.mem_used != 0 {
            return Err(ClusterError::Busy(n.spec.name.clone()));
        }
        let kind = n.kind();
        let (gpus, cpu, mem) = (n.spec.gpus, n.spec.cpu, n.spec.memory_gb);
        let name = n.spec.name.clone();
        self.total_weighted -= u64::from(gpus) * u64::from(n.weight);
        self.total_gpus -= u64::from(gpus);
        self.total_cpu -= u64::from(cpu);
        self.total_mem -= u64::from(mem);
        self.uncount(kind);
        if self.by_name.get(&name) == Some(&id.0) {
            self.by_name.remove(&name);
        }
        self.update(id, |n| {
            n.removed = true;
            n.state = NodeState::Down;
            n.healthy = 0;
        });
        Ok(())
    }

    fn index(&mut self, i: usize) {
        let n = &self.nodes[i];
        let free = n.free().count_ones();
        self.free_total += u64::from(free);
        if free > 0 {
            self.by_free[free as usize].insert(i as u32);
        }
        if n.wholly_free() {
            self.whole_free[n.cluster as usize].insert(i as u32);
        }
        let clear = n.clearable().count_ones();
        if clear > 0 {
            self.by_clearable[clear as usize].insert(i as u32);
        }
        if n.wholly_clearable() {
            self.whole_clearable[n.cluster as usize].insert(i as u32);
        }
    }

    fn unindex(&mut self, i: usize) {
        let n = &self.nodes[i];
        let free = n.free().count_ones();
        self.free_total -= u64::from(free);
        if free > 0 {
            self.by_free[free as usize].remove(&(i as u32));
        }
        self.whole_free[n.cluster as usize].remove(&(i as u32));
        let clear = n.clearable().count_ones();
        if clear > 0 {
            self.by_clearable[clear as usize].remove(&(i as u32));
        }
        self.whole_clearable[n.cluster as usize].remove(&(i as u32));
    }

    /// Changes one node through `f`, keeping the indexes true.
    pub fn update<R>(&mut self, id: NodeId, f: impl FnOnce(&mut Node) -> R) -> R {
        self.unindex(id.idx());
        let r = f(&mut self.nodes[id.idx()]);
        self.index(id.idx());
        self.changes += 1;
        self.stamps[id.idx()] = self.changes;
        r
    }

    /// When `id` last changed through [`Cluster::update`] (or joined): equal stamps
    /// mean the node, its leases' GPUs and its claims are as they were.
    pub fn stamp(&self, id: NodeId) -> u64 {
        self.stamps[id.idx()]
    }

    /// A node.
    pub fn node(&self, id: NodeId) -> &Node {
        &self.nodes[id.idx()]
    }

    /// All nodes in id order.
    pub fn nodes(&self) -> impl Iterator<Item = (NodeId, &Node)> {
        self.nodes
            .iter()
            .enumerate()
            .map(|(i, n)| (NodeId(i as u32), n))
    }

    /// Number of nodes.
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// True with no nodes.
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// Looks a node up by host name (linear; for shells and tests, not the hot path).
    pub fn find(&self, name: &str) -> Option<NodeId> {
        self.by_name.get(name).map(|i| NodeId(*i))
    }

    /// Nodes grouped by what they are (cluster and size), with how many of each.
    pub fn kinds(&self) -> impl Iterator<Item = (&NodeKind, u32)> {
        self.kinds.iter().map(|(k, n)| (k, *n))
    }

    /// Cluster names, indexed by `Node::cluster`.
    pub fn cluster_names(&self) -> &[String] {
        &self.cluster_names
    }

    /// GPUs free for general placement, over all nodes.
    pub fn free_total(&self) -> u64 {
        self.free_total
    }

    /// Installed GPUs, healthy or not.
    pub fn total_gpus(&self) -> u64 {
        self.total_gpus
    }

    /// Installed CPU cores.
    pub fn total_cpu(&self) -> u64 {
        self.total_cpu
    }

    /// Installed memory, GB.
    pub fn total_mem(&self) -> u64 {
        self.total_mem
    }

    /// The largest number of free GPUs on any one node.
    pub fn largest_free_block(&self) -> u32 {
        (1..self.by_free.len())
            .rev()
            .find(|&k| !self.by_free[k].is_empty())
            .unwrap_or(0) as u32
    }

    /// Best fit for single-node work: the node with the fewest free GPUs that still
    /// holds `gpus` GPUs and the CPU and memory (lowest id on ties).
    pub fn best_fit(&self, gpus: u32, cpu: u32, mem: u32, sel: &Selector) -> Option<NodeId> {
        let lo = gpus.max(1) as usize;
        for bucket in self.by_free.iter().skip(lo) {
            for &i in bucket {
                let n = &self.nodes[i as usize];
                if n.takes(gpus, cpu, mem) && self.admits(NodeId(i), sel) {
                    return Some(NodeId(i));
                }
            }
        }
        None
    }

    /// `count` wholly free nodes of one cluster, each with at least `gpus` GPUs and
    /// room for the CPU and memory; the first cluster (by name order) that has them.
    pub fn whole_nodes(
        &self,
        count: u32,
        gpus: u32,
        cpu: u32,
        mem: u32,
        sel: &Selector,
    ) -> Option<Vec<NodeId>> {
        for set in &self.whole_free {
            if (set.len() as u32) < count {
                continue;
            }
            let picked: Vec<NodeId> = set
                .iter()
                .map(|&i| NodeId(i))
                .filter(|&id| {
                    let n = &self.nodes[id.idx()];
                    n.spec.gpus >= gpus && n.takes(gpus, cpu, mem) && self.admits(id, sel)
                })
                .take(count as usize)
                .collect();
            if picked.len() == count as usize {
                return Some(picked);
            }
        }
        None
    }

    /// One node of `kind` fewer.
    fn uncount(&mut self, kind: NodeKind) {
        if let Some(k) = self.kinds.get_mut(&kind) {
            *k -= 1;
            if *k == 0 {
                self.kinds.remove(&kind);
            }
        }
    }

    /// The bits of a node's GPU type and features, registering names not seen yet.
    fn learn(
        &mut self,
        node: &str,
        gpu_type: &str,
        features: &[String],
    ) -> Result<(u64, u64), ClusterError> {
        let too_many = |what, value: &str| ClusterError::TooManyNames {
            name: node.to_string(),
            what,
            value: value.to_string(),
        };
        let type_bit = if gpu_type.is_empty() {
            0
        } else {
            self.gpu_types
                .learn(gpu_type)
                .ok_or_else(|| too_many("GPU type", gpu_type))?
        };
        let mut feature_bits = 0;
        for f in features {
            feature_bits |= self
                .features
                .learn(f)
                .ok_or_else(|| too_many("feature", f))?;
        }
        Ok((type_bit, feature_bits))
    }

    /// Sets node `id`'s GPU type and features (its agent registered new ones),
    /// keeping the kinds and the registries true.
    pub fn relabel(
        &mut self,
        id: NodeId,
        gpu_type: &str,
        features: &[String],
    ) -> Result<(), ClusterError> {
        let n = &self.nodes[id.idx()];
        if n.spec.gpu_type == gpu_type && n.spec.features == features {
            return Ok(());
        }
        let name = n.spec.name.clone();
        let (type_bit, feature_bits) = self.learn(&name, gpu_type, features)?;
        let weight = self.weight_of_type(gpu_type);
        let n = &self.nodes[id.idx()];
        if !n.removed {
            let old = n.kind();
            let gpus = u64::from(n.spec.gpus);
            self.total_weighted =
                self.total_weighted - gpus * u64::from(n.weight) + gpus * u64::from(weight);
            self.uncount(old);
            *self
                .kinds
                .entry(NodeKind {
                    type_bit,
                    feature_bits,
                    ..old
                })
                .or_default() += 1;
        }
        self.update(id, |n| {
            n.spec.gpu_type = gpu_type.to_string();
            n.spec.features = features.to_vec();
            n.type_bit = type_bit;
            n.feature_bits = feature_bits;
            n.weight = weight;
        });
        Ok(())
    }

    /// Sets what an hour of each GPU type counts for, in thousandths (the policy's
    /// `gpu_hour_weight`), and weighs every node again.
    pub fn set_gpu_weights(&mut self, weights: std::collections::BTreeMap<String, u32>) {
        self.weights = weights;
        self.total_weighted = 0;
        for i in 0..self.nodes.len() {
            let w = self.weight_of_type(&self.nodes[i].spec.gpu_type);
            let n = &mut self.nodes[i];
            n.weight = w;
            if !n.removed {
                self.total_weighted += u64::from(n.spec.gpus) * u64::from(w);
            }
        }
    }

    /// What an hour of a GPU of type `t` counts for, in thousandths.
    fn weight_of_type(&self, t: &str) -> u32 {
        self.weights.get(t).copied().unwrap_or(MILLI as u32)
    }

    /// The weighted GPUs `placement` holds, in thousandths.
    pub fn weighted(&self, placement: &[crate::workload::NodeGpus]) -> u64 {
        placement
            .iter()
            .map(|p| u64::from(p.gpus.count_ones()) * u64::from(self.nodes[p.node.idx()].weight))
            .sum()
    }

    /// GPUs across all nodes, each weighted, in thousandths.
    pub fn total_weighted(&self) -> u64 {
        self.total_weighted
    }

    /// What an hour of a GPU counts for to work that asks `sel` before it is
    /// placed, in thousandths: the lightest type it may land on (1 with no weights
    /// set), so a request is never charged ahead for a type it may not get.
    pub fn request_weight(&self, sel: &Selector) -> u32 {
        if self.weights.is_empty() {
            return MILLI as u32;
        }
        self.kinds
            .keys()
            .filter(|k| sel.admits(k.cluster, k.type_bit, k.feature_bits))
            .map(|k| {
                let name = (k.type_bit != 0)
                    .then(|| {
                        self.gpu_types
                            .names()
                            .get(k.type_bit.trailing_zeros() as usize)
                    })
                    .flatten();
                self.weight_of_type(name.map_or("", String::as_str))
            })
            .min()
            .unwrap_or(MILLI as u32)
    }

    /// Whether work that asks `sel` may run on node `id`: its type, features and
    /// cluster, and the node lists it gave.
    pub fn admits(&self, id: NodeId, sel: &Selector) -> bool {
        self.nodes[id.idx()].matches(sel)
            && (sel.nodes == 0 || self.node_lists[sel.nodes as usize - 1].admits(id.0))
    }

    /// The node kinds work asking `sel` may run on, with how many nodes of each it
    /// may use: from the kinds alone, unless it names nodes (then from those nodes).
    pub fn kinds_admitted(&self, sel: &Selector) -> Vec<(NodeKind, u32)> {
        if sel.nodes == 0 {
            return self
                .kinds
                .iter()
                .filter(|(k, _)| sel.admits(k.cluster, k.type_bit, k.feature_bits))
                .map(|(k, n)| (*k, *n))
                .collect();
        }
        let mut kinds = std::collections::BTreeMap::new();
        for (id, n) in self.nodes() {
            if !n.removed && self.admits(id, sel) {
                *kinds.entry(n.kind()).or_insert(0) += 1;
            }
        }
        kinds.into_iter().collect()
    }

    /// The index (plus one) of the node list `--nodelist` and `--exclude` make,
    /// keeping it in the table if it is new; the error names a node that does not
    /// exist.
    fn node_list(&mut self, s: &Select) -> Result<u32, (&'static str, String)> {
        if s.nodelist.is_empty() && s.exclude.is_empty() {
            return Ok(0);
        }
        let ids = |field: &'static str, names: &[String]| {
            let mut ids = names
                .iter()
                .map(|name| {
                    self.find(name).map(|id| id.0).ok_or_else(|| {
                        (
                            field,
                            format!("no node is named {name:?}; `allot nodes` lists them"),
                        )
                    })
                })
                .collect::<Result<Vec<u32>, _>>()?;
            ids.sort_unstable();
            ids.dedup();
            Ok::<_, (&'static str, String)>(ids)
        };
        let list = NodeList {
            only: ids("nodelist", &s.nodelist)?,
            exclude: ids("exclude", &s.exclude)?,
        };
        if let Some(i) = self.node_lists.iter().position(|l| *l == list) {
            return Ok(i as u32 + 1);
        }
        if self.node_lists.len() >= MAX_NODE_LISTS {
            return Err((
                "nodelist",
                format!(
                    "{MAX_NODE_LISTS} different node lists are in use already; name nodes by \
                     type, feature or cluster instead"
                ),
            ));
        }
        self.node_lists.push(list);
        Ok(self.node_lists.len() as u32)
    }

    /// The bits of what `s` names; the error names what no node has and what the
    /// cluster has instead.
    pub fn selector(&mut self, s: &Select) -> Result<Selector, (&'static str, String)> {
        let mut sel = Selector {
            nodes: self.node_list(s)?,
            ..Selector::default()
        };
        for t in &s.gpu_types {
            let bit = self.gpu_types.bit(t).ok_or_else(|| {
                (
                    "gpu_types",
                    format!(
                        "no node has GPU type {t:?}; this cluster has {}",
                        list(self.gpu_types.names())
                    ),
                )
            })?;
            sel.types |= bit;
        }
        for f in &s.features {
            let bit = self.features.bit(f).ok_or_else(|| {
                (
                    "constraint",
                    format!(
                        "no node has feature {f:?}; nodes have {}",
                        list(self.features.names())
                    ),
                )
            })?;
            sel.features |= bit;
        }
        if !s.cluster.is_empty() {
            let i = self
                .cluster_names
                .iter()
                .position(|c| *c == s.cluster)
                .ok_or_else(|| {
                    (
                        "cluster",
                        format!(
                            "no cluster {:?}; there are {}",
                            s.cluster,
                            list(&self.cluster_names)
                        ),
                    )
                })?;
            sel.cluster = u16::try_from(i + 1).unwrap_or(u16::MAX);
        }
        Ok(sel)
    }

    /// The largest number of GPUs on one node that are free or preemptible now.
    pub fn largest_clearable_block(&self) -> u32 {
        (1..self.by_clearable.len())
            .rev()
            .find(|&k| !self.by_clearable[k].is_empty())
            .unwrap_or(0) as u32
    }

    /// Nodes with at least `gpus` free-or-preemptible GPUs, fewest first.
    pub fn clearable_nodes(&self, gpus: u32) -> impl Iterator<Item = NodeId> + '_ {
        self.by_clearable
            .iter()
            .skip(gpus.max(1) as usize)
            .flat_map(|b| b.iter().map(|&i| NodeId(i)))
    }

    /// Per cluster, the nodes that preemption could empty entirely.
    pub fn wholly_clearable(&self) -> &[BTreeSet<u32>] {
        &self.whole_clearable
    }

    /// The wholly free nodes of cluster `cluster` (an index of `cluster_names`).
    pub fn whole_free_in(&self, cluster: u16) -> Option<&BTreeSet<u32>> {
        self.whole_free.get(usize::from(cluster))
    }

    /// Number of wholly free nodes in the cluster with the most of them.
    pub fn most_whole_free(&self) -> u32 {
        self.whole_free
            .iter()
            .map(|s| s.len() as u32)
            .max()
            .unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nodes(n: u32, gpus: u32) -> Vec<NodeSpec> {
        (0..n)
            .map(|i| NodeSpec {
                name: format!("n{i}"),
                cluster: "c".into(),
                gpus,
                cpu: 64,
                memory_gb: 512,
                ..Default::default()
            })
            .collect()
    }

    #[test]
    fn best_fit_prefers_the_fullest_node_that_fits() {
        let any = Selector::default();
        let mut c = Cluster::new(nodes(3, 8)).expect("valid");
        c.update(NodeId(0), |n| n.used = mask_of(6)); // 2 free
        c.update(NodeId(1), |n| n.used = mask_of(3)); // 5 free
        assert_eq!(c.best_fit(2, 1, 1, &any), Some(NodeId(0)));
        assert_eq!(c.best_fit(3, 1, 1, &any), Some(NodeId(1)));
        assert_eq!(c.best_fit(8, 1, 1, &any), Some(NodeId(2)));
        assert_eq!(c.free_total(), 2 + 5 + 8);
        assert_eq!(c.largest_free_block(), 8);
        assert_eq!(c.whole_nodes(1, 8, 0, 0, &any), Some(vec![NodeId(2)]));
        assert_eq!(c.whole_nodes(2, 8, 0, 0, &any), None);
        c.update(NodeId(2), |n| n.state = NodeState::Draining);
        assert_eq!(c.best_fit(8, 1, 1, &any), None);
        assert_eq!(c.free_total(), 7);
    }

    #[test]
    fn host_resources_limit_fit() {
        let any = Selector::default();
        let c = Cluster::new(nodes(1, 8)).expect("valid");
        assert_eq!(c.best_fit(1, 65, 1, &any), None);
        assert_eq!(c.best_fit(1, 64, 512, &any), Some(NodeId(0)));
    }

    #[test]
    fn lowest_bits_takes_from_the_bottom() {
        assert_eq!(lowest_bits(0b1011_0100, 2), 0b0001_0100);
        assert_eq!(lowest_bits(0b1, 3), 0b1);
    }
}
