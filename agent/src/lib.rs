//! `allot-agent`: the per-host daemon. In progress (issue 4): today the workload
//! launcher and the process identity used to re-adopt workloads safely; the lease
//! table, contract timers, drain and local API come next.

pub mod process;
