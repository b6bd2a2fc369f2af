//! What a fetch may reach and how much it may take.

use std::time::Duration;

/// Limits for `fetch` and for the request `web_search` makes to a SearXNG instance.
#[derive(Clone, Debug)]
pub struct FetchPolicy {
    /// "host:port" pairs on private or loopback addresses that fetch may reach (a local SearXNG,
    /// say). The host is the URL's (`localhost:8888`) or an address (`127.0.0.1:8888`, `[::1]:8888`).
    pub allow_private: Vec<String>,
    /// Hosts fetch may reach, as `example.org` or `*.example.org`; empty means any public host.
    pub allow_hosts: Vec<String>,
    /// Hosts fetch refuses, same patterns; a host on both lists is refused.
    pub deny_hosts: Vec<String>,
    /// Bytes kept of a page's body; the rest is not read and the page is marked cut.
    pub max_bytes: u64,
    /// The whole fetch: name lookups, robots.txt, redirects and the body.
    pub timeout: Duration,
    pub max_redirects: u8,
    pub user_agent: String,
    /// Obey robots.txt (RFC 9309) for the user agent's product token.
    pub respect_robots: bool,
}

impl Default for FetchPolicy {
    fn default() -> Self {
        FetchPolicy {
            allow_private: Vec::new(),
            allow_hosts: Vec::new(),
            deny_hosts: Vec::new(),
            max_bytes: 2 * 1024 * 1024,
            timeout: Duration::from_secs(20),
            max_redirects: 5,
            user_agent: concat!("nightmail/", env!("CARGO_PKG_VERSION")).to_string(),
            respect_robots: true,
        }
    }
}

impl FetchPolicy {
    /// Whether the host names pass `allow_hosts` and `deny_hosts`; deny wins.
    pub(crate) fn host_listed(&self, host: &str) -> HostVerdict {
        let host = host.trim_end_matches('.').to_ascii_lowercase();
        if self.deny_hosts.iter().any(|p| host_matches(p, &host)) {
            return HostVerdict::Denied;
        }
        if !self.allow_hosts.is_empty() && !self.allow_hosts.iter().any(|p| host_matches(p, &host)) {
            return HostVerdict::NotAllowed;
        }
        HostVerdict::Pass
    }

    /// The robots.txt product token: the user agent up to its first '/' or space (RFC 9309 §2.2.1).
    pub(crate) fn robots_agent(&self) -> &str {
        self.user_agent.split(['/', ' ']).next().unwrap_or("")
    }

    /// A duration as a model reads it: "20 s", "250 ms".
    pub(crate) fn timeout_text(&self) -> String {
        duration_text(self.timeout)
    }
}

pub(crate) fn duration_text(d: Duration) -> String {
    if d.subsec_millis() == 0 && d.as_secs() > 0 {
        format!("{} s", d.as_secs())
    } else {
        format!("{} ms", d.as_millis())
    }
}

/// Bytes as a model reads them: "2 MiB", "512 KiB", "100 bytes".
pub(crate) fn bytes_text(n: u64) -> String {
    const MIB: u64 = 1024 * 1024;
    if n >= MIB && n.is_multiple_of(MIB) {
        format!("{} MiB", n / MIB)
    } else if n >= 1024 && n.is_multiple_of(1024) {
        format!("{} KiB", n / 1024)
    } else {
        format!("{n} bytes")
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum HostVerdict {
    Pass,
    Denied,
    NotAllowed,
}

/// `example.org` matches itself; `*.example.org` matches its subdomains and itself.
fn host_matches(pattern: &str, host: &str) -> bool {
    let pattern = pattern.trim().trim_end_matches('.').to_ascii_lowercase();
    match pattern.strip_prefix("*.") {
        Some(suffix) => host == suffix || host.strip_suffix(suffix).is_some_and(|rest| rest.ends_with('.')),
        None => host == pattern,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn star_pattern_matches_subdomains_and_the_domain_but_not_lookalikes() {
        assert!(host_matches("*.example.org", "a.b.example.org"));
        assert!(host_matches("*.example.org", "example.org"));
        assert!(!host_matches("*.example.org", "badexample.org"));
        assert!(host_matches("Example.org", "example.org"));
        assert!(!host_matches("example.org", "a.example.org"));
    }

    #[test]
    fn deny_wins_over_allow() {
        let policy = FetchPolicy {
            allow_hosts: vec!["*.example.org".into()],
            deny_hosts: vec!["bad.example.org".into()],
            ..FetchPolicy::default()
        };
        assert_eq!(policy.host_listed("bad.example.org"), HostVerdict::Denied);
        assert_eq!(policy.host_listed("good.example.org"), HostVerdict::Pass);
        assert_eq!(policy.host_listed("other.net"), HostVerdict::NotAllowed);
    }

    #[test]
    fn robots_token_is_the_product_name() {
        let policy = FetchPolicy { user_agent: "nightmail/0.1 (+x)".into(), ..FetchPolicy::default() };
        assert_eq!(policy.robots_agent(), "nightmail");
    }
}
