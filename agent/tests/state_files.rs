//! The agent's state file against damage: once the agent has run in a state dir, an
//! emptied (a write-ahead log beside it or not), truncated or deleted `agent.db`
//! stops `allot-agent` with a non-zero status and one line naming the file and the
//! way back; the agent never serves with its live leases forgotten. The backup put
//! back re-adopts the lease whose workload ran on meanwhile. Nothing here skips.

mod support;

use allot_test_support::{checkpoint_sqlite, run_until_exit};
use std::process::Command;
use support::TestAgent;

/// Runs the agent on `a`'s config until it exits (it must refuse to start);
/// its status and stderr.
fn agent_until_exit(a: &TestAgent) -> (std::process::ExitStatus, String) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_allot-agent"));
    cmd.args(["--config"]).arg(&a.config);
    run_until_exit(
        "the agent to refuse and exit",
        &mut cmd,
        &a.dir.join("refused.log"),
    )
}

#[test]
fn the_agent_refuses_an_empty_truncated_or_deleted_state_file_and_keeps_its_lease() {
    let mut a = TestAgent::start("state-files", "");
    let l = a.lease_start(&["--gpus", "2"], "sleep 600");
    let id = l["id"].as_str().expect("id").to_string();
    a.kill9();
    let state = a.dir.join("state");
    let db = state.join("agent.db");
    let wal = state.join("agent.db-wal");
    let marker = state.join("agent.db.created");
    assert!(marker.exists(), "the first start left the marker");
    checkpoint_sqlite(&db);
    let backup = std::fs::read(&db).expect("backup");
    assert!(backup.len() >= 2 * 4096, "{}", backup.len());

    let cases: [(&str, Option<Vec<u8>>, bool, &str); 4] = [
        (
            "empty",
            Some(Vec::new()),
            false,
            "the file is empty (0 bytes)",
        ),
        (
            "empty beside its log",
            Some(Vec::new()),
            true,
            "the file is empty (0 bytes)",
        ),
        (
            "truncated",
            Some(backup[..backup.len() / 2].to_vec()),
            false,
            "the file is truncated (",
        ),
        ("deleted", None, false, "the file is missing"),
    ];
    for (case, content, with_wal, says) in cases {
        match &content {
            Some(bytes) => std::fs::write(&db, bytes).expect("damage"),
            None => std::fs::remove_file(&db).expect("rm"),
        }
        if with_wal {
            std::fs::write(&wal, vec![7u8; 8192]).expect("wal");
        } else {
            let _ = std::fs::remove_file(&wal);
        }
        let _ = std::fs::remove_file(&a.socket);
        let (status, stderr) = agent_until_exit(&a);
        assert!(!status.success(), "{case}: {status}: {stderr}");
        let line = stderr
            .lines()
            .find(|l| l.starts_with("allot-agent: "))
            .unwrap_or_else(|| panic!("{case}: no error line: {stderr}"));
        assert!(
            line.starts_with(&format!(
                "allot-agent: {}: damaged state: {says}",
                db.display()
            )),
            "{case}: {line}"
        );
        for needed in [
            format!(
                "but {} says a database was created here at ",
                marker.display()
            ),
            format!("restore {} from a backup", db.display()),
            format!("remove {}", marker.display()),
        ] {
            assert!(line.contains(&needed), "{case}: {needed:?} not in {line}");
        }
        assert!(!a.socket.exists(), "{case}: never served");
        match &content {
            Some(bytes) => assert_eq!(std::fs::read(&db).expect("db").len(), bytes.len(), "{case}"),
            None => assert!(!db.exists(), "{case}: no new empty file"),
        }
    }

    // The way back: the backup, put in place, re-adopts the lease that ran on.
    let _ = std::fs::remove_file(&wal);
    std::fs::write(&db, &backup).expect("restored");
    a.launch();
    let back = a.lease(&id);
    assert_eq!(back["state"], "running", "{back}");
    assert_eq!(back["gpus"], l["gpus"], "{back}");
}
