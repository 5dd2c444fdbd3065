//! How to ask a workload for a checkpoint, as written in a submission or a config:
//! `signal:USR1`, `exec:CMD ARGS…`, `http://…`. Parsing only; allotd checks hooks
//! with this module alone (no file watcher, no HTTP client).

use nix::sys::signal::Signal;
use serde::Serialize;
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
