//! Kernel-log parser throughput (`cargo bench -p allot-health`): a synthetic log of
//! 2,000,000 lines, 1 in 1,000 an XID in one of the accepted shapes, the rest ordinary
//! kernel chatter, parsed on one core; prints lines per second, the time from reading
//! an XID line to its decision, and to the host verdict.

use allot_health::kmsg;
use allot_health::verdict::{HealthPolicy, Thresholds};
use allot_health::xid::Catalog;
use std::time::Instant;

const XIDS: [&str; 5] = [
    "[ 1451.785035] NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python3, GPU has fallen off the bus.",
    "4,3964,206764307,-;NVRM: Xid (PCI:0018:01:00): 119, pid='<unknown>', name=<unknown>, Timeout after 6s",
    "kernel: NVRM: Xid (PCI:0000:01:00 GPU-I:05): 94, Contained: CE User Channel (0x9).",
    "[ 88.2] nvidia-nvswitch3: SXid (PCI:0000:c5:00.0): 12028, Non-fatal, Link 52 egress",
    "NVRM: Xid (PCI:0008:01:00): 149, pid=2201, name=torchrun, NETIR_LINK_EVT Fatal XC0 i0 Link 17 (0x0)",
];
const CHATTER: [&str; 4] = [
    "[ 1451.785035] IPv6: ADDRCONF(NETDEV_CHANGE): eth0: link becomes ready",
    "6,3965,206764400,-;EXT4-fs (nvme0n1p1): mounted filesystem with ordered data mode. Quota mode: none.",
    "[Sun Feb 23 16:24:18 2025] mlx5_core 0000:1a:00.0: mlx5_pcie_event:301: PCIe slot advertised sufficient power (75W).",
    "Jan 21 04:41:44 gpu-node-17 kernel: nvidia-peermem nv_get_p2p_free_callback:127 ERROR detected invalid context, skipping further processing",
];

fn main() {
    let n = 2_000_000;
    let mut log = String::with_capacity(n * 100);
    for i in 0..n {
        let line = if i % 1000 == 0 {
            XIDS[(i / 1000) % XIDS.len()]
        } else {
            CHATTER[i % CHATTER.len()]
        };
        log.push_str(line);
        log.push('\n');
    }
    let mut best = f64::MAX;
    let mut found = 0;
    for _ in 0..5 {
        let t = Instant::now();
        found = kmsg::scan(&log).len();
        best = best.min(t.elapsed().as_secs_f64());
    }
    println!(
        "kmsg parser: {n} lines ({found} events) in {:.1} ms: {:.1} M lines/s (best of 5, one core)",
        best * 1e3,
        n as f64 / best / 1e6
    );
    let catalog = Catalog::default();
    let mut worst = 0.0f64;
    for line in XIDS {
        let t = Instant::now();
        for _ in 0..10_000 {
            let e = kmsg::parse_line(std::hint::black_box(line)).expect("an event");
            std::hint::black_box(catalog.decide(e.xid, &e.message));
        }
        worst = worst.max(t.elapsed().as_secs_f64() / 10_000.0);
    }
    println!(
        "XID line to decision: {:.2} µs (worst of the 5 shapes, mean of 10,000)",
        worst * 1e6
    );
    // Line read → host verdict, on an 8-GPU host whose policy already holds state.
    let mut samples = Vec::new();
    for i in 0..1_000usize {
        let mut p = HealthPolicy::new(Thresholds::default(), Catalog::default());
        for g in 0..8 {
            p.xid(
                0,
                &format!("0000:{:02x}:00", 0x10 + g),
                13,
                "app fault",
                None,
            );
        }
        let line = XIDS[i % XIDS.len()];
        let t = Instant::now();
        let e = kmsg::parse_line(std::hint::black_box(line)).expect("an event");
        p.xid(1, &e.pci, e.xid, &e.message, e.seq);
        std::hint::black_box(p.verdict());
        samples.push(t.elapsed().as_secs_f64());
    }
    samples.sort_by(f64::total_cmp);
    println!(
        "XID line to host verdict: median {:.2} µs, max {:.2} µs (1,000 events, 8-GPU host)",
        samples[500] * 1e6,
        samples[999] * 1e6
    );
}
