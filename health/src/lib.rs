//! GPU health for allot: what a GPU's errors mean and what to do about them.
//!
//! Built so far (issue 3, first part): [`xid`], NVIDIA's XID catalog with allot's
//! scheduling action and recovery step per code, overridable; and [`kmsg`], a parser
//! for NVIDIA's `NVRM: Xid` and NVSwitch `SXid` kernel-log lines in every shape they
//! come in. Still to come: the NVML (nvml-wrapper), DCGM and fake sources, the
//! per-GPU state and per-host verdict, and Prometheus export.

pub mod kmsg;
pub mod xid;
