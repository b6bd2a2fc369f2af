//! Numbered schema migrations, applied in order when the store opens; the version reached is
//! recorded in the `meta` tree in the same flush. A migration must be safe to re-run if the process
//! dies half-way (it runs again on the next start, since the version was not yet recorded).
//!
//! This folder is compiled into `nightmail-store` (see its `lib.rs`). To change the schema: add
//! `NNNN_name.rs` with `pub fn apply(db: &sled::Db) -> Result<(), StoreError>` (or, for a step that
//! writes beside sled, `apply(db, dir)`), list it below, bump `SCHEMA_VERSION`, and add a test that
//! opens a store written at the previous version.

use std::path::Path;

use crate::StoreError;
use crate::schema::{KEY_SCHEMA_VERSION, SCHEMA_VERSION, stored_version};

#[path = "0001_initial.rs"]
mod m0001_initial;
#[path = "0002_queue_index.rs"]
mod m0002_queue_index;
#[path = "0003_threads_and_outbound.rs"]
mod m0003_threads_and_outbound;
#[path = "0004_message_refs.rs"]
mod m0004_message_refs;
#[path = "0005_utf8_mailbox_names.rs"]
mod m0005_utf8_mailbox_names;
#[path = "0006_dedupe_by_sender.rs"]
mod m0006_dedupe_by_sender;
#[path = "0007_ask_jobs.rs"]
mod m0007_ask_jobs;
#[path = "0008_bridges.rs"]
mod m0008_bridges;
#[path = "0009_live_jobs.rs"]
mod m0009_live_jobs;
#[path = "0010_modseq.rs"]
mod m0010_modseq;
#[path = "0011_subscriptions.rs"]
mod m0011_subscriptions;
#[path = "0012_job_indexes.rs"]
mod m0012_job_indexes;
#[path = "0013_message_files.rs"]
mod m0013_message_files;

/// A step, given the database and the store's directory.
type Apply = fn(&sled::Db, &Path) -> Result<(), StoreError>;

/// (version reached, name, step)
const MIGRATIONS: &[(u32, &str, Apply)] = &[
    (1, "initial", |db, _| m0001_initial::apply(db)),
    (2, "queue_index", |db, _| m0002_queue_index::apply(db)),
    (3, "threads_and_outbound", |db, _| m0003_threads_and_outbound::apply(db)),
    (4, "message_refs", |db, _| m0004_message_refs::apply(db)),
    (5, "utf8_mailbox_names", |db, _| m0005_utf8_mailbox_names::apply(db)),
    (6, "dedupe_by_sender", |db, _| m0006_dedupe_by_sender::apply(db)),
    (7, "ask_jobs", |db, _| m0007_ask_jobs::apply(db)),
    (8, "bridges", |db, _| m0008_bridges::apply(db)),
    (9, "live_jobs", |db, _| m0009_live_jobs::apply(db)),
    (10, "modseq", |db, _| m0010_modseq::apply(db)),
    (11, "subscriptions", |db, _| m0011_subscriptions::apply(db)),
    (12, "job_indexes", |db, _| m0012_job_indexes::apply(db)),
    (13, "message_files", m0013_message_files::apply),
];

/// Brings the store from its recorded version up to `target`.
pub(crate) fn migrate(db: &sled::Db, dir: &Path, target: u32) -> Result<(), StoreError> {
    let found = stored_version(db)?;
    if found > SCHEMA_VERSION {
        return Err(StoreError::TooNew { found, known: SCHEMA_VERSION });
    }
    for &(version, name, apply) in MIGRATIONS {
        if version <= found || version > target {
            continue;
        }
        tracing::info!(version, name, "applying store migration");
        apply(db, dir)?;
        db.open_tree(crate::schema::META)?.insert(KEY_SCHEMA_VERSION, &version.to_be_bytes())?;
        db.flush()?;
    }
    Ok(())
}
