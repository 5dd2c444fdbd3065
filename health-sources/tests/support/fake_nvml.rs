//! Shared by the NVML tests and benchmark: build the fake `libnvidia-ml.so` and drive
//! its state file.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// Builds the fake library once (its own target dir, so the outer build's lock is not
/// in the way) and links it as `libnvidia-ml.so.1` beside a state file.
pub fn fake() -> &'static (PathBuf, PathBuf) {
    static FAKE: OnceLock<(PathBuf, PathBuf)> = OnceLock::new();
    FAKE.get_or_init(|| {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let target = Path::new(env!("CARGO_TARGET_TMPDIR")).join("fake-nvml");
        let status = Command::new(env!("CARGO"))
            .args([
                "build",
                "--offline",
                "-q",
                "-p",
                "allot-fake-nvml",
                "--target-dir",
            ])
            .arg(&target)
            .current_dir(&root)
            .status()
            .expect("cargo runs");
        assert!(status.success(), "building the fake NVML failed");
        let dir =
            Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("nvml-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let lib = dir.join("libnvidia-ml.so.1");
        let _ = std::fs::remove_file(&lib);
        std::os::unix::fs::symlink(target.join("debug/libnvidia_ml.so"), &lib).expect("link");
        let state = dir.join("state");
        // The fake reads its state from this variable; set once, before any load.
        std::env::set_var("ALLOT_FAKE_NVML", &state);
        (lib, state)
    })
}

pub fn eight_gpus(extra: &str) -> String {
    let mut s = String::from("driver 570.86.15\n");
    for i in 0..8 {
        s += &format!(
            "gpu {i} uuid=GPU-{i:08x} name=NVIDIA_H100_80GB_HBM3 pci=0000:{:02x}:00 temp={} slowdown=87 shutdown=92 power=350000 mem_total=85899345920 mem_used=1024 util=50 ecc_corr=0 ecc_unc=0 pcie_replay={i} recovery=0 nvlinks=18 nvlink_replay={i}{}\n",
            0x18 + i * 0x10,
            40 + i,
            if i == 7 { " unsupported=recovery" } else { "" },
        );
    }
    s + extra
}

/// Replaces the fake's state.
pub fn write_state(state: &Path, text: &str) {
    // Write-then-rename so the fake never reads half a file.
    let tmp = state.with_extension("tmp");
    std::fs::write(&tmp, text).expect("write");
    std::fs::rename(&tmp, state).expect("rename");
}
