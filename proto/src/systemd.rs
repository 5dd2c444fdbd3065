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
