//! `allot-sim suite --variants FILE`: each variant of the policy judged against the
//! policy itself on every scenario of the suite, by the rule that decides defaults.
//!
//! The rule: a variant is better only if, on **no** scenario, the median over the
//! seeds of worst team, mean team, GPU-hours lost or the largest gang's p90 wait is
//! worse than the base's beyond the base's own spread over the same seeds (its min
//! to max, widened by a small tolerance), and some scenario's is better beyond it.
//! Worse somewhere is a rejection, whatever it wins elsewhere: a rule that trades one
//! workload for another is not a default for every workload. A median hides one
//! seed's collapse, so the team ratios are also judged on their worst seed: the
//! variant's lowest may not fall more than 0.10 below the base's lowest (a variant that changes
//! nothing measurable moves the chaotic worst seed by up to 0.08: less is noise).

use crate::suite::{self, Entry, Figures, Spread3, SuiteArgs, Task};
use crate::PolicyKind;
use anyhow::{bail, Context, Result};
use serde::Serialize;
use std::path::Path;

/// Most variants one file may hold.
const MAX_VARIANTS: usize = 200;

/// A measure the rule reads: its name, how to read it, whether higher is better,
/// and the tolerance past the base's spread (absolute, and relative to its median).
struct Judged {
    name: &'static str,
    get: fn(&Figures) -> f64,
    higher_is_better: bool,
    abs_tol: f64,
    rel_tol: f64,
    /// Also judged on the worst seed, with this tolerance below the base's worst.
    worst_seed_tol: Option<f64>,
}

const JUDGED: [Judged; 4] = [
    Judged {
        name: "worst team",
        get: |f| f.worst_team,
        higher_is_better: true,
        abs_tol: 0.002,
        rel_tol: 0.0,
        worst_seed_tol: Some(0.10),
    },
    Judged {
        name: "mean team",
        get: |f| f.mean_team,
        higher_is_better: true,
        abs_tol: 0.002,
        rel_tol: 0.0,
        worst_seed_tol: Some(0.10),
    },
    Judged {
        name: "lost GPU-h",
        get: |f| f.lost_gpu_hours,
        higher_is_better: false,
        abs_tol: 20.0,
        rel_tol: 0.02,
        worst_seed_tol: None,
    },
    Judged {
        name: "largest gang p90 s",
        get: |f| f.largest_gang_p90_s,
        higher_is_better: false,
        abs_tol: 120.0,
        rel_tol: 0.02,
        worst_seed_tol: None,
    },
];

/// One measure of one scenario where a variant left the base's spread.
#[derive(Debug, Clone, Serialize)]
pub struct Shift {
    /// The scenario.
    pub scenario: String,
    /// The measure.
    pub measure: String,
    /// The base's median.
    pub base: f64,
    /// The variant's median.
    pub variant: f64,
}

/// What the rule says of one variant.
#[derive(Debug, Clone, Serialize)]
pub struct Judgement {
    /// Its name in the file.
    pub name: String,
    /// Its keys, as `key = value`.
    pub keys: String,
    /// `adopt`, `reject` or `no effect`.
    pub verdict: &'static str,
    /// Where it is worse beyond the spread.
    pub worse: Vec<Shift>,
    /// Where it is better beyond the spread.
    pub better: Vec<Shift>,
}

/// The rule, on one variant's figures against the base's (scenario by scenario,
/// seed by seed).
pub fn judge(
    name: &str,
    keys: &str,
    scenarios: &[String],
    base: &[Vec<Figures>],
    variant: &[Vec<Figures>],
) -> Judgement {
    let (mut worse, mut better) = (Vec::new(), Vec::new());
    for ((sc, b), v) in scenarios.iter().zip(base).zip(variant) {
        for m in &JUDGED {
            let bs = Spread3::of(&b.iter().map(m.get).collect::<Vec<_>>());
            let vs = Spread3::of(&v.iter().map(m.get).collect::<Vec<_>>());
            let (bm, x) = (bs.median, vs.median);
            let tol = m.abs_tol.max(m.rel_tol * bm.abs());
            let (lo, hi) = (bs.min - tol, bs.max + tol);
            let shift = Shift {
                scenario: sc.clone(),
                measure: m.name.to_string(),
                base: bm,
                variant: x,
            };
            let (bad, good) = if m.higher_is_better {
                (x < lo, x > hi)
            } else {
                (x > hi, x < lo)
            };
            if bad {
                worse.push(shift);
            } else if good {
                better.push(shift);
            }
            // Only higher-is-better measures carry the guard: the worst seed is the lowest.
            if let Some(tol) = m.worst_seed_tol {
                if vs.min < bs.min - tol {
                    worse.push(Shift {
                        scenario: sc.clone(),
                        measure: format!("{}, worst seed", m.name),
                        base: bs.min,
                        variant: vs.min,
                    });
                }
            }
        }
    }
    let verdict = match (worse.is_empty(), better.is_empty()) {
        (false, _) => "reject",
        (true, false) => "adopt",
        (true, true) => "no effect",
    };
    Judgement {
        name: name.to_string(),
        keys: keys.to_string(),
        verdict,
        worse,
        better,
    }
}

/// Reads the variants: `name = { key = value, … }` per variant.
fn read_variants(file: &Path) -> Result<Vec<(String, toml::Table)>> {
    let text = std::fs::read_to_string(file)
        .with_context(|| format!("--variants {}: cannot read the file", file.display()))?;
    let table: toml::Table = toml::from_str(&text)
        .with_context(|| format!("--variants {}: not TOML", file.display()))?;
    let mut out = Vec::new();
    for (name, v) in table {
        let toml::Value::Table(keys) = v else {
            bail!(
                "--variants {}: {name:?} is not a table; write {name} = {{ key = value }}",
                file.display()
            );
        };
        out.push((name, keys));
    }
    if out.is_empty() {
        bail!("--variants {}: no variant in it", file.display());
    }
    if out.len() > MAX_VARIANTS {
        bail!(
            "--variants {}: {} variants; at most {MAX_VARIANTS}",
            file.display(),
            out.len()
        );
    }
    Ok(out)
}

/// Runs the base and every variant on the suite and prints the rule's verdicts.
pub fn run(a: &SuiteArgs, file: &Path) -> Result<()> {
    let started = std::time::Instant::now();
    let base_table = suite::set_table(&a.set)?;
    let base = suite::policy_of(base_table.clone(), "--set")?;
    let variants = read_variants(file)?;
    let mut configs = vec![base.clone()];
    let mut keys = Vec::new();
    for (name, t) in &variants {
        let mut merged = base_table.clone();
        merged.extend(t.clone());
        configs.push(suite::policy_of(
            merged,
            &format!("--variants {}: {name}", file.display()),
        )?);
        keys.push(
            t.iter()
                .map(|(k, v)| format!("{k} = {v}"))
                .collect::<Vec<_>>()
                .join(", "),
        );
    }
    let entries: Vec<Entry> = suite::read_entries(a)?;
    if entries.is_empty() {
        bail!("--dir {}: no scenario to run", a.dir.display());
    }
    let tasks: Vec<Task> = suite::tasks_of(&entries, &[PolicyKind::FairShare], configs.len());
    tracing::info!(
        variants = variants.len(),
        runs = tasks.len(),
        "judging the variants"
    );
    let figures = suite::run_all(&entries, &configs, &tasks)?;
    let per = |config: usize| -> Vec<Vec<Figures>> {
        (0..entries.len())
            .map(|e| suite::figures_of(&tasks, &figures, e, PolicyKind::FairShare, config))
            .collect()
    };
    let names: Vec<String> = entries.iter().map(|e| e.name.clone()).collect();
    let base_figs = per(0);
    let judgements: Vec<Judgement> = variants
        .iter()
        .enumerate()
        .map(|(i, (name, _))| judge(name, &keys[i], &names, &base_figs, &per(i + 1)))
        .collect();
    if a.json {
        #[derive(Serialize)]
        struct Out<'a> {
            base: &'a [String],
            seeds: Vec<(String, Vec<u64>)>,
            judgements: &'a [Judgement],
            wall_s: f64,
        }
        println!(
            "{}",
            serde_json::to_string(&Out {
                base: &a.set,
                seeds: entries
                    .iter()
                    .map(|e| (e.name.clone(), e.seeds.clone()))
                    .collect(),
                judgements: &judgements,
                wall_s: started.elapsed().as_secs_f64(),
            })?
        );
    } else {
        print!("{}", table(&judgements));
        println!("wall time {:.1} s", started.elapsed().as_secs_f64());
    }
    Ok(())
}

/// The verdicts as a Markdown table (what `docs/policy/suite.md` keeps).
pub fn table(js: &[Judgement]) -> String {
    let shifts = |v: &[Shift]| {
        if v.is_empty() {
            return "—".to_string();
        }
        v.iter()
            .map(|s| {
                format!(
                    "{} {} {}→{}",
                    s.scenario,
                    s.measure.trim_end_matches(" s"),
                    show(&s.measure, s.base),
                    show(&s.measure, s.variant)
                )
            })
            .collect::<Vec<_>>()
            .join("; ")
    };
    let mut s = String::from(
        "| variant | keys | verdict | worse beyond the seeds' spread | better beyond it |\n\
         |---|---|---|---|---|\n",
    );
    for j in js {
        s += &format!(
            "| {} | `{}` | {} | {} | {} |\n",
            j.name,
            j.keys,
            j.verdict,
            shifts(&j.worse),
            shifts(&j.better)
        );
    }
    s
}

fn show(measure: &str, x: f64) -> String {
    if measure.ends_with(" s") {
        allot_fairshare::time::format_duration(x.max(0.0) as u64)
    } else if measure.starts_with("lost") {
        if x >= 1000.0 {
            format!("{:.1}k", x / 1000.0)
        } else {
            format!("{x:.0}")
        }
    } else {
        format!("{x:.3}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fig(worst: f64, lost: f64) -> Figures {
        Figures {
            occupancy: 0.9,
            worst_team: worst,
            mean_team: 0.95,
            small_short_p90_s: 0.0,
            small_short_funded_p90_s: 0.0,
            lost_gpu_hours: lost,
            lost_pct: 1.0,
            reservation_lost_gpu_hours: 0.0,
            preemptions: 0.0,
            largest_gang_p90_s: 0.0,
            wall_s: 1.0,
        }
    }

    #[test]
    fn worse_anywhere_rejects_and_within_the_spread_is_no_effect() {
        let names = vec!["a".to_string(), "b".to_string()];
        let base = vec![
            vec![fig(0.90, 1000.0), fig(0.92, 1100.0), fig(0.91, 1050.0)],
            vec![fig(0.80, 500.0), fig(0.82, 520.0), fig(0.81, 510.0)],
        ];
        // Inside the spread on both: no effect.
        let same = vec![vec![fig(0.915, 1080.0); 3], vec![fig(0.805, 505.0); 3]];
        assert_eq!(judge("x", "", &names, &base, &same).verdict, "no effect");
        // Better worst team on a, nothing worse: adopt.
        let up = vec![vec![fig(0.95, 1050.0); 3], vec![fig(0.81, 510.0); 3]];
        let j = judge("x", "", &names, &base, &up);
        assert_eq!(j.verdict, "adopt");
        assert_eq!(j.better[0].scenario, "a");
        // Better on a, lost worse on b: reject, naming b.
        let trade = vec![vec![fig(0.95, 1050.0); 3], vec![fig(0.81, 900.0); 3]];
        let j = judge("x", "", &names, &base, &trade);
        assert_eq!(j.verdict, "reject");
        assert_eq!(j.worse.len(), 1);
        assert_eq!(
            (j.worse[0].scenario.as_str(), j.worse[0].measure.as_str()),
            ("b", "lost GPU-h")
        );
        assert!(table(&[j]).contains("b lost GPU-h 510→900"));
        // One seed's collapse is not hidden by the median.
        let collapse = vec![
            vec![fig(0.92, 1050.0), fig(0.95, 1050.0), fig(0.95, 1050.0)],
            vec![fig(0.10, 510.0), fig(0.81, 510.0), fig(0.82, 510.0)],
        ];
        let j = judge("x", "", &names, &base, &collapse);
        assert_eq!(j.verdict, "reject");
        assert_eq!(j.worse[0].measure, "worst team, worst seed");
    }
}
