//! `[auth]`: how failed logins are slowed.

use std::time::Duration;

use serde::Deserialize;

/// Failed-login handling, shared by SMTP and IMAP.
#[derive(Clone, Debug)]
pub struct AuthConfig {
    /// Every failed attempt is answered only after this delay.
    pub failure_delay: Duration,
    /// Wrong answers for one account (however its login is spelt) to one client (an IPv4
    /// address, an IPv6 /64, or loopback) within `failure_window`; past them a wrong password
    /// is answered only when the window has room again. The right password is always answered
    /// at once, and other users at the same address (a NAT, Docker) have budgets of their own.
    pub max_failures: u32,
    /// The same, for all logins from one client together.
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
