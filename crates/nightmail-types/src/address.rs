//! A mailbox address (`local@domain`), as used in SMTP paths and in configuration.

use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A checked `local-part@domain` address, normalised to lower case for comparison.
///
/// RFC 5321 §2.4 lets the local part be case-sensitive, but every mail system a user meets treats
/// it as case-insensitive, and so do we: `Me@Nightmail.Local` reaches the same mailbox as
/// `me@nightmail.local`.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Address(String);

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum AddressError {
    #[error("`{0}` is not an address of the form local@domain")]
    Shape(String),
    #[error("`{0}`: the local part is longer than 64 octets (RFC 5321 §4.5.3.1.1)")]
    LocalTooLong(String),
    #[error("`{0}`: the domain is longer than 255 octets (RFC 5321 §4.5.3.1.2)")]
    DomainTooLong(String),
    #[error("`{0}` contains a space, a control character or a character not allowed in an address")]
    Character(String),
}

impl Address {
    /// Checks the shape RFC 5321 §4.1.2 gives a `Mailbox`, leniently: one `@`, a non-empty local
    /// part and domain within their length limits, no spaces, controls or angle brackets.
    /// UTF-8 is allowed (RFC 6531, SMTPUTF8).
    pub fn parse(text: &str) -> Result<Address, AddressError> {
        let text = text.trim();
        let bad_char = |c: char| c.is_whitespace() || c.is_control() || "<>()[]\\,;:\"".contains(c);
        let (local, domain) = text.rsplit_once('@').ok_or_else(|| AddressError::Shape(text.to_string()))?;
        if local.is_empty() || domain.is_empty() {
            return Err(AddressError::Shape(text.to_string()));
        }
        if local.contains('@') || local.chars().any(bad_char) || domain.chars().any(bad_char) {
            return Err(AddressError::Character(text.to_string()));
        }
        if domain.starts_with('.') || domain.ends_with('.') || domain.contains("..") {
            return Err(AddressError::Shape(text.to_string()));
        }
        if local.len() > 64 {
            return Err(AddressError::LocalTooLong(text.to_string()));
        }
        if domain.len() > 255 {
            return Err(AddressError::DomainTooLong(text.to_string()));
        }
        Ok(Address(text.to_lowercase()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    pub fn local_part(&self) -> &str {
        self.0.rsplit_once('@').map(|(l, _)| l).unwrap_or(&self.0)
    }

    pub fn domain(&self) -> &str {
        self.0.rsplit_once('@').map(|(_, d)| d).unwrap_or("")
    }
}

impl fmt::Display for Address {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for Address {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "<{}>", self.0)
    }
}

impl std::str::FromStr for Address {
    type Err = AddressError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Address::parse(s)
    }
}

impl Serialize for Address {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for Address {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        Address::parse(&text).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_and_normalises() {
        let a = Address::parse(" Me@NightMail.Local ").unwrap();
        assert_eq!(a.as_str(), "me@nightmail.local");
        assert_eq!(a.local_part(), "me");
        assert_eq!(a.domain(), "nightmail.local");
        assert!(Address::parse("jörg@bücher.example").is_ok());
    }

    #[test]
    fn rejects_bad_shapes() {
        for bad in ["", "me", "@x", "me@", "a b@x", "me@x@y", "<me@x>", "me@.x", "me@x..y", "me@x."] {
            assert!(Address::parse(bad).is_err(), "{bad} was accepted");
        }
        let long = format!("{}@x", "a".repeat(65));
        assert_eq!(Address::parse(&long), Err(AddressError::LocalTooLong(long.clone())));
    }
}
