//! How a workload is asked to checkpoint (signal, exec, HTTP), how completion is seen,
//! and the escalation ladder.
//!
//! Placeholder crate: built by issue 4.
