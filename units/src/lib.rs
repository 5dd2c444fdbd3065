//! allot's units: whole seconds and the duration strings people type.
//!
//! The policy core never reads a wall clock; every entry point takes `now`. Seconds
//! are exact integers so that the same inputs give the same decisions byte for byte.
//! A leaf: the core, the daemons and the CLI share it without linking each other.

use serde::{de, Deserialize, Deserializer};
use std::fmt;

/// An instant, in seconds since an epoch chosen by the caller.
pub type Time = u64;
/// A span of time in seconds.
pub type Secs = u64;

/// Longest min runtime or time limit accepted: a year.
pub const MAX_CONTRACT: Secs = 365 * 86_400;

/// One minute in seconds.
pub const MINUTE: Secs = 60;
/// One hour in seconds.
pub const HOUR: Secs = 3_600;
/// One day in seconds.
pub const DAY: Secs = 86_400;

/// Why a duration string was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid duration {input:?}: expected a number with a unit, such as 90s, 10m, 8h or 7d")]
pub struct DurationError {
    /// The text that did not parse.
    pub input: String,
}

/// Parses `90s`, `10m`, `8h`, `7d`, `1h30m` or a bare number of seconds.
pub fn parse_duration(input: &str) -> Result<Secs, DurationError> {
    let err = || DurationError {
        input: input.to_string(),
    };
    let s = input.trim();
    if s.is_empty() {
        return Err(err());
    }
    if let Ok(n) = s.parse::<u64>() {
        return Ok(n);
    }
    let mut total: u64 = 0;
    let mut num: Option<u64> = None;
    for c in s.chars() {
        if let Some(d) = c.to_digit(10) {
            num = Some(
                num.unwrap_or(0)
                    .checked_mul(10)
                    .and_then(|n| n.checked_add(u64::from(d)))
                    .ok_or_else(err)?,
            );
            continue;
        }
        let unit = match c {
            's' => 1,
            'm' => MINUTE,
            'h' => HOUR,
            'd' => DAY,
            'w' => 7 * DAY,
            _ => return Err(err()),
        };
        let n = num.take().ok_or_else(err)?;
        total = n
            .checked_mul(unit)
            .and_then(|v| total.checked_add(v))
            .ok_or_else(err)?;
    }
    if num.is_some() {
        return Err(err());
    }
    Ok(total)
}

/// Formats seconds the way people read them, to two units: `45s`, `3m12s`, `2h05m`,
/// `3d04h` (the CLI's tables and the explanations use this one formatter).
pub fn format_duration(secs: Secs) -> String {
    struct D(Secs);
    impl fmt::Display for D {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            let s = self.0;
            if s < MINUTE {
                write!(f, "{s}s")
            } else if s < HOUR {
                write!(f, "{}m{:02}s", s / MINUTE, s % MINUTE)
            } else if s < DAY {
                write!(f, "{}h{:02}m", s / HOUR, (s % HOUR) / MINUTE)
            } else {
                write!(f, "{}d{:02}h", s / DAY, (s % DAY) / HOUR)
            }
        }
    }
    D(secs).to_string()
}

/// A start forecast as people read it, as waits from `now`: `about 40m00s, at most
/// 2h05m`; a bound of `None` lies beyond `horizon` (`not within 14d00h`).
pub fn start_words(now: i64, p50: Option<i64>, p90: Option<i64>, horizon: Secs) -> String {
    let wait = |t: i64| format_duration(t.saturating_sub(now).max(0) as Secs);
    match (p50, p90) {
        (Some(_), Some(b)) if b <= now + MINUTE as i64 => "now: at the next passes".into(),
        (Some(a), Some(b)) => format!("about {}, at most {}", wait(a), wait(b)),
        (Some(a), None) => format!(
            "about {}, at most: not within {}",
            wait(a),
            format_duration(horizon)
        ),
        (None, _) => format!("not within {}", format_duration(horizon)),
    }
}

/// Serde helper: a duration given as a string (`"8h"`) or a number of seconds.
pub fn de_duration<'de, D: Deserializer<'de>>(d: D) -> Result<Secs, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Raw {
        N(u64),
        S(String),
    }
    match Raw::deserialize(d)? {
        Raw::N(n) => Ok(n),
        Raw::S(s) => parse_duration(&s).map_err(de::Error::custom),
    }
}

/// Serde helper for an optional duration.
pub fn de_opt_duration<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Secs>, D::Error> {
    de_duration(d).map(Some)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_units_and_compounds() {
        assert_eq!(parse_duration("90s"), Ok(90));
        assert_eq!(parse_duration("10m"), Ok(600));
        assert_eq!(parse_duration("8h"), Ok(28_800));
        assert_eq!(parse_duration("7d"), Ok(604_800));
        assert_eq!(parse_duration("1h30m"), Ok(5_400));
        assert_eq!(parse_duration("0"), Ok(0));
        assert_eq!(parse_duration("42"), Ok(42));
    }

    #[test]
    fn rejects_garbage() {
        for bad in ["", "h", "10x", "5m3", "-1s", "99999999999999999999d"] {
            assert!(parse_duration(bad).is_err(), "{bad} should fail");
        }
    }

    #[test]
    fn formats_for_people() {
        assert_eq!(format_duration(30), "30s");
        assert_eq!(format_duration(41 * MINUTE), "41m00s");
        assert_eq!(format_duration(192), "3m12s");
        assert_eq!(format_duration(2 * HOUR + 5 * MINUTE), "2h05m");
        assert_eq!(format_duration(3 * DAY + 4 * HOUR), "3d04h");
    }

    #[test]
    fn a_start_forecast_reads_as_waits_from_now() {
        assert_eq!(
            start_words(1000, Some(1000 + 2400), Some(1000 + 7500), 14 * DAY),
            "about 40m00s, at most 2h05m"
        );
        assert_eq!(
            start_words(1000, Some(1000), Some(1030), 14 * DAY),
            "now: at the next passes"
        );
        assert_eq!(
            start_words(1000, Some(4600), None, 14 * DAY),
            "about 1h00m, at most: not within 14d00h"
        );
        assert_eq!(start_words(1000, None, None, 14 * DAY), "not within 14d00h");
    }
}
