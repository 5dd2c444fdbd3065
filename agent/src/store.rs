//! The agent's durable state: one SQLite file (`agent.db` in the state dir) with the
//! lease table, the event log and a few settings (drain, the lease counter).
//!
//! Why SQLite rather than a hand-rolled journal: every change is one transaction
//! that is on disk (WAL, `synchronous=FULL`) before the API answers, a torn write
//! is the database's problem rather than ours, operators can read it with
//! `sqlite3`, and allotd keeps its state the same way.

use crate::lease::LeaseRecord;
use rusqlite::{params, Connection, OptionalExtension};
use std::path::{Path, PathBuf};

pub use allot_common::sqlite::StoreError;

/// One line of the event log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    /// When, Unix milliseconds.
    pub at_ms: i64,
    /// `health`, `contract`, `lease`, `drain`, `config`.
    pub kind: String,
    /// The lease, if any.
    pub lease: String,
    /// The GPU, if any.
    pub gpu: String,
    /// What happened.
    pub message: String,
}

/// Events older than this are pruned when the agent starts.
const EVENT_RETENTION_MS: i64 = 30 * 86_400_000;

/// The open database.
pub struct Store {
    conn: Connection,
    path: PathBuf,
}

impl Store {
    /// Opens (creating if needed) `agent.db` under `dir`.
    pub fn open(dir: &Path) -> Result<Store, StoreError> {
        let (conn, path) = allot_common::sqlite::open(
            dir,
            "agent.db",
            "CREATE TABLE IF NOT EXISTS leases (id TEXT PRIMARY KEY, live INTEGER NOT NULL, body TEXT NOT NULL);
             CREATE TABLE IF NOT EXISTS events (seq INTEGER PRIMARY KEY AUTOINCREMENT, at_ms INTEGER NOT NULL,
                 kind TEXT NOT NULL, lease TEXT NOT NULL, gpu TEXT NOT NULL, message TEXT NOT NULL);
             CREATE INDEX IF NOT EXISTS events_at ON events(at_ms);
             CREATE TABLE IF NOT EXISTS settings (key TEXT PRIMARY KEY, value TEXT NOT NULL);",
        )?;
        Ok(Store { conn, path })
    }

    /// Writes the lease (insert or replace), durably.
    pub fn put_lease(&self, l: &LeaseRecord) -> Result<(), StoreError> {
        let body = serde_json::to_string(l)
            .map_err(|e| StoreError::new(&self.path, "encoding a lease", e))?;
        self.conn
            .execute(
                "INSERT INTO leases (id, live, body) VALUES (?1, ?2, ?3)
                 ON CONFLICT(id) DO UPDATE SET live = excluded.live, body = excluded.body",
                params![l.id, l.live(), body],
            )
            .map_err(|e| StoreError::new(&self.path, "writing a lease", e))?;
        Ok(())
    }

    /// Every lease, live ones and the last `ended` ended ones (newest first).
    pub fn leases(&self, ended: usize) -> Result<Vec<LeaseRecord>, StoreError> {
        let mut st = self
            .conn
            .prepare(
                "SELECT body FROM leases WHERE live = 1
                 UNION ALL
                 SELECT body FROM (SELECT body FROM leases WHERE live = 0 ORDER BY rowid DESC LIMIT ?1)",
            )
            .map_err(|e| StoreError::new(&self.path, "reading leases", e))?;
        let rows = st
            .query_map(params![ended as i64], |r| r.get::<_, String>(0))
            .map_err(|e| StoreError::new(&self.path, "reading leases", e))?;
        let mut out = Vec::new();
        for body in rows {
            let body = body.map_err(|e| StoreError::new(&self.path, "reading leases", e))?;
            match serde_json::from_str(&body) {
                Ok(l) => out.push(l),
                // One unreadable row must not hide the others.
                Err(e) => tracing::error!(error = %e, "skipping an unreadable lease row"),
            }
        }
        Ok(out)
    }

    /// Appends an event.
    pub fn event(&self, e: &Event) -> Result<(), StoreError> {
        self.conn
            .execute(
                "INSERT INTO events (at_ms, kind, lease, gpu, message) VALUES (?1, ?2, ?3, ?4, ?5)",
                params![e.at_ms, e.kind, e.lease, e.gpu, e.message],
            )
            .map_err(|e| StoreError::new(&self.path, "writing an event", e))?;
        Ok(())
    }

    /// Events at or after `since_ms`, oldest first (at most `limit`, the newest).
    pub fn events_since(&self, since_ms: i64, limit: usize) -> Result<Vec<Event>, StoreError> {
        let mut st = self
            .conn
            .prepare(
                "SELECT at_ms, kind, lease, gpu, message FROM
                   (SELECT seq, at_ms, kind, lease, gpu, message FROM events WHERE at_ms >= ?1 ORDER BY seq DESC LIMIT ?2)
                 ORDER BY seq",
            )
            .map_err(|e| StoreError::new(&self.path, "reading events", e))?;
        let rows = st
            .query_map(params![since_ms, limit as i64], |r| {
                Ok(Event {
                    at_ms: r.get(0)?,
                    kind: r.get(1)?,
                    lease: r.get(2)?,
                    gpu: r.get(3)?,
                    message: r.get(4)?,
                })
            })
            .map_err(|e| StoreError::new(&self.path, "reading events", e))?;
        rows.collect::<Result<_, _>>()
            .map_err(|e| StoreError::new(&self.path, "reading events", e))
    }

    /// Drops events older than the retention.
    pub fn prune_events(&self, now_ms: i64) -> Result<usize, StoreError> {
        self.conn
            .execute(
                "DELETE FROM events WHERE at_ms < ?1",
                params![now_ms - EVENT_RETENTION_MS],
            )
            .map_err(|e| StoreError::new(&self.path, "pruning events", e))
    }

    /// A setting.
    pub fn get(&self, key: &str) -> Result<Option<String>, StoreError> {
        self.conn
            .query_row(
                "SELECT value FROM settings WHERE key = ?1",
                params![key],
                |r| r.get(0),
            )
            .optional()
            .map_err(|e| StoreError::new(&self.path, "reading a setting", e))
    }

    /// Sets (or with `None` removes) a setting.
    pub fn set(&self, key: &str, value: Option<&str>) -> Result<(), StoreError> {
        match value {
            Some(v) => self.conn.execute(
                "INSERT INTO settings (key, value) VALUES (?1, ?2)
                 ON CONFLICT(key) DO UPDATE SET value = excluded.value",
                params![key, v],
            ),
            None => self
                .conn
                .execute("DELETE FROM settings WHERE key = ?1", params![key]),
        }
        .map_err(|e| StoreError::new(&self.path, "writing a setting", e))?;
        Ok(())
    }

    /// The next local lease number (durable, so ids are never reused).
    pub fn next_lease_number(&self) -> Result<u64, StoreError> {
        let n = self
            .get("lease_counter")?
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0)
            + 1;
        self.set("lease_counter", Some(&n.to_string()))?;
        Ok(n)
    }
}
