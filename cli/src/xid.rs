//! `allot xid explain N` and `allot xid scan [FILE|-] [--json]`.

use allot_health::kmsg::{self, Kind};
use allot_health::xid::{self, decide_sxid, Catalog};
use anyhow::{Context, Result};
use serde::Serialize;
use std::io::{BufRead, BufReader, Read};

/// The `xid` subcommands.
#[derive(clap::Subcommand)]
pub enum XidCommand {
    /// What XID N means, NVIDIA's resolution, and allot's action and recovery.
    Explain {
        /// The XID number.
        xid: u32,
        /// Print one JSON object.
        #[arg(long)]
        json: bool,
    },
    /// Every XID/SXid event in a kernel log (a file, or `-`/nothing for stdin).
    Scan {
        /// The log: `dmesg` output, `/dev/kmsg` records, syslog or journal text.
        file: Option<String>,
        /// Print one JSON array.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Serialize)]
struct Row {
    kind: Kind,
    xid: u32,
    pci: String,
    action: xid::Action,
    recovery: xid::Recovery,
    message: String,
    time: Option<String>,
    pid: Option<u32>,
    name: Option<String>,
    known: bool,
}

/// Runs one `xid` subcommand.
pub fn run(c: XidCommand) -> Result<()> {
    let catalog = Catalog::default();
    match c {
        XidCommand::Explain { xid, json } => {
            let d = catalog.decide(xid, "");
            let info = xid::lookup(xid);
            if json {
                let v = serde_json::json!({
                    "xid": xid,
                    "known": d.known,
                    "mnemonic": info.map(|i| i.mnemonic),
                    "meaning": info.map(|i| i.meaning),
                    "immediate": info.map(|i| i.immediate),
                    "immediate_meaning": info.and_then(|i| xid::bucket_meaning(i.immediate)),
                    "investigatory": info.map(|i| i.investigatory),
                    "investigatory_meaning": info.and_then(|i| xid::bucket_meaning(i.investigatory)),
                    "hopper": info.map(|i| i.hopper),
                    "blackwell": info.map(|i| i.blackwell),
                    "action": d.action,
                    "recovery": d.recovery,
                });
                println!("{v}");
                return Ok(());
            }
            match info {
                Some(i) => {
                    let field = |label: &str, value: &dyn std::fmt::Display| {
                        println!("  {:<22}{value}", format!("{label}:"));
                    };
                    // The bucket name is what NVIDIA's documents use; the sentence is
                    // what it asks of the operator.
                    let bucket = |b: &str| match xid::bucket_meaning(b) {
                        Some(m) => format!("{b}: {m}"),
                        None => b.to_string(),
                    };
                    println!("XID {} {}", i.xid, i.mnemonic);
                    field("meaning", &i.meaning);
                    field("NVIDIA immediate", &bucket(i.immediate));
                    if i.investigatory == i.immediate {
                        field("NVIDIA investigatory", &format!("{} (as above)", i.investigatory));
                    } else {
                        field("NVIDIA investigatory", &bucket(i.investigatory));
                    }
                    let yn = |b: bool| if b { "yes" } else { "no" };
                    field("applies to", &format!("H100 {}, Blackwell {}", yn(i.hopper), yn(i.blackwell)));
                    field("allot action", &d.action);
                    field("allot recovery", &d.recovery);
                    if xid == 154 {
                        field("note", &"the new recovery action in the message decides");
                    }
                    if (144..=150).contains(&xid) {
                        field("note", &"Fatal lines drain at once, Nonfatal ones are reported");
                    }
                }
                None => println!(
                    "XID {xid} is not in allot's catalog: it is reported and the GPU is marked degraded (action {}, recovery {})",
                    d.action, d.recovery
                ),
            }
            Ok(())
        }
        XidCommand::Scan { file, json } => {
            let (reader, what): (Box<dyn Read>, String) = match file.as_deref() {
                None | Some("-") => (Box::new(std::io::stdin()), "standard input".into()),
                Some(path) => (
                    Box::new(std::fs::File::open(path).with_context(|| {
                        format!("cannot open {path} (give a kernel log file, or - for stdin)")
                    })?),
                    path.to_string(),
                ),
            };
            let mut rows = Vec::new();
            let mut r = BufReader::new(reader);
            // Some notices name their GPU only in an earlier line.
            let mut lines = kmsg::Assembler::new();
            let mut buf = Vec::new();
            loop {
                buf.clear();
                let n = r
                    .read_until(b'\n', &mut buf)
                    .with_context(|| format!("cannot read {what}"))?;
                if n == 0 {
                    break;
                }
                // Logs are not always valid UTF-8; a bad byte must not hide an XID.
                let line = String::from_utf8_lossy(&buf);
                let Some(e) = lines.push(line.trim_end_matches(['\n', '\r'])) else {
                    continue;
                };
                let d = match e.kind {
                    Kind::Xid => catalog.decide(e.xid, &e.message),
                    Kind::Sxid => decide_sxid(e.xid, &e.message),
                };
                rows.push(Row {
                    kind: e.kind,
                    xid: e.xid,
                    pci: e.pci,
                    action: d.action,
                    recovery: d.recovery,
                    message: e.message,
                    time: e.time,
                    pid: e.pid,
                    name: e.name,
                    known: d.known,
                });
            }
            if json {
                println!("{}", serde_json::to_string(&rows)?);
                return Ok(());
            }
            println!(
                "{:<26} {:<12} {:<5} {:>6} {:<10} {:<16} message",
                "time", "pci", "kind", "xid", "action", "recovery"
            );
            for r in &rows {
                println!(
                    "{:<26} {:<12} {:<5} {:>6} {:<10} {:<16} {}",
                    r.time.as_deref().unwrap_or("-"),
                    r.pci,
                    if r.kind == Kind::Xid { "xid" } else { "sxid" },
                    r.xid,
                    r.action.to_string(),
                    r.recovery.to_string(),
                    r.message
                );
            }
            Ok(())
        }
    }
}
