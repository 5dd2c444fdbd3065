//! Which connections hold a slot, and whose slot a newcomer takes when the caps
//! are reached. Pure bookkeeping (no sockets, no clock), so every rule is tested
//! here with plain addresses.
//!
//! Every connection counts against its peer address's share and the cap in all;
//! one that has not yet authenticated (no request has shown a valid token or node
//! certificate) is *pending*, and only pending ones count against their address
//! prefix's share: a rack's or a login subnet's /24 is shared by its
//! authenticated hosts without limit. A newcomer that finds its prefix, or the
//! server, full takes the slot of the oldest pending connection of the heaviest
//! holder (the peer of its prefix, or the prefix, holding most pending slots),
//! if that holder holds more than the newcomer's own; otherwise it is refused.
//! So a flood from a few addresses or prefixes evicts itself, and a host with
//! nothing pending (an agent reconnecting, a user's CLI) always gets in.

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::net::IpAddr;

/// The network a peer's address is in, as far as one owner goes: a /24 of IPv4 (a
/// rack, a small site), a /64 of IPv6 (one host may have every address of it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Prefix {
    /// The first three octets.
    V4([u8; 3]),
    /// The first eight bytes.
    V6([u8; 8]),
}

impl Prefix {
    /// The prefix of `ip`.
    pub fn of(ip: IpAddr) -> Prefix {
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

/// The caps the table keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Caps {
    /// Connections in all.
    pub max: usize,
    /// Connections from one address.
    pub per_peer: usize,
    /// Pending connections from one prefix.
    pub per_prefix: usize,
    /// Authenticated connections of one identity (a user's token, a node).
    pub per_identity: usize,
}

/// Why a connection was refused at accept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Over {
    /// Its address holds its share.
    Peer,
    /// Its prefix holds its share of pending slots, and no peer of it holds more
    /// than the newcomer's own.
    Prefix,
    /// The server is full, and no prefix holds more pending slots than the
    /// newcomer's.
    All,
}

impl Over {
    /// The setting whose cap it was.
    pub fn setting(self) -> &'static str {
        match self {
            Over::Peer => "max_connections_per_peer",
            Over::Prefix => "max_connections_per_prefix",
            Over::All => "max_connections",
        }
    }
}

/// What became of a newcomer.
#[derive(Debug, PartialEq, Eq)]
pub enum Admitted<H> {
    /// It holds slot `id`; `evicted`, if any, gave its slot up for it and is to be
    /// closed.
    In {
        /// The newcomer's slot.
        id: u64,
        /// The pending connection whose slot it took.
        evicted: Option<H>,
    },
    /// Closed at once.
    Refused(Over),
}

#[derive(Debug)]
enum State {
    Pending,
    Authed(String),
}

#[derive(Debug)]
struct Entry<H> {
    peer: IpAddr,
    prefix: Prefix,
    state: State,
    handle: H,
}

/// A prefix's pending connections, by peer, oldest first.
#[derive(Debug, Default)]
struct Pending {
    count: usize,
    peers: HashMap<IpAddr, VecDeque<u64>>,
}

/// The connections holding slots. `H` is what the owner needs to close an
/// evicted one.
#[derive(Debug)]
pub struct Table<H> {
    caps: Caps,
    next: u64,
    entries: HashMap<u64, Entry<H>>,
    by_peer: HashMap<IpAddr, usize>,
    pending: HashMap<Prefix, Pending>,
    /// `(pending count, prefix)` of every prefix with pending connections: the
    /// heaviest is the last.
    heaviest: BTreeSet<(usize, Prefix)>,
    identities: HashMap<String, usize>,
    pending_total: usize,
}

impl<H> Table<H> {
    /// An empty table under `caps`.
    pub fn new(caps: Caps) -> Table<H> {
        Table {
            caps,
            next: 0,
            entries: HashMap::new(),
            by_peer: HashMap::new(),
            pending: HashMap::new(),
            heaviest: BTreeSet::new(),
            identities: HashMap::new(),
            pending_total: 0,
        }
    }

    /// The caps in force.
    pub fn caps(&self) -> Caps {
        self.caps
    }

    /// Connections holding a slot.
    pub fn open(&self) -> usize {
        self.entries.len()
    }

    /// Of those, the ones not yet authenticated.
    pub fn pending(&self) -> usize {
        self.pending_total
    }

    /// Open connections from `peer`, and pending ones from its prefix.
    pub fn held_by(&self, peer: IpAddr) -> (usize, usize) {
        let prefix = Prefix::of(peer);
        (
            self.by_peer.get(&peer).copied().unwrap_or(0),
            self.pending.get(&prefix).map_or(0, |p| p.count),
        )
    }

    fn pending_of(&self, peer: IpAddr, prefix: Prefix) -> usize {
        self.pending
            .get(&prefix)
            .and_then(|p| p.peers.get(&peer))
            .map_or(0, VecDeque::len)
    }

    /// The oldest pending connection of the peer of `prefix` holding most pending
    /// slots, if it holds more than `than`.
    fn victim_in(&self, prefix: Prefix, than: usize) -> Option<u64> {
        let p = self.pending.get(&prefix)?;
        // Ties go to the lowest address, so the choice does not depend on hash order.
        let (_, q) = p
            .peers
            .iter()
            .max_by(|a, b| a.1.len().cmp(&b.1.len()).then(b.0.cmp(a.0)))?;
        (q.len() > than).then(|| q.front().copied()).flatten()
    }

    /// Admits a connection from `peer` (an IPv4 client of a dual-stack listener
    /// counts as its IPv4 address), taking a pending connection's slot where a cap
    /// is reached and a heavier holder has one.
    pub fn admit(&mut self, peer: IpAddr, handle: H) -> Admitted<H> {
        let peer = peer.to_canonical();
        let prefix = Prefix::of(peer);
        if self.by_peer.get(&peer).copied().unwrap_or(0) >= self.caps.per_peer {
            return Admitted::Refused(Over::Peer);
        }
        let in_prefix = self.pending.get(&prefix).map_or(0, |p| p.count);
        let mut victim = None;
        if in_prefix >= self.caps.per_prefix {
            match self.victim_in(prefix, self.pending_of(peer, prefix)) {
                Some(v) => victim = Some(v),
                None => return Admitted::Refused(Over::Prefix),
            }
        } else if self.entries.len() >= self.caps.max {
            let heaviest = self.heaviest.last().map(|(n, _)| *n).unwrap_or(0);
            let from = match self.heaviest.last() {
                Some((n, p)) if *n > in_prefix => self.victim_in(*p, 0),
                // Its own prefix is (one of) the heaviest: there, as when the prefix
                // is full, the heaviest peer gives way to a lighter one, so a host
                // with nothing pending gets in even inside the flooded /24.
                _ if in_prefix > 0 && in_prefix == heaviest => {
                    self.victim_in(prefix, self.pending_of(peer, prefix))
                }
                _ => None,
            };
            match from {
                Some(v) => victim = Some(v),
                None => return Admitted::Refused(Over::All),
            }
        }
        let evicted = victim.and_then(|v| self.release(v));
        let id = self.next;
        self.next += 1;
        *self.by_peer.entry(peer).or_insert(0) += 1;
        self.add_pending(prefix, peer, id);
        self.entries.insert(
            id,
            Entry {
                peer,
                prefix,
                state: State::Pending,
                handle,
            },
        );
        Admitted::In { id, evicted }
    }

    fn set_prefix_count(&mut self, prefix: Prefix, from: usize, to: usize) {
        if from > 0 {
            self.heaviest.remove(&(from, prefix));
        }
        if to > 0 {
            self.heaviest.insert((to, prefix));
        }
    }

    fn add_pending(&mut self, prefix: Prefix, peer: IpAddr, id: u64) {
        let p = self.pending.entry(prefix).or_default();
        p.peers.entry(peer).or_default().push_back(id);
        p.count += 1;
        let n = p.count;
        self.pending_total += 1;
        self.set_prefix_count(prefix, n - 1, n);
    }

    fn remove_pending(&mut self, prefix: Prefix, peer: IpAddr, id: u64) {
        let Some(p) = self.pending.get_mut(&prefix) else {
            return;
        };
        if let Some(q) = p.peers.get_mut(&peer) {
            if let Some(at) = q.iter().position(|x| *x == id) {
                q.remove(at);
                p.count -= 1;
                self.pending_total -= 1;
            }
            if q.is_empty() {
                p.peers.remove(&peer);
            }
        }
        let n = p.count;
        if n == 0 {
            self.pending.remove(&prefix);
        }
        self.set_prefix_count(prefix, n + 1, n);
    }

    /// Connection `id` proved `identity`: no longer pending, counted against that
    /// identity's share; or, over that share, the identity's count (it stays
    /// pending). An evicted or already authenticated one is left as it is.
    pub fn authenticate(&mut self, id: u64, identity: &str) -> Result<(), usize> {
        let Some(e) = self.entries.get(&id) else {
            return Ok(());
        };
        if !matches!(e.state, State::Pending) {
            return Ok(());
        }
        let n = self.identities.get(identity).copied().unwrap_or(0);
        if n >= self.caps.per_identity {
            return Err(n);
        }
        let (prefix, peer) = (e.prefix, e.peer);
        self.remove_pending(prefix, peer, id);
        self.identities.insert(identity.to_string(), n + 1);
        if let Some(e) = self.entries.get_mut(&id) {
            e.state = State::Authed(identity.to_string());
        }
        Ok(())
    }

    /// Gives connection `id`'s slot back (it closed, or was evicted); its handle.
    pub fn release(&mut self, id: u64) -> Option<H> {
        let e = self.entries.remove(&id)?;
        match self.by_peer.get_mut(&e.peer) {
            Some(n) if *n > 1 => *n -= 1,
            _ => {
                self.by_peer.remove(&e.peer);
            }
        }
        match &e.state {
            State::Pending => self.remove_pending(e.prefix, e.peer, id),
            State::Authed(who) => match self.identities.get_mut(who) {
                Some(n) if *n > 1 => *n -= 1,
                _ => {
                    self.identities.remove(who);
                }
            },
        }
        Some(e.handle)
    }

    /// Whether every count agrees with the entries (for tests).
    #[cfg(test)]
    fn consistent(&self) -> bool {
        let pending: Vec<&Entry<H>> = self
            .entries
            .values()
            .filter(|e| matches!(e.state, State::Pending))
            .collect();
        let by_prefix_ok = self.pending.iter().all(|(p, v)| {
            v.count == pending.iter().filter(|e| e.prefix == *p).count()
                && v.peers.values().map(VecDeque::len).sum::<usize>() == v.count
                && self.heaviest.contains(&(v.count, *p))
        });
        let peers_ok = self
            .by_peer
            .iter()
            .all(|(p, n)| *n == self.entries.values().filter(|e| e.peer == *p).count())
            && self.by_peer.values().sum::<usize>() == self.entries.len();
        by_prefix_ok
            && peers_ok
            && self.heaviest.len() == self.pending.len()
            && self.pending_total == pending.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn caps(max: usize, per_peer: usize, per_prefix: usize) -> Caps {
        Caps {
            max,
            per_peer,
            per_prefix,
            per_identity: 1000,
        }
    }

    fn v4(c: u8, d: u8) -> IpAddr {
        [10, 0, c, d].into()
    }

    fn id(a: Admitted<u64>) -> (u64, Option<u64>) {
        match a {
            Admitted::In { id, evicted } => (id, evicted),
            Admitted::Refused(o) => panic!("refused: {o:?}"),
        }
    }

    #[test]
    fn a_peer_over_its_share_is_refused_and_its_slots_come_back() {
        let mut t = Table::new(caps(10, 2, 5));
        let a = id(t.admit(v4(0, 1), 0)).0;
        id(t.admit(v4(0, 1), 1));
        assert_eq!(t.admit(v4(0, 1), 2), Admitted::Refused(Over::Peer));
        assert_eq!(t.release(a), Some(0));
        id(t.admit(v4(0, 1), 3));
        assert_eq!(t.open(), 2);
        assert!(t.consistent());
    }

    #[test]
    fn a_full_prefix_evicts_its_heaviest_peers_oldest_and_refuses_its_heaviest() {
        let mut t = Table::new(caps(100, 4, 6));
        // .1 holds 4, .2 holds 2: the /24 is at its cap of 6.
        let ones: Vec<u64> = (0..4).map(|h| id(t.admit(v4(0, 1), h)).0).collect();
        (4..6).for_each(|h| {
            id(t.admit(v4(0, 2), h));
        });
        // A newcomer of the prefix with nothing pending takes .1's oldest slot.
        let (_, evicted) = id(t.admit(v4(0, 3), 6));
        assert_eq!(evicted, Some(0), "the handle of .1's first");
        assert_eq!(t.held_by(v4(0, 1)), (3, 6));
        // .1 (3 pending, the heaviest) gets nothing more: the /24 is full and no
        // peer of it holds more than .1.
        assert_eq!(t.admit(v4(0, 1), 7), Admitted::Refused(Over::Prefix));
        // Authenticating frees the prefix's share without closing anything.
        t.authenticate(ones[1], "alice").expect("share");
        assert_eq!(t.held_by(v4(0, 1)), (3, 5));
        id(t.admit(v4(0, 4), 8));
        assert!(t.consistent());
    }

    #[test]
    fn a_full_server_evicts_from_the_heaviest_prefix_never_a_lighter_one() {
        let mut t = Table::new(caps(6, 4, 6));
        // 10.0.0.0/24 holds 4 pending, 10.0.1.0/24 holds 2 pending: full.
        (0..4).for_each(|h| {
            id(t.admit(v4(0, 1 + h as u8 % 2), h));
        });
        let light: Vec<u64> = (4..6).map(|h| id(t.admit(v4(1, 1), h)).0).collect();
        // A third prefix takes a slot of the heaviest (10.0.0.0/24, its heavier
        // peer tied at 2: the lower address, .1, and its oldest).
        let (_, evicted) = id(t.admit(v4(2, 1), 6));
        assert_eq!(evicted, Some(0));
        // 10.0.1.0/24 (2 pending) may take from 10.0.0.0/24 (3) ...
        let (_, evicted) = id(t.admit(v4(1, 2), 7));
        assert_eq!(
            evicted,
            Some(1),
            "the oldest of .2, now the heaviest peer of 10.0.0.0/24"
        );
        // ... and now the two hold 2 and 3: 10.0.1.0/24 is the heaviest. Its own
        // newcomer never takes from the lighter prefix; it takes from its own
        // prefix's heaviest peer (.1, 2 pending), which holds more than it does.
        let (_, evicted) = id(t.admit(v4(1, 3), 8));
        assert_eq!(evicted, Some(4), "the oldest of 10.0.1.1");
        // .1 and .3 now hold 1 each as the heaviest peers of the heaviest prefix:
        // a third slot for .3 is refused, none heavier holds more.
        assert_eq!(t.admit(v4(1, 3), 9), Admitted::Refused(Over::All));
        // Authenticated connections are never taken.
        t.authenticate(light[1], "bob").expect("share");
        assert!(t.consistent());
        assert_eq!((t.open(), t.pending()), (6, 5));
    }

    #[test]
    fn a_full_server_lets_a_host_with_nothing_pending_into_its_own_flooded_prefix() {
        // Two prefixes flooded alike fill the server; a CLI from inside one of them,
        // with nothing pending, takes the slot of that prefix's heaviest peer.
        let mut t = Table::new(caps(6, 10, 10));
        (0..3).for_each(|h| {
            id(t.admit(v4(0, 1), h));
        });
        (3..6).for_each(|h| {
            id(t.admit(v4(1, 1), h));
        });
        let (_, evicted) = id(t.admit(v4(0, 9), 6));
        assert_eq!(evicted, Some(0), "10.0.0.1's oldest");
        assert!(t.consistent());
    }

    #[test]
    fn an_identity_over_its_share_stays_pending() {
        let mut t = Table::new(Caps {
            per_identity: 2,
            ..caps(10, 10, 10)
        });
        let ids: Vec<u64> = (0..3).map(|h| id(t.admit(v4(0, 1), h)).0).collect();
        t.authenticate(ids[0], "ana").expect("1");
        t.authenticate(ids[1], "ana").expect("2");
        assert_eq!(t.authenticate(ids[2], "ana"), Err(2));
        assert_eq!(t.pending(), 1);
        t.authenticate(ids[2], "bo").expect("another identity");
        t.release(ids[0]);
        let more = id(t.admit(v4(0, 1), 9)).0;
        t.authenticate(more, "ana").expect("ana's slot came back");
        assert!(t.consistent());
    }

    #[test]
    fn prefixes_read_as_networks() {
        assert_eq!(Prefix::of([10, 1, 2, 3].into()).to_string(), "10.1.2.0/24");
        let a: IpAddr = "2001:db8:0:7::1234".parse().expect("addr");
        assert_eq!(Prefix::of(a).to_string(), "2001:db8:0:7::/64");
    }

    #[test]
    fn a_mapped_ipv4_client_counts_as_its_ipv4_address() {
        let mut t = Table::new(caps(10, 1, 5));
        id(t.admit([127, 0, 0, 3].into(), 0));
        let mapped: IpAddr = "::ffff:127.0.0.3".parse().expect("addr");
        assert_eq!(t.admit(mapped, 1), Admitted::Refused(Over::Peer));
    }

    /// One step of a random history.
    #[derive(Debug, Clone)]
    enum Step {
        Admit(u8, u8),
        Auth(usize, u8),
        Close(usize),
    }

    fn step() -> impl Strategy<Value = Step> {
        prop_oneof![
            4 => (0u8..4, 0u8..6).prop_map(|(c, d)| Step::Admit(c, d)),
            2 => (0usize..64, 0u8..3).prop_map(|(i, u)| Step::Auth(i, u)),
            1 => (0usize..64).prop_map(Step::Close),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]
        /// Whatever comes and goes: the caps hold, counts agree, an authenticated
        /// connection is never evicted, and a newcomer whose peer and prefix hold
        /// nothing pending is refused only when every slot is authenticated or its
        /// own address is at its share.
        #[test]
        fn caps_hold_and_only_the_heaviest_pending_are_evicted(
            steps in proptest::collection::vec(step(), 1..200),
            max in 4usize..24,
            per_peer in 1usize..6,
            per_prefix in 1usize..10,
        ) {
            let per_prefix = per_prefix.max(per_peer);
            let mut t: Table<u64> = Table::new(Caps { max, per_peer, per_prefix, per_identity: 5 });
            let mut live: Vec<u64> = Vec::new();
            let mut authed: Vec<u64> = Vec::new();
            for s in steps {
                match s {
                    Step::Admit(c, d) => {
                        let peer = v4(c, d);
                        let (mine, _) = t.held_by(peer);
                        let quiet = t.pending_of(peer.to_canonical(), Prefix::of(peer)) == 0
                            && t.held_by(peer).1 == 0;
                        let all_authed = t.pending() == 0;
                        match t.admit(peer, 0) {
                            Admitted::In { id, .. } => {
                                // The evicted one's handle is 0 for all; find it by
                                // what the table still holds.
                                live.retain(|x| t.entries.contains_key(x));
                                prop_assert!(authed.iter().all(|a| t.entries.contains_key(a)), "an authenticated one was evicted");
                                live.push(id);
                            }
                            Admitted::Refused(o) => {
                                prop_assert!(
                                    !quiet || mine >= per_peer || all_authed || o == Over::Peer,
                                    "a quiet newcomer was refused ({o:?})"
                                );
                            }
                        }
                    }
                    Step::Auth(i, u) => {
                        if let Some(id) = live.get(i % live.len().max(1)).copied() {
                            if t.authenticate(id, &format!("u{u}")).is_ok()
                                && t.entries.get(&id).is_some_and(|e| matches!(e.state, State::Authed(_)))
                                && !authed.contains(&id)
                            {
                                authed.push(id);
                            }
                        }
                    }
                    Step::Close(i) => {
                        if !live.is_empty() {
                            let id = live.remove(i % live.len());
                            t.release(id);
                            authed.retain(|a| *a != id);
                        }
                    }
                }
                prop_assert!(t.consistent());
                prop_assert!(t.open() <= max);
                prop_assert!(t.by_peer.values().all(|n| *n <= per_peer));
                prop_assert!(t.pending.values().all(|p| p.count <= per_prefix));
            }
        }
    }
}
