//! GPU health for allot: what a GPU's errors mean and what to do about them.
//!
//! Map: [`xid`] (NVIDIA's XID catalog, allot's action and recovery per code,
//! overridable) · [`kmsg`] (`NVRM: Xid` / `SXid` kernel-log lines in every shape) ·
//! [`kmsg_reader`] (following `/dev/kmsg`, remembering what was acted on across
//! restarts) · [`nvml`] (samples and XID events through nvml-wrapper and a run-time
//! loaded `libnvidia-ml.so`) · [`dcgm`] (dcgm-exporter scrape) · [`fake`] (scripted
//! GPUs for development) · [`monitor`] (GPUs that vanish are lost) · [`verdict`] (the
//! pure policy: GPU states, host verdict, reasons, Prometheus text) · [`config`]
//! (the agent config's `[health]` section) · [`service`] (the running monitor the
//! agent embeds: sampling, NVML events and kernel-log threads feeding the policy).

pub mod config;
pub mod dcgm;
pub mod fake;
pub mod kmsg;
pub mod kmsg_reader;
pub mod monitor;
pub mod nvml;
pub mod service;
pub mod verdict;
pub mod xid;
