//! Mail a user files over IMAP (APPEND, COPY, MOVE), in the transaction that adds its mailbox
//! entry: the user joins the message's participants in the Message-ID index, and a message filed
//! into an Ask folder becomes a job for that folder's model.
//!
//! The index is what the worker follows a thread through, and only into messages the asker took
//! part in: a client that APPENDs its sent mail to Sent (mutt's `record`) makes the user's own
//! words context for a later question; so does a COPY of mail the index did not know the user
//! had. Only the user is added: the addresses a filed message's header names never received it
//! from us, so they do not become participants.

use nightmail_types::{Address, Timestamp};
use sled::transaction::ConflictableTransactionError;

use crate::delivery::{MessageRef, index_message_id};
use crate::job::{Job, Origin};
use crate::queue::write_job;
use crate::refs::{hold, read_holders};
use crate::schema::{Tx, encode};
use crate::{JobId, MessageKey, StoreError, Summary};

/// Who files mail into a mailbox over IMAP, and whether filing it asks a model about it.
#[derive(Clone, Copy, Debug)]
pub struct Filing<'a> {
    /// The authenticated user's address.
    pub by: &'a Address,
    /// The model whose Ask folder the mailbox is, if it is one: each message filed there becomes
    /// a job for it, asked by `by` ([`Origin::Ask`]).
    pub ask: Option<&'a Address>,
}

/// Files the stored message `key`: indexes it for `filing.by` and, for an Ask folder, queues job
/// `job` about it (the job holds the message, as a delivered question does).
pub(crate) fn file_in<E: From<StoreError>>(
    tx: &Tx<'_>,
    filing: &Filing<'_>,
    key: MessageKey,
    job: JobId,
    now: Timestamp,
) -> Result<Option<JobId>, ConflictableTransactionError<E>> {
    let mut holders = read_holders::<E>(tx.message_refs, key)?.unwrap_or_default();
    // Read the header only when needed: delivered mail (and mail filed before) is indexed already.
    let needs_summary = holders.message_id.is_empty() || filing.ask.is_some();
    let summary = match needs_summary {
        true => tx
            .files
            .read(key)
            .map_err(|e| ConflictableTransactionError::Abort(e.into()))?
            .and_then(|raw| Summary::read(&raw))
            .unwrap_or_default(),
        false => Summary::default(),
    };
    if holders.message_id.is_empty() && !summary.message_id.is_empty() {
        // Recorded with the holders so the index entry goes when the last copy does (`refs`).
        holders.message_id = summary.message_id.clone();
        tx.message_refs.insert(&key.to_be_bytes(), encode(&holders))?;
    }
    let reference = MessageRef { key, participants: vec![filing.by.clone()] };
    index_message_id::<E>(tx.message_ids, &holders.message_id, reference)?;
    let Some(model) = filing.ask else { return Ok(None) };
    let job = Job::queued(job, model.clone(), key, Some(filing.by.clone()), &summary, Origin::Ask, now);
    write_job(tx.into(), None, &job).map_err(|e| match e {
        // write_job aborts only with a StoreError; carry it over to this transaction's error.
        ConflictableTransactionError::Abort(e) => ConflictableTransactionError::Abort(E::from(e)),
        ConflictableTransactionError::Conflict => ConflictableTransactionError::Conflict,
        ConflictableTransactionError::Storage(e) => ConflictableTransactionError::Storage(e),
    })?;
    hold::<E>(tx.message_refs, key, 1, "")?;
    Ok(Some(job.id))
}
