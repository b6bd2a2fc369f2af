//! Garbage collection of message bytes. A message is stored once and held by mailbox entries
//! (delivery, APPEND, COPY), jobs (the question a model answers) and outbound entries (mail
//! awaiting the relay); `message_refs` counts those holders, in the same transaction that adds or
//! removes one. When EXPUNGE or DELETE drops the last holder, that transaction records the key in
//! `collected`, and the file goes once it is flushed (`message_files.rs`).
//!
//! A job holds its question's bytes until retention deletes the finished job (`Store::purge_jobs`,
//! `queue.rs`; status and the thread of a later follow-up read jobs until then); a message awaiting
//! the relay is held until it is sent, bounced or dropped (`outbound.rs`). A job's
//! `reply` names the reply but does not hold it: the reply lives as long as the entries it was
//! delivered to, so what its readers delete is deleted.
//!
//! The Message-ID index keeps pointing only at bytes that exist: a collected message's entry is
//! dropped from it, so the worker's thread lookup finds no copy rather than a dangling key. The
//! dedupe marks stay: a resend of a message its recipient has deleted is still a resend.

use serde::{Deserialize, Serialize};
use sled::transaction::{ConflictableTransactionError, TransactionalTree};

use crate::delivery::MessageRef;
use crate::schema::{MESSAGE_IDS, MESSAGE_REFS, decode, encode};
use crate::{MessageKey, StoreError};

/// What `message_refs` records of one message.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Holders {
    /// Mailbox entries, jobs and outbound entries that refer to the message.
    pub count: u64,
    /// The Message-ID it is indexed under in `message_ids` (empty if it is not indexed).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message_id: String,
    /// The size and SHA-256 (hex) of the message's file, for the integrity check (schema 13).
    #[serde(default)]
    pub size: u64,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub sha256: String,
}

/// The trees one reference change touches, inside a transaction.
pub(crate) struct RefTrees<'a> {
    pub refs: &'a TransactionalTree,
    pub collected: &'a TransactionalTree,
    pub message_ids: &'a TransactionalTree,
}

type TxResult<T, E> = Result<T, ConflictableTransactionError<E>>;

pub(crate) fn read_holders<E: From<StoreError>>(
    refs: &TransactionalTree,
    key: MessageKey,
) -> TxResult<Option<Holders>, E> {
    match refs.get(key.to_be_bytes())? {
        None => Ok(None),
        Some(v) => decode(MESSAGE_REFS, &v).map(Some).map_err(|e| ConflictableTransactionError::Abort(e.into())),
    }
}

/// Adds `n` holders of `key`; `message_id` is recorded if the message is indexed under one.
pub(crate) fn hold<E: From<StoreError>>(
    refs: &TransactionalTree,
    key: MessageKey,
    n: u64,
    message_id: &str,
) -> TxResult<(), E> {
    let mut holders = read_holders(refs, key)?.unwrap_or_default();
    holders.count += n;
    if holders.message_id.is_empty() {
        holders.message_id = message_id.to_string();
    }
    refs.insert(&key.to_be_bytes(), encode(&holders))?;
    Ok(())
}

/// [`hold`] for a message stored just now (its file written ahead, `Store::stage`): also records
/// the size and SHA-256 of its bytes.
pub(crate) fn hold_new<E: From<StoreError>>(
    refs: &TransactionalTree,
    key: MessageKey,
    n: u64,
    message_id: &str,
    raw: &[u8],
) -> TxResult<(), E> {
    let holders = Holders {
        count: n,
        message_id: message_id.to_string(),
        size: raw.len() as u64,
        sha256: crate::stable_digest(raw),
    };
    refs.insert(&key.to_be_bytes(), encode(&holders))?;
    Ok(())
}

impl RefTrees<'_> {
    /// Removes one holder of `key`; with none left, deletes the index entry and marks the file
    /// for removal after this transaction is flushed.
    /// Returns whether the message was collected. A message with no record is kept: nothing
    /// is deleted on a count this build did not keep.
    pub fn release<E: From<StoreError>>(&self, key: MessageKey) -> TxResult<bool, E> {
        let Some(mut holders) = read_holders(self.refs, key)? else { return Ok(false) };
        holders.count = holders.count.saturating_sub(1);
        if holders.count > 0 {
            self.refs.insert(&key.to_be_bytes(), encode(&holders))?;
            return Ok(false);
        }
        self.refs.remove(&key.to_be_bytes())?;
        self.collected.insert(&key.to_be_bytes(), &[])?;
        if !holders.message_id.is_empty() {
            let id = holders.message_id.as_bytes();
            if let Some(v) = self.message_ids.get(id)? {
                let mut copies: Vec<MessageRef> =
                    decode(MESSAGE_IDS, &v).map_err(|e| ConflictableTransactionError::Abort(e.into()))?;
                copies.retain(|r| r.key != key);
                if copies.is_empty() {
                    self.message_ids.remove(id)?;
                } else {
                    self.message_ids.insert(id, encode(&copies))?;
                }
            }
        }
        Ok(true)
    }
}
