//! How to ask a workload for a checkpoint, as written in a submission or a config:
//! `signal:USR1`, `exec:CMD ARGS…`, `http://…`. Parsing only; allotd checks hooks
//! with this module alone (no file watcher, no HTTP client).

use nix::sys::signal::Signal;
use serde::Serialize;
use std::net::IpAddr;
use std::str::FromStr;

/// How to ask for a checkpoint.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case", tag = "kind", content = "value")]
pub enum Hook {
    /// Send this signal to the process group.
    Signal(String),
    /// Run this command (argv) with the lease's environment.
    Exec(Vec<String>),
    /// POST a JSON body to this URL.
    Http(String),
}

/// A hook spec that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("checkpoint hook {spec:?}: {why}; use signal:USR1, exec:CMD ARGS or http://HOST:PORT/PATH")]
pub struct HookError {
    /// What was given.
    pub spec: String,
    /// What is wrong.
    pub why: String,
}

/// A signal by name, as operators write it: `USR1`, `sigusr1`, `SIGTERM`.
pub fn signal_named(name: &str) -> Option<Signal> {
    let n = name.trim().to_ascii_uppercase();
    let n = if n.starts_with("SIG") {
        n
    } else {
        format!("SIG{n}")
    };
    Signal::from_str(&n).ok()
}

impl Hook {
    /// The host an `http:` hook sends to (lowercased, an IPv6 address without its
    /// brackets); `Some("")` when no plain host can be read from the URL (so that no
    /// list allows it); `None` for other hooks.
    pub fn http_host(&self) -> Option<String> {
        match self {
            Hook::Http(url) => Some(url_host(url).unwrap_or_default()),
            _ => None,
        }
    }
}

/// The host of an `http(s)://` URL, read as the URL standard reads it for these
/// schemes: the authority ends at `/`, `\`, `?` or `#`, user info (up to the last
/// `@`) is dropped, and the port is cut off. `None` for anything unusual (percent
/// escapes, spaces or control characters, an empty host): a caller checking where a
/// hook may go must then refuse it, never guess.
pub fn url_host(url: &str) -> Option<String> {
    let rest = url
        .strip_prefix("http://")
        .or_else(|| url.strip_prefix("https://"))?;
    let authority = rest.split(['/', '\\', '?', '#']).next().unwrap_or("");
    let hostport = authority.rsplit('@').next().unwrap_or("");
    let host = if let Some(v6) = hostport.strip_prefix('[') {
        v6.split(']').next().unwrap_or("")
    } else {
        hostport.split(':').next().unwrap_or("")
    };
    let plain = host
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | ':' | '_'));
    (plain && !host.is_empty()).then(|| host.to_ascii_lowercase())
}

/// True if an `http:` hook may reach `host`: loopback (127.0.0.0/8, ::1,
/// `localhost`) or one of `allowed` (names compared without case, addresses as
/// addresses; brackets around an IPv6 address are optional).
pub fn host_allowed(host: &str, allowed: &[String]) -> bool {
    let unbracket = |h: &str| h.trim_start_matches('[').trim_end_matches(']').to_string();
    let host = unbracket(host);
    if allot_common::net::is_loopback_host(&host) {
        return true;
    }
    let ip = host.parse::<IpAddr>().ok();
    allowed
        .iter()
        .map(|a| unbracket(a))
        .any(|a| match (ip, a.parse::<IpAddr>()) {
            (Some(x), Ok(y)) => x == y,
            _ => !host.is_empty() && a.eq_ignore_ascii_case(&host),
        })
}

impl FromStr for Hook {
    type Err = HookError;

    fn from_str(spec: &str) -> Result<Self, HookError> {
        let err = |why: &str| HookError {
            spec: spec.into(),
            why: why.into(),
        };
        if let Some(sig) = spec.strip_prefix("signal:") {
            let s = signal_named(sig).ok_or_else(|| err("unknown signal"))?;
            if matches!(s, Signal::SIGKILL | Signal::SIGSTOP) {
                return Err(err(
                    "SIGKILL and SIGSTOP cannot be caught, so they cannot ask for a checkpoint",
                ));
            }
            return Ok(Hook::Signal(s.as_str().to_string()));
        }
        if let Some(cmd) = spec.strip_prefix("exec:") {
            // Split like a shell, so a quoted path with spaces stays one argument.
            let argv = shlex::split(cmd).ok_or_else(|| {
                err("unbalanced quotes or a trailing backslash; quote as in a shell")
            })?;
            if argv.is_empty() {
                return Err(err("empty command"));
            }
            return Ok(Hook::Exec(argv));
        }
        if let Some(rest) = spec.strip_prefix("http:") {
            let url = if rest.starts_with("//") {
                format!("http:{rest}")
            } else {
                rest.to_string()
            };
            if !(url.starts_with("http://") || url.starts_with("https://")) || url.len() < 10 {
                return Err(err("not an http(s) URL"));
            }
            return Ok(Hook::Http(url));
        }
        Err(err("unknown kind"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_host_is_read_as_the_url_standard_reads_it() {
        for (url, host) in [
            ("http://127.0.0.1:8080/ckpt", Some("127.0.0.1")),
            ("https://CKPT.Example.com/x?y#z", Some("ckpt.example.com")),
            ("http://[::1]:9/x", Some("::1")),
            // User info is not the host; the last `@` ends it.
            ("http://127.0.0.1@evil.example/", Some("evil.example")),
            ("http://a@b@evil.example:80/", Some("evil.example")),
            // The authority ends at `\`, `?` or `#`, before a later `@`.
            ("http://evil.example\\@127.0.0.1/", Some("evil.example")),
            ("http://evil.example?@127.0.0.1/", Some("evil.example")),
            ("http://127.0.0.1#@evil.example/", Some("127.0.0.1")),
            // Anything unusual is not read at all.
            ("http://127.0.0.1%2f@evil.example/", Some("evil.example")),
            ("http://ev%69l.example/", None),
            ("http:///evil.example/", None),
            ("http://127.0.0.1\t.evil/", None),
            ("ftp://127.0.0.1/", None),
        ] {
            assert_eq!(url_host(url).as_deref(), host, "{url}");
        }
        assert_eq!(Hook::Signal("SIGUSR1".into()).http_host(), None);
        assert_eq!(
            Hook::Http("http://ev%69l.example/".into()).http_host(),
            Some(String::new())
        );
    }

    #[test]
    fn loopback_and_the_named_hosts_are_allowed_nothing_else() {
        let none: &[String] = &[];
        for h in [
            "127.0.0.1",
            "127.9.8.7",
            "::1",
            "[::1]",
            "localhost",
            "LocalHost",
        ] {
            assert!(host_allowed(h, none), "{h}");
        }
        for h in [
            "10.0.0.5",
            "ckpt.example",
            "",
            "localhost.evil",
            "0.0.0.0",
            "::",
        ] {
            assert!(!host_allowed(h, none), "{h}");
        }
        let named = ["Ckpt.Example".to_string(), "[fd00::0:5]".to_string()];
        assert!(host_allowed("ckpt.example", &named));
        assert!(
            host_allowed("fd00::5", &named),
            "addresses compare as addresses"
        );
        assert!(!host_allowed("ckpt.example.evil", &named));
        assert!(
            !host_allowed("", &[String::new()]),
            "an empty host never matches"
        );
    }
}
