//! `nightmail check --reindex`: every user's mail index rebuilt from the store, by the daemon when
//! one runs (it holds the store), else by this process.

use std::path::Path;
use std::time::Duration;

use anyhow::{Context, bail};
use nightmail_config::Config;
use nightmail_mailindex::{MailIndex, RebuildReport};
use nightmail_store::Store;
use nightmail_types::Address;

use crate::control::Request;

/// A rebuild reads every message: give the daemon time.
const REINDEX_WAIT: Duration = Duration::from_secs(6 * 3600);

/// Where the indexes live: beside the store, in the data directory.
pub fn index_dir(data_dir: &Path) -> std::path::PathBuf {
    data_dir.join("mail_index")
}

fn rebuild(store: &Store, data_dir: &Path, users: Vec<(Address, String)>) -> serde_json::Value {
    let result = MailIndex::open(&index_dir(data_dir)).and_then(|index| index.with_users(users).rebuild(store));
    match result {
        Ok(report) => serde_json::json!({ "ok": report }),
        Err(e) => serde_json::json!({ "error": e.to_string() }),
    }
}

/// Runs in the daemon for the control socket: `{"ok": report}` or `{"error": why}`.
pub async fn answer(store: &Store, data_dir: &Path, users: Vec<(Address, String)>) -> serde_json::Value {
    let (store, data_dir) = (store.clone(), data_dir.to_path_buf());
    match tokio::task::spawn_blocking(move || rebuild(&store, &data_dir, users)).await {
        Ok(value) => value,
        Err(e) => serde_json::json!({ "error": format!("the reindex task failed: {e}") }),
    }
}

/// Rebuilds, printing a line per user with the messages indexed.
pub fn reindex(config: &Config) -> anyhow::Result<()> {
    let users: Vec<(Address, String)> = config.users.iter().map(|u| (u.address.clone(), u.name.clone())).collect();
    let request = Request::Reindex { users: users.clone() };
    let value = crate::control::ask_or_open(config, &request, REINDEX_WAIT, |store| {
        Ok(rebuild(store, &config.data_dir, users))
    })?;
    if let Some(error) = value.get("error").and_then(|e| e.as_str()) {
        bail!("{error}");
    }
    let report: RebuildReport =
        serde_json::from_value(value["ok"].clone()).context("the daemon's answer about the reindex")?;
    for (user, messages) in &report.users {
        println!("mail index of {user}: {messages} messages");
    }
    for owner in &report.skipped_owners {
        println!("not indexed: the mailboxes of `{owner}`, who is no configured user");
    }
    Ok(())
}
