//! Plain SVG plots of a simulation report, no plotting dependency.

use crate::Report;
use std::fmt::Write as _;
use std::path::Path;

const W: f64 = 900.0;
const H: f64 = 360.0;
const PAD: f64 = 50.0;
const COLORS: [&str; 8] = [
    "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#17becf",
];

fn polyline(points: &[(f64, f64)], xmax: f64, ymax: f64, color: &str) -> String {
    let mut s = String::new();
    for (x, y) in points {
        let px = PAD + x / xmax.max(f64::MIN_POSITIVE) * (W - 2.0 * PAD);
        let py = H - PAD - y / ymax.max(f64::MIN_POSITIVE) * (H - 2.0 * PAD);
        let _ = write!(s, "{px:.1},{py:.1} ");
    }
    format!("<polyline fill=\"none\" stroke=\"{color}\" stroke-width=\"1.5\" points=\"{s}\"/>\n")
}

fn frame(title: &str, xlabel: &str, ylabel: &str, body: &str, legend: &[(String, &str)]) -> String {
    let mut s = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{W}\" height=\"{H}\" font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n<text x=\"{PAD}\" y=\"20\" font-size=\"15\">{title}</text>\n<line x1=\"{PAD}\" y1=\"{y0}\" x2=\"{x1}\" y2=\"{y0}\" stroke=\"black\"/>\n<line x1=\"{PAD}\" y1=\"{PAD}\" x2=\"{PAD}\" y2=\"{y0}\" stroke=\"black\"/>\n<text x=\"{xm}\" y=\"{yl}\">{xlabel}</text>\n<text x=\"8\" y=\"{PAD}\" >{ylabel}</text>\n",
        y0 = H - PAD,
        x1 = W - PAD,
        xm = W / 2.0,
        yl = H - 15.0
    );
    s += body;
    for (i, (name, color)) in legend.iter().enumerate() {
        let y = PAD + 14.0 * i as f64;
        let _ = writeln!(
            s,
            "<text x=\"{x}\" y=\"{y}\" fill=\"{color}\">{name}</text>",
            x = W - PAD - 110.0
        );
    }
    s + "</svg>\n"
}

/// Writes `team-share.svg`, `occupancy.svg` and `wait-cdf.svg` into `dir`.
pub fn write_all(dir: &Path, r: &Report) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    let Some(tl) = &r.timeline else {
        return Ok(());
    };
    let hours = tl.hours.len().max(1) as f64;
    // Team share of busy GPUs over time, against its configured share (dashed).
    let mut body = String::new();
    let mut legend = Vec::new();
    for (i, team) in r.teams.iter().enumerate().take(COLORS.len()) {
        let c = COLORS[i];
        let pts: Vec<(f64, f64)> = tl.team_share[i]
            .iter()
            .enumerate()
            .map(|(h, v)| (h as f64, *v))
            .collect();
        body += &polyline(&pts, hours, 0.4, c);
        legend.push((team.name.clone(), c));
    }
    std::fs::write(
        dir.join("team-share.svg"),
        frame(
            "Share of busy GPUs per team (largest 8 teams)",
            "hour",
            "share (0–0.4)",
            &body,
            &legend,
        ),
    )?;
    let pts: Vec<(f64, f64)> = tl
        .occupancy
        .iter()
        .enumerate()
        .map(|(h, v)| (h as f64, *v))
        .collect();
    std::fs::write(
        dir.join("occupancy.svg"),
        frame(
            "Occupancy",
            "hour",
            "busy / capacity",
            &polyline(&pts, hours, 1.0, COLORS[0]),
            &[],
        ),
    )?;
    // Wait CDF per class from its percentiles (p50, p90, p99).
    let mut body = String::new();
    let mut legend = Vec::new();
    let xmax = r
        .wait_s
        .values()
        .map(|w| w.p99 as f64)
        .fold(1.0, f64::max)
        .log10()
        .max(1.0);
    for (i, (class, w)) in r.wait_s.iter().enumerate() {
        let c = COLORS[i % COLORS.len()];
        let lx = |s: u64| ((s.max(1)) as f64).log10();
        let pts = [
            (0.0, 0.0),
            (lx(w.p50), 0.5),
            (lx(w.p90), 0.9),
            (lx(w.p99), 0.99),
        ];
        body += &polyline(&pts, xmax, 1.0, c);
        legend.push((class.clone(), c));
    }
    std::fs::write(
        dir.join("wait-cdf.svg"),
        frame(
            "Queue wait CDF per class",
            "log10(wait seconds)",
            "fraction",
            &body,
            &legend,
        ),
    )
}
