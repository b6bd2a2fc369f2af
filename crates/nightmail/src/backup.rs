//! `nightmail backup DIR`, `restore DIR` and `check`.
//!
//! A running daemon is reached over its control socket: sled lets one process open the store, and
//! only the process whose writes go through the store's gate can stop them for the moment a
//! consistent copy takes (`nightmail-store`'s `backup.rs`). With no daemon running, the command
//! opens the store itself. Restore never runs against a live store: it writes into an empty
//! data directory only.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, bail};
use nightmail_config::Config;
use nightmail_store::{Integrity, Manifest, Store};

use crate::control::Request;

/// A backup reads the whole store: give the daemon time.
const BACKUP_WAIT: Duration = Duration::from_secs(6 * 3600);

/// The files beside the store that a backup carries: the self-signed certificate and key
/// (`data_dir/tls/`), so clients that pinned it keep trusting the restored daemon. Checkpoints
/// are left out: they are being written while the daemon runs, and a restored job without one
/// starts its answer again.
fn extra_files(data_dir: &Path) -> Vec<(String, PathBuf)> {
    let Ok(entries) = std::fs::read_dir(data_dir.join("tls")) else { return Vec::new() };
    let mut files: Vec<(String, PathBuf)> = entries
        .filter_map(|e| e.ok())
        .filter(|e| e.file_type().is_ok_and(|t| t.is_file()))
        .filter_map(|e| Some((format!("tls/{}", e.file_name().to_str()?), e.path())))
        .collect();
    files.sort();
    files
}

/// Runs in the daemon for the control socket: `{"ok": manifest}` or `{"error": why}`.
pub async fn answer_backup(store: &Store, data_dir: &Path, dir: PathBuf) -> serde_json::Value {
    let (store, extra) = (store.clone(), extra_files(data_dir));
    let result = tokio::task::spawn_blocking(move || store.backup(&dir, &extra)).await;
    match result {
        Ok(Ok(manifest)) => serde_json::json!({ "ok": manifest }),
        Ok(Err(e)) => serde_json::json!({ "error": e.to_string() }),
        Err(e) => serde_json::json!({ "error": format!("the backup task failed: {e}") }),
    }
}

/// Runs in the daemon for the control socket: `{"ok": integrity}` or `{"error": why}`.
pub async fn answer_check(store: &Store) -> serde_json::Value {
    let store = store.clone();
    match tokio::task::spawn_blocking(move || store.check()).await {
        Ok(Ok(integrity)) => serde_json::json!({ "ok": integrity }),
        Ok(Err(e)) => serde_json::json!({ "error": e.to_string() }),
        Err(e) => serde_json::json!({ "error": format!("the check task failed: {e}") }),
    }
}

/// Asks the daemon, or opens the store when none answers; `{"ok": ...}` gives the value.
fn through_daemon(
    config: &Config,
    request: &Request,
    wait: Duration,
    direct: impl FnOnce(&Store) -> serde_json::Value,
) -> anyhow::Result<serde_json::Value> {
    let value = crate::control::ask_or_open(config, request, wait, |store| Ok(direct(store)))?;
    if let Some(error) = value.get("error").and_then(|e| e.as_str()) {
        bail!("{error}");
    }
    Ok(value["ok"].clone())
}

pub fn backup(config: &Config, dir: &Path) -> anyhow::Result<()> {
    // The daemon may run in another directory.
    let dir = std::path::absolute(dir).with_context(|| format!("the backup directory {}", dir.display()))?;
    let request = Request::Backup { dir: dir.clone() };
    let value = through_daemon(config, &request, BACKUP_WAIT, |store| {
        match store.backup(&dir, &extra_files(&config.data_dir)) {
            Ok(manifest) => serde_json::json!({ "ok": manifest }),
            Err(e) => serde_json::json!({ "error": e.to_string() }),
        }
    })?;
    let manifest: Manifest = serde_json::from_value(value).context("the daemon's answer about the backup")?;
    let entries: u64 = manifest.trees.iter().map(|t| t.entries).sum();
    let bytes: u64 = manifest.trees.iter().map(|t| t.bytes).sum();
    let (messages, message_bytes) = manifest.messages.as_ref().map_or((0, 0), |m| (m.entries, m.bytes));
    println!(
        "backed up {} trees ({entries} records, {bytes} bytes), {messages} messages ({message_bytes} bytes) and {} files at schema {} into {}",
        manifest.trees.len(),
        manifest.files.len(),
        manifest.schema_version,
        dir.display()
    );
    Ok(())
}

pub fn check(config: &Config) -> anyhow::Result<bool> {
    let value = through_daemon(config, &Request::Check, BACKUP_WAIT, |store| match store.check() {
        Ok(integrity) => serde_json::json!({ "ok": integrity }),
        Err(e) => serde_json::json!({ "error": e.to_string() }),
    })?;
    let integrity: Integrity = serde_json::from_value(value).context("the daemon's answer about the check")?;
    Ok(report(&integrity))
}

/// Prints the check; true when the store is whole.
fn report(integrity: &Integrity) -> bool {
    println!(
        "{} messages, {} mailboxes ({} entries), {} jobs, {} outbound entries",
        integrity.messages, integrity.mailboxes, integrity.mail_entries, integrity.jobs, integrity.outbound
    );
    for problem in &integrity.problems {
        println!("problem: {problem}");
    }
    if integrity.is_whole() {
        println!("every index points at existing records and bytes");
    }
    integrity.is_whole()
}

pub fn restore(config: &Config, dir: &Path) -> anyhow::Result<bool> {
    let data_dir = &config.data_dir;
    if let Ok(mut entries) = std::fs::read_dir(data_dir)
        && entries.next().is_some()
    {
        bail!(
            "data_dir {} (from {}) is not empty: restore writes only into an empty data directory; stop nightmail, \
             move {} away (or set data_dir to a new directory), and run restore again",
            data_dir.display(),
            config.source_name(),
            data_dir.display()
        );
    }
    let (manifest, integrity) = nightmail_store::restore(dir, &data_dir.join("store"), data_dir)?;
    let age = nightmail_types::Timestamp::now().since(nightmail_types::Timestamp(manifest.created_at));
    println!(
        "restored a backup taken {} s ago (schema {}) into {}",
        age.as_secs(),
        manifest.schema_version,
        data_dir.display()
    );
    Ok(report(&integrity))
}
