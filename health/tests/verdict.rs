//! The health policy: signals in, GPU states and a host verdict out, with reasons.

use allot_health::verdict::{
    GpuSample, GpuState, HealthPolicy, HostVerdict, RemappedRows, Thresholds,
};
use allot_health::xid::Catalog;

const A: &str = "0000:3b:00";
const B: &str = "0000:5e:00";

fn policy() -> HealthPolicy {
    HealthPolicy::new(Thresholds::default(), Catalog::default())
}

fn sample(pci: &str) -> GpuSample {
    GpuSample {
        pci: pci.into(),
        uuid: format!("GPU-{pci}"),
        temperature_c: Some(40),
        slowdown_c: Some(87),
        shutdown_c: Some(92),
        ecc_corrected: Some(0),
        ecc_uncorrected: Some(0),
        remapped: Some(RemappedRows::default()),
        retired_pending: Some(false),
        pcie_replay: Some(0),
        nvlink_errors: Some(0),
        recovery_action: Some(0),
        ..GpuSample::default()
    }
}

fn state(p: &HealthPolicy, pci: &str) -> GpuState {
    p.verdict()
        .gpus
        .into_iter()
        .find(|g| g.pci == pci)
        .map_or(GpuState::Healthy, |g| g.state)
}

#[test]
fn healthy_samples_give_ok() {
    let mut p = policy();
    p.sample(0, sample(A));
    p.sample(10, sample(B));
    let v = p.verdict();
    assert_eq!(v.host, HostVerdict::Ok);
    assert!(v
        .gpus
        .iter()
        .all(|g| g.state == GpuState::Healthy && g.reasons.is_empty()));
}

#[test]
fn xid_79_fails_the_gpu_and_drains_the_host_now() {
    let mut p = policy();
    p.sample(0, sample(A));
    p.xid(5, A, 79, "GPU has fallen off the bus.", None);
    let v = p.verdict();
    assert_eq!(v.host, HostVerdict::DrainNow);
    assert!(v.only_gpus.is_empty(), "a lost GPU takes the host");
    let g = &v.gpus[0];
    assert_eq!(g.state, GpuState::Failed);
    assert_eq!(g.reasons[0].signal, "xid:79");
    assert!(
        g.reasons[0].detail.contains("GPU_HAS_FALLEN_OFF_THE_BUS"),
        "{}",
        g.reasons[0].detail
    );
    // XID conditions are sticky: healthy samples do not clear them; a reset does.
    p.sample(10_000, sample(A));
    assert_eq!(state(&p, A), GpuState::Failed);
    p.gpu_reset(A, None);
    assert_eq!(p.verdict().host, HostVerdict::Ok);
}

#[test]
fn application_xids_are_counted_not_drained() {
    let mut p = policy();
    p.xid(0, A, 13, "Graphics Exception", None);
    p.xid(1, A, 13, "Graphics Exception", None);
    assert_eq!(p.verdict().host, HostVerdict::Ok);
    let m = p.metrics("", &|_| Vec::new());
    assert!(
        m.contains("allot_gpu_xid_total{pci_bus_id=\"0000:3b:00\",xid=\"13\"} 2"),
        "{m}"
    );
    assert!(
        m.contains("DCGM_FI_DEV_XID_ERRORS{pci_bus_id=\"0000:3b:00\"} 13"),
        "{m}"
    );
}

#[test]
fn unknown_xids_degrade_without_draining() {
    let mut p = policy();
    p.xid(0, A, 4242, "something new", None);
    let v = p.verdict();
    assert_eq!(
        (v.host, v.gpus[0].state),
        (HostVerdict::Ok, GpuState::Degraded)
    );
    assert!(v.gpus[0].reasons[0].detail.contains("not in the catalog"));
}

#[test]
fn polled_recovery_action_drains_only_that_gpu() {
    // No event at all (the agent was down when XID 95 fired): the field still says
    // "reset required".
    let mut p = policy();
    p.sample(0, sample(B));
    p.sample(
        0,
        GpuSample {
            recovery_action: Some(1),
            ..sample(A)
        },
    );
    let v = p.verdict();
    assert_eq!(v.host, HostVerdict::DrainNow);
    assert_eq!(
        v.only_gpus,
        vec![A.to_string()],
        "only this GPU's leases must end"
    );
    assert_eq!(state(&p, B), GpuState::Healthy);
}

#[test]
fn row_remap_pending_drains_and_failure_drains_now() {
    let mut p = policy();
    let pending = RemappedRows {
        uncorrectable: 1,
        pending: true,
        ..RemappedRows::default()
    };
    p.sample(
        0,
        GpuSample {
            remapped: Some(pending),
            ..sample(A)
        },
    );
    let v = p.verdict();
    assert_eq!(
        (v.host, v.gpus[0].state),
        (HostVerdict::Drain, GpuState::Degraded)
    );
    assert_eq!(v.gpus[0].reasons[0].signal, "row-remap-pending");
    p.sample(
        10,
        GpuSample {
            remapped: Some(RemappedRows {
                failure: true,
                ..pending
            }),
            ..sample(A)
        },
    );
    assert_eq!(p.verdict().host, HostVerdict::DrainNow);
}

#[test]
fn a_flapping_signal_does_not_flap_the_verdict() {
    let mut p = policy();
    let hot = GpuSample {
        temperature_c: Some(84),
        ..sample(A)
    };
    for t in 0..30 {
        let s = if t % 2 == 0 { hot.clone() } else { sample(A) };
        p.sample(t * 10, s);
        assert_eq!(state(&p, A), GpuState::Degraded, "t={}", t * 10);
    }
    // Cool for longer than clear_after: healthy again.
    let mut t = 300;
    while t <= 290 + Thresholds::default().clear_after {
        p.sample(t, sample(A));
        t += 10;
    }
    assert_eq!(state(&p, A), GpuState::Healthy);
}

#[test]
fn rates_and_new_uncorrectable_errors() {
    let mut p = policy();
    p.sample(0, sample(A));
    // 30 NVLink errors in 10 minutes = 180/h, above 100/h: drain the host.
    p.sample(
        600,
        GpuSample {
            nvlink_errors: Some(30),
            ..sample(A)
        },
    );
    let v = p.verdict();
    assert_eq!(v.host, HostVerdict::Drain);
    assert!(v.only_gpus.is_empty(), "a bad link concerns the host");
    assert!(
        v.gpus[0].reasons[0]
            .detail
            .starts_with("180 NVLink errors/h"),
        "{:?}",
        v.gpus[0].reasons
    );
    // An uncorrectable ECC error since the last sample: now.
    p.sample(
        610,
        GpuSample {
            nvlink_errors: Some(30),
            ecc_uncorrected: Some(1),
            ..sample(A)
        },
    );
    assert_eq!(p.verdict().host, HostVerdict::DrainNow);
}

#[test]
fn replayed_history_does_not_drain_again() {
    let mut p = policy();
    p.xid(0, A, 48, "double bit error", Some(100));
    assert_eq!(p.verdict().host, HostVerdict::DrainNow);
    p.gpu_reset(A, Some(100));
    // The agent restarts and reads the ring buffer again: seq 100 is history.
    p.xid(50, A, 48, "double bit error", Some(100));
    assert_eq!(p.verdict().host, HostVerdict::Ok);
    p.xid(60, A, 48, "double bit error", Some(101));
    assert_eq!(p.verdict().host, HostVerdict::DrainNow);
}

#[test]
fn lost_gpus_fail() {
    let mut p = policy();
    p.lost(0, B);
    let v = p.verdict();
    assert_eq!(
        (v.host, v.gpus[0].state),
        (HostVerdict::DrainNow, GpuState::Failed)
    );
    assert_eq!(v.gpus[0].reasons[0].signal, "gpu-lost");
}

#[test]
fn metrics_use_dcgm_names() {
    let mut p = policy();
    p.sample(
        0,
        GpuSample {
            pcie_replay: Some(7),
            index: Some(0),
            name: Some("NVIDIA H100 80GB HBM3".into()),
            utilization_pct: Some(55),
            memory_total: Some(80 << 30),
            memory_used: Some(1 << 30),
            power_mw: Some(350_000),
            ..sample(A)
        },
    );
    p.xid(
        1,
        "0000:3b:00",
        79,
        "Xid 79: GPU has fallen off the bus",
        None,
    );
    let held = |uuid: &str| {
        if uuid == "GPU-0000:3b:00" {
            vec![("lease", "L1".to_string()), ("workload", "7".to_string())]
        } else {
            Vec::new()
        }
    };
    let m = p.metrics("host-a", &held);
    let labels = "gpu=\"0\",UUID=\"GPU-0000:3b:00\",pci_bus_id=\"0000:3b:00\",Hostname=\"host-a\",model=\"NVIDIA H100 80GB HBM3\",lease=\"L1\",workload=\"7\"";
    for line in [
        format!("DCGM_FI_DEV_GPU_TEMP{{{labels}}} 40"),
        format!("allot_gpu_pcie_replays_total{{{labels}}} 7"),
        format!("DCGM_FI_DEV_GPU_UTIL{{{labels}}} 55"),
        format!("DCGM_FI_DEV_FB_USED{{{labels}}} 1024"),
        format!("DCGM_FI_DEV_POWER_USAGE{{{labels}}} 350"),
        format!("DCGM_FI_DEV_XID_ERRORS{{{labels}}} 79"),
        format!("allot_gpu_xid_total{{{labels},xid=\"79\"}} 1"),
        "# TYPE DCGM_FI_DEV_GPU_UTIL gauge".to_string(),
    ] {
        assert!(m.contains(&line), "{line} not in\n{m}");
    }
    assert!(m.contains("allot_gpu_health_state{"), "{m}");
}

#[test]
fn one_error_between_close_samples_is_not_a_rate() {
    let mut p = policy();
    p.sample(0, sample(A));
    // +1 on every counter ten seconds later: 360/h if taken at face value.
    p.sample(
        10,
        GpuSample {
            ecc_corrected: Some(1),
            pcie_replay: Some(1),
            nvlink_errors: Some(1),
            ..sample(A)
        },
    );
    assert_eq!(
        (p.verdict().host, state(&p, A)),
        (HostVerdict::Ok, GpuState::Healthy)
    );
}

#[test]
fn uncorrectable_errors_stay_until_reset_and_reset_clears_levels() {
    let mut p = policy();
    p.sample(0, sample(A));
    p.sample(
        10,
        GpuSample {
            ecc_uncorrected: Some(1),
            remapped: Some(RemappedRows {
                pending: true,
                ..RemappedRows::default()
            }),
            ..sample(A)
        },
    );
    let v = p.verdict();
    assert_eq!(v.host, HostVerdict::DrainNow);
    assert_eq!(
        v.only_gpus,
        vec![A.to_string()],
        "a memory error needs this GPU reset, not the host"
    );
    // Long after, with the counter steady, it still stands: time does not fix memory.
    p.sample(
        5_000,
        GpuSample {
            ecc_uncorrected: Some(1),
            ..sample(A)
        },
    );
    assert_eq!(p.verdict().host, HostVerdict::DrainNow);
    // After a reset the GPU is back at once; the next sample decides afresh.
    p.gpu_reset(A, None);
    p.sample(
        5_010,
        GpuSample {
            ecc_uncorrected: Some(0),
            ..sample(A)
        },
    );
    assert_eq!(p.verdict().host, HostVerdict::Ok);
}

#[test]
fn xids_needing_a_reset_drain_only_their_gpu() {
    let mut p = policy();
    p.sample(0, sample(B));
    p.xid(0, A, 95, "Uncontained: FBHUB", None);
    let v = p.verdict();
    assert_eq!(v.host, HostVerdict::DrainNow);
    assert_eq!(v.only_gpus, vec![A.to_string()]);
}
