//! allotd's connections and long-lived streams, bounded so that one client cannot
//! starve the rest, and so that nothing unauthenticated holds a slot for long.
//! Accepted TCP connections are admitted per peer address, per address prefix (a
//! /24 of IPv4, a /64 of IPv6, which one host may hold whole) and in all
//! ([`allot_common::admission`]): a connection is *pending* until a request on it shows a valid
//! token or node certificate, and a newcomer that finds a cap reached takes the
//! slot of the heaviest holder's oldest pending connection, so an agent or a
//! user's CLI gets in under a flood. A pending connection is closed
//! `handshake_timeout + first_request_timeout` after accept, whatever it has
//! open; an authenticated one once no request has been open for `idle_timeout`
//! (bytes alone, pings included, keep nothing open). Authenticated connections
//! have a share per identity. `Watch` and `Logs --follow` streams have a cap in
//! all and a share per user. The counts are `/metrics` gauges.
//!
//! Measured before: 1,100 idle connections with the default 1,024 descriptors left
//! allotd unable to accept anyone (the accept loop spun on EMFILE); 20,000 abandoned
//! Watch streams held 146 MB; one user held all 10,000 Watch streams; 18 loopback
//! addresses held all 4,096 connections; one TLS byte every 120 s, or HTTP/2 pings,
//! kept a connection open forever; 4,200 anonymous requests that sent their headers
//! and never a body held every slot, so that a restarted agent could not reconnect
//! and its node was declared lost.

mod incoming;
mod requests;

pub use allot_common::admission::Prefix;
pub use incoming::Incoming;
pub use requests::{peer_certs, Proof, Prover, TrackRequests};

use crate::config::ServerSection;
use allot_common::admission::{Admitted, Caps, Over, Table};
use incoming::Activity;
use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::time::Instant;

/// Descriptors kept for what is not a client connection: the journal and its WAL,
/// the listeners, `/metrics` scrapes, logs.
const RESERVE_FDS: u64 = 64;
/// At most one warning per this period for refused connections (an abuser would
/// otherwise write the log for us).
const WARN_EVERY: Duration = Duration::from_secs(10);

/// The counts and caps, shared by the accept loop, every connection and the Watch
/// streams.
pub struct Conns {
    idle: Duration,
    handshake: Duration,
    first_request: Duration,
    max_watch: usize,
    watch_per_user: usize,
    table: Mutex<Table<Arc<Activity>>>,
    watch: Mutex<WatchCounts>,
    refused: AtomicU64,
    idle_closed: AtomicU64,
    evicted: AtomicU64,
    /// When the last refusal warning was logged, and refusals since.
    warned: Mutex<(Option<Instant>, u64)>,
}

/// Open Watch streams in all and per user.
#[derive(Default)]
struct WatchCounts {
    total: usize,
    by_user: HashMap<String, usize>,
}

/// The caps of `[server]`, with `max_connections` lowered to what the descriptor
/// limit `nofile` allows.
pub fn effective_max(s: &ServerSection, nofile: u64) -> usize {
    let room = usize::try_from(nofile.saturating_sub(RESERVE_FDS)).unwrap_or(usize::MAX);
    s.max_connections.min(room.max(1))
}

impl Conns {
    /// Counts with the caps of `[server]` under this process's descriptor limit.
    pub fn new(s: &ServerSection) -> Conns {
        use nix::sys::resource::{getrlimit, Resource};
        let nofile = getrlimit(Resource::RLIMIT_NOFILE).map_or(1024, |(soft, _)| soft);
        Self::with_nofile(s, nofile)
    }

    /// Counts with the caps of `[server]`; `nofile` is the descriptor limit in force.
    pub fn with_nofile(s: &ServerSection, nofile: u64) -> Conns {
        let max = effective_max(s, nofile);
        if max < s.max_connections {
            tracing::warn!(
                max_connections = s.max_connections,
                nofile,
                effective = max,
                "max_connections lowered to the descriptor limit; raise LimitNOFILE"
            );
        }
        // Kept below the cap in all when that was lowered: one peer (or prefix)
        // never takes every connection.
        let below_max = max.saturating_sub(1).max(1);
        let per_peer = s.max_connections_per_peer.min(below_max);
        let per_prefix = s
            .max_connections_per_prefix
            .unwrap_or(s.max_connections_per_peer.saturating_mul(4))
            .clamp(per_peer, below_max);
        let per_identity = s
            .max_connections_per_user
            .unwrap_or(s.max_connections_per_peer)
            .clamp(1, below_max);
        let watch_per_user = s
            .max_watch_streams_per_user
            .unwrap_or(s.max_watch_streams / 10)
            .clamp(1, s.max_watch_streams.max(1));
        Conns {
            idle: Duration::from_secs(s.idle_timeout.max(1)),
            handshake: Duration::from_secs(s.handshake_timeout.max(1)),
            first_request: Duration::from_secs(s.first_request_timeout.max(1)),
            max_watch: s.max_watch_streams,
            watch_per_user,
            table: Mutex::new(Table::new(Caps {
                max,
                per_peer,
                per_prefix,
                per_identity,
            })),
            watch: Mutex::new(WatchCounts::default()),
            refused: AtomicU64::new(0),
            idle_closed: AtomicU64::new(0),
            evicted: AtomicU64::new(0),
            warned: Mutex::new((None, 0)),
        }
    }

    fn table(&self) -> std::sync::MutexGuard<'_, Table<Arc<Activity>>> {
        self.table.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Open connections now.
    pub fn open(&self) -> usize {
        self.table().open()
    }

    /// Of those, the ones no request has authenticated yet.
    pub fn pending(&self) -> usize {
        self.table().pending()
    }

    /// Open Watch streams now.
    pub fn watch_streams(&self) -> usize {
        self.watch.lock().unwrap_or_else(|e| e.into_inner()).total
    }

    /// Connections closed at accept for a cap, since start.
    pub fn refused(&self) -> u64 {
        self.refused.load(Ordering::Relaxed)
    }

    /// Connections closed by a deadline (not authenticated in time, or no request
    /// open for `idle_timeout`), since start.
    pub fn idle_closed(&self) -> u64 {
        self.idle_closed.load(Ordering::Relaxed)
    }

    /// Pending connections closed to give their slot to a newcomer, since start.
    pub fn evicted(&self) -> u64 {
        self.evicted.load(Ordering::Relaxed)
    }

    /// The HTTP/2 ping period: a peer that vanished under an open stream is found
    /// within this and the ping timeout.
    pub fn keepalive_interval(&self) -> Duration {
        (self.idle / 3).min(Duration::from_secs(60))
    }

    /// How long a TLS handshake may take.
    pub fn handshake_timeout(&self) -> Duration {
        self.handshake
    }

    /// How long after accept a connection may stay unauthenticated.
    fn auth_deadline(&self) -> Duration {
        self.handshake + self.first_request
    }

    /// A slot for a connection from `peer`, or `None` when the peer, its prefix or
    /// the server is at its cap and no heavier holder has a pending slot to give.
    fn admit(self: &Arc<Self>, peer: IpAddr, now: Instant) -> Option<Slot> {
        let activity = Arc::new(Activity::new(now));
        let mut table = self.table();
        match table.admit(peer, activity.clone()) {
            Admitted::In { id, evicted } => {
                activity.set_id(id);
                drop(table);
                if let Some(victim) = evicted {
                    self.evicted.fetch_add(1, Ordering::Relaxed);
                    victim.evict();
                }
                Some(Slot {
                    conns: self.clone(),
                    id,
                    peer: peer.to_canonical(),
                    activity,
                })
            }
            Admitted::Refused(over) => {
                let held = table.held_by(peer.to_canonical());
                let (open, caps) = (table.open(), table.caps());
                drop(table);
                self.refused.fetch_add(1, Ordering::Relaxed);
                self.warn_refused(peer.to_canonical(), over, (held.0, held.1, open), caps);
                None
            }
        }
    }

    /// The connection of `activity` proved `identity`: from now on it is closed only
    /// when idle. Refused, naming the setting, when that identity holds its share.
    pub(crate) fn authenticate(&self, activity: &Activity, identity: &str) -> Result<(), String> {
        if activity.authed() {
            return Ok(());
        }
        let mut table = self.table();
        let per = table.caps().per_identity;
        match table.authenticate(activity.id(), identity) {
            Ok(()) => {
                activity.set_authed();
                Ok(())
            }
            Err(n) => Err(format!(
                "{identity} has {n} connections open, one identity's most (server.max_connections_per_user = {per}); close some"
            )),
        }
    }

    /// Logs a refusal, at most once per [`WARN_EVERY`] with the count since.
    fn warn_refused(&self, peer: IpAddr, over: Over, held: (usize, usize, usize), caps: Caps) {
        let mut w = self.warned.lock().unwrap_or_else(|e| e.into_inner());
        w.1 += 1;
        let now = Instant::now();
        if w.0.is_none_or(|at| now.duration_since(at) >= WARN_EVERY) {
            tracing::warn!(
                peer = %peer,
                prefix = %Prefix::of(peer),
                from_peer = held.0,
                pending_from_prefix = held.1,
                open = held.2,
                per_peer_cap = caps.per_peer,
                per_prefix_cap = caps.per_prefix,
                max = caps.max,
                refused = w.1,
                "connection closed at accept: over server.{} (refused counts those since the last warning)",
                over.setting()
            );
            *w = (Some(now), 0);
        }
    }

    /// A slot for one more Watch (or followed Logs) stream of `owner`, or why not:
    /// the cap in all or the owner's share, named with its setting.
    pub fn watch_slot(self: &Arc<Self>, owner: &str) -> Result<WatchSlot, String> {
        let mut w = self.watch.lock().unwrap_or_else(|e| e.into_inner());
        if w.total >= self.max_watch {
            return Err(format!(
                "{} streams are open, this allotd's most (server.max_watch_streams)",
                self.max_watch
            ));
        }
        let mine = w.by_user.get(owner).copied().unwrap_or(0);
        if mine >= self.watch_per_user {
            return Err(format!(
                "{owner} has {mine} streams open, one caller's most (server.max_watch_streams_per_user)"
            ));
        }
        w.total += 1;
        w.by_user.insert(owner.to_string(), mine + 1);
        Ok(WatchSlot {
            conns: self.clone(),
            owner: owner.to_string(),
        })
    }
}

/// A connection's place in the counts, given back on drop.
struct Slot {
    conns: Arc<Conns>,
    id: u64,
    peer: IpAddr,
    activity: Arc<Activity>,
}

/// Takes one off a count, removing the key at zero.
fn give_back<K: std::hash::Hash + Eq>(m: &mut HashMap<K, usize>, k: &K) {
    match m.get_mut(k) {
        Some(n) if *n > 1 => *n -= 1,
        _ => {
            m.remove(k);
        }
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        // An evicted one gave its slot back already.
        self.conns.table().release(self.id);
    }
}

/// An open Watch stream's place in the counts, given back on drop.
pub struct WatchSlot {
    conns: Arc<Conns>,
    owner: String,
}

impl Drop for WatchSlot {
    fn drop(&mut self) {
        let mut w = self.conns.watch.lock().unwrap_or_else(|e| e.into_inner());
        w.total = w.total.saturating_sub(1);
        give_back(&mut w.by_user, &self.owner);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(super) fn section(max: usize, per_peer: usize, watch: usize) -> ServerSection {
        ServerSection {
            max_connections: max,
            max_connections_per_peer: per_peer,
            max_watch_streams: watch,
            ..ServerSection::default()
        }
    }

    fn caps(c: &Conns) -> Caps {
        c.table().caps()
    }

    #[test]
    fn the_cap_follows_the_descriptor_limit() {
        let s = section(4096, 256, 10);
        assert_eq!(effective_max(&s, 65536), 4096);
        assert_eq!(effective_max(&s, 1024), 1024 - 64);
        assert_eq!(effective_max(&s, 10), 1);
        let c = Conns::with_nofile(&section(4096, 3000, 10), 1024);
        let k = caps(&c);
        assert_eq!((k.max, k.per_peer, k.per_prefix), (960, 959, 959));
        let k = caps(&Conns::with_nofile(&section(4096, 256, 10), 65536));
        assert_eq!(
            (k.per_peer, k.per_prefix, k.per_identity),
            (256, 1024, 256),
            "four peers' shares; an identity, one peer's"
        );
    }

    #[test]
    fn slots_are_counted_and_given_back_and_an_evicted_one_is_told() {
        let c = Arc::new(Conns::with_nofile(&section(3, 2, 10), 65536));
        let a: IpAddr = [10, 0, 0, 1].into();
        let b: IpAddr = [10, 0, 1, 2].into();
        let now = Instant::now();
        let a1 = c.admit(a, now).expect("first of a");
        let a2 = c.admit(a, now).expect("second of a");
        assert!(c.admit(a, now).is_none(), "a is at its cap");
        let b1 = c.admit(b, now).expect("b has its own share");
        assert_eq!((c.open(), c.pending(), c.refused()), (3, 3, 1));
        // Full: another prefix's newcomer takes a's oldest pending slot.
        c.authenticate(&b1.activity, "bo").expect("share");
        let d = c.admit([10, 0, 2, 1].into(), now).expect("takes a slot");
        assert!(a1.activity.evicted() && !a2.activity.evicted());
        assert_eq!((c.open(), c.pending(), c.evicted()), (3, 2, 1));
        drop(a1);
        assert_eq!(
            c.open(),
            3,
            "an evicted slot was given back when it was taken"
        );
        drop((a2, b1, d));
        assert_eq!((c.open(), c.pending()), (0, 0));
    }

    #[test]
    fn an_identity_over_its_share_is_refused_naming_the_setting() {
        let mut s = section(100, 50, 10);
        s.max_connections_per_user = Some(1);
        let c = Arc::new(Conns::with_nofile(&s, 65536));
        let now = Instant::now();
        let one = c.admit([10, 0, 0, 1].into(), now).expect("in");
        let two = c.admit([10, 0, 0, 2].into(), now).expect("in");
        c.authenticate(&one.activity, "ana").expect("first");
        let e = c.authenticate(&two.activity, "ana").expect_err("second");
        assert!(e.contains("server.max_connections_per_user = 1"), "{e}");
        assert!(!two.activity.authed());
    }

    #[test]
    fn watch_slots_stop_at_the_cap_and_at_each_users_share() {
        let mut s = section(10, 5, 4);
        s.max_watch_streams_per_user = Some(2);
        let c = Arc::new(Conns::with_nofile(&s, 65536));
        let a1 = c.watch_slot("ana").expect("1");
        let _a2 = c.watch_slot("ana").expect("2");
        let e = c.watch_slot("ana").err().expect("ana's share");
        assert!(e.contains("max_watch_streams_per_user"), "{e}");
        let _b = c.watch_slot("bo").expect("bo's own share");
        let _c = c.watch_slot("cy").expect("cy's own share");
        let e = c.watch_slot("dee").err().expect("the cap");
        assert!(e.contains("server.max_watch_streams)"), "{e}");
        assert_eq!(c.watch_streams(), 4);
        drop(a1);
        assert!(c.watch_slot("ana").is_ok());
        // Unset: a tenth of the cap in all.
        let c = Arc::new(Conns::with_nofile(&section(10, 5, 10_000), 65536));
        assert_eq!(c.watch_per_user, 1000);
    }
}
