//! GPU samples and XID events from NVML, through nvml-wrapper and a shared library
//! loaded at run time (NVIDIA's `libnvidia-ml.so.1` on GPU hosts, the repo's fake in
//! tests).
//!
//! Every field the GPU or driver does not offer (`NOT_SUPPORTED`, an older driver
//! without the symbol) becomes `None` in the sample rather than an error: a missing
//! field must never stop the others from being read. A GPU that answers
//! `GPU_IS_LOST` is reported as lost, which the policy treats as fallen off the bus.

use allot_health::verdict::{GpuSample, RemappedRows};
use nvml_wrapper::bitmasks::event::EventTypes;
use nvml_wrapper::enum_wrappers::device::{
    EccCounter, MemoryError, TemperatureSensor, TemperatureThreshold,
};
use nvml_wrapper::enum_wrappers::nv_link::ErrorCounter;
use nvml_wrapper::enums::device::SampleValue;
use nvml_wrapper::enums::event::XidError;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::event::EventSet;
use nvml_wrapper::struct_wrappers::device::PciInfo;
use nvml_wrapper::structs::device::FieldId;
use nvml_wrapper::{Device, Nvml};
use std::path::Path;

/// The system's NVML, as the driver installs it.
pub const DEFAULT_LIBRARY: &str = "libnvidia-ml.so.1";
/// `NVML_FI_DEV_GET_GPU_RECOVERY_ACTION` (R565+).
pub const FIELD_RECOVERY_ACTION: u32 = 230;

/// NVML could not be used at all.
#[derive(Debug, thiserror::Error)]
pub enum NvmlSourceError {
    /// The library is missing or is not NVML.
    #[error("cannot load NVML from {path}: {source}; install the NVIDIA driver, or set the health source's nvml_library to the path of libnvidia-ml.so.1")]
    Load {
        /// What was tried.
        path: String,
        /// Why it failed.
        source: NvmlError,
    },
    /// A call that concerns the whole library failed.
    #[error("NVML {what}: {source}")]
    Call {
        /// The call.
        what: &'static str,
        /// Why.
        source: NvmlError,
    },
}

/// One GPU could not be read.
#[derive(Debug, thiserror::Error)]
pub enum GpuReadError {
    /// It no longer answers: fallen off the bus.
    #[error("GPU {index} is lost (NVML: GPU_IS_LOST)")]
    Lost {
        /// Its NVML index.
        index: u32,
        /// Its bus id, when it was known before.
        pci: Option<String>,
    },
    /// A call every sample needs failed.
    #[error("GPU {index}: {what}: {source}")]
    Failed {
        /// Its NVML index.
        index: u32,
        /// The call.
        what: &'static str,
        /// Why.
        source: NvmlError,
    },
}

/// What an NVML event set delivered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Notice {
    /// An XID on the GPU at `pci`; `xid` is `None` when NVML reports it unknown (999).
    Xid {
        /// Bus id `dddd:bb:dd`.
        pci: String,
        /// The XID.
        xid: Option<u64>,
    },
    /// Something else changed on the GPU (its recovery action): sample it now.
    Changed {
        /// Bus id `dddd:bb:dd`.
        pci: String,
    },
}

/// NVML, loaded.
pub struct NvmlSource {
    nvml: Nvml,
}

/// `dddd:bb:dd` from NVML's PCI info.
fn pci_of(p: &PciInfo) -> String {
    format!("{:04x}:{:02x}:{:02x}", p.domain, p.bus, p.device)
}

/// `Some(v)` on success, `None` where the field is not offered; errors that mean the
/// GPU is gone are passed up.
fn optional<T>(r: Result<T, NvmlError>) -> Result<Option<T>, NvmlError> {
    match r {
        Ok(v) => Ok(Some(v)),
        Err(NvmlError::GpuLost) => Err(NvmlError::GpuLost),
        Err(_) => Ok(None),
    }
}

impl NvmlSource {
    /// Loads NVML from `library` (default: the system's `libnvidia-ml.so.1`).
    pub fn open(library: Option<&Path>) -> Result<Self, NvmlSourceError> {
        let path = library.map_or_else(|| DEFAULT_LIBRARY.into(), |p| p.display().to_string());
        let nvml = match library {
            Some(p) => Nvml::builder().lib_path(p.as_os_str()).init(),
            None => Nvml::init(),
        }
        .map_err(|source| NvmlSourceError::Load { path, source })?;
        Ok(NvmlSource { nvml })
    }

    /// The driver's version string, if it says.
    pub fn driver_version(&self) -> Option<String> {
        self.nvml.sys_driver_version().ok()
    }

    /// Number of GPUs.
    pub fn count(&self) -> Result<u32, NvmlSourceError> {
        self.nvml
            .device_count()
            .map_err(|source| NvmlSourceError::Call {
                what: "device count",
                source,
            })
    }

    /// Samples every GPU; one GPU's failure does not stop the others.
    pub fn sample_all(&self) -> Result<Vec<Result<GpuSample, GpuReadError>>, NvmlSourceError> {
        Ok((0..self.count()?).map(|i| self.sample(i)).collect())
    }

    /// Samples GPU `index`.
    pub fn sample(&self, index: u32) -> Result<GpuSample, GpuReadError> {
        let fail = |what: &'static str| {
            move |source: NvmlError| match source {
                NvmlError::GpuLost => GpuReadError::Lost { index, pci: None },
                source => GpuReadError::Failed {
                    index,
                    what,
                    source,
                },
            }
        };
        let d = self.nvml.device_by_index(index).map_err(fail("handle"))?;
        let pci = pci_of(&d.pci_info().map_err(fail("PCI info"))?);
        let lost = |e: NvmlError| match e {
            NvmlError::GpuLost => GpuReadError::Lost {
                index,
                pci: Some(pci.clone()),
            },
            source => GpuReadError::Failed {
                index,
                what: "sample",
                source,
            },
        };
        let uuid = d.uuid().map_err(lost)?;
        let read = || -> Result<GpuSample, NvmlError> {
            let memory = optional(d.memory_info())?;
            let nvlink = nvlink_errors(&d)?;
            Ok(GpuSample {
                pci: pci.clone(),
                uuid: uuid.clone(),
                index: Some(index),
                name: optional(d.name())?,
                architecture: optional(d.architecture())?.map(|a| a.to_string()),
                power_mw: optional(d.power_usage())?,
                utilization_pct: optional(d.utilization_rates())?.map(|u| u.gpu),
                memory_total: memory.as_ref().map(|m| m.total),
                memory_used: memory.as_ref().map(|m| m.used),
                ecc_corrected_aggregate: optional(
                    d.total_ecc_errors(MemoryError::Corrected, EccCounter::Aggregate),
                )?,
                ecc_uncorrected_aggregate: optional(
                    d.total_ecc_errors(MemoryError::Uncorrected, EccCounter::Aggregate),
                )?,
                throttle_reasons: optional(d.current_throttle_reasons())?.map(|t| t.bits()),
                persistence: optional(d.is_in_persistent_mode())?,
                mig: optional(d.mig_mode())?.map(|m| m.current == 1),
                nvlink_errors: (!nvlink.is_empty())
                    .then(|| nvlink.iter().map(|l| l.1 + l.2 + l.3).sum()),
                nvlink,
                temperature_c: optional(d.temperature(TemperatureSensor::Gpu))?,
                slowdown_c: optional(d.temperature_threshold(TemperatureThreshold::Slowdown))?,
                shutdown_c: optional(d.temperature_threshold(TemperatureThreshold::Shutdown))?,
                ecc_corrected: optional(
                    d.total_ecc_errors(MemoryError::Corrected, EccCounter::Volatile),
                )?,
                ecc_uncorrected: optional(
                    d.total_ecc_errors(MemoryError::Uncorrected, EccCounter::Volatile),
                )?,
                remapped: optional(self.remapped_rows(&d))?,
                retired_pending: optional(d.are_pages_pending_retired())?,
                pcie_replay: optional(d.pcie_replay_counter())?.map(u64::from),
                recovery_action: optional(recovery_action(&d))?,
            })
        };
        read().map_err(lost)
    }

    /// `nvmlDeviceGetRemappedRows`, which nvml-wrapper does not wrap: called through
    /// the wrapper's library handle.
    fn remapped_rows(&self, d: &Device<'_>) -> Result<RemappedRows, NvmlError> {
        let lib = self.nvml.lib();
        let f = raw_sym(&lib.nvmlDeviceGetRemappedRows)?;
        let (mut corr, mut unc, mut pending, mut failure) = (0u32, 0u32, 0u32, 0u32);
        // SAFETY: the handle comes from this NVML instance and outlives the call; the
        // four out-pointers are valid for writes of c_uint.
        #[allow(unsafe_code)]
        let ret = unsafe { f(d.handle(), &mut corr, &mut unc, &mut pending, &mut failure) };
        nvml_wrapper::error::nvml_try(ret)?;
        Ok(RemappedRows {
            correctable: corr,
            uncorrectable: unc,
            pending: pending != 0,
            failure: failure != 0,
        })
    }

    /// Registers every GPU for XID events and, where the driver offers it (R565+),
    /// recovery-action changes, and returns the set to wait on. The wrapper knows only
    /// the older event types, so registration goes through the raw library handle.
    pub fn watch(&self) -> Result<EventWatcher<'_>, NvmlSourceError> {
        let call = |what| move |source| NvmlSourceError::Call { what, source };
        let set = self
            .nvml
            .create_event_set()
            .map_err(call("create event set"))?;
        let lib = self.nvml.lib();
        let supported =
            raw_sym(&lib.nvmlDeviceGetSupportedEventTypes).map_err(call("event types"))?;
        let register = raw_sym(&lib.nvmlDeviceRegisterEvents).map_err(call("register events"))?;
        for i in 0..self.count()? {
            let d = self
                .nvml
                .device_by_index(i)
                .map_err(call("device handle"))?;
            let mut offered: u64 = 0;
            // SAFETY: handles come from this NVML instance and outlive the calls; the
            // out-pointer is valid for one u64.
            #[allow(unsafe_code)]
            let types = unsafe {
                nvml_wrapper::error::nvml_try(supported(d.handle(), &mut offered))
                    .map(|_| offered & (EVENT_XID | EVENT_RECOVERY_ACTION))
                    .unwrap_or(EVENT_XID)
            };
            // SAFETY: as above; the set is alive for the whole registration.
            #[allow(unsafe_code)]
            let ret = unsafe { register(d.handle(), types, set.handle()) };
            nvml_wrapper::error::nvml_try(ret).map_err(call("register events"))?;
        }
        Ok(EventWatcher { set })
    }
}

/// `nvmlEventTypeXidCriticalError`.
const EVENT_XID: u64 = 0x8;
/// `nvmlEventTypeGpuRecoveryAction` (R565+).
const EVENT_RECOVERY_ACTION: u64 = 0x8000;

/// A raw symbol of the loaded library, or the wrapper's error for a missing one.
fn raw_sym<T: Copy, E: std::fmt::Display>(r: &Result<T, E>) -> Result<T, NvmlError> {
    r.as_ref()
        .map_err(|e| NvmlError::FailedToLoadSymbol(e.to_string()))
        .copied()
}

/// Most NVLinks a GPU has (`NVML_NVLINK_MAX_LINKS`).
const MAX_LINKS: u32 = 18;

/// Error counters of each active NVLink; empty where NVML offers none (no NVLink, or
/// Blackwell, whose DL counters moved to field values).
fn nvlink_errors(d: &Device<'_>) -> Result<Vec<(u32, u64, u64, u64)>, NvmlError> {
    let mut out = Vec::new();
    for link in 0..MAX_LINKS {
        let l = d.link_wrapper_for(link);
        match optional(l.is_active())? {
            Some(true) => {}
            Some(false) => continue,
            None => break,
        }
        let c = |e| optional(l.error_counter(e)).map(|v| v.unwrap_or(0));
        let crc = c(ErrorCounter::DlCrcFlit)? + c(ErrorCounter::DlCrcData)?;
        out.push((
            link,
            crc,
            c(ErrorCounter::DlReplay)?,
            c(ErrorCounter::DlRecovery)?,
        ));
    }
    Ok(out)
}

fn recovery_action(d: &Device<'_>) -> Result<u32, NvmlError> {
    let mut v = d.field_values_for(&[FieldId(FIELD_RECOVERY_ACTION)])?;
    let sample = v.pop().ok_or(NvmlError::NotSupported)??;
    match sample.value? {
        SampleValue::U32(x) => Ok(x),
        SampleValue::U64(x) => Ok(x as u32),
        SampleValue::I64(x) => Ok(x as u32),
        SampleValue::F64(x) => Ok(x as u32),
    }
}

/// Waits on NVML's event set (blocking, not polling).
pub struct EventWatcher<'a> {
    set: EventSet<'a>,
}

impl EventWatcher<'_> {
    /// The next event, or `None` after `timeout_ms` without one.
    pub fn wait(&mut self, timeout_ms: u32) -> Result<Option<Notice>, NvmlSourceError> {
        match self.set.wait(timeout_ms) {
            Ok(e) => {
                let pci = e.device.pci_info().map(|p| pci_of(&p)).map_err(|source| {
                    NvmlSourceError::Call {
                        what: "PCI info of an event's GPU",
                        source,
                    }
                })?;
                if !e.event_type.contains(EventTypes::CRITICAL_XID_ERROR) {
                    return Ok(Some(Notice::Changed { pci }));
                }
                let xid = match e.event_data {
                    Some(XidError::Value(x)) => Some(x),
                    _ => None,
                };
                Ok(Some(Notice::Xid { pci, xid }))
            }
            Err(NvmlError::Timeout) => Ok(None),
            Err(source) => Err(NvmlSourceError::Call {
                what: "wait for events",
                source,
            }),
        }
    }
}
