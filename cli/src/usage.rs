//! Usage problems clap cannot express, checked before anything is asked of an agent
//! or of allotd, and reported like clap's own (exit 2).

use crate::duration::exact;

/// A usage problem clap cannot express, reported like clap's own (exit 2).
pub struct Usage {
    /// The subcommand path whose usage line to show, e.g. `["lease", "start"]`.
    pub path: &'static [&'static str],
    /// What is wrong and how to say it right.
    pub message: String,
}

/// Clap value parser: the hook's kind only; the agent checks the rest and says why.
pub(crate) fn parse_hook(s: &str) -> Result<String, String> {
    let known = ["signal:", "exec:", "http:"];
    match known.iter().find(|k| s.starts_with(*k)) {
        Some(k) if s.len() > k.len() => Ok(s.to_string()),
        _ => Err("expected signal:NAME (e.g. signal:USR1), exec:CMD or http:URL".into()),
    }
}

/// A warning before the time limit as `--signal` takes it: `SIG[@DURATION]` (Slurm's
/// `--signal`), the signal by name (`USR2`, `SIGUSR1`), the lead a duration (`5m`,
/// `300` seconds); without `@`, 60 s as in Slurm. Returns the name and the lead.
pub(crate) fn parse_signal(s: &str) -> Result<(String, u64), String> {
    let (name, lead) = match s.split_once('@') {
        Some((n, d)) => (
            n,
            crate::duration::parse(d).map_err(|e| format!("after @: {e}"))?,
        ),
        None => (s, 60),
    };
    let sig = allot_checkpoint_hooks::signal_named(name)
        .filter(|_| !name.is_empty())
        .ok_or_else(|| format!("{name:?} is not a signal; give SIG[@DURATION], e.g. USR2@5m"))?;
    // KILL and STOP cannot be caught: a warning nobody can hear is refused here.
    if matches!(
        sig,
        nix::sys::signal::Signal::SIGKILL | nix::sys::signal::Signal::SIGSTOP
    ) {
        return Err(format!(
            "{name} cannot be caught, so it warns nobody; use e.g. USR2@5m"
        ));
    }
    Ok((sig.as_str().trim_start_matches("SIG").to_string(), lead))
}

/// `--signal` without `--time-limit`: there is no limit to warn before.
pub(crate) fn check_signal(
    path: &'static [&'static str],
    signal: Option<&(String, u64)>,
    time_limit: Option<u64>,
) -> Result<(), Usage> {
    match (signal, time_limit) {
        (Some((name, _)), None) => Err(Usage {
            path,
            message: format!(
                "--signal {name} warns before the time limit, and there is none: add --time-limit"
            ),
        }),
        _ => Ok(()),
    }
}

/// `--min-runtime` longer than `--time-limit`: the contract cannot be kept, so it is
/// refused before anything is asked (`lease start` and `submit` say it alike).
pub(crate) fn check_contract(
    path: &'static [&'static str],
    min_runtime: u64,
    time_limit: Option<u64>,
) -> Result<(), Usage> {
    match time_limit {
        Some(limit) if min_runtime > limit => Err(Usage {
            path,
            message: format!(
                "--min-runtime {} is longer than --time-limit {}: the work would be killed before its protection ends",
                exact(min_runtime),
                exact(limit)
            ),
        }),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn contracts_that_cannot_be_kept_are_refused() {
        let e = check_contract(&["submit"], 7_200, Some(3_600)).expect_err("refused");
        assert_eq!(
            e.message,
            "--min-runtime 2h is longer than --time-limit 1h: the work would be killed before its protection ends"
        );
        assert!(check_contract(&["submit"], 3_600, Some(3_600)).is_ok());
        assert!(check_contract(&["submit"], 7_200, None).is_ok());
    }

    #[test]
    fn signals_are_read_as_slurm_writes_them() {
        assert_eq!(parse_signal("USR2@5m"), Ok(("USR2".into(), 300)));
        assert_eq!(parse_signal("sigusr1@90"), Ok(("USR1".into(), 90)));
        assert_eq!(parse_signal("TERM"), Ok(("TERM".into(), 60)));
        assert!(parse_signal("KILL@1m")
            .unwrap_err()
            .contains("cannot be caught"));
        assert!(parse_signal("BOGUS@1m")
            .unwrap_err()
            .contains("SIG[@DURATION]"));
        assert!(parse_signal("USR2@soon")
            .unwrap_err()
            .starts_with("after @"));
        let e = check_signal(&["submit"], Some(&("USR2".into(), 60)), None).expect_err("no limit");
        assert!(e.message.contains("add --time-limit"), "{}", e.message);
        assert!(check_signal(&["submit"], Some(&("USR2".into(), 60)), Some(600)).is_ok());
    }

    #[test]
    fn hook_kinds_are_checked_before_the_call() {
        assert!(parse_hook("signal:USR1").is_ok());
        assert!(parse_hook("exec:/bin/ckpt --now").is_ok());
        assert!(parse_hook("http:http://127.0.0.1:9/ckpt").is_ok());
        assert!(parse_hook("USR1").is_err());
        assert!(parse_hook("signal:").is_err());
    }
}
