//! Virtual time: whole seconds on a clock the caller owns (the units are
//! `allot-units`', shared with the daemons and the CLI).

pub use allot_units::*;
