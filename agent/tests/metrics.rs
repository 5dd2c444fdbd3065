//! The agent's `/metrics`: every GPU under dcgm-exporter's names, each labelled with
//! the lease holding it, so utilisation joins work; checked with the real agent on
//! fake GPUs whose utilisation a script sets, and by promtool where it is installed
//! (always under CI=true).

mod support;

use std::io::{Read, Write};
use std::time::Duration;
use support::{wait_for, TestAgent};

/// `GET path` on `addr`, the whole answer.
fn get(addr: &str, path: &str) -> String {
    let mut s = std::net::TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    write!(s, "GET {path} HTTP/1.1\r\nhost: x\r\n\r\n").expect("write");
    let mut out = String::new();
    s.read_to_string(&mut out).expect("read");
    out
}

/// A free port on loopback.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

#[test]
fn gpu_metrics_carry_dcgm_names_and_the_lease_holding_each_gpu() {
    let addr = format!("127.0.0.1:{}", free_port());
    let mut a = TestAgent::prepare("metrics", &format!("metrics_listen = {addr:?}\n"));
    // GPU i is i × 10 % busy from the start.
    let script = a.dir.join("gpus.txt");
    let lines: String = (0..8)
        .map(|i| format!("at 0s gpu {i} util {}\n", i * 10))
        .collect();
    std::fs::write(&script, lines).expect("script");
    let cfg = std::fs::read_to_string(&a.config).expect("config");
    std::fs::write(
        &a.config,
        cfg.replace(
            "source = \"fake:8\"",
            &format!("source = \"fake:8:{}\"", script.display()),
        ),
    )
    .expect("config");
    a.launch();
    let lease = a.lease_start(&["--gpus", "2", "--min-runtime", "1h"], "sleep 600");
    let id = lease["id"].as_str().expect("id").to_string();
    let gpus = a.json(&["gpus", "--json"]);
    let held: Vec<(String, u64)> = gpus["gpus"]
        .as_array()
        .expect("gpus")
        .iter()
        .filter(|g| g["lease_id"] == id.as_str())
        .map(|g| {
            (
                g["uuid"].as_str().expect("uuid").to_string(),
                g["index"].as_u64().expect("index"),
            )
        })
        .collect();
    assert_eq!(held.len(), 2, "{gpus}");
    // The utilisation script has been sampled once the held GPUs read non-zero
    // (GPU 0 reads 0 whatever happens, so the mean of the two is what is waited on).
    let mean = held.iter().map(|(_, i)| (i * 10) as f64).sum::<f64>() / 100.0 / 2.0;
    let body = wait_for(
        "the lease's utilisation on /metrics",
        Duration::from_secs(30),
        || {
            let r = get(&addr, "/metrics");
            r.contains(&format!(
                "allot_lease_gpu_utilization_ratio{{lease=\"{id}\",workload=\"{id}\",Hostname="
            ))
            .then_some(r)
            .filter(|r| {
                r.lines().any(|l| {
                    l.starts_with("allot_lease_gpu_utilization_ratio")
                        && l.ends_with(&format!(" {mean}"))
                })
            })
        },
    );
    assert!(body.starts_with("HTTP/1.1 200"), "{body}");
    assert!(
        body.contains("content-type: text/plain; version=0.0.4"),
        "{body}"
    );
    for (uuid, index) in &held {
        let line = body
            .lines()
            .find(|l| {
                l.starts_with("DCGM_FI_DEV_GPU_UTIL{") && l.contains(&format!("UUID=\"{uuid}\""))
            })
            .unwrap_or_else(|| panic!("no DCGM_FI_DEV_GPU_UTIL for {uuid}:\n{body}"));
        for part in [
            format!("gpu=\"{index}\""),
            format!("lease=\"{id}\""),
            format!("workload=\"{id}\""),
            "model=\"Fake H100 80GB HBM3\"".to_string(),
        ] {
            assert!(line.contains(&part), "{part} not in {line}");
        }
        assert!(line.ends_with(&format!(" {}", index * 10)), "{line}");
    }
    // A GPU nobody holds has no lease label.
    let free = body
        .lines()
        .find(|l| {
            l.starts_with("DCGM_FI_DEV_FB_USED{")
                && !held.iter().any(|(u, _)| l.contains(u.as_str()))
        })
        .expect("a free GPU's memory");
    assert!(!free.contains("lease="), "{free}");
    for family in [
        "DCGM_FI_DEV_GPU_TEMP",
        "DCGM_FI_DEV_POWER_USAGE",
        "allot_gpu_health_state",
        "allot_agent_leases 1",
        "allot_agent_build_info{version=",
    ] {
        assert!(body.contains(family), "{family} missing:\n{body}");
    }
    assert!(get(&addr, "/nope").starts_with("HTTP/1.1 404"));
    // promtool, Prometheus' own checker: the exposition is clean.
    if allot_test_support::promtool() {
        let text = body.split("\r\n\r\n").nth(1).expect("a body");
        allot_test_support::promtool_check_metrics("the agent", text);
    }
}
