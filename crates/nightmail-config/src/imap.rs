//! `[imap]`: the IMAP listeners and their limits.

use std::net::SocketAddr;
use std::time::Duration;

use serde::Deserialize;
use toml::Spanned;

use crate::error::{ConfigError, Locator};

#[derive(Clone, Debug)]
pub struct ImapConfig {
    pub listen: SocketAddr,
    /// IMAP with implicit TLS (RFC 8314 §3.2, like port 993), beside `listen`'s STARTTLS.
    pub listen_tls: Option<SocketAddr>,
    /// Connections served at once; more are greeted with BYE (RFC 3501 §7.1.5).
    pub max_connections: usize,
    /// Connections from one client (an IPv4 address or an IPv6 /64) at once.
    pub max_connections_per_ip: usize,
    /// Of `max_connections`, how many may be not yet logged in: the rest are for logged-in users
    /// alone, whoever opens connections and stays silent.
    pub max_unauthenticated: usize,
    /// How long a connection may take to log in, from its greeting (RFC 9051 §5.4 lets the
    /// not-authenticated state have a shorter autologout than the 30 minutes after login).
    pub login_timeout: Duration,
    /// How long a whole command (with its literals) may take to arrive, counted from its first
    /// byte; also the deadline of a TLS handshake and of a write.
    pub command_timeout: Duration,
    /// Mailboxes one user may have.
    pub max_mailboxes: usize,
    /// The longest mailbox name, in bytes of UTF-8.
    pub max_mailbox_name_bytes: usize,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(crate) struct RawImap {
    listen: SocketAddr,
    pub(crate) listen_tls: Option<Spanned<SocketAddr>>,
    max_connections: Spanned<usize>,
    max_connections_per_ip: Spanned<usize>,
    max_unauthenticated: Spanned<usize>,
    login_timeout_secs: Spanned<u64>,
    command_timeout_secs: Spanned<u64>,
    max_mailboxes: Spanned<usize>,
    max_mailbox_name_bytes: Spanned<usize>,
}

impl Default for RawImap {
    fn default() -> Self {
        RawImap {
            listen: "127.0.0.1:1143".parse().unwrap(),
            listen_tls: None,
            max_connections: Spanned::new(0..0, 256),
            // Desktop clients open up to five per account; a household behind one NAT more.
            max_connections_per_ip: Spanned::new(0..0, 20),
            max_unauthenticated: Spanned::new(0..0, 32),
            login_timeout_secs: Spanned::new(0..0, 60),
            command_timeout_secs: Spanned::new(0..0, 600),
            max_mailboxes: Spanned::new(0..0, 1000),
            max_mailbox_name_bytes: Spanned::new(0..0, 255),
        }
    }
}

pub(crate) fn check(raw: &RawImap, loc: &Locator<'_>) -> Result<ImapConfig, ConfigError> {
    let positive = |v: &Spanned<usize>, key: &str| match *v.get_ref() {
        0 => Err(loc.spanned(v, format!("imap.{key} must be greater than 0"))),
        n => Ok(n),
    };
    if *raw.command_timeout_secs.get_ref() == 0 {
        return Err(loc.spanned(&raw.command_timeout_secs, "imap.command_timeout_secs must be greater than 0".into()));
    }
    if *raw.login_timeout_secs.get_ref() == 0 {
        return Err(loc.spanned(&raw.login_timeout_secs, "imap.login_timeout_secs must be greater than 0".into()));
    }
    Ok(ImapConfig {
        listen: raw.listen,
        listen_tls: raw.listen_tls.as_ref().map(|l| *l.get_ref()),
        max_connections: positive(&raw.max_connections, "max_connections")?,
        max_connections_per_ip: positive(&raw.max_connections_per_ip, "max_connections_per_ip")?,
        max_unauthenticated: positive(&raw.max_unauthenticated, "max_unauthenticated")?,
        login_timeout: Duration::from_secs(*raw.login_timeout_secs.get_ref()),
        command_timeout: Duration::from_secs(*raw.command_timeout_secs.get_ref()),
        max_mailboxes: positive(&raw.max_mailboxes, "max_mailboxes")?,
        max_mailbox_name_bytes: positive(&raw.max_mailbox_name_bytes, "max_mailbox_name_bytes")?,
    })
}
