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

/// A live lease's row that cannot be decoded: the agent does not start without it.
#[derive(Debug, thiserror::Error)]
#[error("lease {id:?} cannot be decoded ({error}); the agent will not start without it, since its GPUs would go to another lease while its workload may still run. Restore {path} from a backup or repair the row's JSON (sqlite3 {path} \"SELECT body FROM leases WHERE id = '{id}'\"); if its workload is gone, mark it ended: sqlite3 {path} \"UPDATE leases SET live = 0 WHERE id = '{id}'\"")]
pub struct UnreadableLease {
    /// The lease id (the row's key).
    pub id: String,
    /// The database.
    pub path: String,
    /// Why it cannot be decoded.
    pub error: String,
}

/// A setting that cannot be decoded.
#[derive(Debug, thiserror::Error)]
#[error("setting {key:?} cannot be decoded ({error}); the agent will not start without it. Restore {path} from a backup or repair it (sqlite3 {path} \"SELECT value FROM settings WHERE key = '{key}'\"), or remove it to forget it: sqlite3 {path} \"DELETE FROM settings WHERE key = '{key}'\"")]
pub struct UnreadableSetting {
    /// The key.
    pub key: String,
    /// The database.
    pub path: String,
    /// Why it cannot be decoded.
    pub error: String,
}

/// The schema, in order (index + 1 = the `user_version` it brings `agent.db` to);
/// only ever appended. 1 is the schema of 0.1, which had no version.
const MIGRATIONS: &[&str] = &[
    "CREATE TABLE IF NOT EXISTS leases (id TEXT PRIMARY KEY, live INTEGER NOT NULL, body TEXT NOT NULL);
     CREATE TABLE IF NOT EXISTS events (seq INTEGER PRIMARY KEY AUTOINCREMENT, at_ms INTEGER NOT NULL,
         kind TEXT NOT NULL, lease TEXT NOT NULL, gpu TEXT NOT NULL, message TEXT NOT NULL);
     CREATE INDEX IF NOT EXISTS events_at ON events(at_ms);
     CREATE TABLE IF NOT EXISTS settings (key TEXT PRIMARY KEY, value TEXT NOT NULL);",
];

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
        let (conn, path) = allot_common::sqlite::open(dir, "agent.db", MIGRATIONS, None)?;
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
    ///
    /// A live lease whose row cannot be decoded is an error naming it: forgetting it
    /// would hand its GPUs to the next lease while its workload still runs. An ended
    /// one is only history and is skipped, logged.
    pub fn leases(&self, ended: usize) -> Result<Vec<LeaseRecord>, StoreError> {
        let mut st = self
            .conn
            .prepare(
                "SELECT id, live, body FROM leases WHERE live = 1
                 UNION ALL
                 SELECT id, live, body FROM (SELECT id, live, body FROM leases WHERE live = 0 ORDER BY rowid DESC LIMIT ?1)",
            )
            .map_err(|e| StoreError::new(&self.path, "reading leases", e))?;
        let rows = st
            .query_map(params![ended as i64], |r| {
                Ok((
                    r.get::<_, String>(0)?,
                    r.get::<_, bool>(1)?,
                    r.get::<_, String>(2)?,
                ))
            })
            .map_err(|e| StoreError::new(&self.path, "reading leases", e))?;
        let mut out = Vec::new();
        for row in rows {
            let (id, live, body) =
                row.map_err(|e| StoreError::new(&self.path, "reading leases", e))?;
            match serde_json::from_str(&body) {
                Ok(l) => out.push(l),
                Err(e) if live => {
                    return Err(StoreError::new(
                        &self.path,
                        "reading a live lease",
                        UnreadableLease {
                            id,
                            path: self.path.display().to_string(),
                            error: e.to_string(),
                        },
                    ))
                }
                Err(e) => {
                    tracing::warn!(lease = %id, error = %e, "skipping an unreadable ended lease row")
                }
            }
        }
        Ok(out)
    }

    /// One lease by id, live or ended (`None` when no row has it, or an ended
    /// row cannot be decoded any more).
    pub fn lease(&self, id: &str) -> Result<Option<LeaseRecord>, StoreError> {
        let body: Option<String> = self
            .conn
            .query_row("SELECT body FROM leases WHERE id = ?1", params![id], |r| {
                r.get(0)
            })
            .optional()
            .map_err(|e| StoreError::new(&self.path, "reading a lease", e))?;
        Ok(body.and_then(|b| serde_json::from_str(&b).ok()))
    }

    /// A JSON setting (`None` when unset). One that cannot be decoded is an error
    /// naming the key: a forgotten drain would let work start on a drained host.
    pub fn get_json<T: serde::de::DeserializeOwned>(
        &self,
        key: &str,
    ) -> Result<Option<T>, StoreError> {
        let Some(v) = self.get(key)? else {
            return Ok(None);
        };
        serde_json::from_str(&v).map(Some).map_err(|error| {
            StoreError::new(
                &self.path,
                "reading a setting",
                UnreadableSetting {
                    key: key.to_string(),
                    path: self.path.display().to_string(),
                    error: error.to_string(),
                },
            )
        })
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

    /// The highest workload and lease ids of allotd's leases (`A-N`) this host holds,
    /// ended or not (0 when none).
    pub fn highest_allotd_ids(&self) -> Result<(u64, u64), StoreError> {
        self.conn
            .query_row(
                "SELECT COALESCE(MAX(CAST(json_extract(body, '$.workload_id') AS INTEGER)), 0),
                        COALESCE(MAX(CAST(substr(id, 3) AS INTEGER)), 0)
                 FROM leases WHERE id LIKE 'A-%'",
                [],
                |r| Ok((r.get::<_, i64>(0)?, r.get::<_, i64>(1)?)),
            )
            .map(|(w, l)| (w.max(0).unsigned_abs(), l.max(0).unsigned_abs()))
            .map_err(|e| StoreError::new(&self.path, "reading the highest lease ids", e))
    }

    /// The next local lease number (durable, so ids are never reused).
    pub fn next_lease_number(&self) -> Result<u64, StoreError> {
        let n = match self.get("lease_counter")? {
            None => 0,
            // A lost counter would give a new lease an old one's id.
            Some(v) => v.parse::<u64>().map_err(|e| {
                StoreError::new(
                    &self.path,
                    "reading a setting",
                    UnreadableSetting {
                        key: "lease_counter".into(),
                        path: self.path.display().to_string(),
                        error: e.to_string(),
                    },
                )
            })?,
        } + 1;
        self.set("lease_counter", Some(&n.to_string()))?;
        Ok(n)
    }
}
