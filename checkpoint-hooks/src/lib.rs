//! How a workload is asked to checkpoint, how completion is seen, and the escalation
//! ladder that ends a revoked lease: hook → wait for the checkpoint (marker file seen
//! through `notify`, the process exiting, or an HTTP acknowledgement) up to a grace
//! period → SIGTERM → grace → SIGKILL. The outcome records which rung ended it and how
//! long each took.
//!
//! Hooks: `signal:USR1` (to the process group), `exec:CMD ARGS…` (run with the lease's
//! environment; exit 0 means the checkpoint is done), `http:URL` (POST a JSON body; 200
//! or 204 means done, 202 means started: then the marker or the exit says done).

//!
//! Map: [`hook`] (the hook spec; always built) · `ladder` (running the ladder; feature
//! `ladder`, on by default, which brings `notify` and the HTTP client).

pub mod hook;
#[cfg(feature = "ladder")]
mod ladder;

pub use hook::{signal_named, Hook, HookError};
#[cfg(feature = "ladder")]
pub use ladder::{
    group_alive, proc_stat, run, Ladder, Outcome, ProcStat, Rung, Step, Target, DEFAULT_MARKER,
};
