//! The service manager's side of the wire: `sd_notify(3)` for `Type=notify` units,
//! a datagram on `$NOTIFY_SOCKET` (no libsystemd needed).

use std::path::PathBuf;

/// Sends `state` (`READY=1`, `STOPPING=1` …) to the service manager; nothing when
/// not started by systemd.
pub fn notify(state: &str) {
    let Some(path) = std::env::var_os("NOTIFY_SOCKET") else {
        return;
    };
    let sock = match std::os::unix::net::UnixDatagram::unbound() {
        Ok(s) => s,
        Err(_) => return,
    };
    let path = PathBuf::from(path);
    // An abstract socket ("@name") is a Linux-only address.
    let sent = if let Some(name) = path.to_str().and_then(|p| p.strip_prefix('@')) {
        use std::os::linux::net::SocketAddrExt;
        std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes())
            .and_then(|a| sock.send_to_addr(state.as_bytes(), &a))
    } else {
        sock.send_to(state.as_bytes(), &path)
    };
    if let Err(e) = sent {
        tracing::warn!(error = %e, "cannot notify systemd");
    }
}

/// How often to send `WATCHDOG=1` when the unit has `WatchdogSec=` (half the
/// period systemd waits, as sd_watchdog_enabled(3) advises); `None` otherwise.
pub fn watchdog_interval() -> Option<std::time::Duration> {
    let usec: u64 = std::env::var("WATCHDOG_USEC").ok()?.parse().ok()?;
    // The variable may be inherited by children; it is ours only if the pid matches.
    if let Some(pid) = std::env::var("WATCHDOG_PID")
        .ok()
        .and_then(|p| p.parse::<u32>().ok())
    {
        if pid != std::process::id() {
            return None;
        }
    }
    (usec > 0).then(|| std::time::Duration::from_micros(usec / 2))
}
