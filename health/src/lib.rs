//! GPU health policy for allot: what a GPU's errors mean and what to do about them.
//!
//! Pure like the fair-share core: text and samples in, decisions out; no NVML, no
//! files, no clock. The sources that feed it (NVML, DCGM, the kernel log, scripted
//! GPUs) live in `allot-health-sources`, which only the agent links.
//!
//! Map: [`xid`] (NVIDIA's XID catalog, allot's action and recovery per code,
//! overridable) · [`kmsg`] (`NVRM: Xid` / `SXid` kernel-log lines in every shape) ·
//! [`verdict`] (GPU states, host verdict, reasons, Prometheus text) · [`config`]
//! (the agent config's `[health]` section and the GPU source spec).

pub mod config;
pub mod kmsg;
pub mod verdict;
pub mod xid;
