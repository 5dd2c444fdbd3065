//! The `[health]` section of the agent's config: source, sampling, thresholds, XID
//! overrides. Errors name the line and the field; the defaults are the named
//! constants beside each setting.

use crate::fake::{parse_source, SourceSpec};
use crate::verdict::Thresholds;
use crate::xid::{Catalog, Override};
use serde::Deserialize;
use std::collections::BTreeMap;

/// Default sampling period: 10 s, NVML's own refresh for most counters is 1–10 s, and
/// XIDs arrive through events and the kernel log, not through sampling.
pub const DEFAULT_INTERVAL_S: u64 = 10;

/// The `[health]` section.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct HealthConfig {
    /// `nvml`, `nvml:PATH`, `fake:N` or `fake:N:SCRIPT`.
    pub source: String,
    /// Seconds between samples.
    pub interval_s: u64,
    /// Kernel log to follow (`/dev/kmsg`); empty to disable.
    pub kmsg: String,
    /// dcgm-exporter endpoint to scrape, if any.
    pub dcgm_url: Option<String>,
    /// Thresholds of the verdict policy.
    pub thresholds: Thresholds,
    /// XID number → replacement action (and recovery).
    pub xid_overrides: BTreeMap<String, Override>,
}

impl Default for HealthConfig {
    fn default() -> Self {
        HealthConfig {
            source: "nvml".into(),
            interval_s: DEFAULT_INTERVAL_S,
            kmsg: crate::kmsg_reader::KMSG.into(),
            dcgm_url: None,
            thresholds: Thresholds::default(),
            xid_overrides: BTreeMap::new(),
        }
    }
}

/// A config that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{file}:{line}: {field}: {message}")]
pub struct ConfigError {
    /// The file.
    pub file: String,
    /// 1-based line (0 when unknown).
    pub line: usize,
    /// The field.
    pub field: String,
    /// What is wrong and how to fix it.
    pub message: String,
}

/// The 1-based line where the key of `field` (dotted; its last part) is set, 0 if
/// nowhere: semantic errors found after parsing point at the line to edit.
pub fn line_of(text: &str, field: &str) -> usize {
    let key = field.rsplit('.').next().unwrap_or(field);
    text.lines()
        .position(|l| {
            l.trim_start()
                .strip_prefix(key)
                .is_some_and(|rest| rest.trim_start().starts_with('='))
        })
        .map_or(0, |i| i + 1)
}

/// The dotted key set on 1-based `line` (`section.key`), if that line sets one.
fn key_at(text: &str, line: usize) -> Option<String> {
    let lines: Vec<&str> = text.lines().collect();
    let key = lines.get(line.checked_sub(1)?)?.split_once('=')?.0.trim();
    let section = lines[..line - 1].iter().rev().find_map(|l| {
        let l = l.trim();
        l.strip_prefix('[')
            .and_then(|r| r.strip_suffix(']'))
            .map(|s| s.trim_matches(['[', ']']).trim().to_string())
    });
    Some(match section {
        Some(s) if !s.is_empty() => format!("{s}.{key}"),
        _ => key.to_string(),
    })
}

/// A TOML syntax or type error as a [`ConfigError`]: the line from the error's span,
/// the field from the message, else the key set on that line, else `default_field`.
pub fn toml_error(text: &str, file: &str, e: &toml::de::Error, default_field: &str) -> ConfigError {
    let line = e.span().map_or(0, |s| {
        text.as_bytes()[..s.start.min(text.len())]
            .iter()
            .filter(|&&b| b == b'\n')
            .count()
            + 1
    });
    let field = e
        .message()
        .split('`')
        .nth(1)
        .map(str::to_string)
        .or_else(|| key_at(text, line))
        .unwrap_or_else(|| default_field.to_string());
    ConfigError {
        file: file.into(),
        line,
        field,
        message: e.message().to_string(),
    }
}

impl HealthConfig {
    /// Parses a `[health]` table (the text of the whole agent config; other sections
    /// are ignored) and checks it.
    pub fn parse(text: &str, file: &str) -> Result<HealthConfig, ConfigError> {
        #[derive(Deserialize)]
        struct Wrapper {
            #[serde(default)]
            health: HealthConfig,
        }
        let w: Wrapper = toml::from_str(text).map_err(|e| toml_error(text, file, &e, "health"))?;
        let c = w.health;
        let err = |field: &str, message: String| ConfigError {
            file: file.into(),
            line: line_of(text, field),
            field: field.into(),
            message,
        };
        parse_source(&c.source).map_err(|m| err("health.source", m))?;
        if c.interval_s == 0 {
            return Err(err(
                "health.interval_s",
                "must be at least 1 (default 10)".into(),
            ));
        }
        for k in c.xid_overrides.keys() {
            if k.parse::<u32>().is_err() {
                return Err(err(
                    "health.xid_overrides",
                    format!("key {k:?} is not an XID number; write e.g. xid_overrides.64 = {{ action = \"drain\" }}"),
                ));
            }
        }
        let t = &c.thresholds;
        for (name, v) in [
            ("sbe_per_hour", t.sbe_per_hour),
            ("pcie_replay_per_hour", t.pcie_replay_per_hour),
            ("nvlink_errors_per_hour", t.nvlink_errors_per_hour),
        ] {
            if !(v.is_finite() && v > 0.0) {
                return Err(err(
                    &format!("health.thresholds.{name}"),
                    format!("{v}: use a positive rate per hour"),
                ));
            }
        }
        Ok(c)
    }

    /// The source to open.
    pub fn source_spec(&self) -> SourceSpec {
        // Checked in `parse`; the default source if a caller built the struct by hand.
        parse_source(&self.source).unwrap_or(SourceSpec::Nvml(None))
    }

    /// The XID catalog with this config's overrides.
    pub fn catalog(&self) -> Catalog {
        Catalog::with_overrides(
            self.xid_overrides
                .iter()
                .filter_map(|(k, v)| k.parse().ok().map(|x| (x, *v)))
                .collect(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::xid::Action;

    #[test]
    fn defaults_and_overrides() {
        let c = HealthConfig::parse("[agent]\nsocket = \"/x\"\n", "agent.toml").expect("defaults");
        assert_eq!(c, HealthConfig::default());
        let text = "[health]\nsource = \"fake:8\"\ninterval_s = 5\n[health.thresholds]\nclear_after = 60\n[health.xid_overrides]\n64 = { action = \"drain\", recovery = \"contact-support\" }\n";
        let c = HealthConfig::parse(text, "agent.toml").expect("valid");
        assert_eq!(c.source_spec(), SourceSpec::Fake(8, None));
        assert_eq!(c.thresholds.clear_after, 60);
        assert_eq!(c.catalog().decide(64, "").action, Action::Drain);
    }

    #[test]
    fn errors_name_line_and_field() {
        let e = HealthConfig::parse("[health]\nsource = \"gpu\"\n", "a.toml").unwrap_err();
        assert_eq!((e.line, e.field.as_str()), (2, "health.source"), "{e}");
        let e = HealthConfig::parse("[health]\n\ninterval_s = \"often\"\n", "a.toml").unwrap_err();
        assert_eq!(e.line, 3, "{e}");
        let e = HealthConfig::parse("[health]\nsampels = 3\n", "a.toml").unwrap_err();
        assert_eq!((e.line, e.field.as_str()), (2, "sampels"), "{e}");
        let e = HealthConfig::parse(
            "[health.xid_overrides]\nfoo = { action = \"drain\" }\n",
            "a.toml",
        )
        .unwrap_err();
        assert!(e.message.contains("not an XID number"), "{e}");
        let e = HealthConfig::parse(
            "[health.xid_overrides]\n64 = { action = \"explode\" }\n",
            "a.toml",
        )
        .unwrap_err();
        assert_eq!(e.line, 2, "{e}");
        let e =
            HealthConfig::parse("[health.thresholds]\nsbe_per_hour = -1\n", "a.toml").unwrap_err();
        assert_eq!(
            (e.line, e.field.as_str()),
            (2, "health.thresholds.sbe_per_hour"),
            "{e}"
        );
    }
}
