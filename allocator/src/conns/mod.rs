//! allotd's connections and long-lived streams, bounded so that one client cannot
//! starve the rest. Accepted TCP connections are admitted per peer address, per
//! address prefix (a /24 of IPv4, a /64 of IPv6, which one host may hold whole) and
//! in all; one over a cap is closed at once. Each holds its slot until it closes. A
//! connection must finish its TLS handshake within `handshake_timeout`, begin a
//! request soon after, and is closed once no request has been open for
//! `idle_timeout` (bytes alone, pings included, keep nothing open). `Watch` and
//! `Logs --follow` streams have a cap in all and a share per user. The counts are
//! `/metrics` gauges.
//!
//! Measured before: 1,100 idle connections with the default 1,024 descriptors left
//! allotd unable to accept anyone (the accept loop spun on EMFILE); 20,000 abandoned
//! Watch streams held 146 MB; one user held all 10,000 Watch streams; 18 loopback
//! addresses held all 4,096 connections; one TLS byte every 120 s, or HTTP/2 pings,
//! kept a connection open forever.

mod incoming;
mod requests;

pub use incoming::Incoming;
pub use requests::{peer_certs, TrackRequests};

use crate::config::ServerSection;
use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
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
    max: usize,
    per_peer: usize,
    per_prefix: usize,
    idle: Duration,
    handshake: Duration,
    first_request: Duration,
    max_watch: usize,
    watch_per_user: usize,
    by_peer: Mutex<Counts>,
    open: AtomicUsize,
    watch: Mutex<WatchCounts>,
    refused: AtomicU64,
    idle_closed: AtomicU64,
    /// When the last refusal warning was logged, and refusals since.
    warned: Mutex<(Option<Instant>, u64)>,
}

/// Open connections per peer address and per prefix.
#[derive(Default)]
struct Counts {
    peer: HashMap<IpAddr, usize>,
    prefix: HashMap<Prefix, usize>,
}

/// Open Watch streams in all and per user.
#[derive(Default)]
struct WatchCounts {
    total: usize,
    by_user: HashMap<String, usize>,
}

/// The network a peer's address is in, as far as one owner goes: a /24 of IPv4 (a
/// rack, a small site), a /64 of IPv6 (one host may have every address of it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Prefix {
    V4([u8; 3]),
    V6([u8; 8]),
}

impl Prefix {
    fn of(ip: IpAddr) -> Prefix {
        match ip {
            IpAddr::V4(a) => {
                let o = a.octets();
                Prefix::V4([o[0], o[1], o[2]])
            }
            IpAddr::V6(a) => {
                let mut p = [0u8; 8];
                p.copy_from_slice(&a.octets()[..8]);
                Prefix::V6(p)
            }
        }
    }
}

impl std::fmt::Display for Prefix {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Prefix::V4([a, b, c]) => write!(f, "{a}.{b}.{c}.0/24"),
            Prefix::V6(p) => {
                let mut o = [0u8; 16];
                o[..8].copy_from_slice(p);
                write!(f, "{}/64", std::net::Ipv6Addr::from(o))
            }
        }
    }
}

/// Why a connection was refused at accept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Over {
    Peer,
    Prefix,
    All,
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
        let watch_per_user = s
            .max_watch_streams_per_user
            .unwrap_or(s.max_watch_streams / 10)
            .clamp(1, s.max_watch_streams.max(1));
        Conns {
            max,
            per_peer,
            per_prefix,
            idle: Duration::from_secs(s.idle_timeout.max(1)),
            handshake: Duration::from_secs(s.handshake_timeout.max(1)),
            first_request: Duration::from_secs(s.first_request_timeout.max(1)),
            max_watch: s.max_watch_streams,
            watch_per_user,
            by_peer: Mutex::new(Counts::default()),
            open: AtomicUsize::new(0),
            watch: Mutex::new(WatchCounts::default()),
            refused: AtomicU64::new(0),
            idle_closed: AtomicU64::new(0),
            warned: Mutex::new((None, 0)),
        }
    }

    /// Open connections now.
    pub fn open(&self) -> usize {
        self.open.load(Ordering::Relaxed)
    }

    /// Open Watch streams now.
    pub fn watch_streams(&self) -> usize {
        self.watch.lock().unwrap_or_else(|e| e.into_inner()).total
    }

    /// Connections closed at accept for a cap, since start.
    pub fn refused(&self) -> u64 {
        self.refused.load(Ordering::Relaxed)
    }

    /// Connections closed for idleness (no request begun in time), since start.
    pub fn idle_closed(&self) -> u64 {
        self.idle_closed.load(Ordering::Relaxed)
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

    /// A slot for a connection from `peer`, or `None` when the peer, its prefix or
    /// the server is at its cap.
    fn admit(self: &Arc<Self>, peer: IpAddr) -> Option<Slot> {
        // An IPv4 client of a dual-stack listener is counted as the IPv4 address.
        let peer = peer.to_canonical();
        let prefix = Prefix::of(peer);
        let mut counts = self.by_peer.lock().unwrap_or_else(|e| e.into_inner());
        let n = counts.peer.get(&peer).copied().unwrap_or(0);
        let in_prefix = counts.prefix.get(&prefix).copied().unwrap_or(0);
        let total = self.open.load(Ordering::Relaxed);
        let over = if n >= self.per_peer {
            Some(Over::Peer)
        } else if in_prefix >= self.per_prefix {
            Some(Over::Prefix)
        } else if total >= self.max {
            Some(Over::All)
        } else {
            None
        };
        if let Some(over) = over {
            drop(counts);
            self.refused.fetch_add(1, Ordering::Relaxed);
            self.warn_refused(peer, prefix, over, (n, in_prefix, total));
            return None;
        }
        counts.peer.insert(peer, n + 1);
        counts.prefix.insert(prefix, in_prefix + 1);
        self.open.store(total + 1, Ordering::Relaxed);
        Some(Slot {
            conns: self.clone(),
            peer,
            prefix,
        })
    }

    /// Logs a refusal, at most once per [`WARN_EVERY`] with the count since.
    fn warn_refused(&self, peer: IpAddr, prefix: Prefix, over: Over, open: (usize, usize, usize)) {
        let mut w = self.warned.lock().unwrap_or_else(|e| e.into_inner());
        w.1 += 1;
        let now = Instant::now();
        if w.0.is_none_or(|at| now.duration_since(at) >= WARN_EVERY) {
            let cap = match over {
                Over::Peer => "max_connections_per_peer",
                Over::Prefix => "max_connections_per_prefix",
                Over::All => "max_connections",
            };
            tracing::warn!(
                peer = %peer,
                prefix = %prefix,
                from_peer = open.0,
                from_prefix = open.1,
                open = open.2,
                per_peer_cap = self.per_peer,
                per_prefix_cap = self.per_prefix,
                max = self.max,
                refused = w.1,
                "connection closed at accept: over server.{cap} (refused counts those since the last warning)"
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
    peer: IpAddr,
    prefix: Prefix,
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
        let mut counts = self.conns.by_peer.lock().unwrap_or_else(|e| e.into_inner());
        give_back(&mut counts.peer, &self.peer);
        give_back(&mut counts.prefix, &self.prefix);
        self.conns.open.fetch_sub(1, Ordering::Relaxed);
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

    #[test]
    fn the_cap_follows_the_descriptor_limit() {
        let s = section(4096, 256, 10);
        assert_eq!(effective_max(&s, 65536), 4096);
        assert_eq!(effective_max(&s, 1024), 1024 - 64);
        assert_eq!(effective_max(&s, 10), 1);
        let c = Conns::with_nofile(&section(4096, 3000, 10), 1024);
        assert_eq!((c.max, c.per_peer, c.per_prefix), (960, 959, 959));
        let c = Conns::with_nofile(&section(4096, 256, 10), 65536);
        assert_eq!(
            (c.per_peer, c.per_prefix),
            (256, 1024),
            "four peers' shares"
        );
    }

    #[test]
    fn slots_are_counted_per_peer_and_in_all_and_given_back() {
        let c = Arc::new(Conns::with_nofile(&section(3, 2, 10), 65536));
        let a: IpAddr = [10, 0, 0, 1].into();
        let b: IpAddr = [10, 0, 1, 2].into();
        let a1 = c.admit(a).expect("first of a");
        let a2 = c.admit(a).expect("second of a");
        assert!(c.admit(a).is_none(), "a is at its cap");
        let b1 = c.admit(b).expect("b has its own share");
        assert!(c.admit(b).is_none(), "the server is at its cap");
        assert_eq!((c.open(), c.refused()), (3, 2));
        drop(a1);
        assert_eq!(c.open(), 2);
        let a3 = c.admit(a).expect("a's slot came back");
        drop((a2, a3, b1));
        assert_eq!(c.open(), 0);
        let counts = c.by_peer.lock().expect("lock");
        assert!(counts.peer.is_empty() && counts.prefix.is_empty());
    }

    #[test]
    fn many_addresses_of_one_prefix_share_its_cap() {
        let mut s = section(100, 2, 10);
        s.max_connections_per_prefix = Some(5);
        let c = Arc::new(Conns::with_nofile(&s, 65536));
        // Six addresses of one /64, one each: five admitted, the sixth refused.
        let v6 = |i: u16| -> IpAddr { [0x2001, 0xdb8, 0, 7, 0, 0, 0, i].into() };
        let held: Vec<Slot> = (1..=5).map(|i| c.admit(v6(i)).expect("in share")).collect();
        assert!(c.admit(v6(6)).is_none(), "the /64 is at its cap");
        // Another /64, and another /24 of IPv4, are not.
        let other = c.admit([0x2001, 0xdb8, 0, 8, 0, 0, 0, 1].into());
        assert!(other.is_some());
        let v4 = |d: u8| -> IpAddr { [127, 0, 0, d].into() };
        let v4_held: Vec<Slot> = (1..=5).map(|d| c.admit(v4(d)).expect("in share")).collect();
        assert!(c.admit(v4(9)).is_none(), "127.0.0.0/24 is at its cap");
        assert!(
            c.admit([127, 0, 1, 1].into()).is_some(),
            "127.0.1.0/24 is not"
        );
        // An IPv4 client of a dual-stack listener counts as its IPv4 address.
        let mapped: IpAddr = "::ffff:127.0.0.3".parse().expect("addr");
        assert!(c.admit(mapped).is_none(), "mapped into 127.0.0.0/24");
        assert_eq!(c.refused(), 3);
        drop(held);
        assert!(c.admit(v6(6)).is_some(), "the /64's slots came back");
        drop(v4_held);
    }

    #[test]
    fn prefixes_read_as_networks() {
        assert_eq!(Prefix::of([10, 1, 2, 3].into()).to_string(), "10.1.2.0/24");
        let a: IpAddr = "2001:db8:0:7::1234".parse().expect("addr");
        assert_eq!(Prefix::of(a).to_string(), "2001:db8:0:7::/64");
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
