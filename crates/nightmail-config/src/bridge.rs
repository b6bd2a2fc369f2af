//! `[[bridge]]`: a mailbox at another provider (say `kimi.bot@fastmail.com`) that a model answers
//! from: read over IMAP, answered over that provider's SMTP submission server.

use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;
use toml::Spanned;

use nightmail_types::Address;

use crate::error::{ConfigError, Locator, address};
use crate::model::ModelEntry;
use crate::upstream::{PasswordSource, RelayTls, host, login, tls_mode};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawBridge {
    model: Spanned<String>,
    pub(crate) address: Spanned<String>,
    imap_host: Spanned<String>,
    imap_port: Option<u16>,
    #[serde(default = "default_tls")]
    imap_tls: Spanned<String>,
    smtp_host: Spanned<String>,
    smtp_port: Option<u16>,
    #[serde(default = "default_tls")]
    smtp_tls: Spanned<String>,
    user: Spanned<String>,
    password_env: Option<Spanned<String>>,
    password_file: Option<Spanned<PathBuf>>,
    #[serde(default = "no_one")]
    allow: Spanned<Vec<Spanned<String>>>,
    auth_serv_id: Option<Spanned<String>>,
    #[serde(default = "default_flag")]
    flag: Spanned<String>,
    #[serde(default = "default_mailbox")]
    mailbox: String,
    #[serde(default = "default_sent")]
    sent_mailbox: String,
    #[serde(default)]
    tls_insecure: bool,
    ca_file: Option<PathBuf>,
    #[serde(default = "default_poll_secs")]
    poll_secs: Spanned<u64>,
    #[serde(default = "default_max_recipients_per_reply")]
    max_recipients_per_reply: usize,
    #[serde(default = "default_timeout_secs")]
    timeout_secs: Spanned<u64>,
}

fn default_tls() -> Spanned<String> {
    Spanned::new(0..0, "implicit".into())
}

fn no_one() -> Spanned<Vec<Spanned<String>>> {
    Spanned::new(0..0, Vec::new())
}

fn default_flag() -> Spanned<String> {
    Spanned::new(0..0, "\\Seen".into())
}

fn default_mailbox() -> String {
    "INBOX".into()
}

fn default_sent() -> String {
    "Sent".into()
}

fn default_poll_secs() -> Spanned<u64> {
    Spanned::new(0..0, 60)
}

fn default_max_recipients_per_reply() -> usize {
    20
}

fn default_timeout_secs() -> Spanned<u64> {
    Spanned::new(0..0, 60)
}

/// A server to connect to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Endpoint {
    pub host: String,
    pub port: u16,
    pub tls: RelayTls,
}

impl Endpoint {
    /// `host:port (tls)`, for messages.
    pub fn describe(&self) -> String {
        format!("{}:{} ({})", self.host, self.port, self.tls.name())
    }
}

/// Who a bridge answers: one address, or everyone at a domain (`*@example.com`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Allow {
    Address(Address),
    Domain(String),
}

impl Allow {
    pub fn admits(&self, sender: &Address) -> bool {
        match self {
            Allow::Address(a) => a == sender,
            Allow::Domain(d) => sender.domain().eq_ignore_ascii_case(d),
        }
    }
}

/// One bridged mailbox.
#[derive(Clone, Debug)]
pub struct BridgeConfig {
    /// The `[[model]]` that answers.
    pub model: Address,
    /// The upstream address: the bot's mailbox at the provider. Replies come from it.
    pub address: Address,
    pub imap: Endpoint,
    pub smtp: Endpoint,
    /// The login at the provider (IMAP and SMTP) and where its password is.
    pub user: String,
    pub password: PasswordSource,
    /// Senders answered; everyone else is logged and ignored.
    pub allow: Vec<Allow>,
    /// The provider's authserv-id (RFC 8601 §2.2): only its `Authentication-Results` count.
    pub auth_serv_id: String,
    /// The flag or keyword set on an upstream message once its job is queued (`\Seen` by default).
    pub flag: String,
    /// The upstream mailbox read (INBOX) and the one replies are appended to (Sent).
    pub mailbox: String,
    pub sent_mailbox: String,
    /// Accept certificates that do not verify. Only when set explicitly, and logged.
    pub tls_insecure: bool,
    /// Extra trusted roots (PEM), for a provider with a private CA.
    pub ca_file: Option<PathBuf>,
    /// How often to look for new mail when the server has no IDLE (RFC 2177), and the longest
    /// wait between reconnects.
    pub poll: Duration,
    /// Recipients of one reply; the rest are named in it, not sent to.
    pub max_recipients_per_reply: usize,
    /// Connecting and each command.
    pub timeout: Duration,
}

/// RFC 3501 §2.3.2: a keyword is an atom; system flags start with `\` and only these may be set.
fn check_flag(value: &Spanned<String>, loc: &Locator<'_>) -> Result<String, ConfigError> {
    let flag = value.get_ref().trim();
    const SYSTEM: [&str; 4] = ["\\Seen", "\\Flagged", "\\Answered", "\\Draft"];
    if let Some(system) = SYSTEM.iter().find(|s| s.eq_ignore_ascii_case(flag)) {
        return Ok(system.to_string());
    }
    let atom = !flag.is_empty() && flag.bytes().all(|b| b.is_ascii_graphic() && !b"(){%*\"\\]".contains(&b));
    if !atom {
        return Err(loc.spanned(
            value,
            format!("bridge.flag `{flag}`: use \\Seen, \\Flagged, \\Answered or a keyword such as \"$Nightmail\""),
        ));
    }
    Ok(flag.to_string())
}

pub(crate) fn check(
    spanned: &Spanned<RawBridge>,
    loc: &Locator<'_>,
    models: &[ModelEntry],
) -> Result<BridgeConfig, ConfigError> {
    let b = spanned.get_ref();
    let model = address(&b.model, loc, "bridge.model")?;
    if !models.iter().any(|m| m.address == model) {
        return Err(loc.spanned(&b.model, format!("bridge.model {model} is not the address of a [[model]]")));
    }
    let bridge_address = address(&b.address, loc, "bridge.address")?;
    let imap_host = host(&b.imap_host, "bridge.imap_host", loc)?;
    let imap_tls = tls_mode(&b.imap_tls, &imap_host, "bridge.imap_tls", loc)?;
    let smtp_host = host(&b.smtp_host, "bridge.smtp_host", loc)?;
    let smtp_tls = tls_mode(&b.smtp_tls, &smtp_host, "bridge.smtp_tls", loc)?;
    let imap = Endpoint {
        port: b.imap_port.unwrap_or(if imap_tls == RelayTls::Implicit { 993 } else { 143 }),
        host: imap_host,
        tls: imap_tls,
    };
    let smtp = Endpoint {
        port: b.smtp_port.unwrap_or(match smtp_tls {
            RelayTls::Implicit => 465,
            RelayTls::StartTls => 587,
            RelayTls::None => 25,
        }),
        host: smtp_host,
        tls: smtp_tls,
    };
    let Some((user, password)) =
        login("bridge", Some(&b.user), b.password_env.as_ref(), b.password_file.as_ref(), loc)?
    else {
        unreachable!("a user is always given to login()")
    };
    let mut allow = Vec::new();
    for entry in b.allow.get_ref() {
        let text = entry.get_ref().trim();
        let parsed = match text.strip_prefix("*@") {
            Some(domain) if !domain.is_empty() && !domain.contains(['@', '*', ' ']) => {
                Allow::Domain(domain.to_ascii_lowercase())
            }
            _ => Allow::Address(Address::parse(text).map_err(|e| {
                loc.spanned(entry, format!("bridge.allow `{text}`: {e} (use an address or \"*@domain\")"))
            })?),
        };
        allow.push(parsed);
    }
    if allow.is_empty() {
        return Err(loc.spanned(
            &b.allow,
            format!(
                "bridge {bridge_address}: `allow` is empty, so nobody would be answered: list the senders, e.g. allow = [\"me@example.com\", \"*@example.com\"]"
            ),
        ));
    }
    let auth_serv_id = match &b.auth_serv_id {
        Some(id) if !id.get_ref().trim().is_empty() && !id.get_ref().contains(char::is_whitespace) => {
            id.get_ref().trim().to_ascii_lowercase()
        }
        Some(id) => return Err(loc.spanned(id, "bridge.auth_serv_id must be one word, e.g. \"fastmail.com\"".into())),
        None => {
            return Err(loc.spanned(
                spanned,
                format!(
                    "bridge {bridge_address} needs `auth_serv_id`: the name the provider writes first in its Authentication-Results headers (e.g. \"fastmail.com\"); without it a forged From cannot be told apart"
                ),
            ));
        }
    };
    for (value, key) in [(&b.poll_secs, "poll_secs"), (&b.timeout_secs, "timeout_secs")] {
        if *value.get_ref() == 0 {
            return Err(loc.spanned(value, format!("bridge.{key} must be greater than 0")));
        }
    }
    Ok(BridgeConfig {
        model,
        address: bridge_address,
        imap,
        smtp,
        user,
        password,
        allow,
        auth_serv_id,
        flag: check_flag(&b.flag, loc)?,
        mailbox: b.mailbox.clone(),
        sent_mailbox: b.sent_mailbox.clone(),
        tls_insecure: b.tls_insecure,
        ca_file: b.ca_file.clone(),
        poll: Duration::from_secs(*b.poll_secs.get_ref()),
        max_recipients_per_reply: b.max_recipients_per_reply,
        timeout: Duration::from_secs(*b.timeout_secs.get_ref()),
    })
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use crate::config::Config;

    use super::*;

    const MODEL: &str = "[[model]]\naddress = \"kimi@nm.test\"\nbackend = \"openai\"\nurl = \"http://127.0.0.1:1\"\n";

    fn parse(bridge: &str) -> Result<Config, ConfigError> {
        Config::parse(&format!("{MODEL}[[bridge]]\n{bridge}"), Some(Path::new("nm.toml")))
    }

    const GOOD: &str = "model = \"kimi@nm.test\"\naddress = \"kimi.bot@fastmail.com\"\nimap_host = \"imap.fastmail.com\"\nsmtp_host = \"smtp.fastmail.com\"\nuser = \"kimi.bot@fastmail.com\"\npassword_env = \"NM_BRIDGE_PW\"\nallow = [\"me@example.com\", \"*@Example.org\"]\nauth_serv_id = \"fastmail.com\"\n";

    #[test]
    fn a_bridge_reads_with_defaults() {
        let c = parse(GOOD).unwrap();
        let b = &c.bridges[0];
        assert_eq!(
            (b.imap.port, b.imap.tls, b.smtp.port, b.smtp.tls),
            (993, RelayTls::Implicit, 465, RelayTls::Implicit)
        );
        assert_eq!((b.flag.as_str(), b.mailbox.as_str(), b.sent_mailbox.as_str()), ("\\Seen", "INBOX", "Sent"));
        assert!(b.allow[0].admits(&Address::parse("ME@example.com").unwrap()));
        assert!(b.allow[1].admits(&Address::parse("anyone@example.org").unwrap()));
        assert!(!b.allow[1].admits(&Address::parse("anyone@example.org.evil").unwrap()));
        assert_eq!(c.bridge(&Address::parse("kimi.bot@fastmail.com").unwrap()).unwrap().model.as_str(), "kimi@nm.test");
        assert!(c.warnings.iter().all(|w| !w.contains("tls_insecure")));
        let c = parse(&format!("{GOOD}flag = \"$Answered-By-Bot\"\nimap_tls = \"starttls\"\ntls_insecure = true\n"))
            .unwrap();
        assert_eq!((c.bridges[0].flag.as_str(), c.bridges[0].imap.port), ("$Answered-By-Bot", 143));
        assert!(c.warnings.iter().any(|w| w.contains("tls_insecure")));
    }

    fn err(bridge: &str) -> String {
        parse(bridge).unwrap_err().to_string()
    }

    #[test]
    fn bridge_mistakes_name_their_line_and_key() {
        let e = err(&GOOD.replace("kimi@nm.test", "other@nm.test"));
        assert!(e.starts_with("nm.toml:6:") && e.contains("not the address of a [[model]]"), "{e}");
        let e = err(&format!("{GOOD}imap_tls = \"none\"\n"));
        assert!(e.contains("bridge.imap_tls") && e.contains("loopback"), "{e}");
        let e = err(&format!("{GOOD}smtp_tls = \"ssl\"\n"));
        assert!(e.contains("bridge.smtp_tls `ssl`"), "{e}");
        let e = err(&GOOD.replace("password_env = \"NM_BRIDGE_PW\"\n", ""));
        assert!(e.contains("bridge.user needs a password"), "{e}");
        let e = err(&GOOD.replace("allow = [\"me@example.com\", \"*@Example.org\"]", "allow = []"));
        assert!(e.starts_with("nm.toml:12:") && e.contains("nobody would be answered"), "{e}");
        let e = err(&GOOD.replace("\"me@example.com\"", "\"not an address\""));
        assert!(e.starts_with("nm.toml:12:") && e.contains("bridge.allow"), "{e}");
        let e = err(&GOOD.replace("auth_serv_id = \"fastmail.com\"\n", ""));
        assert!(e.contains("auth_serv_id"), "{e}");
        let e = err(&format!("{GOOD}flag = \"\\\\Deleted\"\n"));
        assert!(e.contains("bridge.flag"), "{e}");
        let e = err(&format!("{GOOD}pol_secs = 5\n"));
        assert!(e.contains("pol_secs"), "{e}");
        let e = err(&GOOD.replace("kimi.bot@fastmail.com\"\nimap", "kimi@nm.test\"\nimap"));
        assert!(e.contains("used twice"), "{e}");
        assert!(
            PasswordSource::Env("NIGHTMAIL_TEST_SURELY_UNSET".into())
                .read_for("bridge")
                .unwrap_err()
                .contains("bridge.password_env")
        );
    }
}
