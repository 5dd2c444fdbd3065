//! The NVML backend against the repo's fake `libnvidia-ml.so`, loaded through
//! nvml-wrapper exactly as NVIDIA's library is on a GPU host.

use allot_health::verdict::{HealthPolicy, HostVerdict, Thresholds};
use allot_health::xid::Catalog;
use allot_health_sources::nvml::{GpuReadError, Notice, NvmlSource};
#[path = "support/fake_nvml.rs"]
mod fake_nvml;

use fake_nvml::{eight_gpus, fake, write_state};
use std::path::Path;
use std::sync::Mutex;

/// NVML is process-global (one library, one state file): tests take turns.
static TURN: Mutex<()> = Mutex::new(());

#[test]
fn samples_eight_gpus() {
    let _turn = TURN.lock().unwrap_or_else(|e| e.into_inner());
    let (lib, state) = fake();
    write_state(state, &eight_gpus(""));
    let src = NvmlSource::open(Some(lib)).expect("loads the fake");
    assert_eq!(src.driver_version().as_deref(), Some("570.86.15"));
    let samples = src.sample_all().expect("count");
    assert_eq!(samples.len(), 8);
    let s: Vec<_> = samples.into_iter().map(|r| r.expect("sampled")).collect();
    assert_eq!(s[0].pci, "0000:18:00");
    assert_eq!(s[0].uuid, "GPU-00000000");
    assert_eq!(
        (s[3].temperature_c, s[3].slowdown_c, s[3].shutdown_c),
        (Some(43), Some(87), Some(92))
    );
    assert_eq!(s[5].pcie_replay, Some(5));
    assert_eq!(s[0].recovery_action, Some(0));
    assert_eq!(
        s[7].recovery_action, None,
        "NOT_SUPPORTED on an older GPU is a missing field"
    );
    assert_eq!(s[0].remapped.map(|r| r.pending), Some(false));
    assert_eq!(s[0].name.as_deref(), Some("NVIDIA H100 80GB HBM3"));
    assert_eq!(s[0].architecture.as_deref(), Some("Hopper"));
    assert_eq!(
        (s[0].power_mw, s[0].utilization_pct),
        (Some(350_000), Some(50))
    );
    assert_eq!(
        (s[0].memory_total, s[0].memory_used),
        (Some(85_899_345_920), Some(1024))
    );
    assert_eq!((s[0].persistence, s[0].mig), (Some(true), Some(false)));
    assert_eq!(
        s[0].retired_pending, None,
        "page retirement is not offered on Hopper"
    );
    assert_eq!(s[3].nvlink.len(), 18, "all active links read");
    assert_eq!(s[3].nvlink[0], (0, 0, 3, 0));
    assert_eq!(s[3].nvlink_errors, Some(3));
    assert_eq!(s[0].index, Some(0));
}

#[test]
fn xid_79_event_drains_the_host_now() {
    let _turn = TURN.lock().unwrap_or_else(|e| e.into_inner());
    let (lib, state) = fake();
    write_state(state, &eight_gpus(""));
    let src = NvmlSource::open(Some(lib)).expect("loads");
    let mut w = src.watch().expect("event set");
    assert_eq!(w.wait(20).expect("waits"), None, "no event yet: a timeout");
    write_state(state, &eight_gpus("xid 2 79\n"));
    let n = w.wait(2_000).expect("waits").expect("the XID arrives");
    let Notice::Xid { pci, xid } = n else {
        panic!("an XID, got {n:?}")
    };
    assert_eq!((pci.as_str(), xid), ("0000:38:00", Some(79)));
    let mut p = HealthPolicy::new(Thresholds::default(), Catalog::default());
    p.xid(1, &pci, xid.unwrap_or(999) as u32, "NVML event", None);
    assert_eq!(p.verdict().host, HostVerdict::DrainNow);
}

#[test]
fn row_remap_pending_drains() {
    let _turn = TURN.lock().unwrap_or_else(|e| e.into_inner());
    let (lib, state) = fake();
    write_state(
        state,
        &eight_gpus("").replace(
            "gpu 4 uuid=GPU-00000004",
            "gpu 4 remap_unc=1 remap_pending=1 uuid=GPU-00000004",
        ),
    );
    let src = NvmlSource::open(Some(lib)).expect("loads");
    let mut p = HealthPolicy::new(Thresholds::default(), Catalog::default());
    for s in src.sample_all().expect("count") {
        p.sample(0, s.expect("sampled"));
    }
    let v = p.verdict();
    assert_eq!(v.host, HostVerdict::Drain);
    assert_eq!(v.only_gpus, vec!["0000:58:00".to_string()]);
}

#[test]
fn a_lost_gpu_is_reported_lost_and_the_rest_still_sampled() {
    let _turn = TURN.lock().unwrap_or_else(|e| e.into_inner());
    let (lib, state) = fake();
    write_state(
        state,
        &eight_gpus("").replace("gpu 6 uuid", "gpu 6 lost=1 uuid"),
    );
    let src = NvmlSource::open(Some(lib)).expect("loads");
    let all = src.sample_all().expect("count");
    assert!(
        matches!(all[6], Err(GpuReadError::Lost { index: 6, .. })),
        "{:?}",
        all[6]
    );
    assert_eq!(all.iter().filter(|r| r.is_ok()).count(), 7);
}

#[test]
fn a_missing_library_is_a_clear_error() {
    let e = NvmlSource::open(Some(Path::new("/nonexistent/libnvidia-ml.so.1")))
        .err()
        .expect("fails");
    let msg = e.to_string();
    assert!(
        msg.starts_with("cannot load NVML from /nonexistent/libnvidia-ml.so.1"),
        "{msg}"
    );
    assert!(msg.contains("install the NVIDIA driver"), "{msg}");
}

#[test]
fn a_gpu_that_leaves_the_device_list_is_lost() {
    use allot_health_sources::monitor::Roster;
    let _turn = TURN.lock().unwrap_or_else(|e| e.into_inner());
    let (lib, state) = fake();
    write_state(state, &eight_gpus(""));
    let src = NvmlSource::open(Some(lib)).expect("loads");
    let mut p = HealthPolicy::new(Thresholds::default(), Catalog::default());
    let mut roster = Roster::default();
    assert!(roster
        .apply(&mut p, 0, src.sample_all().expect("count"))
        .is_empty());
    // The driver drops GPU 7 (0000:88:00) from the list altogether.
    let seven: String = eight_gpus("")
        .lines()
        .filter(|l| !l.starts_with("gpu 7 "))
        .map(|l| format!("{l}\n"))
        .collect();
    write_state(state, &seven);
    let lost = roster.apply(&mut p, 10, src.sample_all().expect("count"));
    assert_eq!(lost, vec!["0000:88:00".to_string()]);
    let v = p.verdict();
    assert_eq!(v.host, HostVerdict::DrainNow);
    let g = v
        .gpus
        .iter()
        .find(|g| g.pci == "0000:88:00")
        .expect("listed");
    assert_eq!(g.reasons[0].signal, "gpu-lost");
}

#[test]
fn a_recovery_action_event_prompts_a_sample_that_drains_the_gpu() {
    let _turn = TURN.lock().unwrap_or_else(|e| e.into_inner());
    let (lib, state) = fake();
    write_state(state, &eight_gpus(""));
    let src = NvmlSource::open(Some(lib)).expect("loads");
    let mut w = src.watch().expect("event set");
    // The driver now wants GPU 3 reset, and says so through an event.
    let changed = eight_gpus("recovery-event 3 1\n").replace(
        "recovery=0 nvlinks=18 nvlink_replay=3",
        "recovery=1 nvlinks=18 nvlink_replay=3",
    );
    write_state(state, &changed);
    let n = w.wait(2_000).expect("waits").expect("the event arrives");
    assert_eq!(
        n,
        Notice::Changed {
            pci: "0000:48:00".into()
        }
    );
    let s = src.sample(3).expect("samples");
    assert_eq!(s.recovery_action, Some(1));
    let mut p = HealthPolicy::new(Thresholds::default(), Catalog::default());
    p.sample(0, s);
    let v = p.verdict();
    assert_eq!(v.host, HostVerdict::DrainNow);
    assert_eq!(
        v.only_gpus,
        vec!["0000:48:00".to_string()],
        "a reset concerns that GPU alone"
    );
}
