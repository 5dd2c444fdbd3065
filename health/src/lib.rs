//! GPU health: sources (NVML, kernel-log XIDs, dcgm-exporter, scripted fake), the XID
//! catalog and the verdict policy.
//!
//! Placeholder crate: built by issue 3.
