//! The allot policy core: who runs where, and why.
//!
//! Pure and deterministic: state and `now` in, [`Decisions`] out. No I/O, no async, no
//! wall clock, no hash-order iteration, so the same inputs give the same decisions
//! byte for byte. The allocator service and the simulator (crate `allot-sim`) drive the
//! very same [`Scheduler`].
//!
//! Map: [`tree`] (org tree and shares) · [`ledger`] (usage over the lookback) ·
//! [`ratios`] (served ratios) · [`runlength`] (run lengths predicted) · [`entitlement`] (the ideal allocation) · [`cluster`]
//! (nodes, GPUs, fit indexes) · [`queue`] (per-project order) · [`scheduler`] (the
//! pass, and the static-priority baseline it replaces) · [`select`] (GPU types,
//! features and clusters work asks for) · `preempt` (victims,
//! reservations) · [`decision`] (actions and reasons).

pub mod cluster;
pub mod config;
pub mod decision;
pub mod entitlement;
pub mod ledger;
mod preempt;
pub mod queue;
pub mod ratios;
pub mod runlength;
pub mod scheduler;
pub mod select;
pub mod time;
pub mod tree;
pub mod workload;

pub use cluster::{NodeId, NodeSpec, NodeState};
pub use config::PolicyConfig;
pub use decision::{Action, Decisions, Explanation, StartWhy};
pub use scheduler::{
    Calibration, CoreError, Forecast, ForecastOptions, LeaseEnd, RunHistory, Scheduler,
};
pub use time::{Secs, Time};
pub use tree::{GroupId, GroupSpec, OrgTree};
pub use workload::{
    Blocked, Lease, LeaseId, LeaseUse, RevokeWhy, SpecError, Workload, WorkloadId, WorkloadSpec,
    WorkloadState, CLASSES, DEFAULT_CLASS,
};
