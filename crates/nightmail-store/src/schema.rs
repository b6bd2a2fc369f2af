//! The trees of the store and the schema version kept in `meta`.
//!
//! | tree            | key                              | value                        |
//! |-----------------|----------------------------------|------------------------------|
//! | `meta`          | `schema_version`, `uidvalidity`  | u32 big-endian               |
//! | `messages`      | MessageKey                       | raw RFC 5322 bytes, until schema 13 moved them to files (`message_files.rs`) and dropped the tree |
//! | `mailboxes`     | MailboxId                        | JSON `MailboxRecord`         |
//! | `mailbox_names` | owner `\0` name (UTF-8, schema 5) | MailboxId                    |
//! | `mail`          | MailboxId ++ Uid                 | JSON `MailRecord`            |
//! | `jobs`          | JobId                            | JSON `Job` (its `origin`, mail or Ask folder: schema 7; `progress_mail`, its entry in the asker's `In Progress`, and `progress.engine` default to none, so no step) |
//! | `queue`         | not_before (ms) ++ JobId         | empty: the queued jobs, due first (schema 2) |
//! | `dedupe`        | SHA-256 of sender `\0` recipient `\0` dedupe id (schema 6) | JSON `Mark`: what the delivery made, and when |
//! | `message_ids`   | Message-ID                       | JSON `[MessageRef]`: the stored copies and who took part (schema 3) |
//! | `outbound`      | OutboundId                       | JSON `Outbound`: mail for one remote recipient, leased by the relay (schema 3; its `attempts`, `state`, `last_error` came with the relay and default to queued-and-due, so no migration) |
//! | `message_refs`  | MessageKey                       | JSON `Holders`: how many mailbox entries, jobs and outbound entries hold the message, and the Message-ID it is indexed under (schema 4) |
//! | `bridges`       | a bridge's upstream address      | JSON `BridgeState`: the upstream UIDVALIDITY, the last UID and INTERNALDATE taken, the UIDs still to flag (schema 8) |
//! | `live_jobs`     | `n` ++ JobId, `r` ++ JobId       | empty: the queued jobs not yet triaged (`n`, the concierge's work) and the running ones (`r`, the lease sweeper's), kept by `write_job` (schema 9) |
//! | `expunged`      | MailboxId ++ ModSeq ++ Uid       | empty: each UID expunged from a mailbox and the mod-sequence of its expunge, for QRESYNC's VANISHED (schema 10, `modseq.rs`; the same step gave `MailEntry::modseq` and `MailboxInfo::highest_modseq`) |
//! | `subscriptions` | owner `\0` name (UTF-8)          | empty: the user's IMAP subscriptions, names that need not exist (schema 11, `subscriptions.rs`; the step took them out of `MailboxInfo`) |
//! | `replies`       | sender `\0` finished_at ++ JobId | empty: the jobs that sent their sender a reply or notice, for the hourly limit (schema 12, `job_index.rs`) |
//! | `answers`       | model `\0` done_at ++ JobId      | started_at ++ tokens (u64 big-endian each): a model's answers, for its pace (schema 12) |
//! | `open_jobs`     | model `\0` created_at ++ JobId   | empty: the jobs queued or running, per model in arrival order, for queue positions and `status` (schema 12) |
//! | `collected`     | MessageKey                       | empty: messages whose last holder went, whose files are removed once that is flushed (schema 13, `message_files.rs`) |
//!
//! A message's bytes are the file `messages/<kk>/<key>` under the store's directory (schema 13);
//! `message_refs` records its size and SHA-256 for the integrity check.

use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};

use sled::transaction::{ConflictableTransactionError, TransactionalTree};

use crate::StoreError;

/// The schema this build writes. Each step up has a migration in `migrations/`.
pub const SCHEMA_VERSION: u32 = 13;

pub(crate) const META: &str = "meta";
pub(crate) const MESSAGES: &str = "messages";
pub(crate) const MAILBOXES: &str = "mailboxes";
pub(crate) const MAILBOX_NAMES: &str = "mailbox_names";
pub(crate) const MAIL: &str = "mail";
pub(crate) const JOBS: &str = "jobs";
pub(crate) const QUEUE: &str = "queue";
pub(crate) const DEDUPE: &str = "dedupe";
pub(crate) const MESSAGE_IDS: &str = "message_ids";
pub(crate) const OUTBOUND: &str = "outbound";
pub(crate) const MESSAGE_REFS: &str = "message_refs";
pub(crate) const BRIDGES: &str = "bridges";
pub(crate) const LIVE_JOBS: &str = "live_jobs";
pub(crate) const EXPUNGED: &str = "expunged";
pub(crate) const SUBSCRIPTIONS: &str = "subscriptions";
pub(crate) const REPLIES: &str = "replies";
pub(crate) const ANSWERS: &str = "answers";
pub(crate) const OPEN_JOBS: &str = "open_jobs";
pub(crate) const COLLECTED: &str = "collected";

pub(crate) const KEY_SCHEMA_VERSION: &[u8] = b"schema_version";
pub(crate) const KEY_LAST_UIDVALIDITY: &[u8] = b"uidvalidity";

#[derive(Clone)]
pub(crate) struct Trees {
    pub meta: sled::Tree,
    pub collected: sled::Tree,
    pub mailboxes: sled::Tree,
    pub mailbox_names: sled::Tree,
    pub mail: sled::Tree,
    pub jobs: sled::Tree,
    pub queue: sled::Tree,
    pub dedupe: sled::Tree,
    pub message_ids: sled::Tree,
    pub outbound: sled::Tree,
    pub message_refs: sled::Tree,
    pub bridges: sled::Tree,
    pub live_jobs: sled::Tree,
    pub expunged: sled::Tree,
    pub subscriptions: sled::Tree,
    pub replies: sled::Tree,
    pub answers: sled::Tree,
    pub open_jobs: sled::Tree,
    /// The message bytes (`message_files.rs`).
    pub files: crate::message_files::MessageFiles,
    /// Held shared by every write, and exclusively by a backup (`backup.rs`): sled 0.34 has no
    /// snapshots, so a consistent copy of all trees is one taken while no write is under way.
    gate: Arc<RwLock<()>>,
}

impl Trees {
    pub fn open(db: &sled::Db, dir: &std::path::Path) -> Result<Trees, StoreError> {
        Ok(Trees {
            meta: db.open_tree(META)?,
            collected: db.open_tree(COLLECTED)?,
            mailboxes: db.open_tree(MAILBOXES)?,
            mailbox_names: db.open_tree(MAILBOX_NAMES)?,
            mail: db.open_tree(MAIL)?,
            jobs: db.open_tree(JOBS)?,
            queue: db.open_tree(QUEUE)?,
            dedupe: db.open_tree(DEDUPE)?,
            message_ids: db.open_tree(MESSAGE_IDS)?,
            outbound: db.open_tree(OUTBOUND)?,
            message_refs: db.open_tree(MESSAGE_REFS)?,
            bridges: db.open_tree(BRIDGES)?,
            live_jobs: db.open_tree(LIVE_JOBS)?,
            expunged: db.open_tree(EXPUNGED)?,
            subscriptions: db.open_tree(SUBSCRIPTIONS)?,
            replies: db.open_tree(REPLIES)?,
            answers: db.open_tree(ANSWERS)?,
            open_jobs: db.open_tree(OPEN_JOBS)?,
            files: crate::message_files::MessageFiles::new(dir),
            gate: Arc::default(),
        })
    }

    /// Every tree, in the order [`Tx`] expects, for a transaction over all of them.
    pub fn all(&self) -> [&sled::Tree; 18] {
        [
            &self.meta,
            &self.collected,
            &self.mailboxes,
            &self.mailbox_names,
            &self.mail,
            &self.jobs,
            &self.queue,
            &self.dedupe,
            &self.message_ids,
            &self.outbound,
            &self.message_refs,
            &self.bridges,
            &self.live_jobs,
            &self.expunged,
            &self.subscriptions,
            &self.replies,
            &self.answers,
            &self.open_jobs,
        ]
    }

    /// The trees a job's state lives in, in the order [`crate::queue::JobTrees`] expects.
    pub fn of_jobs(&self) -> [&sled::Tree; 6] {
        [&self.jobs, &self.queue, &self.live_jobs, &self.replies, &self.answers, &self.open_jobs]
    }

    /// Held for the length of one write to the trees (a transaction, or a lone insert or removal),
    /// so that a backup sees each write whole or not at all.
    pub fn writing(&self) -> RwLockReadGuard<'_, ()> {
        self.gate.read().unwrap_or_else(|p| p.into_inner())
    }

    /// Held while a backup reads every tree: no write starts until it is dropped.
    pub fn quiesce(&self) -> RwLockWriteGuard<'_, ()> {
        self.gate.write().unwrap_or_else(|p| p.into_inner())
    }

    /// Runs `f` in one transaction over every tree.
    pub fn transaction<A, E>(&self, f: impl Fn(&Tx<'_>) -> Result<A, ConflictableTransactionError<E>>) -> Result<A, E>
    where
        E: From<sled::transaction::TransactionError<E>>,
    {
        use sled::Transactional;
        let _writing = self.writing();
        let all = self.all();
        Ok(all[..].transaction(|view| f(&Tx::new(view, &self.files)))?)
    }
}

/// The trees of one transaction, by name.
pub(crate) struct Tx<'a> {
    pub meta: &'a TransactionalTree,
    pub collected: &'a TransactionalTree,
    pub mailboxes: &'a TransactionalTree,
    pub mailbox_names: &'a TransactionalTree,
    pub mail: &'a TransactionalTree,
    pub jobs: &'a TransactionalTree,
    pub queue: &'a TransactionalTree,
    pub dedupe: &'a TransactionalTree,
    pub message_ids: &'a TransactionalTree,
    pub outbound: &'a TransactionalTree,
    pub message_refs: &'a TransactionalTree,
    pub bridges: &'a TransactionalTree,
    pub live_jobs: &'a TransactionalTree,
    pub expunged: &'a TransactionalTree,
    /// No transaction over every tree changes subscriptions yet (`subscriptions.rs` uses its own).
    #[allow(dead_code)]
    pub subscriptions: &'a TransactionalTree,
    pub replies: &'a TransactionalTree,
    pub answers: &'a TransactionalTree,
    pub open_jobs: &'a TransactionalTree,
    /// Read only: a file is written before its transaction and removed after (`message_files.rs`).
    pub files: &'a crate::message_files::MessageFiles,
}

impl<'a> Tx<'a> {
    fn new(view: &'a [TransactionalTree], files: &'a crate::message_files::MessageFiles) -> Tx<'a> {
        Tx {
            meta: &view[0],
            collected: &view[1],
            mailboxes: &view[2],
            mailbox_names: &view[3],
            mail: &view[4],
            jobs: &view[5],
            queue: &view[6],
            dedupe: &view[7],
            message_ids: &view[8],
            outbound: &view[9],
            message_refs: &view[10],
            bridges: &view[11],
            live_jobs: &view[12],
            expunged: &view[13],
            subscriptions: &view[14],
            replies: &view[15],
            answers: &view[16],
            open_jobs: &view[17],
            files,
        }
    }
}

pub(crate) fn stored_version(db: &sled::Db) -> Result<u32, StoreError> {
    let meta = db.open_tree(META)?;
    Ok(match meta.get(KEY_SCHEMA_VERSION)? {
        Some(v) => {
            u32_of(&v).ok_or(StoreError::Corrupt { tree: META, message: "schema_version is not a u32".into() })?
        }
        None => 0,
    })
}

pub(crate) fn u32_of(bytes: &[u8]) -> Option<u32> {
    Some(u32::from_be_bytes(bytes.try_into().ok()?))
}

pub(crate) fn encode<T: serde::Serialize>(value: &T) -> Vec<u8> {
    serde_json::to_vec(value).expect("store records always serialise")
}

pub(crate) fn decode<T: serde::de::DeserializeOwned>(tree: &'static str, bytes: &[u8]) -> Result<T, StoreError> {
    serde_json::from_slice(bytes).map_err(|e| StoreError::Corrupt { tree, message: e.to_string() })
}
