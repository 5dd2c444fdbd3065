//! allotd's state file against damage: once allotd has run in a state dir, an
//! emptied, truncated or deleted `allotd.db` stops `allotd serve` with a non-zero
//! status and one line naming the file and the way back, rather than a start with no
//! state; the backup put back opens with everything. Nothing here skips.

mod support;

use allot_test_support::{checkpoint_sqlite, run_until_exit};
use std::os::unix::fs::PermissionsExt;
use std::process::Command;
use support::Cluster;

const GROUPS: &str = "[[group]]\nname = \"demo-a\"\nweight = 1\n";

/// Runs allotd on `c`'s config until it exits (it must refuse to start);
/// its status and stderr.
fn serve_until_exit(c: &Cluster) -> (std::process::ExitStatus, String) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_allotd"));
    cmd.args(["serve", "--config"]).arg(&c.config);
    run_until_exit(
        "allotd to refuse and exit",
        &mut cmd,
        &c.dir.join("refused.log"),
    )
}

#[test]
fn allotd_refuses_an_empty_truncated_or_deleted_state_file_once_it_has_run() {
    // The state that matters here: the admin token the harness made (a journal entry).
    let mut c = Cluster::start("state-files", GROUPS, 0, 0);
    c.kill9_server();
    let state = c.dir.join("allotd");
    let db = state.join("allotd.db");
    let marker = state.join("allotd.db.created");
    assert!(marker.exists(), "the first start left the marker");
    checkpoint_sqlite(&db);
    let backup = std::fs::read(&db).expect("backup");
    assert!(backup.len() >= 2 * 4096, "{}", backup.len());

    let cases: [(&str, Option<Vec<u8>>, &str); 3] = [
        ("empty", Some(Vec::new()), "the file is empty (0 bytes)"),
        (
            "truncated",
            Some(backup[..backup.len() / 2].to_vec()),
            "the file is truncated (",
        ),
        ("deleted", None, "the file is missing"),
    ];
    for (case, content, says) in cases {
        match &content {
            Some(bytes) => std::fs::write(&db, bytes).expect("damage"),
            None => std::fs::remove_file(&db).expect("rm"),
        }
        let (status, stderr) = serve_until_exit(&c);
        assert!(!status.success(), "{case}: {status}: {stderr}");
        let line = stderr
            .lines()
            .find(|l| l.starts_with("allotd: "))
            .unwrap_or_else(|| panic!("{case}: no error line: {stderr}"));
        assert!(
            line.starts_with(&format!("allotd: {}: damaged state: {says}", db.display())),
            "{case}: {line}"
        );
        for needed in [
            format!(
                "but {} says a database was created here at ",
                marker.display()
            ),
            format!("restore {} from a backup", db.display()),
            "allotd state import FILE".to_string(),
            format!("remove {}", marker.display()),
        ] {
            assert!(line.contains(&needed), "{case}: {needed:?} not in {line}");
        }
        // Nothing was changed: the damage is still there for the operator to see.
        match &content {
            Some(bytes) => assert_eq!(std::fs::read(&db).expect("db").len(), bytes.len(), "{case}"),
            None => assert!(!db.exists(), "{case}: no new empty file"),
        }
        assert!(marker.exists(), "{case}");
    }

    // The way back: the backup, put in place, opens with the token (starting waits
    // until allotd answers it).
    std::fs::write(&db, &backup).expect("restored");
    c.start_server();
    assert!(c.allot(&["share", "--json"]).status.success());
}

/// `allotd ARGS --config CFG` (the state commands), its status and output.
fn state(c: &Cluster, args: &[&str]) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_allotd"))
        .args(args)
        .arg("--config")
        .arg(&c.config)
        .output()
        .expect("allotd runs");
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

const LONG: std::time::Duration = std::time::Duration::from_secs(60);

#[test]
fn a_lost_or_damaged_write_ahead_log_is_refused_and_a_loss_is_accepted_only_by_hand() {
    let mut c = Cluster::start("wal", GROUPS, 1, 1);
    // A clean stop first: what the cluster set up (the token, the node) is moved
    // into the file.
    c.term_server();
    c.start_server();
    c.wait_connected(1);
    // Three acknowledged submissions, then allotd killed before SQLite moved them
    // from its write-ahead log into the file.
    let ids: Vec<String> = (0..3)
        .map(|_| c.submit(&["--project", "demo-a", "--gpus", "1"], "sleep 600"))
        .collect();
    assert_eq!(ids, ["1", "2", "3"]);
    c.kill9_server();
    let state_dir = c.dir.join("allotd");
    let db = state_dir.join("allotd.db");
    let wal = state_dir.join("allotd.db-wal");
    let kept: Vec<(std::path::PathBuf, Vec<u8>)> = ["allotd.db", "allotd.db-wal", "allotd.db-shm"]
        .iter()
        .map(|f| state_dir.join(f))
        .filter(|p| p.exists())
        .map(|p| {
            let b = std::fs::read(&p).expect("read");
            (p, b)
        })
        .collect();
    let wal_bytes = std::fs::read(&wal).expect("the write-ahead log");
    assert!(wal_bytes.len() > 32 * 1024, "{}", wal_bytes.len());
    let mut garbage = wal_bytes.clone();
    for b in &mut garbage[4096..] {
        *b ^= 0x5a;
    }
    let cases: [(&str, Option<Vec<u8>>); 4] = [
        ("deleted", None),
        ("emptied", Some(Vec::new())),
        ("cut short", Some(wal_bytes[..wal_bytes.len() / 3].to_vec())),
        ("garbage", Some(garbage)),
    ];
    for (case, content) in cases {
        for (p, b) in &kept {
            std::fs::write(p, b).expect("put back");
        }
        match &content {
            Some(bytes) => std::fs::write(&wal, bytes).expect("damage"),
            None => std::fs::remove_file(&wal).expect("rm"),
        }
        let _ = std::fs::remove_file(state_dir.join("allotd.db-shm"));
        let (status, stderr) = serve_until_exit(&c);
        assert!(!status.success(), "{case}: {status}: {stderr}");
        for words in [
            format!("{} holds the journal up to entry", db.display()),
            "but allotd acknowledged entry".to_string(),
            format!("{}-wal was lost", db.display()),
            "allotd state restore FILE".to_string(),
            "allotd state accept-loss".to_string(),
        ] {
            assert!(stderr.contains(&words), "{case}: {words:?} not in {stderr}");
        }
        // `state check` says so too, rather than "state ok".
        let (ok, out) = state(&c, &["state", "check"]);
        assert!(!ok && out.contains("acknowledged entry"), "{case}: {out}");
    }
    // The operator accepts the loss: allotd goes on, and the lost ids are not given
    // again (the three submissions were 1 to 3).
    let (ok, out) = state(&c, &["state", "accept-loss"]);
    assert!(ok && out.contains("accepted: the "), "{out}");
    c.start_server();
    c.wait_connected(1);
    let next = c.submit(&["--project", "demo-a", "--gpus", "1"], "true");
    assert_eq!(next, "4", "ids continue above the lost ones");
    let history = c.status(&next)["history"].to_string();
    assert!(
        history.contains("submitted") || !history.is_empty(),
        "{history}"
    );
}

#[test]
fn a_restored_backup_never_gives_an_id_twice() {
    let mut c = Cluster::start("restore", GROUPS, 1, 1);
    let first = c.submit(&["--project", "demo-a", "--gpus", "1"], "echo one");
    c.wait_state(&first, "completed", LONG);
    // Online: allotd serves meanwhile.
    let backup = c.dir.join("backup.db");
    let (ok, out) = state(&c, &["state", "backup", &backup.display().to_string()]);
    assert!(ok, "{out}");
    // It holds every token hash: its owner's alone from the first byte, and never
    // written over a file that holds something.
    let mode = std::fs::metadata(&backup)
        .expect("backup")
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600, "backup mode {mode:o}");
    let (ok, out) = state(&c, &["state", "backup", &backup.display().to_string()]);
    assert!(!ok && out.contains("exists"), "{out}");
    let second = c.submit(&["--project", "demo-a", "--gpus", "1"], "echo two");
    c.wait_state(&second, "completed", LONG);
    assert_eq!(second, "2");
    // Back to the backup: workload 2 and lease A-2 were given since, and the agent
    // holds A-2 as ended.
    c.term_server();
    let (ok, out) = state(&c, &["state", "restore", &backup.display().to_string()]);
    assert!(ok, "{out}");
    assert!(
        out.contains("new ids continue at workload 3 and lease A-3"),
        "{out}"
    );
    c.start_server();
    c.wait_connected(1);
    let third = c.submit(&["--project", "demo-a", "--gpus", "1"], "echo three");
    assert_eq!(third, "3", "workload 2 is never given again");
    let w = c.wait_state(&third, "completed", LONG);
    assert_eq!(w["lease_ids"][0], "A-3", "{w}");
    // The output is the new run's, not an old lease's end taken for it.
    let out = c.allot(&["logs", &third]);
    assert_eq!(String::from_utf8_lossy(&out.stdout), "three\n");
    // Without the marker (a backup restored on another machine): the host's ids.
    c.term_server();
    std::fs::remove_file(c.dir.join("allotd/allotd.db.acked")).expect("marker gone");
    let (ok, out) = state(&c, &["state", "restore", &backup.display().to_string()]);
    assert!(ok, "{out}");
    c.start_server();
    c.wait_connected(1);
    let fourth = c.submit(&["--project", "demo-a", "--gpus", "1"], "echo four");
    assert_eq!(fourth, "4", "ids continue above those the host holds");
    let w = c.wait_state(&fourth, "completed", LONG);
    assert_eq!(w["lease_ids"][0], "A-4", "{w}");
}

#[test]
fn a_damaged_acknowledgement_record_is_refused_until_the_loss_is_accepted() {
    // Garbage in allotd.db.acked must not switch the lost-log check off in silence.
    let mut c = Cluster::start("acked-damaged", GROUPS, 1, 1);
    c.term_server();
    let file = c.dir.join("allotd/allotd.db.acked");
    std::fs::write(&file, [0x5au8; 128]).expect("garble");
    let (status, stderr) = serve_until_exit(&c);
    assert!(!status.success(), "{status}: {stderr}");
    for words in [
        format!("{} is damaged", file.display()),
        "allotd state accept-loss".to_string(),
    ] {
        assert!(stderr.contains(&words), "{words:?} not in {stderr}");
    }
    let (ok, out) = state(&c, &["state", "accept-loss"]);
    assert!(ok && out.contains("was damaged; it is made anew"), "{out}");
    c.start_server();
    c.wait_connected(1);
    let w = c.submit(&["--project", "demo-a", "--gpus", "1"], "true");
    assert_eq!(w, "1", "{w}");
    c.wait_state(&w, "completed", LONG);
}
