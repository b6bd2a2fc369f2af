//! The file as serde reads it, and the checks that turn it into [`Config`].

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;
use toml::Spanned;

use crate::{
    Address, ApiPrice, AuthConfig, BackendConfig, Config, ConfigError, Cost, DEFAULTS_NAME, ImapConfig, Model,
    Password, PasswordSource, ReasoningOutput, RelayConfig, RelayTls, SmtpConfig, TlsConfig, User, WorkerConfig,
};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    #[serde(default = "default_hostname")]
    hostname: Spanned<String>,
    #[serde(default = "default_data_dir")]
    data_dir: PathBuf,
    #[serde(default)]
    smtp: RawSmtp,
    #[serde(default)]
    imap: RawImap,
    tls: Option<Spanned<RawTls>>,
    #[serde(default)]
    auth: RawAuth,
    #[serde(default)]
    user: Vec<Spanned<RawUser>>,
    #[serde(default)]
    model: Vec<Spanned<RawModel>>,
    #[serde(default)]
    worker: RawWorker,
    relay: Option<Spanned<RawRelay>>,
    #[serde(default)]
    bridge: Vec<Spanned<crate::bridge::RawBridge>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRelay {
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

#[derive(Deserialize)]
#[serde(deny_unknown_fields, default)]
struct RawWorker {
    concurrency: usize,
    lease_secs: u64,
    max_replies_per_sender_per_hour: u32,
    retry_base_secs: u64,
    retry_max_secs: u64,
    max_attempts: u32,
    retention_days: u64,
}

impl Default for RawWorker {
    fn default() -> Self {
        RawWorker {
            concurrency: 4,
            lease_secs: 300,
            max_replies_per_sender_per_hour: 30,
            retry_base_secs: 60,
            retry_max_secs: 3600,
            max_attempts: 8,
            retention_days: 30,
        }
    }
}

fn default_hostname() -> Spanned<String> {
    Spanned::new(0..0, "nightmail.local".into())
}

fn default_data_dir() -> PathBuf {
    PathBuf::from("data")
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, default)]
struct RawSmtp {
    listen: SocketAddr,
    listen_tls: Option<Spanned<SocketAddr>>,
    max_message_bytes: Spanned<usize>,
    max_recipients: Spanned<usize>,
    max_connections: Spanned<usize>,
    max_connections_per_ip: Spanned<usize>,
    max_line_bytes: Spanned<usize>,
    max_header_lines: Spanned<usize>,
    timeout_secs: Spanned<u64>,
    data_timeout_secs: Spanned<u64>,
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
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, default)]
struct RawImap {
    listen: SocketAddr,
    listen_tls: Option<Spanned<SocketAddr>>,
    max_connections: Spanned<usize>,
    max_connections_per_ip: Spanned<usize>,
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
            command_timeout_secs: Spanned::new(0..0, 600),
            max_mailboxes: Spanned::new(0..0, 1000),
            max_mailbox_name_bytes: Spanned::new(0..0, 255),
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTls {
    cert: Option<PathBuf>,
    key: Option<PathBuf>,
    #[serde(default)]
    self_signed: bool,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, default)]
struct RawAuth {
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

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawUser {
    name: Spanned<String>,
    address: Spanned<String>,
    password: Option<String>,
    password_hash: Option<Spanned<String>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawModel {
    address: Spanned<String>,
    backend: Spanned<String>,
    name: Option<String>,
    system_prompt: Option<String>,
    #[serde(default = "default_max_tokens")]
    max_tokens: u32,
    #[serde(default)]
    reasoning: bool,
    reasoning_output: Option<Spanned<String>>,
    #[serde(default = "default_temperature")]
    temperature: f32,
    #[serde(default)]
    ack: bool,
    watts: Option<Spanned<f64>>,
    price_in_per_mtok: Option<Spanned<f64>>,
    price_out_per_mtok: Option<Spanned<f64>>,
    #[serde(default = "default_progress_every_secs")]
    progress_every_secs: u64,
    progress_mail_every_hours: Option<Spanned<f64>>,
    context_tokens: Option<Spanned<usize>>,
    // backend = "openai"
    url: Option<Spanned<String>>,
    model: Option<String>,
    api_key_env: Option<String>,
    #[serde(default = "default_timeout_secs")]
    timeout_secs: u64,
    #[serde(default = "default_retries")]
    retries: u32,
    // backend = "local"
    path: Option<PathBuf>,
    top_p: Option<f32>,
    top_k: Option<usize>,
    seed: Option<u64>,
    /// Stream routed experts from disk through a cache of this many MiB.
    expert_cache_mb: Option<usize>,
    /// One memory budget for the whole model (dense layers stream too).
    memory_mb: Option<Spanned<usize>>,
    #[serde(default = "default_checkpoint_every_tokens")]
    checkpoint_every_tokens: u32,
    #[serde(default = "default_checkpoint_every_secs")]
    checkpoint_every_secs: u64,
    #[serde(default = "default_max_batch")]
    max_batch: Spanned<usize>,
    /// "lookup" (the default), "none", or "model" (with `draft_model`).
    draft: Option<Spanned<String>>,
    /// A small model of the same tokenizer that drafts (implies draft = "model").
    draft_model: Option<Spanned<PathBuf>>,
    /// MiB of disk for finished answers' states, reused by follow-ups (0: none kept).
    #[serde(default = "default_state_cache_mb")]
    state_cache_mb: u64,
}

/// Room for about twenty 2,000-token threads of SmolLM2 (46 KiB of keys and values a token),
/// or seven of Kimi K2's latent cache (140 KiB a token).
fn default_state_cache_mb() -> u64 {
    2048
}

/// `draft` and `draft_model` together: a draft model drafts (`draft` unset or "model"), else
/// `draft` names the drafter (lookup by default).
fn drafter(
    draft: &Option<Spanned<String>>,
    model: &Option<Spanned<PathBuf>>,
    loc: &Locator<'_>,
) -> Result<crate::Draft, ConfigError> {
    let name = draft.as_ref().map(|d| (d.get_ref().as_str(), d));
    Ok(match (name, model) {
        (None | Some(("lookup", _)), None) => crate::Draft::Lookup,
        (Some(("none", _)), None) => crate::Draft::None,
        (Some(("mtp", _)), None) => crate::Draft::Mtp,
        (None | Some(("model", _)), Some(path)) => crate::Draft::Model(path.get_ref().clone()),
        (Some(("model", span)), None) => {
            return Err(loc.spanned(
                span,
                "model.draft \"model\" needs draft_model = PATH (the small model that guesses)".into(),
            ));
        }
        (Some((other @ ("lookup" | "none" | "mtp"), span)), Some(_)) => {
            return Err(loc.spanned(
                span,
                format!("model.draft `{other}` and model.draft_model are both set: drop draft to draft with the model, or draft_model"),
            ));
        }
        (Some((other, span)), _) => {
            return Err(
                loc.spanned(span, format!("model.draft `{other}`: use \"lookup\", \"model\", \"mtp\" or \"none\""))
            );
        }
    })
}

fn default_checkpoint_every_tokens() -> u32 {
    64
}

fn default_checkpoint_every_secs() -> u64 {
    300
}

fn default_max_batch() -> Spanned<usize> {
    Spanned::new(0..0, 4)
}

fn default_progress_every_secs() -> u64 {
    600
}

fn default_max_tokens() -> u32 {
    1024
}

fn default_temperature() -> f32 {
    0.7
}

fn default_timeout_secs() -> u64 {
    600
}

fn default_retries() -> u32 {
    2
}

/// Turns byte offsets into `line:column` for messages.
pub(crate) struct Locator<'a> {
    text: &'a str,
    path: String,
}

impl Locator<'_> {
    pub(crate) fn at(&self, offset: usize, message: String) -> ConfigError {
        let before = &self.text[..offset.min(self.text.len())];
        let line = before.matches('\n').count() + 1;
        let column = before.len() - before.rfind('\n').map(|i| i + 1).unwrap_or(0) + 1;
        ConfigError::Invalid { path: self.path.clone(), line, column, message }
    }

    pub(crate) fn spanned<T>(&self, value: &Spanned<T>, message: String) -> ConfigError {
        if value.span().is_empty() && value.span().start == 0 {
            ConfigError::Semantic { path: self.path.clone(), message }
        } else {
            self.at(value.span().start, message)
        }
    }
}

pub(crate) fn parse(text: &str, source: Option<&Path>) -> Result<Config, ConfigError> {
    let path = source.map(|p| p.display().to_string()).unwrap_or_else(|| DEFAULTS_NAME.to_string());
    let loc = Locator { text, path };
    let raw: RawConfig = toml::from_str(text).map_err(|e| {
        let offset = e.span().map(|s| s.start).unwrap_or(0);
        loc.at(
            offset,
            format!("{} (see config/nightmail.toml in the nightmail repository for every key)", e.message().trim()),
        )
    })?;
    let mut warnings = Vec::new();

    let hostname = raw.hostname.get_ref().trim().to_string();
    if hostname.is_empty() || hostname.contains(|c: char| c.is_whitespace() || c == '@') {
        return Err(
            loc.spanned(&raw.hostname, format!("hostname `{hostname}` must be a domain name like nightmail.local"))
        );
    }

    let smtp = check_smtp(&raw.smtp, &loc)?;
    let tls = raw.tls.map(|t| check_tls(&t, &loc)).transpose()?;
    // RFC 8314 §3: an implicit-TLS listener needs a certificate to speak TLS with.
    for (key, listen) in [("smtp.listen_tls", &raw.smtp.listen_tls), ("imap.listen_tls", &raw.imap.listen_tls)] {
        if let (Some(listen), None) = (listen, &tls) {
            return Err(
                loc.spanned(listen, format!("{key} needs a [tls] section (cert and key, or self_signed = true)"))
            );
        }
    }
    let auth = AuthConfig {
        failure_delay: Duration::from_millis(raw.auth.failure_delay_ms),
        max_failures: raw.auth.max_failures.max(1),
        max_client_failures: raw.auth.max_client_failures.max(1),
        failure_window: Duration::from_secs(raw.auth.failure_window_secs),
        max_concurrent_hashes: raw.auth.max_concurrent_hashes.max(1),
    };

    let relay = raw.relay.as_ref().map(|r| check_relay(r, &loc)).transpose()?;
    if let Some(relay) = &relay
        && relay.tls_insecure
    {
        warnings.push(format!(
            "relay.tls_insecure = true in {}: the certificate of {} is not verified, so anyone on the path can read and change outgoing mail",
            loc.path, relay.host
        ));
    }

    let mut users: Vec<User> = Vec::new();
    for spanned in &raw.user {
        let user = check_user(spanned, &loc)?;
        if matches!(user.password, Password::Plain(_)) {
            warnings.push(format!(
                "user `{}` has a plain-text password in {}: run `nightmail user add {} --address {}` to store an argon2 hash instead",
                user.name, loc.path, user.name, user.address
            ));
        }
        if users.iter().any(|u| u.name.eq_ignore_ascii_case(&user.name)) {
            return Err(loc.spanned(&spanned.get_ref().name, format!("user name `{}` appears twice", user.name)));
        }
        if users.iter().any(|u| u.address == user.address) {
            return Err(
                loc.spanned(&spanned.get_ref().address, format!("address {} belongs to two users", user.address))
            );
        }
        users.push(user);
    }

    let mut models: Vec<Model> = Vec::new();
    for spanned in &raw.model {
        let model = check_model(spanned, &loc)?;
        if users.iter().any(|u| u.address == model.address) || models.iter().any(|o| o.address == model.address) {
            return Err(loc.spanned(
                &spanned.get_ref().address,
                format!("address {} is used twice (by a user or another model)", model.address),
            ));
        }
        models.push(model);
    }
    let mut bridges: Vec<crate::BridgeConfig> = Vec::new();
    for spanned in &raw.bridge {
        let bridge = crate::bridge::check(spanned, &loc, &models)?;
        if bridge.tls_insecure {
            warnings.push(format!(
                "bridge {}: tls_insecure = true in {}: the certificates of {} and {} are not verified",
                bridge.address, loc.path, bridge.imap.host, bridge.smtp.host
            ));
        }
        let taken = |a: &Address| {
            users.iter().any(|u| &u.address == a)
                || models.iter().any(|m| &m.address == a)
                || bridges.iter().any(|b| &b.address == a)
        };
        if taken(&bridge.address) {
            return Err(loc.spanned(
                &spanned.get_ref().address,
                format!("bridge.address {} is used twice (by a user, a model or another bridge)", bridge.address),
            ));
        }
        bridges.push(bridge);
    }
    if users.is_empty() {
        warnings.push(format!(
            "{} has no [[user]]: nobody can log in; add one with `nightmail user add NAME --address A`",
            loc.path
        ));
    }

    Ok(Config {
        hostname,
        data_dir: raw.data_dir,
        smtp,
        imap: check_imap(&raw.imap, &loc)?,
        tls,
        auth,
        users,
        models,
        worker: WorkerConfig {
            concurrency: raw.worker.concurrency,
            lease: Duration::from_secs(raw.worker.lease_secs.max(10)),
            max_replies_per_sender_per_hour: raw.worker.max_replies_per_sender_per_hour,
            retry_base: Duration::from_secs(raw.worker.retry_base_secs),
            retry_max: Duration::from_secs(raw.worker.retry_max_secs.max(raw.worker.retry_base_secs)),
            max_attempts: raw.worker.max_attempts.max(1),
            retention: (raw.worker.retention_days > 0)
                .then(|| Duration::from_secs(raw.worker.retention_days.saturating_mul(86_400))),
        },
        relay,
        bridges,
        source: source.map(Path::to_path_buf),
        warnings,
    })
}

pub(crate) fn address(value: &Spanned<String>, loc: &Locator<'_>, key: &str) -> Result<Address, ConfigError> {
    Address::parse(value.get_ref()).map_err(|e| loc.spanned(value, format!("{key}: {e}")))
}

fn check_smtp(raw: &RawSmtp, loc: &Locator<'_>) -> Result<SmtpConfig, ConfigError> {
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
    })
}

fn check_imap(raw: &RawImap, loc: &Locator<'_>) -> Result<ImapConfig, ConfigError> {
    let positive = |v: &Spanned<usize>, key: &str| match *v.get_ref() {
        0 => Err(loc.spanned(v, format!("imap.{key} must be greater than 0"))),
        n => Ok(n),
    };
    if *raw.command_timeout_secs.get_ref() == 0 {
        return Err(loc.spanned(&raw.command_timeout_secs, "imap.command_timeout_secs must be greater than 0".into()));
    }
    Ok(ImapConfig {
        listen: raw.listen,
        listen_tls: raw.listen_tls.as_ref().map(|l| *l.get_ref()),
        max_connections: positive(&raw.max_connections, "max_connections")?,
        max_connections_per_ip: positive(&raw.max_connections_per_ip, "max_connections_per_ip")?,
        command_timeout: Duration::from_secs(*raw.command_timeout_secs.get_ref()),
        max_mailboxes: positive(&raw.max_mailboxes, "max_mailboxes")?,
        max_mailbox_name_bytes: positive(&raw.max_mailbox_name_bytes, "max_mailbox_name_bytes")?,
    })
}

fn check_tls(raw: &Spanned<RawTls>, loc: &Locator<'_>) -> Result<TlsConfig, ConfigError> {
    let t = raw.get_ref();
    match (&t.cert, &t.key, t.self_signed) {
        (Some(cert), Some(key), false) => Ok(TlsConfig::Files { cert: cert.clone(), key: key.clone() }),
        (None, None, true) => Ok(TlsConfig::SelfSigned),
        _ => Err(loc.spanned(
            raw,
            "[tls] needs either `cert` and `key` (PEM file paths) or `self_signed = true`, not both".into(),
        )),
    }
}

/// Whether `host` is this machine: the only place a smarthost may be reached without TLS.
pub(crate) fn is_loopback_host(host: &str) -> bool {
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    host.eq_ignore_ascii_case("localhost") || bare.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

/// A TLS mode key (`relay.tls`, `bridge.imap_tls`...): "starttls", "implicit" or "none", the last
/// only for a loopback `host`.
pub(crate) fn tls_mode(
    value: &Spanned<String>,
    host: &str,
    key: &str,
    loc: &Locator<'_>,
) -> Result<RelayTls, ConfigError> {
    let tls = match value.get_ref().as_str() {
        "starttls" => RelayTls::StartTls,
        "implicit" => RelayTls::Implicit,
        "none" => RelayTls::None,
        other => {
            return Err(loc.spanned(value, format!("{key} `{other}`: use \"starttls\", \"implicit\" or \"none\"")));
        }
    };
    if tls == RelayTls::None && !is_loopback_host(host) {
        return Err(loc.spanned(
            value,
            format!(
                "{key} = \"none\" is allowed only for a loopback host, not {host}: mail and the password would cross the network in the clear; use \"starttls\" or \"implicit\""
            ),
        ));
    }
    Ok(tls)
}

/// `user` with `password_env` or `password_file` (one of them, never both) in `section`.
pub(crate) fn login(
    section: &str,
    user: Option<&Spanned<String>>,
    password_env: Option<&Spanned<String>>,
    password_file: Option<&Spanned<PathBuf>>,
    loc: &Locator<'_>,
) -> Result<Option<(String, PasswordSource)>, ConfigError> {
    let password = match (password_env, password_file) {
        (Some(env), None) => Some((env.span(), PasswordSource::Env(env.get_ref().clone()))),
        (None, Some(file)) => Some((file.span(), PasswordSource::File(file.get_ref().clone()))),
        (None, None) => None,
        (Some(env), Some(_)) => {
            return Err(loc.spanned(env, format!("{section}: give either `password_env` or `password_file`, not both")));
        }
    };
    match (user, password) {
        (Some(user), Some((_, source))) => {
            let name = user.get_ref().trim().to_string();
            if name.is_empty() {
                return Err(loc.spanned(user, format!("{section}.user must not be empty")));
            }
            Ok(Some((name, source)))
        }
        (None, None) => Ok(None),
        (Some(user), None) => Err(loc.spanned(
            user,
            format!(
                "{section}.user needs a password: set `password_env` (an environment variable's name) or `password_file`"
            ),
        )),
        (None, Some((span, _))) => {
            Err(loc.at(span.start, format!("{section}: a password without `user`: set {section}.user (the login)")))
        }
    }
}

fn check_relay(spanned: &Spanned<RawRelay>, loc: &Locator<'_>) -> Result<RelayConfig, ConfigError> {
    let r = spanned.get_ref();
    let host = r.host.get_ref().trim().to_string();
    if host.is_empty() || host.contains(|c: char| c.is_whitespace() || c == '/' || c == '@') {
        return Err(loc.spanned(&r.host, format!("relay.host `{host}` must be a host name or an IP address")));
    }
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

fn check_model(spanned: &Spanned<RawModel>, loc: &Locator<'_>) -> Result<Model, ConfigError> {
    let m = spanned.get_ref();
    let address = address(&m.address, loc, "model.address")?;
    let backend = match m.backend.get_ref().as_str() {
        "openai" => {
            let Some(url) = &m.url else {
                return Err(loc.spanned(
                    spanned,
                    format!("model {address}: backend \"openai\" needs `url` (e.g. \"http://127.0.0.1:8080/v1\")"),
                ));
            };
            let text = url.get_ref().trim_end_matches('/').to_string();
            if !(text.starts_with("http://") || text.starts_with("https://")) {
                return Err(loc.spanned(url, format!("model.url `{text}` must start with http:// or https://")));
            }
            BackendConfig::OpenAi {
                url: text,
                model: m.model.clone().unwrap_or_else(|| "default".into()),
                api_key_env: m.api_key_env.clone(),
                timeout: Duration::from_secs(m.timeout_secs.max(1)),
                retries: m.retries,
            }
        }
        "local" => {
            let Some(path) = &m.path else {
                return Err(loc.spanned(
                    spanned,
                    format!("model {address}: backend \"local\" needs `path` (a GGUF file or a model directory)"),
                ));
            };
            if *m.max_batch.get_ref() == 0 {
                return Err(loc.spanned(&m.max_batch, "model.max_batch must be at least 1".to_string()));
            }
            if let Some(mb) = &m.memory_mb {
                if *mb.get_ref() == 0 {
                    return Err(loc.spanned(mb, "model.memory_mb must be at least 1 (MiB)".to_string()));
                }
                if m.expert_cache_mb.is_some() {
                    return Err(loc.spanned(
                        mb,
                        "model.memory_mb and model.expert_cache_mb are both set: keep memory_mb, which sizes \
                         the expert cache itself"
                            .to_string(),
                    ));
                }
            }
            BackendConfig::Local(crate::LocalBackend {
                path: path.clone(),
                top_p: m.top_p,
                top_k: m.top_k,
                seed: m.seed,
                expert_cache_mb: m.expert_cache_mb,
                memory_mb: m.memory_mb.as_ref().map(|mb| *mb.get_ref()),
                checkpoint_every_tokens: m.checkpoint_every_tokens.max(1),
                checkpoint_every: Duration::from_secs(m.checkpoint_every_secs.max(1)),
                max_batch: *m.max_batch.get_ref(),
                state_cache_mb: m.state_cache_mb,
                draft: drafter(&m.draft, &m.draft_model, loc)?,
            })
        }
        other => {
            return Err(
                loc.spanned(&m.backend, format!("model.backend `{other}` is not known: use \"openai\" or \"local\""))
            );
        }
    };
    let reasoning_output = match m.reasoning_output.as_ref().map(|r| r.get_ref().as_str()) {
        None | Some("omit") => ReasoningOutput::Omit,
        Some("attach") => ReasoningOutput::Attach,
        Some(other) => {
            let span = m.reasoning_output.as_ref().expect("matched Some");
            return Err(loc.spanned(span, format!("model.reasoning_output `{other}`: use \"omit\" or \"attach\"")));
        }
    };
    if !(0.0..=2.0).contains(&m.temperature) {
        return Err(loc.spanned(spanned, format!("model {address}: temperature must be between 0 and 2")));
    }
    let cost = check_cost(spanned, loc, &address)?;
    let progress_mail_every = match &m.progress_mail_every_hours {
        Some(h) if !(h.get_ref().is_finite() && *h.get_ref() > 0.0) => {
            return Err(loc.spanned(
                h,
                "model.progress_mail_every_hours must be a number above 0 (leave it out for no progress mail)".into(),
            ));
        }
        Some(h) => Some(Duration::from_secs_f64(h.get_ref() * 3600.0)),
        None => None,
    };
    let context_tokens = match &m.context_tokens {
        Some(c) if *c.get_ref() < 16 => {
            return Err(
                loc.spanned(c, "model.context_tokens must be at least 16 (leave it out to use the model's own)".into())
            );
        }
        c => c.as_ref().map(|c| *c.get_ref()),
    };
    Ok(Model {
        address,
        name: m.name.clone(),
        backend,
        system_prompt: m.system_prompt.clone(),
        max_tokens: m.max_tokens.max(1),
        reasoning: m.reasoning,
        reasoning_output,
        temperature: m.temperature,
        ack: m.ack,
        cost,
        progress_every: Duration::from_secs(m.progress_every_secs.max(1)),
        progress_mail_every,
        context_tokens,
    })
}

/// `watts` and the API price: positive numbers, the price's two halves together.
fn check_cost(spanned: &Spanned<RawModel>, loc: &Locator<'_>, address: &Address) -> Result<Cost, ConfigError> {
    let m = spanned.get_ref();
    let positive = |value: &Option<Spanned<f64>>, key: &str| -> Result<Option<f64>, ConfigError> {
        match value {
            Some(v) if !(v.get_ref().is_finite() && *v.get_ref() >= 0.0) => {
                Err(loc.spanned(v, format!("model.{key} must be a number of at least 0")))
            }
            Some(v) => Ok(Some(*v.get_ref())),
            None => Ok(None),
        }
    };
    let watts = positive(&m.watts, "watts")?;
    let api_price = match (
        positive(&m.price_in_per_mtok, "price_in_per_mtok")?,
        positive(&m.price_out_per_mtok, "price_out_per_mtok")?,
    ) {
        (Some(input_per_mtok), Some(output_per_mtok)) => Some(ApiPrice { input_per_mtok, output_per_mtok }),
        (None, None) => None,
        (Some(_), None) | (None, Some(_)) => {
            return Err(loc.spanned(
                spanned,
                format!("model {address}: give both price_in_per_mtok and price_out_per_mtok (US dollars per million tokens), or neither"),
            ));
        }
    };
    Ok(Cost { watts, api_price })
}

fn check_user(spanned: &Spanned<RawUser>, loc: &Locator<'_>) -> Result<User, ConfigError> {
    let u = spanned.get_ref();
    let name = u.name.get_ref().trim().to_string();
    if name.is_empty() || name.contains(|c: char| c.is_whitespace() || c.is_control()) {
        return Err(loc.spanned(&u.name, format!("user.name `{name}` must be one word")));
    }
    let address = address(&u.address, loc, "user.address")?;
    let password = match (&u.password, &u.password_hash) {
        (Some(p), None) => Password::Plain(p.clone()),
        (None, Some(h)) => {
            if !h.get_ref().starts_with("$argon2") {
                return Err(loc.spanned(
                    h,
                    "user.password_hash must be an argon2 PHC string ($argon2id$...), as `nightmail user add` writes"
                        .into(),
                ));
            }
            Password::Argon2(h.get_ref().clone())
        }
        _ => {
            return Err(
                loc.spanned(spanned, format!("user `{name}` needs exactly one of `password` or `password_hash`"))
            );
        }
    };
    Ok(User { name, address, password })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(text: &str) -> String {
        parse(text, Some(Path::new("nm.toml"))).unwrap_err().to_string()
    }

    #[test]
    fn defaults_are_loopback() {
        let c = Config::defaults();
        assert!(c.smtp.listen.ip().is_loopback() && c.imap.listen.ip().is_loopback());
        assert_eq!(c.smtp.max_message_bytes, 26214400);
        assert_eq!(c.hostname, "nightmail.local");
    }

    #[test]
    fn the_shipped_config_is_valid() {
        let text = include_str!("../../../config/nightmail.toml");
        let c = parse(text, None).unwrap();
        assert!(!c.users.is_empty() && !c.models.is_empty());
        assert!(c.warnings.is_empty(), "{:?}", c.warnings);
    }

    #[test]
    fn each_model_gets_one_ask_folder() {
        let model = |address: &str, name: &str| {
            format!("[[model]]\naddress = \"{address}\"\n{name}backend = \"openai\"\nurl = \"http://x\"\n")
        };
        let text = [
            model("kimi@n.local", "name = \"Kimi\"\n"),
            model("qwen@n.local", ""),
            model("k2@n.local", "name = \"kimi\"\n"),
            model("gpt@n.local", "name = \"GPT/OSS\"\n"),
        ]
        .concat();
        let c = parse(&text, None).unwrap();
        let folders: Vec<(String, &str)> = c.ask_folders().into_iter().map(|(f, m)| (f, m.address.as_str())).collect();
        assert_eq!(
            folders,
            [
                ("Ask/Kimi".to_string(), "kimi@n.local"),
                ("Ask/qwen".to_string(), "qwen@n.local"),
                ("Ask/k2@n.local".to_string(), "k2@n.local"),
                ("Ask/GPT-OSS".to_string(), "gpt@n.local"),
            ]
        );
        assert_eq!(c.ask_folder("Ask/qwen").map(|m| m.address.as_str()), Some("qwen@n.local"));
        assert!(c.ask_folder("Ask").is_none() && c.ask_folder("INBOX").is_none());
    }

    #[test]
    fn an_unknown_key_names_its_line() {
        let e = err("hostname = \"a.b\"\n[smtp]\nlisten = \"127.0.0.1:1\"\nmax_mesage_bytes = 5\n");
        assert!(e.starts_with("nm.toml:4:"), "{e}");
        assert!(e.contains("max_mesage_bytes"), "{e}");
    }

    #[test]
    fn a_bad_address_names_its_line_and_key() {
        let e = err("[[user]]\nname = \"me\"\naddress = \"not an address\"\npassword = \"x\"\n");
        assert!(e.starts_with("nm.toml:3:"), "{e}");
        assert!(e.contains("user.address"), "{e}");
        let e = err("[[model]]\naddress = \"kimi\"\nbackend = \"openai\"\nurl = \"http://x\"\n");
        assert!(e.starts_with("nm.toml:2:") && e.contains("model.address"), "{e}");
    }

    #[test]
    fn semantic_mistakes_are_named() {
        assert!(err("[[model]]\naddress = \"k@x\"\nbackend = \"gpt\"\n").contains("use \"openai\" or \"local\""));
        assert!(err("[[model]]\naddress = \"k@x\"\nbackend = \"openai\"\n").contains("needs `url`"));
        assert!(err("[[model]]\naddress = \"k@x\"\nbackend = \"local\"\n").contains("needs `path`"));
        assert!(err("[[model]]\naddress = \"k@x\"\nbackend = \"openai\"\nurl = \"ftp://x\"\n").contains("nm.toml:4:"));
        assert!(err("[[user]]\nname = \"me\"\naddress = \"me@x\"\n").contains("exactly one of"));
        assert!(err("[[user]]\nname = \"me\"\naddress = \"me@x\"\npassword_hash = \"md5\"\n").contains("argon2"));
        let twice = "[[user]]\nname = \"a\"\naddress = \"me@x\"\npassword = \"p\"\n[[model]]\naddress = \"ME@x\"\nbackend = \"local\"\npath = \"m.gguf\"\n";
        assert!(err(twice).contains("used twice"));
        assert!(err("[smtp]\nlisten = \"nowhere\"\n").contains("nm.toml:2:"));
        assert!(err("[tls]\nself_signed = true\ncert = \"c.pem\"\n").contains("[tls]"));
    }

    #[test]
    fn cost_keys_are_checked() {
        let model = "[[model]]\naddress = \"k@x\"\nbackend = \"openai\"\nurl = \"http://h/v1\"\n";
        let c =
            parse(&format!("{model}watts = 45.5\nprice_in_per_mtok = 3\nprice_out_per_mtok = 15.0\n"), None).unwrap();
        let price = ApiPrice { input_per_mtok: 3.0, output_per_mtok: 15.0 };
        assert_eq!(c.models[0].cost, Cost { watts: Some(45.5), api_price: Some(price) });
        assert_eq!(parse(model, None).unwrap().models[0].cost, Cost::default());
        let e = err(&format!("{model}watts = -1\n"));
        assert!(e.starts_with("nm.toml:5:") && e.contains("model.watts must be a number of at least 0"), "{e}");
        let e = err(&format!("{model}price_out_per_mtok = 15\n"));
        assert!(e.contains("give both price_in_per_mtok and price_out_per_mtok"), "{e}");
    }

    #[test]
    fn progress_and_context_keys_are_checked() {
        let model = "[[model]]\naddress = \"k@x\"\nbackend = \"openai\"\nurl = \"http://h/v1\"\n";
        let m = &parse(model, None).unwrap().models[0];
        assert_eq!((m.progress_every, m.progress_mail_every, m.context_tokens), (Duration::from_secs(600), None, None));
        let c = parse(
            &format!("{model}progress_every_secs = 2\nprogress_mail_every_hours = 0.5\ncontext_tokens = 4096\n"),
            None,
        )
        .unwrap();
        let m = &c.models[0];
        assert_eq!(m.progress_every, Duration::from_secs(2));
        assert_eq!(m.progress_mail_every, Some(Duration::from_secs(1800)));
        assert_eq!(m.context_tokens, Some(4096));
        let e = err(&format!("{model}progress_mail_every_hours = 0\n"));
        assert!(e.starts_with("nm.toml:5:") && e.contains("progress_mail_every_hours must be a number above 0"), "{e}");
        let e = err(&format!("{model}context_tokens = 3\n"));
        assert!(e.starts_with("nm.toml:5:") && e.contains("context_tokens must be at least 16"), "{e}");
    }

    #[test]
    fn an_implicit_tls_listener_needs_a_certificate() {
        let c = parse("[smtp]\nlisten_tls = \"127.0.0.1:4650\"\n[imap]\nlisten_tls = \"127.0.0.1:9930\"\n[tls]\nself_signed = true\n", None).unwrap();
        assert_eq!(c.smtp.listen_tls, Some("127.0.0.1:4650".parse().unwrap()));
        assert_eq!(c.imap.listen_tls, Some("127.0.0.1:9930".parse().unwrap()));
        assert_eq!(parse("", None).unwrap().smtp.listen_tls, None);
        let e = err("[imap]\nlisten_tls = \"127.0.0.1:9930\"\n");
        assert!(e.starts_with("nm.toml:2:") && e.contains("imap.listen_tls needs a [tls] section"), "{e}");
    }

    #[test]
    fn relay_keys_are_checked() {
        let ok =
            parse("[relay]\nhost = \"smtp.example.com\"\nuser = \"me\"\npassword_env = \"NM_PW\"\n", None).unwrap();
        let relay = ok.relay.unwrap();
        assert_eq!((relay.port, relay.tls, relay.max_recipients_per_reply), (587, RelayTls::StartTls, 20));
        assert_eq!(relay.give_up_after, Duration::from_secs(72 * 3600));
        assert!(!format!("{relay:?}").contains("secret"));
        assert_eq!(parse("[relay]\nhost = \"h\"\ntls = \"implicit\"\n", None).unwrap().relay.unwrap().port, 465);
        assert_eq!(
            parse("[relay]\nhost = \"127.0.0.1\"\ntls = \"none\"\nport = 2500\n", None).unwrap().relay.unwrap().port,
            2500
        );
        assert!(parse("[relay]\nhost = \"localhost\"\ntls = \"none\"\n", None).is_ok());

        let e = err("[relay]\nhost = \"smtp.example.com\"\ntls = \"none\"\n");
        assert!(e.starts_with("nm.toml:3:") && e.contains("relay.tls") && e.contains("loopback"), "{e}");
        let e = err("[relay]\nhost = \"h\"\ntls = \"ssl\"\n");
        assert!(e.contains("relay.tls `ssl`"), "{e}");
        let e = err("[relay]\nhost = \"h\"\nuser = \"me\"\n");
        assert!(e.starts_with("nm.toml:3:") && e.contains("password_env"), "{e}");
        let e = err("[relay]\nhost = \"h\"\npassword_env = \"X\"\n");
        assert!(e.contains("relay.user"), "{e}");
        let e = err("[relay]\nhost = \"h\"\nuser = \"me\"\npassword_env = \"X\"\npassword_file = \"f\"\n");
        assert!(e.contains("not both"), "{e}");
        let e = err("[relay]\nhost = \"h\"\npasword = \"x\"\n");
        assert!(e.contains("pasword"), "{e}");
        let insecure = parse("[relay]\nhost = \"h\"\ntls_insecure = true\n", None).unwrap();
        assert!(insecure.warnings.iter().any(|w| w.contains("tls_insecure")));
    }

    #[test]
    fn a_relay_password_is_read_but_never_shown() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("pw");
        std::fs::write(&file, "hunter2\n").unwrap();
        let secret = PasswordSource::File(file.clone()).read().unwrap();
        assert_eq!(secret.expose(), "hunter2");
        assert_eq!(format!("{secret:?}"), "Secret(..)");
        let missing = PasswordSource::Env("NIGHTMAIL_TEST_SURELY_UNSET".into()).read().unwrap_err();
        assert!(missing.contains("NIGHTMAIL_TEST_SURELY_UNSET") && missing.contains("relay.password_env"), "{missing}");
        std::fs::write(&file, "").unwrap();
        assert!(PasswordSource::File(file).read().unwrap_err().contains("empty"));
    }

    #[test]
    fn a_memory_budget_is_read_and_its_mistakes_are_named() {
        let local = "[[model]]\naddress = \"k@x\"\nbackend = \"local\"\npath = \"m.gguf\"\n";
        let c = parse(&format!("{local}memory_mb = 512\n"), None).unwrap();
        let BackendConfig::Local(b) = &c.models[0].backend else { panic!("a local model") };
        assert_eq!((b.memory_mb, b.expert_cache_mb), (Some(512), None));
        let e = err(&format!("{local}memory_mb = 0\n"));
        assert!(e.starts_with("nm.toml:5:") && e.contains("at least 1"), "{e}");
        let e = err(&format!("{local}expert_cache_mb = 64\nmemory_mb = 512\n"));
        assert!(e.starts_with("nm.toml:6:") && e.contains("keep memory_mb"), "{e}");
    }

    #[test]
    fn a_drafter_is_read_lookup_by_default_and_an_unknown_one_is_named() {
        let local = "[[model]]\naddress = \"k@x\"\nbackend = \"local\"\npath = \"m.gguf\"\n";
        let draft = |text: &str| match &parse(text, None).unwrap().models[0].backend {
            BackendConfig::Local(b) => b.draft.clone(),
            BackendConfig::OpenAi { .. } => panic!("a local model"),
        };
        assert_eq!(draft(local), crate::Draft::Lookup);
        assert_eq!(draft(&format!("{local}draft = \"none\"\n")), crate::Draft::None);
        assert_eq!(draft(&format!("{local}draft = \"lookup\"\n")), crate::Draft::Lookup);
        assert_eq!(draft(&format!("{local}draft = \"mtp\"\n")), crate::Draft::Mtp);
        let e = err(&format!("{local}draft = \"medusa\"\n"));
        assert!(e.starts_with("nm.toml:5:") && e.contains("use \"lookup\", \"model\", \"mtp\" or \"none\""), "{e}");
        let e = err(&format!("{local}draft = \"mtp\"\ndraft_model = \"small.gguf\"\n"));
        assert!(e.starts_with("nm.toml:5:") && e.contains("both set"), "{e}");
        // A draft model drafts whether or not draft = "model" says so; it needs its path, and
        // another drafter beside it is refused, at the line that names it.
        let small = crate::Draft::Model(PathBuf::from("small.gguf"));
        assert_eq!(draft(&format!("{local}draft_model = \"small.gguf\"\n")), small);
        assert_eq!(draft(&format!("{local}draft = \"model\"\ndraft_model = \"small.gguf\"\n")), small);
        let e = err(&format!("{local}draft = \"model\"\n"));
        assert!(e.starts_with("nm.toml:5:") && e.contains("needs draft_model = PATH"), "{e}");
        let e = err(&format!("{local}draft = \"none\"\ndraft_model = \"small.gguf\"\n"));
        assert!(e.starts_with("nm.toml:5:") && e.contains("both set"), "{e}");
    }

    #[test]
    fn the_state_cache_budget_is_read_with_a_default_and_0_turns_it_off() {
        let local = "[[model]]\naddress = \"k@x\"\nbackend = \"local\"\npath = \"m.gguf\"\n";
        let mb = |text: &str| match &parse(text, None).unwrap().models[0].backend {
            BackendConfig::Local(b) => b.state_cache_mb,
            BackendConfig::OpenAi { .. } => panic!("a local model"),
        };
        assert_eq!(mb(local), 2048);
        assert_eq!(mb(&format!("{local}state_cache_mb = 64\n")), 64);
        assert_eq!(mb(&format!("{local}state_cache_mb = 0\n")), 0);
        let e = err(&format!("{local}state_cache_mb = -1\n"));
        assert!(e.starts_with("nm.toml:5:") && e.contains("expected u64"), "{e}");
    }

    #[test]
    fn users_are_found_by_name_or_address() {
        let c = parse("[[user]]\nname = \"me\"\naddress = \"Me@X.org\"\npassword = \"p\"\n", None).unwrap();
        assert_eq!(c.user("ME").unwrap().name, "me");
        assert_eq!(c.user("me@x.org").unwrap().name, "me");
        assert!(c.user("you").is_none());
        assert_eq!(c.warnings.len(), 1, "plain-text password warns");
    }
}
