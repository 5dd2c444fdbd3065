//! The `[health]` section of the agent's config: source, sampling, thresholds, XID
//! overrides. Errors name the line and the field; the defaults are the named
//! constants beside each setting.

use crate::verdict::Thresholds;
use crate::xid::{Catalog, Override};
use allot_common::config_error::{from_toml, ConfigError, Positions};
use serde::Deserialize;
use std::collections::BTreeMap;

/// Default sampling period: 10 s, NVML's own refresh for most counters is 1–10 s, and
/// XIDs arrive through events and the kernel log, not through sampling.
pub const DEFAULT_INTERVAL_S: u64 = 10;

/// The kernel log the agent follows unless told otherwise.
pub const KMSG: &str = "/dev/kmsg";

/// Where GPU health comes from, as written in a config or on the command line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SourceSpec {
    /// NVML from the given library, or the system's.
    Nvml(Option<String>),
    /// `n` scripted GPUs, optionally with a fault script file.
    Fake(usize, Option<String>),
    /// No GPUs: a login host, whose agent only vouches for its users.
    None,
}

/// Parses `nvml`, `nvml:/path/libnvidia-ml.so.1`, `fake:8`, `fake:8:/path/script` or
/// `none`.
pub fn parse_source(s: &str) -> Result<SourceSpec, String> {
    let bad = || format!("gpu source {s:?}: use nvml, nvml:PATH, fake:N, fake:N:SCRIPT or none");
    match s.split_once(':') {
        None if s == "nvml" => Ok(SourceSpec::Nvml(None)),
        None if s == "none" => Ok(SourceSpec::None),
        Some(("nvml", p)) if !p.is_empty() => Ok(SourceSpec::Nvml(Some(p.into()))),
        Some(("fake", rest)) => {
            let (n, script) = match rest.split_once(':') {
                Some((n, p)) => (n, Some(p.to_string())),
                None => (rest, None),
            };
            let n: usize = n
                .parse()
                .ok()
                .filter(|&n| (1..=64).contains(&n))
                .ok_or_else(bad)?;
            Ok(SourceSpec::Fake(n, script))
        }
        _ => Err(bad()),
    }
}

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
            kmsg: KMSG.into(),
            dcgm_url: None,
            thresholds: Thresholds::default(),
            xid_overrides: BTreeMap::new(),
        }
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
        let w: Wrapper = from_toml(text, file, "health")?;
        let c = w.health;
        let at = Positions::new(text, file);
        let err = |field: &str, message: String| at.error(field, message);
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
    fn source_specs() {
        assert_eq!(parse_source("nvml"), Ok(SourceSpec::Nvml(None)));
        assert_eq!(
            parse_source("nvml:/x/lib.so"),
            Ok(SourceSpec::Nvml(Some("/x/lib.so".into())))
        );
        assert_eq!(parse_source("fake:8"), Ok(SourceSpec::Fake(8, None)));
        assert_eq!(
            parse_source("fake:4:/s"),
            Ok(SourceSpec::Fake(4, Some("/s".into())))
        );
        assert_eq!(parse_source("none"), Ok(SourceSpec::None));
        for bad in ["", "fake", "fake:0", "fake:x", "dcgm", "nvml:", "none:1"] {
            assert!(parse_source(bad).is_err(), "{bad}");
        }
    }

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
