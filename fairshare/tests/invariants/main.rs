//! Property tests of the scheduler's invariants.
//!
//! A small shell plays the agents: it remembers every lease a `Start` hands out, ends a
//! revoked lease `save` seconds after `max(now, not_before)`, lets leases finish on
//! their own, takes nodes down and GPUs out, and calls `schedule(now)` after every
//! input and at every event and wake-up. Proptest drives it with random clusters, org
//! trees, policies and operation sequences; every pass is checked against the
//! invariants below, and each property test fails only on its own kind of violation,
//! so one broken rule does not hide behind another.
//!
//! The shell's own bookkeeping (which GPUs its agents hold, which workloads it saw
//! end) is the reference: a core that agrees with itself but not with the agents
//! still fails.
//!
//! Where each part lives:
//!
//! - `harness/`: the shell and what feeds it, apart from any property.
//!   - `mod.rs`: the shell's state, the invariants (`Prop`), `run`, `assert_clean`,
//!     and the `team`/`project` specs the fixed tests build trees from.
//!   - `generate.rs`: the proptest strategies (setups, policies, operations).
//!   - `shell.rs`: the driver: operations, time, scheduling passes.
//!   - `actions.rs`: carrying out each action of a pass, with its checks.
//!   - `checks.rs`: the whole-state checks after every pass.
//! - `properties.rs`: the property tests, one invariant each, and the check that the
//!   generated cases reach every path.
//! - `convergence.rs`: long saturated runs settle at the groups' weights (property 7).
//! - `reproductions.rs`: fixed cases of what the properties found, smallest first.

mod convergence;
mod harness;
mod properties;
mod reproductions;
