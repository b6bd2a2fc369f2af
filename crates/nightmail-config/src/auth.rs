//! `[auth]`: how failed logins are slowed and refused.

use std::time::Duration;

use serde::Deserialize;

/// Failed-login handling, shared by SMTP and IMAP.
#[derive(Clone, Debug)]
pub struct AuthConfig {
    /// Every failed attempt is answered only after this delay.
    pub failure_delay: Duration,
    /// After this many failures for one login name from one client (an IPv4 address or IPv6
    /// /64) within `failure_window`, that login is refused to that client until the window
    /// passes; other users at the same address (a NAT, Docker) are not.
    pub max_failures: u32,
    /// After this many failures from one client for all logins together, the client is refused.
    pub max_client_failures: u32,
    pub failure_window: Duration,
    /// argon2 hashes computed at once (each takes 19 MiB and tens of milliseconds of CPU); more
    /// logins wait their turn.
    pub max_concurrent_hashes: usize,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(crate) struct RawAuth {
    failure_delay_ms: u64,
    max_failures: u32,
    max_client_failures: u32,
    failure_window_secs: u64,
    max_concurrent_hashes: usize,
}

impl Default for RawAuth {
    fn default() -> Self {
        RawAuth {
            failure_delay_ms: 2000,
            max_failures: 10,
            max_client_failures: 100,
            failure_window_secs: 900,
            max_concurrent_hashes: 4,
        }
    }
}

pub(crate) fn check(raw: &RawAuth) -> AuthConfig {
    AuthConfig {
        failure_delay: Duration::from_millis(raw.failure_delay_ms),
        max_failures: raw.max_failures.max(1),
        max_client_failures: raw.max_client_failures.max(1),
        failure_window: Duration::from_secs(raw.failure_window_secs),
        max_concurrent_hashes: raw.max_concurrent_hashes.max(1),
    }
}
