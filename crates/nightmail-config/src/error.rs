//! A configuration mistake, and the [`Locator`] that says where in the file it is.

use std::path::PathBuf;

use nightmail_types::Address;
use toml::Spanned;

/// A configuration mistake, with where it is and what to do.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read {path}: {message}")]
    Read { path: PathBuf, message: String },
    #[error("{path}:{line}:{column}: {message}")]
    Invalid { path: String, line: usize, column: usize, message: String },
    #[error("{path}: {message}")]
    Semantic { path: String, message: String },
}

/// Turns byte offsets into `line:column` for messages.
pub(crate) struct Locator<'a> {
    pub(crate) text: &'a str,
    pub(crate) path: String,
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

/// `value` as an address, or an error naming `key` at its line.
pub(crate) fn address(value: &Spanned<String>, loc: &Locator<'_>, key: &str) -> Result<Address, ConfigError> {
    Address::parse(value.get_ref()).map_err(|e| loc.spanned(value, format!("{key}: {e}")))
}
