//! `allot xid` as operators run it: the real binary on real-shaped logs.

use std::io::Write;
use std::process::{Command, Stdio};

fn allot(args: &[&str], stdin: &[u8]) -> (i32, String, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_allot"))
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("allot runs");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(stdin)
        .expect("write");
    let out = child.wait_with_output().expect("exits");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

const LOG: &[u8] = b"[ 1.0] usb 1-1: new device\n\
[ 1451.785035] NVRM: Xid (PCI:0000:3B:00): 79, pid=1234, name=python3, GPU has fallen off the bus.\n\
6,3965,206764400,-;NVRM: Xid (PCI:0018:01:00 GPU-I:05): 13, pid='<unknown>', name=<unknown>, Graphics Exception\n\
\xff\xfe garbage line\n\
[ 88.2] nvidia-nvswitch3: SXid (PCI:0000:c5:00.0): 12028, Non-fatal, Link 52 egress\n\
[ 90.0] NVRM: Xid (PCI:0000:3c:00): 4242, something new\n";

#[test]
fn scan_json_lists_every_event_in_order() {
    let (code, out, err) = allot(&["xid", "scan", "-", "--json"], LOG);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).expect("one JSON array");
    let rows = v.as_array().expect("array");
    assert_eq!(rows.len(), 4);
    assert_eq!(rows[0]["kind"], "xid");
    assert_eq!(rows[0]["xid"], 79);
    assert_eq!(rows[0]["pci"], "0000:3b:00");
    assert_eq!(rows[0]["action"], "drain-now");
    assert_eq!(rows[0]["recovery"], "reboot");
    assert_eq!(rows[0]["message"], "GPU has fallen off the bus.");
    assert_eq!(rows[1]["pci"], "0018:01:00", "MIG suffix dropped");
    assert_eq!(rows[1]["action"], "app");
    assert_eq!(rows[2]["kind"], "sxid");
    assert_eq!(rows[3]["known"], false);
}

#[test]
fn scan_reads_files_and_names_missing_ones() {
    let path = std::env::temp_dir().join(format!("allot-xid-{}.log", std::process::id()));
    std::fs::write(&path, LOG).expect("write");
    let (code, out, _) = allot(&["xid", "scan", path.to_str().expect("utf8")], b"");
    std::fs::remove_file(&path).ok();
    assert_eq!(code, 0);
    assert!(
        out.contains("0000:3b:00") && out.contains("drain-now"),
        "{out}"
    );
    let (code, _, err) = allot(&["xid", "scan", "/nonexistent/kern.log"], b"");
    assert_eq!(code, 2);
    assert!(err.contains("cannot open /nonexistent/kern.log"), "{err}");
}

#[test]
fn scan_attributes_a_fall_named_only_by_an_earlier_line() {
    // The driver's multi-line shape: the bus id only in the announcement, then an
    // Xid-less notice; and a second GPU whose Xid line and notice are one fall.
    let log = b"[ 9.0] NVRM: GPU at PCI:0000:3b:00: GPU-2bb7e0d8-1e4e-6dc4-9a87-1b5d0a7c2f11\n\
[ 9.0] NVRM: GPU Board Serial Number: 1234567890123\n\
[ 9.1] usb 1-1: new high-speed USB device\n\
[ 9.2] NVRM: A GPU crash dump has been created.\n\
[ 9.2] NVRM: GPU has fallen off the bus.\n\
[ 12.0] NVRM: GPU at PCI:0000:5e:00: GPU-99999999-1e4e-6dc4-9a87-1b5d0a7c2f11\n\
[ 12.0] NVRM: Xid (PCI:0000:5e:00): 79, pid=7, name=train, GPU has fallen off the bus.\n\
[ 12.0] NVRM: GPU 0000:5e:00.0: GPU has fallen off the bus.\n";
    let (code, out, err) = allot(&["xid", "scan", "-", "--json"], log);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).expect("one JSON array");
    let rows = v.as_array().expect("array");
    let got: Vec<(&str, &str, u64)> = rows
        .iter()
        .map(|r| {
            (
                r["pci"].as_str().unwrap_or(""),
                r["time"].as_str().unwrap_or(""),
                r["xid"].as_u64().unwrap_or(0),
            )
        })
        .collect();
    assert_eq!(got, [("0000:3b:00", "9.2", 79), ("0000:5e:00", "12.0", 79)]);
    assert_eq!(rows[0]["action"], "drain-now");
    assert_eq!(
        rows[1]["pid"], 7,
        "the Xid line, not the notice, is the one kept"
    );
}

#[test]
fn explain_known_and_unknown() {
    let (code, out, _) = allot(&["xid", "explain", "48"], b"");
    assert_eq!(code, 0);
    assert!(
        out.contains("GPU_ECC_DBE") && out.contains("drain-now"),
        "{out}"
    );
    // The bucket names, and what they ask of the operator.
    let immediate = out
        .lines()
        .find(|l| l.trim_start().starts_with("NVIDIA immediate:"))
        .unwrap_or_else(|| panic!("no immediate line: {out}"));
    assert!(
        immediate.contains("WORKFLOW_XID_48") && immediate.contains("reset the GPU"),
        "{out}"
    );
    assert!(
        out.lines()
            .any(|l| l.contains("NVIDIA investigatory:") && l.contains("WORKFLOW_XID_48")),
        "{out}"
    );
    let (_, out, _) = allot(&["xid", "explain", "79"], b"");
    assert!(
        out.lines().any(|l| l.contains("NVIDIA immediate:")
            && l.contains("RESTART_BM")
            && l.contains("restart (power-cycle) the bare-metal host")),
        "{out}"
    );
    assert!(
        out.lines().any(|l| l.contains("NVIDIA investigatory:")
            && l.contains("CONTACT_SUPPORT")
            && l.contains("support organization")),
        "{out}"
    );
    let (_, out, _) = allot(&["xid", "explain", "48", "--json"], b"");
    let v: serde_json::Value = serde_json::from_str(&out).expect("json");
    assert_eq!(v["immediate"], "WORKFLOW_XID_48", "bucket name kept");
    assert!(
        v["immediate_meaning"]
            .as_str()
            .is_some_and(|m| m.contains("double-bit ECC") && m.contains("reset the GPU")),
        "{v}"
    );
    assert!(v["investigatory_meaning"].as_str().is_some(), "{v}");
    let (_, out, _) = allot(&["xid", "explain", "119", "--json"], b"");
    let v: serde_json::Value = serde_json::from_str(&out).expect("json");
    assert_eq!(
        (v["action"].as_str(), v["recovery"].as_str()),
        (Some("drain-now"), Some("reset-gpu"))
    );
    assert_eq!(v["hopper"], true);
    assert_eq!(
        (v["immediate"].as_str(), v["investigatory"].as_str()),
        (Some("RESET_GPU"), Some("INVESTIGATE_SW"))
    );
    assert!(
        v["immediate_meaning"]
            .as_str()
            .is_some_and(|m| m.contains("nvidia-smi -r")),
        "{v}"
    );
    let (code, out, _) = allot(&["xid", "explain", "4242"], b"");
    assert_eq!(code, 0);
    assert!(out.contains("not in allot's catalog"), "{out}");
    let (_, out, _) = allot(&["xid", "explain", "4242", "--json"], b"");
    let v: serde_json::Value = serde_json::from_str(&out).expect("json");
    assert!(v["immediate_meaning"].is_null(), "{v}");
    let (code, _, err) = allot(&["xid", "explain", "seventy-nine"], b"");
    assert_eq!(code, 2);
    assert!(err.contains("<XID>"), "{err}");
}
