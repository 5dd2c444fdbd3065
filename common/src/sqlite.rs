//! Opening a state database: one SQLite file in WAL mode with `synchronous=FULL`,
//! so an acknowledged write survives a crash or a power cut.
//!
//! Two promises beyond that:
//!
//! - **A schema version with ordered migrations.** The caller passes its migrations
//!   in order; migration `i` (from 0) brings the file to version `i + 1`, kept in
//!   SQLite's `PRAGMA user_version`. The missing ones run on open, one transaction
//!   each; a file whose version is newer than the binary knows is refused. A file made
//!   before versions were kept reads as version 0, so migration 1 must accept the
//!   tables an earlier release made (`CREATE TABLE IF NOT EXISTS`).
//! - **Damaged state is never taken for no state.** When a database is made in a
//!   directory, a marker beside it (`FILE.created`, see [`marker_path`]) records its
//!   id and creation time (the id is in the database too, table `allot_meta`). While
//!   the marker exists, a missing, empty, truncated, foreign or damaged file is
//!   refused ([`Refusal`]) with the file named and the way back; a damaged file is
//!   refused even without a marker. A first start (no marker, no file) makes both.
//!   A new file is made whole under a temporary name and renamed into place, so the
//!   file this module leaves is never half-made.

use rusqlite::{Connection, ErrorCode, OpenFlags, OptionalExtension};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

/// A state database that failed: which file, what was being done, why, in one line
/// (`PATH: WHAT: WHY`). The cause is in the text and not also a
/// [`source`](std::error::Error::source), so that `anyhow`'s `{:#}` prints it once.
#[derive(Debug)]
pub struct StoreError {
    /// The database file (or the directory, when creating it failed).
    pub path: String,
    /// What was being done.
    pub what: &'static str,
    /// The underlying error.
    pub source: Box<dyn std::error::Error + Send + Sync>,
}

impl std::fmt::Display for StoreError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}: {}", self.path, self.what, self.source)
    }
}

impl std::error::Error for StoreError {}

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

    /// Why the file was refused, when it was (nothing was changed then).
    pub fn refusal(&self) -> Option<&Refusal> {
        self.source.downcast_ref::<Refusal>()
    }
}

/// What is wrong with a state file that is refused as damaged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Damage {
    /// The file is gone.
    Missing,
    /// The file is zero-length.
    Empty,
    /// A write-ahead log (`FILE-wal`) is there but its database is not.
    WalWithoutDatabase,
    /// The file does not start with SQLite's header.
    NotSqlite,
    /// The file is shorter than its own header says.
    Truncated {
        /// Its length in bytes.
        len: u64,
        /// What its header says, in bytes.
        expected: u64,
    },
    /// SQLite finds it damaged (`PRAGMA quick_check`, or an error opening it).
    Corrupt(String),
    /// A sound database, but not the one the marker names.
    OtherDatabase {
        /// Its id (empty: none, e.g. made by an earlier release).
        id: String,
    },
}

impl std::fmt::Display for Damage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Damage::Missing => write!(f, "the file is missing"),
            Damage::Empty => write!(f, "the file is empty (0 bytes)"),
            Damage::WalWithoutDatabase => {
                write!(
                    f,
                    "the file is missing but its write-ahead log (-wal) is there"
                )
            }
            Damage::NotSqlite => write!(f, "the file is not a SQLite database"),
            Damage::Truncated { len, expected } => write!(
                f,
                "the file is truncated ({len} bytes where its header says {expected})"
            ),
            Damage::Corrupt(why) => write!(f, "the file is damaged ({why})"),
            Damage::OtherDatabase { id } if id.is_empty() => {
                write!(
                    f,
                    "the file is a database without an id, not the one made here"
                )
            }
            Damage::OtherDatabase { id } => {
                write!(
                    f,
                    "the file is another database (id {id}), not the one made here"
                )
            }
        }
    }
}

/// Why a state database was refused. Nothing was changed; the text names the file
/// and what the operator can do.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// Missing or damaged where a database was made (or damaged where none was
    /// recorded): never taken for no state.
    #[error("{damage}{since}; nothing was changed. To recover, restore {file} from a backup{also}; to start deliberately with no state, {fresh}")]
    Damaged {
        /// What is wrong.
        damage: Damage,
        /// The database file.
        file: String,
        /// What the marker says (`, but M says a database was created here at T (id I)`), or empty.
        since: String,
        /// Another way back beside a backup (`, or …`), or empty.
        also: String,
        /// How to start with no state on purpose.
        fresh: String,
    },
    /// The file's schema is newer than this binary knows.
    #[error("schema version {found}, newer than the {known} this release knows; nothing was changed. Run the release that made it, or restore {file} from a backup this release made")]
    Newer {
        /// The database file.
        file: String,
        /// Its `user_version`.
        found: u32,
        /// The newest this binary knows.
        known: u32,
    },
    /// The marker cannot be read.
    #[error("{marker} cannot be read ({why}); nothing was changed. It records that {file} was created here: restore it from a backup, or remove it if {file} is the state to keep")]
    BadMarker {
        /// The marker file.
        marker: String,
        /// The database file.
        file: String,
        /// Why.
        why: String,
    },
}

/// What the marker records about the database made in a directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Marker {
    /// The id, also kept in the database (`allot_meta`, key `id`).
    pub id: String,
    /// When it was created, Unix milliseconds.
    pub created_ms: i64,
    /// The same, readable (UTC).
    pub created: String,
}

/// The marker kept beside `dir/file` once a database was made there: `dir/file.created`.
pub fn marker_path(dir: &Path, file: &str) -> PathBuf {
    dir.join(format!("{file}.created"))
}

/// A migration failed.
#[derive(Debug, thiserror::Error)]
#[error("to schema version {version}: {error}")]
struct MigrationError {
    version: usize,
    error: rusqlite::Error,
}

/// The marker could not be written.
#[derive(Debug, thiserror::Error)]
#[error("{marker}: {error}")]
struct MarkerError {
    marker: String,
    error: std::io::Error,
}

/// Opens `dir/file` (creating the directory, and the file with its marker on a first
/// start), checks that it is the database made there and sound, and brings its schema
/// up to date: `migrations[i]` is a SQL batch that takes the file from version `i` to
/// `i + 1` (no `BEGIN`/`COMMIT` in it: each runs in its own transaction). Migrations
/// are only ever appended; an earlier release's file is version 0, so the first
/// migration must take the tables it already has (`CREATE TABLE IF NOT EXISTS`).
///
/// `also` is a way back beside a backup that a refusal names (allotd: an import of
/// an export), or `None`. Returns the connection and the file's path.
pub fn open(
    dir: &Path,
    file: &str,
    migrations: &[&str],
    also: Option<&str>,
) -> Result<(Connection, PathBuf), StoreError> {
    let path = dir.join(file);
    std::fs::create_dir_all(dir).map_err(|e| StoreError::new(dir, "creating the state dir", e))?;
    let marker_file = marker_path(dir, file);
    let marker = read_marker(&marker_file).map_err(|why| {
        StoreError::new(
            &path,
            "unreadable marker",
            Refusal::BadMarker {
                marker: marker_file.display().to_string(),
                file: path.display().to_string(),
                why,
            },
        )
    })?;
    let refuse = |damage: Damage| -> StoreError {
        let file_there = !matches!(damage, Damage::Missing | Damage::WalWithoutDatabase);
        let keep = match &damage {
            Damage::OtherDatabase { .. } => format!(
                "; to keep this file as the state, remove {} alone",
                marker_file.display()
            ),
            _ => String::new(),
        };
        let fresh = match (&marker, file_there) {
            (Some(_), true) => format!(
                "move {} and its -wal and -shm files aside and remove {}",
                path.display(),
                marker_file.display()
            ),
            (Some(_), false) => format!(
                "remove {}{}",
                marker_file.display(),
                if damage == Damage::WalWithoutDatabase {
                    format!(" and move {}-wal aside", path.display())
                } else {
                    String::new()
                }
            ),
            (None, true) => format!("move {} and its -wal and -shm files aside", path.display()),
            (None, false) => format!("move {}-wal aside", path.display()),
        } + &keep;
        let since = marker
            .as_ref()
            .map(|m| {
                format!(
                    ", but {} says a database was created here at {} (id {})",
                    marker_file.display(),
                    m.created,
                    m.id
                )
            })
            .unwrap_or_default();
        StoreError::new(
            &path,
            "damaged state",
            Refusal::Damaged {
                damage,
                file: path.display().to_string(),
                since,
                also: also.map(|a| format!(", or {a}")).unwrap_or_default(),
                fresh,
            },
        )
    };
    match inspect(&path).map_err(|e| StoreError::new(&path, "reading", e))? {
        Shape::Absent if marker.is_some() => return Err(refuse(Damage::Missing)),
        Shape::Absent if wal_has_content(&path) => return Err(refuse(Damage::WalWithoutDatabase)),
        Shape::Absent => create(dir, file, &path, migrations)?,
        Shape::Damaged(d) => return Err(refuse(d)),
        Shape::Present => {}
    }
    owner_only(&path);
    let damaged = |e: &rusqlite::Error| {
        matches!(
            e.sqlite_error_code(),
            Some(ErrorCode::DatabaseCorrupt | ErrorCode::NotADatabase)
        )
    };
    // No CREATE: the file was just found; if it went meanwhile, that is an error, not
    // a new empty database.
    let flags = OpenFlags::SQLITE_OPEN_READ_WRITE
        | OpenFlags::SQLITE_OPEN_NO_MUTEX
        | OpenFlags::SQLITE_OPEN_URI;
    let mut conn = Connection::open_with_flags(&path, flags)
        .map_err(|e| StoreError::new(&path, "opening", e))?;
    // busy_timeout: the CLI's read-only peeks (and backups) may hold a lock briefly.
    if let Err(e) = conn.execute_batch(
        "PRAGMA busy_timeout=5000; PRAGMA journal_mode=WAL; PRAGMA synchronous=FULL;",
    ) {
        return Err(if damaged(&e) {
            refuse(Damage::Corrupt(e.to_string()))
        } else {
            StoreError::new(&path, "setting the journal mode", e)
        });
    }
    match quick_check(&conn) {
        Ok(None) => {}
        Ok(Some(why)) => return Err(refuse(Damage::Corrupt(why))),
        Err(e) if damaged(&e) => return Err(refuse(Damage::Corrupt(e.to_string()))),
        Err(e) => return Err(StoreError::new(&path, "checking the file", e)),
    }
    let version: i64 = conn
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .map_err(|e| StoreError::new(&path, "reading the schema version", e))?;
    let version = usize::try_from(version).unwrap_or(usize::MAX);
    if version > migrations.len() {
        return Err(StoreError::new(
            &path,
            "made by a newer release",
            Refusal::Newer {
                file: path.display().to_string(),
                found: u32::try_from(version).unwrap_or(u32::MAX),
                known: u32::try_from(migrations.len()).unwrap_or(u32::MAX),
            },
        ));
    }
    let own = read_meta(&conn).map_err(|e| StoreError::new(&path, "reading allot_meta", e))?;
    match (&marker, own) {
        (Some(m), Some(own)) if own.id == m.id => {}
        (Some(_), own) => {
            return Err(refuse(Damage::OtherDatabase {
                id: own.map(|o| o.id).unwrap_or_default(),
            }))
        }
        (None, Some(own)) => write_marker(&marker_file, &own)
            .map_err(|e| StoreError::new(&path, "writing the marker", e))?,
        (None, None) => {
            // An earlier release's file (or one whose marker was removed on purpose):
            // taken as is, and from now on known.
            let own =
                new_meta(&conn).map_err(|e| StoreError::new(&path, "writing allot_meta", e))?;
            write_marker(&marker_file, &own)
                .map_err(|e| StoreError::new(&path, "writing the marker", e))?;
        }
    }
    migrate(&mut conn, &path, version, migrations)?;
    Ok((conn, path))
}

/// What the file looks like before SQLite reads it.
enum Shape {
    Absent,
    Present,
    Damaged(Damage),
}

/// SQLite's header: magic, page size, and the page count when it is valid.
fn inspect(path: &Path) -> std::io::Result<Shape> {
    let mut f = match std::fs::File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Shape::Absent),
        Err(e) => return Err(e),
    };
    let len = f.metadata()?.len();
    if len == 0 {
        return Ok(Shape::Damaged(Damage::Empty));
    }
    let mut h = [0u8; 100];
    let mut got = 0;
    while got < h.len() {
        match f.read(&mut h[got..])? {
            0 => break,
            n => got += n,
        }
    }
    if got < 16 || &h[..16] != b"SQLite format 3\0" {
        return Ok(Shape::Damaged(Damage::NotSqlite));
    }
    if got < h.len() {
        return Ok(Shape::Damaged(Damage::Truncated {
            len,
            expected: h.len() as u64,
        }));
    }
    let be32 = |at: usize| u32::from_be_bytes([h[at], h[at + 1], h[at + 2], h[at + 3]]);
    let page = match u16::from_be_bytes([h[16], h[17]]) {
        1 => 65_536u64,
        p if p >= 512 && p.is_power_of_two() => u64::from(p),
        _ => return Ok(Shape::Damaged(Damage::NotSqlite)),
    };
    // A write-ahead log may hold what a checkpoint cut short had yet to write here:
    // then only SQLite (quick_check, through the log) can tell.
    if !wal_has_content(path) {
        if len % page != 0 {
            return Ok(Shape::Damaged(Damage::Truncated {
                len,
                expected: len.div_ceil(page) * page,
            }));
        }
        let pages = u64::from(be32(28));
        if pages > 0 && be32(24) == be32(92) && len < pages * page {
            return Ok(Shape::Damaged(Damage::Truncated {
                len,
                expected: pages * page,
            }));
        }
    }
    Ok(Shape::Present)
}

fn wal_path(path: &Path) -> PathBuf {
    let mut p = path.as_os_str().to_owned();
    p.push("-wal");
    PathBuf::from(p)
}

fn wal_has_content(path: &Path) -> bool {
    std::fs::metadata(wal_path(path)).is_ok_and(|m| m.len() > 0)
}

/// `None` when `PRAGMA quick_check` says ok, else what it found (the first lines).
fn quick_check(conn: &Connection) -> rusqlite::Result<Option<String>> {
    let mut st = conn.prepare("PRAGMA quick_check(5)")?;
    let rows = st
        .query_map([], |r| r.get::<_, String>(0))?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    if rows.len() == 1 && rows[0] == "ok" {
        return Ok(None);
    }
    Ok(Some(format!("quick_check: {}", rows.join("; "))))
}

const META: &str =
    "CREATE TABLE IF NOT EXISTS allot_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);";

fn read_meta(conn: &Connection) -> rusqlite::Result<Option<Marker>> {
    let has: bool = conn.query_row(
        "SELECT EXISTS (SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'allot_meta')",
        [],
        |r| r.get(0),
    )?;
    if !has {
        return Ok(None);
    }
    let get = |key: &str| {
        conn.query_row("SELECT value FROM allot_meta WHERE key = ?1", [key], |r| {
            r.get::<_, String>(0)
        })
        .optional()
    };
    let Some(id) = get("id")? else {
        return Ok(None);
    };
    let created_ms = get("created_ms")?.and_then(|v| v.parse().ok()).unwrap_or(0);
    Ok(Some(Marker {
        id,
        created_ms,
        created: readable(conn, created_ms)?,
    }))
}

/// Gives the database an id and a creation time (now), in `allot_meta`.
fn new_meta(conn: &Connection) -> rusqlite::Result<Marker> {
    let created_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0);
    let id: String = conn.query_row("SELECT lower(hex(randomblob(16)))", [], |r| r.get(0))?;
    conn.execute_batch(META)?;
    conn.execute(
        "INSERT OR REPLACE INTO allot_meta (key, value) VALUES ('id', ?1), ('created_ms', ?2)",
        rusqlite::params![id, created_ms.to_string()],
    )?;
    Ok(Marker {
        id,
        created_ms,
        created: readable(conn, created_ms)?,
    })
}

fn readable(conn: &Connection, ms: i64) -> rusqlite::Result<String> {
    conn.query_row(
        "SELECT datetime(?1 / 1000, 'unixepoch') || ' UTC'",
        [ms],
        |r| r.get(0),
    )
}

/// Reads the marker: `Ok(None)` when there is none, `Err` when it cannot be read.
fn read_marker(path: &Path) -> Result<Option<Marker>, String> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e.to_string()),
    };
    let field = |key: &str| {
        text.lines()
            .filter_map(|l| l.split_once('='))
            .find(|(k, _)| k.trim() == key)
            .map(|(_, v)| v.trim().to_string())
    };
    let id = field("id")
        .filter(|id| !id.is_empty())
        .ok_or_else(|| "no id= line".to_string())?;
    let created_ms = field("created_ms")
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| "no created_ms= line".to_string())?;
    Ok(Some(Marker {
        id,
        created_ms,
        created: field("created").unwrap_or_else(|| format!("{created_ms} ms")),
    }))
}

/// Writes the marker whole (temporary file, fsync, rename, fsync of the directory).
fn write_marker(path: &Path, m: &Marker) -> Result<(), MarkerError> {
    let fail = |error| MarkerError {
        marker: path.display().to_string(),
        error,
    };
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let db = name.strip_suffix(".created").unwrap_or(&name);
    let text = format!(
        "# allot: {db} was created in this directory. While this file is here, the daemon\n\
         # refuses to start if {db} is missing, empty or damaged, rather than start with no state.\n\
         # To start deliberately with no state, move {db} aside and remove this file.\n\
         file={db}\nid={}\ncreated_ms={}\ncreated={}\n",
        m.id, m.created_ms, m.created
    );
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    let mut f = std::fs::File::create(&tmp).map_err(fail)?;
    f.write_all(text.as_bytes()).map_err(fail)?;
    f.sync_all().map_err(fail)?;
    std::fs::rename(&tmp, path).map_err(fail)?;
    sync_dir(path).map_err(fail)
}

fn sync_dir(path: &Path) -> std::io::Result<()> {
    match path.parent() {
        Some(d) => std::fs::File::open(d)?.sync_all(),
        None => Ok(()),
    }
}

/// Makes a new database whole under `FILE.new` (id, creation time, every
/// migration), then renames it into place.
fn create(dir: &Path, file: &str, path: &Path, migrations: &[&str]) -> Result<(), StoreError> {
    let tmp = dir.join(format!("{file}.new"));
    for p in [tmp.clone(), dir.join(format!("{file}.new-journal"))] {
        match std::fs::remove_file(&p) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                return Err(StoreError::new(&p, "removing a half-made database", e))
            }
            _ => {}
        }
    }
    // Made 0600 before SQLite writes a byte (its journal and WAL files take the
    // database's mode): it holds what users submitted, environments included.
    {
        use std::os::unix::fs::OpenOptionsExt;
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)
            .map_err(|e| StoreError::new(&tmp, "creating", e))?;
    }
    let mut conn = Connection::open(&tmp).map_err(|e| StoreError::new(&tmp, "creating", e))?;
    conn.execute_batch("PRAGMA synchronous=FULL;")
        .map_err(|e| StoreError::new(&tmp, "creating", e))?;
    new_meta(&conn).map_err(|e| StoreError::new(&tmp, "writing allot_meta", e))?;
    migrate(&mut conn, &tmp, 0, migrations)?;
    conn.close()
        .map_err(|(_, e)| StoreError::new(&tmp, "closing", e))?;
    std::fs::File::open(&tmp)
        .and_then(|f| f.sync_all())
        .map_err(|e| StoreError::new(&tmp, "syncing", e))?;
    std::fs::rename(&tmp, path).map_err(|e| StoreError::new(path, "moving into place", e))?;
    sync_dir(path).map_err(|e| StoreError::new(dir, "syncing the state dir", e))
}

/// Takes group and other bits off a database and its WAL files (one made by an
/// earlier release, or copied in with a looser mode); best effort, as a file of
/// another owner cannot be changed and is read as it is.
fn owner_only(path: &Path) {
    use std::os::unix::fs::PermissionsExt;
    let mut wal = path.as_os_str().to_owned();
    wal.push("-wal");
    let mut shm = path.as_os_str().to_owned();
    shm.push("-shm");
    for p in [path.as_os_str(), &wal, &shm] {
        if let Ok(m) = std::fs::metadata(p) {
            let mode = m.permissions().mode();
            if mode & 0o077 != 0 {
                let _ = std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode & 0o700));
            }
        }
    }
}

/// Runs `migrations[from..]`, one transaction each, setting `user_version`.
fn migrate(
    conn: &mut Connection,
    path: &Path,
    from: usize,
    migrations: &[&str],
) -> Result<(), StoreError> {
    for (i, sql) in migrations.iter().enumerate().skip(from) {
        let version = i + 1;
        let fail = |source| {
            StoreError::new(
                path,
                "migrating the schema",
                MigrationError {
                    version,
                    error: source,
                },
            )
        };
        let tx = conn.transaction().map_err(fail)?;
        tx.execute_batch(sql).map_err(fail)?;
        tx.pragma_update(None, "user_version", version as i64)
            .map_err(fail)?;
        tx.commit().map_err(fail)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests;
