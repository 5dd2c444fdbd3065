//! allotd's certificates on disk: the cluster CA (`ca.pem`, `ca.key`) and allotd's
//! own (`server.pem`, `server.key`) in the PKI directory (`STATE_DIR/pki` unless
//! `[tls] dir` says otherwise). `allotd init` and the first `allotd serve` create
//! them; keys are 0600 and never leave this host. The server certificate is made
//! again when a configured name is missing from it or it nears expiry.

use crate::config::ServerConfig;
use allot_auth::{Ca, CertInfo};
use anyhow::Context;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

/// What TLS needs, loaded.
#[derive(Clone)]
pub struct Pki {
    /// The CA (its key signs node certificates).
    pub ca: Ca,
    /// allotd's certificate, PEM.
    pub server_cert: String,
    /// allotd's key, PEM.
    pub server_key: String,
    /// Where they are.
    pub dir: PathBuf,
}

impl std::fmt::Debug for Pki {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Pki({})", self.dir.display())
    }
}

/// Renew allotd's certificate when less than this is left (seconds).
const RENEW_BEFORE: u64 = 30 * 86_400;

/// Writes `text` to `path` readable by its owner only (keys), or world-readable
/// (certificates), atomically.
fn write_file(path: &Path, text: &str, secret: bool) -> anyhow::Result<()> {
    allot_common::files::write_atomic(path, text, if secret { 0o600 } else { 0o644 })
        .with_context(|| format!("writing {}", path.display()))
}

fn read(path: &Path) -> anyhow::Result<String> {
    std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))
}

/// The names allotd's certificate carries: loopback, this host, and `[tls] names`.
pub(crate) fn server_names(cfg: &ServerConfig) -> Vec<String> {
    let mut names = vec!["localhost".to_string(), "127.0.0.1".into(), "::1".into()];
    if let Ok(h) = nix::unistd::gethostname() {
        if let Some(h) = h.to_str().filter(|h| !h.is_empty()) {
            names.push(h.to_string());
        }
    }
    if let Ok(a) = cfg.server.listen.parse::<std::net::SocketAddr>() {
        if !a.ip().is_unspecified() {
            names.push(a.ip().to_string());
        }
    }
    names.extend(cfg.tls.names.iter().cloned());
    names.sort();
    names.dedup();
    names
}

/// Refuses private keys (the CA's, allotd's) whose files others may read: anyone
/// with the CA key mints node certificates, anyone with allotd's key poses as allotd.
/// `serve --check` runs it too, so a check passes only what `serve` starts with.
pub fn check_key_modes(cfg: &ServerConfig) -> anyhow::Result<()> {
    let dir = cfg.pki_dir();
    for (name, what) in [("ca.key", "the CA key"), ("server.key", "allotd's TLS key")] {
        let path = dir.join(name);
        let Ok(meta) = std::fs::metadata(&path) else {
            continue; // made at start, 0600
        };
        let mode = meta.permissions().mode();
        if mode & 0o077 != 0 {
            anyhow::bail!(
                "{}: mode {:o} lets others read {what}; `chmod 600 {}`",
                path.display(),
                mode & 0o777,
                path.display()
            );
        }
    }
    Ok(())
}

/// Loads the CA and allotd's certificate, creating what is missing. A key whose
/// file others may read is refused ([`check_key_modes`]).
pub fn ensure(cfg: &ServerConfig, cluster: &str, now: u64) -> anyhow::Result<Pki> {
    let dir = cfg.pki_dir();
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let _ = std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755));
    check_key_modes(cfg)?;
    let (ca_pem, ca_key) = (dir.join("ca.pem"), dir.join("ca.key"));
    let ca = if ca_key.exists() {
        Ca::from_pem(&read(&ca_pem)?, &read(&ca_key)?)
            .with_context(|| format!("loading the CA from {}", dir.display()))?
    } else {
        let ca = Ca::create(cluster, now)?;
        write_file(&ca_key, &ca.key_pem, true)?;
        write_file(&ca_pem, &ca.cert_pem, false)?;
        tracing::info!(dir = %dir.display(), "created the cluster CA");
        ca
    };
    let (cert_path, key_path) = (dir.join("server.pem"), dir.join("server.key"));
    // The names it was made for are kept beside it: a name added to [tls] names
    // makes a new certificate.
    let names_path = dir.join("server.names");
    let names = server_names(cfg);
    let fresh = read(&cert_path)
        .ok()
        .and_then(|pem| CertInfo::from_pem(&pem).ok())
        .is_some_and(|i| i.not_after > now + RENEW_BEFORE)
        && key_path.exists()
        && read(&names_path).is_ok_and(|t| t == names.join("\n"));
    if !fresh {
        let (issued, key) = ca.issue_server(&names, now)?;
        write_file(&key_path, &key, true)?;
        write_file(&cert_path, &issued.cert_pem, false)?;
        write_file(&names_path, &names.join("\n"), false)?;
        tracing::info!(names = ?names, "issued allotd's certificate");
    }
    Ok(Pki {
        ca,
        server_cert: read(&cert_path)?,
        server_key: read(&key_path)?,
        dir,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::EXAMPLE;

    #[test]
    fn a_key_others_may_read_fails_the_check_as_it_fails_the_start() {
        let dir = std::env::temp_dir().join(format!("allot-pki-modes-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let mut cfg = ServerConfig::parse(EXAMPLE, "example").expect("example");
        cfg.tls.dir = dir.clone();
        let pki = ensure(&cfg, "test", 1_000).expect("made");
        assert!(!pki.server_key.is_empty());
        check_key_modes(&cfg).expect("made 0600");
        for name in ["ca.key", "server.key"] {
            let path = dir.join(name);
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).expect("chmod");
            let e = check_key_modes(&cfg).expect_err("refused").to_string();
            assert!(
                e.contains(name) && e.contains("mode 644") && e.contains("chmod 600"),
                "{e}"
            );
            let Err(e) = ensure(&cfg, "test", 1_000) else {
                panic!("{name} others may read: refused at start too");
            };
            let e = e.to_string();
            assert!(e.contains(name), "{e}");
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).expect("chmod");
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}
