//! The credential services: `Enrollment` (a host trades a one-time token and a
//! signing request for its certificate; an enrolled host renews its own) and
//! `Admin` (user tokens, node enrollment and revocation). Every change is an
//! [`Input`] of the state machine, journaled; secrets are shown once and only their
//! hashes kept. Admins reach `Admin` over TLS with their token, or as root on
//! allotd's host through the admin socket (`allotd tokens …`, `allotd nodes …`).

use crate::api::Api;
use crate::serve::now;
use crate::state::{Ask, Input};
use allot_proto::v1 as pb;
use tonic::{Request, Response, Status};

/// A token's life unless asked otherwise: 90 days.
pub const TOKEN_TTL: u64 = 90 * 86_400;
/// The longest a token may live: two years.
pub const TOKEN_TTL_MAX: u64 = 2 * 365 * 86_400;
/// An enrollment token's life unless asked otherwise: one hour.
pub const ENROLL_TTL: u64 = 3_600;
/// The longest an enrollment token may wait: a week.
pub const ENROLL_TTL_MAX: u64 = 7 * 86_400;
/// Largest signing request accepted.
const MAX_CSR: usize = 16 * 1024;

fn internal(e: impl std::fmt::Display) -> Status {
    Status::internal(e.to_string())
}

fn ttl(asked: u64, default: u64, max: u64, field: &str) -> Result<u64, Status> {
    match asked {
        0 => Ok(default),
        t if t <= max => Ok(t),
        t => Err(Status::invalid_argument(format!(
            "{field}: {t} s is longer than the {max} s allowed; ask for less"
        ))),
    }
}

fn csr(pem: &str) -> Result<&str, Status> {
    if pem.len() > MAX_CSR || !pem.contains("CERTIFICATE REQUEST") {
        return Err(Status::invalid_argument(
            "csr_pem: not a PEM signing request (at most 16 KiB)",
        ));
    }
    Ok(pem)
}

impl Api {
    /// After a revocation or removal (`what`): the node's stream ends now and its
    /// reconnect is refused; returns its credential as it now stands.
    fn cut_off(&self, node: &str, by: &str, what: &str) -> pb::NodeCredentials {
        self.0.cut(node);
        tracing::warn!(node = %node, by = %by, "node {what}");
        let c = self.0.core();
        c.alloc
            .creds
            .nodes
            .get(node)
            .map(|n| node_cred_pb(node, n))
            .unwrap_or_else(|| pb::NodeCredentials {
                node: node.to_string(),
                state: what.to_string(),
                ..Default::default()
            })
    }

    /// Signs `csr_pem` for `node` and records the certificate.
    fn certify(&self, node: &str, csr_pem: &str) -> Result<pb::EnrollResponse, Status> {
        let pki = &self.0.pki;
        let issued = pki
            .ca
            .sign_node(csr(csr_pem)?, node, now(), allot_auth::pki::NODE_DAYS)
            .map_err(|e| Status::invalid_argument(format!("csr_pem: {e}")))?;
        self.0
            .commit(Input::NodeCertified {
                node: node.to_string(),
                fingerprint: issued.fingerprint.clone(),
                not_after: issued.not_after,
            })
            .map_err(internal)?;
        Ok(pb::EnrollResponse {
            node: node.to_string(),
            cert_pem: issued.cert_pem,
            ca_pem: pki.ca.cert_pem.clone(),
            not_after_unix: i64::try_from(issued.not_after).unwrap_or(i64::MAX),
        })
    }
}

#[tonic::async_trait]
impl pb::enrollment_server::Enrollment for Api {
    async fn enroll(
        &self,
        req: Request<pb::EnrollRequest>,
    ) -> Result<Response<pb::EnrollResponse>, Status> {
        let r = req.into_inner();
        let node = self
            .0
            .core()
            .alloc
            .creds
            .offered_node(&r.token, now())
            .map(str::to_string)
            .map_err(|e| Status::permission_denied(e.0))?;
        let out = self.certify(&node, &r.csr_pem)?;
        tracing::info!(node = %node, "node enrolled");
        Ok(Response::new(out))
    }

    async fn renew(
        &self,
        req: Request<pb::RenewRequest>,
    ) -> Result<Response<pb::EnrollResponse>, Status> {
        let node = match self.who(&req)? {
            crate::state::Who::Node(n) => n,
            other => {
                return Err(Status::permission_denied(format!(
                    "{} is not a node: only an enrolled node renews its certificate",
                    other.name()
                )))
            }
        };
        self.check(&crate::state::Who::Node(node.clone()), Ask::Renew(&node))?;
        Ok(Response::new(self.certify(&node, &req.get_ref().csr_pem)?))
    }
}

fn token_pb(t: &crate::state::TokenRec) -> pb::TokenInfo {
    pb::TokenInfo {
        id: t.id.clone(),
        user: t.user.clone(),
        created_unix: i64::try_from(t.created).unwrap_or(0),
        expires_unix: i64::try_from(t.expires).unwrap_or(i64::MAX),
        revoked: t.revoked,
        created_by: t.by.clone(),
        note: t.note.clone(),
    }
}

fn node_cred_pb(name: &str, n: &crate::state::NodeCred) -> pb::NodeCredentials {
    let state = if n.removed {
        "removed"
    } else if n.revoked {
        "revoked"
    } else if !n.certs.is_empty() {
        "enrolled"
    } else {
        "pending"
    };
    pb::NodeCredentials {
        node: name.to_string(),
        state: state.into(),
        not_after_unix: n
            .certs
            .last()
            .map_or(0, |(_, t)| i64::try_from(*t).unwrap_or(i64::MAX)),
        by: n.by.clone(),
    }
}

#[tonic::async_trait]
impl pb::admin_server::Admin for Api {
    async fn create_token(
        &self,
        req: Request<pb::CreateTokenRequest>,
    ) -> Result<Response<pb::CreateTokenResponse>, Status> {
        let who = self.allow(&req, Ask::Admin)?;
        let r = req.into_inner();
        crate::api::safe_name("user", &r.user)?;
        allot_common::fields::check_text("note", &r.note, 1024)
            .map_err(|e| Status::invalid_argument(e.to_string()))?;
        let ttl = ttl(r.ttl_s, TOKEN_TTL, TOKEN_TTL_MAX, "ttl_s")?;
        let secret = allot_auth::new_secret("allot").map_err(internal)?;
        let hash = allot_auth::hash_secret(&secret);
        let id = format!("t-{}", &hash[..10]);
        let expires = now() + ttl;
        self.0
            .commit(Input::TokenCreated {
                id: id.clone(),
                user: r.user.clone(),
                hash,
                expires,
                by: who.name(),
                note: r.note,
            })
            .map_err(internal)?;
        Ok(Response::new(pb::CreateTokenResponse {
            id,
            token: secret,
            expires_unix: i64::try_from(expires).unwrap_or(i64::MAX),
        }))
    }

    async fn list_tokens(
        &self,
        req: Request<pb::ListTokensRequest>,
    ) -> Result<Response<pb::ListTokensResponse>, Status> {
        self.allow(&req, Ask::Admin)?;
        let tokens = self
            .0
            .core()
            .alloc
            .creds
            .tokens
            .values()
            .map(token_pb)
            .collect();
        Ok(Response::new(pb::ListTokensResponse { tokens }))
    }

    async fn revoke_token(
        &self,
        req: Request<pb::RevokeTokenRequest>,
    ) -> Result<Response<pb::TokenInfo>, Status> {
        let who = self.allow(&req, Ask::Admin)?;
        let id = req.into_inner().id;
        crate::api::safe_name("id", &id)?;
        if !self.0.core().alloc.creds.tokens.contains_key(&id) {
            return Err(Status::not_found(format!(
                "id: no token {id:?}; `allotd tokens list` shows them"
            )));
        }
        self.0
            .commit(Input::TokenRevoked {
                id: id.clone(),
                by: who.name(),
            })
            .map_err(internal)?;
        let c = self.0.core();
        let t = c.alloc.creds.tokens.get(&id).map(token_pb);
        t.map(Response::new).ok_or_else(|| Status::not_found(id))
    }

    async fn enroll_node(
        &self,
        req: Request<pb::EnrollNodeRequest>,
    ) -> Result<Response<pb::EnrollNodeResponse>, Status> {
        let who = self.allow(&req, Ask::Admin)?;
        let r = req.into_inner();
        crate::api::safe_name("node", &r.node)?;
        let ttl = ttl(r.ttl_s, ENROLL_TTL, ENROLL_TTL_MAX, "ttl_s")?;
        let secret = allot_auth::new_secret("allot-enroll").map_err(internal)?;
        let expires = now() + ttl;
        self.0
            .commit(Input::NodeOffered {
                node: r.node.clone(),
                hash: allot_auth::hash_secret(&secret),
                expires,
                by: who.name(),
            })
            .map_err(internal)?;
        Ok(Response::new(pb::EnrollNodeResponse {
            token: secret,
            expires_unix: i64::try_from(expires).unwrap_or(i64::MAX),
            ca_pem: self.0.pki.ca.cert_pem.clone(),
        }))
    }

    async fn revoke_node(
        &self,
        req: Request<pb::RevokeNodeRequest>,
    ) -> Result<Response<pb::NodeCredentials>, Status> {
        let who = self.allow(&req, Ask::Admin)?;
        let node = req.into_inner().node;
        crate::api::safe_name("node", &node)?;
        if !self.0.core().alloc.creds.nodes.contains_key(&node) {
            return Err(Status::not_found(format!(
                "node: {node:?} was never enrolled; `allotd nodes list` shows them"
            )));
        }
        self.0
            .commit(Input::NodeRevoked {
                node: node.clone(),
                by: who.name(),
            })
            .map_err(internal)?;
        Ok(Response::new(self.cut_off(&node, &who.name(), "revoked")))
    }

    async fn remove_node(
        &self,
        req: Request<pb::RemoveNodeRequest>,
    ) -> Result<Response<pb::NodeCredentials>, Status> {
        let who = self.allow(&req, Ask::Admin)?;
        let node = req.into_inner().node;
        crate::api::safe_name("node", &node)?;
        {
            let c = self.0.core();
            if !c.alloc.creds.nodes.contains_key(&node) && !c.alloc.nodes().contains_key(&node) {
                return Err(Status::not_found(format!(
                    "node: {node:?} is not in the cluster; `allotd nodes list` shows them"
                )));
            }
            let leases = c.alloc.leases_on(&node).len() + c.alloc.leaving_on(&node).len();
            if leases > 0 {
                return Err(Status::failed_precondition(format!(
                    "node: {node:?} still runs {leases} lease(s); drain it (`allot nodes drain {node} --reason TEXT --now`) and wait for its work to end, or for it to be declared lost, then remove it"
                )));
            }
        }
        self.0
            .commit(Input::NodeRemoved {
                node: node.clone(),
                by: who.name(),
            })
            .map_err(|e| Status::failed_precondition(e.to_string()))?;
        Ok(Response::new(self.cut_off(&node, &who.name(), "removed")))
    }

    async fn list_node_credentials(
        &self,
        req: Request<pb::ListNodeCredentialsRequest>,
    ) -> Result<Response<pb::ListNodeCredentialsResponse>, Status> {
        self.allow(&req, Ask::Admin)?;
        let nodes = self
            .0
            .core()
            .alloc
            .creds
            .nodes
            .iter()
            .map(|(name, n)| node_cred_pb(name, n))
            .collect();
        Ok(Response::new(pb::ListNodeCredentialsResponse { nodes }))
    }
}
