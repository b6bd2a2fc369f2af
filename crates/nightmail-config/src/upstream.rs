//! Connections to other servers (the `[relay]` smarthost, a `[[bridge]]` provider): the TLS mode,
//! the login and where its password is kept.

use std::path::PathBuf;

use toml::Spanned;

use crate::error::{ConfigError, Locator};

/// How a connection to another server (the smarthost, a bridge's provider) is protected.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RelayTls {
    /// Plain connection upgraded with STARTTLS (RFC 3207), the submission port 587.
    StartTls,
    /// TLS from the first byte (RFC 8314 §3.3), port 465.
    Implicit,
    /// No TLS: accepted only for a loopback host (a local Postfix, a test smarthost).
    None,
}

impl RelayTls {
    pub fn name(self) -> &'static str {
        match self {
            RelayTls::StartTls => "starttls",
            RelayTls::Implicit => "implicit",
            RelayTls::None => "none",
        }
    }
}

/// Where a password for another server comes from. The password itself is never in the
/// configuration, so it is never in its `Debug`, the log or `status`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PasswordSource {
    /// The name of an environment variable.
    Env(String),
    /// A file holding the password (one line; a final newline is ignored).
    File(PathBuf),
}

/// A password read from its [`PasswordSource`]. Its `Debug` says only that it is there.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    pub fn new(text: String) -> Secret {
        Secret(text)
    }

    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(..)")
    }
}

impl PasswordSource {
    /// Reads the `[relay]` password. The error names the variable or file and the key to fix,
    /// never the value.
    pub fn read(&self) -> Result<Secret, String> {
        self.read_for("relay")
    }

    /// Reads the password of the section `section` (`relay`, `bridge`), naming its keys in errors.
    pub fn read_for(&self, section: &str) -> Result<Secret, String> {
        let text = match self {
            PasswordSource::Env(name) => std::env::var(name).map_err(|_| {
                format!("{section}.password_env: the environment variable {name} is not set (or not UTF-8)")
            })?,
            PasswordSource::File(path) => std::fs::read_to_string(path)
                .map_err(|e| format!("{section}.password_file: cannot read {}: {e}", path.display()))?,
        };
        let text = text.trim_end_matches(['\r', '\n']).to_string();
        if text.is_empty() {
            return Err(match self {
                PasswordSource::Env(name) => format!("{section}.password_env: {name} is empty"),
                PasswordSource::File(path) => format!("{section}.password_file: {} is empty", path.display()),
            });
        }
        Ok(Secret(text))
    }
}

/// A host key's value: a host name or an IP address.
pub(crate) fn host(value: &Spanned<String>, key: &str, loc: &Locator<'_>) -> Result<String, ConfigError> {
    let host = value.get_ref().trim().to_string();
    if host.is_empty() || host.contains(|c: char| c.is_whitespace() || c == '/' || c == '@') {
        return Err(loc.spanned(value, format!("{key} `{host}` must be a host name or an IP address")));
    }
    Ok(host)
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
