//! `allot-agent`: the per-host daemon. It holds the host's leases in SQLite, starts
//! or adopts their workloads, enforces each contract (min runtime, time limit, the
//! checkpoint ladder), acts on the health verdict, and answers the local API.
//!
//! `contract` is pure (lease + time → what is due); `host` holds every rule about
//! leases, drains and GPUs; `daemon` and `api` are the thin async shell.

pub mod api;
pub mod cgroup;
pub mod config;
pub mod contract;
pub mod credentials;
pub mod daemon;
pub mod disk;
pub mod fence;
pub mod host;
pub mod lease;
pub mod logs;
pub mod metrics;
pub mod os;
pub mod process;
pub mod procid;
pub mod shared;
pub mod store;
pub mod supervisor;
pub mod tty;
pub mod tty_relay;
pub mod uplink;
pub mod vouch;
pub mod wire;
pub mod workdir;
