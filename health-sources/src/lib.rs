//! Where GPU health comes from: the I/O half of allot's health, feeding the pure
//! policy of `allot-health`. Only the agent links this crate (and so NVML).
//!
//! Map: [`nvml`] (samples and XID events through nvml-wrapper and a run-time loaded
//! `libnvidia-ml.so`) · [`dcgm`] (dcgm-exporter scrape) · [`kmsg_reader`] (following
//! `/dev/kmsg`, remembering what was acted on across restarts) · [`fake`] (scripted
//! GPUs for development) · [`monitor`] (GPUs that vanish are lost) · [`service`] (the
//! running monitor the agent embeds: sampling, NVML events and kernel-log threads
//! feeding the policy).

pub mod dcgm;
pub mod fake;
pub mod kmsg_reader;
pub mod monitor;
pub mod nvml;
pub mod service;
