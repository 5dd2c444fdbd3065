//! `allotd state check|export|import|backup|restore|accept-loss|drop|bench`: the
//! operator's tools for allotd's state file, run beside (check, export, backup) or
//! instead of (import, restore, accept-loss, drop) `allotd serve`. Export is the JSON
//! of a snapshot; import makes a state file holding only that snapshot; backup is a
//! consistent copy of the whole file taken while allotd serves, restore puts one
//! back. A file replaced is kept aside, and ids continue above every id allotd gave
//! (`acked.rs`), so none is given twice.

use crate::acked::{db_hash, older, Acked, Marker};
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
    /// Copy the whole state file, consistent, while allotd serves (SQLite's `VACUUM
    /// INTO`): what `restore` takes back.
    Backup {
        #[command(flatten)]
        common: Common,
        /// The copy to write (must not exist).
        file: PathBuf,
    },
    /// Put a backup back (allotd stopped): the file it replaces is kept aside as
    /// `allotd.db.replaced-UNIXTIME`, and new ids continue above every id allotd
    /// gave since, so none is given twice.
    Restore {
        #[command(flatten)]
        common: Common,
        /// A file `allotd state backup` wrote.
        file: PathBuf,
    },
    /// Accept that the newest acknowledged inputs are lost (the write-ahead log was
    /// lost or damaged, and start-up refuses the state): the state goes on from what
    /// the database holds, and new ids continue above every id allotd gave.
    AcceptLoss(Common),
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
        StateCmd::Backup { common, file } => backup(&ServerConfig::load(&common.config)?, &file),
        StateCmd::Restore { common, file } => restore(&ServerConfig::load(&common.config)?, &file),
        StateCmd::AcceptLoss(c) => accept_loss(&ServerConfig::load(&c.config)?),
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
    let marker = cfg.server.state_dir.join(crate::acked::FILE);
    let this = db_hash(&store.db_id()?);
    if let Some(why) = Marker::peek(&cfg.server.state_dir)?
        .and_then(|a| older(&path, this, &marker, store.last_seq().unwrap_or(0), &a))
    {
        problems.push(why);
    }
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
    let aside = move_aside(dir)?;
    let mut store = Sqlite::open(dir)?;
    store.snapshot(now(), &text, &[])?;
    let (w, l) = continue_ids(cfg, &mut store, "the state was imported from an export")?;
    println!(
        "{} made from {}: {} workloads, {} live leases; new ids continue at workload {w} and lease A-{l}; the file it replaced (if any) is {aside}",
        db.display(),
        file.display(),
        snap.work.len(),
        snap.core.leases.len()
    );
    Ok(())
}

/// Moves the state file (and its `-wal`, `-shm`) aside as
/// `allotd.db.replaced-UNIXTIME`, for a new one to take its place, and removes its
/// marker (which would refuse the new one as "missing"); returns the name aside.
fn move_aside(dir: &Path) -> anyhow::Result<String> {
    let db = dir.join("allotd.db");
    let aside = format!("allotd.db.replaced-{}", now());
    for suffix in ["", "-wal", "-shm"] {
        let from = PathBuf::from(format!("{}{suffix}", db.display()));
        if from.exists() {
            std::fs::rename(&from, dir.join(format!("{aside}{suffix}")))
                .with_context(|| format!("moving {} aside", from.display()))?;
        }
    }
    let marker = allot_common::sqlite::marker_path(dir, "allotd.db");
    match std::fs::remove_file(&marker) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            Err(e).with_context(|| format!("removing {}", marker.display()))
        }
        _ => Ok(aside),
    }
}

/// After the state file was replaced (import, restore) or a loss accepted: new ids
/// continue above every id allotd gave (the marker's, and the file's own), through
/// a journaled `IdsAbove`; the marker then agrees with the file. Returns the next
/// workload and lease ids.
fn continue_ids(cfg: &ServerConfig, store: &mut Sqlite, why: &str) -> anyhow::Result<(u64, u64)> {
    let (mut marker, acked) = Marker::open(&cfg.server.state_dir, &store.db_id()?)?;
    let (alloc, _) = load(cfg, store)?;
    let (w, l) = alloc.core.next_ids();
    let seen = acked.unwrap_or_default();
    let next = (w.max(seen.next_workload), l.max(seen.next_lease));
    if next != (w, l) {
        store.commit(
            now(),
            Some(&Input::IdsAbove {
                next_workload: next.0,
                next_lease: next.1,
                why: why.to_string(),
            }),
            &[],
            &[],
        )?;
    }
    marker.record(Acked {
        seq: store.last_seq()?,
        next_workload: next.0,
        next_lease: next.1,
        db: 0,
    })?;
    Ok(next)
}

/// `allotd state backup FILE`: a consistent copy while allotd serves.
fn backup(cfg: &ServerConfig, file: &Path) -> anyhow::Result<()> {
    anyhow::ensure!(
        !file.exists(),
        "{} exists: give a new file (a backup never overwrites one)",
        file.display()
    );
    let db = cfg.server.state_dir.join("allotd.db");
    let seq = crate::store::backup(&db, file)?;
    let bytes = std::fs::metadata(file).map(|m| m.len()).unwrap_or(0);
    println!(
        "{} backed up to {} ({bytes} bytes, journal up to entry {seq}); put it back with `allotd state restore {}`",
        db.display(),
        file.display(),
        file.display()
    );
    Ok(())
}

/// `allotd state restore FILE`: a backup put back, allotd stopped.
fn restore(cfg: &ServerConfig, file: &Path) -> anyhow::Result<()> {
    let dir = &cfg.server.state_dir;
    stopped(cfg)?;
    // Read whole first, in a dir of its own: a backup that does not read, or does
    // not fit this config, changes nothing.
    let trial = dir.join(format!(".restore-{}", now()));
    std::fs::create_dir_all(&trial)?;
    let checked = (|| -> anyhow::Result<u64> {
        std::fs::copy(file, trial.join("allotd.db"))
            .with_context(|| format!("copying {}", file.display()))?;
        // fs::copy keeps the backup's mode: a copy made readable elsewhere must not
        // make the live state file readable.
        std::fs::set_permissions(
            trial.join("allotd.db"),
            std::os::unix::fs::PermissionsExt::from_mode(0o600),
        )?;
        let store = Sqlite::open(&trial)
            .with_context(|| format!("{} is not an allotd state file", file.display()))?;
        let problems = store.integrity()?;
        anyhow::ensure!(
            problems.is_empty(),
            "{}: {}",
            file.display(),
            problems.join("; ")
        );
        load(cfg, &store)
            .with_context(|| format!("{} does not fit this config", file.display()))?;
        Ok(store.last_seq()?)
    })();
    let seq = match checked {
        Ok(seq) => seq,
        Err(e) => {
            let _ = std::fs::remove_dir_all(&trial);
            return Err(e);
        }
    };
    let db = dir.join("allotd.db");
    let aside = move_aside(dir)?;
    // Closed by now (its log folded back into the file).
    std::fs::rename(trial.join("allotd.db"), &db)
        .with_context(|| format!("putting {} in place", file.display()))?;
    let _ = std::fs::remove_dir_all(&trial);
    let mut store = Sqlite::open(dir)?;
    let (w, l) = continue_ids(
        cfg,
        &mut store,
        &format!("the state was restored from {}", file.display()),
    )?;
    println!(
        "{} restored from {} (journal up to entry {seq}); new ids continue at workload {w} and lease A-{l}, above every id allotd gave; the file it replaced is {aside}. Work the backup does not know that hosts still run is reported when they register, and left running",
        db.display(),
        file.display()
    );
    Ok(())
}

/// `allotd state accept-loss`: the state goes on from what the database holds.
fn accept_loss(cfg: &ServerConfig) -> anyhow::Result<()> {
    stopped(cfg)?;
    let mut store = Sqlite::open(&cfg.server.state_dir)?;
    let seq = store.last_seq()?;
    let this = db_hash(&store.db_id()?);
    let file = cfg.server.state_dir.join(crate::acked::FILE);
    if Marker::damaged(&cfg.server.state_dir)? {
        // What it said is gone: it is made anew from the database, and ids continue
        // above those the database and the hosts' records hold.
        std::fs::remove_file(&file).with_context(|| format!("removing {}", file.display()))?;
        let (w, l) = continue_ids(
            cfg,
            &mut store,
            &format!("{} was damaged and is made anew", file.display()),
        )?;
        println!(
            "accepted: {} was damaged; it is made anew at journal entry {seq}, and new ids continue at workload {w} and lease A-{l}",
            file.display()
        );
        return Ok(());
    }
    let acked = Marker::peek(&cfg.server.state_dir)?;
    let Some(a) = acked.filter(|a| a.db == this && a.seq > seq) else {
        println!(
            "nothing to accept: {} holds every input allotd acknowledged ({})",
            cfg.server.state_dir.join("allotd.db").display(),
            cfg.server.state_dir.join(crate::acked::FILE).display()
        );
        return Ok(());
    };
    let (w, l) = continue_ids(
        cfg,
        &mut store,
        &format!(
            "{} acknowledged inputs (journal entries {} to {}) were lost with the write-ahead log",
            a.seq - seq,
            seq + 1,
            a.seq
        ),
    )?;
    println!(
        "accepted: the {} newest acknowledged inputs are lost (journal entries {} to {}); allotd goes on from entry {seq}, and new ids continue at workload {w} and lease A-{l}",
        a.seq - seq,
        seq + 1,
        a.seq
    );
    Ok(())
}

/// Refuses while an allotd serves this state dir (it is the file's one writer).
fn stopped(cfg: &ServerConfig) -> anyhow::Result<()> {
    let socket = crate::daemon::admin_socket_path(&cfg.server.state_dir);
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
                ..Default::default()
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
            ..Default::default()
        };
        let mut step = vec![Input::Submit {
            pty: false,
            spec,
            argv: vec!["train.py".into()],
            hook: String::new(),
            cwd: String::new(),
            env: Vec::new(),
            output: String::new(),
            error: String::new(),
            warn: None,
            name: String::new(),
            gates: Default::default(),
            array: None,
            script: String::new(),
            notify: Vec::new(),
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
                    signal: None,
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
    // What one acknowledged input costs: its journal commit (SQLite, fsync), then the
    // record of what was acknowledged (`acked.rs`, fdatasync), as `allotd serve` does
    // before it answers.
    let mut store = store;
    let (mut marker, _) = Marker::open(&dir, &store.db_id()?)?;
    let input = Input::SetWeight {
        group: "demo-a".into(),
        weight: 1.0,
        by: "bench".into(),
    };
    let (mut commit_s, mut ack_s) = (Vec::new(), Vec::new());
    for i in 0..500u64 {
        let t = Instant::now();
        let seq = store.commit(t0.elapsed().as_secs() + i, Some(&input), &[], &[])?;
        commit_s.push(t.elapsed().as_secs_f64());
        let t = Instant::now();
        marker.record(Acked {
            seq: seq.unwrap_or(0),
            next_workload: i,
            next_lease: i,
            db: 0,
        })?;
        ack_s.push(t.elapsed().as_secs_f64());
    }
    let p = |v: &mut Vec<f64>, q: f64| {
        v.sort_by(f64::total_cmp);
        v[((v.len() as f64 - 1.0) * q) as usize] * 1e3
    };
    println!(
        "acknowledging one input: journal commit median {:.3} ms (p99 {:.3}), then the marker median {:.3} ms (p99 {:.3}), over 500",
        p(&mut commit_s, 0.5),
        p(&mut commit_s, 0.99),
        p(&mut ack_s, 0.5),
        p(&mut ack_s, 0.99),
    );
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}
