//! `allot-agent`: lease table, workload launcher, contract timers, drain, local API.
//!
//! Placeholder crate: built by issue 4.
