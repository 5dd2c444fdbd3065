//! Restarting the agent replays the kernel ring buffer: a GPU's XIDs from before its
//! last reset stay history, in the same boot; other GPUs' XIDs still count.

use allot_health::kmsg::Assembler;
use allot_health::verdict::{HealthPolicy, HostVerdict};
use allot_health_sources::kmsg_reader::{KmsgMemory, KmsgReader};
use std::io::Write;

/// A policy fed the whole log, as an agent starting with `memory` would.
fn replay(log: &std::path::Path, memory: &KmsgMemory) -> HealthPolicy {
    let mut p = HealthPolicy::default();
    for (pci, seq) in &memory.reset_through {
        p.gpu_reset(pci, Some(*seq));
    }
    let mut r = KmsgReader::open(log).expect("opens");
    let mut lines = Assembler::new();
    while let Some(line) = r.next_line().expect("reads") {
        if let Some(e) = lines.push(&line) {
            p.xid(0, &e.pci, e.xid, &e.message, e.seq);
        }
    }
    p
}

#[test]
fn history_stays_history_per_gpu_and_boot() {
    let dir = std::env::temp_dir().join(format!("allot-kmsg-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let log = dir.join("kmsg");
    let memo = dir.join("resets.json");
    std::fs::write(
        &log,
        "6,100,1000,-;usb 1-1: hello\n4,101,2000,-;NVRM: Xid (PCI:0000:3b:00): 48, pid=1, name=x, DBE\n",
    )
    .expect("write");
    let mut m = KmsgMemory::load(&memo).expect("fresh start");
    m.for_boot("boot-a");
    // Not reset yet: a restart still sees the DBE.
    assert_eq!(replay(&log, &m).verdict().host, HostVerdict::DrainNow);
    // The GPU is reset after record 101; the memory is saved.
    m.reset_through.insert("0000:3b:00".into(), 101);
    m.save(&memo).expect("saves");
    let mut m = KmsgMemory::load(&memo).expect("loads");
    m.for_boot("boot-a");
    assert_eq!(replay(&log, &m).verdict().host, HostVerdict::Ok);
    // A new XID after the reset counts again.
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .open(&log)
        .expect("append");
    writeln!(
        f,
        "4,102,3000,-;NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus."
    )
    .expect("append");
    assert_eq!(replay(&log, &m).verdict().host, HostVerdict::DrainNow);
    // Another boot forgets the old resets.
    let mut other = m.clone();
    other.for_boot("boot-b");
    assert!(other.reset_through.is_empty());
    // A corrupt memory file is named, not ignored.
    std::fs::write(&memo, "{not json").expect("write");
    let e = KmsgMemory::load(&memo).expect_err("corrupt");
    assert!(e.to_string().contains("resets.json"), "{e}");
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn a_fall_named_only_by_the_announcement_is_timed_by_its_notice() {
    let dir = std::env::temp_dir().join(format!("allot-kmsg-multi-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let log = dir.join("kmsg");
    std::fs::write(
        &log,
        "4,200,1000,-;NVRM: GPU at PCI:0000:3b:00: GPU-2bb7e0d8-1e4e-6dc4-9a87-1b5d0a7c2f11\n\
         4,201,1000,-;NVRM: GPU Board Serial Number: 1234567890123\n\
         6,202,1500,-;usb 1-1: new high-speed USB device\n\
         4,203,2000,-;NVRM: A GPU crash dump has been created.\n\
         4,204,2000,-;NVRM: GPU has fallen off the bus.\n",
    )
    .expect("write");
    let mut m = KmsgMemory::default();
    m.for_boot("boot-a");
    let p = replay(&log, &m);
    assert_eq!(p.verdict().host, HostVerdict::DrainNow);
    assert!(
        p.metrics("", &|_| Vec::new())
            .contains("allot_gpu_xid_total{pci_bus_id=\"0000:3b:00\",xid=\"79\"} 1"),
        "{}",
        p.metrics("", &|_| Vec::new())
    );
    // A reset read after the announcement but before the notice does not cure it.
    m.reset_through.insert("0000:3b:00".into(), 203);
    assert_eq!(replay(&log, &m).verdict().host, HostVerdict::DrainNow);
    // One read after the notice does.
    m.reset_through.insert("0000:3b:00".into(), 204);
    assert_eq!(replay(&log, &m).verdict().host, HostVerdict::Ok);
    std::fs::remove_dir_all(&dir).ok();
}
