//! Which addresses fetch may connect to: global unicast only (server-side request forgery is the
//! hole this closes: a model asked to fetch `http://169.254.169.254/` or a LAN router). The ranges
//! are RFC 6890's special-purpose registries, with the later additions named where they are checked.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

/// Whether `ip` is reachable on the public Internet and not a special-purpose address.
pub(crate) fn is_global(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => is_global_v4(v4),
        IpAddr::V6(v6) => is_global_v6(v6),
    }
}

fn is_global_v4(ip: Ipv4Addr) -> bool {
    let [a, b, c, _] = ip.octets();
    let special = a == 0 // "this network", RFC 791 (0.0.0.0 reaches the host itself on Linux)
        || a == 10 // RFC 1918
        || (a == 100 && (64..128).contains(&b)) // shared address space (CGNAT), RFC 6598
        || a == 127 // loopback
        || (a == 169 && b == 254) // link-local, RFC 3927: cloud metadata lives here
        || (a == 172 && (16..32).contains(&b)) // RFC 1918
        || (a == 192 && b == 0 && c == 0) // IETF protocol assignments, RFC 6890
        || (a == 192 && b == 0 && c == 2) // TEST-NET-1, RFC 5737
        || (a == 192 && b == 88 && c == 99) // 6to4 relay anycast, RFC 7526
        || (a == 192 && b == 168) // RFC 1918
        || (a == 198 && (18..20).contains(&b)) // benchmarking, RFC 2544
        || (a == 198 && b == 51 && c == 100) // TEST-NET-2, RFC 5737
        || (a == 203 && b == 0 && c == 113) // TEST-NET-3, RFC 5737
        || a >= 224; // multicast, reserved 240/4, and 255.255.255.255 broadcast
    !special
}

fn is_global_v6(ip: Ipv6Addr) -> bool {
    let s = ip.segments();
    // Forms that carry an IPv4 address: judge the address they reach.
    if let Some(v4) = ip.to_ipv4_mapped() {
        return is_global_v4(v4); // ::ffff:0:0/96, RFC 4291 §2.5.5.2
    }
    if s[..6] == [0; 6] {
        // ::/96 holds :: and ::1, and the deprecated IPv4-compatible form (RFC 4291 §2.5.5.1),
        // which some stacks still route to the embedded address: refuse all of it.
        return false;
    }
    if s[..6] == [0x64, 0xff9b, 0, 0, 0, 0] {
        return is_global_v4(embedded_v4(s[6], s[7])); // NAT64 well-known prefix, RFC 6052
    }
    if s[0] == 0x2002 {
        return is_global_v4(embedded_v4(s[1], s[2])); // 6to4, RFC 3056
    }
    // Only global unicast 2000::/3 is left to allow (RFC 4291 §2.4): this refuses fc00::/7
    // unique-local, fe80::/10 link-local, ff00::/8 multicast, 64:ff9b:1::/48 local NAT64 and 100::/64
    // discard, and 5f00::/16 SRv6 SIDs (RFC 9602) at once.
    if s[0] & 0xe000 != 0x2000 {
        return false;
    }
    let special = match s[0] {
        // IETF protocol assignments 2001::/23 (Teredo, ORCHID, benchmarking), and documentation
        // 2001:db8::/32 (RFC 3849).
        0x2001 => s[1] < 0x200 || s[1] == 0x0db8,
        0x3fff => s[1] < 0x1000, // documentation 3fff::/20, RFC 9637
        _ => false,
    };
    !special
}

fn embedded_v4(hi: u16, lo: u16) -> Ipv4Addr {
    Ipv4Addr::new((hi >> 8) as u8, hi as u8, (lo >> 8) as u8, lo as u8)
}

/// The first resolved address that is neither global nor let through by `allow_private`, which
/// names "host:port" as the URL writes it or an address and port.
pub(crate) fn first_refused(
    host: &str,
    port: u16,
    addrs: &[SocketAddr],
    allow_private: &[String],
) -> Option<SocketAddr> {
    let host = host.trim_start_matches('[').trim_end_matches(']').to_ascii_lowercase();
    let allowed = |entry: &str| -> bool {
        let Some((h, p)) = entry.trim().rsplit_once(':') else { return false };
        let h = h.trim_start_matches('[').trim_end_matches(']').to_ascii_lowercase();
        p.parse::<u16>().is_ok_and(|p| p == port) && h == host
    };
    let by_name = allow_private.iter().any(|e| allowed(e));
    addrs.iter().copied().find(|addr| {
        !is_global(addr.ip())
            && !by_name
            && !allow_private.iter().any(|e| e.trim().parse::<SocketAddr>().is_ok_and(|a| a == *addr))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v4(s: &str) -> bool {
        is_global(s.parse().unwrap())
    }

    #[test]
    fn special_purpose_ipv4_is_not_global() {
        for ip in [
            "0.0.0.0",
            "0.1.2.3",
            "10.1.2.3",
            "100.64.0.1",
            "100.127.255.255",
            "127.0.0.1",
            "169.254.169.254",
            "172.16.0.1",
            "172.31.255.255",
            "192.0.0.8",
            "192.0.2.1",
            "192.168.1.1",
            "198.18.0.1",
            "198.19.255.255",
            "198.51.100.7",
            "203.0.113.9",
            "224.0.0.1",
            "240.0.0.1",
            "255.255.255.255",
        ] {
            assert!(!v4(ip), "{ip} should be refused");
        }
    }

    #[test]
    fn public_ipv4_is_global() {
        for ip in ["1.1.1.1", "8.8.8.8", "100.63.255.255", "100.128.0.1", "172.32.0.1", "93.184.215.14"] {
            assert!(v4(ip), "{ip} should be allowed");
        }
    }

    #[test]
    fn special_purpose_ipv6_and_ipv4_in_ipv6_forms_are_not_global() {
        for ip in [
            "::",
            "::1",
            "::ffff:127.0.0.1",
            "::ffff:10.0.0.1",
            "::127.0.0.1",
            "64:ff9b::a9fe:a9fe",
            "2002:7f00:1::",
            "2002:c0a8:101::1",
            "fc00::1",
            "fd12::1",
            "fe80::1",
            "ff02::1",
            "2001:db8::1",
            "2001::1",
            "3fff::1",
            "100::1",
            "64:ff9b:1::1",
            "fec0::1",
            "3fff:0fff::1",
            "5f00::1",
        ] {
            assert!(!v4(ip), "{ip} should be refused");
        }
    }

    #[test]
    fn public_ipv6_and_mapped_public_ipv4_are_global() {
        for ip in ["2606:4700:4700::1111", "3fff:1000::1", "::ffff:8.8.8.8", "64:ff9b::808:808", "2002:808:808::1"] {
            assert!(v4(ip), "{ip} should be allowed");
        }
    }

    #[test]
    fn one_private_address_among_public_ones_refuses_the_name() {
        let public: SocketAddr = "8.8.8.8:80".parse().unwrap();
        let private: SocketAddr = "10.0.0.1:80".parse().unwrap();
        assert_eq!(first_refused("example.org", 80, &[public, private], &[]), Some(private));
        assert_eq!(first_refused("example.org", 80, &[public], &[]), None);
    }

    #[test]
    fn allow_private_lets_through_the_named_host_port_or_address_only() {
        let lo: SocketAddr = "127.0.0.1:8888".parse().unwrap();
        let lo6: SocketAddr = "[::1]:8888".parse().unwrap();
        let allow = vec!["localhost:8888".to_string()];
        assert_eq!(first_refused("localhost", 8888, &[lo, lo6], &allow), None);
        assert_eq!(first_refused("localhost", 8889, &[lo], &allow), Some(lo));
        let allow = vec!["127.0.0.1:8888".to_string()];
        assert_eq!(first_refused("localhost", 8888, &[lo, lo6], &allow), Some(lo6));
        assert_eq!(first_refused("127.0.0.1", 8888, &[lo], &allow), None);
        let allow = vec!["[::1]:8888".to_string()];
        assert_eq!(first_refused("[::1]", 8888, &[lo6], &allow), None);
    }
}
