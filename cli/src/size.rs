//! Memory sizes as users type them for `--memory`.

/// Clap value parser for `64G`, `512M` or `1T`, to whole GB.
///
/// Units are binary (1T = 1024G, 1024M = 1G) as on every node's `free -g`; megabytes
/// round up because asking for less memory than the job needs gets it killed. `GB`,
/// `Gi`, `GiB` and lower case are accepted so that pasted values from other schedulers
/// work; clap adds the flag's name to the message.
///
/// A number without a unit is refused (but 0, which needs none): Slurm's `--mem 64`
/// means megabytes, so a pasted bare number would be taken 1024 times too large if
/// it were read as gigabytes.
pub fn parse_gb(s: &str) -> Result<u32, String> {
    const EXPECTED: &str = "expected a size like 64G, 512M (rounded up to whole GB) or 1T";
    let t = s.trim();
    let digits = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(digits);
    let n: u64 = num.parse().map_err(|_| EXPECTED.to_string())?;
    let unit = unit.to_ascii_lowercase();
    let unit = unit
        .strip_suffix("ib")
        .or_else(|| unit.strip_suffix('i'))
        .or_else(|| unit.strip_suffix('b'))
        .unwrap_or(&unit);
    let gb = match unit {
        "" if n == 0 => Some(0),
        "" => {
            return Err(format!(
                "{n} has no unit: write {n}G for gigabytes (or {n}M, {n}T); a bare number is ambiguous (Slurm's --mem reads it as megabytes)"
            ))
        }
        "g" => Some(n),
        "m" => Some(n.div_ceil(1_024)),
        "t" => n.checked_mul(1_024),
        _ => return Err(EXPECTED.to_string()),
    };
    gb.and_then(|g| u32::try_from(g).ok())
        .ok_or_else(|| format!("{s} is more memory than any node has"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_what_users_type() {
        assert_eq!(parse_gb("64G"), Ok(64));
        assert_eq!(parse_gb("1T"), Ok(1_024));
        assert_eq!(parse_gb("2t"), Ok(2_048));
        assert_eq!(parse_gb("64g"), Ok(64));
        assert_eq!(parse_gb("64GB"), Ok(64));
        assert_eq!(parse_gb("64Gi"), Ok(64));
        assert_eq!(parse_gb("64GiB"), Ok(64));
        assert_eq!(parse_gb("0"), Ok(0));
    }

    #[test]
    fn megabytes_round_up_to_whole_gigabytes() {
        assert_eq!(parse_gb("512M"), Ok(1));
        assert_eq!(parse_gb("1024M"), Ok(1));
        assert_eq!(parse_gb("1025M"), Ok(2));
        assert_eq!(parse_gb("0M"), Ok(0));
        assert_eq!(parse_gb("1m"), Ok(1));
    }

    #[test]
    fn refuses_garbage_and_says_what_is_expected() {
        for bad in ["", "G", "12Q", "-1G", "1.5T", "64 G", "64GG", "sixty"] {
            let e = parse_gb(bad).expect_err(bad);
            assert!(e.contains("64G, 512M"), "{bad}: {e}");
        }
    }

    #[test]
    fn a_bare_number_needs_a_unit() {
        let e = parse_gb("64").expect_err("no unit");
        assert!(
            e.starts_with("64 has no unit: write 64G for gigabytes"),
            "{e}"
        );
        assert!(e.contains("megabytes"), "{e}");
        assert_eq!(parse_gb("0"), Ok(0));
    }

    #[test]
    fn refuses_sizes_that_do_not_fit() {
        assert!(parse_gb("4294967296G").is_err());
        assert!(parse_gb("4194304T").is_err());
        assert!(parse_gb("99999999999999999999999").is_err());
        assert_eq!(parse_gb("4294967295G"), Ok(u32::MAX));
    }
}
