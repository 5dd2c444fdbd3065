//! What work asks of its nodes besides their size: GPU types (any of them), node
//! features (all of them) and a cluster, as Slurm's `--gres=gpu:TYPE`,
//! `--constraint` and `--clusters`. Names in a [`Select`] (what the user wrote,
//! journaled with the submission); bits in a [`Selector`] (what placement tests,
//! from the cluster's registry of the names its nodes registered, which only grows,
//! so a bit keeps its meaning).

use serde::{Deserialize, Serialize};

/// Most distinct GPU types, and most distinct node features, one cluster tells apart.
pub const MAX_NAMES: usize = 64;

/// What a workload asks of its nodes, by name.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Select {
    /// Any of these GPU types (`h100`, `b200`); empty: any.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gpu_types: Vec<String>,
    /// Every one of these node features (`nvlink`, `ib`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub features: Vec<String>,
    /// Only this cluster's nodes; empty: any.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub cluster: String,
    /// Only these nodes, by host name (`--nodelist`); empty: any.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nodelist: Vec<String>,
    /// Never these nodes (`--exclude`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub exclude: Vec<String>,
}

impl Select {
    /// Asks nothing: any node of the right size.
    pub fn is_any(&self) -> bool {
        *self == Select::default()
    }
}

/// A [`Select`] as bits of one cluster's registry.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Selector {
    /// GPU type bits, any of which will do (0: any type).
    pub types: u64,
    /// Feature bits, all of which are needed.
    pub features: u64,
    /// The cluster's index plus one (0: any cluster).
    pub cluster: u16,
    /// The index plus one of its node list in the cluster's table of them (0: any
    /// node); see `Cluster::admits`.
    pub nodes: u32,
}

impl Selector {
    /// Whether a node of this cluster, type and features will do.
    pub fn admits(&self, cluster: u16, type_bit: u64, feature_bits: u64) -> bool {
        (self.types == 0 || self.types & type_bit != 0)
            && feature_bits & self.features == self.features
            && (self.cluster == 0 || self.cluster == cluster + 1)
    }
}

/// Most node lists (`--nodelist`, `--exclude`, as distinct pairs) one cluster keeps
/// for the work it holds; the table starts afresh with each allotd start.
pub const MAX_NODE_LISTS: usize = 4096;

/// Which nodes a workload's `--nodelist` and `--exclude` leave it, by node index.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeList {
    /// Sorted; empty: any node.
    pub only: Vec<u32>,
    /// Sorted.
    pub exclude: Vec<u32>,
}

impl NodeList {
    /// Whether node `i` is left.
    pub fn admits(&self, i: u32) -> bool {
        (self.only.is_empty() || self.only.binary_search(&i).is_ok())
            && self.exclude.binary_search(&i).is_err()
    }
}

/// Names to bits, in the order nodes brought them.
#[derive(Debug, Clone, Default)]
pub struct Registry {
    names: Vec<String>,
}

impl Registry {
    /// The bit of `name`, registering it; `None` once [`MAX_NAMES`] are taken.
    pub fn learn(&mut self, name: &str) -> Option<u64> {
        if let Some(i) = self.names.iter().position(|n| n == name) {
            return Some(1 << i);
        }
        if self.names.len() >= MAX_NAMES {
            return None;
        }
        self.names.push(name.to_string());
        Some(1 << (self.names.len() - 1))
    }

    /// The bit of a known `name`.
    pub fn bit(&self, name: &str) -> Option<u64> {
        self.names.iter().position(|n| n == name).map(|i| 1 << i)
    }

    /// The names known, in order.
    pub fn names(&self) -> &[String] {
        &self.names
    }
}

/// The GPU type a model name stands for: `NVIDIA H100 80GB HBM3` is `h100`,
/// `NVIDIA A100-SXM4-80GB` `a100`, `NVIDIA GeForce RTX 4090` `rtx4090`; lower case,
/// the first word after the vendor and the product line, up to a dash.
pub fn gpu_type_of(model: &str) -> String {
    let words: Vec<String> = model
        .split_whitespace()
        .map(str::to_lowercase)
        // `fake` is the test GPUs' vendor (allot-health-sources' fake source).
        .filter(|w| {
            !matches!(
                w.as_str(),
                "nvidia" | "tesla" | "geforce" | "quadro" | "fake"
            )
        })
        .collect();
    match words.as_slice() {
        [first, second, ..] if first == "rtx" => format!("rtx{second}"),
        [first, ..] => first.split('-').next().unwrap_or(first).to_string(),
        [] => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn models_name_their_type() {
        assert_eq!(gpu_type_of("NVIDIA H100 80GB HBM3"), "h100");
        assert_eq!(gpu_type_of("NVIDIA B200"), "b200");
        assert_eq!(gpu_type_of("NVIDIA GB200"), "gb200");
        assert_eq!(gpu_type_of("Tesla V100-SXM2-16GB"), "v100");
        assert_eq!(gpu_type_of("NVIDIA A100-SXM4-80GB"), "a100");
        assert_eq!(gpu_type_of("NVIDIA GeForce RTX 4090"), "rtx4090");
        assert_eq!(gpu_type_of("Fake H100 80GB HBM3"), "h100");
        assert_eq!(gpu_type_of(""), "");
    }

    #[test]
    fn a_selector_admits_any_listed_type_with_every_feature() {
        let s = Selector {
            types: 0b011,
            features: 0b10,
            cluster: 0,
            nodes: 0,
        };
        assert!(s.admits(3, 0b001, 0b110));
        assert!(!s.admits(3, 0b100, 0b110), "another type");
        assert!(!s.admits(3, 0b001, 0b001), "a feature missing");
        let one = Selector {
            cluster: 2,
            ..Selector::default()
        };
        assert!(one.admits(1, 0, 0) && !one.admits(0, 0, 0));
    }
}
