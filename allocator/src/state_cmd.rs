//! `allotd state check|export|import|drop|bench`: the operator's tools for allotd's
//! state file, run beside (check, export) or instead of (import, drop) `allotd serve`.
//! Export is the JSON of a snapshot; import makes a state file holding only that
//! snapshot, the damaged or replaced file kept aside.

use crate::config::ServerConfig;
use crate::serve::{load, now};
use crate::state::{Allocator, Input, Snapshot};
use crate::store::{Sqlite, Store};
use anyhow::Context;
use std::path::{Path, PathBuf};
use std::time::Instant;

/// `allotd state …`.
#[derive(clap::Subcommand)]
pub enum StateCmd {
    /// Read the state file whole: the snapshot, every journal entry after it, and
    /// the state they make; says what does not read. Exit 1 on any problem.
    Check(Common),
    /// Write the state as JSON (a snapshot: facts only) to stdout or `--out`.
    Export {
        #[command(flatten)]
        common: Common,
        /// Write here instead of stdout.
        #[arg(long)]
        out: Option<PathBuf>,
    },
    /// Make the state file anew from an export (with allotd stopped); a state
    /// file already there is kept aside as `allotd.db.replaced-UNIXTIME`.
    Import {
        #[command(flatten)]
        common: Common,
        /// The export to read.
        file: PathBuf,
    },
    /// Move one journal entry that does not read (as `check` names it) out of the
    /// journal, into the file's `dropped` table; allotd stopped. What it held is
    /// lost to the state (its audit lines stay): the way past a damaged entry.
    Drop {
        #[command(flatten)]
        common: Common,
        /// The entry's position, as `check` or the start-up error names it.
        seq: u64,
    },
    /// Start-up time: a journal of N entries (a fleet in a steady state: a
    /// submission a second, as many ends, a pass every 4 s), snapshotted and
    /// retired as `allotd serve` does, then loaded.
    Bench {
        /// Journal entries written.
        #[arg(long, default_value_t = 100_000)]
        entries: u64,
        /// Nodes of 8 GPUs.
        #[arg(long, default_value_t = 1_000)]
        nodes: u32,
    },
}

/// Which allotd.
#[derive(clap::Args)]
pub struct Common {
    /// allotd's config (its `server.state_dir` and org tree).
    #[arg(long, default_value = "/etc/allot/allotd.toml")]
    config: PathBuf,
}

/// Runs one `allotd state` command.
pub fn run(cmd: StateCmd) -> anyhow::Result<()> {
    match cmd {
        StateCmd::Check(c) => check(&ServerConfig::load(&c.config)?),
        StateCmd::Export { common, out } => {
            let cfg = ServerConfig::load(&common.config)?;
            let store = Sqlite::open(&cfg.server.state_dir)?;
            let (alloc, _) = load(&cfg, &store)?;
            let body = serde_json::to_string_pretty(&alloc.snapshot())?;
            match out {
                Some(p) => allot_common::files::write_atomic(&p, &body, 0o600)
                    .with_context(|| format!("writing {}", p.display()))?,
                None => println!("{body}"),
            }
            Ok(())
        }
        StateCmd::Import { common, file } => import(&ServerConfig::load(&common.config)?, &file),
        StateCmd::Drop { common, seq } => {
            let cfg = ServerConfig::load(&common.config)?;
            stopped(&cfg)?;
            let mut store = Sqlite::open(&cfg.server.state_dir)?;
            anyhow::ensure!(
                store.drop_entry(seq)?,
                "no journal entry {seq} in {}: `allotd state check` names the ones that do not read",
                cfg.server.state_dir.join("allotd.db").display()
            );
            println!("journal entry {seq} moved to the dropped table; `allotd state check` next");
            Ok(())
        }
        StateCmd::Bench { entries, nodes } => bench(entries, nodes),
    }
}

fn check(cfg: &ServerConfig) -> anyhow::Result<()> {
    let store = Sqlite::open(&cfg.server.state_dir)?;
    let path = cfg.server.state_dir.join("allotd.db");
    let mut problems = store.integrity()?;
    let bad = store.unreadable_entries()?;
    for (seq, e) in &bad {
        problems.push(format!("journal entry {seq} does not read: {e}"));
    }
    if bad.is_empty() {
        match load(cfg, &store) {
            Ok((a, tail)) => {
                let running = a
                    .workloads()
                    .values()
                    .filter(|w| w.state == allot_fairshare::WorkloadState::Running)
                    .count();
                println!(
                    "{}: {} workloads ({running} running), {} live leases, {} nodes; {tail} journal entries after the last snapshot",
                    path.display(),
                    a.workloads().len(),
                    a.core.leases().count(),
                    a.nodes().len()
                );
            }
            Err(e) => problems.push(format!("{e:#}")),
        }
    }
    if problems.is_empty() {
        println!("state ok");
        return Ok(());
    }
    for p in &problems {
        println!("problem: {p}");
    }
    anyhow::bail!(
        "{} problem(s) in {}: restore the file from a backup, `allotd state import EXPORT.json` an export, or `allotd state drop SEQ` a journal entry that does not read",
        problems.len(),
        path.display()
    )
}

fn import(cfg: &ServerConfig, file: &Path) -> anyhow::Result<()> {
    let text =
        std::fs::read_to_string(file).with_context(|| format!("reading {}", file.display()))?;
    let snap: Snapshot = serde_json::from_str(&text)
        .with_context(|| format!("{} is not an `allotd state export`", file.display()))?;
    // Refused before anything is moved: the export must make a state this config runs.
    Allocator::restore(cfg, &snap, now())
        .with_context(|| format!("{} does not fit this config", file.display()))?;
    let dir = &cfg.server.state_dir;
    stopped(cfg)?;
    let db = dir.join("allotd.db");
    let aside = format!("allotd.db.replaced-{}", now());
    for suffix in ["", "-wal", "-shm"] {
        let from = PathBuf::from(format!("{}{suffix}", db.display()));
        if from.exists() {
            let to = dir.join(format!("{aside}{suffix}"));
            std::fs::rename(&from, &to)
                .with_context(|| format!("moving {} aside", from.display()))?;
        }
    }
    // The old file is aside: its marker would refuse the new one as "missing".
    let marker = allot_common::sqlite::marker_path(dir, "allotd.db");
    match std::fs::remove_file(&marker) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            return Err(e).with_context(|| format!("removing {}", marker.display()))
        }
        _ => {}
    }
    let mut store = Sqlite::open(dir)?;
    store.snapshot(now(), &text, &[])?;
    println!(
        "{} made from {}: {} workloads, {} live leases; the file it replaced (if any) is {aside}",
        db.display(),
        file.display(),
        snap.work.len(),
        snap.core.leases.len()
    );
    Ok(())
}

/// Refuses while an allotd serves this state dir (it is the file's one writer).
fn stopped(cfg: &ServerConfig) -> anyhow::Result<()> {
    let socket = crate::serve::admin_socket_path(&cfg.server.state_dir);
    if std::os::unix::net::UnixStream::connect(&socket).is_ok() {
        anyhow::bail!(
            "an allotd answers on {}: stop it first (systemctl stop allotd)",
            socket.display()
        );
    }
    Ok(())
}

/// Writes `entries` journal entries of a fleet at work, snapshotting every
/// `server.snapshot_every` as allotd does, then times start-up.
fn bench(entries: u64, nodes: u32) -> anyhow::Result<()> {
    use allot_fairshare::{NodeSpec, WorkloadSpec};
    let dir = std::env::temp_dir().join(format!("allot-state-bench-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let mut cfg = ServerConfig::parse(crate::config::EXAMPLE, "example")?;
    cfg.server.state_dir = dir.clone();
    let (every, keep) = (cfg.server.snapshot_every, cfg.server.keep_finished);
    let mut store = Sqlite::open(&dir)?;
    let mut a = Allocator::new(&cfg).map_err(|e| anyhow::anyhow!("{e}"))?;
    let projects = ["demo-a", "demo-b"];
    let mut written = 0u64;
    let mut since = 0u64;
    let t0 = Instant::now();
    let mut batch: Vec<(u64, Input)> = Vec::new();
    let flush = |store: &mut Sqlite,
                 a: Option<(&mut Allocator, u64)>,
                 batch: &mut Vec<(u64, Input)>|
     -> anyhow::Result<()> {
        store.append(batch)?;
        batch.clear();
        if let Some((a, at)) = a {
            crate::serve::write_snapshot(a, store, at, keep)?;
        }
        Ok(())
    };
    let mut t: u64 = 1_700_000_000;
    let push = |a: &mut Allocator, batch: &mut Vec<(u64, Input)>, t: u64, i: Input| {
        if let Ok(ap) = a.apply(t, &i) {
            if ap.changed {
                batch.push((t, ap.record.unwrap_or(i)));
                return true;
            }
        }
        false
    };
    for n in 0..nodes {
        let i = Input::AddNode {
            spec: NodeSpec {
                name: format!("n{n:05}"),
                cluster: "bench".into(),
                gpus: 8,
                cpu: 112,
                memory_gb: 2048,
            },
            gpu_uuids: (0..8).map(|g| format!("GPU-{n}-{g}")).collect(),
        };
        if push(&mut a, &mut batch, t, i) {
            written += 1;
            since += 1;
        }
    }
    let mut k = 0u64;
    while written < entries {
        t += 1;
        k += 1;
        let spec = WorkloadSpec {
            project: projects[(k % 2) as usize].into(),
            user: "bench".into(),
            class: "batch".into(),
            gpus_per_node: [1, 2, 4, 8][(k % 4) as usize],
            nodes: 1,
            cpu_per_node: 8,
            mem_per_node_gb: 64,
            min_runtime: if k.is_multiple_of(3) { 0 } else { 3_600 },
            time_limit: None,
            resumable: true,
            priority: 0,
            no_requeue: false,
        };
        let mut step = vec![Input::Submit {
            spec,
            argv: vec!["train.py".into()],
            hook: String::new(),
            cwd: String::new(),
            env: Vec::new(),
            output: String::new(),
            error: String::new(),
            warn: None,
        }];
        if k.is_multiple_of(4) {
            step.push(Input::Schedule);
        }
        // A steady state once the fleet is busy: work ends as fast as it arrives
        // (the oldest live lease).
        if a.core.pending_len() > 100 {
            if let Some(l) = a.core.leases().next().map(|l| l.id.0) {
                step.push(Input::LeaseEnded {
                    lease: l,
                    end: allot_fairshare::LeaseEnd::Completed,
                    reason: "exited 0".into(),
                    node: String::new(),
                    exit_code: None,
                    part: false,
                    leaving: false,
                });
            }
        }
        for i in step {
            if push(&mut a, &mut batch, t, i) {
                written += 1;
                since += 1;
            }
        }
        if since >= every {
            flush(&mut store, Some((&mut a, t)), &mut batch)?;
            since = 0;
        } else if batch.len() >= 1_000 {
            flush(&mut store, None, &mut batch)?;
        }
    }
    flush(&mut store, None, &mut batch)?;
    let wrote = t0.elapsed().as_secs_f64();
    drop(store);
    let bytes = std::fs::metadata(dir.join("allotd.db")).map_or(0, |m| m.len());
    let t1 = Instant::now();
    let store = Sqlite::open(&dir)?;
    let (back, tail) = load(&cfg, &store)?;
    let took = t1.elapsed().as_secs_f64();
    println!(
        "start-up: {entries} journal entries ({} workloads, {} live leases, {} nodes): loaded in {:.3} s (a snapshot and {tail} entries after it; file {:.1} MB; writing took {wrote:.1} s)",
        back.workloads().len(),
        back.core.leases().count(),
        back.nodes().len(),
        took,
        bytes as f64 / 1e6,
    );
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}
