//! dcgm-exporter's `/metrics`, scraped with reqwest and folded into NVML's samples
//! where NVML left a field empty (NVML's own reading wins where it has one).
//!
//! DCGM's XID metric is a gauge holding the *last* XID, so a repeated identical XID
//! is invisible in it; [`XidGauge`] turns changes of the gauge into events, and the
//! kernel log remains the source that sees every XID.

use allot_health::verdict::{GpuSample, RemappedRows};
use std::collections::BTreeMap;
use std::time::Duration;

/// The fields allot reads (dcgm-exporter names).
pub const FIELDS: [&str; 9] = [
    "DCGM_FI_DEV_XID_ERRORS",
    "DCGM_FI_DEV_GPU_TEMP",
    "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
    "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
    "DCGM_FI_DEV_ROW_REMAP_FAILURE",
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
    "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL",
];

/// The scrape failed.
#[derive(Debug, thiserror::Error)]
pub enum DcgmError {
    /// Connection, timeout or HTTP status.
    #[error("scraping dcgm-exporter at {url}: {source}; check that dcgm-exporter runs and the health source's dcgm_url")]
    Fetch {
        /// The endpoint.
        url: String,
        /// Why.
        source: reqwest::Error,
    },
}

/// One GPU's DCGM fields.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DcgmGpu {
    /// UUID label.
    pub uuid: String,
    /// Field name → value.
    pub fields: BTreeMap<String, f64>,
}

fn labels(s: &str) -> BTreeMap<&str, &str> {
    let mut out = BTreeMap::new();
    for part in s.split("\",") {
        if let Some((k, v)) = part.split_once("=\"") {
            out.insert(k.trim().trim_start_matches(','), v.trim_end_matches('"'));
        }
    }
    out
}

/// Parses Prometheus text; returns the fields allot reads, per GPU bus id. Lines it
/// does not understand are skipped.
pub fn parse(text: &str) -> BTreeMap<String, DcgmGpu> {
    let mut out: BTreeMap<String, DcgmGpu> = BTreeMap::new();
    for line in text.lines() {
        if line.starts_with('#') {
            continue;
        }
        let Some(open) = line.find('{') else { continue };
        let name = &line[..open];
        if !FIELDS.contains(&name) {
            continue;
        }
        let Some(close) = line[open..].find('}').map(|c| c + open) else {
            continue;
        };
        let l = labels(&line[open + 1..close]);
        let Some(value) = line[close + 1..]
            .split_whitespace()
            .next()
            .and_then(|v| v.parse::<f64>().ok())
        else {
            continue;
        };
        let Some(pci) = l
            .get("pci_bus_id")
            .and_then(|p| allot_health::kmsg::normalize_pci(p))
        else {
            continue;
        };
        let g = out.entry(pci).or_default();
        if let Some(u) = l.get("UUID") {
            g.uuid = u.to_string();
        }
        g.fields.insert(name.to_string(), value);
    }
    out
}

/// Fetches `url` (dcgm-exporter's `/metrics`) with a timeout.
pub fn fetch(url: &str, timeout: Duration) -> Result<String, DcgmError> {
    let client = reqwest::blocking::Client::builder()
        .timeout(timeout)
        .build()
        .map_err(|source| DcgmError::Fetch {
            url: url.into(),
            source,
        })?;
    fetch_with(&client, url)
}

/// Fetches with a client kept across scrapes (its connection is reused).
pub fn fetch_with(client: &reqwest::blocking::Client, url: &str) -> Result<String, DcgmError> {
    client
        .get(url)
        .send()
        .and_then(|r| r.error_for_status())
        .and_then(|r| r.text())
        .map_err(|source| DcgmError::Fetch {
            url: url.into(),
            source,
        })
}

/// Fills `s`'s empty fields from DCGM.
pub fn fold(s: &mut GpuSample, d: &DcgmGpu) {
    let f = |k: &str| d.fields.get(k).copied();
    let u = |k: &str| f(k).filter(|v| *v >= 0.0).map(|v| v as u64);
    s.temperature_c = s
        .temperature_c
        .or(u("DCGM_FI_DEV_GPU_TEMP").map(|v| v as u32));
    s.ecc_corrected = s.ecc_corrected.or(u("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL"));
    s.ecc_uncorrected = s.ecc_uncorrected.or(u("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"));
    s.pcie_replay = s.pcie_replay.or(u("DCGM_FI_DEV_PCIE_REPLAY_COUNTER"));
    s.nvlink_errors = s
        .nvlink_errors
        .or(u("DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL"));
    if s.remapped.is_none() {
        let corr = u("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS");
        let unc = u("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS");
        let failure = u("DCGM_FI_DEV_ROW_REMAP_FAILURE");
        if corr.is_some() || unc.is_some() || failure.is_some() {
            s.remapped = Some(RemappedRows {
                correctable: corr.unwrap_or(0) as u32,
                uncorrectable: unc.unwrap_or(0) as u32,
                pending: false,
                failure: failure.unwrap_or(0) > 0,
            });
        }
    }
}

/// Turns DCGM's last-XID gauge into events: a new non-zero value is a new XID.
#[derive(Debug, Clone, Default)]
pub struct XidGauge {
    last: BTreeMap<String, u64>,
}

impl XidGauge {
    /// XIDs that appeared since the previous scrape, as (bus id, XID).
    pub fn changes(&mut self, gpus: &BTreeMap<String, DcgmGpu>) -> Vec<(String, u32)> {
        let mut out = Vec::new();
        for (pci, g) in gpus {
            let Some(x) = g.fields.get("DCGM_FI_DEV_XID_ERRORS").map(|v| *v as u64) else {
                continue;
            };
            // The first reading is only a baseline: the gauge keeps its last value
            // across GPU resets, so it may be long settled.
            let before = self.last.insert(pci.clone(), x);
            if x != 0 && before.is_some_and(|b| b != x) {
                out.push((pci.clone(), x as u32));
            }
        }
        out
    }
}
