//! The `In Progress` mailbox: while a job runs, its asker's `In Progress` mailbox holds one message
//! with the answer written so far. The worker writes that message; the store files it here,
//! replacing the one before in the same transaction (APPEND of the new, EXPUNGE of the old, so an
//! IMAP client sees EXISTS and EXPUNGE, RFC 3501 §7.3.1 and §7.4.1), and withdraws it in the
//! transaction that ends the job (`queue.rs` `finish`, `cancel`). The job records which entry is
//! its own (`Job::progress_mail`), so a job resumed after a crash replaces its old message rather
//! than adding a second, and [`Store::sweep_progress_mail`] removes what a job that ended
//! without withdrawing left (a crash of a build without this module).

use nightmail_types::Timestamp;
use serde::{Deserialize, Serialize};
use sled::transaction::ConflictableTransactionError;

use crate::ids::mail_key;
use crate::job::{Job, JobState, LeasedJob};
use crate::mailbox::{MailEntry, append, ensure_mailbox};
use crate::modseq::{next_modseq, record_expunge};
use crate::queue::{read_job, write_job};
use crate::refs::{RefTrees, hold_new};
use crate::schema::{MAIL, MAILBOXES, Tx, decode, encode};
use crate::{MailboxId, MailboxInfo, Store, StoreError, Uid};

/// The mailbox a job's answer so far is filed in, in its asker's account.
pub const IN_PROGRESS: &str = "In Progress";

/// Where a job's progress message is: a mailbox entry the job made and will remove.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProgressMail {
    pub mailbox: MailboxId,
    pub uid: Uid,
}

type TxResult<T> = Result<T, ConflictableTransactionError<StoreError>>;

/// Removes `job`'s progress message, if it is still where the job filed it (the user may have
/// moved or deleted it: then nothing is left to remove). Returns the mailbox it was in.
pub(crate) fn withdraw_in(tx: &Tx<'_>, job: &mut Job) -> TxResult<Option<MailboxId>> {
    let Some(filed) = job.progress_mail.take() else { return Ok(None) };
    let key = mail_key(filed.mailbox, filed.uid);
    let Some(bytes) = tx.mail.get(key)? else { return Ok(None) };
    let entry: MailEntry = decode(MAIL, &bytes).map_err(ConflictableTransactionError::Abort)?;
    tx.mail.remove(&key[..])?;
    // RFC 7162 §3.2.5.1: an expunge like any other, so a resynchronising client hears of it.
    if let Some(record) = tx.mailboxes.get(filed.mailbox.to_be_bytes())? {
        let mut info: MailboxInfo = decode(MAILBOXES, &record).map_err(ConflictableTransactionError::Abort)?;
        let modseq = next_modseq(&mut info);
        record_expunge(tx.expunged, filed.mailbox, modseq, filed.uid)?;
        tx.mailboxes.insert(&filed.mailbox.to_be_bytes(), encode(&info))?;
    }
    RefTrees { refs: tx.message_refs, collected: tx.collected, message_ids: tx.message_ids }
        .release::<StoreError>(entry.message)?;
    Ok(Some(filed.mailbox))
}

impl Store {
    /// Files `raw` (the answer so far, as a message) in `owner`'s `In Progress` mailbox as the
    /// leased job's progress message, replacing the one it filed before. Fails with
    /// [`StoreError::LeaseLost`] if the lease no longer holds, filing nothing.
    pub async fn file_progress(&self, leased: &mut LeasedJob, owner: &str, raw: &[u8]) -> Result<(), StoreError> {
        let key = self.new_message_key()?;
        let new_id = MailboxId(self.db.generate_id()?);
        let now = Timestamp::now();
        let _staged = self.stage([(key, raw)])?;
        let (job, old, mailbox) = self.trees.transaction(|tx| {
            let mut job = read_job(tx.jobs, leased.job.id)?;
            if !leased.holds(&job.state) {
                return Err(ConflictableTransactionError::Abort(StoreError::LeaseLost(job.id)));
            }
            let old = withdraw_in(tx, &mut job)?;
            let info = ensure_mailbox(tx.meta, tx.mailboxes, tx.mailbox_names, owner, IN_PROGRESS, new_id, now)?;
            let mailbox = info.id;
            hold_new::<StoreError>(tx.message_refs, key, 1, "", raw)?;
            let entry = MailEntry {
                uid: Uid(0),
                message: key,
                flags: vec!["\\Recent".into()],
                internal_date: now,
                size: raw.len() as u64,
                modseq: crate::ModSeq::FIRST,
            };
            let uid = append(tx.mailboxes, tx.mail, info, &entry)?;
            job.progress_mail = Some(ProgressMail { mailbox, uid });
            let state = job.state.clone();
            write_job(tx.into(), Some(&state), &job)?;
            Ok((job, old, mailbox))
        })?;
        leased.job = job;
        self.flush().await?;
        if let Some(old) = old.filter(|old| *old != mailbox) {
            self.notify(old);
        }
        self.notify(mailbox);
        Ok(())
    }

    /// Removes the progress messages of jobs that are no longer running or waiting to run again
    /// (at start-up: a job ends with its message withdrawn, but a store written by an older build
    /// may hold leftovers). Returns how many went.
    pub async fn sweep_progress_mail(&self) -> Result<usize, StoreError> {
        let ended: Vec<_> = self
            .jobs()?
            .into_iter()
            .filter(|j| j.progress_mail.is_some() && j.state.finished_at().is_some())
            .map(|j| j.id)
            .collect();
        let mut swept = Vec::new();
        for id in ended {
            let gone = self.trees.transaction(|tx| {
                let mut job = read_job(tx.jobs, id)?;
                if matches!(job.state, JobState::Queued { .. } | JobState::Running { .. }) {
                    return Ok(None);
                }
                let gone = withdraw_in(tx, &mut job)?;
                let state = job.state.clone();
                write_job(tx.into(), Some(&state), &job)?;
                Ok(gone)
            })?;
            swept.extend(gone);
        }
        if !swept.is_empty() {
            self.flush().await?;
            for mailbox in &swept {
                self.notify(*mailbox);
            }
        }
        Ok(swept.len())
    }
}
