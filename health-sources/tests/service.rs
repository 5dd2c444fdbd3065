//! The running monitor: a fault from any source reaches a new verdict on the channel.

#[path = "support/fake_nvml.rs"]
mod fake_nvml;

use allot_health::config::HealthConfig;
use allot_health::verdict::{HostVerdict, Verdict};
use allot_health_sources::service::HealthMonitor;
use std::time::Duration;

/// Waits for a verdict with `host` (the channel is the event; the timeout only stops a
/// broken build from hanging CI).
fn until(m: &HealthMonitor, host: HostVerdict) -> Verdict {
    loop {
        let v = m
            .updates
            .recv_timeout(Duration::from_secs(20))
            .expect("a verdict update arrives");
        if v.host == host {
            return v;
        }
    }
}

fn tempdir(tag: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("allot-health-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&d).expect("dir");
    d
}

#[test]
fn scripted_fake_source_fault_drains() {
    let dir = tempdir("fake");
    let script = dir.join("faults.txt");
    std::fs::write(&script, "at 0s gpu 2 xid 79\n").expect("write");
    let cfg = HealthConfig {
        source: format!("fake:8:{}", script.display()),
        kmsg: String::new(),
        ..HealthConfig::default()
    };
    let m = HealthMonitor::start(&cfg, &dir).expect("starts");
    let v = until(&m, HostVerdict::DrainNow);
    assert!(v
        .gpus
        .iter()
        .any(|g| g.reasons.iter().any(|r| r.signal == "xid:79")));
    let text = m.metrics("", &|_| Vec::new());
    assert!(
        text.lines().any(|l| l.starts_with("allot_gpu_xid_total{")
            && l.contains("pci_bus_id=\"0000:38:00\"")
            && l.ends_with(",xid=\"79\"} 1")),
        "{text}"
    );
}

#[test]
fn kernel_log_xids_survive_restarts_until_the_gpu_is_reset() {
    let dir = tempdir("kmsg");
    let log = dir.join("kmsg");
    std::fs::write(
        &log,
        "4,7,100,-;NVRM: Xid (PCI:0000:18:00): 119, pid=1, name=x, GSP timeout\n",
    )
    .expect("write");
    let cfg = HealthConfig {
        source: "fake:8".into(),
        kmsg: log.display().to_string(),
        ..HealthConfig::default()
    };
    let m = HealthMonitor::start(&cfg, &dir).expect("starts");
    until(&m, HostVerdict::DrainNow);
    drop(m);
    // Restarted without a reset: the GPU still needs one, so the replay drains again.
    let m = HealthMonitor::start(&cfg, &dir).expect("restarts");
    until(&m, HostVerdict::DrainNow);
    m.gpu_reset("0000:18:00");
    until(&m, HostVerdict::Ok);
    drop(m);
    // Restarted after the reset, with one new record since on another GPU: the old
    // record is history (records are read in order, so by the time the new one drains
    // the host the old one was passed over).
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .open(&log)
        .expect("append");
    std::io::Write::write_all(
        &mut f,
        b"4,8,200,-;NVRM: Xid (PCI:0000:28:00): 79, GPU has fallen off the bus.\n",
    )
    .expect("append");
    let m = HealthMonitor::start(&cfg, &dir).expect("restarts");
    let v = until(&m, HostVerdict::DrainNow);
    let old = v.gpus.iter().find(|g| g.pci == "0000:18:00");
    assert!(
        old.is_none_or(|g| g.reasons.is_empty()),
        "history acted on again: {v:?}"
    );
    assert!(v
        .gpus
        .iter()
        .any(|g| g.pci == "0000:28:00" && g.reasons[0].signal == "xid:79"));
}

#[test]
fn a_cleared_fault_in_a_log_without_sequence_numbers_stays_cleared() {
    // dmesg's shape, as the README's recipe writes it: no kmsg sequence number.
    let dir = tempdir("kmsg-dmesg");
    let log = dir.join("kmsg");
    std::fs::write(
        &log,
        "[12345.678901] NVRM: Xid (PCI:0000:18:00): 79, pid=4242, name=python, GPU has fallen off the bus.\n",
    )
    .expect("write");
    let cfg = HealthConfig {
        source: "fake:8".into(),
        kmsg: log.display().to_string(),
        ..HealthConfig::default()
    };
    let m = HealthMonitor::start(&cfg, &dir).expect("starts");
    until(&m, HostVerdict::DrainNow);
    drop(m);
    // Not cleared: still failed after a restart.
    let m = HealthMonitor::start(&cfg, &dir).expect("restarts");
    until(&m, HostVerdict::DrainNow);
    m.gpu_reset("0000:18:00");
    until(&m, HostVerdict::Ok);
    drop(m);
    // Cleared, then restarted twice, with a new line on another GPU: the old line is
    // passed over (it is read before the new one drains the host).
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .open(&log)
        .expect("append");
    std::io::Write::write_all(
        &mut f,
        b"[12399.000001] NVRM: Xid (PCI:0000:28:00): 79, pid=7, name=python, GPU has fallen off the bus.\n",
    )
    .expect("append");
    for _ in 0..2 {
        let m = HealthMonitor::start(&cfg, &dir).expect("restarts");
        let v = until(&m, HostVerdict::DrainNow);
        let old = v.gpus.iter().find(|g| g.pci == "0000:18:00");
        assert!(
            old.is_none_or(|g| g.reasons.is_empty()),
            "a cleared fault came back: {v:?}"
        );
    }
}

#[test]
fn kernel_log_fall_named_by_an_earlier_line_drains_that_gpu() {
    let dir = tempdir("kmsg-multi");
    let log = dir.join("kmsg");
    // The driver's multi-line shape: the bus id only in the announcement, no Xid line.
    std::fs::write(
        &log,
        "4,10,100,-;NVRM: GPU at PCI:0000:48:00: GPU-2bb7e0d8-1e4e-6dc4-9a87-1b5d0a7c2f11\n\
         4,11,100,-;NVRM: GPU Board Serial Number: 1234567890123\n\
         6,12,101,-;usb 1-1: new high-speed USB device\n\
         4,13,102,-;NVRM: A GPU crash dump has been created.\n\
         4,14,102,-;NVRM: GPU has fallen off the bus.\n",
    )
    .expect("write");
    let cfg = HealthConfig {
        source: "fake:8".into(),
        kmsg: log.display().to_string(),
        ..HealthConfig::default()
    };
    let m = HealthMonitor::start(&cfg, &dir).expect("starts");
    let v = until(&m, HostVerdict::DrainNow);
    assert!(
        v.gpus
            .iter()
            .any(|g| g.pci == "0000:48:00" && g.reasons.iter().any(|r| r.signal == "xid:79")),
        "{v:?}"
    );
}

#[test]
fn nvml_event_drains() {
    let (lib, state) = fake_nvml::fake();
    fake_nvml::write_state(state, &fake_nvml::eight_gpus(""));
    let cfg = HealthConfig {
        source: format!("nvml:{}", lib.display()),
        kmsg: String::new(),
        ..HealthConfig::default()
    };
    let m = HealthMonitor::start(&cfg, &tempdir("nvml")).expect("starts");
    until(&m, HostVerdict::Ok);
    fake_nvml::write_state(state, &fake_nvml::eight_gpus("xid 5 119\n"));
    let v = until(&m, HostVerdict::DrainNow);
    assert!(
        v.gpus
            .iter()
            .any(|g| g.pci == "0000:68:00" && g.reasons[0].signal == "xid:119"),
        "{v:?}"
    );
}
