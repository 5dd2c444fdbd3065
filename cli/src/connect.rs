//! How the CLI reaches allotd and proves who it is: TLS checked against the cluster
//! CA (`$ALLOT_CA`, `~/.config/allot/ca.pem`, `/etc/allot/ca.pem`) and a bearer
//! token (`$ALLOT_TOKEN`, `~/.config/allot/token`). Plain `http://` is for a
//! loopback allotd only, so a token never crosses a network in the clear.

use std::path::PathBuf;
use tonic::metadata::{Ascii, MetadataValue};
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint};

/// A connection to allotd that sends the caller's token with every request.
pub type Conn = InterceptedService<Channel, Auth>;

/// Adds `authorization: Bearer TOKEN` when the caller has a token.
#[derive(Clone)]
pub struct Auth(Option<MetadataValue<Ascii>>);

impl tonic::service::Interceptor for Auth {
    fn call(&mut self, mut r: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(v) = &self.0 {
            r.metadata_mut().insert("authorization", v.clone());
        }
        Ok(r)
    }
}

fn config_dir() -> Option<PathBuf> {
    std::env::var_os("XDG_CONFIG_HOME")
        .filter(|d| !d.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".config")))
        .map(|d| d.join("allot"))
}

/// The caller's token: `$ALLOT_TOKEN`, else `~/.config/allot/token`.
pub fn token() -> Result<Option<String>, String> {
    if let Some(t) = std::env::var("ALLOT_TOKEN")
        .ok()
        .filter(|t| !t.trim().is_empty())
    {
        return Ok(Some(t.trim().to_string()));
    }
    let Some(p) = config_dir().map(|d| d.join("token")) else {
        return Ok(None);
    };
    match std::fs::read_to_string(&p) {
        Ok(t) if !t.trim().is_empty() => Ok(Some(t.trim().to_string())),
        Ok(_) => Ok(None),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(format!("{}: {e}", p.display())),
    }
}

/// The project a submission charges when `--project` and `$ALLOT_PROJECT` are
/// absent: `project = "P"` in `~/.config/allot/config.toml`; `None` lets allotd
/// pick the only project the user is a member of.
pub fn default_project() -> Result<Option<String>, String> {
    #[derive(serde::Deserialize)]
    struct File {
        project: Option<String>,
    }
    let Some(p) = config_dir().map(|d| d.join("config.toml")) else {
        return Ok(None);
    };
    let text = match std::fs::read_to_string(&p) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(format!("{}: {e}", p.display())),
    };
    let f: File = toml::from_str(&text).map_err(|e| format!("{}: {e}", p.display()))?;
    Ok(f.project.filter(|p| !p.trim().is_empty()))
}

/// The cluster CA to check allotd by.
fn ca() -> Result<String, String> {
    let candidates: Vec<PathBuf> = match std::env::var_os("ALLOT_CA").filter(|c| !c.is_empty()) {
        Some(p) => vec![PathBuf::from(p)],
        None => config_dir()
            .map(|d| d.join("ca.pem"))
            .into_iter()
            .chain([PathBuf::from("/etc/allot/ca.pem")])
            .collect(),
    };
    for p in &candidates {
        match std::fs::read_to_string(p) {
            Ok(t) => return Ok(t),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(format!("{}: {e}", p.display())),
        }
    }
    Err(format!(
        "no cluster CA certificate (looked at {}); set ALLOT_CA to allotd's pki/ca.pem",
        candidates
            .iter()
            .map(|p| p.display().to_string())
            .collect::<Vec<_>>()
            .join(", ")
    ))
}

/// The endpoint for `server` (already checked by `parse_server`): TLS for
/// `https://`, plain for a loopback `http://`.
pub fn endpoint(server: &str) -> Result<Endpoint, String> {
    let e = Endpoint::from_shared(server.to_string()).map_err(|e| e.to_string())?;
    if let Some(rest) = server.strip_prefix("https://") {
        let host = rest
            .rsplit_once(':')
            .map_or(rest, |(h, _)| h)
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_string();
        let tls = ClientTlsConfig::new()
            .ca_certificate(Certificate::from_pem(ca()?))
            .domain_name(host);
        e.tls_config(tls).map_err(|e| e.to_string())
    } else {
        Ok(e)
    }
}

/// Wraps a channel with the caller's token.
pub fn authed(ch: Channel) -> Result<Conn, String> {
    let v = match token()? {
        Some(t) => Some(
            format!("Bearer {t}")
                .parse::<MetadataValue<Ascii>>()
                .map_err(|_| "ALLOT_TOKEN: not a token (printable ASCII only)".to_string())?,
        ),
        None => None,
    };
    Ok(InterceptedService::new(ch, Auth(v)))
}
