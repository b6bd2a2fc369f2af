//! `[tls]`: the certificate both servers offer.

use std::path::PathBuf;

use serde::Deserialize;
use toml::Spanned;

use crate::error::{ConfigError, Locator};

/// Where the TLS certificate comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TlsConfig {
    Files {
        cert: PathBuf,
        key: PathBuf,
    },
    /// Generated once (rcgen) and kept in `data_dir/tls/`.
    SelfSigned,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawTls {
    cert: Option<PathBuf>,
    key: Option<PathBuf>,
    #[serde(default)]
    self_signed: bool,
}

pub(crate) fn check(raw: &Spanned<RawTls>, loc: &Locator<'_>) -> Result<TlsConfig, ConfigError> {
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
