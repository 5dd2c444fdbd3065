//! A scripted GPU source for development and the local cluster: `n` healthy GPUs, and
//! faults that happen at given times, written in a small script:
//!
//! ```text
//! # at TIME gpu N WHAT [VALUE]
//! at 30s gpu 2 xid 79
//! at 1m  gpu 3 remap-pending
//! at 2m  gpu 1 temp 90
//! at 5m  gpu 4 recovery 1
//! at 6m  gpu 5 lost
//! at 9m  gpu 3 reset
//! at 0s  gpu 0 util 85    # utilisation %, and memory used in proportion
//! ```
//!
//! Times are from the source's start; durations accept `90s`, `10m`, `8h`, `7d`.

use crate::nvml::GpuReadError;
use allot_health::verdict::{GpuSample, RemappedRows, Time};

/// One scripted change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fault {
    /// An XID event.
    Xid(u32),
    /// A row remap waits for a reset.
    RemapPending,
    /// Temperature in °C.
    Temp(u32),
    /// The driver's recovery action.
    Recovery(u32),
    /// The GPU stops answering.
    Lost,
    /// The GPU is reset: back to healthy.
    Reset,
    /// Utilisation in %, with memory used in proportion (a busy job's GPU).
    Util(u32),
}

/// A script line that could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{file}:{line}: {message}")]
pub struct ScriptError {
    /// The script.
    pub file: String,
    /// 1-based line.
    pub line: usize,
    /// What is wrong and the expected form.
    pub message: String,
}

#[derive(Debug, Clone)]
struct GpuState {
    sample: GpuSample,
    lost: bool,
}

/// The scripted source.
#[derive(Debug, Clone)]
pub struct FakeSource {
    gpus: Vec<GpuState>,
    script: Vec<(Time, usize, Fault)>,
    next: usize,
}

/// The bus id of fake GPU `i`, spaced like an HGX board's (16 per PCI domain).
pub fn fake_pci(i: usize) -> String {
    format!("{:04x}:{:02x}:00", i / 16, 0x18 + (i % 16) * 0x10)
}

impl FakeSource {
    /// `gpus` healthy GPUs and the faults of `script` (`file` names it in errors).
    pub fn new(gpus: usize, script: &str, file: &str) -> Result<Self, ScriptError> {
        let err = |line: usize, message: String| ScriptError {
            file: file.into(),
            line,
            message,
        };
        let form = "expected `at TIME gpu N WHAT [VALUE]`, WHAT one of xid N, remap-pending, temp C, recovery N, util PCT, lost, reset";
        let mut faults = Vec::new();
        for (i, raw) in script.lines().enumerate() {
            let line = raw.split('#').next().unwrap_or("").trim();
            if line.is_empty() {
                continue;
            }
            let w: Vec<&str> = line.split_whitespace().collect();
            let (at, gpu, what, value) = match w.as_slice() {
                ["at", t, "gpu", n, what, rest @ ..] if rest.len() <= 1 => {
                    (*t, *n, *what, rest.first().copied())
                }
                _ => return Err(err(i + 1, form.into())),
            };
            let t = allot_units::parse_duration(at)
                .ok()
                .ok_or_else(|| err(i + 1, format!("time {at:?}: use 90s, 10m, 8h or 7d")))?;
            let g: usize = gpu.parse().ok().filter(|&g| g < gpus).ok_or_else(|| {
                err(
                    i + 1,
                    format!(
                        "gpu {gpu:?}: this source has GPUs 0 to {}",
                        gpus.saturating_sub(1)
                    ),
                )
            })?;
            let num = || {
                value
                    .and_then(|v| v.parse::<u32>().ok())
                    .ok_or_else(|| err(i + 1, format!("{what} needs a number, e.g. `{what} 79`")))
            };
            let fault = match what {
                "xid" => Fault::Xid(num()?),
                "temp" => Fault::Temp(num()?),
                "recovery" => Fault::Recovery(num()?),
                "util" => match num()? {
                    p if p <= 100 => Fault::Util(p),
                    p => return Err(err(i + 1, format!("util {p}: a percentage, 0 to 100"))),
                },
                "remap-pending" => Fault::RemapPending,
                "lost" => Fault::Lost,
                "reset" => Fault::Reset,
                other => return Err(err(i + 1, format!("{other:?}: {form}"))),
            };
            faults.push((t, g, fault));
        }
        faults.sort_by_key(|f| f.0);
        Ok(FakeSource {
            gpus: (0..gpus)
                .map(|i| GpuState {
                    sample: healthy(i),
                    lost: false,
                })
                .collect(),
            script: faults,
            next: 0,
        })
    }

    /// Applies the faults due by `now`; returns the XIDs among them as (bus id, XID).
    pub fn advance(&mut self, now: Time) -> Vec<(String, u32)> {
        let mut xids = Vec::new();
        while let Some((t, g, f)) = self.script.get(self.next).cloned() {
            if t > now {
                break;
            }
            self.next += 1;
            let gpu = &mut self.gpus[g];
            match f {
                Fault::Xid(x) => xids.push((gpu.sample.pci.clone(), x)),
                Fault::RemapPending => {
                    gpu.sample.remapped = Some(RemappedRows {
                        uncorrectable: 1,
                        pending: true,
                        ..RemappedRows::default()
                    })
                }
                Fault::Temp(c) => gpu.sample.temperature_c = Some(c),
                Fault::Recovery(r) => gpu.sample.recovery_action = Some(r),
                Fault::Util(p) => {
                    gpu.sample.utilization_pct = Some(p);
                    gpu.sample.memory_used =
                        gpu.sample.memory_total.map(|t| t / 100 * u64::from(p));
                }
                Fault::Lost => gpu.lost = true,
                Fault::Reset => {
                    gpu.sample = healthy(g);
                    gpu.lost = false;
                }
            }
        }
        xids
    }

    /// One round of samples, shaped like the NVML source's.
    pub fn sample_all(&self) -> Vec<Result<GpuSample, GpuReadError>> {
        self.gpus
            .iter()
            .enumerate()
            .map(|(i, g)| {
                if g.lost {
                    Err(GpuReadError::Lost {
                        index: i as u32,
                        pci: Some(g.sample.pci.clone()),
                    })
                } else {
                    Ok(g.sample.clone())
                }
            })
            .collect()
    }
}

fn healthy(i: usize) -> GpuSample {
    GpuSample {
        pci: fake_pci(i),
        uuid: format!("GPU-fake{i:04}-0000-0000-0000-000000000000"),
        index: Some(i as u32),
        name: Some("Fake H100 80GB HBM3".into()),
        architecture: Some("Hopper".into()),
        power_mw: Some(70_000),
        utilization_pct: Some(0),
        memory_total: Some(80 << 30),
        memory_used: Some(0),
        ecc_corrected_aggregate: Some(0),
        ecc_uncorrected_aggregate: Some(0),
        throttle_reasons: Some(0),
        persistence: Some(true),
        mig: Some(false),
        nvlink: Vec::new(),
        temperature_c: Some(38),
        slowdown_c: Some(87),
        shutdown_c: Some(92),
        ecc_corrected: Some(0),
        ecc_uncorrected: Some(0),
        remapped: Some(RemappedRows::default()),
        retired_pending: None,
        pcie_replay: Some(0),
        nvlink_errors: Some(0),
        recovery_action: Some(0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::monitor::Roster;
    use allot_health::verdict::{GpuState, HealthPolicy, HostVerdict};

    #[test]
    fn scripted_faults_reach_the_verdict() {
        let script = "# demo\nat 30s gpu 2 xid 79\nat 1m gpu 3 remap-pending\nat 5m gpu 5 lost\nat 9m gpu 3 reset\n";
        let mut src = FakeSource::new(8, script, "demo").expect("parses");
        let mut p = HealthPolicy::default();
        let mut roster = Roster::default();
        let mut step = |src: &mut FakeSource, p: &mut HealthPolicy, t| {
            for (pci, x) in src.advance(t) {
                p.xid(t, &pci, x, "scripted", None);
            }
            roster.apply(p, t, src.sample_all());
        };
        step(&mut src, &mut p, 0);
        assert_eq!(p.verdict().host, HostVerdict::Ok);
        step(&mut src, &mut p, 60);
        let v = p.verdict();
        assert_eq!(v.host, HostVerdict::DrainNow);
        assert_eq!(
            v.gpus
                .iter()
                .find(|g| g.pci == fake_pci(2))
                .map(|g| g.state),
            Some(GpuState::Failed)
        );
        assert_eq!(
            v.gpus
                .iter()
                .find(|g| g.pci == fake_pci(3))
                .map(|g| g.state),
            Some(GpuState::Degraded)
        );
        step(&mut src, &mut p, 300);
        assert!(p
            .verdict()
            .gpus
            .iter()
            .any(|g| g.pci == fake_pci(5) && g.state == GpuState::Failed));
    }

    #[test]
    fn a_scripted_utilisation_shows_in_the_samples() {
        let mut src = FakeSource::new(2, "at 10s gpu 1 util 85\n", "u").expect("parses");
        src.advance(5);
        let util = |src: &FakeSource| {
            src.sample_all()
                .into_iter()
                .map(|s| s.ok().and_then(|s| s.utilization_pct))
                .collect::<Vec<_>>()
        };
        assert_eq!(util(&src), [Some(0), Some(0)]);
        src.advance(10);
        assert_eq!(util(&src), [Some(0), Some(85)]);
        let used = src.sample_all()[1]
            .as_ref()
            .ok()
            .and_then(|s| s.memory_used);
        assert_eq!(used, Some((80u64 << 30) / 100 * 85));
    }

    #[test]
    fn script_errors_name_the_line() {
        let e =
            FakeSource::new(8, "at 1m gpu 2 xid 79\nat soon gpu 1 lost\n", "f.txt").unwrap_err();
        assert_eq!((e.line, e.file.as_str()), (2, "f.txt"));
        assert!(e.message.contains("time \"soon\""), "{e}");
        let e = FakeSource::new(8, "at 1m gpu 9 lost\n", "f.txt").unwrap_err();
        assert!(e.message.contains("GPUs 0 to 7"), "{e}");
        let e = FakeSource::new(8, "at 1m gpu 1 xid\n", "f.txt").unwrap_err();
        assert!(e.message.contains("xid needs a number"), "{e}");
        let e = FakeSource::new(8, "at 5\u{b5} gpu 1 lost\n", "f.txt").unwrap_err();
        assert!(e.message.contains("time"), "{e}");
        let e = FakeSource::new(8, "at 1m gpu 1 util 101\n", "f.txt").unwrap_err();
        assert!(e.message.contains("0 to 100"), "{e}");
        let e = FakeSource::new(8, "boom\n", "f.txt").unwrap_err();
        assert!(e.message.starts_with("expected `at TIME"), "{e}");
    }
}
