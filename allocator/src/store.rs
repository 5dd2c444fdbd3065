//! Durable state behind a trait (the journal and the audit log), with SQLite as its one backend.
//!
//! The journal of accepted inputs *is* the state: replaying it through the
//! deterministic core rebuilds workloads, leases and the usage window exactly. The
//! audit log (every decision with its reason) sits beside it for people.

use crate::state::Input;
use allot_fairshare::Time;
use rusqlite::{params, Connection};
use std::path::{Path, PathBuf};

pub use allot_common::sqlite::StoreError;

/// What allotd needs from storage.
pub trait Store: Send {
    /// Writes one commit durably, in one transaction (one fsync): the input, if the
    /// journal must keep it, and the audit lines (workload, lease, text) it produced.
    fn commit(
        &mut self,
        at: Time,
        input: Option<&Input>,
        audit: &[(u64, u64, &str)],
    ) -> Result<(), StoreError>;
    /// Every input in order.
    fn replay(&self) -> Result<Vec<(u64, Time, Input)>, StoreError>;
    /// The audit lines of one workload (0: all), oldest first, at most `limit`.
    fn audit_of(&self, workload: u64, limit: usize) -> Result<Vec<(Time, String)>, StoreError>;
}

/// SQLite in WAL mode, `synchronous=FULL`: one file, `allotd.db`.
pub struct Sqlite {
    conn: Connection,
    path: PathBuf,
}

impl Sqlite {
    /// Opens (creating) `allotd.db` in `dir`.
    pub fn open(dir: &Path) -> Result<Sqlite, StoreError> {
        let (conn, path) = allot_common::sqlite::open(
            dir,
            "allotd.db",
            // Migrations, in order (index + 1 = schema version); only ever appended.
            &["CREATE TABLE IF NOT EXISTS journal (seq INTEGER PRIMARY KEY AUTOINCREMENT, at INTEGER NOT NULL, input TEXT NOT NULL);
             CREATE TABLE IF NOT EXISTS audit (seq INTEGER PRIMARY KEY AUTOINCREMENT, at INTEGER NOT NULL,
                 workload INTEGER NOT NULL, lease INTEGER NOT NULL, text TEXT NOT NULL);
             CREATE INDEX IF NOT EXISTS audit_workload ON audit(workload);"],
            Some("run `allotd state import FILE` with an export"),
        )?;
        Ok(Sqlite { conn, path })
    }
}

fn secs(t: Time) -> i64 {
    i64::try_from(t).unwrap_or(i64::MAX)
}

impl Store for Sqlite {
    fn commit(
        &mut self,
        at: Time,
        input: Option<&Input>,
        audit: &[(u64, u64, &str)],
    ) -> Result<(), StoreError> {
        if input.is_none() && audit.is_empty() {
            return Ok(());
        }
        let body = input
            .map(serde_json::to_string)
            .transpose()
            .map_err(|e| StoreError::new(&self.path, "encoding an input", e))?;
        let path = self.path.display().to_string();
        let fail = |what: &'static str| {
            let path = path.clone();
            move |e: rusqlite::Error| StoreError {
                path,
                what,
                source: Box::new(e),
            }
        };
        let tx = self
            .conn
            .transaction()
            .map_err(fail("starting a transaction"))?;
        if let Some(body) = body {
            tx.execute(
                "INSERT INTO journal (at, input) VALUES (?1, ?2)",
                params![secs(at), body],
            )
            .map_err(fail("appending to the journal"))?;
        }
        for (workload, lease, text) in audit {
            tx.execute(
                "INSERT INTO audit (at, workload, lease, text) VALUES (?1, ?2, ?3, ?4)",
                params![secs(at), secs(*workload), secs(*lease), text],
            )
            .map_err(fail("writing the audit log"))?;
        }
        tx.commit().map_err(fail("committing"))
    }

    fn replay(&self) -> Result<Vec<(u64, Time, Input)>, StoreError> {
        let mut st = self
            .conn
            .prepare("SELECT seq, at, input FROM journal ORDER BY seq")
            .map_err(|e| StoreError::new(&self.path, "reading the journal", e))?;
        let rows = st
            .query_map([], |r| {
                Ok((
                    r.get::<_, i64>(0)?,
                    r.get::<_, i64>(1)?,
                    r.get::<_, String>(2)?,
                ))
            })
            .map_err(|e| StoreError::new(&self.path, "reading the journal", e))?;
        let mut out = Vec::new();
        for row in rows {
            let (seq, at, body) =
                row.map_err(|e| StoreError::new(&self.path, "reading the journal", e))?;
            let input = Input::decode(&body)
                .map_err(|e| StoreError::new(&self.path, "decoding a journal entry", e))?;
            out.push((seq.unsigned_abs(), at.unsigned_abs(), input));
        }
        Ok(out)
    }

    fn audit_of(&self, workload: u64, limit: usize) -> Result<Vec<(Time, String)>, StoreError> {
        let mut st = self
            .conn
            .prepare(
                "SELECT at, text FROM (SELECT seq, at, text FROM audit WHERE ?1 = 0 OR workload = ?1
                 ORDER BY seq DESC LIMIT ?2) ORDER BY seq",
            )
            .map_err(|e| StoreError::new(&self.path, "reading the audit log", e))?;
        let rows = st
            .query_map(params![secs(workload), limit as i64], |r| {
                Ok((r.get::<_, i64>(0)?, r.get::<_, String>(1)?))
            })
            .map_err(|e| StoreError::new(&self.path, "reading the audit log", e))?;
        let mut out = Vec::new();
        for r in rows {
            let (at, text) =
                r.map_err(|e| StoreError::new(&self.path, "reading the audit log", e))?;
            out.push((at.unsigned_abs(), text));
        }
        Ok(out)
    }
}
