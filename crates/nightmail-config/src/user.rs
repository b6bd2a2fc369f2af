//! `[[user]]`: the people who log in, and their passwords.

use nightmail_types::Address;
use serde::Deserialize;
use toml::Spanned;

use crate::error::{ConfigError, Locator, address};

#[derive(Clone, PartialEq, Eq)]
pub enum Password {
    /// Plain text in the config file (a warning is logged).
    Plain(String),
    /// A PHC string, `$argon2id$...`, as `nightmail user add` writes.
    Argon2(String),
}

impl std::fmt::Debug for Password {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Password::Plain(_) => f.write_str("Plain(..)"),
            Password::Argon2(_) => f.write_str("Argon2(..)"),
        }
    }
}

#[derive(Clone, Debug)]
pub struct User {
    pub name: String,
    pub address: Address,
    pub password: Password,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawUser {
    pub(crate) name: Spanned<String>,
    pub(crate) address: Spanned<String>,
    password: Option<String>,
    password_hash: Option<Spanned<String>>,
}

pub(crate) fn check(spanned: &Spanned<RawUser>, loc: &Locator<'_>) -> Result<User, ConfigError> {
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
