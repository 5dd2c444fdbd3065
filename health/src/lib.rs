//! GPU health for allot: what a GPU's errors mean and what to do about them.
//!
//! Built so far (issue 3, in progress): [`xid`], NVIDIA's XID catalog with allot's
//! scheduling action and recovery step per code, overridable; [`kmsg`], a parser for
//! NVIDIA's `NVRM: Xid` and NVSwitch `SXid` kernel-log lines in every shape they come
//! in; and [`verdict`], the pure policy turning samples and events into GPU states, a
//! host verdict with reasons, and Prometheus text. Still to come: the NVML
//! (nvml-wrapper, tested against a fake `libnvidia-ml.so`), DCGM and scripted-fake
//! sources that feed it.

pub mod dcgm;
pub mod fake;
pub mod kmsg;
pub mod kmsg_reader;
pub mod monitor;
pub mod nvml;
pub mod verdict;
pub mod xid;
