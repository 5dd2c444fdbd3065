//! UTC date-times to and from Unix seconds, as traces and the CLI write them (the
//! calendar is the `time` crate's).

/// `YYYY-MM-DD HH:MM:SS` (or with a `T`) as a Unix second, read as UTC; `None` for
/// any other shape or a date or time that does not exist.
pub fn parse_time(s: &str) -> Option<i64> {
    let s = s.trim();
    let b = s.as_bytes();
    if b.len() != 19
        || b[4] != b'-'
        || b[7] != b'-'
        || !(b[10] == b' ' || b[10] == b'T')
        || b[13] != b':'
        || b[16] != b':'
    {
        return None;
    }
    let num = |r: std::ops::Range<usize>| -> Option<u16> {
        let p = &s[r];
        if p.bytes().all(|c| c.is_ascii_digit()) {
            p.parse().ok()
        } else {
            None
        }
    };
    let month = time::Month::try_from(u8::try_from(num(5..7)?).ok()?).ok()?;
    let date = time::Date::from_calendar_date(
        i32::from(num(0..4)?),
        month,
        u8::try_from(num(8..10)?).ok()?,
    )
    .ok()?;
    let hms = time::Time::from_hms(
        u8::try_from(num(11..13)?).ok()?,
        u8::try_from(num(14..16)?).ok()?,
        u8::try_from(num(17..19)?).ok()?,
    )
    .ok()?;
    Some(
        time::PrimitiveDateTime::new(date, hms)
            .assume_utc()
            .unix_timestamp(),
    )
}

/// A Unix second as `YYYY-MM-DD HH:MM:SS` (UTC); the raw number when it is beyond
/// the calendar's range.
pub fn format_time(t: i64) -> String {
    format_with(t, ' ', "")
}

/// A Unix second as ISO 8601: `2026-11-29T19:20:00Z`.
pub fn iso(t: i64) -> String {
    format_with(t, 'T', "Z")
}

fn format_with(t: i64, sep: char, zone: &str) -> String {
    match time::OffsetDateTime::from_unix_timestamp(t) {
        Ok(d) => format!(
            "{:04}-{:02}-{:02}{sep}{:02}:{:02}:{:02}{zone}",
            d.year(),
            u8::from(d.month()),
            d.day(),
            d.hour(),
            d.minute(),
            d.second()
        ),
        Err(_) => t.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::{format_time, parse_time};

    #[test]
    fn times_are_utc_seconds_and_round_trip() {
        assert_eq!(parse_time("1970-01-01 00:00:00"), Some(0));
        assert_eq!(parse_time("2017-10-01 00:00:00"), Some(1_506_816_000));
        assert_eq!(parse_time("2016-02-29T23:59:59"), Some(1_456_790_399));
        for bad in [
            "2017-02-29 00:00:00",
            "2017-10-01 24:00:00",
            "2017-10-01",
            "x",
        ] {
            assert_eq!(parse_time(bad), None, "{bad}");
        }
        for t in [0, 1_506_816_045, 1_456_790_399, 4_102_444_800] {
            assert_eq!(parse_time(&format_time(t)), Some(t));
        }
    }

    #[test]
    fn every_day_from_1900_to_2200_reads_as_the_proleptic_calendar_counts_it() {
        // Days since 1970-01-01 counted by Hinnant's `days_from_civil`, the rule
        // this module's earlier own calendar followed: traces replay to the second.
        fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
            let y = if m <= 2 { y - 1 } else { y };
            let era = y.div_euclid(400);
            let yoe = y - era * 400;
            let doy = (153 * ((m + 9) % 12) + 2) / 5 + d - 1;
            era * 146_097 + yoe * 365 + yoe / 4 - yoe / 100 + doy - 719_468
        }
        let mut day = -25_567; // 1900-01-01
        for y in 1900..2200 {
            let leap = (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
            for m in 1..=12 {
                let len = match m {
                    2 if leap => 29,
                    2 => 28,
                    4 | 6 | 9 | 11 => 30,
                    _ => 31,
                };
                for d in 1..=len {
                    assert_eq!(days_from_civil(y, m, d), day);
                    let t = day * 86_400 + 13 * 3_600 + 7 * 60 + 9;
                    let text = format!("{y:04}-{m:02}-{d:02} 13:07:09");
                    assert_eq!(parse_time(&text), Some(t), "{text}");
                    assert_eq!(format_time(t), text);
                    day += 1;
                }
            }
        }
    }
}
