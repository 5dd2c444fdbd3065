//! NVIDIA XID and NVSwitch SXid lines from the kernel log, in every shape they come in.
//!
//! Accepted prefixes: raw `/dev/kmsg` records (`6,3964,206764307,-;…`), `dmesg`
//! (`[ 1451.785035] …`, `[Sun Feb 23 16:24:18 2025] …`, `dmesg --time-format iso`
//! with or without `kern  :warn  : `), syslog and journal (`Jan 21 04:41:44 host
//! kernel: …`). PCI ids with any domain, a MIG `GPU-I:NN` suffix or a function number;
//! `pid=`/`name=` present, absent or `<unknown>` (quoted or not). The "GPU has fallen
//! off the bus" message that comes without an Xid line is reported as XID 79.
//!
//! Lines that are not XIDs cost one substring search, so scanning a whole log is
//! cheap; nothing here allocates for them or can panic on any input.

use serde::Serialize;

/// Which message family.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Kind {
    /// A GPU's `NVRM: Xid`.
    Xid,
    /// An NVSwitch's `SXid`.
    Sxid,
}

/// One XID or SXid event read from the log.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct XidEvent {
    /// Family.
    pub kind: Kind,
    /// The XID or SXid number.
    pub xid: u32,
    /// PCI bus id as `dddd:bb:dd`, lower case, no function, no MIG suffix.
    pub pci: String,
    /// MIG GPU instance, when the line names one.
    pub gpu_instance: Option<u32>,
    /// Process id, when known.
    pub pid: Option<u32>,
    /// Process name, when known.
    pub name: Option<String>,
    /// The rest of the message.
    pub message: String,
    /// The line's own timestamp, as written (kmsg: microseconds since boot).
    pub time: Option<String>,
    /// The kmsg sequence number, for raw `/dev/kmsg` records.
    pub seq: Option<u64>,
}

/// Parses one line; `None` for anything that is not an XID/SXid event.
pub fn parse_line(line: &str) -> Option<XidEvent> {
    if let Some(i) = line.find("Xid (") {
        let kind = if line[..i].ends_with('S') {
            Kind::Sxid
        } else {
            Kind::Xid
        };
        return parse_xid(line, i + "Xid (".len(), kind);
    }
    if line.contains("fallen off the bus") {
        return parse_fallen(line);
    }
    None
}

/// Time and kmsg sequence from the line's prefix.
fn prefix(line: &str) -> (Option<String>, Option<u64>) {
    // Raw kmsg: "prio,seq,usec,flags;message".
    if let Some(semi) = line.find(';') {
        let head = &line[..semi];
        let mut f = head.split(',');
        if let (Some(p), Some(seq), Some(usec)) = (f.next(), f.next(), f.next()) {
            if p.bytes().all(|b| b.is_ascii_digit())
                && !p.is_empty()
                && seq.bytes().all(|b| b.is_ascii_digit())
                && !seq.is_empty()
            {
                return (Some(usec.to_string()), seq.parse().ok());
            }
        }
    }
    let t = line.trim_start();
    if let Some(rest) = t.strip_prefix('[') {
        if let Some(end) = rest.find(']') {
            return (Some(rest[..end].trim().to_string()), None);
        }
    }
    // ISO (`dmesg --time-format iso`, optionally after `kern  :warn  : `) or syslog.
    let t = match t.find(" : ") {
        Some(i) if t[..i].contains(':') && t.starts_with("kern") => t[i + 3..].trim_start(),
        _ => t,
    };
    let first = t.split_whitespace().next().unwrap_or("");
    if first.len() >= 10
        && first.as_bytes()[4] == b'-'
        && first.as_bytes()[..4].iter().all(u8::is_ascii_digit)
    {
        return (Some(first.to_string()), None);
    }
    if t.len() >= 15
        && t.as_bytes()[..3].iter().all(u8::is_ascii_alphabetic)
        && t.as_bytes()[3] == b' '
    {
        return (t.get(..15).map(str::to_string), None);
    }
    (None, None)
}

/// Normalises `PCI:0000:3B:00.0` / `3b:00` to `0000:3b:00`.
pub(crate) fn normalize_pci(raw: &str) -> Option<String> {
    let raw = raw.strip_prefix("PCI:").unwrap_or(raw);
    let raw = raw.split('.').next().unwrap_or(raw);
    let parts: Vec<&str> = raw.split(':').collect();
    let (dom, bus, dev) = match parts.as_slice() {
        [d, b, v] => (*d, *b, *v),
        [b, v] => ("0000", *b, *v),
        _ => return None,
    };
    let hex = |s: &str, max: usize| {
        !s.is_empty() && s.len() <= max && s.bytes().all(|b| b.is_ascii_hexdigit())
    };
    if !(hex(dom, 8) && hex(bus, 2) && hex(dev, 2)) {
        return None;
    }
    // NVML and DCGM write the domain with 8 digits, the kernel with 4: compare values.
    let n = |s: &str| u32::from_str_radix(s, 16).ok();
    Some(format!("{:04x}:{:02x}:{:02x}", n(dom)?, n(bus)?, n(dev)?))
}

fn parse_xid(line: &str, start: usize, kind: Kind) -> Option<XidEvent> {
    let rest = &line[start..];
    let close = rest.find(')')?;
    let inside = rest[..close].trim();
    let mut words = inside.split_whitespace();
    let pci = normalize_pci(words.next()?)?;
    let gpu_instance = words
        .find_map(|w| w.strip_prefix("GPU-I:"))
        .and_then(|n| n.parse().ok());
    let after = rest[close + 1..].trim_start();
    let after = after.strip_prefix(':').unwrap_or(after).trim_start();
    let digits = after.bytes().take_while(u8::is_ascii_digit).count();
    let xid: u32 = after[..digits].parse().ok()?;
    let mut msg = after[digits..].trim_start();
    msg = msg.strip_prefix(',').unwrap_or(msg).trim_start();
    let mut pid = None;
    let mut name = None;
    if let Some(v) = msg.strip_prefix("pid=") {
        let (val, tail) = split_field(v);
        pid = unquote(val).parse().ok();
        msg = tail;
        if let Some(v) = msg.strip_prefix("name=") {
            let (val, tail) = split_field(v);
            let val = unquote(val);
            if val != "<unknown>" && !val.is_empty() {
                name = Some(val.to_string());
            }
            msg = tail;
        }
    }
    let (time, seq) = prefix(line);
    Some(XidEvent {
        kind,
        xid,
        pci,
        gpu_instance,
        pid,
        name,
        message: msg.trim().to_string(),
        time,
        seq,
    })
}

/// Splits `value, rest` at the first comma.
fn split_field(s: &str) -> (&str, &str) {
    match s.find(',') {
        Some(i) => (s[..i].trim(), s[i + 1..].trim_start()),
        None => (s.trim(), ""),
    }
}

fn unquote(s: &str) -> &str {
    s.trim_matches(|c| c == '\'' || c == '"')
}

/// `NVRM: GPU 0000:3b:00.0: GPU has fallen off the bus.` (or `GPU at PCI:…`).
fn parse_fallen(line: &str) -> Option<XidEvent> {
    let i = line.find("GPU ")?;
    let after = &line[i + 4..];
    let after = after.strip_prefix("at ").unwrap_or(after);
    let token = after.split([' ', ',']).next()?.trim_end_matches(':');
    let pci = normalize_pci(token)?;
    let (time, seq) = prefix(line);
    Some(XidEvent {
        kind: Kind::Xid,
        xid: 79,
        pci,
        gpu_instance: None,
        pid: None,
        name: None,
        message: "GPU has fallen off the bus (reported without an Xid line)".into(),
        time,
        seq,
    })
}

/// Every event in a whole log, in order.
pub fn scan(text: &str) -> Vec<XidEvent> {
    text.lines().filter_map(parse_line).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn one(line: &str) -> XidEvent {
        parse_line(line).unwrap_or_else(|| panic!("no event in {line:?}"))
    }

    #[test]
    fn dmesg_with_pid_and_name() {
        let e = one("[ 1451.785035] NVRM: Xid (PCI:0000:3B:00): 79, pid=1234, name=python3, GPU has fallen off the bus.");
        assert_eq!(
            (e.kind, e.xid, e.pci.as_str()),
            (Kind::Xid, 79, "0000:3b:00")
        );
        assert_eq!((e.pid, e.name.as_deref()), (Some(1234), Some("python3")));
        assert_eq!(e.message, "GPU has fallen off the bus.");
        assert_eq!(e.time.as_deref(), Some("1451.785035"));
    }

    #[test]
    fn raw_kmsg_record_with_unknown_pid() {
        let e = one("4,3964,206764307,-;NVRM: Xid (PCI:0018:01:00): 119, pid='<unknown>', name=<unknown>, Timeout after 6s of waiting for RPC response from GPU1 GSP! Expected function 76 (GSP_RM_CONTROL).");
        assert_eq!(
            (e.xid, e.pci.as_str(), e.seq),
            (119, "0018:01:00", Some(3964))
        );
        assert_eq!((e.pid, e.name), (None, None));
        assert_eq!(e.time.as_deref(), Some("206764307"));
        assert!(e.message.starts_with("Timeout after 6s"));
    }

    #[test]
    fn mig_suffix_and_no_pid() {
        let e = one("kernel: NVRM: Xid (PCI:0000:01:00 GPU-I:05): 94, Contained: CE User Channel (0x9). RST: No, D-RST: No");
        assert_eq!(
            (e.xid, e.pci.as_str(), e.gpu_instance),
            (94, "0000:01:00", Some(5))
        );
        assert_eq!(e.pid, None);
        assert!(e.message.starts_with("Contained"));
    }

    #[test]
    fn iso_and_human_and_syslog_prefixes() {
        let e = one("kern  :warn  : 2025-01-21T04:41:44,283302+00:00 NVRM: Xid (PCI:0000:9b:00): 48, pid=<unknown>, name=<unknown>, An uncorrectable double bit error");
        assert_eq!(
            (e.xid, e.time.as_deref()),
            (48, Some("2025-01-21T04:41:44,283302+00:00"))
        );
        let e = one("[Sun Feb 23 16:24:18 2025] NVRM: Xid (PCI:0000:ab:00): 31, pid=77, name=train, Ch 00000008, intr 00000000. MMU Fault");
        assert_eq!(
            (e.xid, e.time.as_deref()),
            (31, Some("Sun Feb 23 16:24:18 2025"))
        );
        let e = one("Jan 21 04:41:44 gpu-node-17 kernel: [ 33.1] NVRM: Xid (PCI:0000:3b:00): 13, Graphics Exception");
        assert_eq!((e.xid, e.time.as_deref()), (13, Some("Jan 21 04:41:44")));
    }

    #[test]
    fn nvswitch_sxid_with_function_number() {
        let e = one("[ 88.2] nvidia-nvswitch3: SXid (PCI:0000:c5:00.0): 12028, Non-fatal, Link 52 egress non-posted PRIV error (First)");
        assert_eq!(
            (e.kind, e.xid, e.pci.as_str()),
            (Kind::Sxid, 12028, "0000:c5:00")
        );
        assert!(e.message.starts_with("Non-fatal"));
    }

    #[test]
    fn nvlink5_line() {
        let e = one("NVRM: Xid (PCI:0008:01:00): 149, pid=2201, name=torchrun, NETIR_LINK_EVT Fatal XC0 i0 Link 17 (0x00000000 0x00000000 0x00000000)");
        assert_eq!(e.xid, 149);
        assert!(e.message.starts_with("NETIR_LINK_EVT Fatal"));
    }

    #[test]
    fn fallen_off_the_bus_without_xid() {
        let e = one("[ 9.9] NVRM: GPU 0000:3B:00.0: GPU has fallen off the bus.");
        assert_eq!((e.xid, e.pci.as_str()), (79, "0000:3b:00"));
        let e = one("NVRM: GPU at PCI:0000:5e:00: GPU has fallen off the bus.");
        assert_eq!(e.pci, "0000:5e:00");
    }

    #[test]
    fn ignores_everything_else() {
        for l in [
            "",
            "[ 1.0] usb 1-1: new high-speed USB device",
            "NVRM: GPU at PCI:0000:91:00: GPU-2b3c4d5e-aaaa-bbbb-cccc-ddddeeeeffff",
            "NVRM: Xid (PCI:zz:00): 79, junk",
            "NVRM: Xid (PCI:0000:3b:00): notanumber",
            "NVRM: Xid (",
        ] {
            assert_eq!(parse_line(l), None, "{l:?}");
        }
    }
}
