//! Browser sessions: a login exchanges a token for a random session id (the
//! cookie) and a CSRF secret (in every form). Kept in memory, by the hash of the
//! id, so a restart of allotd logs every browser out and nothing on disk can be
//! replayed. Capped in all and per user; a session lives until `ttl` after its
//! login or its token's end, whichever is first, and dies with its token.

use allot_fairshare::Time;
use std::collections::HashMap;
use std::sync::Mutex;

/// Most sessions at once; the oldest goes first.
pub const MAX_SESSIONS: usize = 10_000;
/// Most sessions one user holds (browsers, machines); their oldest goes first.
pub const PER_USER: usize = 16;

/// One logged-in browser.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Session {
    /// Whom the token proved.
    pub user: String,
    /// The token it was opened with (`t3`): revoking it ends the session.
    pub token_id: String,
    /// What every form of this session carries.
    pub csrf: String,
    /// When it was opened.
    pub opened: Time,
    /// When it ends.
    pub expires: Time,
    /// Its place in the order of logins: of two opened in one second, the
    /// older goes first.
    pub seq: u64,
}

/// The sessions allotd holds.
#[derive(Debug)]
pub struct Sessions {
    by_hash: Mutex<HashMap<String, Session>>,
    ttl: u64,
    next: std::sync::atomic::AtomicU64,
}

impl Sessions {
    /// No sessions; each lasts at most `ttl` seconds.
    pub fn new(ttl: u64) -> Sessions {
        Sessions {
            by_hash: Mutex::new(HashMap::new()),
            ttl,
            next: std::sync::atomic::AtomicU64::new(0),
        }
    }

    /// Opens a session for `user` proven by token `token_id` (which ends at
    /// `token_expires`): its id, for the cookie, and the session.
    pub fn open(
        &self,
        user: &str,
        token_id: &str,
        token_expires: Time,
        now: Time,
    ) -> Result<(String, Session), String> {
        let random = |p: &str| allot_auth::new_secret(p).map_err(|e| format!("no randomness: {e}"));
        let id = random("allot-web")?;
        let csrf = random("csrf")?;
        let s = Session {
            user: user.to_string(),
            token_id: token_id.to_string(),
            csrf,
            opened: now,
            expires: (now + self.ttl).min(token_expires),
            seq: self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
        };
        let mut map = self.by_hash.lock().unwrap_or_else(|e| e.into_inner());
        map.retain(|_, s| s.expires > now);
        let mut mine: Vec<(u64, String)> = map
            .iter()
            .filter(|(_, s)| s.user == user)
            .map(|(h, s)| (s.seq, h.clone()))
            .collect();
        mine.sort();
        for (_, h) in mine.iter().take((mine.len() + 1).saturating_sub(PER_USER)) {
            map.remove(h);
        }
        if map.len() >= MAX_SESSIONS {
            if let Some(h) = map
                .iter()
                .min_by_key(|(_, s)| s.seq)
                .map(|(h, _)| h.clone())
            {
                map.remove(&h);
            }
        }
        map.insert(allot_auth::hash_secret(&id), s.clone());
        Ok((id, s))
    }

    /// The live session with this id.
    pub fn get(&self, id: &str, now: Time) -> Option<Session> {
        let map = self.by_hash.lock().unwrap_or_else(|e| e.into_inner());
        map.get(&allot_auth::hash_secret(id))
            .filter(|s| s.expires > now)
            .cloned()
    }

    /// Ends the session with this id (a logout, or its token is gone).
    pub fn close(&self, id: &str) {
        let mut map = self.by_hash.lock().unwrap_or_else(|e| e.into_inner());
        map.remove(&allot_auth::hash_secret(id));
    }

    /// How many are open.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.by_hash.lock().unwrap_or_else(|e| e.into_inner()).len()
    }
}

/// Failed logins by address, in fixed windows: past `most` in one, an address
/// waits for the window's end. Bounded: at most [`MAX_SESSIONS`] addresses are
/// kept, the stalest forgotten first.
#[derive(Debug)]
pub struct LoginTries {
    most: u32,
    window: u64,
    by_ip: Mutex<HashMap<std::net::IpAddr, (Time, u32)>>,
}

impl LoginTries {
    /// At most `most` failures per `window` seconds from one address.
    pub fn new(most: u32, window: u64) -> LoginTries {
        LoginTries {
            most,
            window,
            by_ip: Mutex::new(HashMap::new()),
        }
    }

    /// Seconds `ip` must wait before it may try again, if it must.
    pub fn wait(&self, ip: std::net::IpAddr, now: Time) -> Option<u64> {
        let map = self.by_ip.lock().unwrap_or_else(|e| e.into_inner());
        let (since, n) = map.get(&ip.to_canonical())?;
        let ends = since + self.window;
        (*n >= self.most && now < ends).then(|| ends - now)
    }

    /// `ip` failed a login.
    pub fn failed(&self, ip: std::net::IpAddr, now: Time) {
        let mut map = self.by_ip.lock().unwrap_or_else(|e| e.into_inner());
        let window = self.window;
        if map.len() >= MAX_SESSIONS {
            map.retain(|_, (since, _)| since.saturating_add(window) > now);
        }
        if map.len() >= MAX_SESSIONS {
            if let Some(stalest) = map.iter().min_by_key(|(_, v)| v.0).map(|(k, _)| *k) {
                map.remove(&stalest);
            }
        }
        let e = map.entry(ip.to_canonical()).or_insert((now, 0));
        if e.0 + window <= now {
            *e = (now, 0);
        }
        e.1 += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_address_past_its_failed_logins_waits_for_the_window_and_others_do_not() {
        let t = LoginTries::new(3, 60);
        let a: std::net::IpAddr = "10.0.0.7".parse().expect("ip");
        let b: std::net::IpAddr = "10.0.0.8".parse().expect("ip");
        for i in 0..3 {
            assert_eq!(t.wait(a, 1000 + i), None, "try {i}");
            t.failed(a, 1000 + i);
        }
        assert_eq!(t.wait(a, 1010), Some(50));
        assert_eq!(t.wait(b, 1010), None, "another address is not held back");
        assert_eq!(t.wait(a, 1060), None, "the window is over");
        t.failed(a, 1060);
        assert_eq!(t.wait(a, 1061), None, "a new window counts anew");
    }

    #[test]
    fn a_session_is_found_by_its_id_until_it_expires_and_not_after_logout() {
        let s = Sessions::new(3600);
        let (id, a) = s.open("ana", "t1", 10_000, 1000).expect("random");
        assert_eq!(s.get(&id, 1000), Some(a.clone()));
        assert_eq!(a.expires, 4600);
        assert_eq!(s.get(&id, 4600), None, "expired");
        assert_eq!(s.get("allot-web_forged", 1000), None);
        s.close(&id);
        assert_eq!(s.get(&id, 1000), None);
    }

    #[test]
    fn a_session_ends_with_its_token_and_ids_and_csrf_are_fresh() {
        let s = Sessions::new(3600);
        let (id1, a) = s.open("ana", "t1", 1500, 1000).expect("random");
        let (id2, b) = s.open("ana", "t1", 1500, 1000).expect("random");
        assert_eq!(a.expires, 1500);
        assert_ne!(id1, id2);
        assert_ne!(a.csrf, b.csrf);
        assert_ne!(a.csrf, id1);
    }

    #[test]
    fn one_user_holds_at_most_per_user_and_loses_the_oldest() {
        let s = Sessions::new(3600);
        // All in one second: age is the order of logins, not the ids' hashes.
        let ids: Vec<String> = (0..PER_USER + 3)
            .map(|_| s.open("ana", "t1", u64::MAX, 1000).expect("random").0)
            .collect();
        let other = s.open("bo", "t2", u64::MAX, 1000).expect("random").0;
        assert_eq!(s.len(), PER_USER + 1);
        for (i, id) in ids.iter().enumerate() {
            assert_eq!(s.get(id, 1100).is_some(), i >= 3, "login {i}");
        }
        assert!(s.get(&ids[ids.len() - 1], 1100).is_some());
        assert!(s.get(&other, 1100).is_some(), "another user's stays");
    }
}
