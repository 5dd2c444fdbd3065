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
    fn hook_kinds_are_checked_before_the_call() {
        assert!(parse_hook("signal:USR1").is_ok());
        assert!(parse_hook("exec:/bin/ckpt --now").is_ok());
        assert!(parse_hook("http:http://127.0.0.1:9/ckpt").is_ok());
        assert!(parse_hook("USR1").is_err());
        assert!(parse_hook("signal:").is_err());
    }
}
