//! Opening a state database: one SQLite file in WAL mode with `synchronous=FULL`,
//! so an acknowledged write survives a crash or a power cut.

use rusqlite::Connection;
use std::path::{Path, PathBuf};

/// A state database that failed: which file, what was being done, why.
#[derive(Debug, thiserror::Error)]
#[error("{path}: {what}: {source}")]
pub struct StoreError {
    /// The database file (or the directory, when creating it failed).
    pub path: String,
    /// What was being done.
    pub what: &'static str,
    /// The underlying error.
    #[source]
    pub source: Box<dyn std::error::Error + Send + Sync>,
}

impl StoreError {
    /// An error of `what` on `path`.
    pub fn new(
        path: &Path,
        what: &'static str,
        e: impl std::error::Error + Send + Sync + 'static,
    ) -> StoreError {
        StoreError {
            path: path.display().to_string(),
            what,
            source: Box::new(e),
        }
    }
}

/// Opens (creating the directory and the file) `dir/file` and runs `schema`, a batch
/// of `CREATE … IF NOT EXISTS` statements; returns the connection and the file's path.
pub fn open(dir: &Path, file: &str, schema: &str) -> Result<(Connection, PathBuf), StoreError> {
    let path = dir.join(file);
    std::fs::create_dir_all(dir).map_err(|e| StoreError::new(dir, "creating the state dir", e))?;
    let conn = Connection::open(&path).map_err(|e| StoreError::new(&path, "opening", e))?;
    // busy_timeout: the CLI's read-only peeks (and backups) may hold a lock briefly.
    conn.execute_batch(
        "PRAGMA journal_mode=WAL; PRAGMA synchronous=FULL; PRAGMA busy_timeout=5000;",
    )
    .map_err(|e| StoreError::new(&path, "setting the journal mode", e))?;
    conn.execute_batch(schema)
        .map_err(|e| StoreError::new(&path, "creating tables", e))?;
    Ok((conn, path))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn opens_in_wal_mode_with_the_schema() {
        let dir = std::env::temp_dir().join(format!("allot-common-sqlite-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let (conn, path) = open(
            &dir.join("sub"),
            "x.db",
            "CREATE TABLE IF NOT EXISTS t (a INTEGER);",
        )
        .expect("opens");
        assert_eq!(path, dir.join("sub/x.db"));
        let mode: String = conn
            .query_row("PRAGMA journal_mode", [], |r| r.get(0))
            .expect("mode");
        assert_eq!(mode, "wal");
        let sync: i64 = conn
            .query_row("PRAGMA synchronous", [], |r| r.get(0))
            .expect("sync");
        assert_eq!(sync, 2, "FULL");
        conn.execute("INSERT INTO t VALUES (1)", [])
            .expect("table exists");
        let e = open(&dir.join("sub"), "y.db", "CREATE TABLE oops (").expect_err("bad schema");
        assert_eq!(e.what, "creating tables");
        assert!(e.to_string().contains("y.db"), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
