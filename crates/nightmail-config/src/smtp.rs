//! `[smtp]`: the SMTP listeners and the limits on what a client may send.

use std::net::SocketAddr;
use std::time::Duration;

use serde::Deserialize;
use toml::Spanned;

use crate::error::{ConfigError, Locator};

#[derive(Clone, Debug)]
pub struct SmtpConfig {
    pub listen: SocketAddr,
    /// Submission with implicit TLS (RFC 8314 §3.3, like port 465), beside `listen`'s STARTTLS.
    pub listen_tls: Option<SocketAddr>,
    /// RFC 1870 SIZE: larger messages are refused while DATA is read.
    pub max_message_bytes: usize,
    /// RFC 5321 §4.5.3.1.8 asks servers to accept at least 100.
    pub max_recipients: usize,
    pub max_connections: usize,
    /// Connections from one client (an IPv4 address or an IPv6 /64) at once.
    pub max_connections_per_ip: usize,
    /// RFC 5321 §4.5.3.1.6 limits a text line to 1000 octets; we refuse lines longer than this.
    pub max_line_bytes: usize,
    /// Header fields (physical lines) allowed before the body.
    pub max_header_lines: usize,
    /// RFC 5321 §4.5.3.2: how long a whole command line may take to arrive (counted from its
    /// first byte, so a client trickling bytes does not reset it), a TLS handshake and a write.
    pub timeout: Duration,
    /// How long a whole message (DATA to the final dot) may take to arrive.
    pub data_timeout: Duration,
    /// Whether a user may name another account of this server (a user or a model) in From: of
    /// mail kept here and in Sender: or Reply-To: of mail sent outside (a shared desk); off, such
    /// mail is refused as forged (RFC 6409 §6.1 lets a submission server check what it signs for).
    pub allow_other_users_addresses: bool,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(crate) struct RawSmtp {
    listen: SocketAddr,
    pub(crate) listen_tls: Option<Spanned<SocketAddr>>,
    max_message_bytes: Spanned<usize>,
    max_recipients: Spanned<usize>,
    max_connections: Spanned<usize>,
    max_connections_per_ip: Spanned<usize>,
    max_line_bytes: Spanned<usize>,
    max_header_lines: Spanned<usize>,
    timeout_secs: Spanned<u64>,
    data_timeout_secs: Spanned<u64>,
    allow_other_users_addresses: bool,
}

impl Default for RawSmtp {
    fn default() -> Self {
        let s = |v| Spanned::new(0..0, v);
        RawSmtp {
            listen: "127.0.0.1:2525".parse().unwrap(),
            listen_tls: None,
            max_message_bytes: s(25 * 1024 * 1024),
            max_recipients: s(100),
            max_connections: s(64),
            max_connections_per_ip: s(10),
            max_line_bytes: s(8192),
            max_header_lines: s(1000),
            timeout_secs: Spanned::new(0..0, 300),
            data_timeout_secs: Spanned::new(0..0, 1800),
            allow_other_users_addresses: false,
        }
    }
}

pub(crate) fn check(raw: &RawSmtp, loc: &Locator<'_>) -> Result<SmtpConfig, ConfigError> {
    let positive = |v: &Spanned<usize>, key: &str| {
        if *v.get_ref() == 0 {
            Err(loc.spanned(v, format!("smtp.{key} must be greater than 0")))
        } else {
            Ok(*v.get_ref())
        }
    };
    let max_line_bytes = positive(&raw.max_line_bytes, "max_line_bytes")?;
    if max_line_bytes < 1000 {
        return Err(
            loc.spanned(&raw.max_line_bytes, "smtp.max_line_bytes must be at least 1000 (RFC 5321 §4.5.3.1.6)".into())
        );
    }
    if *raw.timeout_secs.get_ref() == 0 {
        return Err(loc.spanned(&raw.timeout_secs, "smtp.timeout_secs must be greater than 0".into()));
    }
    if *raw.data_timeout_secs.get_ref() == 0 {
        return Err(loc.spanned(&raw.data_timeout_secs, "smtp.data_timeout_secs must be greater than 0".into()));
    }
    Ok(SmtpConfig {
        listen: raw.listen,
        listen_tls: raw.listen_tls.as_ref().map(|l| *l.get_ref()),
        max_message_bytes: positive(&raw.max_message_bytes, "max_message_bytes")?,
        max_recipients: positive(&raw.max_recipients, "max_recipients")?,
        max_connections: positive(&raw.max_connections, "max_connections")?,
        max_connections_per_ip: positive(&raw.max_connections_per_ip, "max_connections_per_ip")?,
        max_line_bytes,
        max_header_lines: positive(&raw.max_header_lines, "max_header_lines")?,
        timeout: Duration::from_secs(*raw.timeout_secs.get_ref()),
        data_timeout: Duration::from_secs(*raw.data_timeout_secs.get_ref()),
        allow_other_users_addresses: raw.allow_other_users_addresses,
    })
}
