//! Plain-text tables for operators' terminals.

/// Renders a header and rows as left-aligned columns two spaces apart.
///
/// The last column is not padded so that long messages do not leave trailing
/// blanks; widths count characters, not bytes, so UTF-8 reasons line up.
pub fn render(headers: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    let mut line = |cells: &mut dyn Iterator<Item = &str>| {
        let mut l = String::new();
        for (i, (cell, w)) in cells.zip(&widths).enumerate() {
            if i > 0 {
                l.push_str("  ");
            }
            l.push_str(cell);
            if i + 1 < widths.len() {
                l.push_str(&" ".repeat(w - cell.chars().count()));
            }
        }
        out.push_str(l.trim_end());
        out.push('\n');
    };
    line(&mut headers.iter().copied());
    for row in rows {
        line(&mut row.iter().map(String::as_str));
    }
    out
}

/// Bytes for a table cell: `512B`, `64K`, `1.2G`.
pub fn bytes(n: u64) -> String {
    const UNITS: [&str; 6] = ["B", "K", "M", "G", "T", "P"];
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{n}B")
    } else if v < 9.95 {
        format!("{v:.1}{}", UNITS[u])
    } else {
        format!("{v:.0}{}", UNITS[u])
    }
}

/// An empty string as `-`, so that columns never look shifted.
pub fn or_dash(s: &str) -> String {
    if s.is_empty() {
        "-".into()
    } else {
        s.into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_line_up_and_the_last_is_not_padded() {
        let t = render(
            &["ID", "STATE", "MESSAGE"],
            &[
                vec!["L-1".into(), "running".into(), "ok".into()],
                vec!["L-10".into(), "ended".into(), "exited 0".into()],
            ],
        );
        assert_eq!(
            t,
            "ID    STATE    MESSAGE\nL-1   running  ok\nL-10  ended    exited 0\n"
        );
    }

    #[test]
    fn bytes_are_human() {
        assert_eq!(bytes(0), "0B");
        assert_eq!(bytes(512), "512B");
        assert_eq!(bytes(64 * 1024), "64K");
        assert_eq!(bytes(1_288_490_189), "1.2G");
        assert_eq!(bytes(300 * 1024 * 1024), "300M");
    }
}
