//! allotd's state file against damage: once allotd has run in a state dir, an
//! emptied, truncated or deleted `allotd.db` stops `allotd serve` with a non-zero
//! status and one line naming the file and the way back, rather than a start with no
//! state; the backup put back opens with everything. Nothing here skips.

mod support;

use allot_test_support::{checkpoint_sqlite, run_until_exit};
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
