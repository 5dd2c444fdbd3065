//! What allot's daemons and CLI share, one helper per job.
//!
//! Map: [`admission`] (which connections hold a slot under per-peer, per-prefix and
//! per-identity caps, and whose a newcomer takes) · [`array`] (`--array` specifications) · [`hostlist`] (`--nodelist` host lists) · [`config_error`] (a config error that names file, line and field, with the
//! line from the TOML parser's own spans) · [`stats`] (percentiles) · [`systemd`]
//! (`sd_notify(3)` and the watchdog period) · [`fields`] (caps on request fields, safe
//! names) · [`net`] (loopback hosts) · `files` (atomic writes with a mode, feature `files`) · `rlimit` (the descriptor limit, feature `rlimit`) · `sqlite` (opening a state database,
//! feature `sqlite`) · `logging` (the daemons' tracing set-up, feature `logging`) · `clidocs` (man pages and
//! completions from clap, feature `clidocs`) · `http` (a small HTTP listener with
//! caps and deadlines, feature `http`).
//! Nothing here decides policy; the fair-share core and the health policy stay in
//! their own crates.

pub mod admission;
pub mod array;
#[cfg(feature = "clidocs")]
pub mod clidocs;
pub mod config_error;
pub mod drain;
pub mod exposition;
pub mod fields;
#[cfg(feature = "files")]
pub mod files;
pub mod hostlist;
#[cfg(feature = "http")]
pub mod http;
#[cfg(feature = "logging")]
pub mod logging;
pub mod net;
#[cfg(feature = "http")]
pub mod process;
#[cfg(feature = "rlimit")]
pub mod rlimit;
#[cfg(feature = "sqlite")]
pub mod sqlite;
pub mod stats;
pub mod systemd;
pub mod utc;
