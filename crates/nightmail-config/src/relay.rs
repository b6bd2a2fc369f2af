//! `[relay]`: the smarthost that mail to outside addresses leaves through.

use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;
use toml::Spanned;

use crate::error::{ConfigError, Locator};
use crate::upstream::{PasswordSource, RelayTls, host, login, tls_mode};

/// `[relay]`: the smarthost (the user's provider's submission server, or a local MTA) through
/// which mail to outside addresses leaves, with the limits that keep nightmail from becoming an
/// amplifier.
#[derive(Clone, Debug)]
pub struct RelayConfig {
    pub host: String,
    pub port: u16,
    pub tls: RelayTls,
    /// The login at the smarthost and where its password is; `None`: no AUTH.
    pub user: Option<(String, PasswordSource)>,
    /// Accept a certificate that does not verify. Only when set explicitly, and logged.
    pub tls_insecure: bool,
    /// Extra trusted root certificates (PEM), for a smarthost with a private CA.
    pub ca_file: Option<PathBuf>,
    /// How long a message may wait for a recipient before it bounces.
    pub give_up_after: Duration,
    /// Outside recipients of one model reply; the rest are named in the reply, not sent to.
    pub max_recipients_per_reply: usize,
    /// Outside recipients one user may relay to in 24 hours.
    pub max_relay_recipients_per_user_per_day: usize,
    /// How long to wait for the smarthost to connect and to answer each command.
    pub timeout: Duration,
}

impl RelayConfig {
    /// `host:port (tls)`, for messages.
    pub fn describe(&self) -> String {
        format!("{}:{} ({})", self.host, self.port, self.tls.name())
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawRelay {
    host: Spanned<String>,
    port: Option<u16>,
    #[serde(default = "default_relay_tls")]
    tls: Spanned<String>,
    user: Option<Spanned<String>>,
    password_env: Option<Spanned<String>>,
    password_file: Option<Spanned<PathBuf>>,
    #[serde(default)]
    tls_insecure: bool,
    ca_file: Option<PathBuf>,
    #[serde(default = "default_give_up_after_hours")]
    give_up_after_hours: Spanned<u64>,
    #[serde(default = "default_max_recipients_per_reply")]
    max_recipients_per_reply: usize,
    #[serde(default = "default_max_relay_recipients_per_user_per_day")]
    max_relay_recipients_per_user_per_day: usize,
    #[serde(default = "default_relay_timeout_secs")]
    timeout_secs: Spanned<u64>,
}

fn default_relay_tls() -> Spanned<String> {
    Spanned::new(0..0, "starttls".into())
}

fn default_give_up_after_hours() -> Spanned<u64> {
    Spanned::new(0..0, 72)
}

fn default_max_recipients_per_reply() -> usize {
    20
}

fn default_max_relay_recipients_per_user_per_day() -> usize {
    200
}

fn default_relay_timeout_secs() -> Spanned<u64> {
    Spanned::new(0..0, 60)
}

pub(crate) fn check(spanned: &Spanned<RawRelay>, loc: &Locator<'_>) -> Result<RelayConfig, ConfigError> {
    let r = spanned.get_ref();
    let host = host(&r.host, "relay.host", loc)?;
    let tls = tls_mode(&r.tls, &host, "relay.tls", loc)?;
    let port = r.port.unwrap_or(match tls {
        RelayTls::StartTls => 587,
        RelayTls::Implicit => 465,
        RelayTls::None => 25,
    });
    let user = login("relay", r.user.as_ref(), r.password_env.as_ref(), r.password_file.as_ref(), loc)?;
    if *r.timeout_secs.get_ref() == 0 {
        return Err(loc.spanned(&r.timeout_secs, "relay.timeout_secs must be greater than 0".into()));
    }
    if *r.give_up_after_hours.get_ref() == 0 {
        return Err(loc.spanned(&r.give_up_after_hours, "relay.give_up_after_hours must be at least 1".into()));
    }
    Ok(RelayConfig {
        host,
        port,
        tls,
        user,
        tls_insecure: r.tls_insecure,
        ca_file: r.ca_file.clone(),
        give_up_after: Duration::from_secs(r.give_up_after_hours.get_ref().saturating_mul(3600)),
        max_recipients_per_reply: r.max_recipients_per_reply,
        max_relay_recipients_per_user_per_day: r.max_relay_recipients_per_user_per_day,
        timeout: Duration::from_secs(*r.timeout_secs.get_ref()),
    })
}
