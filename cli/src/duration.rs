//! Durations and instants as operators type and read them.

use std::time::{SystemTime, UNIX_EPOCH};

/// Clap value parser for `90s`, `10m`, `2h`, `7d` or plain seconds.
///
/// Reuses the policy core's parser so that `allot` and the config files agree on
/// what a duration is; clap adds the flag's name to the message.
pub fn parse(s: &str) -> Result<u64, String> {
    allot_units::parse_duration(s).map_err(|e| e.to_string())
}

/// Clap value parser for a job's runtime (`--min-runtime`, `--time-limit`), in the
/// forms Slurm users type as well as allot's: `8h`, `1h30m`, `1.5h`, `90min`,
/// `2days`; Slurm's `MM:SS`, `HH:MM:SS`, `D-HH`, `D-HH:MM`, `D-HH:MM:SS`. A bare
/// number other than 0 is refused: Slurm reads `-t 10` as minutes, allot's other
/// flags as seconds, so it says which is meant.
pub fn parse_job(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let hint = "write it with a unit (90s, 10m, 1.5h, 2d) or as Slurm does (MM:SS, HH:MM:SS, D-HH, D-HH:MM:SS)";
    if t == "0" {
        return Ok(0);
    }
    if !t.is_empty() && t.chars().all(|c| c.is_ascii_digit()) {
        return Err(format!(
            "{t:?} has no unit: Slurm reads a bare number as minutes, allot as seconds; write {t}m or {t}s ({hint})"
        ));
    }
    if t.contains(':') || t.contains('-') {
        return slurm_clock(t).ok_or_else(|| format!("{s:?} is not a duration; {hint}"));
    }
    with_units(t).ok_or_else(|| format!("{s:?} is not a duration; {hint}"))
}

/// Clap value parser for `--begin`, as `sbatch --begin` reads it (UTC): `now`,
/// `now+DURATION` (`now+1h`, `now+90min`), `YYYY-MM-DD`, `YYYY-MM-DDTHH:MM[:SS]`,
/// or `HH:MM[:SS]` (today, or tomorrow once that time has passed). A Unix second.
pub fn parse_begin(s: &str) -> Result<i64, String> {
    parse_begin_at(s, now_ms() / 1000)
}

/// Clap value parser for `--since`/`--until` of history and usage: a duration back
/// from now (`7d`, `36h`, as `sacct -S now-7days`) or a time as `--begin` takes it
/// (`2026-12-01`, `2026-12-01T08:00`, `now`). A Unix second.
pub fn parse_since(s: &str) -> Result<i64, String> {
    let now = now_ms() / 1000;
    match allot_units::parse_duration(s.trim()) {
        Ok(d) if !s.trim().chars().all(|c| c.is_ascii_digit()) => {
            Ok(now - i64::try_from(d).unwrap_or(i64::MAX / 2))
        }
        _ => parse_begin_at(s, now).map_err(|_| {
            format!("{s:?} is neither a duration back from now (7d, 36h) nor a time (2026-12-01, 2026-12-01T08:00, now)")
        }),
    }
}

fn parse_begin_at(s: &str, now: i64) -> Result<i64, String> {
    let hint = "use now, now+1h, 16:00, 2026-12-24 or 2026-12-24T16:00 (UTC)";
    let t = s.trim();
    if t == "now" {
        return Ok(now);
    }
    if let Some(d) = t.strip_prefix("now+") {
        let secs = parse_job(d).map_err(|e| format!("{s:?}: {e}"))?;
        return Ok(now + i64::try_from(secs).unwrap_or(i64::MAX / 2));
    }
    let bad = || format!("{s:?} is not a time; {hint}");
    let day = now - now.rem_euclid(86_400);
    if !t.contains('-') {
        let parts: Vec<&str> = t.split(':').collect();
        if !(2..=3).contains(&parts.len()) {
            return Err(bad());
        }
        let mut secs = 0i64;
        for (p, (mul, max)) in parts.iter().zip([(3_600, 23), (60, 59), (1, 59)]) {
            let v: i64 = p.parse().map_err(|_| bad())?;
            if p.is_empty() || v > max || v < 0 {
                return Err(bad());
            }
            secs += v * mul;
        }
        let today = day + secs;
        return Ok(if today <= now { today + 86_400 } else { today });
    }
    let full = match t.len() {
        10 => format!("{t} 00:00:00"),
        16 => format!("{t}:00"),
        _ => t.to_string(),
    };
    allot_common::utc::parse_time(&full).ok_or_else(bad)
}

/// Slurm's clock forms: `MM:SS`, `HH:MM:SS`, `D-HH`, `D-HH:MM`, `D-HH:MM:SS`.
fn slurm_clock(t: &str) -> Option<u64> {
    let num = |p: &str| -> Option<u64> {
        (!p.is_empty() && p.chars().all(|c| c.is_ascii_digit()))
            .then(|| p.parse().ok())
            .flatten()
    };
    let (days, clock) = match t.split_once('-') {
        Some((d, rest)) => (num(d)?, rest),
        None => (0, t),
    };
    let parts: Vec<u64> = clock.split(':').map(num).collect::<Option<_>>()?;
    let (h, m, sec) = match (t.contains('-'), parts.as_slice()) {
        (true, [h]) => (*h, 0, 0),
        (true, [h, m]) => (*h, *m, 0),
        (_, [h, m, sec]) => (*h, *m, *sec),
        (false, [m, sec]) => (0, *m, *sec),
        _ => return None,
    };
    days.checked_mul(86_400)?
        .checked_add(h.checked_mul(3_600)?)?
        .checked_add(m.checked_mul(60)?)?
        .checked_add(sec)
}

/// Numbers with units, decimals allowed: `1.5h`, `90min`, `1h30m`, `2 days`.
fn with_units(t: &str) -> Option<u64> {
    let mut total = 0f64;
    let mut rest = t.trim();
    if rest.is_empty() {
        return None;
    }
    while !rest.is_empty() {
        let n_end = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let n: f64 = rest[..n_end].parse().ok()?;
        rest = rest[n_end..].trim_start();
        let u_end = rest
            .find(|c: char| !c.is_ascii_alphabetic())
            .unwrap_or(rest.len());
        let unit = match rest[..u_end].to_ascii_lowercase().as_str() {
            "s" | "sec" | "secs" | "second" | "seconds" => 1.0,
            "m" | "min" | "mins" | "minute" | "minutes" => 60.0,
            "h" | "hr" | "hrs" | "hour" | "hours" => 3_600.0,
            "d" | "day" | "days" => 86_400.0,
            "w" | "week" | "weeks" => 604_800.0,
            _ => return None,
        };
        total += n * unit;
        rest = rest[u_end..].trim_start();
    }
    // Whole seconds; beyond 2^53 s (285 million years) nothing is meant.
    (total.is_finite() && total < 9.0e15).then(|| total.round() as u64)
}

/// Milliseconds since the Unix epoch, now.
pub fn now_ms() -> i64 {
    // A clock before 1970 is a broken host; showing ages from 0 is the least harm.
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

/// A span for a table cell: `45s`, `3m12s`, `2h05m`, `3d04h` (the core's formatter,
/// so tables and explanations read alike).
pub use allot_units::format_duration as age;

/// A declared duration exactly, in the form `--min-runtime` takes: `8h`, `2d`, `90m`,
/// `45s`; unlike [`age`] nothing is rounded away, so it can be typed back.
pub fn exact(secs: u64) -> String {
    // Remainders matched rather than `is_multiple_of`, which is newer than the MSRV.
    match (secs % 86_400, secs % 3_600, secs % 60) {
        _ if secs == 0 => "0".into(),
        (0, _, _) => format!("{}d", secs / 86_400),
        (_, 0, _) => format!("{}h", secs / 3_600),
        (_, _, 0) => format!("{}m", secs / 60),
        _ => format!("{secs}s"),
    }
}

/// Milliseconds as whole seconds, rounded up, so that a span still running never
/// reads `0s`.
pub fn ms_to_secs_ceil(ms: i64) -> u64 {
    u64::try_from(ms.max(0)).unwrap_or(0).div_ceil(1_000)
}

/// Unix seconds as UTC ISO-8601: `2026-11-29T19:20:00Z`.
pub use allot_common::utc::iso as iso_utc;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn begin_times_read_as_sbatch_reads_them() {
        let now = 1_764_936_000; // 2025-12-05 12:00:00 UTC
        assert_eq!(parse_begin_at("now", now), Ok(now));
        assert_eq!(parse_begin_at("now+1h", now), Ok(now + 3_600));
        assert_eq!(parse_begin_at("16:00", now), Ok(now + 4 * 3_600));
        assert_eq!(parse_begin_at("11:00", now), Ok(now + 23 * 3_600));
        assert_eq!(parse_begin_at("2025-12-24", now), Ok(1_766_534_400));
        assert_eq!(parse_begin_at("2025-12-24T16:00", now), Ok(1_766_592_000));
        for bad in ["tomorrowish", "25:00", "now+10", "2025-13-01", "1:2:3:4"] {
            assert!(parse_begin_at(bad, now).is_err(), "{bad}");
        }
    }

    #[test]
    fn parses_what_operators_type() {
        assert_eq!(parse("90s"), Ok(90));
        assert_eq!(parse("10m"), Ok(600));
        assert_eq!(parse("2h"), Ok(7_200));
        assert_eq!(parse("7d"), Ok(604_800));
        assert_eq!(parse("45"), Ok(45));
        assert_eq!(parse("0"), Ok(0));
    }

    #[test]
    fn refuses_garbage_and_says_what_is_expected() {
        for bad in ["", "10x", "m", "-5m", "1.5h", "ten minutes"] {
            let e = parse(bad).expect_err(bad);
            assert!(e.contains("90s, 10m"), "{bad}: {e}");
        }
    }

    #[test]
    fn job_runtimes_take_slurms_forms_and_decimal_units() {
        for (text, secs) in [
            ("0", 0),
            ("8h", 28_800),
            ("1h30m", 5_400),
            ("1.5h", 5_400),
            ("90min", 5_400),
            ("2days", 172_800),
            ("45 sec", 45),
            ("0.5d", 43_200),
            // Slurm: minutes:seconds, hours:minutes:seconds, days-hours[:minutes[:seconds]]
            ("10:30", 630),
            ("01:00:00", 3_600),
            ("2-00:00:00", 172_800),
            ("1-12", 129_600),
            ("1-12:30", 131_400),
            ("0-00:00:05", 5),
        ] {
            assert_eq!(parse_job(text), Ok(secs), "{text}");
        }
    }

    #[test]
    fn a_bare_number_says_which_unit_is_meant() {
        let e = parse_job("10").expect_err("ambiguous");
        assert!(
            e.contains("Slurm reads a bare number as minutes") && e.contains("10m or 10s"),
            "{e}"
        );
        for bad in [
            "",
            "1:2:3:4",
            "1-",
            "-5",
            "1.5x",
            "h",
            "1..5h",
            "1-2:3:4:5",
            "ten",
        ] {
            let e = parse_job(bad).expect_err(bad);
            assert!(e.contains("HH:MM:SS"), "{bad}: {e}");
        }
    }

    #[test]
    fn ages_read_like_people_write_them() {
        assert_eq!(age(0), "0s");
        assert_eq!(age(59), "59s");
        assert_eq!(age(192), "3m12s");
        assert_eq!(age(3_600 + 5 * 60 + 9), "1h05m");
        assert_eq!(age(3 * 86_400 + 4 * 3_600), "3d04h");
    }

    #[test]
    fn exact_durations_parse_back() {
        for (secs, text) in [
            (0, "0"),
            (45, "45s"),
            (5_400, "90m"),
            (28_800, "8h"),
            (172_800, "2d"),
            (90_061, "90061s"),
        ] {
            assert_eq!(exact(secs), text);
            assert_eq!(parse(text), Ok(secs));
        }
    }

    #[test]
    fn rounds_time_left_up() {
        assert_eq!(ms_to_secs_ceil(-5), 0);
        assert_eq!(ms_to_secs_ceil(0), 0);
        assert_eq!(ms_to_secs_ceil(1), 1);
        assert_eq!(ms_to_secs_ceil(60_000), 60);
        assert_eq!(ms_to_secs_ceil(60_001), 61);
    }

    #[test]
    fn formats_utc_iso_8601() {
        assert_eq!(iso_utc(0), "1970-01-01T00:00:00Z");
        assert_eq!(iso_utc(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(iso_utc(1_709_164_799), "2024-02-28T23:59:59Z");
        assert_eq!(iso_utc(1_709_251_200), "2024-03-01T00:00:00Z");
        assert_eq!(iso_utc(1_795_980_000), "2026-11-29T19:20:00Z");
        assert_eq!(iso_utc(1_798_572_000), "2026-12-29T19:20:00Z");
        assert_eq!(iso_utc(-1), "1969-12-31T23:59:59Z");
        assert_eq!(iso_utc(4_102_444_800), "2100-01-01T00:00:00Z");
    }
}
