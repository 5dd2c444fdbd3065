//! What allotd acknowledged, kept outside its database: the journal position of
//! the last input it answered, and the ids it would give next. SQLite cannot tell a
//! lost, emptied, truncated or garbage `allotd.db-wal` from no log at all, and opens
//! on the older state; this file can: start-up refuses a database whose journal ends
//! before what allotd acknowledged. The ids let a restore from a backup (or accepting
//! such a loss) continue above every id allotd ever gave.
//!
//! The file (`allotd.db.acked`, 0600) holds two slots of [`SLOT`] bytes, written in
//! turn with `fdatasync`, each with its own write count and checksum: a write torn by
//! a power loss spoils one slot, and the other still reads.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

/// The file's name in the state dir.
pub const FILE: &str = "allotd.db.acked";
/// Bytes of one slot.
const SLOT: usize = 64;
const MAGIC: &[u8; 8] = b"ALLOTACK";

/// What one slot says.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Acked {
    /// Which database it was written for (a hash of its id, `allot_meta`): a marker
    /// of another database (one started afresh, imported) says nothing of this one.
    pub db: u64,
    /// The journal position of the last acknowledged input.
    pub seq: u64,
    /// The next workload id allotd would have given.
    pub next_workload: u64,
    /// The next lease id.
    pub next_lease: u64,
}

/// The open file and what it last said.
#[derive(Debug)]
pub struct Marker {
    file: File,
    path: PathBuf,
    /// Writes so far (the slot of the next is `writes % 2`).
    writes: u64,
    /// The database it now speaks for.
    db: u64,
}

/// The marker's name for database id `id`.
pub fn db_hash(id: &str) -> u64 {
    fnv(id.as_bytes())
}

/// FNV-1a: a checksum the file format keeps forever (std's hashers may change).
fn fnv(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
    })
}

fn encode(writes: u64, a: &Acked) -> [u8; SLOT] {
    let mut s = [0u8; SLOT];
    s[..8].copy_from_slice(MAGIC);
    for (i, v) in [writes, a.seq, a.next_workload, a.next_lease, a.db]
        .into_iter()
        .enumerate()
    {
        s[8 + i * 8..16 + i * 8].copy_from_slice(&v.to_le_bytes());
    }
    let sum = fnv(&s[..48]);
    s[48..56].copy_from_slice(&sum.to_le_bytes());
    s
}

fn decode(s: &[u8]) -> Option<(u64, Acked)> {
    let word =
        |i: usize| -> Option<u64> { Some(u64::from_le_bytes(s.get(i..i + 8)?.try_into().ok()?)) };
    if s.get(..8)? != MAGIC || word(48)? != fnv(s.get(..48)?) {
        return None;
    }
    Some((
        word(8)?,
        Acked {
            seq: word(16)?,
            next_workload: word(24)?,
            next_lease: word(32)?,
            db: word(40)?,
        },
    ))
}

impl Marker {
    /// What the marker in `dir` says, without making one (`None`: none, or neither
    /// slot reads).
    pub fn peek(dir: &Path) -> std::io::Result<Option<Acked>> {
        match std::fs::read(dir.join(FILE)) {
            Ok(buf) => Ok(best(&buf).map(|(_, a)| a)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Whether the marker in `dir` is there and holds bytes of which neither slot
    /// reads: damaged, not absent. allotd cannot tell from it what it acknowledged,
    /// so it refuses to start rather than switch the lost-log check off.
    pub fn damaged(dir: &Path) -> std::io::Result<bool> {
        match std::fs::read(dir.join(FILE)) {
            // Empty is what a crash between making the file and its first write
            // leaves: as if none.
            Ok(buf) => Ok(!buf.is_empty() && best(&buf).is_none()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Opens (making) the marker in `dir` for the database of id `db_id`; `None`
    /// inside when there is none yet (a state dir from before it existed, or a new
    /// one) or neither slot reads. A file it makes is owned like `dir` (an operator's
    /// command run as root must not leave allotd a file it cannot write).
    pub fn open(dir: &Path, db_id: &str) -> std::io::Result<(Marker, Option<Acked>)> {
        let path = dir.join(FILE);
        let made = !path.exists();
        let mut file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(&path)?;
        if made {
            use std::os::unix::fs::MetadataExt;
            let owner = std::fs::metadata(dir)?;
            // Only root can give a file away; anyone else made it theirs already.
            let _ = nix::unistd::chown(
                &path,
                Some(nix::unistd::Uid::from_raw(owner.uid())),
                Some(nix::unistd::Gid::from_raw(owner.gid())),
            );
        }
        let mut buf = Vec::new();
        file.read_to_end(&mut buf)?;
        let best = best(&buf);
        let writes = best.map_or(0, |(w, _)| w + 1);
        Ok((
            Marker {
                file,
                path,
                writes,
                db: db_hash(db_id),
            },
            best.map(|(_, a)| a),
        ))
    }

    /// Where it is.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Records `a` durably (the slot after the last one written), before allotd
    /// answers for it, for the database the marker was opened for.
    pub fn record(&mut self, a: Acked) -> std::io::Result<()> {
        let a = Acked { db: self.db, ..a };
        let slot = encode(self.writes, &a);
        let at = (self.writes % 2) * SLOT as u64;
        self.file.seek(SeekFrom::Start(at))?;
        self.file.write_all(&slot)?;
        self.file.sync_data()?;
        self.writes += 1;
        Ok(())
    }
}

/// Why allotd will not start on the damaged marker `path`, and the ways forward.
pub fn damaged_text(path: &Path) -> String {
    format!(
        "{} is damaged (neither of its two records reads): allotd cannot tell whether its \
         database lost inputs it acknowledged, so it does not start. Nothing was changed. \
         Ways forward, allotd stopped: put back a copy of that file if you kept one; or \
         `allotd state accept-loss`, which makes it anew from what the database holds",
        path.display()
    )
}

/// The slot written last of the two, if either reads.
fn best(buf: &[u8]) -> Option<(u64, Acked)> {
    buf.chunks(SLOT)
        .take(2)
        .filter_map(decode)
        .max_by_key(|(w, _)| *w)
}

/// Why database `db` (of id hash `db_hash`) is older than what allotd acknowledged,
/// and the ways forward; `None` when it is not, or when the marker was written for
/// another database (started afresh or imported here: it is not this one's past).
pub fn older(db: &Path, db_hash: u64, marker: &Path, db_seq: u64, acked: &Acked) -> Option<String> {
    (acked.db == db_hash && db_seq < acked.seq).then(|| {
        format!(
            "{} holds the journal up to entry {db_seq}, but allotd acknowledged entry {} ({}): \
             the {} newest acknowledged inputs are not in the database, so its write-ahead log \
             {}-wal was lost, emptied, cut short or damaged. Nothing was changed. Ways forward, \
             allotd stopped: put the -wal file back if you kept it; or restore a backup \
             (`allotd state restore FILE`); or accept the loss (`allotd state accept-loss`): \
             new ids continue above every id allotd gave",
            db.display(),
            acked.seq,
            marker.display(),
            acked.seq - db_seq,
            db.display()
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("allot-acked-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).expect("dir");
        d
    }

    #[test]
    fn the_last_record_reads_back_after_a_reopen() {
        let d = dir("reopen");
        let (mut m, none) = Marker::open(&d, "db-1").expect("open");
        assert_eq!(none, None);
        for seq in 1..=5 {
            m.record(Acked {
                seq,
                next_workload: seq + 10,
                next_lease: seq + 20,
                db: 0,
            })
            .expect("record");
        }
        let (_, last) = Marker::open(&d, "db-1").expect("reopen");
        assert_eq!(
            last,
            Some(Acked {
                seq: 5,
                next_workload: 15,
                next_lease: 25,
                db: db_hash("db-1"),
            })
        );
    }

    #[test]
    fn a_torn_slot_falls_back_to_the_other() {
        let d = dir("torn");
        let (mut m, _) = Marker::open(&d, "db-1").expect("open");
        for seq in [7, 8] {
            m.record(Acked {
                seq,
                ..Acked::default()
            })
            .expect("record");
        }
        // The write of 8 went to the second slot; tear it.
        let mut bytes = std::fs::read(d.join(FILE)).expect("read");
        bytes[SLOT + 20] ^= 0xff;
        std::fs::write(d.join(FILE), &bytes).expect("write");
        let (mut m, last) = Marker::open(&d, "db-1").expect("reopen");
        assert_eq!(last.map(|a| a.seq), Some(7));
        // Writing goes on from there, into the spoilt slot.
        m.record(Acked {
            seq: 9,
            ..Acked::default()
        })
        .expect("record");
        assert_eq!(
            Marker::open(&d, "db-1").expect("reopen").1.map(|a| a.seq),
            Some(9)
        );
        // Garbage in both: no marker, not a refusal by itself.
        std::fs::write(d.join(FILE), vec![0xAB; 2 * SLOT]).expect("write");
        assert_eq!(Marker::open(&d, "db-1").expect("reopen").1, None);
    }

    #[test]
    fn a_marker_of_which_no_record_reads_is_damaged_and_none_or_empty_is_not() {
        let d = dir("damaged");
        assert!(!Marker::damaged(&d).expect("none"), "absent");
        std::fs::write(d.join(FILE), b"").expect("empty");
        assert!(
            !Marker::damaged(&d).expect("empty"),
            "empty: a crash before the first write"
        );
        let (mut m, _) = Marker::open(&d, "db-1").expect("open");
        m.record(Acked::default()).expect("record");
        assert!(!Marker::damaged(&d).expect("good"));
        std::fs::write(d.join(FILE), [0x5au8; 2 * SLOT]).expect("garble");
        assert!(Marker::damaged(&d).expect("garbled"));
        std::fs::write(d.join(FILE), b"ALLOT").expect("cut");
        assert!(Marker::damaged(&d).expect("cut short"));
        let text = damaged_text(&d.join(FILE));
        assert!(text.contains(&d.join(FILE).display().to_string()), "{text}");
        assert!(text.contains("allotd state accept-loss"), "{text}");
    }

    #[test]
    fn an_older_database_is_named_with_the_ways_forward() {
        let a = Acked {
            seq: 44,
            db: db_hash("db-1"),
            ..Acked::default()
        };
        let db = Path::new("/s/allotd.db");
        let this = db_hash("db-1");
        assert_eq!(older(db, this, Path::new("/s/m"), 44, &a), None);
        // A marker of another database (this one was started afresh) is no past of it.
        assert_eq!(older(db, db_hash("db-2"), Path::new("/s/m"), 0, &a), None);
        let why = older(db, this, Path::new("/s/m"), 41, &a).expect("older");
        for words in [
            "/s/allotd.db holds the journal up to entry 41",
            "acknowledged entry 44 (/s/m)",
            "the 3 newest",
            "/s/allotd.db-wal",
            "allotd state restore FILE",
            "allotd state accept-loss",
        ] {
            assert!(why.contains(words), "{words:?} not in {why}");
        }
    }
}
