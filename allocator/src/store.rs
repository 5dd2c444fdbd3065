//! Durable state behind a trait (snapshots, the journal and the audit log), with
//! SQLite as its one backend.
//!
//! The last snapshot plus the journal after it *is* the state: a snapshot holds
//! the facts at one journal position, the journal every accepted input since (and
//! the decisions of each pass, not the pass). Taking a snapshot deletes the journal
//! below it in the same transaction. The audit log (every decision with its reason)
//! sits beside them for people.

use crate::history::{Query, RunRow};
use crate::state::Input;
use allot_fairshare::Time;
use rusqlite::{params, Connection, OptionalExtension};
use std::path::{Path, PathBuf};

pub use allot_common::sqlite::StoreError;

/// What allotd needs from storage.
pub trait Store: Send {
    /// Writes one commit durably, in one transaction (one fsync): the input, if the
    /// journal must keep it, and the audit lines (workload, lease, text) it produced.
    /// Returns the input's journal position, when there was one.
    fn commit(
        &mut self,
        at: Time,
        input: Option<&Input>,
        audit: &[(u64, u64, &str)],
        runs: &[&RunRow],
    ) -> Result<Option<u64>, StoreError>;
    /// Runs kept for history that match `q`, newest end first (running ones are in
    /// memory, not here); true when more matched than `q.limit`.
    fn runs(&self, q: &Query) -> Result<(Vec<RunRow>, bool), StoreError>;
    /// Forgets the runs that ended before `before` (`history_retention`); returns
    /// how many.
    fn prune_runs(&mut self, before: Time) -> Result<usize, StoreError>;
    /// The journal's last position (also once compaction emptied it; 0: none yet).
    fn last_seq(&self) -> Result<u64, StoreError>;
    /// The database's own id (`allot_meta`), made with it.
    fn db_id(&self) -> Result<String, StoreError>;
    /// The last snapshot, if any, and every journal entry after it, in order.
    fn load(&self) -> Result<Loaded, StoreError>;
    /// Writes a snapshot of the state as of the last journal entry, with the
    /// records of workloads retired from memory (id, JSON), and deletes the journal
    /// and snapshots below it, in one transaction; returns its position.
    fn snapshot(
        &mut self,
        at: Time,
        body: &str,
        retired: &[(u64, String)],
    ) -> Result<u64, StoreError>;
    /// A retired workload's record (JSON).
    fn retired(&self, id: u64) -> Result<Option<String>, StoreError>;
    /// The audit lines of one workload (0: all), oldest first, at most `limit`.
    fn audit_of(&self, workload: u64, limit: usize) -> Result<Vec<(Time, String)>, StoreError>;
}

/// What start-up reads.
#[derive(Debug, Default)]
pub struct Loaded {
    /// The last snapshot: the journal position it includes, when, and its JSON.
    pub snapshot: Option<(u64, Time, String)>,
    /// Journal entries after it: position, time, input.
    pub tail: Vec<(u64, Time, Input)>,
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
             CREATE INDEX IF NOT EXISTS audit_workload ON audit(workload);",
              // 2 (0.5): snapshots of the state, workloads retired from memory, and journal
              // entries an operator dropped (`allotd state drop`).
              "CREATE TABLE IF NOT EXISTS snapshot (seq INTEGER PRIMARY KEY, at INTEGER NOT NULL,
                 version INTEGER NOT NULL, body TEXT NOT NULL);
             CREATE TABLE IF NOT EXISTS retired (id INTEGER PRIMARY KEY, at INTEGER NOT NULL, body TEXT NOT NULL);
             CREATE TABLE IF NOT EXISTS dropped (seq INTEGER PRIMARY KEY, at INTEGER NOT NULL, input TEXT NOT NULL);",
              // 3 (0.7): every ended run, for `allot history` and `allot usage`.
              "CREATE TABLE IF NOT EXISTS runs (seq INTEGER PRIMARY KEY AUTOINCREMENT,
                 workload INTEGER NOT NULL, start INTEGER NOT NULL, end INTEGER NOT NULL,
                 user TEXT NOT NULL, project TEXT NOT NULL, state TEXT NOT NULL, body TEXT NOT NULL);
             CREATE INDEX IF NOT EXISTS runs_end ON runs(end);"],
            Some("run `allotd state import FILE` with an export"),
        )?;
        Ok(Sqlite { conn, path })
    }
}

/// A consistent copy of the state file at `db` into `to`, while allotd may serve it
/// (SQLite's `VACUUM INTO`: one read transaction); returns the journal position the
/// copy holds.
pub fn backup(db: &Path, to: &Path) -> Result<u64, StoreError> {
    let fail = |what| move |e| StoreError::new(db, what, e);
    must_exist(db)?;
    let conn = Connection::open(db).map_err(fail("opening for a backup"))?;
    conn.busy_timeout(std::time::Duration::from_secs(10))
        .map_err(fail("opening for a backup"))?;
    let target = to.to_str().ok_or_else(|| {
        StoreError::new(
            to,
            "writing a backup",
            std::io::Error::other("the path is not UTF-8; give another"),
        )
    })?;
    // The copy holds every token hash and workload: it is made 0600 before SQLite
    // writes a byte (VACUUM INTO takes an empty file), never chmodded after.
    private_empty_file(to)?;
    conn.execute("VACUUM INTO ?1", [target])
        .map_err(fail("writing a backup"))?;
    let copy = Connection::open(to).map_err(|e| StoreError::new(to, "reading the backup", e))?;
    copy.query_row(
        "SELECT COALESCE((SELECT seq FROM sqlite_sequence WHERE name = 'journal'), 0)",
        [],
        |r| r.get::<_, i64>(0),
    )
    .map(i64::unsigned_abs)
    .map_err(|e| StoreError::new(to, "reading the backup", e))
}

/// Creates `to` empty with mode 0600, or takes an empty one there and makes it 0600;
/// a file with something in it is refused rather than overwritten.
fn private_empty_file(to: &Path) -> Result<(), StoreError> {
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    let fail = |e| StoreError::new(to, "writing a backup", e);
    let f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .open(to)
        .map_err(fail)?;
    if f.metadata().map_err(fail)?.len() > 0 {
        return Err(fail(std::io::Error::other(
            "the file exists and is not empty; give a new path, or remove it first",
        )));
    }
    f.set_permissions(std::fs::Permissions::from_mode(0o600))
        .map_err(fail)
}

/// A backup of a state file that is not there is refused, not made empty.
fn must_exist(db: &Path) -> Result<(), StoreError> {
    if db.exists() {
        Ok(())
    } else {
        Err(StoreError::new(
            db,
            "backing up",
            std::io::Error::new(
                std::io::ErrorKind::NotFound,
                "no state file here; is [server] state_dir right?",
            ),
        ))
    }
}

fn secs(t: Time) -> i64 {
    i64::try_from(t).unwrap_or(i64::MAX)
}

impl Sqlite {
    /// Appends many entries in one transaction (the start-up bench writes its
    /// journal so).
    pub fn append(&mut self, entries: &[(Time, Input)]) -> Result<(), StoreError> {
        let path = self.path.clone();
        let fail = |e| StoreError::new(&path, "appending to the journal", e);
        let tx = self.conn.transaction().map_err(fail)?;
        for (at, input) in entries {
            let body = serde_json::to_string(input)
                .map_err(|e| StoreError::new(&path, "encoding an input", e))?;
            tx.execute(
                "INSERT INTO journal (at, input) VALUES (?1, ?2)",
                params![secs(*at), body],
            )
            .map_err(fail)?;
        }
        tx.commit().map_err(fail)
    }

    /// What SQLite's own check finds wrong with the file (empty when nothing).
    pub fn integrity(&self) -> Result<Vec<String>, StoreError> {
        let mut st = self
            .conn
            .prepare("PRAGMA integrity_check")
            .map_err(|e| StoreError::new(&self.path, "checking integrity", e))?;
        let rows = st
            .query_map([], |r| r.get::<_, String>(0))
            .map_err(|e| StoreError::new(&self.path, "checking integrity", e))?;
        let mut out = Vec::new();
        for r in rows {
            let line = r.map_err(|e| StoreError::new(&self.path, "checking integrity", e))?;
            if line != "ok" {
                out.push(format!("sqlite: {line}"));
            }
        }
        Ok(out)
    }

    /// Moves journal entry `seq` out of the journal into the `dropped` table (kept
    /// for the record): the way past an entry that does not read. Returns whether
    /// there was one.
    pub fn drop_entry(&mut self, seq: u64) -> Result<bool, StoreError> {
        let path = self.path.clone();
        let fail = |e| StoreError::new(&path, "dropping a journal entry", e);
        let tx = self.conn.transaction().map_err(fail)?;
        tx.execute(
            "INSERT OR REPLACE INTO dropped SELECT seq, at, input FROM journal WHERE seq = ?1",
            [secs(seq)],
        )
        .map_err(fail)?;
        let n = tx
            .execute("DELETE FROM journal WHERE seq = ?1", [secs(seq)])
            .map_err(fail)?;
        tx.commit().map_err(fail)?;
        Ok(n > 0)
    }

    /// Journal entries that do not decode: position and why.
    pub fn unreadable_entries(&self) -> Result<Vec<(u64, String)>, StoreError> {
        let mut st = self
            .conn
            .prepare("SELECT seq, input FROM journal ORDER BY seq")
            .map_err(|e| StoreError::new(&self.path, "reading the journal", e))?;
        let rows = st
            .query_map([], |r| Ok((r.get::<_, i64>(0)?, r.get::<_, String>(1)?)))
            .map_err(|e| StoreError::new(&self.path, "reading the journal", e))?;
        let mut out = Vec::new();
        for r in rows {
            let (seq, body) =
                r.map_err(|e| StoreError::new(&self.path, "reading the journal", e))?;
            if let Err(e) = Input::decode(&body) {
                out.push((seq.unsigned_abs(), e.to_string()));
            }
        }
        Ok(out)
    }
}

impl Store for Sqlite {
    fn commit(
        &mut self,
        at: Time,
        input: Option<&Input>,
        audit: &[(u64, u64, &str)],
        runs: &[&RunRow],
    ) -> Result<Option<u64>, StoreError> {
        if input.is_none() && audit.is_empty() && runs.is_empty() {
            return Ok(None);
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
        let mut seq = None;
        if let Some(body) = body {
            tx.execute(
                "INSERT INTO journal (at, input) VALUES (?1, ?2)",
                params![secs(at), body],
            )
            .map_err(fail("appending to the journal"))?;
            seq = Some(tx.last_insert_rowid().unsigned_abs());
        }
        for (workload, lease, text) in audit {
            tx.execute(
                "INSERT INTO audit (at, workload, lease, text) VALUES (?1, ?2, ?3, ?4)",
                params![secs(at), secs(*workload), secs(*lease), text],
            )
            .map_err(fail("writing the audit log"))?;
        }
        for r in runs {
            let body = serde_json::to_string(r).map_err(|e| StoreError {
                path: path.clone(),
                what: "encoding a run",
                source: Box::new(e),
            })?;
            tx.execute(
                "INSERT INTO runs (workload, start, end, user, project, state, body)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
                params![
                    secs(r.workload),
                    secs(r.start),
                    secs(r.end),
                    r.user,
                    r.project,
                    r.state,
                    body
                ],
            )
            .map_err(fail("writing a run for history"))?;
        }
        tx.commit().map_err(fail("committing"))?;
        Ok(seq)
    }

    fn runs(&self, q: &Query) -> Result<(Vec<RunRow>, bool), StoreError> {
        let fail = |e| StoreError::new(&self.path, "reading history", e);
        let mut st = self
            .conn
            .prepare(
                "SELECT body FROM runs WHERE end >= ?1 AND ((start > 0 AND start < ?2) OR (start = 0 AND end < ?2))
                 AND (?3 = '' OR user = ?3) AND (?4 = '' OR project = ?4) AND (?5 = '' OR state = ?5)
                 ORDER BY end DESC, seq DESC LIMIT ?6",
            )
            .map_err(fail)?;
        let until = if q.until == 0 {
            i64::MAX
        } else {
            secs(q.until)
        };
        let rows = st
            .query_map(
                params![
                    secs(q.since),
                    until,
                    q.user,
                    q.project,
                    q.state,
                    i64::try_from(q.limit).unwrap_or(i64::MAX).saturating_add(1)
                ],
                |r| r.get::<_, String>(0),
            )
            .map_err(fail)?;
        let mut out = Vec::new();
        for body in rows {
            let body = body.map_err(fail)?;
            match serde_json::from_str::<RunRow>(&body) {
                Ok(r) => out.push(r),
                // A row this release cannot read is left out, not fatal to the query.
                Err(e) => tracing::warn!(error = %e, "a history row does not read; left out"),
            }
        }
        let more = out.len() > q.limit;
        out.truncate(q.limit);
        Ok((out, more))
    }

    fn prune_runs(&mut self, before: Time) -> Result<usize, StoreError> {
        self.conn
            .execute(
                "DELETE FROM runs WHERE end > 0 AND end < ?1",
                [secs(before)],
            )
            .map_err(|e| StoreError::new(&self.path, "pruning history", e))
    }

    fn db_id(&self) -> Result<String, StoreError> {
        self.conn
            .query_row("SELECT value FROM allot_meta WHERE key = 'id'", [], |r| {
                r.get::<_, String>(0)
            })
            .map_err(|e| StoreError::new(&self.path, "reading the database's id", e))
    }

    fn last_seq(&self) -> Result<u64, StoreError> {
        self.conn
            .query_row(
                "SELECT COALESCE((SELECT seq FROM sqlite_sequence WHERE name = 'journal'), 0)",
                [],
                |r| r.get::<_, i64>(0),
            )
            .map(i64::unsigned_abs)
            .map_err(|e| StoreError::new(&self.path, "reading the journal position", e))
    }

    fn load(&self) -> Result<Loaded, StoreError> {
        let read = |e| StoreError::new(&self.path, "reading the last snapshot", e);
        let snapshot = self
            .conn
            .query_row(
                "SELECT seq, at, body FROM snapshot ORDER BY seq DESC LIMIT 1",
                [],
                |r| {
                    Ok((
                        r.get::<_, i64>(0)?.unsigned_abs(),
                        r.get::<_, i64>(1)?.unsigned_abs(),
                        r.get::<_, String>(2)?,
                    ))
                },
            )
            .optional()
            .map_err(read)?;
        let after = snapshot.as_ref().map_or(0, |s| secs(s.0));
        let mut st = self
            .conn
            .prepare("SELECT seq, at, input FROM journal WHERE seq > ?1 ORDER BY seq")
            .map_err(|e| StoreError::new(&self.path, "reading the journal", e))?;
        let rows = st
            .query_map([after], |r| {
                Ok((
                    r.get::<_, i64>(0)?,
                    r.get::<_, i64>(1)?,
                    r.get::<_, String>(2)?,
                ))
            })
            .map_err(|e| StoreError::new(&self.path, "reading the journal", e))?;
        let mut tail = Vec::new();
        for row in rows {
            let (seq, at, body) =
                row.map_err(|e| StoreError::new(&self.path, "reading the journal", e))?;
            let input = Input::decode(&body).map_err(|e| StoreError {
                path: self.path.display().to_string(),
                what: "decoding a journal entry",
                source: format!(
                    "entry {seq}: {e}; `allotd state check` lists every entry that does not read"
                )
                .into(),
            })?;
            tail.push((seq.unsigned_abs(), at.unsigned_abs(), input));
        }
        Ok(Loaded { snapshot, tail })
    }

    fn retired(&self, id: u64) -> Result<Option<String>, StoreError> {
        self.conn
            .query_row("SELECT body FROM retired WHERE id = ?1", [secs(id)], |r| {
                r.get::<_, String>(0)
            })
            .optional()
            .map_err(|e| StoreError::new(&self.path, "reading a retired workload", e))
    }

    fn snapshot(
        &mut self,
        at: Time,
        body: &str,
        retired: &[(u64, String)],
    ) -> Result<u64, StoreError> {
        let path = self.path.clone();
        let fail = |what: &'static str| {
            let path = path.clone();
            move |e: rusqlite::Error| StoreError::new(&path, what, e)
        };
        // Immediate: the position read below must still be the last when the
        // snapshot is written (a deferred read that turns into a write fails at
        // once, without waiting, if another writer came between).
        let tx = self
            .conn
            .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
            .map_err(fail("starting a transaction"))?;
        // The journal's last position, also once compaction left it empty.
        let seq: i64 = tx
            .query_row(
                "SELECT COALESCE((SELECT seq FROM sqlite_sequence WHERE name = 'journal'), 0)",
                [],
                |r| r.get(0),
            )
            .map_err(fail("reading the journal position"))?;
        for (id, rec) in retired {
            tx.execute(
                "INSERT OR REPLACE INTO retired (id, at, body) VALUES (?1, ?2, ?3)",
                params![secs(*id), secs(at), rec],
            )
            .map_err(fail("writing a retired workload"))?;
        }
        tx.execute(
            "INSERT OR REPLACE INTO snapshot (seq, at, version, body) VALUES (?1, ?2, ?3, ?4)",
            params![seq, secs(at), crate::state::SNAPSHOT_VERSION, body],
        )
        .map_err(fail("writing a snapshot"))?;
        tx.execute("DELETE FROM snapshot WHERE seq < ?1", [seq])
            .map_err(fail("dropping older snapshots"))?;
        tx.execute("DELETE FROM journal WHERE seq <= ?1", [seq])
            .map_err(fail("compacting the journal"))?;
        tx.commit().map_err(fail("committing a snapshot"))?;
        Ok(seq.unsigned_abs())
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
