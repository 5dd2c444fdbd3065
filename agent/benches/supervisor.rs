//! `cargo bench -p allot-agent --bench supervisor`: what the per-lease supervisor
//! costs. Start latency (from `launch` to the job running under its supervisor, in
//! its cgroup where this host has one, p50/p99 over many starts), start-to-end of a
//! job that exits at once (`exit.json` written), output throughput into the log file
//! (under the cap, and past it, where the rest is read and dropped), and the
//! supervisor's resident memory while its job runs.

mod common;

use allot_agent::process::{launch, Launch};
use allot_agent::supervisor::exit_file;
use allot_agent::supervisor::read_exit;
use allot_checkpoint_hooks::RunAs;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

const STARTS: usize = 40;
const FLOOD_BYTES: u64 = 1 << 30;

fn spec(dir: &Path, n: usize, script: &str, cap: u64, cgroup: Option<PathBuf>) -> Launch {
    Launch {
        lease: format!("B-{n}"),
        argv: vec!["sh".into(), "-c".into(), script.into()],
        gpus: vec!["GPU-bench".into()],
        checkpoint_dir: dir.join(format!("{n}/ckpt")),
        lease_dir: dir.join(format!("{n}/lease")),
        out_log: dir.join(format!("{n}/out")),
        err_log: dir.join(format!("{n}/err")),
        out_users_own: false,
        err_users_own: false,
        cap_bytes: cap,
        cgroup: cgroup.map(|c| c.join(format!("B-{n}"))),
        limits: Default::default(),
        supervisor: env!("CARGO_BIN_EXE_allot-agent").into(),
        run_as: RunAs::Agent,
        env: vec![("PATH".into(), "/usr/bin:/bin".into())],
        cwd: None,
        script: String::new(),
        pty: false,
        fence: None,
    }
}

fn pct(v: &mut [Duration], p: f64) -> Duration {
    v.sort();
    let i = ((v.len() as f64 - 1.0) * p).round() as usize;
    v[i.min(v.len() - 1)]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// Runs `l` to its end; seconds from launch to exit.json.
fn run_to_end(l: &Launch) -> (Duration, Duration, allot_agent::supervisor::Exit) {
    let t0 = Instant::now();
    let mut s = launch(l).expect("starts");
    let started = t0.elapsed();
    let _ = s.supervisor.wait();
    let end = t0.elapsed();
    let exit = read_exit(&exit_file(&l.lease_dir)).expect("exit.json");
    (started, end, exit)
}

fn main() {
    let dir = std::env::temp_dir().join(format!("allot-bench-sup-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let cgroups = match allot_agent::cgroup::discover("auto", "bench", &dir) {
        allot_agent::cgroup::Placement::At(base) => Some(base),
        allot_agent::cgroup::Placement::Off(why) => {
            println!("no cgroups here ({why}): process groups only");
            None
        }
    };
    let (mut starts, mut ends) = (Vec::new(), Vec::new());
    for n in 0..STARTS {
        let (s, e, exit) = run_to_end(&spec(&dir, n, "exit 0", 1 << 20, cgroups.clone()));
        assert_eq!(exit.code, Some(0));
        starts.push(s);
        ends.push(e);
    }
    println!(
        "start (launch → job running, {STARTS} starts{}): p50 {:.2} ms, p99 {:.2} ms",
        if cgroups.is_some() {
            ", in a cgroup"
        } else {
            ""
        },
        ms(pct(&mut starts, 0.5)),
        ms(pct(&mut starts, 0.99))
    );
    println!(
        "start to end of `exit 0` (exit.json written): p50 {:.2} ms, p99 {:.2} ms",
        ms(pct(&mut ends, 0.5)),
        ms(pct(&mut ends, 0.99))
    );
    let flood = format!("head -c {FLOOD_BYTES} /dev/zero");
    let floods = [
        ("kept (under the cap)", 2 * FLOOD_BYTES),
        ("past a 1 MiB cap (read and dropped)", 1 << 20),
    ];
    for (i, (what, cap)) in floods.into_iter().enumerate() {
        let l = spec(&dir, STARTS + 1 + i, &flood, cap, cgroups.clone());
        let (_, end, exit) = run_to_end(&l);
        assert_eq!(exit.code, Some(0));
        println!(
            "output {what}: {:.0} MiB/s ({} MiB in {:.2} s, {} bytes kept)",
            FLOOD_BYTES as f64 / (1 << 20) as f64 / end.as_secs_f64(),
            FLOOD_BYTES >> 20,
            end.as_secs_f64(),
            exit.output_bytes
        );
        let _ = std::fs::remove_file(&l.out_log);
    }
    let l = spec(&dir, STARTS + 10, "exec sleep 5", 1 << 20, cgroups.clone());
    let mut s = launch(&l).expect("starts");
    std::thread::sleep(Duration::from_millis(300));
    println!(
        "supervisor resident memory while its job runs: {} KiB",
        common::rss_kb(s.supervisor_id.pid.unsigned_abs())
    );
    let _ = nix::sys::signal::killpg(
        nix::unistd::Pid::from_raw(s.job.pid),
        nix::sys::signal::Signal::SIGKILL,
    );
    let _ = s.supervisor.wait();
    if let Some(base) = &cgroups {
        let _ = std::fs::remove_dir(base);
    }
    let _ = std::fs::remove_dir_all(&dir);
}
