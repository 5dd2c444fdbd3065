//! Fuzz-style properties of the kernel-log parser: no input panics it, and what it
//! returns is always well-formed.

use allot_health::kmsg::{parse_line, scan, Assembler, CONTEXT_LINES};
use allot_health::xid::Catalog;
use proptest::prelude::*;
use std::collections::BTreeMap;

/// A kernel-log line of the shapes the assembler cares about, about one of four GPUs.
#[derive(Debug, Clone)]
enum Shape {
    Announce(u8),
    /// `NVRM: GPU has fallen off the bus.`
    Bare,
    /// The notice with its own address.
    Addressed(u8),
    Xid(u8, u32),
    Chatter,
    Junk(String),
}

fn shape() -> impl Strategy<Value = Shape> {
    prop_oneof![
        (0u8..4).prop_map(Shape::Announce),
        Just(Shape::Bare),
        (0u8..4).prop_map(Shape::Addressed),
        (0u8..4, prop_oneof![Just(79u32), 1u32..200]).prop_map(|(g, x)| Shape::Xid(g, x)),
        Just(Shape::Chatter),
        "[ -~]{0,40}".prop_map(Shape::Junk),
    ]
}

fn gpu(g: u8) -> String {
    format!("0000:{:02x}:00", 0x10 + g)
}

fn text(s: &Shape, seq: usize) -> String {
    let pre = format!("4,{seq},{},-;", seq * 10);
    match s {
        Shape::Announce(g) => format!("{pre}NVRM: GPU at PCI:{}: GPU-2bb7e0d8-1e4e", gpu(*g)),
        Shape::Bare => format!("{pre}NVRM: GPU has fallen off the bus."),
        Shape::Addressed(g) => format!("{pre}NVRM: GPU {}.0: GPU has fallen off the bus.", gpu(*g)),
        Shape::Xid(g, x) => format!(
            "{pre}NVRM: Xid (PCI:{}): {x}, pid=1, name=a, detail",
            gpu(*g)
        ),
        Shape::Chatter => format!("{pre}usb 1-1: new high-speed USB device"),
        Shape::Junk(j) => j.clone(),
    }
}

fn well_formed(line: &str) {
    if let Some(e) = parse_line(line) {
        let p: Vec<&str> = e.pci.split(':').collect();
        assert_eq!(p.len(), 3, "{}", e.pci);
        assert!(p.iter().all(|s| s
            .bytes()
            .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())));
        assert_eq!((p[1].len(), p[2].len()), (2, 2));
        // Deciding never panics either, whatever the code and the text.
        let _ = Catalog::default().decide(e.xid, &e.message);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
        let text = String::from_utf8_lossy(&bytes);
        for line in text.lines() {
            well_formed(line);
        }
        let _ = scan(&text);
    }

    #[test]
    fn mangled_xid_lines_never_panic(
        pre in "[ -~]{0,20}",
        pci in "[0-9a-fA-FxzPCI:. -]{0,20}",
        mid in "[ -~]{0,6}",
        num in "[0-9]{0,12}",
        tail in "[ -~,'<>=]{0,60}",
        sx in any::<bool>(),
    ) {
        let tag = if sx { "SXid (" } else { "NVRM: Xid (" };
        well_formed(&format!("{pre}{tag}{pci}){mid}{num}{tail}"));
        well_formed(&format!("{pre}NVRM: GPU {pci}: GPU has fallen off the bus.{tail}"));
    }

    /// The assembler against a model of the module doc's rules: Xid lines pass as
    /// parsed; an address-less notice belongs to the GPU announced within the window;
    /// a notice for a GPU whose XID 79 was reported within the window is not counted.
    #[test]
    fn assembler_follows_the_rules(shapes in proptest::collection::vec(shape(), 0..60)) {
        let mut a = Assembler::new();
        let mut announced: Option<(String, u64)> = None;
        let mut fell: BTreeMap<String, u64> = BTreeMap::new();
        for (i, s) in shapes.iter().enumerate() {
            let n = i as u64 + 1;
            let line = text(s, i);
            let got = a.push(&line);
            well_formed(&line);
            if let (Some(e), false) = (&got, matches!(s, Shape::Junk(_))) {
                // Every event is timed by the line that completes it.
                prop_assert_eq!(e.seq, Some(i as u64));
            }
            let notice_for = match s {
                Shape::Announce(g) => {
                    announced = Some((gpu(*g), n));
                    prop_assert_eq!(got, None);
                    continue;
                }
                Shape::Xid(g, x) => {
                    prop_assert_eq!(&got, &parse_line(&line));
                    if *x == 79 {
                        fell.insert(gpu(*g), n);
                    }
                    continue;
                }
                // Junk may by chance look like anything; it only has to be harmless.
                Shape::Junk(_) => continue,
                Shape::Chatter => {
                    prop_assert_eq!(got, None);
                    continue;
                }
                Shape::Addressed(g) => Some(gpu(*g)),
                Shape::Bare => announced
                    .as_ref()
                    .filter(|(_, at)| n - at <= CONTEXT_LINES)
                    .map(|(p, _)| p.clone()),
            };
            let expect = notice_for.filter(|p| fell.get(p).is_none_or(|at| n - at > CONTEXT_LINES));
            prop_assert_eq!(got.as_ref().map(|e| (e.xid, e.pci.clone())), expect.clone().map(|p| (79, p)));
            if let Some(p) = expect {
                fell.insert(p, n);
            }
        }
    }

    #[test]
    fn well_formed_lines_round_trip(
        dom in 0u32..0xffff, bus in 0u32..0xff, dev in 0u32..0x1f, xid in 1u32..200,
        pid in proptest::option::of(1u32..100_000),
    ) {
        let pidpart = pid.map_or(String::new(), |p| format!(" pid={p}, name=job,"));
        let line = format!("[ 1.5] NVRM: Xid (PCI:{dom:04X}:{bus:02X}:{dev:02X}): {xid},{pidpart} something happened");
        let e = parse_line(&line).expect("parses");
        prop_assert_eq!(e.pci, format!("{dom:04x}:{bus:02x}:{dev:02x}"));
        prop_assert_eq!((e.xid, e.pid), (xid, pid));
        prop_assert_eq!(e.message, "something happened");
    }
}
