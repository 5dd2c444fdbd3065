//! `cargo bench -p allot-agent --bench contract`: how close to the min-runtime lapse
//! the checkpoint signal reaches a workload (p50/p99 over many leases), and what the
//! idle agent with 8 fake GPUs costs (CPU share of one core, resident memory).
//!
//! The release agent binary runs on the fake source; leases go through the local
//! gRPC API; each workload (python3, so the handler itself adds microseconds, not a
//! fork) writes the instant SIGUSR1 arrived.

mod common;

use allot_proto::v1::agent_local_client::AgentLocalClient;
use allot_proto::v1::{RevokeLeaseRequest, StartLeaseRequest};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

const ROUNDS: usize = 12;
const GPUS: u32 = 8;
const MIN_RUNTIME_S: u64 = 2;
const IDLE_WINDOW: Duration = Duration::from_secs(30);

const WORKLOAD: &str = r#"
import os, signal, time
d = os.environ["ALLOT_CHECKPOINT_DIR"]
def on_usr1(sig, frame):
    with open(os.path.join(d, "got"), "w") as f:
        f.write(str(time.time_ns()))
    open(os.path.join(d, "checkpoint.done"), "w").close()
    os._exit(0)
signal.signal(signal.SIGUSR1, on_usr1)
while True:
    signal.pause()
"#;

fn ticks(pid: u32) -> u64 {
    allot_checkpoint_hooks::proc_stat(pid as i32).map_or(0, |s| s.cpu_ticks)
}

fn pct(v: &[i64], p: f64) -> i64 {
    allot_common::stats::percentile(v, p).unwrap_or(0)
}

fn main() {
    let dir = std::env::temp_dir().join(format!("allot-bench-contract-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("dir");
    let socket = dir.join("agent.sock");
    let config = dir.join("agent.toml");
    std::fs::write(
        &config,
        format!(
            "[agent]\nsocket = {socket:?}\nstate_dir = {:?}\nallow_root = true\n[health]\nsource = \"fake:8\"\n",
            dir.join("state")
        ),
    )
    .expect("config");
    let mut agent = std::process::Command::new(env!("CARGO_BIN_EXE_allot-agent"))
        .arg("--config")
        .arg(&config)
        .env("ALLOT_LOG", "warn")
        .spawn()
        .expect("agent");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("rt");
    let state: PathBuf = dir.join("state");
    rt.block_on(async {
        let ch = loop {
            if let Ok(c) = allot_proto::uds::connect(&socket).await {
                break c;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        let mut c = AgentLocalClient::new(ch);
        let mut late_ms = Vec::new();
        for _ in 0..ROUNDS {
            let mut ids = Vec::new();
            for _ in 0..GPUS {
                let l = c
                    .start_lease(StartLeaseRequest {
                        gpus: 1,
                        min_runtime_s: MIN_RUNTIME_S,
                        checkpoint_hook: "signal:USR1".into(),
                        grace_s: 10,
                        argv: vec!["python3".into(), "-c".into(), WORKLOAD.into()],
                        ..Default::default()
                    })
                    .await
                    .expect("start")
                    .into_inner();
                c.revoke_lease(RevokeLeaseRequest { lease_id: l.id.clone(), now: false })
                    .await
                    .expect("revoke");
                ids.push((l.id, l.start_unix_ms + (MIN_RUNTIME_S * 1000) as i64));
            }
            for (id, lapse) in ids {
                let got = ckpt(&state, &id).join("got");
                let t = Instant::now();
                let ns = loop {
                    if let Some(ns) = std::fs::read_to_string(&got).ok().and_then(|s| s.trim().parse::<i64>().ok()) {
                        break ns;
                    }
                    assert!(t.elapsed() < Duration::from_secs(30), "no signal for {id}");
                    tokio::time::sleep(Duration::from_millis(20)).await;
                };
                late_ms.push(ns / 1_000_000 - lapse);
            }
            // Wait until the GPUs are free again.
            loop {
                let ls = c.list_leases(allot_proto::v1::ListLeasesRequest {}).await.expect("list").into_inner();
                if ls.leases.iter().all(|l| l.state == allot_proto::v1::LeaseState::Ended as i32) {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
        late_ms.sort_unstable();
        println!(
            "checkpoint signal after the min-runtime lapse over {} leases: p50 {} ms, p99 {} ms, max {} ms, min {} ms",
            late_ms.len(),
            pct(&late_ms, 0.5),
            pct(&late_ms, 0.99),
            late_ms[late_ms.len() - 1],
            late_ms[0]
        );
    });
    let pid = agent.id();
    let hz = 100.0; // USER_HZ on Linux
    let t0 = ticks(pid);
    let w0 = Instant::now();
    std::thread::sleep(IDLE_WINDOW);
    let cpu = (ticks(pid) - t0) as f64 / hz / w0.elapsed().as_secs_f64() * 100.0;
    println!(
        "idle agent, 8 fake GPUs: {cpu:.2}% of one core over {}s, resident memory {:.1} MB",
        IDLE_WINDOW.as_secs(),
        common::rss_kb(pid) as f64 / 1024.0
    );
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::Signal::SIGTERM,
    );
    let _ = agent.wait();
    let _ = std::fs::remove_dir_all(&dir);
}

fn ckpt(state: &Path, id: &str) -> PathBuf {
    state.join("leases").join(id).join("checkpoint")
}
