//! The durable store of nightmail: raw messages (immutable files, `message_files.rs`), per-user
//! mailboxes, and the job queue for model addresses.
//!
//! sled is the engine today, but no sled type crosses this crate's API: the servers and the worker
//! speak only of [`Store`], [`Job`], [`Uid`] and friends, so the engine can be swapped (redb,
//! fjall) without touching them.
//!
//! Durability: sled writes to disk only every 500 ms on its own. Every method that changes state
//! here ends with [`Store::flush`], which also fsyncs what sled's flush leaves out (`durable.rs`),
//! so when it returns, the change survives `kill -9` and power loss (RFC 5321 §6.1: once 250 is
//! sent, the message must not be lost).

mod backup;
mod bridge;
mod changes;
mod check;
mod delivery;
mod durable;
mod error;
mod filing;
mod ids;
mod in_progress;
mod job;
mod job_index;
mod lease_clock;
mod mail_ops;
mod mailbox;
mod mailbox_ops;
mod message_files;
mod modseq;
mod outbound;
mod private;
mod queue;
mod refs;
mod relay_quota;
mod schema;
mod space;
mod staging;
mod subscriptions;

#[path = "../../../migrations/mod.rs"]
mod migrations;

use std::path::{Path, PathBuf};
use std::sync::Arc;

pub use backup::{FileCopy, Manifest, TreeCopy, restore, verify_backup};
pub use bridge::BridgeState;
pub use changes::{ChangeKind, MailboxChange};
pub use check::Integrity;
pub use delivery::{
    DEDUPE_WINDOW_MS, Incoming, MessageRef, Receipt, Recipient, Summary, author, message_id, stable_digest,
};
pub use error::StoreError;
pub use filing::Filing;
pub use ids::{JobId, MailboxId, MessageKey, Uid};
pub use in_progress::{IN_PROGRESS, ProgressMail};
pub use job::{
    EngineFigures, Finish, Job, JobState, LeasedJob, Origin, Progress, PromptIn, ResearchProgress, Retry, RetryPolicy,
};
pub use job_index::Answered;
pub use mail_ops::{Appended, AppendedAll, Copied, FlagChange, FlagUpdate, FlagsStored, NewMail};
pub use mailbox::{MailEntry, MailboxInfo};
pub use mailbox_ops::{MailboxOpError, SpecialUse};
pub use modseq::ModSeq;
pub use outbound::{LeasedOutbound, Outbound, OutboundId, OutboundOpError, OutboundState, Settle};
pub use private::{log_made_private, make_private};
pub use relay_quota::{HoldError, RelayHold};
pub use schema::SCHEMA_VERSION;
pub use space::MIN_FREE_BYTES;

/// The open store. Cheap to clone: clones share one database.
#[derive(Clone)]
pub struct Store {
    db: sled::Db,
    trees: schema::Trees,
    path: PathBuf,
    /// The fsyncs that make a flush survive a power cut.
    durability: Arc<durable::Durability>,
    /// When this process's leases expire, on a clock that stops during a suspend.
    leases: Arc<lease_clock::LeaseClock>,
    /// Announces every change to a mailbox's contents, so IMAP sessions (IDLE) learn of it at once.
    changes: changes::Changes,
    /// Job records decoded by scans (`Store::job_reads`).
    job_reads: Arc<std::sync::atomic::AtomicU64>,
    /// Outside recipients held by open SMTP transactions (`relay_quota.rs`).
    relay_holds: Arc<relay_quota::RelayHolds>,
}

/// sled's page cache when no size is given. sled's own default, 1 GiB, is kept filled once a busy
/// daemon has read that much, and never given back.
pub const DEFAULT_CACHE_BYTES: u64 = 64 * 1024 * 1024;

/// Store directories this process has opened (canonical paths).
static OPENED: std::sync::Mutex<std::collections::BTreeSet<PathBuf>> =
    std::sync::Mutex::new(std::collections::BTreeSet::new());

/// How long an open waits for this process's own earlier hold on the directory to end.
const OWN_RELEASE: std::time::Duration = std::time::Duration::from_secs(2);

/// sled's database in `dir`. sled lets go of its lock when the last of its background writes ends,
/// a moment after the `Db` is dropped, so opening a store again right after closing it in the same
/// process can find the lock still held by ourselves.
/// Such an open waits for that release, up to [`OWN_RELEASE`]; a lock held by another process, or
/// on a directory this process never opened, is [`StoreError::Locked`] at once.
fn open_sled(dir: &Path, cache_bytes: u64) -> Result<sled::Db, StoreError> {
    let canonical = std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_path_buf());
    let ours = OPENED.lock().unwrap_or_else(|p| p.into_inner()).contains(&canonical);
    let deadline = std::time::Instant::now() + OWN_RELEASE;
    loop {
        match sled::Config::new().path(dir).cache_capacity(cache_bytes).open() {
            Ok(db) => {
                OPENED.lock().unwrap_or_else(|p| p.into_inner()).insert(canonical);
                return Ok(db);
            }
            Err(sled::Error::Io(io)) if io.to_string().contains("could not acquire lock") => {
                if !ours || std::time::Instant::now() >= deadline {
                    return Err(StoreError::Locked { path: dir.to_path_buf() });
                }
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            Err(other) => return Err(StoreError::from(other)),
        }
    }
}

impl Store {
    /// Opens (or creates) the store in `dir`, applying pending migrations, with sled's page cache
    /// at [`DEFAULT_CACHE_BYTES`].
    ///
    /// Only one process may hold the store; a second gets [`StoreError::Locked`].
    pub fn open(dir: &Path) -> Result<Store, StoreError> {
        Self::open_with_cache(dir, DEFAULT_CACHE_BYTES)
    }

    /// [`Store::open`] with sled's page cache at most `cache_bytes` (the daemon's `store.cache_mb`).
    pub fn open_with_cache(dir: &Path, cache_bytes: u64) -> Result<Store, StoreError> {
        Self::open_at(dir, SCHEMA_VERSION, cache_bytes)
    }

    /// Opens the store and migrates it up to `version` only. Tests use it to write a store as an
    /// older nightmail would have.
    #[doc(hidden)]
    pub fn open_to(dir: &Path, version: u32) -> Result<Store, StoreError> {
        Self::open_at(dir, version, DEFAULT_CACHE_BYTES)
    }

    fn open_at(dir: &Path, version: u32, cache_bytes: u64) -> Result<Store, StoreError> {
        log_made_private(dir, &make_private(dir)?);
        let db = open_sled(dir, cache_bytes)?;
        let durability = Arc::new(
            durable::Durability::new(dir)
                .map_err(|e| StoreError::Io { path: dir.to_path_buf(), message: e.to_string() })?,
        );
        migrations::migrate(&db, dir, version)?;
        let trees = schema::Trees::open(&db, dir)?;
        if version >= 13 {
            // What sled recovered is made durable first: a file is removed only once no reference
            // to it can come back.
            durability.flush(&db).map_err(|e| StoreError::Io { path: dir.to_path_buf(), message: e.to_string() })?;
            let removed = staging::sweep(&trees)?;
            if removed > 0 {
                tracing::info!(removed, "removed message files nothing referenced (left by a crash)");
            }
        }
        Ok(Store {
            db,
            trees,
            path: dir.to_path_buf(),
            durability,
            leases: Arc::default(),
            changes: changes::Changes::default(),
            job_reads: Arc::default(),
            relay_holds: Arc::default(),
        })
    }

    /// The schema version recorded in the store.
    pub fn schema_version(&self) -> Result<u32, StoreError> {
        schema::stored_version(&self.db)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Raw RFC 5322 bytes of a stored message, read from its file (the page cache holds it, not
    /// this process's heap, once the caller drops it).
    pub fn message(&self, key: MessageKey) -> Result<Option<Vec<u8>>, StoreError> {
        self.trees.files.read(key)
    }

    /// Waits until everything written so far is on stable storage (fsynced: see `durable.rs`),
    /// then removes the files of messages whose release it made durable (`message_files.rs`).
    ///
    /// A blocking `flush` on tokio's blocking pool, not `flush_async`: in sled 0.34 concurrent
    /// `flush_async` calls occupy every thread of sled's own pool, which is also the pool that
    /// writes the buffers they wait for, and the whole store deadlocks under concurrent writers.
    pub async fn flush(&self) -> Result<(), StoreError> {
        let (db, durability, path) = (self.db.clone(), self.durability.clone(), self.path.clone());
        let trees = self.trees.clone();
        tokio::task::spawn_blocking(move || {
            let collected = staging::collected(&trees)?;
            durability.flush(&db).map_err(|e| StoreError::Io { path, message: format!("flushing the store: {e}") })?;
            staging::reap(&trees, &collected)
        })
        .await
        .map_err(|e| StoreError::Engine(format!("flush task failed: {e}")))?
    }
}

#[cfg(test)]
mod backup_tests;
#[cfg(test)]
mod live_tests;
#[cfg(test)]
mod message_files_tests;
#[cfg(test)]
mod outbound_tests;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod upgrade_tests;
