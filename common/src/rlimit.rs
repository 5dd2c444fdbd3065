//! The descriptor limit: a daemon that serves many connections (allotd) or many
//! workloads' pipes (the agent) raises its soft `RLIMIT_NOFILE` to the hard limit
//! at start. The soft default of 1,024 is a limit for programs of the `select(2)`
//! era; at it allotd stopped accepting anyone once 1,100 idle connections were open.

use nix::sys::resource::{getrlimit, setrlimit, Resource};

/// Raises the soft descriptor limit to the hard one; returns the limit in force
/// after (the soft one). Nothing is changed when they are already equal: a unit's
/// `LimitNOFILE=` has set both, and a seccomp filter such as allotd's
/// `SystemCallFilter=~@resources` would kill the process for asking.
pub fn raise_nofile() -> nix::Result<u64> {
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE)?;
    if soft >= hard {
        return Ok(soft);
    }
    setrlimit(Resource::RLIMIT_NOFILE, hard, hard)?;
    Ok(hard)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_soft_limit_reaches_the_hard_one() {
        let (_, hard) = getrlimit(Resource::RLIMIT_NOFILE).expect("getrlimit");
        let now = raise_nofile().expect("raise");
        assert_eq!(now, hard);
        assert_eq!(
            getrlimit(Resource::RLIMIT_NOFILE).expect("getrlimit").0,
            hard
        );
        // A second call changes nothing and says the same.
        assert_eq!(raise_nofile().expect("raise"), hard);
    }
}
