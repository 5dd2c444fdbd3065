//! The cluster CA: allotd's certificate and every node's are signed by it, and both
//! sides of a connection check the other's against it. A node's key never leaves
//! the node: the agent sends a signing request, and allotd signs the public key in
//! it for the node name that the enrollment token was made for (never a name from
//! the request).

use rcgen::{
    BasicConstraints, CertificateParams, CertificateSigningRequestParams, DistinguishedName,
    DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, KeyUsagePurpose,
};
use sha2::{Digest, Sha256};

/// Why a certificate could not be made, read or checked.
#[derive(Debug, thiserror::Error)]
pub enum PkiError {
    /// rcgen refused (a malformed key, request or name).
    #[error("{what}: {source}")]
    Rcgen {
        /// What was being done.
        what: &'static str,
        /// Why.
        source: rcgen::Error,
    },
    /// Not a PEM certificate.
    #[error("{what}: not a PEM certificate ({why})")]
    Parse {
        /// Which certificate.
        what: &'static str,
        /// Why.
        why: String,
    },
    /// A time outside what a certificate can carry.
    #[error("time {0} is out of range for a certificate")]
    Time(u64),
}

fn rc(what: &'static str) -> impl FnOnce(rcgen::Error) -> PkiError {
    move |source| PkiError::Rcgen { what, source }
}

/// How long the CA is valid: ten years (replacing it means re-enrolling every node).
pub const CA_DAYS: u64 = 3650;
/// How long allotd's own certificate is valid.
pub const SERVER_DAYS: u64 = 825;
/// How long a node certificate is valid; agents renew after two thirds of it.
pub const NODE_DAYS: u64 = 30;
/// What the CA calls itself.
const CA_NAME: &str = "allot cluster CA";

fn at(unix: u64) -> Result<time::OffsetDateTime, PkiError> {
    i64::try_from(unix)
        .ok()
        .and_then(|s| time::OffsetDateTime::from_unix_timestamp(s).ok())
        .ok_or(PkiError::Time(unix))
}

/// Sets validity from an hour before `now` (clock skew between hosts) for `days`.
fn validity(p: &mut CertificateParams, now: u64, days: u64) -> Result<(), PkiError> {
    p.not_before = at(now.saturating_sub(3600))?;
    p.not_after = at(now.saturating_add(days.saturating_mul(86_400)))?;
    Ok(())
}

fn serial(p: &mut CertificateParams) -> Result<(), PkiError> {
    let mut s = [0u8; 16];
    getrandom::fill(&mut s).map_err(|e| PkiError::Parse {
        what: "serial number",
        why: e.to_string(),
    })?;
    s[0] &= 0x7f; // positive
    p.serial_number = Some(rcgen::SerialNumber::from_slice(&s));
    Ok(())
}

/// The cluster CA: its certificate and key, in PEM.
#[derive(Clone)]
pub struct Ca {
    /// The CA certificate (public: nodes and clients trust it).
    pub cert_pem: String,
    /// The CA key (secret: 0600, allotd's user only).
    pub key_pem: String,
}

impl std::fmt::Debug for Ca {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Ca { key: <secret> }")
    }
}

/// A certificate just signed.
#[derive(Debug, Clone)]
pub struct Issued {
    /// The certificate, PEM.
    pub cert_pem: String,
    /// Its SHA-256 over the DER, hex: what allotd records to know it again.
    pub fingerprint: String,
    /// When it expires (Unix seconds).
    pub not_after: u64,
}

impl Ca {
    /// A new CA for `cluster`, valid from `now` for [`CA_DAYS`].
    pub fn create(cluster: &str, now: u64) -> Result<Ca, PkiError> {
        let key = KeyPair::generate().map_err(rc("CA key"))?;
        let mut p = CertificateParams::default();
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, format!("{CA_NAME} ({cluster})"));
        p.distinguished_name = dn;
        p.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        p.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        validity(&mut p, now, CA_DAYS)?;
        serial(&mut p)?;
        let cert = p.self_signed(&key).map_err(rc("CA certificate"))?;
        Ok(Ca {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        })
    }

    /// The CA from its PEM files' contents.
    pub fn from_pem(cert_pem: &str, key_pem: &str) -> Result<Ca, PkiError> {
        let ca = Ca {
            cert_pem: cert_pem.to_string(),
            key_pem: key_pem.to_string(),
        };
        ca.issuer()?;
        Ok(ca)
    }

    fn issuer(&self) -> Result<Issuer<'static, KeyPair>, PkiError> {
        let key = KeyPair::from_pem(&self.key_pem).map_err(rc("CA key"))?;
        Issuer::from_ca_cert_pem(&self.cert_pem, key).map_err(rc("CA certificate"))
    }

    /// allotd's certificate, for `names` (DNS names or IP addresses): its PEM and a
    /// new key's PEM.
    pub fn issue_server(&self, names: &[String], now: u64) -> Result<(Issued, String), PkiError> {
        let key = KeyPair::generate().map_err(rc("server key"))?;
        let mut p = CertificateParams::new(names.to_vec()).map_err(rc("server names"))?;
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, "allotd");
        p.distinguished_name = dn;
        p.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        p.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        validity(&mut p, now, SERVER_DAYS)?;
        serial(&mut p)?;
        let cert = p
            .signed_by(&key, &self.issuer()?)
            .map_err(rc("server certificate"))?;
        Ok((issued(cert.pem(), cert.der())?, key.serialize_pem()))
    }

    /// Signs the key in `csr_pem` as node `node`'s client certificate for `days`.
    /// Only the request's public key is used (its proof of possession is checked);
    /// the name comes from the caller, never from the request.
    pub fn sign_node(
        &self,
        csr_pem: &str,
        node: &str,
        now: u64,
        days: u64,
    ) -> Result<Issued, PkiError> {
        let csr =
            CertificateSigningRequestParams::from_pem(csr_pem).map_err(rc("signing request"))?;
        let mut p = CertificateParams::default();
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, node);
        dn.push(DnType::OrganizationalUnitName, "allot node");
        p.distinguished_name = dn;
        p.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        p.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        validity(&mut p, now, days)?;
        serial(&mut p)?;
        let cert = p
            .signed_by(&csr.public_key, &self.issuer()?)
            .map_err(rc("node certificate"))?;
        issued(cert.pem(), cert.der())
    }
}

fn issued(cert_pem: String, der: &[u8]) -> Result<Issued, PkiError> {
    let info = CertInfo::from_der(der)?;
    Ok(Issued {
        cert_pem,
        fingerprint: fingerprint(der),
        not_after: info.not_after,
    })
}

/// A node's new key and its signing request, both PEM (the key stays on the node).
pub fn node_request(node: &str) -> Result<(String, String), PkiError> {
    let key = KeyPair::generate().map_err(rc("node key"))?;
    let mut p = CertificateParams::default();
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, node);
    p.distinguished_name = dn;
    let csr = p.serialize_request(&key).map_err(rc("signing request"))?;
    Ok((
        key.serialize_pem(),
        csr.pem().map_err(rc("signing request"))?,
    ))
}

/// SHA-256 over a certificate's DER, hex.
pub fn fingerprint(der: &[u8]) -> String {
    Sha256::digest(der)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// What allot reads from a certificate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertInfo {
    /// Its subject's common name: a node certificate's node.
    pub common_name: String,
    /// When it expires (Unix seconds).
    pub not_after: u64,
    /// SHA-256 over the DER, hex.
    pub fingerprint: String,
}

impl CertInfo {
    /// Reads a DER certificate.
    pub fn from_der(der: &[u8]) -> Result<CertInfo, PkiError> {
        let (_, cert) = x509_parser::parse_x509_certificate(der).map_err(|e| PkiError::Parse {
            what: "certificate",
            why: e.to_string(),
        })?;
        let common_name = cert
            .subject()
            .iter_common_name()
            .next()
            .and_then(|cn| cn.as_str().ok())
            .unwrap_or_default()
            .to_string();
        Ok(CertInfo {
            common_name,
            not_after: u64::try_from(cert.validity().not_after.timestamp()).unwrap_or(0),
            fingerprint: fingerprint(der),
        })
    }

    /// Reads the first certificate of a PEM text.
    pub fn from_pem(pem: &str) -> Result<CertInfo, PkiError> {
        let (_, p) =
            x509_parser::pem::parse_x509_pem(pem.as_bytes()).map_err(|e| PkiError::Parse {
                what: "certificate",
                why: e.to_string(),
            })?;
        CertInfo::from_der(&p.contents)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: u64 = 1_800_000_000;

    #[test]
    fn a_node_certificate_carries_the_name_allotd_chose_not_the_requests() {
        let ca = Ca::create("test", NOW).expect("CA");
        let (_key, csr) = node_request("evil-node").expect("request");
        let issued = ca
            .sign_node(&csr, "node-7", NOW, NODE_DAYS)
            .expect("signed");
        let info = CertInfo::from_pem(&issued.cert_pem).expect("parsed");
        assert_eq!(info.common_name, "node-7");
        assert_eq!(info.not_after, NOW + NODE_DAYS * 86_400);
        assert_eq!(info.fingerprint, issued.fingerprint);
    }

    #[test]
    fn a_tampered_signing_request_is_refused() {
        let ca = Ca::create("test", NOW).expect("CA");
        let (_key, csr) = node_request("node-1").expect("request");
        // Flip one character inside the base64 body: the signature no longer holds.
        let mut lines: Vec<String> = csr.lines().map(str::to_string).collect();
        let mid = &mut lines[2];
        let c = if mid.starts_with('A') { "B" } else { "A" };
        mid.replace_range(0..1, c);
        let bad = lines.join("\n");
        assert!(ca.sign_node(&bad, "node-1", NOW, NODE_DAYS).is_err());
        assert!(ca
            .sign_node("not a request", "node-1", NOW, NODE_DAYS)
            .is_err());
    }

    #[test]
    fn the_ca_round_trips_through_its_pem_files() {
        let ca = Ca::create("test", NOW).expect("CA");
        let again = Ca::from_pem(&ca.cert_pem, &ca.key_pem).expect("loaded");
        let (issued, key) = again
            .issue_server(&["localhost".into(), "127.0.0.1".into()], NOW)
            .expect("server certificate");
        assert!(key.contains("PRIVATE KEY"));
        assert_eq!(
            CertInfo::from_pem(&issued.cert_pem)
                .expect("parsed")
                .common_name,
            "allotd"
        );
        assert!(Ca::from_pem(&ca.cert_pem, "garbage").is_err());
        assert!(format!("{ca:?}").contains("secret") && !format!("{ca:?}").contains("KEY"));
    }
}
