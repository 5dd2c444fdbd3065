//! The health policy: samples and events per GPU in, `healthy | degraded | failed` per
//! GPU and `ok | drain | drain-now` per host out, each with reasons that name the
//! signal and the value.
//!
//! Pure, like the scheduling core: the caller passes time in. Two kinds of signal:
//! *events* (XIDs) raise conditions that stay until the GPU is reset or the host
//! reboots ([`HealthPolicy::gpu_reset`]); *levels* (samples: recovery action, row
//! remapping, temperature, error rates) raise conditions that clear only after they
//! have been absent for `clear_after`, so a flapping signal cannot flap the verdict.
//! The GPU's own state wins over messages where NVML has it: the recovery action and
//! the remapped-rows state are read from every sample, so an event missed while the
//! agent was down still drains a GPU that needs a reset.

use crate::xid::{recovery_action, Action, Catalog};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Seconds, on the caller's clock.
pub type Time = u64;

/// Default: a level condition must be absent this long before it clears. Ten minutes
/// is a few sampling periods (10 s) beyond anything a transient spike lasts, yet short
/// enough that a fixed GPU rejoins the pool within one sampling of repair work.
pub const DEFAULT_CLEAR_AFTER: Time = 600;
/// Default: corrected ECC errors per hour that mark a GPU degraded. NVIDIA's XID 92
/// fires on an "excessive" single-bit rate; 100/h is well above a healthy HBM's
/// background and well below a failing row's storm.
pub const DEFAULT_SBE_PER_HOUR: f64 = 100.0;
/// Default: PCIe replays per hour that mark a GPU degraded (a marginal link or riser;
/// healthy links replay a handful of times a day).
pub const DEFAULT_PCIE_REPLAY_PER_HOUR: f64 = 60.0;
/// Default: NVLink CRC/replay/recovery errors per hour that drain the host: collective
/// jobs stall on a bad link long before it fails outright.
pub const DEFAULT_NVLINK_ERRORS_PER_HOUR: f64 = 100.0;
/// Rates are measured over at most this much history …
pub const RATE_WINDOW: Time = 3_600;
/// … and only once at least this much is there: a single error between two 10-second
/// samples would otherwise read as hundreds per hour.
pub const RATE_MIN_SPAN: Time = 600;
/// Default: degrade this many °C below the slowdown threshold (thermal margin).
pub const DEFAULT_TEMP_MARGIN_C: u32 = 5;

/// Configurable thresholds; every default is a named constant above, with its why.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Thresholds {
    /// Seconds a level condition must be absent before it clears.
    pub clear_after: Time,
    /// Corrected ECC errors per hour → degraded.
    pub sbe_per_hour: f64,
    /// PCIe replays per hour → degraded.
    pub pcie_replay_per_hour: f64,
    /// NVLink errors per hour → drain.
    pub nvlink_errors_per_hour: f64,
    /// Degrade within this many °C of the slowdown threshold.
    pub temp_margin_c: u32,
}

impl Default for Thresholds {
    fn default() -> Self {
        Thresholds {
            clear_after: DEFAULT_CLEAR_AFTER,
            sbe_per_hour: DEFAULT_SBE_PER_HOUR,
            pcie_replay_per_hour: DEFAULT_PCIE_REPLAY_PER_HOUR,
            nvlink_errors_per_hour: DEFAULT_NVLINK_ERRORS_PER_HOUR,
            temp_margin_c: DEFAULT_TEMP_MARGIN_C,
        }
    }
}

/// Remapped-rows state (`nvmlDeviceGetRemappedRows`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RemappedRows {
    /// Rows remapped for correctable errors.
    pub correctable: u32,
    /// Rows remapped for uncorrectable errors.
    pub uncorrectable: u32,
    /// A remap waits for the next GPU reset.
    pub pending: bool,
    /// A remap failed.
    pub failure: bool,
}

/// One periodic sample of one GPU; `None` where the GPU or driver does not say.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct GpuSample {
    /// PCI bus id `dddd:bb:dd`, the key that kernel-log XIDs also carry.
    pub pci: String,
    /// GPU UUID.
    pub uuid: String,
    /// NVML index.
    pub index: Option<u32>,
    /// Product name.
    pub name: Option<String>,
    /// Architecture (Hopper, Blackwell …).
    pub architecture: Option<String>,
    /// Power draw, mW.
    pub power_mw: Option<u32>,
    /// GPU utilisation, %.
    pub utilization_pct: Option<u32>,
    /// Memory installed, bytes.
    pub memory_total: Option<u64>,
    /// Memory used, bytes.
    pub memory_used: Option<u64>,
    /// Corrected ECC errors over the GPU's life.
    pub ecc_corrected_aggregate: Option<u64>,
    /// Uncorrected ECC errors over the GPU's life.
    pub ecc_uncorrected_aggregate: Option<u64>,
    /// Clock-throttle reasons (NVML bitmask).
    pub throttle_reasons: Option<u64>,
    /// Persistence mode on.
    pub persistence: Option<bool>,
    /// MIG mode on.
    pub mig: Option<bool>,
    /// Per active NVLink: (link, CRC, replay, recovery) error counters.
    pub nvlink: Vec<(u32, u64, u64, u64)>,
    /// Core temperature, °C.
    pub temperature_c: Option<u32>,
    /// Slowdown threshold, °C.
    pub slowdown_c: Option<u32>,
    /// Shutdown threshold, °C.
    pub shutdown_c: Option<u32>,
    /// Corrected ECC errors (volatile).
    pub ecc_corrected: Option<u64>,
    /// Uncorrected ECC errors (volatile).
    pub ecc_uncorrected: Option<u64>,
    /// Row remapping.
    pub remapped: Option<RemappedRows>,
    /// Pages pending retirement (pre-Ampere page retirement).
    pub retired_pending: Option<bool>,
    /// PCIe replay counter.
    pub pcie_replay: Option<u64>,
    /// NVLink CRC + replay + recovery errors, all links.
    pub nvlink_errors: Option<u64>,
    /// The driver's recovery action (NVML field 230).
    pub recovery_action: Option<u32>,
}

/// State of one GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum GpuState {
    /// Nothing wrong.
    Healthy,
    /// Usable, but something is off (or a condition drains the host).
    Degraded,
    /// Its leases must end now.
    Failed,
}

/// The host's verdict.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum HostVerdict {
    /// Schedulable.
    Ok,
    /// No new leases; running ones end at their min-runtime lapse.
    Drain,
    /// Every lease ends now.
    DrainNow,
}

/// One reason, naming the signal and its value.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Reason {
    /// The signal (`xid:79`, `recovery-action`, `row-remap-pending`, …).
    pub signal: String,
    /// Its value and what it means.
    pub detail: String,
    /// What it asks of scheduling; `None` for a degradation that drains nothing.
    pub action: Option<Action>,
    /// Only this GPU's leases need to end (the rest of the host may keep running).
    pub gpu_only: bool,
    /// When it was first seen.
    pub since: Time,
}

#[derive(Debug, Clone)]
struct Condition {
    reason: Reason,
    sticky: bool,
    last_seen: Time,
}

#[derive(Debug, Clone, Default)]
struct Gpu {
    conditions: BTreeMap<String, Condition>,
    last: Option<(Time, GpuSample)>,
    /// Counter readings over the last `RATE_WINDOW`, oldest first: rates are measured
    /// across it, so one error between two samples is not a rate.
    history: std::collections::VecDeque<(Time, [Option<u64>; 3])>,
    xids: BTreeMap<u32, u64>,
    last_xid: Option<u32>,
    cleared_through_seq: Option<u64>,
}

/// Labels of a metric sample: (name, value).
pub type Labels = Vec<(&'static str, String)>;

/// One GPU's verdict.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct GpuVerdict {
    /// PCI bus id.
    pub pci: String,
    /// State.
    pub state: GpuState,
    /// Reasons, most severe first.
    pub reasons: Vec<Reason>,
}

/// The whole host's verdict.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Verdict {
    /// The host.
    pub host: HostVerdict,
    /// When only some GPUs' leases must end: their bus ids (empty = the whole host).
    pub only_gpus: Vec<String>,
    /// Per GPU.
    pub gpus: Vec<GpuVerdict>,
}

/// The policy's memory, fed by samples and events.
#[derive(Debug, Clone, Default)]
pub struct HealthPolicy {
    thresholds: Thresholds,
    catalog: Catalog,
    gpus: BTreeMap<String, Gpu>,
}

impl HealthPolicy {
    /// A policy with these thresholds and XID catalog.
    pub fn new(thresholds: Thresholds, catalog: Catalog) -> Self {
        HealthPolicy {
            thresholds,
            catalog,
            gpus: BTreeMap::new(),
        }
    }

    fn raise(&mut self, pci: &str, now: Time, key: String, reason: Reason, sticky: bool) {
        let gpu = self.gpus.entry(pci.to_string()).or_default();
        gpu.conditions
            .entry(key)
            .and_modify(|c| {
                c.last_seen = now;
                // Keep the first sighting; take the newest wording and severity.
                let since = c.reason.since;
                c.reason = Reason {
                    since,
                    ..reason.clone()
                };
            })
            .or_insert(Condition {
                reason,
                sticky,
                last_seen: now,
            });
    }

    /// An XID (or SXid: pass `switch = true`) read from NVML events or the kernel log.
    /// `seq` is the kmsg sequence number when it came from the kernel log; events at
    /// or before the last GPU reset's sequence are history and change nothing.
    pub fn xid(&mut self, now: Time, pci: &str, xid: u32, message: &str, seq: Option<u64>) {
        let gpu = self.gpus.entry(pci.to_string()).or_default();
        if let (Some(s), Some(done)) = (seq, gpu.cleared_through_seq) {
            if s <= done {
                return;
            }
        }
        *gpu.xids.entry(xid).or_insert(0) += 1;
        gpu.last_xid = Some(xid);
        let d = self.catalog.decide(xid, message);
        let action = match d.action {
            Action::App if d.known => return, // the workload's fault: counted only
            Action::App => None,              // unknown: degraded
            a => Some(a),
        };
        let reason = Reason {
            signal: format!("xid:{xid}"),
            detail: format!("{} ({message})", d.reason),
            action,
            // A reset (or a P2P drain) concerns this GPU alone; a reboot, a lost GPU
            // or hardware checks concern the host.
            gpu_only: d.recovery.gpu_only(),
            since: now,
        };
        self.raise(pci, now, format!("xid:{xid}"), reason, true);
    }

    /// An NVSwitch SXid, keyed by the switch's bus id: fatal ones drain the host.
    pub fn switch_error(&mut self, now: Time, pci: &str, sxid: u32, message: &str) {
        let d = crate::xid::decide_sxid(sxid, message);
        if d.action == Action::App {
            return;
        }
        let reason = Reason {
            signal: format!("sxid:{sxid}"),
            detail: format!("{} ({message})", d.reason),
            action: Some(d.action),
            gpu_only: false,
            since: now,
        };
        self.raise(pci, now, format!("sxid:{sxid}"), reason, true);
    }

    /// The GPU stopped answering NVML or left the device list: fallen off the bus.
    pub fn lost(&mut self, now: Time, pci: &str) {
        let reason = Reason {
            signal: "gpu-lost".into(),
            detail: "NVML no longer reaches the GPU: treated as fallen off the bus (XID 79)".into(),
            action: Some(Action::DrainNow),
            gpu_only: false,
            since: now,
        };
        self.raise(pci, now, "gpu-lost".into(), reason, true);
    }

    /// The GPU was reset (or the host rebooted): event conditions end, and kernel-log
    /// XIDs up to `through_seq` are history.
    pub fn gpu_reset(&mut self, pci: &str, through_seq: Option<u64>) {
        let gpu = self.gpus.entry(pci.to_string()).or_default();
        // Level conditions go too: the next sample raises them again if they hold.
        gpu.conditions.clear();
        gpu.history.clear();
        gpu.cleared_through_seq = match (through_seq, gpu.cleared_through_seq) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        };
    }

    /// A periodic sample.
    pub fn sample(&mut self, now: Time, s: GpuSample) {
        let th = self.thresholds.clone();
        // Only the last uncorrectable count is compared; the sample itself is not.
        let prev_ecc = self
            .gpus
            .get(&s.pci)
            .and_then(|g| g.last.as_ref())
            .and_then(|(_, p)| p.ecc_uncorrected);
        let mut raised: Vec<(String, Option<Action>, bool, String)> = Vec::new();
        if let Some(code) = s.recovery_action.filter(|&c| c != 0) {
            let (action, recovery, what) = recovery_action(code);
            let gpu_only = recovery.gpu_only();
            raised.push((
                "recovery-action".into(),
                Some(action),
                gpu_only,
                format!("driver recovery action {code} ({what})"),
            ));
        }
        if let Some(r) = s.remapped {
            if r.failure {
                raised.push((
                    "row-remap-failure".into(),
                    Some(Action::DrainNow),
                    false,
                    "row remapping failed: memory cannot be repaired".into(),
                ));
            } else if r.pending {
                raised.push(("row-remap-pending".into(), Some(Action::Drain), true, format!("row remap pending ({} uncorrectable, {} correctable rows remapped): reset the GPU to apply", r.uncorrectable, r.correctable)));
            }
        }
        if s.retired_pending == Some(true) {
            raised.push((
                "page-retirement-pending".into(),
                Some(Action::Drain),
                true,
                "pages pending retirement: reset the GPU to apply".into(),
            ));
        }
        if let (Some(t), Some(shut)) = (s.temperature_c, s.shutdown_c) {
            if t >= shut {
                raised.push((
                    "temperature".into(),
                    Some(Action::DrainNow),
                    false,
                    format!("{t} °C at or above the shutdown threshold {shut} °C"),
                ));
            }
        }
        if let (Some(t), Some(slow)) = (s.temperature_c, s.slowdown_c) {
            if t.saturating_add(th.temp_margin_c) >= slow
                && s.shutdown_c.is_none_or(|shut| t < shut)
            {
                raised.push((
                    "temperature-margin".into(),
                    None,
                    true,
                    format!(
                        "{t} °C within {} °C of the slowdown threshold {slow} °C",
                        th.temp_margin_c
                    ),
                ));
            }
        }
        let counters = [s.ecc_corrected, s.pcie_replay, s.nvlink_errors];
        let base = {
            let gpu = self.gpus.entry(s.pci.clone()).or_default();
            while gpu.history.len() > 1
                && gpu
                    .history
                    .get(1)
                    .is_some_and(|h| now.saturating_sub(h.0) >= RATE_WINDOW)
            {
                gpu.history.pop_front();
            }
            let base = gpu.history.front().copied();
            gpu.history.push_back((now, counters));
            base
        };
        {
            if let (Some(new), Some(old)) = (s.ecc_uncorrected, prev_ecc) {
                if new > old {
                    // Sticky: memory that failed is not fixed by time, only by a reset.
                    let reason = Reason {
                        signal: "ecc-uncorrected".into(),
                        detail: format!("{} new uncorrectable ECC errors", new - old),
                        action: Some(Action::DrainNow),
                        gpu_only: true,
                        since: now,
                    };
                    self.raise(&s.pci, now, "ecc-uncorrected".into(), reason, true);
                }
            }
        }
        if let Some((bt, b)) = base.filter(|(bt, _)| now.saturating_sub(*bt) >= RATE_MIN_SPAN) {
            let hours = now.saturating_sub(bt) as f64 / 3600.0;
            let rate = |i: usize| match (counters[i], b[i]) {
                (Some(new), Some(old)) if new >= old => Some((new - old) as f64 / hours),
                _ => None,
            };
            if let Some(r) = rate(0).filter(|&r| r >= th.sbe_per_hour) {
                raised.push((
                    "ecc-corrected-rate".into(),
                    None,
                    true,
                    format!(
                        "{r:.0} corrected ECC errors/h (threshold {})",
                        th.sbe_per_hour
                    ),
                ));
            }
            if let Some(r) = rate(1).filter(|&r| r >= th.pcie_replay_per_hour) {
                raised.push((
                    "pcie-replay-rate".into(),
                    None,
                    true,
                    format!(
                        "{r:.0} PCIe replays/h (threshold {})",
                        th.pcie_replay_per_hour
                    ),
                ));
            }
            if let Some(r) = rate(2).filter(|&r| r >= th.nvlink_errors_per_hour) {
                raised.push((
                    "nvlink-error-rate".into(),
                    Some(Action::Drain),
                    false,
                    format!(
                        "{r:.0} NVLink errors/h (threshold {})",
                        th.nvlink_errors_per_hour
                    ),
                ));
            }
        }
        let pci = s.pci.clone();
        for (key, action, gpu_only, detail) in raised {
            let reason = Reason {
                signal: key.clone(),
                detail,
                action,
                gpu_only,
                since: now,
            };
            self.raise(&pci, now, key, reason, false);
        }
        let gpu = self.gpus.entry(pci).or_default();
        gpu.conditions
            .retain(|_, c| c.sticky || now.saturating_sub(c.last_seen) < th.clear_after);
        gpu.last = Some((now, s));
    }

    /// The last sample of every GPU seen (a lost GPU keeps its last one, so its UUID
    /// stays known), in NVML index order.
    pub fn inventory(&self) -> Vec<GpuSample> {
        let mut v: Vec<GpuSample> = self
            .gpus
            .values()
            .filter_map(|g| g.last.as_ref().map(|(_, s)| s.clone()))
            .collect();
        v.sort_by(|a, b| a.index.cmp(&b.index).then_with(|| a.pci.cmp(&b.pci)));
        v
    }

    /// The verdict as of now.
    pub fn verdict(&self) -> Verdict {
        let mut host = HostVerdict::Ok;
        let mut gpu_only = true;
        let mut only = Vec::new();
        let mut gpus = Vec::new();
        for (pci, g) in &self.gpus {
            let mut reasons: Vec<Reason> =
                g.conditions.values().map(|c| c.reason.clone()).collect();
            reasons.sort_by(|a, b| b.action.cmp(&a.action).then(a.signal.cmp(&b.signal)));
            let worst = reasons.iter().filter_map(|r| r.action).max();
            let state = match (worst, reasons.is_empty()) {
                (Some(Action::DrainNow), _) => GpuState::Failed,
                (_, false) => GpuState::Degraded,
                _ => GpuState::Healthy,
            };
            let h = match worst {
                Some(Action::DrainNow) => HostVerdict::DrainNow,
                Some(Action::Drain) => HostVerdict::Drain,
                _ => HostVerdict::Ok,
            };
            if h > HostVerdict::Ok {
                only.push(pci.clone());
                gpu_only &= reasons
                    .iter()
                    .filter(|r| r.action.is_some())
                    .all(|r| r.gpu_only);
            }
            host = host.max(h);
            gpus.push(GpuVerdict {
                pci: pci.clone(),
                state,
                reasons,
            });
        }
        Verdict {
            host,
            only_gpus: if host > HostVerdict::Ok && gpu_only {
                only
            } else {
                Vec::new()
            },
            gpus,
        }
    }

    /// Prometheus text, under dcgm-exporter's names where a metric means the same
    /// (`DCGM_FI_DEV_GPU_UTIL`, `_FB_USED`, `_FB_FREE`, `_GPU_TEMP`, `_POWER_USAGE`,
    /// `_XID_ERRORS`) and its labels (`gpu`, `UUID`, `pci_bus_id`, `Hostname`; the
    /// model as `model`), so dashboards built for it read these; `holder` adds the labels of the work on a
    /// GPU by its UUID (dcgm-exporter's pod mapping, for a lease), so utilisation
    /// joins jobs. allot's own: health state and a counter per GPU and XID, so a
    /// repeated XID is never invisible.
    pub fn metrics(
        &self,
        hostname: &str,
        holder: &dyn Fn(&str) -> Vec<(&'static str, String)>,
    ) -> String {
        use allot_common::exposition::{Exposition, Kind};
        let mut e = Exposition::new();
        // Each GPU's labels, from its last sample (a lost GPU keeps its last one).
        let labels: Vec<(&String, &Gpu, Labels)> = self
            .gpus
            .iter()
            .map(|(pci, g)| {
                let s = g.last.as_ref().map(|(_, s)| s);
                let index = s.and_then(|s| s.index);
                let uuid = s.map_or(String::new(), |s| s.uuid.clone());
                let mut l = vec![
                    ("gpu", index.map_or(String::new(), |i| i.to_string())),
                    ("UUID", uuid.clone()),
                    ("pci_bus_id", pci.clone()),
                    ("Hostname", hostname.to_string()),
                    // dcgm-exporter's `modelName`, in the snake case promtool asks for.
                    ("model", s.and_then(|s| s.name.clone()).unwrap_or_default()),
                ];
                if !uuid.is_empty() {
                    l.extend(holder(&uuid));
                }
                // What is not known is left out rather than written empty.
                l.retain(|(_, v)| !v.is_empty());
                (pci, g, l)
            })
            .collect();
        fn refs<'a>(l: &'a [(&'static str, String)]) -> Vec<(&'static str, &'a str)> {
            l.iter().map(|(k, v)| (*k, v.as_str())).collect()
        }
        type Read = fn(&GpuSample) -> Option<f64>;
        let gauges: [(&str, &str, Read); 5] = [
            ("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %).", |s| {
                s.utilization_pct.map(f64::from)
            }),
            (
                "DCGM_FI_DEV_FB_USED",
                "Framebuffer memory used (in MiB).",
                |s| s.memory_used.map(|b| (b >> 20) as f64),
            ),
            (
                "DCGM_FI_DEV_FB_FREE",
                "Framebuffer memory free (in MiB).",
                |s| {
                    s.memory_total
                        .zip(s.memory_used)
                        .map(|(t, u)| (t.saturating_sub(u) >> 20) as f64)
                },
            ),
            ("DCGM_FI_DEV_GPU_TEMP", "GPU temperature (in C).", |s| {
                s.temperature_c.map(f64::from)
            }),
            ("DCGM_FI_DEV_POWER_USAGE", "Power draw (in W).", |s| {
                s.power_mw.map(|mw| f64::from(mw) / 1000.0)
            }),
        ];
        for (name, help, read) in gauges {
            e.family(name, help, Kind::Gauge);
            for (_, g, l) in &labels {
                if let Some(v) = g.last.as_ref().and_then(|(_, s)| read(s)) {
                    e.sample(name, &refs(l), v);
                }
            }
        }
        // dcgm-exporter's DCGM_FI_DEV_PCIE_REPLAY_COUNTER, named as a counter should be.
        e.family(
            "allot_gpu_pcie_replays_total",
            "PCIe retries over the GPU's life.",
            Kind::Counter,
        );
        for (_, g, l) in &labels {
            if let Some(v) = g.last.as_ref().and_then(|(_, s)| s.pcie_replay) {
                e.sample("allot_gpu_pcie_replays_total", &refs(l), v);
            }
        }
        e.family(
            "DCGM_FI_DEV_XID_ERRORS",
            "Value of the last XID error encountered.",
            Kind::Gauge,
        );
        for (_, g, l) in &labels {
            if let Some(x) = g.last_xid {
                e.sample("DCGM_FI_DEV_XID_ERRORS", &refs(l), f64::from(x));
            }
        }
        e.family(
            "allot_gpu_health_state",
            "GPU state: 0 healthy, 1 degraded, 2 failed.",
            Kind::Gauge,
        );
        let verdict = self.verdict();
        for g in &verdict.gpus {
            if let Some((_, _, l)) = labels.iter().find(|(p, _, _)| **p == g.pci) {
                e.sample("allot_gpu_health_state", &refs(l), f64::from(g.state as u8));
            }
        }
        e.family(
            "allot_gpu_xid_total",
            "XID events per GPU and XID.",
            Kind::Counter,
        );
        for (_, g, l) in &labels {
            for (x, n) in &g.xids {
                let x = x.to_string();
                let mut l = refs(l);
                l.push(("xid", &x));
                e.sample("allot_gpu_xid_total", &l, n);
            }
        }
        e.finish()
    }
}
