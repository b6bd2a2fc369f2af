//! Edits to the configuration file that keep its comments and layout (toml_edit).

use std::path::Path;

use toml_edit::{ArrayOfTables, DocumentMut, Item, Table, value};

use nightmail_types::Address;

use crate::config::Config;
use crate::error::ConfigError;

/// Sets user `name`'s address and argon2 `password_hash` in the file at `path`, adding the user
/// if absent (the file too). A plain `password` the user had is removed. The result is checked
/// by parsing it before it replaces the file, so a bad edit never leaves a broken config.
pub fn upsert_user(path: &Path, name: &str, address: &Address, password_hash: &str) -> Result<bool, ConfigError> {
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
        Err(e) => return Err(ConfigError::Read { path: path.to_path_buf(), message: e.to_string() }),
    };
    let invalid = |message: String| ConfigError::Semantic { path: path.display().to_string(), message };
    let mut doc: DocumentMut = text.parse().map_err(|e: toml_edit::TomlError| invalid(e.to_string()))?;

    let users = doc
        .entry("user")
        .or_insert_with(|| Item::ArrayOfTables(ArrayOfTables::new()))
        .as_array_of_tables_mut()
        .ok_or_else(|| invalid("`user` must be written as [[user]] tables".into()))?;
    let existing =
        users.iter_mut().find(|t| t.get("name").and_then(|n| n.as_str()).is_some_and(|n| n.eq_ignore_ascii_case(name)));
    let created = existing.is_none();
    let table = match existing {
        Some(table) => table,
        None => {
            users.push(Table::new());
            users.iter_mut().last().expect("just pushed")
        }
    };
    table["name"] = value(name);
    table["address"] = value(address.as_str());
    table.remove("password");
    table["password_hash"] = value(password_hash);

    let new_text = doc.to_string();
    Config::parse(&new_text, Some(path))?;
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)
            .map_err(|e| ConfigError::Read { path: dir.to_path_buf(), message: e.to_string() })?;
    }
    // Write beside, then rename: a crash mid-write leaves the old file whole.
    let tmp = path.with_extension("toml.tmp");
    std::fs::write(&tmp, new_text)
        .and_then(|_| std::fs::rename(&tmp, path))
        .map_err(|e| ConfigError::Read { path: path.to_path_buf(), message: e.to_string() })?;
    Ok(created)
}

#[cfg(test)]
mod tests {
    use super::*;

    const HASH: &str = "$argon2id$v=19$m=19456,t=2,p=1$c2FsdHNhbHQ$aGFzaGhhc2hoYXNoaGFzaA";

    #[test]
    fn adds_then_updates_keeping_comments() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("nightmail.toml");
        std::fs::write(&path, "# my comment\nhostname = \"x.org\"\n\n[[user]]\nname = \"me\"\naddress = \"me@x.org\"\npassword = \"old\"\n").unwrap();
        let you = Address::parse("you@x.org").unwrap();
        assert!(upsert_user(&path, "you", &you, HASH).unwrap());
        let me = Address::parse("me2@x.org").unwrap();
        assert!(!upsert_user(&path, "me", &me, HASH).unwrap());
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.starts_with("# my comment\n"), "{text}");
        assert!(!text.contains("\"old\""), "{text}");
        let config = Config::load(&path).unwrap();
        assert_eq!(config.users.len(), 2);
        assert_eq!(config.user("me").unwrap().address, me);
        assert!(config.warnings.is_empty());
    }

    #[test]
    fn creates_a_missing_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config/nightmail.toml");
        upsert_user(&path, "me", &Address::parse("me@x.org").unwrap(), HASH).unwrap();
        assert_eq!(Config::load(&path).unwrap().users.len(), 1);
    }
}
