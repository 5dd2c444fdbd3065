//! `Type=notify`: the readiness datagram reaches the socket systemd names.

#[test]
fn notify_sends_the_state_to_notify_socket() {
    let dir = std::env::temp_dir().join(format!("allot-notify-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let path = dir.join("notify.sock");
    let _ = std::fs::remove_file(&path);
    let sock = std::os::unix::net::UnixDatagram::bind(&path).expect("bind");
    // Without the variable nothing is sent (and nothing fails).
    std::env::remove_var("NOTIFY_SOCKET");
    allot_common::systemd::notify("READY=1");
    std::env::set_var("NOTIFY_SOCKET", &path);
    allot_common::systemd::notify("READY=1");
    let mut buf = [0u8; 64];
    sock.set_read_timeout(Some(std::time::Duration::from_secs(5)))
        .expect("timeout");
    let n = sock.recv(&mut buf).expect("a datagram");
    assert_eq!(&buf[..n], b"READY=1");
    // The watchdog: half of WATCHDOG_USEC, only for the process it names.
    std::env::remove_var("WATCHDOG_USEC");
    assert_eq!(allot_common::systemd::watchdog_interval(), None);
    std::env::set_var("WATCHDOG_USEC", "60000000");
    std::env::set_var("WATCHDOG_PID", std::process::id().to_string());
    assert_eq!(
        allot_common::systemd::watchdog_interval(),
        Some(std::time::Duration::from_secs(30))
    );
    std::env::set_var("WATCHDOG_PID", "1");
    assert_eq!(allot_common::systemd::watchdog_interval(), None);
    let _ = std::fs::remove_dir_all(&dir);
}
