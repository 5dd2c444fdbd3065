//! Addresses: which hosts are this machine's own (where plain HTTP/2 may go).

/// Whether `host` (as a URL carries it, IPv6 in brackets or not) is `localhost` or
/// a loopback address.
pub fn is_loopback_host(host: &str) -> bool {
    host.eq_ignore_ascii_case("localhost")
        || host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_names_and_addresses() {
        for h in [
            "localhost",
            "LOCALHOST",
            "127.0.0.1",
            "127.3.2.1",
            "::1",
            "[::1]",
        ] {
            assert!(is_loopback_host(h), "{h}");
        }
        for h in [
            "allotd.example",
            "10.0.0.1",
            "0.0.0.0",
            "",
            "[::2]",
            "localhost.evil",
        ] {
            assert!(!is_loopback_host(h), "{h}");
        }
    }
}
