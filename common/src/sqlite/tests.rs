use super::*;

const V1: &str = "CREATE TABLE IF NOT EXISTS t (a INTEGER, b TEXT);";
const V2: &str = "CREATE TABLE IF NOT EXISTS u (c INTEGER);";

/// A fresh directory for one test.
fn dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("allot-common-sqlite-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

/// Makes the database with some rows (about 40 pages), closed so that the WAL is
/// checkpointed into the file.
fn made(d: &Path) -> PathBuf {
    let (conn, path) = open(d, "x.db", &[V1], None).expect("opens");
    for i in 0..40 {
        conn.execute(
            "INSERT INTO t VALUES (?1, ?2)",
            rusqlite::params![i, "x".repeat(3000)],
        )
        .expect("insert");
    }
    drop(conn);
    assert!(!wal_has_content(&path), "checkpointed on close");
    path
}

fn damage(e: &StoreError) -> Damage {
    match e.refusal() {
        Some(Refusal::Damaged { damage, .. }) => damage.clone(),
        other => panic!("not refused as damaged: {other:?}: {e}"),
    }
}

#[test]
fn a_first_start_makes_the_file_and_its_marker() {
    let d = dir("fresh");
    let (conn, path) = open(&d.join("sub"), "x.db", &[V1, V2], None).expect("opens");
    assert_eq!(path, d.join("sub/x.db"));
    let mode: String = conn
        .query_row("PRAGMA journal_mode", [], |r| r.get(0))
        .expect("mode");
    assert_eq!(mode, "wal");
    let sync: i64 = conn
        .query_row("PRAGMA synchronous", [], |r| r.get(0))
        .expect("sync");
    assert_eq!(sync, 2, "FULL");
    let v: i64 = conn
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .expect("version");
    assert_eq!(v, 2);
    conn.execute("INSERT INTO t VALUES (1, 'a')", [])
        .expect("table t");
    conn.execute("INSERT INTO u VALUES (1)", [])
        .expect("table u");
    let marker = read_marker(&marker_path(&d.join("sub"), "x.db"))
        .expect("readable")
        .expect("there");
    let own = read_meta(&conn).expect("meta").expect("has an id");
    assert_eq!(
        marker, own,
        "the marker names the database's id and creation"
    );
    assert_eq!(marker.id.len(), 32);
    assert!(marker.created.ends_with(" UTC"), "{}", marker.created);
    assert!(
        !d.join("sub/x.db.new").exists(),
        "made under a temporary name"
    );
    drop(conn);
    // Opened again: the same database, nothing refused.
    let (conn, _) = open(&d.join("sub"), "x.db", &[V1, V2], None).expect("reopens");
    let n: i64 = conn
        .query_row("SELECT count(*) FROM t", [], |r| r.get(0))
        .expect("rows");
    assert_eq!(n, 1);
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn only_the_missing_migrations_run_each_in_its_transaction() {
    let d = dir("migrate");
    // Not idempotent on purpose: running it twice would fail.
    let v1 = "CREATE TABLE t (a INTEGER);";
    drop(open(&d, "x.db", &[v1], None).expect("v1"));
    let (conn, _) = open(&d, "x.db", &[v1, V2], None).expect("v2 added");
    let v: i64 = conn
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .expect("version");
    assert_eq!(v, 2);
    drop(conn);
    // A failing migration leaves the file at the version before it.
    let e = open(&d, "x.db", &[v1, V2, "CREATE TABLE u (c INTEGER);"], None).expect_err("u exists");
    assert_eq!(e.what, "migrating the schema");
    assert!(e.to_string().contains("to schema version 3"), "{e}");
    let (conn, _) = open(&d, "x.db", &[v1, V2], None).expect("still v2");
    let v: i64 = conn
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .expect("version");
    assert_eq!(v, 2);
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn an_earlier_release_file_at_version_0_is_taken_as_is() {
    let d = dir("earlier");
    std::fs::create_dir_all(&d).expect("dir");
    // What 0.1 made: the tables, WAL, no version, no id, no marker.
    let old = Connection::open(d.join("x.db")).expect("old");
    old.execute_batch(
        "PRAGMA journal_mode=WAL; CREATE TABLE t (a INTEGER, b TEXT); INSERT INTO t VALUES (7, 'kept');",
    )
    .expect("old schema");
    drop(old);
    let (conn, _) = open(&d, "x.db", &[V1, V2], None).expect("migrates");
    let b: String = conn
        .query_row("SELECT b FROM t WHERE a = 7", [], |r| r.get(0))
        .expect("row");
    assert_eq!(b, "kept");
    let v: i64 = conn
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .expect("version");
    assert_eq!(v, 2);
    let own = read_meta(&conn).expect("meta").expect("given an id");
    let marker = read_marker(&marker_path(&d, "x.db"))
        .expect("ok")
        .expect("written");
    assert_eq!(own, marker);
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn a_missing_file_with_its_marker_is_refused_naming_file_and_recovery() {
    let d = dir("missing");
    let path = made(&d);
    std::fs::remove_file(&path).expect("rm");
    let e = open(
        &d,
        "x.db",
        &[V1],
        Some("run `allotd state import FILE` with an export"),
    )
    .expect_err("refused");
    assert_eq!(damage(&e), Damage::Missing);
    let text = e.to_string();
    let marker = marker_path(&d, "x.db");
    assert!(
        text.starts_with(&format!(
            "{}: damaged state: the file is missing, but {} says a database was created here at ",
            path.display(),
            marker.display()
        )),
        "{text}"
    );
    assert!(
        text.contains(&format!(
            "restore {} from a backup, or run `allotd state import FILE` with an export",
            path.display()
        )),
        "{text}"
    );
    assert!(
        text.ends_with(&format!(
            "to start deliberately with no state, remove {}",
            marker.display()
        )),
        "{text}"
    );
    assert!(!text.contains('\n'), "one line: {text}");
    assert!(!path.exists(), "nothing made");
    // Removing the marker is the deliberate fresh start.
    std::fs::remove_file(&marker).expect("rm marker");
    let (conn, _) = open(&d, "x.db", &[V1], None).expect("fresh");
    let n: i64 = conn
        .query_row("SELECT count(*) FROM t", [], |r| r.get(0))
        .expect("rows");
    assert_eq!(n, 0);
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn a_zero_length_file_is_refused_with_or_without_marker_and_wal() {
    let d = dir("empty");
    let path = made(&d);
    std::fs::write(&path, b"").expect("truncate");
    let e = open(&d, "x.db", &[V1], None).expect_err("refused");
    assert_eq!(damage(&e), Damage::Empty);
    assert!(
        e.to_string().contains(&format!(
            "move {} and its -wal and -shm files aside and remove {}",
            path.display(),
            marker_path(&d, "x.db").display()
        )),
        "{e}"
    );
    assert_eq!(
        std::fs::metadata(&path).expect("still there").len(),
        0,
        "untouched"
    );
    // A WAL beside it is still damage.
    std::fs::write(wal_path(&path), vec![1u8; 4096]).expect("wal");
    assert_eq!(
        damage(&open(&d, "x.db", &[V1], None).expect_err("refused")),
        Damage::Empty
    );
    // No marker (a file from before markers): still not taken for no state.
    std::fs::remove_file(marker_path(&d, "x.db")).expect("rm marker");
    let e = open(&d, "x.db", &[V1], None).expect_err("refused");
    assert_eq!(damage(&e), Damage::Empty);
    assert!(
        e.to_string().ends_with(&format!(
            "move {} and its -wal and -shm files aside",
            path.display()
        )),
        "{e}"
    );
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn a_wal_without_its_database_is_refused() {
    let d = dir("wal-only");
    std::fs::create_dir_all(&d).expect("dir");
    let path = d.join("x.db");
    std::fs::write(wal_path(&path), vec![1u8; 4096]).expect("wal");
    let e = open(&d, "x.db", &[V1], None).expect_err("refused");
    assert_eq!(damage(&e), Damage::WalWithoutDatabase);
    assert!(!path.exists());
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn a_file_truncated_halfway_is_refused() {
    let d = dir("truncated");
    let path = made(&d);
    let len = std::fs::metadata(&path).expect("meta").len();
    assert!(len >= 40 * 4096, "{len}");
    // Halfway, on a page boundary and off one.
    for cut in [len / 2 / 4096 * 4096, len / 2 + 123] {
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .expect("open");
        f.set_len(cut).expect("cut");
        drop(f);
        let e = open(&d, "x.db", &[V1], None).expect_err("refused");
        assert!(
            matches!(damage(&e), Damage::Truncated { len, .. } if len == cut),
            "{e}"
        );
        assert!(e.to_string().contains("the file is truncated ("), "{e}");
    }
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn garbage_and_damaged_pages_are_refused() {
    let d = dir("garbage");
    let path = made(&d);
    let good = std::fs::read(&path).expect("read");
    std::fs::write(&path, b"this is not a database\n".repeat(500)).expect("garbage");
    assert_eq!(
        damage(&open(&d, "x.db", &[V1], None).expect_err("refused")),
        Damage::NotSqlite
    );
    // A sound header over damaged pages: quick_check finds it.
    let mut bad = good.clone();
    for b in &mut bad[4096..4096 * 3] {
        *b = 0xA5;
    }
    std::fs::write(&path, &bad).expect("damaged");
    let e = open(&d, "x.db", &[V1], None).expect_err("refused");
    assert!(matches!(damage(&e), Damage::Corrupt(_)), "{e}");
    // Restored from a backup: opens.
    std::fs::write(&path, &good).expect("restored");
    open(&d, "x.db", &[V1], None).expect("the backup opens");
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn another_database_in_place_of_the_one_made_is_refused() {
    let d = dir("other");
    let path = made(&d);
    let o = dir("other-src");
    let other = made(&o);
    std::fs::copy(&other, &path).expect("swapped");
    let e = open(&d, "x.db", &[V1], None).expect_err("refused");
    assert!(
        matches!(damage(&e), Damage::OtherDatabase { id } if id.len() == 32),
        "{e}"
    );
    let marker = marker_path(&d, "x.db");
    assert!(
        e.to_string().ends_with(&format!(
            "to keep this file as the state, remove {} alone",
            marker.display()
        )),
        "{e}"
    );
    // Kept on purpose: the marker removed, the file is taken and known from now on.
    std::fs::remove_file(&marker).expect("rm marker");
    drop(open(&d, "x.db", &[V1], None).expect("taken"));
    drop(open(&d, "x.db", &[V1], None).expect("and again"));
    let _ = std::fs::remove_dir_all(&d);
    let _ = std::fs::remove_dir_all(&o);
}

#[test]
fn a_newer_release_file_is_refused() {
    let d = dir("newer");
    drop(open(&d, "x.db", &[V1, V2], None).expect("made by the newer release"));
    let e = open(&d, "x.db", &[V1], None).expect_err("refused");
    assert_eq!(
        e.refusal(),
        Some(&Refusal::Newer {
            file: d.join("x.db").display().to_string(),
            found: 2,
            known: 1
        })
    );
    assert_eq!(
        e.to_string(),
        format!(
            "{p}: made by a newer release: schema version 2, newer than the 1 this release knows; nothing was changed. Run the release that made it, or restore {p} from a backup this release made",
            p = d.join("x.db").display()
        )
    );
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn an_unreadable_marker_is_refused() {
    let d = dir("bad-marker");
    made(&d);
    std::fs::write(marker_path(&d, "x.db"), "junk\n").expect("junk");
    let e = open(&d, "x.db", &[V1], None).expect_err("refused");
    assert!(
        matches!(e.refusal(), Some(Refusal::BadMarker { .. })),
        "{e}"
    );
    assert!(
        e.to_string()
            .contains("x.db.created cannot be read (no id= line)"),
        "{e}"
    );
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn a_bad_schema_fails_naming_the_file() {
    let d = dir("bad-schema");
    let e = open(&d, "y.db", &["CREATE TABLE oops ("], None).expect_err("bad schema");
    assert_eq!(e.what, "migrating the schema");
    assert!(e.to_string().contains("y.db"), "{e}");
    assert!(!d.join("y.db").exists(), "nothing left in place");
    assert!(!marker_path(&d, "y.db").exists());
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn the_database_and_its_wal_are_for_their_owner_only() {
    use std::os::unix::fs::PermissionsExt;
    let mode = |p: &Path| std::fs::metadata(p).expect("there").permissions().mode() & 0o777;
    let d = dir("modes");
    let (conn, path) = open(&d, "x.db", &[V1], None).expect("opens");
    conn.execute("INSERT INTO t VALUES (1, 'secret')", [])
        .expect("insert");
    let wal = d.join("x.db-wal");
    assert_eq!(mode(&path), 0o600);
    assert_eq!(
        mode(&wal),
        0o600,
        "SQLite gives the WAL the database's mode"
    );
    drop(conn);
    // One an earlier release made readable by all is tightened when opened.
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).expect("chmod");
    let (_conn, path) = open(&d, "x.db", &[V1], None).expect("opens");
    assert_eq!(mode(&path), 0o600);
    let _ = std::fs::remove_dir_all(&d);
}
