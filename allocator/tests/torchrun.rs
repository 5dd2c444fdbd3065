//! A real torchrun gang under allot: PyTorch from PyPI on CPU (gloo), 2 nodes × 8
//! ranks that rendezvous from the environment allot sets alone, preempted with
//! `--checkpoint signal:USR1` five times in a row. Every rank checkpoints at the same
//! step, and the requeued gang starts again on the free nodes and resumes at exactly
//! that step. The venv comes from `ALLOT_TEST_TORCH_VENV` (`.ci/run` makes it under
//! `target/torch-venv`); without it the test is skipped, and under `CI=true` it fails.

mod support;

use std::path::{Path, PathBuf};
use std::time::Duration;
use support::{wait_for, Cluster};

/// Long: 16 ranks import torch on a 2-core machine before each rendezvous.
const LONG: Duration = Duration::from_secs(300);
const ONE_PROJECT: &str = "[[group]]\nname = \"demo-a\"\nweight = 1\n";
const PREEMPTIONS: usize = 5;

/// Held by each test for its whole run: two gangs at once on a 2-core machine starve
/// each other's rendezvous (and their allotds may hand out the same master port).
static ONE_GANG_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// This test's turn: the lock, whether or not a test before it panicked.
fn turn() -> std::sync::MutexGuard<'static, ()> {
    ONE_GANG_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner())
}

/// The venv with torch, if there is one.
fn torch_venv() -> Option<PathBuf> {
    let p = std::env::var_os("ALLOT_TEST_TORCH_VENV")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/torch-venv"));
    let torchrun = p.join("bin/torchrun");
    if torchrun.exists() {
        return Some(p);
    }
    assert!(
        std::env::var("CI").as_deref() != Ok("true"),
        "CI=true: no torchrun at {} (.ci/run installs PyTorch there; set ALLOT_TEST_TORCH_VENV)",
        torchrun.display()
    );
    eprintln!("skipped: no torchrun at {}", torchrun.display());
    None
}

/// Submits `torchrun train.py` for 100000 steps with `flags` (and
/// `--checkpoint signal:USR1`): its id, and the log its ranks write.
fn submit_train(c: &Cluster, venv: &Path, flags: &[&str]) -> (String, PathBuf) {
    let ckpt = c.dir.join("ckpt");
    let log = c.dir.join("ranks.log");
    let train = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/torchrun/train.py");
    let path = format!(
        "PATH={}:{}",
        venv.join("bin").display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let (train, ckpt_s, log_s) = (
        train.display().to_string(),
        ckpt.display().to_string(),
        log.display().to_string(),
    );
    let mut args = vec!["submit", "--json", "--project", "demo-a"];
    args.extend_from_slice(flags);
    args.extend_from_slice(&["--checkpoint", "signal:USR1", "--env", &path, "--"]);
    args.extend_from_slice(&[
        "torchrun",
        &train,
        "--ckpt-dir",
        &ckpt_s,
        "--steps",
        "100000",
        "--rank-log",
        &log_s,
    ]);
    let out = c.allot(&args);
    assert!(out.status.success(), "{out:?}");
    let id = serde_json::from_slice::<serde_json::Value>(&out.stdout).expect("json")["id"]
        .as_str()
        .expect("id")
        .to_string();
    (id, log)
}

/// The lines the ranks wrote (`--log`) for run `run`: (rank, step) of each `word`.
fn lines(log: &Path, word: &str, run: usize) -> Vec<(u32, u64)> {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    text.lines()
        .filter(|l| l.starts_with(word) && l.ends_with(&format!(" run={run}")))
        .filter_map(|l| {
            let field = |k: &str| {
                l.split_whitespace()
                    .find_map(|w| w.strip_prefix(k))
                    .and_then(|v| v.parse::<u64>().ok())
            };
            Some((u32::try_from(field("rank=")?).ok()?, field("step=")?))
        })
        .collect()
}

/// Every rank's step in `found`, when all 16 are there and agree.
fn agreed(found: &[(u32, u64)]) -> Option<u64> {
    agreed_of(found, 16)
}

/// Every rank's step in `found`, when all `world` are there and agree.
fn agreed_of(found: &[(u32, u64)], world: usize) -> Option<u64> {
    let ranks: std::collections::BTreeSet<u32> = found.iter().map(|x| x.0).collect();
    let steps: std::collections::BTreeSet<u64> = found.iter().map(|x| x.1).collect();
    (ranks.len() == world && steps.len() == 1).then(|| *steps.iter().next().unwrap_or(&0))
}

#[test]
fn a_torchrun_gang_checkpoints_and_resumes_at_its_step_through_five_preemptions() {
    let _turn = turn();
    let Some(venv) = torch_venv() else {
        return;
    };
    let c = Cluster::start("torchrun", ONE_PROJECT, 4, 8);
    let (id, log) = submit_train(
        &c,
        &venv,
        &[
            "--nodes",
            "2",
            "--gpus",
            "8",
            "--min-runtime",
            "1s",
            "--resumable",
        ],
    );
    let mut step = 0;
    for run in 1..=PREEMPTIONS {
        // Every rank of this run is up, at the step the last checkpoint left.
        let resumed = wait_for(&format!("run {run}: 16 ranks resumed"), LONG, || {
            agreed(&lines(&log, "resumed", run))
        });
        assert_eq!(resumed, step, "run {run} resumed at its checkpoint");
        let w = c.status(&id);
        let nodes: Vec<String> = w["node_names"]
            .as_array()
            .expect("nodes")
            .iter()
            .filter_map(|n| n.as_str().map(str::to_string))
            .collect();
        assert_eq!(nodes.len(), 2, "{w}");
        // Let it train a few steps past the resume (rank 0 logs each), then preempt:
        // its nodes drain.
        wait_for("a few steps", LONG, || {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            text.lines()
                .filter(|l| l.starts_with("step=") && l.ends_with(&format!(" run={run}")))
                .filter_map(|l| {
                    l.split_whitespace()
                        .next()?
                        .strip_prefix("step=")?
                        .parse::<u64>()
                        .ok()
                })
                .any(|s| s >= resumed + 3)
                .then_some(())
        });
        for n in &nodes {
            let out = c.allot(&["nodes", "drain", n, "--reason", "preempt the gang"]);
            assert!(out.status.success(), "{out:?}");
        }
        // Every rank checkpoints at one step; the run's end is a revocation after a
        // checkpoint, on both hosts.
        step = wait_for(&format!("run {run}: 16 ranks checkpointed"), LONG, || {
            agreed(&lines(&log, "checkpointed", run))
        });
        assert!(step > resumed, "run {run} trained before it was preempted");
        let w = wait_for("the gang to run again elsewhere", LONG, || {
            let w = c.status(&id);
            (w["state"] == "running" && w["lease_ids"].as_array().map(Vec::len) == Some(run + 1))
                .then_some(w)
        });
        let again: Vec<&str> = w["node_names"]
            .as_array()
            .expect("nodes")
            .iter()
            .filter_map(|n| n.as_str())
            .collect();
        assert!(again.iter().all(|n| !nodes.iter().any(|m| m == n)), "{w}");
        let history = w["history"].to_string();
        assert!(!history.contains("refused"), "{history}");
        for n in &nodes {
            let out = c.allot(&["nodes", "undrain", n]);
            assert!(out.status.success(), "{out:?}");
        }
    }
    // The sixth run resumes at the fifth checkpoint too.
    let resumed = wait_for("the last run resumed", LONG, || {
        agreed(&lines(&log, "resumed", PREEMPTIONS + 1))
    });
    assert_eq!(resumed, step);
    let out = c.allot(&["cancel", &id]);
    assert!(out.status.success(), "{out:?}");
}

#[test]
fn a_torchrun_gang_hears_its_warning_checkpoints_trains_on_and_ends_at_its_limit() {
    // `--signal USR2@45s`: the warning is for the ranks. torchrun must pass it by,
    // not shut the gang down on it ("failed, exit 1" before the limit).
    let _turn = turn();
    let Some(venv) = torch_venv() else {
        return;
    };
    let c = Cluster::start("torchwarn", ONE_PROJECT, 2, 2);
    let (id, log) = submit_train(
        &c,
        &venv,
        &[
            "--nodes",
            "2",
            "--gpus",
            "2",
            "--min-runtime",
            "1s",
            "--time-limit",
            "90s",
            "--signal",
            "USR2@45s",
        ],
    );
    let warned = wait_for("4 ranks warned, at one step", LONG, || {
        agreed_of(&lines(&log, "warned", 1), 4)
    });
    // The gang trains on past the warning: torchrun did not stop it.
    wait_for("steps after the warning", LONG, || {
        std::fs::read_to_string(&log)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| {
                l.strip_prefix("step=")?
                    .split_whitespace()
                    .next()?
                    .parse::<u64>()
                    .ok()
            })
            .any(|s| s >= warned + 3)
            .then_some(())
    });
    assert_eq!(c.status(&id)["state"], "running");
    // At the limit the ladder ends it through its checkpoint, as timed-out.
    let w = c.wait_state(&id, "timed-out", LONG);
    assert_eq!(w["lease_ids"].as_array().map(Vec::len), Some(1), "{w}");
    let done = agreed_of(&lines(&log, "checkpointed", 1), 4).expect("every rank checkpointed");
    assert!(done > warned, "it trained on from {warned} to {done}");
}
