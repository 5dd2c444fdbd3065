//! NVIDIA's XID catalog and allot's two decisions per code: the scheduling *action*
//! (`app`: the workload's fault, report only; `drain`: no new leases, running ones end
//! at their min-runtime lapse; `drain-now`: the GPU is gone or its results cannot be
//! trusted) and the *recovery* step (`none`, `reset-gpu`, `reboot`, `check-hardware`,
//! `contact-support`).
//!
//! Rows follow NVIDIA's XID catalog (Immediate / Investigatory resolution buckets) as
//! gathered in `shared/reference/gpu-health.md`. How buckets map to actions:
//! RESTART_APP / IGNORE / CHECK_UVM → `app`; RESET_GPU, RESTART_BM, RESTART_VM and the
//! XID-48 workflow → `drain-now` (the GPU must be reset before anything on it can be
//! trusted); the NVLink workflow, CHECK_MECHANICALS and CONTACT_SUPPORT → `drain`.
//! Operators override any code (see [`Catalog::with_overrides`]); unknown codes are
//! reported, never fatal: the GPU is marked degraded.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt;

/// What scheduling does about an XID.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Action {
    /// The workload's fault: report it, keep scheduling.
    App,
    /// No new leases; running leases end at their min-runtime lapse.
    Drain,
    /// End every lease on the GPU at once.
    DrainNow,
}

/// What an operator (or automation) does to bring the GPU back.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Recovery {
    /// Nothing.
    None,
    /// `nvidia-smi -r` once no process uses the GPU.
    ResetGpu,
    /// Reboot the host.
    Reboot,
    /// Check cables, power, NVLink/PCIe seating; run diagnostics.
    CheckHardware,
    /// Open a case with the vendor (likely RMA).
    ContactSupport,
}

impl fmt::Display for Action {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Action::App => "app",
            Action::Drain => "drain",
            Action::DrainNow => "drain-now",
        })
    }
}

impl fmt::Display for Recovery {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Recovery::None => "none",
            Recovery::ResetGpu => "reset-gpu",
            Recovery::Reboot => "reboot",
            Recovery::CheckHardware => "check-hardware",
            Recovery::ContactSupport => "contact-support",
        })
    }
}

/// One row of the catalog.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct XidInfo {
    /// The XID.
    pub xid: u32,
    /// NVIDIA's mnemonic.
    pub mnemonic: &'static str,
    /// What it means.
    pub meaning: &'static str,
    /// NVIDIA's immediate resolution bucket.
    pub immediate: &'static str,
    /// NVIDIA's investigatory resolution bucket.
    pub investigatory: &'static str,
    /// allot's scheduling action.
    pub action: Action,
    /// allot's recovery step.
    pub recovery: Recovery,
}

const fn row(
    xid: u32,
    mnemonic: &'static str,
    meaning: &'static str,
    immediate: &'static str,
    investigatory: &'static str,
    action: Action,
    recovery: Recovery,
) -> XidInfo {
    XidInfo {
        xid,
        mnemonic,
        meaning,
        immediate,
        investigatory,
        action,
        recovery,
    }
}

use Action::{App, Drain, DrainNow};
use Recovery::{CheckHardware, ContactSupport, None as NoRecovery, Reboot, ResetGpu};

/// The catalog, sorted by XID.
pub static CATALOG: &[XidInfo] = &[
    row(
        13,
        "ROBUST_CHANNEL_GR_EXCEPTION",
        "Graphics engine exception, usually an application out-of-bounds access",
        "RESTART_APP",
        "WORKFLOW_XID_13",
        App,
        NoRecovery,
    ),
    row(
        31,
        "ROBUST_CHANNEL_FIFO_ERROR_MMU_ERR_FLT",
        "GPU memory page fault, usually an application illegal address",
        "RESTART_APP",
        "WORKFLOW_XID_31",
        App,
        NoRecovery,
    ),
    row(
        43,
        "RESETCHANNEL_VERIF_ERROR",
        "GPU stopped processing a channel (software-induced application fault)",
        "IGNORE",
        "CONTACT_SUPPORT",
        App,
        NoRecovery,
    ),
    row(
        45,
        "PREEMPTIVE_REMOVAL",
        "Preemptive cleanup after earlier errors or an application exit",
        "WORKFLOW_XID_45",
        "RESTART_FM if alone, else follow the other XID",
        App,
        NoRecovery,
    ),
    row(
        46,
        "GPU_TIMEOUT_ERROR",
        "GPU stopped processing",
        "RESET_GPU",
        "CONTACT_SUPPORT",
        DrainNow,
        ResetGpu,
    ),
    row(
        48,
        "GPU_ECC_DBE",
        "Double-bit (uncorrectable) ECC error",
        "WORKFLOW_XID_48",
        "WORKFLOW_XID_48",
        DrainNow,
        ResetGpu,
    ),
    row(
        54,
        "PWR_REDUCED_CLOCKING",
        "Auxiliary power is not connected: the GPU runs at reduced clocks",
        "CHECK_MECHANICALS",
        "CONTACT_SUPPORT",
        Drain,
        CheckHardware,
    ),
    row(
        61,
        "PMU_BREAKPOINT",
        "Internal micro-controller breakpoint (marked unused in the current catalog)",
        "CONTACT_SUPPORT",
        "-",
        Drain,
        ContactSupport,
    ),
    row(
        62,
        "PMU_HALT_ERROR",
        "Internal micro-controller halt",
        "RESET_GPU",
        "CONTACT_SUPPORT",
        DrainNow,
        ResetGpu,
    ),
    row(
        63,
        "INFOROM_DRAM_RETIREMENT_EVENT",
        "A row remap (or page retirement) was recorded; the remapped-rows state decides",
        "IGNORE",
        "IGNORE",
        App,
        NoRecovery,
    ),
    row(
        64,
        "INFOROM_DRAM_RETIREMENT_FAILURE",
        "Row remap failed: the memory error could not be repaired",
        "RESET_GPU",
        "CONTACT_SUPPORT",
        DrainNow,
        ResetGpu,
    ),
    row(
        68,
        "NVDEC0_ERROR",
        "Video decoder exception",
        "RESTART_APP",
        "CONTACT_SUPPORT",
        App,
        NoRecovery,
    ),
    row(
        69,
        "GR_CLASS_ERROR",
        "Graphics engine class error",
        "RESTART_APP",
        "CHECK_APP/CUDA",
        App,
        NoRecovery,
    ),
    row(
        74,
        "NVLINK_ERROR",
        "NVLink error (link down, replay or recovery failures)",
        "WORKFLOW_NVLINK_ERR",
        "CONTACT_SUPPORT",
        Drain,
        ResetGpu,
    ),
    row(
        79,
        "GPU_HAS_FALLEN_OFF_THE_BUS",
        "The GPU fell off the bus and no longer answers",
        "RESTART_BM",
        "CONTACT_SUPPORT",
        DrainNow,
        Reboot,
    ),
    row(
        92,
        "EXCESSIVE_SBE_INTERRUPTS",
        "High rate of single-bit (corrected) ECC errors",
        "IGNORE",
        "CONTACT_SUPPORT",
        App,
        NoRecovery,
    ),
    row(
        94,
        "CONTAINED_ERROR",
        "Contained memory error: only the affected application is hit",
        "RESTART_APP",
        "IGNORE (sympathetic)",
        App,
        NoRecovery,
    ),
    row(
        95,
        "UNCONTAINED_ERROR",
        "Uncontained memory error: every process on the GPU may be affected",
        "RESET_GPU",
        "IGNORE (sympathetic)",
        DrainNow,
        ResetGpu,
    ),
    row(
        109,
        "CTXSW_TIMEOUT_ERROR",
        "Context-switch timeout",
        "RESET_GPU",
        "CONTACT_SUPPORT",
        DrainNow,
        ResetGpu,
    ),
    row(
        110,
        "SEC_FAULT_ERROR",
        "Security fault",
        "RESET_GPU",
        "INVESTIGATE_SW",
        DrainNow,
        ResetGpu,
    ),
    row(
        119,
        "GSP_RPC_TIMEOUT",
        "Timeout waiting for the GPU System Processor (GSP)",
        "RESET_GPU",
        "INVESTIGATE_SW",
        DrainNow,
        ResetGpu,
    ),
    row(
        120,
        "GSP_ERROR",
        "Error in the GPU System Processor (GSP)",
        "RESET_GPU",
        "INVESTIGATE_SW",
        DrainNow,
        ResetGpu,
    ),
    row(
        121,
        "C2C_ERROR",
        "Chip-to-chip (C2C) link error, corrected",
        "IGNORE",
        "CONTACT_SUPPORT",
        App,
        NoRecovery,
    ),
    row(
        136,
        "ALI_TRAINING_FAIL",
        "NVLink training failed",
        "RESET_GPU",
        "INVESTIGATE_LINK_SI",
        DrainNow,
        ResetGpu,
    ),
    row(
        137,
        "NVLINK_PRIV_ERR",
        "NVLink privilege error",
        "IGNORE",
        "XID_137_FLOW",
        App,
        NoRecovery,
    ),
    row(
        140,
        "UNRECOVERABLE_ECC_ERROR_ESCAPE",
        "An uncorrectable ECC error escaped containment",
        "RESET_GPU",
        "CONTACT_SUPPORT",
        DrainNow,
        ResetGpu,
    ),
    row(
        143,
        "GPU_INIT_ERROR",
        "GPU initialization failed",
        "RESET_GPU",
        "CONTACT_SUPPORT",
        DrainNow,
        ResetGpu,
    ),
    row(
        144,
        "NVLINK_SAW_ERROR",
        "NVLink5 SAW unit error (decode the unit and severity)",
        "WORKFLOW_NVLINK5_ERR",
        "decode per sub-unit",
        Drain,
        ResetGpu,
    ),
    row(
        145,
        "NVLINK_RLW_ERROR",
        "NVLink5 RLW unit error (decode the unit and severity)",
        "WORKFLOW_NVLINK5_ERR",
        "decode per sub-unit",
        Drain,
        ResetGpu,
    ),
    row(
        146,
        "NVLINK_TLW_ERROR",
        "NVLink5 TLW unit error (decode the unit and severity)",
        "WORKFLOW_NVLINK5_ERR",
        "decode per sub-unit",
        Drain,
        ResetGpu,
    ),
    row(
        147,
        "NVLINK_TREX_ERROR",
        "NVLink5 TREX unit error (decode the unit and severity)",
        "WORKFLOW_NVLINK5_ERR",
        "decode per sub-unit",
        Drain,
        ResetGpu,
    ),
    row(
        148,
        "NVLINK_NVLPW_CTRL_ERROR",
        "NVLink5 NVLPW control error (decode the unit and severity)",
        "WORKFLOW_NVLINK5_ERR",
        "decode per sub-unit",
        Drain,
        ResetGpu,
    ),
    row(
        149,
        "NVLINK_NETIR_ERROR",
        "NVLink5 NETIR error: link events, BER (decode the unit and severity)",
        "WORKFLOW_NVLINK5_ERR",
        "decode per sub-unit",
        Drain,
        ResetGpu,
    ),
    row(
        150,
        "NVLINK_MSE_ERROR",
        "NVLink5 MSE error, e.g. watchdog (decode the unit and severity)",
        "WORKFLOW_NVLINK5_ERR",
        "decode per sub-unit",
        Drain,
        ResetGpu,
    ),
    row(
        151,
        "KEY_ROTATION_ERROR",
        "Confidential-computing key rotation error",
        "RESTART_VM",
        "CONTACT_SUPPORT",
        DrainNow,
        Reboot,
    ),
    row(
        154,
        "GPU_RECOVERY_ACTION_CHANGED",
        "The driver's recovery action changed; the new action decides",
        "XID_154",
        "N/A",
        App,
        NoRecovery,
    ),
    row(
        155,
        "NVLINK_SW_DEFINED_ERROR",
        "NVLink software-defined error",
        "RESET_GPU",
        "INVESTIGATE_SW_USER",
        DrainNow,
        ResetGpu,
    ),
    row(
        156,
        "RESOURCE_RETIREMENT_EVENT",
        "A GPU resource was retired",
        "RESET_GPU",
        "IGNORE",
        DrainNow,
        ResetGpu,
    ),
    row(
        158,
        "GPU_FATAL_TIMEOUT",
        "GPU fatal timeout",
        "RESET_GPU",
        "CONTACT_SUPPORT",
        DrainNow,
        ResetGpu,
    ),
    row(
        159,
        "CHI_NON_DATA_ERROR",
        "CHI non-data error",
        "CHECK_UVM",
        "SYMPATHETIC_REPORT_SOLO",
        App,
        NoRecovery,
    ),
    // 162–172 are new codes whose buckets are blank in the 2025-10 catalog; the actions
    // below are allot's, chosen from what the code names.
    row(
        167,
        "PCIE_FATAL_TIMEOUT",
        "PCIe fatal timeout (blank bucket in the catalog; allot treats the GPU as gone)",
        "-",
        "-",
        DrainNow,
        Reboot,
    ),
    row(
        168,
        "REDUCED_GPU_MEMORY_CAPACITY",
        "GPU runs with reduced memory capacity (blank bucket; allot drains for inspection)",
        "-",
        "-",
        Drain,
        ContactSupport,
    ),
    row(
        169,
        "SEC2_HALT",
        "SEC2 micro-controller halt (blank bucket; treated like other halts)",
        "-",
        "-",
        DrainNow,
        ResetGpu,
    ),
    row(
        171,
        "UNCORRECTABLE_DRAM_ERROR",
        "Uncorrectable DRAM error, detail for XID 48 (blank bucket)",
        "-",
        "-",
        DrainNow,
        ResetGpu,
    ),
    row(
        172,
        "UNCORRECTABLE_SRAM_ERROR",
        "Uncorrectable SRAM error, detail for XID 48 (blank bucket)",
        "-",
        "-",
        DrainNow,
        ResetGpu,
    ),
];

/// The catalog row of `xid`, if the code is known.
pub fn lookup(xid: u32) -> Option<&'static XidInfo> {
    CATALOG
        .binary_search_by_key(&xid, |r| r.xid)
        .ok()
        .map(|i| &CATALOG[i])
}

/// The driver's recovery action (`NVML_FI_DEV_GET_GPU_RECOVERY_ACTION`, also carried
/// by XID 154) and what allot makes of it.
pub fn recovery_action(code: u32) -> (Action, Recovery, &'static str) {
    match code {
        0 => (App, NoRecovery, "none"),
        1 => (DrainNow, ResetGpu, "GPU reset required"),
        2 => (DrainNow, Reboot, "node reboot required"),
        // Only peer-to-peer users are affected until the action is re-read.
        3 => (Drain, NoRecovery, "drain peer-to-peer traffic"),
        4 => (Drain, ResetGpu, "drain and reset"),
        5 => (Drain, CheckHardware, "recover the IMEX domain"),
        6 => (DrainNow, Reboot, "bus reset required"),
        7 => (DrainNow, Reboot, "system reboot required"),
        _ => (Drain, ContactSupport, "unknown recovery action"),
    }
}

/// What allot decided about one event, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Decision {
    /// Scheduling action.
    pub action: Action,
    /// Recovery step.
    pub recovery: Recovery,
    /// False for codes the catalog does not know: the GPU is marked degraded.
    pub known: bool,
    /// Where the decision came from, for people.
    pub reason: String,
}

/// An operator's replacement for one code's decisions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Override {
    /// Scheduling action.
    pub action: Action,
    /// Recovery step (the catalog's if absent).
    #[serde(default)]
    pub recovery: Option<Recovery>,
}

/// The catalog plus operators' overrides.
#[derive(Debug, Clone, Default)]
pub struct Catalog {
    overrides: BTreeMap<u32, Override>,
}

impl Catalog {
    /// The catalog with `overrides` (operators disagree with the vendor on some codes).
    pub fn with_overrides(overrides: BTreeMap<u32, Override>) -> Self {
        Catalog { overrides }
    }

    /// Decides an XID; `detail` is the rest of the kernel message, which refines
    /// XID 154 (the new recovery action) and the NVLink5 codes 144–150 (fatal or not).
    pub fn decide(&self, xid: u32, detail: &str) -> Decision {
        let info = lookup(xid);
        if let Some(o) = self.overrides.get(&xid) {
            let recovery = o
                .recovery
                .or(info.map(|i| i.recovery))
                .unwrap_or(NoRecovery);
            return Decision {
                action: o.action,
                recovery,
                known: true,
                reason: format!("XID {xid}: operator override"),
            };
        }
        let Some(info) = info else {
            return Decision {
                action: App,
                recovery: NoRecovery,
                known: false,
                reason: format!("XID {xid} is not in the catalog: GPU marked degraded"),
            };
        };
        if xid == 154 {
            if let Some(code) = new_recovery_action(detail) {
                let (action, recovery, what) = recovery_action(code);
                return Decision {
                    action,
                    recovery,
                    known: true,
                    reason: format!("XID 154: recovery action is now {code} ({what})"),
                };
            }
        }
        if (144..=150).contains(&xid) {
            if let Some(fatal) = nvlink5_fatal(detail) {
                let (action, recovery) = if fatal {
                    (DrainNow, ResetGpu)
                } else {
                    (App, NoRecovery)
                };
                return Decision {
                    action,
                    recovery,
                    known: true,
                    reason: format!(
                        "XID {xid} {}: {} NVLink5 error",
                        info.mnemonic,
                        if fatal { "fatal" } else { "non-fatal" }
                    ),
                };
            }
        }
        Decision {
            action: info.action,
            recovery: info.recovery,
            known: true,
            reason: format!("XID {xid} {}: {}", info.mnemonic, info.meaning),
        }
    }
}

/// The new action in `… changed from 0x4 (Drain and Reset) to 0x1 (GPU Reset …)`.
fn new_recovery_action(detail: &str) -> Option<u32> {
    let to = detail.rfind(" to ")?;
    let rest = detail[to + 4..].trim_start();
    let hex = rest.strip_prefix("0x").or_else(|| rest.strip_prefix("0X"));
    let digits: String = hex
        .unwrap_or(rest)
        .chars()
        .take_while(|c| c.is_ascii_hexdigit())
        .collect();
    if digits.is_empty() {
        return None;
    }
    u32::from_str_radix(&digits, if hex.is_some() { 16 } else { 10 }).ok()
}

/// `Fatal` / `Nonfatal` after the unit name in an NVLink5 message.
fn nvlink5_fatal(detail: &str) -> Option<bool> {
    detail.split_whitespace().take(3).find_map(|w| match w {
        "Fatal" => Some(true),
        "Nonfatal" | "NonFatal" | "Non-fatal" => Some(false),
        _ => None,
    })
}

/// A switch (SXid) event: fatal ones drain the host (its NVLink fabric is impaired),
/// others are reported.
pub fn decide_sxid(sxid: u32, detail: &str) -> Decision {
    let lower = detail.to_ascii_lowercase();
    let fatal =
        lower.contains("fatal") && !lower.contains("non-fatal") && !lower.contains("nonfatal");
    Decision {
        action: if fatal { Drain } else { App },
        recovery: if fatal { CheckHardware } else { NoRecovery },
        known: true,
        reason: format!(
            "NVSwitch SXid {sxid}: {}",
            if fatal {
                "fatal fabric error"
            } else {
                "non-fatal"
            }
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn catalog_is_sorted_and_unique() {
        assert!(CATALOG.windows(2).all(|w| w[0].xid < w[1].xid));
    }

    #[test]
    fn buckets_map_to_actions() {
        let c = Catalog::default();
        assert_eq!(c.decide(13, "").action, App);
        assert_eq!(c.decide(48, "").action, DrainNow);
        assert_eq!(c.decide(74, "").action, Drain);
        let d = c.decide(79, "");
        assert_eq!((d.action, d.recovery), (DrainNow, Reboot));
        assert_eq!(c.decide(119, "").recovery, ResetGpu);
        let u = c.decide(4242, "");
        assert!(!u.known);
        assert_eq!(u.action, App);
    }

    #[test]
    fn xid_154_follows_the_new_recovery_action() {
        let c = Catalog::default();
        let d = c.decide(
            154,
            "GPU recovery action changed from 0x4 (Drain and Reset) to 0x1 (GPU Reset Required)",
        );
        assert_eq!((d.action, d.recovery), (DrainNow, ResetGpu));
        let d = c.decide(
            154,
            "GPU recovery action changed from 0x1 (GPU Reset Required) to 0x0 (None)",
        );
        assert_eq!(d.action, App);
    }

    #[test]
    fn nvlink5_severity_decides() {
        let c = Catalog::default();
        let fatal = c.decide(149, "NETIR_LINK_EVT Fatal XC0 i0 Link 17 (0x00000000 0x0)");
        assert_eq!(fatal.action, DrainNow);
        let soft = c.decide(149, "NETIR_BER_EVENT Nonfatal XC1 i0 Link 03 (0x1 0x2)");
        assert_eq!(soft.action, App);
        assert_eq!(
            c.decide(149, "garbled").action,
            Drain,
            "undecodable: the catalog's default"
        );
    }

    #[test]
    fn overrides_win() {
        let mut o = BTreeMap::new();
        o.insert(
            64,
            Override {
                action: Drain,
                recovery: Some(ContactSupport),
            },
        );
        o.insert(
            13,
            Override {
                action: Drain,
                recovery: None,
            },
        );
        let c = Catalog::with_overrides(o);
        let d = c.decide(64, "");
        assert_eq!((d.action, d.recovery), (Drain, ContactSupport));
        assert_eq!(
            c.decide(13, "").recovery,
            NoRecovery,
            "catalog recovery kept"
        );
    }
}
