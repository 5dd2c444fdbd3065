//! Host lists as Slurm writes them (`--nodelist`, `--exclude`): names separated by
//! commas, with bracketed ranges that keep their zero padding, `gpu[01-04,07],login1`.
//! The CLI expands them; allotd receives and stores plain names.

/// Most hosts one list may name.
pub const MAX_HOSTS: usize = 1024;

/// The names `s` stands for, in order, each once; the error says what is wrong.
pub fn expand(s: &str) -> Result<Vec<String>, String> {
    let mut out: Vec<String> = Vec::new();
    for part in top_level(s)? {
        let part = part.trim();
        if part.is_empty() {
            continue;
        }
        for name in expand_one(part)? {
            if !out.contains(&name) {
                out.push(name);
            }
            if out.len() > MAX_HOSTS {
                return Err(format!(
                    "more than {MAX_HOSTS} hosts; name fewer, or select nodes by --gpu-type, --constraint or --cluster"
                ));
            }
        }
    }
    Ok(out)
}

/// `s` split at the commas outside brackets.
fn top_level(s: &str) -> Result<Vec<&str>, String> {
    let (mut parts, mut depth, mut from) = (Vec::new(), 0u32, 0);
    for (i, c) in s.char_indices() {
        match c {
            '[' if depth == 0 => depth = 1,
            '[' => return Err(format!("{s:?}: brackets do not nest; write gpu[01-04]")),
            ']' if depth == 1 => depth = 0,
            ']' => return Err(format!("{s:?}: a ] without its [")),
            ',' if depth == 0 => {
                parts.push(&s[from..i]);
                from = i + 1;
            }
            _ => {}
        }
    }
    if depth != 0 {
        return Err(format!("{s:?}: a [ without its ]"));
    }
    parts.push(&s[from..]);
    Ok(parts)
}

/// One name, with at most one bracketed list of numbers and ranges.
fn expand_one(part: &str) -> Result<Vec<String>, String> {
    let Some((prefix, rest)) = part.split_once('[') else {
        return Ok(vec![part.to_string()]);
    };
    let (inner, suffix) = rest
        .split_once(']')
        .ok_or_else(|| format!("{part:?}: a [ without its ]"))?;
    if suffix.contains('[') {
        return Err(format!(
            "{part:?}: one bracketed range per name; write gpu[01-04]"
        ));
    }
    let mut names = Vec::new();
    for r in inner.split(',') {
        let r = r.trim();
        let (lo, hi) = r.split_once('-').unwrap_or((r, r));
        let width = lo.len();
        let num = |v: &str| {
            v.parse::<u64>()
                .map_err(|_| format!("{part:?}: {r:?} is not a number or a range such as 01-04"))
        };
        let (a, b) = (num(lo)?, num(hi)?);
        if a > b {
            return Err(format!("{part:?}: the range {r:?} runs backwards"));
        }
        if b - a >= MAX_HOSTS as u64 {
            return Err(format!("{part:?}: more than {MAX_HOSTS} hosts"));
        }
        names.extend((a..=b).map(|n| format!("{prefix}{n:0width$}{suffix}")));
    }
    Ok(names)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_keep_their_padding_and_names_come_once() {
        assert_eq!(
            expand("gpu[01-03,07],login1,gpu02").unwrap(),
            ["gpu01", "gpu02", "gpu03", "gpu07", "login1"]
        );
        assert_eq!(expand("n[8-10]-ib").unwrap(), ["n8-ib", "n9-ib", "n10-ib"]);
        assert_eq!(expand(" a , ,b").unwrap(), ["a", "b"]);
    }

    #[test]
    fn malformed_lists_say_what_is_wrong() {
        for (bad, says) in [
            ("gpu[01-04", "without its ]"),
            ("gpu01-04]", "without its ["),
            ("gpu[04-01]", "backwards"),
            ("gpu[a-b]", "not a number"),
            ("gpu[[1]]", "do not nest"),
            ("n[0-5000]", "more than 1024"),
        ] {
            let e = expand(bad).unwrap_err();
            assert!(e.contains(says), "{bad}: {e}");
        }
    }
}
