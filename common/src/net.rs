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

/// Whether a request's `Host` header (`name`, `name:port`, `[v6]:port`) names
/// this server: an IP address, `localhost`, or one of `names`. A page whose own
/// name was rebound to this server's address (DNS rebinding) sends its own name,
/// and is refused.
pub fn host_is_ours(host: &str, names: &[String]) -> bool {
    let name = match host.strip_prefix('[') {
        Some(rest) => match rest.split_once(']') {
            Some((v6, tail)) if tail.is_empty() || tail.starts_with(':') => v6,
            _ => return false,
        },
        None => match host.rsplit_once(':') {
            Some((n, port)) if !n.contains(':') && port.bytes().all(|b| b.is_ascii_digit()) => n,
            Some(_) => host,
            None => host,
        },
    };
    let name = name.trim_end_matches('.');
    !name.is_empty()
        && (name.parse::<std::net::IpAddr>().is_ok()
            || name.eq_ignore_ascii_case("localhost")
            || names.iter().any(|n| n.eq_ignore_ascii_case(name)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_host_header_is_ours_by_address_or_by_a_name_we_carry() {
        let names = vec!["allot.example.org".to_string(), "ctl-1".into()];
        for h in [
            "127.0.0.1:9470",
            "10.1.2.3",
            "[::1]:9470",
            "[fe80::1]",
            "localhost:9470",
            "Allot.Example.Org:9470",
            "allot.example.org.",
            "ctl-1",
        ] {
            assert!(host_is_ours(h, &names), "{h}");
        }
        for h in [
            "evil.example.com:9470",
            "",
            "ctl-1.evil.com",
            "[::1",
            "[::1]x",
            ":9470",
        ] {
            assert!(!host_is_ours(h, &names), "{h}");
        }
    }

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
