//! A fake `libnvidia-ml.so` for tests: the part of NVML's C API that allot's NVML
//! backend calls (through nvml-wrapper), driven by a plain-text state file named by
//! `ALLOT_FAKE_NVML`, re-read when it changed at the calls that start a sampling round
//! (init, device count, handle lookup) and while waiting for events:
//!
//! ```text
//! driver 570.86.15
//! gpu 0 uuid=GPU-0 name=NVIDIA_H100 pci=0000:3b:00 temp=45 slowdown=87 shutdown=92 \
//!       power=350000 mem_total=85899345920 mem_used=1024 util=50 ecc_corr=0 ecc_unc=0 \
//!       remap_corr=0 remap_unc=0 remap_pending=0 remap_failure=0 pcie_replay=0 \
//!       recovery=0 lost=0 unsupported=recovery,remap
//! xid 0 79
//! ```
//!
//! `xid G N` and `recovery-event G N` lines are events (an XID; the recovery action
//! changing to N), each delivered once through `nvmlEventSetWait_v2`,
//! which blocks (polling the file) until one is due or the timeout passes. `lost=1`
//! makes every query of that GPU return `NVML_ERROR_GPU_IS_LOST`; `unsupported=`
//! lists fields answered with `NVML_ERROR_NOT_SUPPORTED`. Names use `_` for spaces.

#![allow(unsafe_code, clippy::missing_safety_doc, non_snake_case)]

use std::collections::BTreeMap;
use std::ffi::{c_char, c_int, c_uint, c_ulonglong, c_void};
use std::sync::Mutex;
use std::time::{Duration, Instant};

type Ret = c_uint;
const SUCCESS: Ret = 0;
const INVALID_ARGUMENT: Ret = 2;
const NOT_SUPPORTED: Ret = 3;
const NOT_FOUND: Ret = 6;
const INSUFFICIENT_SIZE: Ret = 7;
const TIMEOUT: Ret = 10;
const GPU_IS_LOST: Ret = 15;
const UNKNOWN: Ret = 999;

const EVENT_XID: c_ulonglong = 0x8;
const EVENT_RECOVERY_ACTION: c_ulonglong = 0x8000;
const FIELD_RECOVERY_ACTION: c_uint = 230;

#[derive(Default, Clone)]
struct Gpu {
    kv: BTreeMap<String, String>,
}

impl Gpu {
    fn get(&self, k: &str) -> u64 {
        self.kv.get(k).and_then(|v| v.parse().ok()).unwrap_or(0)
    }
    fn text(&self, k: &str) -> String {
        self.kv
            .get(k)
            .cloned()
            .unwrap_or_default()
            .replace('_', " ")
    }
    fn unsupported(&self, what: &str) -> bool {
        self.kv
            .get("unsupported")
            .is_some_and(|v| v.split(',').any(|x| x == what))
    }
    fn lost(&self) -> bool {
        self.get("lost") == 1
    }
}

#[derive(Default)]
struct State {
    stamp: Option<(std::time::SystemTime, u64)>,
    driver: String,
    gpus: Vec<Gpu>,
    events: Vec<(usize, u64, u64)>,
    delivered: usize,
    /// Event types registered per GPU: only those are delivered.
    registered: BTreeMap<usize, u64>,
}

static STATE: Mutex<Option<State>> = Mutex::new(None);

fn reload(st: &mut State) {
    let Ok(path) = std::env::var("ALLOT_FAKE_NVML") else {
        return;
    };
    let Ok(meta) = std::fs::metadata(&path) else {
        return;
    };
    let stamp = (meta.modified().unwrap_or(std::time::UNIX_EPOCH), meta.len());
    if st.stamp == Some(stamp) {
        return;
    }
    let Ok(text) = std::fs::read_to_string(&path) else {
        return;
    };
    st.stamp = Some(stamp);
    st.gpus.clear();
    let old_events = st.events.len();
    st.events.clear();
    for line in text.lines() {
        let mut w = line.split_whitespace();
        match w.next() {
            Some("driver") => st.driver = w.next().unwrap_or("").to_string(),
            Some("gpu") => {
                let mut g = Gpu::default();
                w.next();
                for kv in w {
                    if let Some((k, v)) = kv.split_once('=') {
                        g.kv.insert(k.to_string(), v.to_string());
                    }
                }
                st.gpus.push(g);
            }
            Some(kind @ ("xid" | "recovery-event")) => {
                let gpu = w.next().and_then(|x| x.parse().ok()).unwrap_or(0);
                let data = w.next().and_then(|x| x.parse().ok()).unwrap_or(0);
                let ty = if kind == "xid" {
                    EVENT_XID
                } else {
                    EVENT_RECOVERY_ACTION
                };
                st.events.push((gpu, ty, data));
            }
            _ => {}
        }
    }
    // A rewritten file with fewer events starts delivery afresh.
    if st.events.len() < old_events {
        st.delivered = 0;
    }
}

/// Runs `f` on the state as last read. Field queries use this: re-reading the file on
/// every one of a sample's hundreds of calls would time the fake, not the backend.
fn with<R>(f: impl FnOnce(&mut State) -> R) -> R {
    let mut guard = STATE.lock().unwrap_or_else(|e| e.into_inner());
    f(guard.get_or_insert_with(State::default))
}

/// Runs `f` after picking up changes to the state file: at init, at the device count
/// and handle lookups that start every sampling round, and while waiting for events.
fn with_reload<R>(f: impl FnOnce(&mut State) -> R) -> R {
    with(|st| {
        reload(st);
        f(st)
    })
}

fn index(device: *mut c_void) -> usize {
    (device as usize).wrapping_sub(1)
}

/// Runs `f` on the device's GPU, mapping lost and unknown devices to errors.
fn gpu(device: *mut c_void, f: impl FnOnce(&Gpu) -> Ret) -> Ret {
    with(|st| match st.gpus.get(index(device)) {
        None => INVALID_ARGUMENT,
        Some(g) if g.lost() => GPU_IS_LOST,
        Some(g) => f(g),
    })
}

unsafe fn write_str(s: &str, buf: *mut c_char, len: c_uint) -> Ret {
    if buf.is_null() {
        return INVALID_ARGUMENT;
    }
    let bytes = s.as_bytes();
    if bytes.len() + 1 > len as usize {
        return INSUFFICIENT_SIZE;
    }
    std::ptr::copy_nonoverlapping(bytes.as_ptr(), buf as *mut u8, bytes.len());
    *buf.add(bytes.len()) = 0;
    SUCCESS
}

#[no_mangle]
pub extern "C" fn nvmlInit_v2() -> Ret {
    with_reload(|_| SUCCESS)
}

#[no_mangle]
pub extern "C" fn nvmlInitWithFlags(_flags: c_uint) -> Ret {
    with_reload(|_| SUCCESS)
}

#[no_mangle]
pub extern "C" fn nvmlShutdown() -> Ret {
    SUCCESS
}

#[no_mangle]
pub unsafe extern "C" fn nvmlErrorString(_r: Ret) -> *const c_char {
    c"fake NVML error".as_ptr()
}

#[no_mangle]
pub unsafe extern "C" fn nvmlSystemGetDriverVersion(buf: *mut c_char, len: c_uint) -> Ret {
    let v = with(|st| st.driver.clone());
    write_str(&v, buf, len)
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetCount_v2(count: *mut c_uint) -> Ret {
    if count.is_null() {
        return INVALID_ARGUMENT;
    }
    *count = with_reload(|st| st.gpus.len() as c_uint);
    SUCCESS
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetHandleByIndex_v2(i: c_uint, device: *mut *mut c_void) -> Ret {
    if device.is_null() {
        return INVALID_ARGUMENT;
    }
    let n = with_reload(|st| st.gpus.len());
    if i as usize >= n {
        return INVALID_ARGUMENT;
    }
    *device = (i as usize + 1) as *mut c_void;
    SUCCESS
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetUUID(
    device: *mut c_void,
    buf: *mut c_char,
    len: c_uint,
) -> Ret {
    gpu(device, |g| write_str(&g.text("uuid"), buf, len))
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetName(
    device: *mut c_void,
    buf: *mut c_char,
    len: c_uint,
) -> Ret {
    gpu(device, |g| write_str(&g.text("name"), buf, len))
}

/// `nvmlPciInfo_t`.
#[repr(C)]
pub struct PciInfo {
    bus_id_legacy: [c_char; 16],
    domain: c_uint,
    bus: c_uint,
    device: c_uint,
    pci_device_id: c_uint,
    pci_sub_system_id: c_uint,
    bus_id: [c_char; 32],
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetPciInfo_v3(device: *mut c_void, out: *mut PciInfo) -> Ret {
    gpu(device, |g| {
        let text = g.text("pci");
        let parts: Vec<u32> = text
            .split(':')
            .map(|p| u32::from_str_radix(p, 16).unwrap_or(0))
            .collect();
        let (d, b, v) = match parts.as_slice() {
            [d, b, v] => (*d, *b, *v),
            _ => return UNKNOWN,
        };
        let out = &mut *out;
        out.domain = d;
        out.bus = b;
        out.device = v;
        out.pci_device_id = 0x2330_10de;
        out.pci_sub_system_id = 0;
        let full = format!("{d:08X}:{b:02X}:{v:02X}.0");
        let legacy = format!("{d:04X}:{b:02X}:{v:02X}.0");
        out.bus_id = [0; 32];
        out.bus_id_legacy = [0; 16];
        for (i, c) in full.bytes().take(31).enumerate() {
            out.bus_id[i] = c as c_char;
        }
        for (i, c) in legacy.bytes().take(15).enumerate() {
            out.bus_id_legacy[i] = c as c_char;
        }
        SUCCESS
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetTemperature(
    device: *mut c_void,
    _sensor: c_uint,
    t: *mut c_uint,
) -> Ret {
    gpu(device, |g| {
        *t = g.get("temp") as c_uint;
        SUCCESS
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetTemperatureThreshold(
    device: *mut c_void,
    kind: c_uint,
    t: *mut c_uint,
) -> Ret {
    gpu(device, |g| {
        // 0 = shutdown, 1 = slowdown.
        *t = g.get(if kind == 0 { "shutdown" } else { "slowdown" }) as c_uint;
        SUCCESS
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetPowerUsage(device: *mut c_void, mw: *mut c_uint) -> Ret {
    gpu(device, |g| {
        *mw = g.get("power") as c_uint;
        SUCCESS
    })
}

/// `nvmlMemory_v2_t`.
#[repr(C)]
pub struct MemoryV2 {
    version: c_uint,
    total: c_ulonglong,
    reserved: c_ulonglong,
    free: c_ulonglong,
    used: c_ulonglong,
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo_v2(device: *mut c_void, m: *mut MemoryV2) -> Ret {
    gpu(device, |g| {
        let m = &mut *m;
        m.total = g.get("mem_total");
        m.used = g.get("mem_used");
        m.reserved = 0;
        m.free = m.total.saturating_sub(m.used);
        SUCCESS
    })
}

/// `nvmlUtilization_t`.
#[repr(C)]
pub struct Utilization {
    gpu: c_uint,
    memory: c_uint,
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetUtilizationRates(
    device: *mut c_void,
    u: *mut Utilization,
) -> Ret {
    gpu(device, |g| {
        (*u).gpu = g.get("util") as c_uint;
        (*u).memory = 0;
        SUCCESS
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetTotalEccErrors(
    device: *mut c_void,
    error_type: c_uint,
    _counter: c_uint,
    n: *mut c_ulonglong,
) -> Ret {
    gpu(device, |g| {
        if g.unsupported("ecc") {
            return NOT_SUPPORTED;
        }
        // 0 = corrected, 1 = uncorrected.
        *n = g.get(if error_type == 0 {
            "ecc_corr"
        } else {
            "ecc_unc"
        });
        SUCCESS
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetPcieReplayCounter(
    device: *mut c_void,
    n: *mut c_uint,
) -> Ret {
    gpu(device, |g| {
        *n = g.get("pcie_replay") as c_uint;
        SUCCESS
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetRemappedRows(
    device: *mut c_void,
    corr: *mut c_uint,
    unc: *mut c_uint,
    pending: *mut c_uint,
    failure: *mut c_uint,
) -> Ret {
    gpu(device, |g| {
        if g.unsupported("remap") {
            return NOT_SUPPORTED;
        }
        *corr = g.get("remap_corr") as c_uint;
        *unc = g.get("remap_unc") as c_uint;
        *pending = g.get("remap_pending") as c_uint;
        *failure = g.get("remap_failure") as c_uint;
        SUCCESS
    })
}

/// `nvmlFieldValue_t`.
#[repr(C)]
pub struct FieldValue {
    field_id: c_uint,
    scope_id: c_uint,
    timestamp: i64,
    latency_usec: i64,
    value_type: c_uint,
    nvml_return: Ret,
    value: u64,
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetFieldValues(
    device: *mut c_void,
    count: c_int,
    values: *mut FieldValue,
) -> Ret {
    gpu(device, |g| {
        for i in 0..count.max(0) as usize {
            let v = &mut *values.add(i);
            v.timestamp = 0;
            v.latency_usec = 0;
            v.value_type = 1; // unsigned int
            if v.field_id == FIELD_RECOVERY_ACTION && !g.unsupported("recovery") {
                v.nvml_return = SUCCESS;
                v.value = g.get("recovery");
            } else {
                v.nvml_return = NOT_SUPPORTED;
                v.value = 0;
            }
        }
        SUCCESS
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlEventSetCreate(set: *mut *mut c_void) -> Ret {
    *set = std::ptr::dangling_mut::<c_void>();
    SUCCESS
}

#[no_mangle]
pub extern "C" fn nvmlEventSetFree(_set: *mut c_void) -> Ret {
    SUCCESS
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetSupportedEventTypes(
    device: *mut c_void,
    types: *mut c_ulonglong,
) -> Ret {
    gpu(device, |_| {
        *types = EVENT_XID | EVENT_RECOVERY_ACTION | 0x1 | 0x2;
        SUCCESS
    })
}

#[no_mangle]
pub extern "C" fn nvmlDeviceRegisterEvents(
    device: *mut c_void,
    types: c_ulonglong,
    _set: *mut c_void,
) -> Ret {
    let r = gpu(device, |_| SUCCESS);
    if r == SUCCESS {
        with(|st| *st.registered.entry(index(device)).or_insert(0) |= types);
    }
    r
}

/// `nvmlEventData_t`.
#[repr(C)]
pub struct EventData {
    device: *mut c_void,
    event_type: c_ulonglong,
    event_data: c_ulonglong,
    gpu_instance_id: c_uint,
    compute_instance_id: c_uint,
}

#[no_mangle]
pub unsafe extern "C" fn nvmlEventSetWait_v2(
    _set: *mut c_void,
    data: *mut EventData,
    timeout_ms: c_uint,
) -> Ret {
    let deadline = Instant::now() + Duration::from_millis(u64::from(timeout_ms));
    loop {
        let next = with_reload(|st| {
            // Events of types nobody registered for are consumed unseen, as NVML does.
            while let Some(&(gpu, ty, value)) = st.events.get(st.delivered) {
                st.delivered += 1;
                if st.registered.get(&gpu).is_some_and(|m| m & ty != 0) {
                    return Some((gpu, ty, value));
                }
            }
            None
        });
        if let Some((gpu, ty, value)) = next {
            let d = &mut *data;
            d.device = (gpu + 1) as *mut c_void;
            d.event_type = ty;
            d.event_data = value;
            d.gpu_instance_id = 0xFFFF_FFFF;
            d.compute_instance_id = 0xFFFF_FFFF;
            return SUCCESS;
        }
        if Instant::now() >= deadline {
            return TIMEOUT;
        }
        // The file is the only channel a test has; poll it briefly.
        std::thread::sleep(Duration::from_millis(2));
    }
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetIndex(device: *mut c_void, i: *mut c_uint) -> Ret {
    gpu(device, |_| {
        *i = index(device) as c_uint;
        SUCCESS
    })
}

#[no_mangle]
pub extern "C" fn nvmlDeviceGetHandleByUUID(
    _uuid: *const c_char,
    _device: *mut *mut c_void,
) -> Ret {
    NOT_FOUND
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetArchitecture(device: *mut c_void, arch: *mut c_uint) -> Ret {
    gpu(device, |g| {
        // NVML_DEVICE_ARCH_HOPPER = 9, BLACKWELL = 10.
        *arch = g.kv.get("arch").and_then(|a| a.parse().ok()).unwrap_or(9);
        SUCCESS
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetRetiredPagesPendingStatus(
    device: *mut c_void,
    _pending: *mut c_uint,
) -> Ret {
    // Hopper and later remap rows instead of retiring pages.
    gpu(device, |_| NOT_SUPPORTED)
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetCurrentClocksThrottleReasons(
    device: *mut c_void,
    r: *mut c_ulonglong,
) -> Ret {
    gpu(device, |g| {
        *r = g.get("throttle");
        SUCCESS
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetPersistenceMode(
    device: *mut c_void,
    mode: *mut c_uint,
) -> Ret {
    gpu(device, |_| {
        *mode = 1;
        SUCCESS
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMigMode(
    device: *mut c_void,
    current: *mut c_uint,
    pending: *mut c_uint,
) -> Ret {
    gpu(device, |g| {
        *current = g.get("mig") as c_uint;
        *pending = *current;
        SUCCESS
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetNvLinkState(
    device: *mut c_void,
    link: c_uint,
    active: *mut c_uint,
) -> Ret {
    gpu(device, |g| {
        let links = g.get("nvlinks");
        if links == 0 {
            return NOT_SUPPORTED;
        }
        if u64::from(link) >= links {
            return INVALID_ARGUMENT;
        }
        *active = 1;
        SUCCESS
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetNvLinkErrorCounter(
    device: *mut c_void,
    link: c_uint,
    counter: c_uint,
    n: *mut c_ulonglong,
) -> Ret {
    gpu(device, |g| {
        // 0 replay, 1 recovery, 2 CRC flit, 3 CRC data; errors sit on link 0 only.
        let key = match counter {
            0 => "nvlink_replay",
            1 => "nvlink_recovery",
            2 => "nvlink_crc",
            _ => "",
        };
        *n = if link == 0 { g.get(key) } else { 0 };
        SUCCESS
    })
}
