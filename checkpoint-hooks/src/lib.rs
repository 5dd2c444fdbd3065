//! How a workload is asked to checkpoint, how completion is seen, and the escalation
//! ladder that ends a revoked lease: hook → wait for the checkpoint (marker file seen
//! through `notify`, the process exiting, or an HTTP acknowledgement) up to a grace
//! period → SIGTERM → grace → SIGKILL. The outcome records which rung ended it and how
//! long each took.
//!
//! Hooks: `signal:USR1` (to the process group), `exec:CMD ARGS…` (run as the
//! workload's user, with its groups and the lease's environment; exit 0 means the
//! checkpoint is done), `http:URL` (POST a JSON body to loopback or a host the agent
//! allows; 200 or 204 means done, 202 means started: then the marker or the exit says
//! done).

//!
//! Map: [`hook`] (the hook spec and where an http hook may go; always built) ·
//! `cgroup` (a lease's cgroup v2 directory: its whole process tree) ·
//! `identity` (whom a child runs as, and the one switch of user, groups and session
//! before exec, shared with the agent's launch) · `ladder` (running the ladder). The
//! last two need feature `ladder`, on by default, which brings `notify` and the HTTP
//! client.

#[cfg(feature = "ladder")]
pub mod cgroup;
pub mod hook;
#[cfg(feature = "ladder")]
pub mod identity;
#[cfg(feature = "ladder")]
mod ladder;

pub use hook::{host_allowed, signal_named, url_host, Hook, HookError};
#[cfg(feature = "ladder")]
pub use identity::{Identity, RunAs};
#[cfg(feature = "ladder")]
pub use ladder::{
    group_alive, proc_stat, run, Ladder, Outcome, ProcStat, Rung, Step, Target, DEFAULT_MARKER,
};
