//! Restarting the agent replays the kernel ring buffer: what was acted on stays acted
//! on, in the same boot; a new boot starts afresh.

use allot_health::kmsg::parse_line;
use allot_health::kmsg_reader::{KmsgReader, Seen};
use std::io::Write;

fn read_fresh(log: &std::path::Path, seen: &mut Seen, boot: &str) -> Vec<u32> {
    let mut r = KmsgReader::open(log).expect("opens");
    let mut out = Vec::new();
    while let Some(line) = r.next_line().expect("reads") {
        if let Some(e) = parse_line(&line) {
            if seen.fresh(boot, e.seq) {
                out.push(e.xid);
            }
        }
    }
    out
}

#[test]
fn history_is_not_acted_on_twice() {
    let dir = std::env::temp_dir().join(format!("allot-kmsg-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let log = dir.join("kmsg");
    let memo = dir.join("seen.json");
    std::fs::write(
        &log,
        "6,100,1000,-;usb 1-1: hello\n4,101,2000,-;NVRM: Xid (PCI:0000:3b:00): 48, pid=1, name=x, DBE\n4,102,3000,-;NVRM: Xid (PCI:0000:3b:00): 13, Graphics",
    )
    .expect("write");
    let mut seen = Seen::load(&memo).expect("fresh start");
    assert_eq!(read_fresh(&log, &mut seen, "boot-a"), vec![48, 13]);
    seen.save(&memo).expect("saves");
    // The agent restarts: same boot, the ring buffer replays; nothing is new.
    let mut seen = Seen::load(&memo).expect("loads");
    assert_eq!(seen.last_seq, Some(102));
    assert!(read_fresh(&log, &mut seen, "boot-a").is_empty());
    // New records arrive.
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .open(&log)
        .expect("append");
    writeln!(
        f,
        "\n4,103,4000,-;NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus."
    )
    .expect("append");
    assert_eq!(read_fresh(&log, &mut seen, "boot-a"), vec![79]);
    // After a reboot the sequence numbers start over: everything is this boot's.
    let mut fresh_boot = seen.clone();
    assert_eq!(
        read_fresh(&log, &mut fresh_boot, "boot-b"),
        vec![48, 13, 79]
    );
    // A corrupt memo file is named, not ignored.
    std::fs::write(&memo, "{not json").expect("write");
    let e = Seen::load(&memo).expect_err("corrupt");
    assert!(e.to_string().contains("seen.json"), "{e}");
    std::fs::remove_dir_all(&dir).ok();
}
