//! The host's identity towards allotd: a key made here (it never leaves the host),
//! a certificate for the host's name signed by the cluster CA, and that CA, in
//! `STATE_DIR/pki/` (`node.key` 0600, `node.pem`, `ca.pem`). `allot-agent enroll`
//! gets the first certificate with a one-time token; the uplink renews it over its
//! own mTLS connection once two thirds of its life have passed.

use allot_auth::CertInfo;
use allot_proto::v1 as pb;
use std::path::{Path, PathBuf};
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity};

/// Why the host's credentials could not be made, read or used.
#[derive(Debug, thiserror::Error)]
pub enum CredError {
    /// A file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// Why.
        source: std::io::Error,
    },
    /// The host is not enrolled.
    #[error("not enrolled: no certificate in {0}; run `allot-agent enroll --server URL --token TOKEN` (an admin prints the token with `allotd nodes enroll NAME`)")]
    NotEnrolled(String),
    /// A key, request or certificate was malformed.
    #[error(transparent)]
    Pki(#[from] allot_auth::PkiError),
    /// allotd could not be reached or refused.
    #[error("{0}")]
    Remote(String),
    /// The allocator address cannot be used.
    #[error("allocator address {0:?}: {1}")]
    Address(String, String),
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> CredError + '_ {
    move |source| CredError::Io {
        path: path.display().to_string(),
        source,
    }
}

/// The host's credentials, loaded.
#[derive(Clone)]
pub struct Credentials {
    /// The cluster CA, PEM.
    pub ca_pem: String,
    /// The host's certificate, PEM.
    pub cert_pem: String,
    /// The host's key, PEM.
    pub key_pem: String,
    /// What the certificate says.
    pub info: CertInfo,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Credentials({})", self.info.common_name)
    }
}

/// Where the credentials live.
pub fn dir(state_dir: &Path) -> PathBuf {
    state_dir.join("pki")
}

fn write(path: &Path, text: &str, secret: bool) -> Result<(), CredError> {
    allot_common::files::write_atomic(path, text, if secret { 0o600 } else { 0o644 })
        .map_err(io(path))
}

fn read(path: &Path) -> Result<String, CredError> {
    std::fs::read_to_string(path).map_err(io(path))
}

impl Credentials {
    /// Loads them from `STATE_DIR/pki`.
    pub fn load(state_dir: &Path) -> Result<Credentials, CredError> {
        let d = dir(state_dir);
        if !d.join("node.pem").exists() {
            return Err(CredError::NotEnrolled(d.display().to_string()));
        }
        let cert_pem = read(&d.join("node.pem"))?;
        Ok(Credentials {
            ca_pem: read(&d.join("ca.pem"))?,
            key_pem: read(&d.join("node.key"))?,
            info: CertInfo::from_pem(&cert_pem)?,
            cert_pem,
        })
    }

    /// Stores a key with the certificate allotd signed for it (the key first: a
    /// certificate is never on disk without its key).
    fn store(
        state_dir: &Path,
        key_pem: &str,
        r: &pb::EnrollResponse,
    ) -> Result<Credentials, CredError> {
        let d = dir(state_dir);
        std::fs::create_dir_all(&d).map_err(io(&d))?;
        write(&d.join("ca.pem"), &r.ca_pem, false)?;
        write(&d.join("node.key"), key_pem, true)?;
        write(&d.join("node.pem"), &r.cert_pem, false)?;
        Credentials::load(state_dir)
    }

    /// Whether two thirds of the certificate's life have passed at `now`.
    pub fn renewal_due(&self, now: u64) -> bool {
        let life = allot_auth::pki::NODE_DAYS * 86_400;
        now + life / 3 >= self.info.not_after
    }

    /// An endpoint to allotd at `addr` that proves this host with its certificate.
    pub fn endpoint(&self, addr: &str) -> Result<Endpoint, CredError> {
        // Pings find a stream cut off in the network (nothing closes it), so that
        // the agent reconnects once the way is open again; a connect into a cut
        // network gives up and is tried again.
        Ok(endpoint(addr, &self.ca_pem, Some(self))?
            .http2_keep_alive_interval(std::time::Duration::from_secs(10))
            .keep_alive_timeout(std::time::Duration::from_secs(10))
            .keep_alive_while_idle(true)
            .connect_timeout(std::time::Duration::from_secs(10)))
    }
}

/// An endpoint to allotd: TLS checked against `ca_pem`, with the host's identity
/// when it has one. `http://` is accepted for a loopback allotd only (its
/// `plaintext_loopback` baseline).
pub fn endpoint(addr: &str, ca_pem: &str, me: Option<&Credentials>) -> Result<Endpoint, CredError> {
    let bad = |why: &str| CredError::Address(addr.to_string(), why.to_string());
    let (https, host) = check_allocator(addr).map_err(|why| bad(&why))?;
    let e = Endpoint::from_shared(addr.to_string()).map_err(|e| bad(&e.to_string()))?;
    match https {
        true => {
            let mut tls = ClientTlsConfig::new()
                .ca_certificate(Certificate::from_pem(ca_pem))
                .domain_name(host.trim_start_matches('[').trim_end_matches(']'));
            if let Some(c) = me {
                tls = tls.identity(Identity::from_pem(&c.cert_pem, &c.key_pem));
            }
            e.tls_config(tls).map_err(|e| bad(&e.to_string()))
        }
        false => Ok(e),
    }
}

/// Whether the agent may talk to allotd at `addr` (a scheme given): `https://`, or
/// plain `http://` to a loopback allotd only. Returns whether it is TLS, and the host.
pub fn check_allocator(addr: &str) -> Result<(bool, String), String> {
    let uri: tonic::transport::Uri = addr.parse().map_err(|_| "not a URL".to_string())?;
    let host = uri.host().ok_or("no host")?.to_string();
    match uri.scheme_str() {
        Some("https") => Ok((true, host)),
        Some("http") if allot_common::net::is_loopback_host(&host) => Ok((false, host)),
        Some("http") => Err("plain http is for a loopback allotd only; use https://".into()),
        _ => Err("use https://HOST:PORT".into()),
    }
}

/// The address as the agent uses it: a scheme added when missing (https).
pub fn with_scheme(addr: &str) -> String {
    if addr.contains("://") {
        addr.to_string()
    } else {
        format!("https://{addr}")
    }
}

/// `allot-agent enroll`: a new key, its certificate from allotd for the token's
/// node name, and the CA, stored in `STATE_DIR/pki`.
pub async fn enroll(
    server: &str,
    token: &str,
    ca_pem: &str,
    state_dir: &Path,
    host: &str,
) -> Result<Credentials, CredError> {
    let (key_pem, csr_pem) = allot_auth::pki::node_request(host)?;
    let server = with_scheme(server);
    let ch = endpoint(&server, ca_pem, None)?
        .connect()
        .await
        .map_err(|e| {
            CredError::Remote(format!(
                "cannot reach allotd at {server}: {}",
                root_cause(&e)
            ))
        })?;
    let r = pb::enrollment_client::EnrollmentClient::new(ch)
        .enroll(pb::EnrollRequest {
            token: token.trim().to_string(),
            csr_pem,
        })
        .await
        .map_err(|e| CredError::Remote(format!("allotd refused the enrollment: {}", e.message())))?
        .into_inner();
    Credentials::store(state_dir, &key_pem, &r)
}

/// Renews the certificate over an mTLS channel; the new one is stored and returned.
pub async fn renew(
    ch: tonic::transport::Channel,
    state_dir: &Path,
    me: &Credentials,
) -> Result<Credentials, CredError> {
    let (key_pem, csr_pem) = allot_auth::pki::node_request(&me.info.common_name)?;
    let r = pb::enrollment_client::EnrollmentClient::new(ch)
        .renew(pb::RenewRequest { csr_pem })
        .await
        .map_err(|e| CredError::Remote(format!("allotd refused the renewal: {}", e.message())))?
        .into_inner();
    Credentials::store(state_dir, &key_pem, &r)
}

/// The innermost cause of an error (tonic's own text says only "transport error").
pub fn root_cause(e: &(dyn std::error::Error + 'static)) -> String {
    let mut cur = e;
    while let Some(next) = cur.source() {
        cur = next;
    }
    cur.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn creds(not_after: u64) -> Credentials {
        Credentials {
            ca_pem: String::new(),
            cert_pem: String::new(),
            key_pem: String::new(),
            info: CertInfo {
                common_name: "node-1".into(),
                not_after,
                fingerprint: String::new(),
            },
        }
    }

    #[test]
    fn renewal_is_due_once_two_thirds_of_the_life_have_passed() {
        let life = allot_auth::pki::NODE_DAYS * 86_400;
        let issued = 1_800_000_000;
        let c = creds(issued + life);
        assert!(!c.renewal_due(issued));
        assert!(!c.renewal_due(issued + life * 2 / 3 - 1));
        assert!(c.renewal_due(issued + life * 2 / 3));
        assert!(c.renewal_due(issued + life + 1));
    }

    #[test]
    fn plain_http_reaches_a_loopback_allotd_only() {
        let ca = allot_auth::Ca::create("t", 1_800_000_000).expect("CA");
        assert!(endpoint("http://127.0.0.1:7070", &ca.cert_pem, None).is_ok());
        assert!(endpoint("http://[::1]:7070", &ca.cert_pem, None).is_ok());
        let e = endpoint("http://allotd.example:7070", &ca.cert_pem, None)
            .expect_err("refused")
            .to_string();
        assert!(e.contains("use https://"), "{e}");
        assert!(endpoint("https://allotd.example:7070", &ca.cert_pem, None).is_ok());
        assert!(endpoint("ftp://x:1", &ca.cert_pem, None).is_err());
        assert_eq!(with_scheme("allotd:7070"), "https://allotd:7070");
    }

    #[test]
    fn a_host_that_never_enrolled_is_told_how() {
        let dir = std::env::temp_dir().join(format!("allot-creds-{}", std::process::id()));
        let e = Credentials::load(&dir)
            .expect_err("not enrolled")
            .to_string();
        assert!(e.contains("allot-agent enroll"), "{e}");
    }
}
