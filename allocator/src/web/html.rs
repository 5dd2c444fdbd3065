//! HTML building blocks: escaping, the page frame (navigation, who is logged in,
//! the logout form), numbers and durations as people read them, and inline SVG
//! bars. Every text that comes from a user or a host goes through [`esc`].

use std::fmt::Write;

/// `s` safe inside HTML text and double-quoted attributes.
pub fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// `s` as one path segment of a URL (project names, ids, node names).
pub fn url_part(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(b as char);
        } else {
            let _ = write!(out, "%{b:02X}");
        }
    }
    out
}

/// Who sees the page: their name and their session's CSRF secret.
pub struct Viewer<'a> {
    /// The user.
    pub user: &'a str,
    /// What forms carry.
    pub csrf: &'a str,
}

/// The hidden field every form of a session carries.
pub fn csrf_field(csrf: &str) -> String {
    format!(r#"<input type="hidden" name="csrf" value="{}">"#, esc(csrf))
}

/// A whole page: the frame around `body`. `refresh`: the page reloads itself
/// every so many seconds (allot.js), 0 for never.
pub fn page(title: &str, viewer: Option<&Viewer<'_>>, refresh: u32, body: &str) -> String {
    let nav = match viewer {
        Some(v) => format!(
            r#"<nav><a href="/">Org tree</a><a href="/nodes">Nodes</a><a href="/usage">Usage</a><span class="who">{user}</span><form method="post" action="/logout" class="inline">{csrf}<button type="submit">Log out</button></form></nav>"#,
            user = esc(v.user),
            csrf = csrf_field(v.csrf),
        ),
        None => "<nav><span>allot</span></nav>".to_string(),
    };
    format!(
        r#"<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width">
<title>{title} · allot</title><link rel="icon" href="data:,"><link rel="stylesheet" href="/static/allot.css">
<script src="/static/allot.js" defer></script></head>
<body data-refresh="{refresh}">{nav}<main><h1>{title}</h1>
{body}</main></body></html>
"#,
        title = esc(title),
    )
}

/// A number of GPU-hours, as tables show them.
pub fn hours(h: f64) -> String {
    if h >= 100.0 {
        format!("{h:.0}")
    } else {
        format!("{h:.1}")
    }
}

/// A share, as a percentage.
pub fn pct(x: f64) -> String {
    format!("{:.1}%", x * 100.0)
}

/// A duration as the CLI says it (`45s`, `3h05m`).
pub fn duration(secs: u64) -> String {
    allot_units::format_duration(secs)
}

/// A Unix time as UTC to the minute (`2026-12-05 19:49`), or `-` for none.
pub fn time(unix: i64) -> String {
    if unix <= 0 {
        return "-".into();
    }
    let full = allot_common::utc::format_time(unix);
    full.get(..16).map_or(full.clone(), str::to_string)
}

/// The date of a Unix time (`2026-12-05`).
pub fn date(unix: i64) -> String {
    let full = allot_common::utc::format_time(unix);
    full.get(..10).map_or(full.clone(), str::to_string)
}

/// Two bars in one SVG: what was received against what was entitled, on a scale
/// where `max` fills the width.
pub fn received_bar(received: f64, entitled: f64, max: f64) -> String {
    const W: f64 = 160.0;
    let scale = |x: f64| {
        if max > 0.0 {
            (x / max * W).clamp(0.0, W)
        } else {
            0.0
        }
    };
    let (r, e) = (scale(received), scale(entitled));
    let class = if received + 1e-9 < entitled * 0.9 {
        "below"
    } else if received > entitled * 1.1 {
        "over"
    } else {
        "even"
    };
    format!(
        r#"<svg class="bar" width="{W}" height="14" role="img" aria-label="received {} of {} GPU-hours"><rect class="entitled" x="0" y="1" width="{e:.1}" height="12"/><rect class="received {class}" x="0" y="4" width="{r:.1}" height="6"/></svg>"#,
        hours(received),
        hours(entitled),
    )
}

/// A stacked column chart: one column per period, one colour per key (at most 8
/// named, the rest as "other"), heights in GPU-hours.
pub fn columns(periods: &[(String, Vec<(usize, f64)>)], keys: &[String]) -> String {
    const H: f64 = 160.0;
    const COL: f64 = 22.0;
    let top = periods
        .iter()
        .map(|(_, v)| v.iter().map(|(_, h)| h).sum::<f64>())
        .fold(0.0_f64, f64::max);
    let width = (periods.len() as f64 * COL).max(COL) + 60.0;
    let mut svg = format!(
        r#"<svg class="columns" width="{width:.0}" height="{}" role="img" aria-label="GPU-hours per day">"#,
        H + 30.0
    );
    let _ = write!(
        svg,
        r#"<text x="0" y="12" class="axis">{} GPU-h</text>"#,
        hours(top)
    );
    for (i, (label, parts)) in periods.iter().enumerate() {
        let x = 50.0 + i as f64 * COL;
        let mut y = H + 14.0;
        for (k, h) in parts {
            let hgt = if top > 0.0 { h / top * H } else { 0.0 };
            y -= hgt;
            let _ = write!(
                svg,
                r#"<rect class="k{}" x="{x:.0}" y="{y:.1}" width="{:.0}" height="{hgt:.1}"><title>{} {}: {} GPU-h</title></rect>"#,
                k % 8,
                COL - 4.0,
                esc(label),
                esc(keys.get(*k).map_or("other", String::as_str)),
                hours(*h)
            );
        }
        if i % 7 == 0 || periods.len() <= 8 {
            let _ = write!(
                svg,
                r#"<text x="{x:.0}" y="{}" class="axis">{}</text>"#,
                H + 28.0,
                esc(label.get(5..).unwrap_or(label))
            );
        }
    }
    svg.push_str("</svg>");
    let mut legend = String::from(r#"<p class="legend">"#);
    for (k, name) in keys.iter().enumerate() {
        let _ = write!(
            legend,
            r#"<span class="swatch k{}"></span>{} "#,
            k % 8,
            esc(name)
        );
    }
    legend.push_str("</p>");
    svg + &legend
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn markup_and_quotes_are_escaped() {
        assert_eq!(
            esc(r#"<script>"a"&'b'</script>"#),
            "&lt;script&gt;&quot;a&quot;&amp;&#39;b&#39;&lt;/script&gt;"
        );
        assert_eq!(url_part("a b/c"), "a%20b%2Fc");
    }

    #[test]
    fn times_and_durations_read_as_people_write_them() {
        assert_eq!(time(0), "-");
        assert_eq!(time(1_796_500_140), "2026-12-05 19:49");
        assert_eq!(date(951_782_400), "2000-02-29");
        assert_eq!(duration(3 * 3600 + 5 * 60), "3h05m");
    }

    #[test]
    fn a_page_escapes_its_title_and_carries_the_csrf_secret() {
        let v = Viewer {
            user: "ana<",
            csrf: "csrf_x\"y",
        };
        let p = page("<b>", Some(&v), 0, "body");
        assert!(p.contains("<title>&lt;b&gt; · allot</title>"), "{p}");
        assert!(p.contains("ana&lt;"), "{p}");
        assert!(p.contains(r#"value="csrf_x&quot;y""#), "{p}");
    }
}
