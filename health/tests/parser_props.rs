//! Fuzz-style properties of the kernel-log parser: no input panics it, and what it
//! returns is always well-formed.

use allot_health::kmsg::{parse_line, scan};
use allot_health::xid::Catalog;
use proptest::prelude::*;

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
