//! Who drained a node. Each kind holds its own drain of a host and lifts only its
//! own; the node's state is the most severe in force. The names are those of the
//! wire, the journal and the agent's database since 0.2.

/// The kind of author of a drain.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum DrainAuthor {
    /// An operator of the cluster (`allot nodes drain`), carried out by the agent.
    ClusterOperator,
    /// An operator on the host itself (`allot drain` on the agent's socket).
    LocalOperator,
    /// The health verdict (an XID, a failed GPU, a disk nearly full).
    Health,
    /// allotd, for a node whose agent went silent past the grace.
    Lost,
}

impl DrainAuthor {
    /// Every kind.
    pub const ALL: [DrainAuthor; 4] = [
        DrainAuthor::ClusterOperator,
        DrainAuthor::LocalOperator,
        DrainAuthor::Health,
        DrainAuthor::Lost,
    ];

    /// Its name (`cluster-operator`, `local-operator`, `health`, `lost`).
    pub const fn as_str(self) -> &'static str {
        match self {
            DrainAuthor::ClusterOperator => "cluster-operator",
            DrainAuthor::LocalOperator => "local-operator",
            DrainAuthor::Health => "health",
            DrainAuthor::Lost => "lost",
        }
    }

    /// The kind `name` names, if any.
    pub fn named(name: &str) -> Option<DrainAuthor> {
        Self::ALL.into_iter().find(|k| k.as_str() == name)
    }
}

impl std::fmt::Display for DrainAuthor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_reads_back_from_its_name() {
        for k in DrainAuthor::ALL {
            assert_eq!(DrainAuthor::named(k.as_str()), Some(k));
        }
        assert_eq!(DrainAuthor::named("operator"), None);
    }
}
