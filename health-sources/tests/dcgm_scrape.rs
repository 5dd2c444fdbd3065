//! Scraping a dcgm-exporter endpoint over a real socket and folding what it says.

use allot_health::verdict::GpuSample;
use allot_health_sources::dcgm::{fetch, fold, parse, XidGauge};
use std::io::{Read, Write};
use std::net::TcpListener;
use std::time::Duration;

const METRICS: &str = "# HELP DCGM_FI_DEV_GPU_TEMP GPU temperature (in C).\n\
# TYPE DCGM_FI_DEV_GPU_TEMP gauge\n\
DCGM_FI_DEV_GPU_TEMP{gpu=\"0\",UUID=\"GPU-aaa\",pci_bus_id=\"00000000:3B:00.0\",device=\"nvidia0\",modelName=\"NVIDIA H100 80GB HBM3\",Hostname=\"n1\"} 51\n\
DCGM_FI_DEV_XID_ERRORS{gpu=\"0\",UUID=\"GPU-aaa\",pci_bus_id=\"00000000:3B:00.0\",device=\"nvidia0\",err_code=\"79\"} 79\n\
DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS{gpu=\"0\",UUID=\"GPU-aaa\",pci_bus_id=\"00000000:3B:00.0\"} 2\n\
DCGM_FI_DEV_ROW_REMAP_FAILURE{gpu=\"0\",UUID=\"GPU-aaa\",pci_bus_id=\"00000000:3B:00.0\"} 0\n\
DCGM_FI_DEV_PCIE_REPLAY_COUNTER{gpu=\"1\",UUID=\"GPU-bbb\",pci_bus_id=\"00000018:5E:00.0\"} 12\n\
DCGM_FI_DEV_POWER_USAGE{gpu=\"1\",UUID=\"GPU-bbb\",pci_bus_id=\"00000018:5E:00.0\"} 300.5\n\
garbage line {\n";

/// Serves `body` to `n` requests on 127.0.0.1:port-0, then stops.
fn serve(body: &'static str, n: usize) -> String {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = l.local_addr().expect("addr");
    std::thread::spawn(move || {
        for stream in l.incoming().take(n) {
            let Ok(mut s) = stream else { continue };
            let mut buf = [0u8; 2048];
            let _ = s.read(&mut buf);
            let _ = write!(
                s,
                "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    format!("http://{addr}/metrics")
}

#[test]
fn scrape_parse_and_fold() {
    let url = serve(METRICS, 1);
    let text = fetch(&url, Duration::from_secs(5)).expect("scrapes");
    let gpus = parse(&text);
    assert_eq!(gpus.len(), 2);
    let a = &gpus["0000:3b:00"];
    assert_eq!(a.uuid, "GPU-aaa");
    assert_eq!(a.fields["DCGM_FI_DEV_GPU_TEMP"], 51.0);
    let b = &gpus["0018:5e:00"];
    assert!(
        !b.fields.contains_key("DCGM_FI_DEV_POWER_USAGE"),
        "unread fields are skipped"
    );
    // NVML had the temperature but not the remap state: DCGM fills only the gap.
    let mut s = GpuSample {
        pci: "0000:3b:00".into(),
        temperature_c: Some(49),
        ..GpuSample::default()
    };
    fold(&mut s, a);
    assert_eq!(s.temperature_c, Some(49), "NVML's reading wins");
    assert_eq!(
        s.remapped.map(|r| (r.uncorrectable, r.failure)),
        Some((2, false))
    );
    // The last-XID gauge becomes one event per change, not one per scrape.
    let mut g = XidGauge::default();
    assert!(
        g.changes(&gpus).is_empty(),
        "the first reading is a baseline, not news"
    );
    let mut next = gpus.clone();
    if let Some(a) = next.get_mut("0000:3b:00") {
        a.fields.insert("DCGM_FI_DEV_XID_ERRORS".into(), 48.0);
    }
    assert_eq!(g.changes(&next), vec![("0000:3b:00".to_string(), 48)]);
    assert!(g.changes(&next).is_empty());
    // A mangled bus id is skipped, never a panic.
    assert!(parse("DCGM_FI_DEV_GPU_TEMP{pci_bus_id=\"x\u{e9}000:3b:00.0\"} 1\n").is_empty());
}

#[test]
fn a_dead_exporter_is_a_clear_error() {
    // Bind then drop: nothing listens on that port any more.
    let port = TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr")
        .port();
    let url = format!("http://127.0.0.1:{port}/metrics");
    let e = fetch(&url, Duration::from_secs(2)).expect_err("refused");
    let msg = e.to_string();
    assert!(
        msg.starts_with(&format!("scraping dcgm-exporter at {url}")),
        "{msg}"
    );
    assert!(msg.contains("dcgm_url"), "{msg}");
}
