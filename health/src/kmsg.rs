//! NVIDIA XID and NVSwitch SXid lines from the kernel log, in every shape they come in.
//!
//! Accepted prefixes: raw `/dev/kmsg` records (`6,3964,206764307,-;…`), `dmesg`
//! (`[ 1451.785035] …`, `[Sun Feb 23 16:24:18 2025] …`, `dmesg --time-format iso`
//! with or without `kern  :warn  : `), syslog and journal (`Jan 21 04:41:44 host
//! kernel: …`). PCI ids with any domain, a MIG `GPU-I:NN` suffix or a function number;
//! `pid=`/`name=` present, absent or `<unknown>` (quoted or not). A GPU that fell off
//! the bus without an Xid line is reported as XID 79.
//!
//! The driver (NVIDIA/open-gpu-kernel-modules, 515 to 595) says a GPU fell off the bus
//! in three ways:
//! - `NVRM: Xid (PCI:0000:3b:00): 79, …` (`krcReportXid`), the usual one;
//! - `NVRM: GPU 0000:3b:00.0: GPU has fallen off the bus.` (`osHandleGpuLost`), which
//!   usually follows the Xid line and comes alone when Xid lines are off
//!   (`NVreg_RmLogonRC=0`) or, from 595, after a Hopper or Blackwell `SEC_FAULT` (Xid
//!   110);
//! - at probe (`rm_is_supported_device`), one record of three lines: `NVRM: The NVIDIA
//!   GPU 0000:3b:00.0` / `NVRM: (PCI ID: 10de:2330) installed in this system has` /
//!   `NVRM: fallen off the bus and is not responding to commands.`, no Xid at all.
//!   `/dev/kmsg` keeps it one line (newlines written `\x0a`), journald one message
//!   (`\n`, rsyslog `#012`), but dmesg, syslog and `journalctl -k` print three lines,
//!   and only the first names the GPU.
//!
//! [`parse_line`] sees one line, so anything reading a stream of lines goes through
//! an [`Assembler`]: it keeps the GPU a probe notice's first line named for its next
//! [`PROBE_LINES`] lines, and reports the line that says it fell as that GPU's XID 79.
//! It also keeps the last GPU announced (`NVRM: GPU at PCI:0000:3b:00: GPU-<uuid>`,
//! printed before a GPU's first Xid) for [`CONTEXT_LINES`] lines, for a notice that
//! names no GPU at all (`NVRM: GPU has fallen off the bus.`: no driver source of 515 to
//! 595 prints it, older closed ones may have). A notice with its own address keeps it;
//! an address-less one outside any window is dropped, as there is no telling which GPU
//! it concerns. The driver usually writes an Xid 79 line and a notice for the same
//! fall; a notice for a GPU whose XID 79 was reported in the last [`CONTEXT_LINES`]
//! lines is that same fall and is not counted again.
//!
//! Lines that are not XIDs cost two substring searches, so scanning a whole log is
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

/// Parses one line; `None` for anything that is not an XID/SXid event on its own
/// (a "fallen off the bus" notice without an address needs an [`Assembler`]).
pub fn parse_line(line: &str) -> Option<XidEvent> {
    match classify(line) {
        Line::Event(e) => Some(e),
        Line::Fallen(Some(pci)) => Some(fallen(line, pci, FALLEN)),
        Line::Fallen(None) | Line::Announce(_) | Line::Probe(_) | Line::Other => None,
    }
}

/// Lines after a probe notice's first line (`NVRM: The NVIDIA GPU …`) during which
/// the line saying the GPU fell off the bus is taken to be about that GPU: the driver
/// prints the three lines in one call.
pub const PROBE_LINES: u64 = 3;

/// Lines after an `NVRM: GPU at PCI:…` announcement during which an address-less
/// "fallen off the bus" notice is taken to be about the announced GPU. The driver
/// writes the notice within a handful of lines (serial number, Xid, crash-dump
/// notice); beyond this, other GPUs' messages may have come in between.
pub const CONTEXT_LINES: u64 = 16;

/// Turns a stream of kernel-log lines into events, remembering across lines what a
/// single line cannot say: which GPU the driver last announced, and which GPUs' fall
/// off the bus was already reported (see the module doc). Pure: no I/O; feed it every
/// line in order, chatter included, as the window is counted in lines.
#[derive(Debug, Clone, Default)]
pub struct Assembler {
    /// Lines pushed so far.
    line: u64,
    /// The GPU last announced, and the line that announced it.
    announced: Option<(String, u64)>,
    /// The GPU a probe notice's first line named, and that line.
    probed: Option<(String, u64)>,
    /// GPUs whose XID 79 was reported, and on which line; at most one entry per line
    /// of the window, as older ones are dropped.
    fallen: Vec<(String, u64)>,
}

impl Assembler {
    /// A fresh assembler (the start of a log).
    pub fn new() -> Self {
        Self::default()
    }

    /// The event `line` completes, if any.
    pub fn push(&mut self, line: &str) -> Option<XidEvent> {
        self.line += 1;
        match classify(line) {
            Line::Other => None,
            Line::Announce(pci) => {
                self.announced = Some((pci, self.line));
                None
            }
            Line::Probe(pci) => {
                self.probed = Some((pci, self.line));
                None
            }
            Line::Event(e) => {
                if e.kind == Kind::Xid && e.xid == 79 {
                    self.fell(&e.pci);
                }
                Some(e)
            }
            Line::Fallen(Some(pci)) => self.notice(line, pci, FALLEN),
            Line::Fallen(None) => {
                let line_no = self.line;
                let within = |w: u64| move |(_, at): &&(String, u64)| line_no - at <= w;
                if let Some((pci, _)) = self.probed.as_ref().filter(within(PROBE_LINES)) {
                    let pci = pci.clone();
                    self.probed = None;
                    return self.notice(line, pci, FALLEN_PROBED);
                }
                let pci = self
                    .announced
                    .as_ref()
                    .filter(within(CONTEXT_LINES))
                    .map(|(pci, _)| pci.clone())?;
                self.notice(line, pci, FALLEN_ANNOUNCED)
            }
        }
    }

    /// The notice's event, unless the same GPU's fall was reported within the window.
    fn notice(&mut self, line: &str, pci: String, message: &str) -> Option<XidEvent> {
        let now = self.line;
        if self
            .fallen
            .iter()
            .any(|(p, at)| *p == pci && now - at <= CONTEXT_LINES)
        {
            return None;
        }
        self.fell(&pci);
        Some(fallen(line, pci, message))
    }

    /// Records `pci`'s fall on this line (and forgets falls outside the window).
    fn fell(&mut self, pci: &str) {
        let now = self.line;
        self.fallen
            .retain(|(p, at)| now - at <= CONTEXT_LINES && p != pci);
        self.fallen.push((pci.to_string(), now));
    }
}

/// What one line says, before any context is applied.
enum Line {
    /// An Xid/SXid line.
    Event(XidEvent),
    /// A "fallen off the bus" notice without an Xid line, with its bus id if it has one.
    Fallen(Option<String>),
    /// `NVRM: GPU at PCI:…: GPU-<uuid>`: the lines that follow concern this GPU.
    Announce(String),
    /// `NVRM: The NVIDIA GPU dddd:bb:dd.f`: a probe notice begins, about this GPU.
    Probe(String),
    /// Anything else.
    Other,
}

fn classify(line: &str) -> Line {
    // `contains` has a vectorised path for short needles and `find` builds a searcher
    // per call: the lines that are not XIDs (nearly all) pay only the former.
    if let Some(i) = line.contains("Xid (").then(|| line.find("Xid (")).flatten() {
        let kind = if line[..i].ends_with('S') {
            Kind::Sxid
        } else {
            Kind::Xid
        };
        return parse_xid(line, i + "Xid (".len(), kind).map_or(Line::Other, Line::Event);
    }
    // Announcements and notices say "GPU" or that something fell off the bus (a probe
    // notice's last line names neither GPU nor address); most chatter says neither.
    let fell = line.contains("fallen off the bus");
    if !fell && !line.contains("GPU") {
        return Line::Other;
    }
    if fell {
        return match fallen_address(line) {
            Address::Valid(pci) => Line::Fallen(Some(pci)),
            // Only the driver's own notice may borrow an announced GPU; a garbled
            // address is not "no address" and must not be pinned on another GPU.
            Address::Absent if line.contains("NVRM") => Line::Fallen(None),
            Address::Absent | Address::Garbled => Line::Other,
        };
    }
    if line.contains("GPU at PCI:") {
        if let Some(pci) = announced(line) {
            return Line::Announce(pci);
        }
    }
    if line.contains("NVRM") && line.contains(PROBED_GPU) {
        if let Address::Valid(pci) = fallen_address(line) {
            return Line::Probe(pci);
        }
    }
    Line::Other
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
pub fn normalize_pci(raw: &str) -> Option<String> {
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

const FALLEN: &str = "GPU has fallen off the bus (reported without an Xid line)";
const FALLEN_PROBED: &str =
    "GPU has fallen off the bus and is not responding to commands (found so when the driver probed it; no Xid line)";
/// How a probe notice names its GPU.
const PROBED_GPU: &str = "The NVIDIA GPU ";
const FALLEN_ANNOUNCED: &str =
    "GPU has fallen off the bus (reported without an Xid line or bus id; GPU named by the driver's preceding `GPU at PCI:` line)";

/// The bus id a "fallen off the bus" notice names, if it names one.
enum Address {
    /// A bus id, normalised.
    Valid(String),
    /// `NVRM: GPU has fallen off the bus.`: the GPU is in an earlier line.
    Absent,
    /// Something address-shaped that is not a bus id.
    Garbled,
}

/// `NVRM: GPU 0000:3b:00.0: GPU has fallen off the bus.`, `GPU at PCI:…`, or a probe
/// notice's `The NVIDIA GPU 0000:3b:00.0` (whose record may go on, after `\x0a`, `\n`
/// or `#012`, to say it fell).
fn fallen_address(line: &str) -> Address {
    let i = match line.find(PROBED_GPU) {
        Some(i) => i + PROBED_GPU.len(),
        None => match line.find("GPU ") {
            Some(i) => i + 4,
            None => return Address::Absent,
        },
    };
    let after = &line[i..];
    let after = after.strip_prefix("at ").unwrap_or(after);
    let after = after.strip_prefix("PCI:").unwrap_or(after);
    // The word ends at a space or comma, or where a record's newline was escaped
    // (`\x0a` in /dev/kmsg, `#012` from rsyslog).
    let end = after
        .find(|c: char| c.is_whitespace() || matches!(c, ',' | '\\' | '#'))
        .unwrap_or(after.len());
    let token = after[..end].trim_end_matches([':', '.']);
    if !token.contains(':') {
        return Address::Absent;
    }
    normalize_pci(token).map_or(Address::Garbled, Address::Valid)
}

/// `NVRM: GPU at PCI:0000:3b:00: GPU-2bb7e0d8-…`: the GPU the next lines are about.
fn announced(line: &str) -> Option<String> {
    let i = line.find("GPU at ")?;
    let token = line[i + "GPU at ".len()..]
        .split([' ', ','])
        .next()?
        .trim_end_matches(':');
    normalize_pci(token)
}

/// XID 79 for `pci`, timed by the notice's own line.
fn fallen(line: &str, pci: String, message: &str) -> XidEvent {
    let (time, seq) = prefix(line);
    XidEvent {
        kind: Kind::Xid,
        xid: 79,
        pci,
        gpu_instance: None,
        pid: None,
        name: None,
        message: message.into(),
        time,
        seq,
    }
}

/// Every event in a whole log, in order (through an [`Assembler`]).
pub fn scan(text: &str) -> Vec<XidEvent> {
    let mut a = Assembler::new();
    text.lines().filter_map(|l| a.push(l)).collect()
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

    /// Every event the assembler makes of `lines`, in order.
    fn assemble(lines: &[&str]) -> Vec<XidEvent> {
        let mut a = Assembler::new();
        lines.iter().filter_map(|l| a.push(l)).collect()
    }

    const ANNOUNCE_3B: &str =
        "4,500,9000,-;NVRM: GPU at PCI:0000:3b:00: GPU-2bb7e0d8-1e4e-6dc4-9a87-1b5d0a7c2f11";
    const SERIAL: &str = "4,501,9000,-;NVRM: GPU Board Serial Number: 1234567890123";
    const BARE_NOTICE: &str = "4,503,9100,-;NVRM: GPU has fallen off the bus.";

    #[test]
    fn announced_gpu_owns_a_later_notice_without_address() {
        let ev = assemble(&[
            ANNOUNCE_3B,
            SERIAL,
            "4,502,9050,-;NVRM: A GPU crash dump has been created. If possible, please run",
            BARE_NOTICE,
        ]);
        assert_eq!(ev.len(), 1, "{ev:?}");
        let e = &ev[0];
        assert_eq!(
            (e.kind, e.xid, e.pci.as_str()),
            (Kind::Xid, 79, "0000:3b:00")
        );
        // Timed by the notice, so a reset recorded after the announcement still
        // counts the fall as new.
        assert_eq!((e.seq, e.time.as_deref()), (Some(503), Some("9100")));
        assert!(e.message.contains("GPU at PCI:"), "{}", e.message);
        // On its own the notice names no GPU.
        assert_eq!(parse_line(BARE_NOTICE), None);
    }

    #[test]
    fn notice_with_its_own_address_after_the_announcement() {
        let notice = "[ 9.9] NVRM: GPU 0000:3b:00.0: GPU has fallen off the bus.";
        let ev = assemble(&[ANNOUNCE_3B, SERIAL, notice]);
        assert_eq!(ev.len(), 1, "{ev:?}");
        assert_eq!((ev[0].xid, ev[0].pci.as_str()), (79, "0000:3b:00"));
        assert_eq!(ev[0].time.as_deref(), Some("9.9"));
        // Its own address wins over the announced GPU's.
        let ev = assemble(&[
            ANNOUNCE_3B,
            "NVRM: GPU 0000:5e:00.0: GPU has fallen off the bus.",
        ]);
        assert_eq!(ev.len(), 1, "{ev:?}");
        assert_eq!(ev[0].pci, "0000:5e:00");
    }

    #[test]
    fn the_xid_line_and_the_notice_are_one_fall() {
        let xid = "4,502,9050,-;NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python3, GPU has fallen off the bus.";
        for notice in [
            BARE_NOTICE,
            "4,503,9100,-;NVRM: GPU 0000:3b:00.0: GPU has fallen off the bus.",
        ] {
            let ev = assemble(&[ANNOUNCE_3B, SERIAL, xid, notice]);
            assert_eq!(ev.len(), 1, "{notice}: {ev:?}");
            assert_eq!((ev[0].seq, ev[0].pid), (Some(502), Some(1234)));
        }
        // A notice repeated for the same GPU is the same fall too.
        let ev = assemble(&[ANNOUNCE_3B, BARE_NOTICE, BARE_NOTICE]);
        assert_eq!(ev.len(), 1, "{ev:?}");
    }

    #[test]
    fn unrelated_chatter_in_between_keeps_the_context() {
        let ev = assemble(&[
            ANNOUNCE_3B,
            "6,600,9001,-;usb 1-1: new high-speed USB device number 2 using xhci_hcd",
            SERIAL,
            "[ 9.0] pcieport 0000:3a:00.0: AER: Uncorrected (Fatal) error received: 0000:3a:00.0",
            "Jan 21 04:41:44 gpu-node-17 kernel: nvidia-peermem nv_get_p2p_free_callback:127 ERROR detected invalid context",
            "NVRM: Xid (PCI:0000:91:00): 13, Graphics Exception",
            BARE_NOTICE,
        ]);
        let got: Vec<(u32, &str)> = ev.iter().map(|e| (e.xid, e.pci.as_str())).collect();
        assert_eq!(got, [(13, "0000:91:00"), (79, "0000:3b:00")]);
    }

    #[test]
    fn a_second_gpu_announced_takes_over_the_context() {
        let ev = assemble(&[
            ANNOUNCE_3B,
            SERIAL,
            "4,510,9001,-;NVRM: GPU at PCI:0000:5e:00: GPU-99999999-1e4e-6dc4-9a87-1b5d0a7c2f11",
            "4,511,9001,-;NVRM: GPU Board Serial Number: 1234567890999",
            BARE_NOTICE,
        ]);
        assert_eq!(ev.len(), 1, "{ev:?}");
        assert_eq!(ev[0].pci, "0000:5e:00");
    }

    #[test]
    fn the_context_expires_after_its_window() {
        let chatter = "[ 1.0] usb 1-1: new high-speed USB device";
        let with_gap = |gap: usize| {
            let mut lines = vec![ANNOUNCE_3B];
            lines.resize(1 + gap, chatter);
            lines.push(BARE_NOTICE);
            assemble(&lines)
        };
        let last = CONTEXT_LINES as usize - 1;
        assert_eq!(
            with_gap(last).len(),
            1,
            "the notice is the window's last line"
        );
        assert!(with_gap(last + 1).is_empty(), "one line too late");
        // With no GPU announced at all, nobody can be blamed.
        assert!(assemble(&[chatter, BARE_NOTICE]).is_empty());
    }

    #[test]
    fn only_the_drivers_notice_borrows_an_announced_gpu() {
        // A garbled address is not "no address".
        assert!(
            assemble(&[ANNOUNCE_3B, "NVRM: GPU zz:qq: GPU has fallen off the bus."]).is_empty()
        );
        // Someone else's words about a bus.
        assert!(assemble(&[
            ANNOUNCE_3B,
            "myapp[77]: my GPU has fallen off the bus, retrying"
        ])
        .is_empty());
    }

    #[test]
    fn scan_assembles_multi_line_notices() {
        let log = [ANNOUNCE_3B, SERIAL, BARE_NOTICE].join("\n");
        let ev = scan(&log);
        assert_eq!(ev.len(), 1, "{ev:?}");
        assert_eq!(ev[0].pci, "0000:3b:00");
    }

    /// The driver's shapes of a fall off the bus (open-gpu-kernel-modules 515 to 595),
    /// as the kernel log is read: each yields one XID 79 for 0000:3b:00.
    #[test]
    fn every_shape_the_driver_prints_for_a_fall_is_one_xid_79() {
        let probe = [
            "NVRM: The NVIDIA GPU 0000:3b:00.0",
            "NVRM: (PCI ID: 10de:2330) installed in this system has",
            "NVRM: fallen off the bus and is not responding to commands.",
        ];
        let shapes: Vec<(&str, Vec<String>)> = vec![
            // krcReportXid: 570+ without a process, 515-565 with an unknown one, MIG.
            (
                "xid, no process",
                vec!["[ 1451.785035] NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.".into()],
            ),
            (
                "xid, unknown process",
                vec!["4,812,1451785035,c;NVRM: Xid (PCI:0000:3b:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.".into()],
            ),
            (
                "xid, MIG",
                vec!["NVRM: Xid (PCI:0000:3b:00 GPU-I:03 GPU-CI:01): 79, pid=1234, name=python3, GPU has fallen off the bus.".into()],
            ),
            // osHandleGpuLost alone (RmLogonRC=0, or 595's SEC_FAULT path after Xid 110).
            (
                "notice, kmsg",
                vec![
                    "4,813,1451785040,c;NVRM: GPU 0000:3b:00.0: GPU has fallen off the bus.".into(),
                    "4,814,1451785041,c;NVRM: GPU 0000:3b:00.0: GPU serial number is 1654922006536.".into(),
                ],
            ),
            // rm_is_supported_device at probe: one /dev/kmsg record, newlines escaped.
            (
                "probe, kmsg record",
                vec![format!("4,812,1843308145,c;{}", probe.join("\\x0a"))],
            ),
            ("probe, journald message", vec![probe.join("\n")]),
            ("probe, rsyslog", vec![format!("Jan 21 04:41:44 gpu7 kernel: {}", probe.join("#012"))]),
            // ... and as dmesg prints it: three lines, continuations indented.
            (
                "probe, dmesg",
                vec![
                    format!("[ 1843.308145] {}", probe[0]),
                    format!("               {}", probe[1]),
                    format!("               {}", probe[2]),
                ],
            ),
            ("probe, dmesg -t", probe.iter().map(|l| l.to_string()).collect()),
            (
                "probe, dmesg -T",
                vec![
                    format!("[Sun Feb 23 16:24:18 2025] {}", probe[0]),
                    format!("{:27}{}", "", probe[1]),
                    format!("{:27}{}", "", probe[2]),
                ],
            ),
            (
                "probe, syslog",
                probe
                    .iter()
                    .map(|l| format!("Jan 21 04:41:44 gpu7 kernel: {l}"))
                    .collect(),
            ),
        ];
        for (name, lines) in &shapes {
            let mut a = Assembler::new();
            // Chatter before and after, as in a real log.
            let mut ev: Vec<XidEvent> = ["[ 1.0] usb 1-1: new high-speed USB device"]
                .iter()
                .filter_map(|l| a.push(l))
                .collect();
            ev.extend(lines.iter().filter_map(|l| a.push(l)));
            ev.extend(a.push("NVRM: A GPU crash dump has been created. If possible, please run"));
            assert_eq!(ev.len(), 1, "{name}: {ev:?}");
            assert_eq!(
                (ev[0].xid, ev[0].pci.as_str()),
                (79, "0000:3b:00"),
                "{name}"
            );
        }
        // The Xid line and the notice after it are one fall.
        assert_eq!(
            scan("NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.\nNVRM: GPU 0000:3b:00.0: GPU has fallen off the bus.").len(),
            1
        );
        // A probe notice's last line far from its first names nobody.
        let mut far = vec![probe[0].to_string()];
        far.extend((0..PROBE_LINES).map(|_| "[ 2.0] usb 1-1: hello".to_string()));
        far.push(probe[2].into());
        assert!(scan(&far.join("\n")).is_empty());
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
