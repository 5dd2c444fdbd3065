//! Credentials allotd issued: user tokens and node enrollment (offers, certificates,
//! revocations). Journaled like everything else, so a restart (or a second allotd
//! later) knows them; only hashes and fingerprints are kept, never a secret.

use allot_fairshare::Time;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// A user token.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct TokenRec {
    /// Its id (`t1`, `t2` …): what `allotd tokens list|revoke` name.
    pub id: String,
    /// Whom it proves.
    pub user: String,
    /// SHA-256 of the secret.
    pub hash: String,
    /// Created, Unix s.
    pub created: Time,
    /// Expires, Unix s.
    pub expires: Time,
    /// Revoked.
    pub revoked: bool,
    /// Who created it.
    pub by: String,
    /// The creator's note.
    pub note: String,
}

/// A node's credentials.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct NodeCred {
    /// An enrollment token not used yet: its hash and expiry.
    pub offer: Option<(String, Time)>,
    /// Fingerprints of the certificates it may connect with (the newest and the
    /// one it renewed from, so a renewal never cuts a session), with their expiry.
    pub certs: Vec<(String, Time)>,
    /// Revoked: refused from now on, whatever certificate it shows.
    pub revoked: bool,
    /// Removed from the cluster (and revoked) until enrolled again.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub removed: bool,
    /// Who enrolled or revoked it last.
    pub by: String,
}

/// Every credential allotd issued.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct Creds {
    /// User tokens by id.
    pub tokens: BTreeMap<String, TokenRec>,
    /// Nodes by name.
    pub nodes: BTreeMap<String, NodeCred>,
}

/// Why a credential was not accepted: said to the caller as is.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Rejected(pub String);

impl Creds {
    /// The user a token secret proves at `now`.
    pub fn user_of(&self, secret: &str, now: Time) -> Result<&str, Rejected> {
        self.token_of(secret, now).map(|t| t.user.as_str())
    }

    /// Whether token `id` still proves its user at `now` (a web session opened
    /// with it ends when it is revoked or expires).
    pub fn token_live(&self, id: &str, now: Time) -> bool {
        self.tokens
            .get(id)
            .is_some_and(|t| !t.revoked && t.expires > now)
    }

    /// The token a secret is, valid at `now`.
    pub fn token_of(&self, secret: &str, now: Time) -> Result<&TokenRec, Rejected> {
        let hash = allot_auth::hash_secret(secret);
        // Every token is compared, so the time taken says nothing about which matched.
        let mut found = None;
        for t in self.tokens.values() {
            if allot_auth::same_hash(&t.hash, &hash) {
                found = Some(t);
            }
        }
        let t = found.ok_or_else(|| {
            Rejected("token: not a token of this allotd; ask an admin for one (`allotd tokens create --user NAME`)".into())
        })?;
        if t.revoked {
            return Err(Rejected(format!(
                "token: {} was revoked; ask an admin for a new one",
                t.id
            )));
        }
        if t.expires <= now {
            return Err(Rejected(format!(
                "token: {} expired at {}; ask an admin for a new one",
                t.id, t.expires
            )));
        }
        Ok(t)
    }

    /// The node an enrollment token secret was offered to at `now`.
    pub fn offered_node(&self, secret: &str, now: Time) -> Result<&str, Rejected> {
        let hash = allot_auth::hash_secret(secret);
        let mut found = None;
        for (name, n) in &self.nodes {
            if let Some((h, expires)) = &n.offer {
                if allot_auth::same_hash(h, &hash) {
                    found = Some((name, *expires, n.revoked));
                }
            }
        }
        match found {
            None => Err(Rejected("token: not an enrollment token of this allotd, or already used; ask for a new one (`allotd nodes enroll NAME`)".into())),
            Some((_, expires, _)) if expires <= now => Err(Rejected(format!(
                "token: expired at {expires}; ask for a new one (`allotd nodes enroll NAME`)"
            ))),
            Some((name, _, _)) => Ok(name),
        }
    }

    /// Whether node `name` may connect with the certificate of `fingerprint`.
    pub fn node_may_connect(
        &self,
        name: &str,
        fingerprint: &str,
        now: Time,
    ) -> Result<(), Rejected> {
        let n = self.nodes.get(name).ok_or_else(|| {
            Rejected(format!(
                "node {name:?} is not enrolled here; enroll it (`allotd nodes enroll {name}` prints the token)"
            ))
        })?;
        if n.revoked {
            return Err(Rejected(format!(
                "node {name:?} was revoked by {}; enroll it again to readmit it",
                n.by
            )));
        }
        if n.certs
            .iter()
            .any(|(f, exp)| *exp > now && allot_auth::same_hash(f, fingerprint))
        {
            Ok(())
        } else {
            Err(Rejected(format!(
                "node {name:?}: this certificate is not (or no longer) the node's; enroll it again (`allotd nodes enroll {name}`)"
            )))
        }
    }
}
