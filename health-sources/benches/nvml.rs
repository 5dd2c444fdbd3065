//! One sample of 8 GPUs through the NVML backend, against the fake library
//! (`cargo bench -p allot-health --bench nvml`): nvml-wrapper, the dynamic symbols and
//! every field read, as on a host; the fake answers from memory.

#[path = "../tests/support/fake_nvml.rs"]
mod fake_nvml;

use allot_health_sources::nvml::NvmlSource;
use std::time::Instant;

fn main() {
    let (lib, state) = fake_nvml::fake();
    fake_nvml::write_state(state, &fake_nvml::eight_gpus(""));
    let src = NvmlSource::open(Some(lib)).expect("loads the fake NVML");
    let mut times = Vec::new();
    for _ in 0..1_000 {
        let t = Instant::now();
        let all = src.sample_all().expect("samples");
        assert_eq!(all.len(), 8);
        times.push(t.elapsed().as_secs_f64());
    }
    times.sort_by(f64::total_cmp);
    println!(
        "NVML sample of 8 GPUs (fake library): median {:.1} µs, p99 {:.1} µs (1,000 samples)",
        times[500] * 1e6,
        times[990] * 1e6
    );
}
