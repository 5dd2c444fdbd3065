//! NVIDIA's XID catalog and allot's two decisions per code: the scheduling *action*
//! (`app`: the workload's fault, report only; `drain`: no new leases, running ones end
//! at their min-runtime lapse; `drain-now`: the GPU is gone or its results cannot be
//! trusted) and the *recovery* step (`none`, `reset-gpu`, `reboot`, `check-hardware`,
//! `contact-support`).
//!
//! Rows follow NVIDIA's XID catalog for Ampere and newer (Immediate / Investigatory
//! resolution buckets, which GPUs a code applies to). How buckets map to actions:
//! RESTART_APP / IGNORE / CHECK_UVM / UPDATE_SWFW / the XID-45 and XID-154 workflows →
//! `app`; RESET_GPU, RESTART_BM, RESTART_VM and the XID-48 workflow → `drain-now` (the
//! GPU must be reset before anything on it can be trusted); the NVLink workflows,
//! CHECK_MECHANICALS and CONTACT_SUPPORT (which includes codes marked unused: seeing
//! one means something is off) → `drain`.
//! Operators override any code (see [`Catalog::with_overrides`]); unknown codes are
//! reported, never fatal: the GPU is marked degraded. Bucket names mean little to an
//! operator on their own; [`bucket_meaning`] says in a sentence what each asks for.

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

impl Recovery {
    /// Whether recovering needs only this GPU (a reset, or nothing), so only its
    /// leases must end; a reboot, hardware checks or support concern the host.
    pub fn gpu_only(self) -> bool {
        matches!(self, Recovery::ResetGpu | Recovery::None)
    }
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
    /// NVIDIA lists it for H100 (Hopper).
    pub hopper: bool,
    /// NVIDIA lists it for B100 or GB200 (Blackwell).
    pub blackwell: bool,
    /// allot's scheduling action.
    pub action: Action,
    /// allot's recovery step.
    pub recovery: Recovery,
}

#[allow(clippy::too_many_arguments)]
const fn row(
    xid: u32,
    mnemonic: &'static str,
    meaning: &'static str,
    immediate: &'static str,
    investigatory: &'static str,
    hopper: bool,
    blackwell: bool,
    action: Action,
    recovery: Recovery,
) -> XidInfo {
    XidInfo {
        xid,
        mnemonic,
        meaning,
        immediate,
        investigatory,
        hopper,
        blackwell,
        action,
        recovery,
    }
}

use Action::{App, Drain, DrainNow};
use Recovery::{CheckHardware, ContactSupport, None as NoRecovery, Reboot, ResetGpu};

/// The catalog, sorted by XID: every code of NVIDIA's Ampere-and-newer catalog
/// (1–172; descriptions in our words). Codes 162–172 have blank buckets there; their
/// actions are allot's, chosen from what the code names.
#[rustfmt::skip]
pub static CATALOG: &[XidInfo] = &[
    row(1, "ROBUST_CHANNEL_FIFO_ERROR_FIFO_METHOD", "Unused", "CONTACT_SUPPORT", "N/A; Unused", false, false, Drain, ContactSupport),
    row(2, "ROBUST_CHANNEL_FIFO_ERROR_SW_METHOD", "Unused", "CONTACT_SUPPORT", "N/A; Unused", false, false, Drain, ContactSupport),
    row(3, "ROBUST_CHANNEL_FIFO_ERROR_UNK_METHOD", "Unused", "CONTACT_SUPPORT", "N/A; Unused", false, false, Drain, ContactSupport),
    row(4, "ROBUST_CHANNEL_FIFO_ERROR_CHANNEL_BUSY", "Unused", "CONTACT_SUPPORT", "N/A; Unused", false, false, Drain, ContactSupport),
    row(5, "ROBUST_CHANNEL_FIFO_ERROR_RUNOUT_OVERFLOW", "Unused", "CONTACT_SUPPORT", "N/A; Unused", false, false, Drain, ContactSupport),
    row(6, "ROBUST_CHANNEL_FIFO_ERROR_PARSE_ERR", "Unused", "CONTACT_SUPPORT", "N/A; Unused", false, false, Drain, ContactSupport),
    row(7, "ROBUST_CHANNEL_FIFO_ERROR_PTE_ERR", "Unused", "CONTACT_SUPPORT", "N/A; Unused", false, false, Drain, ContactSupport),
    row(8, "ROBUST_CHANNEL_FIFO_ERROR_IDLE_TIMEOUT", "GPU stopped making progress (idle timeout)", "RESTART_APP", "CONTACT_SUPPORT", true, true, App, NoRecovery),
    row(9, "ROBUST_CHANNEL_GR_ERROR_INSTANCE", "Unused", "CONTACT_SUPPORT", "N/A; Unused", false, false, Drain, ContactSupport),
    row(10, "ROBUST_CHANNEL_GR_ERROR_SINGLE_STEP", "Unused", "CONTACT_SUPPORT", "N/A; Unused", false, false, Drain, ContactSupport),
    row(11, "ROBUST_CHANNEL_GR_ERROR_MISSING_HW", "Bad or corrupted command (push buffer) stream", "RESTART_APP", "CHECK_APP/CUDA", true, true, App, NoRecovery),
    row(12, "ROBUST_CHANNEL_GR_ERROR_SW_METHOD", "Unused", "CONTACT_SUPPORT", "N/A; Unused", false, false, Drain, ContactSupport),
    row(13, "ROBUST_CHANNEL_GR_EXCEPTION / ROBUST_CHANNEL_GR_ERROR_SW_NOTIFY", "Compute/graphics engine exception, usually an app bug (e.g. out-of-bounds)", "RESTART_APP", "WORKFLOW_XID_13", true, true, App, NoRecovery),
    row(14, "ROBUST_CHANNEL_FAKE_ERROR", "Unused; marks a fake or injected error from userspace", "IGNORE", "CONTACT_SUPPORT", true, true, App, NoRecovery),
    row(15, "ROBUST_CHANNEL_SCANLINE_TIMEOUT", "Unused", "CONTACT_SUPPORT", "N/A; Unused", false, false, Drain, ContactSupport),
    row(16, "ROBUST_CHANNEL_VBLANK_CALLBACK_TIMEOUT", "Unused", "CONTACT_SUPPORT", "CONTACT_SUPPORT", false, false, Drain, ContactSupport),
    row(17, "ROBUST_CHANNEL_PARAMETER_ERROR", "Unused", "CONTACT_SUPPORT", "N/A; Unused", false, false, Drain, ContactSupport),
    row(18, "ROBUST_CHANNEL_BUS_MASTER_TIMEOUT_ERROR", "Unused", "CONTACT_SUPPORT", "N/A; Unused", false, false, Drain, ContactSupport),
    row(19, "ROBUST_CHANNEL_DISP_MISSED_NOTIFIER", "Unused", "CONTACT_SUPPORT", "N/A; Unused", false, false, Drain, ContactSupport),
    row(20, "ROBUST_CHANNEL_MPEG_ERROR_SW_METHOD", "Unused", "CONTACT_SUPPORT", "N/A; Unused", false, false, Drain, ContactSupport),
    row(21, "ROBUST_CHANNEL_ME_ERROR_SW_METHOD", "Unused", "CONTACT_SUPPORT", "N/A; Unused", false, false, Drain, ContactSupport),
    row(22, "ROBUST_CHANNEL_VP_ERROR_SW_METHOD", "Unused", "CONTACT_SUPPORT", "N/A; Unused", false, false, Drain, ContactSupport),
    row(23, "ROBUST_CHANNEL_RC_LOGGING_ENABLED", "Unused", "CONTACT_SUPPORT", "N/A; Unused", false, false, Drain, ContactSupport),
    row(24, "ROBUST_CHANNEL_GR_SEMAPHORE_TIMEOUT", "Unused", "CONTACT_SUPPORT", "N/A; Unused", false, false, Drain, ContactSupport),
    row(25, "ROBUST_CHANNEL_GR_ILLEGAL_NOTIFY", "Illegal or invalid command stream submitted", "RESTART_APP", "CHECK_APP/CUDA", true, true, App, NoRecovery),
    row(26, "ROBUST_CHANNEL_FIFO_ERROR_FBISTATE_TIMEOUT", "Unused", "CONTACT_SUPPORT", "N/A; Unused", false, false, Drain, ContactSupport),
    row(27, "ROBUST_CHANNEL_VP_ERROR", "Unused", "CONTACT_SUPPORT", "N/A; Unused", false, false, Drain, ContactSupport),
    row(28, "ROBUST_CHANNEL_VP2_ERROR", "Unused", "CONTACT_SUPPORT", "N/A; Unused", false, false, Drain, ContactSupport),
    row(29, "ROBUST_CHANNEL_BSP_ERROR", "Unused", "CONTACT_SUPPORT", "N/A; Unused", false, false, Drain, ContactSupport),
    row(30, "ROBUST_CHANNEL_BAD_ADDR_ACCESS", "Unused", "CONTACT_SUPPORT", "N/A; Unused", false, false, Drain, ContactSupport),
    row(31, "ROBUST_CHANNEL_FIFO_ERROR_MMU_ERR_FLT", "MMU page fault from an illegal GPU memory access", "RESTART_APP", "WORKFLOW_XID_31", true, true, App, NoRecovery),
    row(32, "ROBUST_CHANNEL_PBDMA_ERROR", "DMA controller fault on the driver-to-GPU command stream", "RESTART_APP", "CHECK_APP/CUDA", true, true, App, NoRecovery),
    row(33, "ROBUST_CHANNEL_SEC_ERROR", "Unused", "CONTACT_SUPPORT", "N/A; Unused", false, false, Drain, ContactSupport),
    row(34, "ROBUST_CHANNEL_MSVLD_ERROR", "Unused", "CONTACT_SUPPORT", "N/A; Unused", false, false, Drain, ContactSupport),
    row(35, "ROBUST_CHANNEL_MSPDEC_ERROR", "Unused", "CONTACT_SUPPORT", "N/A; Unused", false, false, Drain, ContactSupport),
    row(36, "ROBUST_CHANNEL_MSPPP_ERROR", "Unused", "CONTACT_SUPPORT", "N/A; Unused", false, false, Drain, ContactSupport),
    row(37, "ROBUST_CHANNEL_FECS_ERR_UNIMP_FIRMWARE_METHOD", "Firmware error: unimplemented firmware method", "IGNORE", "CHECK_APP/CUDA", true, true, App, NoRecovery),
    row(38, "ROBUST_CHANNEL_FECS_ERR_WATCHDOG_TIMEOUT", "Firmware error: watchdog timed out", "IGNORE", "CONTACT_SUPPORT", true, true, App, NoRecovery),
    row(39, "ROBUST_CHANNEL_CE0_ERROR", "Copy engine 0 exception", "RESTART_APP", "CONTACT_SUPPORT", true, true, App, NoRecovery),
    row(40, "ROBUST_CHANNEL_CE1_ERROR", "Copy engine 1 exception", "RESTART_APP", "CONTACT_SUPPORT", true, true, App, NoRecovery),
    row(41, "ROBUST_CHANNEL_CE2_ERROR", "Copy engine 2 exception", "RESTART_APP", "CONTACT_SUPPORT", true, true, App, NoRecovery),
    row(42, "ROBUST_CHANNEL_VIC_ERROR", "Unused", "CONTACT_SUPPORT", "N/A; Unused", false, false, Drain, ContactSupport),
    row(43, "ROBUST_CHANNEL_RESETCHANNEL_VERIF_ERROR", "App hit a software-induced fault and was stopped; GPU healthy", "IGNORE", "CONTACT_SUPPORT", true, true, App, NoRecovery),
    row(44, "ROBUST_CHANNEL_GR_FAULT_DURING_CTXSW", "Graphics engine fault while switching contexts", "IGNORE", "CONTACT_SUPPORT", true, true, App, NoRecovery),
    row(45, "ROBUST_CHANNEL_PREEMPTIVE_REMOVAL", "Channel torn down after app abort, kill, reset or earlier error", "WORKFLOW_XID_45", "Solo: RESTART_FM Not Solo: IGNORE (follow other Xid)", true, true, App, NoRecovery),
    row(46, "ROBUST_CHANNEL_GPU_TIMEOUT_ERROR", "GPU stopped processing (timeout)", "RESET_GPU", "CONTACT_SUPPORT", true, true, DrainNow, ResetGpu),
    row(47, "ROBUST_CHANNEL_NVENC0_ERROR", "Unused", "CONTACT_SUPPORT", "N/A; Unused", false, false, Drain, ContactSupport),
    row(48, "ROBUST_CHANNEL_GPU_ECC_DBE", "Uncorrectable double-bit ECC error", "WORKFLOW_XID_48", "WORKFLOW_XID_48", true, true, DrainNow, ResetGpu),
    row(49, "SILENT_RUNNING_CONSTANT_LEVEL_SET_BY_REGISTRY", "Unused", "CONTACT_SUPPORT", "N/A; Unused", false, false, Drain, ContactSupport),
    row(50, "SILENT_RUNNING_LEVEL_TRANSITION_DUE_TO_RC_ERROR", "Unused", "CONTACT_SUPPORT", "N/A; Unused", false, false, Drain, ContactSupport),
    row(51, "SILENT_RUNNING_STRESS_TEST_FAILURE", "Unused", "CONTACT_SUPPORT", "N/A; Unused", false, false, Drain, ContactSupport),
    row(52, "SILENT_RUNNING_LEVEL_TRANS_DUE_TO_TEMP_RISE", "Unused", "CONTACT_SUPPORT", "N/A; Unused", false, false, Drain, ContactSupport),
    row(53, "SILENT_RUNNING_TEMP_REDUCED_CLOCKING", "Unused", "CONTACT_SUPPORT", "N/A; Unused", false, false, Drain, ContactSupport),
    row(54, "SILENT_RUNNING_PWR_REDUCED_CLOCKING", "Board auxiliary power connector not attached", "CHECK_MECHANICALS", "CONTACT_SUPPORT", true, true, Drain, CheckHardware),
    row(55, "SILENT_RUNNING_TEMPERATURE_READ_ERROR", "Unused", "CONTACT_SUPPORT", "N/A; Unused", false, false, Drain, ContactSupport),
    row(56, "DISPLAY_CHANNEL_EXCEPTION", "Unused", "CONTACT_SUPPORT", "N/A; Unused", false, false, Drain, ContactSupport),
    row(57, "FB_LINK_TRAINING_FAILURE_ERROR", "Unused", "CONTACT_SUPPORT", "N/A; Unused", false, false, Drain, ContactSupport),
    row(58, "FB_MEMORY_ERROR", "Unused", "CONTACT_SUPPORT", "N/A; Unused", false, false, Drain, ContactSupport),
    row(59, "PMU_ERROR", "Unused", "CONTACT_SUPPORT", "N/A; Unused", false, false, Drain, ContactSupport),
    row(60, "ROBUST_CHANNEL_SEC2_ERROR", "Video processor (SEC2) exception", "RESTART_APP", "INVESTIGATE_SW", true, true, App, NoRecovery),
    row(61, "PMU_BREAKPOINT", "Unused", "CONTACT_SUPPORT", "N/A; Unused", false, false, Drain, ContactSupport),
    row(62, "PMU_HALT_ERROR", "Internal microcontroller halted", "RESET_GPU", "CONTACT_SUPPORT", true, true, DrainNow, ResetGpu),
    row(63, "INFOROM_DRAM_RETIREMENT_EVENT", "Memory row remap (or page retirement) recorded", "IGNORE", "IGNORE", true, true, App, NoRecovery),
    row(64, "INFOROM_DRAM_RETIREMENT_FAILURE", "Memory row remap (or page retirement) failed", "RESET_GPU", "CONTACT_SUPPORT", true, true, DrainNow, ResetGpu),
    row(65, "ROBUST_CHANNEL_NVENC1_ERROR", "Unused", "CONTACT_SUPPORT", "N/A; Unused", false, false, Drain, ContactSupport),
    row(66, "ROBUST_CHANNEL_FECS_ERR_REG_ACCESS_VIOLATION", "Driver made an illegal register access", "IGNORE", "INVESTIGATE_SW", true, true, App, NoRecovery),
    row(67, "ROBUST_CHANNEL_FECS_ERR_VERIF_VIOLATION", "Driver made an illegal access (verification violation)", "IGNORE", "CONTACT_SUPPORT", true, true, App, NoRecovery),
    row(68, "ROBUST_CHANNEL_NVDEC0_ERROR", "Video decoder 0 exception", "RESTART_APP", "CONTACT_SUPPORT", true, true, App, NoRecovery),
    row(69, "ROBUST_CHANNEL_GR_CLASS_ERROR", "Graphics engine class/method error", "RESTART_APP", "CHECK_APP/CUDA", true, true, App, NoRecovery),
    row(70, "ROBUST_CHANNEL_CE3_ERROR", "Copy engine 3 error (unspecified)", "RESTART_APP", "CONTACT_SUPPORT", true, true, App, NoRecovery),
    row(71, "ROBUST_CHANNEL_CE4_ERROR", "Copy engine 4 error (unspecified)", "RESTART_APP", "CONTACT_SUPPORT", true, true, App, NoRecovery),
    row(72, "ROBUST_CHANNEL_CE5_ERROR", "Copy engine 5 error (unspecified)", "RESTART_APP", "CONTACT_SUPPORT", true, true, App, NoRecovery),
    row(73, "ROBUST_CHANNEL_NVENC2_ERROR", "Unused", "CONTACT_SUPPORT", "N/A; Unused", false, false, Drain, ContactSupport),
    row(74, "NVLINK_ERROR", "NVLink fault on link to another GPU or NVSwitch", "WORKFLOW_NVLINK_ERR", "CONTACT_SUPPORT", true, false, Drain, ResetGpu),
    row(75, "ROBUST_CHANNEL_CE6_ERROR", "Copy engine 6 error (unspecified)", "RESTART_APP", "CONTACT_SUPPORT", true, true, App, NoRecovery),
    row(76, "ROBUST_CHANNEL_CE7_ERROR", "Copy engine 7 error (unspecified)", "RESTART_APP", "CONTACT_SUPPORT", true, true, App, NoRecovery),
    row(77, "ROBUST_CHANNEL_CE8_ERROR", "Copy engine 8 error (unspecified)", "RESTART_APP", "CONTACT_SUPPORT", true, true, App, NoRecovery),
    row(78, "VGPU_START_ERROR", "vGPU failed to start (e.g. guest/host driver mismatch)", "UPDATE_SWFW", "UPDATE_SWFW", true, true, App, NoRecovery),
    row(79, "ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS", "GPU no longer reachable over PCIe", "RESTART_BM", "CONTACT_SUPPORT", true, true, DrainNow, Reboot),
    row(80, "PBDMA_PUSHBUFFER_CRC_MISMATCH", "Command data sent to the GPU was corrupted (CRC mismatch)", "RESTART_APP", "CHECK_APP/CUDA", true, false, App, NoRecovery),
    row(81, "ROBUST_CHANNEL_VGA_SUBSYSTEM_ERROR", "Unused", "CONTACT_SUPPORT", "N/A; Unused", false, false, Drain, ContactSupport),
    row(82, "ROBUST_CHANNEL_NVJPG0_ERROR", "JPEG engine 0 error", "RESTART_APP", "CONTACT_SUPPORT", true, true, App, NoRecovery),
    row(83, "ROBUST_CHANNEL_NVDEC1_ERROR", "Video decoder 1 error", "RESTART_APP", "CONTACT_SUPPORT", true, true, App, NoRecovery),
    row(84, "ROBUST_CHANNEL_NVDEC2_ERROR", "Video decoder 2 error", "RESTART_APP", "CONTACT_SUPPORT", true, true, App, NoRecovery),
    row(85, "ROBUST_CHANNEL_CE9_ERROR", "Copy engine 9 error (unspecified)", "RESTART_APP", "CONTACT_SUPPORT", true, true, App, NoRecovery),
    row(86, "ROBUST_CHANNEL_OFA0_ERROR", "Optical flow accelerator 0 exception", "RESTART_APP", "CONTACT_SUPPORT", true, true, App, NoRecovery),
    row(87, "NVTELEMETRY_DRIVER_REPORT", "Unused", "CONTACT_SUPPORT", "N/A; Unused", false, false, Drain, ContactSupport),
    row(88, "ROBUST_CHANNEL_NVDEC3_ERROR", "Video decoder 3 error", "RESTART_APP", "CONTACT_SUPPORT", true, true, App, NoRecovery),
    row(89, "ROBUST_CHANNEL_NVDEC4_ERROR", "Video decoder 4 error", "RESTART_APP", "CONTACT_SUPPORT", true, true, App, NoRecovery),
    row(90, "LTC_ERROR", "Unused", "CONTACT_SUPPORT", "N/A; Unused", false, false, Drain, ContactSupport),
    row(91, "RESERVED_XID", "Unused", "CONTACT_SUPPORT", "N/A; Unused", false, false, Drain, ContactSupport),
    row(92, "EXCESSIVE_SBE_INTERRUPTS", "Unusually high rate of correctable single-bit ECC errors", "IGNORE", "CONTACT_SUPPORT", true, true, App, NoRecovery),
    row(93, "INFOROM_ERASE_LIMIT_EXCEEDED", "InfoROM write refused: provisioned wear limit reached (A100 only)", "IGNORE", "CONTACT_SUPPORT", false, false, App, NoRecovery),
    row(94, "ROBUST_CHANNEL_CONTAINED_ERROR", "Memory error contained to one application; restart that app", "RESTART_APP", "IGNORE (sympathetic)", true, true, App, NoRecovery),
    row(95, "ROBUST_CHANNEL_UNCONTAINED_ERROR", "Memory error hit multiple apps; GPU needs a reset", "RESET_GPU", "IGNORE (sympathetic)", true, true, DrainNow, ResetGpu),
    row(96, "ROBUST_CHANNEL_NVDEC5_ERROR", "Video decoder 5 error", "RESTART_APP", "CONTACT_SUPPORT", true, true, App, NoRecovery),
    row(97, "ROBUST_CHANNEL_NVDEC6_ERROR", "Video decoder 6 error", "RESTART_APP", "CONTACT_SUPPORT", true, true, App, NoRecovery),
    row(98, "ROBUST_CHANNEL_NVDEC7_ERROR", "Video decoder 7 error", "RESTART_APP", "CONTACT_SUPPORT", true, true, App, NoRecovery),
    row(99, "ROBUST_CHANNEL_NVJPG1_ERROR", "JPEG engine 1 error", "RESTART_APP", "CONTACT_SUPPORT", true, true, App, NoRecovery),
    row(100, "ROBUST_CHANNEL_NVJPG2_ERROR", "JPEG engine 2 error", "RESTART_APP", "CONTACT_SUPPORT", true, true, App, NoRecovery),
    row(101, "ROBUST_CHANNEL_NVJPG3_ERROR", "JPEG engine 3 error", "RESTART_APP", "CONTACT_SUPPORT", true, true, App, NoRecovery),
    row(102, "ROBUST_CHANNEL_NVJPG4_ERROR", "JPEG engine 4 error", "RESTART_APP", "CONTACT_SUPPORT", true, true, App, NoRecovery),
    row(103, "ROBUST_CHANNEL_NVJPG5_ERROR", "JPEG engine 5 error", "RESTART_APP", "CONTACT_SUPPORT", true, true, App, NoRecovery),
    row(104, "ROBUST_CHANNEL_NVJPG6_ERROR", "JPEG engine 6 error", "RESTART_APP", "CONTACT_SUPPORT", true, true, App, NoRecovery),
    row(105, "ROBUST_CHANNEL_NVJPG7_ERROR", "JPEG engine 7 error", "RESTART_APP", "CONTACT_SUPPORT", true, true, App, NoRecovery),
    row(106, "SMBPBI_TEST_MESSAGE", "Out-of-band (SMBPBI) test message", "IGNORE", "IGNORE", true, true, App, NoRecovery),
    row(107, "SMBPBI_TEST_MESSAGE_SILENT", "Silent out-of-band (SMBPBI) test message", "IGNORE", "IGNORE", true, true, App, NoRecovery),
    row(108, "NVLINK_REMOTE_TRANSLATION_ERROR", "Unused (listed as NVLink remote translation error)", "IGNORE", "XID_137_FLOW", true, true, App, NoRecovery),
    row(109, "ROBUST_CHANNEL_CTXSW_TIMEOUT_ERROR", "Context switch timed out", "RESET_GPU", "CONTACT_SUPPORT", true, true, DrainNow, ResetGpu),
    row(110, "SEC_FAULT_ERROR", "Security fault; rare, usually a hardware failure", "RESET_GPU", "INVESTIGATE_SW", true, true, DrainNow, ResetGpu),
    row(111, "BUNDLE_ERROR_EVENT", "Unused", "CONTACT_SUPPORT", "N/A; Unused", false, false, Drain, ContactSupport),
    row(112, "DISP_SUPERVISOR_ERROR", "Unused", "CONTACT_SUPPORT", "N/A; Unused", false, false, Drain, ContactSupport),
    row(113, "DP_LT_FAILURE", "Unused", "CONTACT_SUPPORT", "N/A; Unused", false, false, Drain, ContactSupport),
    row(114, "HEAD_RG_UNDERFLOW", "Unused", "CONTACT_SUPPORT", "N/A; Unused", false, false, Drain, ContactSupport),
    row(115, "CORE_CHANNEL_REGS", "Unused", "CONTACT_SUPPORT", "N/A; Unused", false, false, Drain, ContactSupport),
    row(116, "WINDOW_CHANNEL_REGS", "Unused", "CONTACT_SUPPORT", "N/A; Unused", false, false, Drain, ContactSupport),
    row(117, "CURSOR_CHANNEL_REGS", "Unused", "CONTACT_SUPPORT", "N/A; Unused", false, false, Drain, ContactSupport),
    row(118, "HEAD_REGS", "Unused", "CONTACT_SUPPORT", "N/A; Unused", false, false, Drain, ContactSupport),
    row(119, "GSP_RPC_TIMEOUT", "GSP firmware did not answer an RPC in time", "RESET_GPU", "INVESTIGATE_SW", true, true, DrainNow, ResetGpu),
    row(120, "GSP_ERROR", "Error in code running on the GSP core", "RESET_GPU", "INVESTIGATE_SW", true, true, DrainNow, ResetGpu),
    row(121, "C2C_ERROR", "Corrected errors on the C2C link to a Grace CPU (GB200 only)", "IGNORE", "CONTACT_SUPPORT", false, true, App, NoRecovery),
    row(122, "SPI_PMU_RPC_READ_FAIL", "Unused", "CONTACT_SUPPORT", "N/A; Unused", false, false, Drain, ContactSupport),
    row(123, "SPI_PMU_RPC_WRITE_FAIL", "Unused", "CONTACT_SUPPORT", "N/A; Unused", false, false, Drain, ContactSupport),
    row(124, "SPI_PMU_RPC_ERASE_FAIL", "Unused", "CONTACT_SUPPORT", "N/A; Unused", false, false, Drain, ContactSupport),
    row(125, "INFOROM_FS_ERROR", "Unused", "CONTACT_SUPPORT", "N/A; Unused", false, false, Drain, ContactSupport),
    row(126, "ROBUST_CHANNEL_CE10_ERROR", "Copy engine 10 error (unspecified)", "RESTART_APP", "CONTACT_SUPPORT", false, true, App, NoRecovery),
    row(127, "ROBUST_CHANNEL_CE11_ERROR", "Copy engine 11 error (unspecified)", "RESTART_APP", "CONTACT_SUPPORT", false, true, App, NoRecovery),
    row(128, "ROBUST_CHANNEL_CE12_ERROR", "Copy engine 12 error (unspecified)", "RESTART_APP", "CONTACT_SUPPORT", false, true, App, NoRecovery),
    row(129, "ROBUST_CHANNEL_CE13_ERROR", "Copy engine 13 error (unspecified)", "RESTART_APP", "CONTACT_SUPPORT", false, true, App, NoRecovery),
    row(130, "ROBUST_CHANNEL_CE14_ERROR", "Copy engine 14 error (unspecified)", "RESTART_APP", "CONTACT_SUPPORT", false, true, App, NoRecovery),
    row(131, "ROBUST_CHANNEL_CE15_ERROR", "Copy engine 15 error (unspecified)", "RESTART_APP", "CONTACT_SUPPORT", false, true, App, NoRecovery),
    row(132, "ROBUST_CHANNEL_CE16_ERROR", "Copy engine 16 error (unspecified)", "RESTART_APP", "CONTACT_SUPPORT", false, true, App, NoRecovery),
    row(133, "ROBUST_CHANNEL_CE17_ERROR", "Copy engine 17 error (unspecified)", "RESTART_APP", "CONTACT_SUPPORT", false, true, App, NoRecovery),
    row(134, "ROBUST_CHANNEL_CE18_ERROR", "Copy engine 18 error (unspecified)", "RESTART_APP", "CONTACT_SUPPORT", false, true, App, NoRecovery),
    row(135, "ROBUST_CHANNEL_CE19_ERROR", "Copy engine 19 error (unspecified)", "RESTART_APP", "CONTACT_SUPPORT", false, true, App, NoRecovery),
    row(136, "ALI_TRAINING_FAIL", "NVLink link training failed", "RESET_GPU", "INVESTIGATE_LINK_SI", true, false, DrainNow, ResetGpu),
    row(137, "NVLINK_PRIV_ERR", "Illegal NVLink peer access caught by the remote MMU", "IGNORE", "XID_137_FLOW", true, true, App, NoRecovery),
    row(138, "ROBUST_CHANNEL_DLA_ERROR", "Unused", "CONTACT_SUPPORT", "N/A; Unused", false, false, Drain, ContactSupport),
    row(139, "ROBUST_CHANNEL_OFA1_ERROR", "Optical flow accelerator 1 error", "RESTART_APP", "CONTACT_SUPPORT", false, true, App, NoRecovery),
    row(140, "UNRECOVERABLE_ECC_ERROR_ESCAPE", "Uncorrectable memory error escaped page offlining/row remapping", "RESET_GPU", "CONTACT_SUPPORT", true, true, DrainNow, ResetGpu),
    row(141, "ROBUST_CHANNEL_FAST_PATH_ERROR", "CUDA fast-path error", "IGNORE", "CONTACT_SUPPORT", true, true, App, NoRecovery),
    row(142, "ROBUST_CHANNEL_NVENC3_ERROR", "Video encoder 3 error (GB200 only)", "CONTACT_SUPPORT", "-", false, true, Drain, ContactSupport),
    row(143, "GPU_INIT_ERROR", "GPU failed to initialize", "RESET_GPU", "CONTACT_SUPPORT", true, true, DrainNow, ResetGpu),
    row(144, "NVLINK_SAW_ERROR", "NVLink5 SAW unit error; decode IntrInfo/ErrorStatus", "WORKFLOW_NVLINK5_ERR", "WORKFLOW_NVLINK5_ERR", false, true, Drain, ResetGpu),
    row(145, "NVLINK_RLW_ERROR", "NVLink5 RLW unit error; decode IntrInfo/ErrorStatus", "WORKFLOW_NVLINK5_ERR", "WORKFLOW_NVLINK5_ERR", false, true, Drain, ResetGpu),
    row(146, "NVLINK_TLW_ERROR", "NVLink5 TLW unit error; decode IntrInfo/ErrorStatus", "WORKFLOW_NVLINK5_ERR", "WORKFLOW_NVLINK5_ERR", false, true, Drain, ResetGpu),
    row(147, "NVLINK_TREX_ERROR", "NVLink5 TREX unit error; decode IntrInfo/ErrorStatus", "WORKFLOW_NVLINK5_ERR", "WORKFLOW_NVLINK5_ERR", false, true, Drain, ResetGpu),
    row(148, "NVLINK_NVLPW_CTRL_ERROR", "NVLink5 NVLPW control error; decode IntrInfo/ErrorStatus", "WORKFLOW_NVLINK5_ERR", "WORKFLOW_NVLINK5_ERR", false, true, Drain, ResetGpu),
    row(149, "NVLINK_NETIR_ERROR", "NVLink5 NETIR error (link down, BER, MFDE); decode needed", "WORKFLOW_NVLINK5_ERR", "WORKFLOW_NVLINK5_ERR", false, true, Drain, ResetGpu),
    row(150, "NVLINK_MSE_ERROR", "NVLink5 MSE error (degraded/watchdog); decode needed", "WORKFLOW_NVLINK5_ERR", "WORKFLOW_NVLINK5_ERR", false, true, Drain, ResetGpu),
    row(151, "ROBUST_CHANNEL_KEY_ROTATION_ERROR", "Key rotation failed; VM owning GPU must restart", "RESTART_VM", "CONTACT_SUPPORT", true, true, DrainNow, Reboot),
    row(152, "ROBUST_CHANNEL_DLA_SMMU_ERROR", "DLA SMMU error (not on listed data-center GPUs)", "IGNORE", "CONTACT_SUPPORT", false, false, App, NoRecovery),
    row(153, "ROBUST_CHANNEL_DLA_TIMEOUT", "DLA timeout (not on listed data-center GPUs)", "IGNORE", "CONTACT_SUPPORT", false, false, App, NoRecovery),
    row(154, "GPU_RECOVERY_ACTION_CHANGED", "Summarizes recovery action now required because of other Xids", "XID_154", "N/A Informational only regarding another Xid", true, true, App, NoRecovery),
    row(155, "NVLINK_SW_DEFINED_ERROR", "Intentional NVLink link-down (including to sleep)", "RESET_GPU", "INVESTIGATE_SW_USER", false, true, DrainNow, ResetGpu),
    row(156, "RESOURCE_RETIREMENT_EVENT", "Hardware resource was retired", "RESET_GPU", "IGNORE", true, true, DrainNow, ResetGpu),
    row(157, "RESOURCE_RETIREMENT_FAILURE", "Resource retirement impossible; no spare resources left", "IGNORE", "CONTACT_SUPPORT", true, true, App, NoRecovery),
    row(158, "GPU_FATAL_TIMEOUT", "Fatal GPU timeout", "RESET_GPU", "CONTACT_SUPPORT", true, true, DrainNow, ResetGpu),
    row(159, "ROBUST_CHANNEL_CHI_NON_DATA_ERROR", "CHI non-data error on a C2C-connected GPU", "CHECK_UVM", "SYMPATHETIC_REPORT_SOLO", false, true, App, NoRecovery),
    row(160, "CHANNEL_RETIREMENT_EVENT", "A channel was retired", "IGNORE", "INVESTIGATE_SW", false, true, App, NoRecovery),
    row(161, "CHANNEL_RETIREMENT_FAILURE", "Retiring a channel failed", "IGNORE", "INVESTIGATE_SW", false, true, App, NoRecovery),
    row(162, "PSHC_REENGAGED", "Power-smoothing hardware re-enabled", "-", "-", false, true, App, NoRecovery),
    row(163, "PSHC_DISENGAGED", "Power-smoothing hardware disabled (thermal event or timeout)", "-", "-", false, true, Drain, CheckHardware),
    row(164, "PSHC_LOW_LIFETIME", "Power-smoothing hardware nearing end of its lifetime", "-", "-", false, true, App, NoRecovery),
    row(165, "PSHC_ZERO_LIFETIME", "Power-smoothing hardware lifetime used up; smoothing disabled", "-", "-", false, true, Drain, ContactSupport),
    row(166, "NVLINK_SECURE_CRYPTO_ERR", "Confidential-computing traffic before NVLink encryption was configured", "-", "-", false, true, Drain, ContactSupport),
    row(167, "PCIE_FATAL_TIMEOUT", "Fatal PCIe timeout", "-", "-", true, true, DrainNow, Reboot),
    row(168, "REDUCED_GPU_MEMORY_CAPACITY", "Errors in write-protected region; usable memory reduced", "-", "-", true, true, Drain, ContactSupport),
    row(169, "SEC2_HALT_ERROR", "SEC2 internal microcontroller halted", "-", "-", true, true, DrainNow, ResetGpu),
    row(170, "NVLINK_SECURE_OTHER", "Unexpected interrupt in confidential-computing mode", "-", "-", false, true, Drain, ContactSupport),
    row(171, "UNCORRECTABLE_DRAM_ERROR", "Companion to Xid 48: uncorrectable error located in DRAM", "-", "-", true, true, DrainNow, ResetGpu),
    row(172, "UNCORRECTABLE_SRAM_ERROR", "Companion to Xid 48: uncorrectable error located in SRAM", "-", "-", true, true, DrainNow, ResetGpu),
];

/// The catalog row of `xid`, if the code is known.
pub fn lookup(xid: u32) -> Option<&'static XidInfo> {
    CATALOG
        .binary_search_by_key(&xid, |r| r.xid)
        .ok()
        .map(|i| &CATALOG[i])
}

/// What one of NVIDIA's resolution buckets (an [`XidInfo::immediate`] or
/// [`XidInfo::investigatory`] value) asks an operator to do, in plain words after
/// NVIDIA's "Fault Resolution Buckets" sheet; `None` for a name the catalog never uses.
pub fn bucket_meaning(bucket: &str) -> Option<&'static str> {
    Some(match bucket {
        "RESTART_APP" => "restart the application; the GPU needs neither a reset nor a reboot",
        "IGNORE" => "no action needed",
        "RESET_GPU" => "stop every process on the GPU and reset it (nvidia-smi -r); reboot the host only if the reset does not clear it",
        "RESTART_BM" => "restart (power-cycle) the bare-metal host: the GPU cannot be reached again without it",
        "RESTART_VM" => "restart the virtual machine that owns the GPU; neither a GPU reset nor a host restart is needed",
        "CONTACT_SUPPORT" => "contact your support organization (NVIDIA or the system vendor) to investigate further",
        "CHECK_MECHANICALS" => "check that the board is seated and that its power and other connectors are secure",
        "UPDATE_SWFW" => "update the driver and firmware to current versions; for vGPU (XID 78) the guest driver must match the host's and the vGPU type must suit the guest OS and GPU",
        "CHECK_UVM" => "reset the GPU if Unified Memory (UVM) or vGPU is in use on it; otherwise no action needed",
        "CHECK_APP/CUDA" => "most likely the application sent bad data or misused the GPU: check the application (the message may carry its pid), and report a driver bug to NVIDIA if it is not the application",
        "WORKFLOW_XID_13" => "NVIDIA's XID 13 workflow — if it repeats on the same GPC/TPC, run DCGM diagnostics and then field diagnostics (possible hardware fault); otherwise debug the application (cuda-gdb, Compute Sanitizer), and report it if a known-good application hits it",
        "WORKFLOW_XID_31" => "NVIDIA's XID 31 workflow — repeated MMU faults on the same GPU suggest hardware (run DCGM diagnostics, then field diagnostics); faults on different GPUs, or a single one, point at the application; report it if a known-good application hits it",
        "WORKFLOW_XID_45" | "Solo: RESTART_FM Not Solo: IGNORE (follow other Xid)" => "cleanup after an aborted application or an earlier error: alone, restart Fabric Manager; with other XIDs, ignore it and follow theirs",
        "WORKFLOW_XID_48" => "double-bit ECC error: NVIDIA's XID 48 workflow — reset the GPU (drain it first when XID 63 or 64 came with it); if it came alone, run field diagnostics; otherwise the message names the memory: for framebuffer follow the row-remapping XIDs 63/64, for SRAM run field diagnostics if nvidia-smi's SRAM error-threshold flag is set (the board may need replacing)",
        "WORKFLOW_NVLINK_ERR" => "NVIDIA's NVLink error workflow — decode the error registers in the message (some bits are harmless, some side effects of other errors, others point at link ECC/parity faults or poor seating); a GPU reset or reboot clears it; if it recurs, reseat the link, run field diagnostics and contact support",
        "WORKFLOW_NVLINK5_ERR" => "NVIDIA's NVLink5 workflow — the unit, the Fatal/Nonfatal flag and the registers in the message decide, per NVIDIA's XID 144-150 decode table; fatal link errors need a GPU reset, non-fatal ones usually nothing",
        "XID_154" => "do what the message's new GPU recovery action says (none, GPU reset, node reboot, drain peer-to-peer traffic, drain and reset)",
        "N/A Informational only regarding another Xid" => "informational: it always comes with another XID that needs recovery; act on that one",
        "INVESTIGATE_SW" => "a problem in user or NVIDIA software, such as illegal accesses or malformed commands: investigate it (the message may carry the pid) and report driver bugs to NVIDIA",
        "INVESTIGATE_SW_USER" => "if it was not expected, find which software or user caused it",
        "INVESTIGATE_LINK_SI" => "investigate the link's signal integrity with its access or trunk link telemetry (NVIDIA's GB200 resiliency service flow)",
        "XID_137_FLOW" => "an illegal NVLink peer-to-peer access, usually an application bug: debug the application with cuda-gdb or Compute Sanitizer, and report it if that is inconclusive",
        "IGNORE (sympathetic)" | "SYMPATHETIC_REPORT_SOLO" => "a side effect of other errors: resolve those first; report it if it comes alone or persists once they are resolved",
        "N/A; Unused" => "none defined: NVIDIA lists the code as unused, so seeing it at all is unexpected",
        "-" => "NVIDIA's catalog gives no bucket for this code yet; allot's action is its own",
        _ => return None,
    })
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
    // "changed from 0x4 (Drain and Reset) to 0x1 (…)": the new code follows ") to ".
    let to = detail
        .find(") to ")
        .map(|i| i + 5)
        .or_else(|| detail.rfind(" to ").map(|i| i + 4))?;
    let rest = detail[to..].trim_start();
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
    fn catalog_is_sorted_unique_and_complete() {
        assert!(CATALOG.windows(2).all(|w| w[0].xid < w[1].xid));
        assert_eq!(CATALOG.len(), 172);
        assert!((1..=172).all(|x| lookup(x).is_some()));
        assert!(lookup(79)
            .is_some_and(|i| i.hopper && i.mnemonic.ends_with("GPU_HAS_FALLEN_OFF_THE_BUS")));
        assert!(lookup(149).is_some_and(|i| i.blackwell && !i.hopper));
    }

    #[test]
    fn every_bucket_in_the_catalog_is_explained() {
        for r in CATALOG {
            for b in [r.immediate, r.investigatory] {
                assert!(
                    bucket_meaning(b).is_some_and(|m| !m.is_empty()),
                    "XID {}: bucket {b:?} has no meaning",
                    r.xid
                );
            }
        }
        assert_eq!(bucket_meaning("NOT_A_BUCKET"), None);
        assert!(bucket_meaning("WORKFLOW_XID_48").is_some_and(|m| m.contains("double-bit ECC")));
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
