//! Changes to the messages of a mailbox, for IMAP: flags (RFC 3501 §6.4.6 STORE), EXPUNGE
//! (§6.4.3, RFC 4315 §2.1 UID EXPUNGE), COPY (§6.4.7) and MOVE (RFC 6851) with the UIDs they
//! assigned (RFC 4315 COPYUID), APPEND (§6.3.11, APPENDUID), and the session-claimed `\Recent`.
//!
//! Each operation is one sled transaction, flushed, then announced (see `changes`). UIDs only
//! grow: expunged UIDs are never handed out again because `uid_next` never goes back.
//!
//! Every entry made or removed here is counted in `message_refs` in the same transaction; the
//! EXPUNGE that removes a message's last holder deletes its bytes (see `refs`).

use nightmail_types::Timestamp;
use sled::Transactional;
use sled::transaction::{ConflictableTransactionError, TransactionalTree};

use crate::filing::{Filing, file_in};

use crate::ids::mail_key;
use crate::mailbox::MailEntry;
use crate::mailbox_ops::MailboxOpError;
use crate::modseq::{ModSeq, next_modseq, record_expunge};
use crate::refs::{RefTrees, hold, hold_new};
use crate::schema::{MAIL, MAILBOXES, Tx, decode, encode};
use crate::{JobId, MailboxId, MailboxInfo, Store, StoreError, Uid};

/// The flag IMAP sets on mail new to the first session that selects its mailbox (RFC 3501 §2.3.2).
const RECENT: &str = "\\Recent";
const DELETED: &str = "\\Deleted";

/// How STORE combines the given flags with a message's flags (RFC 3501 §6.4.6).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FlagUpdate {
    Add,
    Remove,
    Replace,
}

/// A message's flags after a STORE, and its mod-sequence (RFC 7162 §3.1.1: new if they changed).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FlagChange {
    pub uid: Uid,
    pub flags: Vec<String>,
    pub modseq: ModSeq,
}

/// What a conditional STORE did (RFC 7162 §3.1.3): the messages it stored to, and those it left
/// alone because they had changed since the client's mod-sequence (the MODIFIED response code).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FlagsStored {
    pub changes: Vec<FlagChange>,
    pub modified: Vec<Uid>,
}

/// What COPY or MOVE made (RFC 4315 §3 COPYUID): source and destination UIDs, pairwise.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Copied {
    pub uid_validity: u32,
    pub pairs: Vec<(Uid, Uid)>,
    /// The jobs made when the destination is an Ask folder, one per message.
    pub jobs: Vec<JobId>,
}

/// What APPEND made (RFC 4315 §3 APPENDUID).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Appended {
    pub uid_validity: u32,
    pub uid: Uid,
    /// The job made when the mailbox is an Ask folder.
    pub job: Option<JobId>,
}

/// One message of an APPEND or MULTIAPPEND, as the client sent it.
#[derive(Clone, Debug)]
pub struct NewMail<'a> {
    pub raw: &'a [u8],
    pub flags: Vec<String>,
    pub internal_date: Timestamp,
}

/// What a MULTIAPPEND made (RFC 3502, RFC 4315 §3 APPENDUID with a UID set).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AppendedAll {
    pub uid_validity: u32,
    /// In the order the messages were given; consecutive.
    pub uids: Vec<Uid>,
    /// The jobs made when the mailbox is an Ask folder.
    pub jobs: Vec<JobId>,
}

type Abort = ConflictableTransactionError<MailboxOpError>;

fn read_mailbox(mailboxes: &TransactionalTree, id: MailboxId) -> Result<MailboxInfo, Abort> {
    let record =
        mailboxes.get(id.to_be_bytes())?.ok_or_else(|| Abort::Abort(MailboxOpError::NoSuchMailbox(id.to_string())))?;
    decode(MAILBOXES, &record).map_err(|e| Abort::Abort(e.into()))
}

fn write_mailbox(mailboxes: &TransactionalTree, info: &MailboxInfo) -> Result<(), Abort> {
    mailboxes.insert(&info.id.to_be_bytes(), encode(info))?;
    Ok(())
}

fn read_entry(mail: &TransactionalTree, mailbox: MailboxId, uid: Uid) -> Result<Option<MailEntry>, Abort> {
    match mail.get(mail_key(mailbox, uid))? {
        None => Ok(None),
        Some(v) => {
            let mut entry: MailEntry = decode(MAIL, &v).map_err(|e| Abort::Abort(e.into()))?;
            entry.uid = uid;
            Ok(Some(entry))
        }
    }
}

fn has(flags: &[String], flag: &str) -> bool {
    flags.iter().any(|f| f.eq_ignore_ascii_case(flag))
}

/// Whether a transfer keeps the originals (COPY: one more holder each) or removes them (MOVE).
#[derive(Clone, Copy)]
enum Transfer {
    Copy,
    Move,
}

/// Files each of `entries` (see [`Filing`]); returns the jobs made, one per entry for an Ask folder.
fn file_all(
    tx: &Tx<'_>,
    filing: Option<&Filing<'_>>,
    entries: &[MailEntry],
    ids: &[JobId],
    now: Timestamp,
) -> Result<Vec<JobId>, Abort> {
    let Some(filing) = filing else { return Ok(Vec::new()) };
    let mut jobs = Vec::new();
    for (i, entry) in entries.iter().enumerate() {
        // `ids` is empty unless the folder asks, and then holds one id per entry.
        let id = ids.get(i).copied().unwrap_or(JobId(0));
        jobs.extend(file_in(tx, filing, entry.message, id, now)?);
    }
    Ok(jobs)
}

/// Puts `entries` into mailbox `to`, each under the next UID, marked `\Recent`.
fn put_copies(
    mailboxes: &TransactionalTree,
    mail: &TransactionalTree,
    to: MailboxId,
    entries: &[MailEntry],
) -> Result<Copied, Abort> {
    let mut dest = read_mailbox(mailboxes, to)?;
    let mut copied =
        Copied { uid_validity: dest.uid_validity, pairs: Vec::with_capacity(entries.len()), jobs: Vec::new() };
    let modseq = if entries.is_empty() { dest.highest_modseq } else { next_modseq(&mut dest) };
    for entry in entries {
        let uid = dest.uid_next;
        dest.uid_next = Uid(uid.0 + 1);
        let mut copy = MailEntry { modseq, ..entry.clone() };
        if !has(&copy.flags, RECENT) {
            copy.flags.push(RECENT.into());
        }
        mail.insert(&mail_key(to, uid)[..], encode(&copy))?;
        copied.pairs.push((entry.uid, uid));
    }
    mailboxes.insert(&to.to_be_bytes(), encode(&dest))?;
    Ok(copied)
}

impl Store {
    /// One message of a mailbox.
    pub fn mail_entry(&self, mailbox: MailboxId, uid: Uid) -> Result<Option<MailEntry>, crate::StoreError> {
        match self.trees.mail.get(mail_key(mailbox, uid))? {
            None => Ok(None),
            Some(v) => {
                let mut entry: MailEntry = decode(MAIL, &v)?;
                entry.uid = uid;
                Ok(Some(entry))
            }
        }
    }

    /// STORE: changes the flags of the messages `uids` that still exist; returns their new flags.
    /// `\Recent` is the server's to manage and is neither added nor removed here.
    pub async fn update_flags(
        &self,
        mailbox: MailboxId,
        uids: &[Uid],
        update: FlagUpdate,
        flags: &[String],
    ) -> Result<Vec<FlagChange>, MailboxOpError> {
        Ok(self.update_flags_unchanged_since(mailbox, uids, update, flags, None).await?.changes)
    }

    /// STORE with RFC 7162 §3.1.3 UNCHANGEDSINCE: as [`Store::update_flags`], but a message whose
    /// mod-sequence is above `unchanged_since` is left alone and listed in `modified`, checked in
    /// the same transaction that stores, so no change can slip between the test and the write.
    /// The messages whose flags change take one new mod-sequence; the others keep theirs.
    pub async fn update_flags_unchanged_since(
        &self,
        mailbox: MailboxId,
        uids: &[Uid],
        update: FlagUpdate,
        flags: &[String],
        unchanged_since: Option<ModSeq>,
    ) -> Result<FlagsStored, MailboxOpError> {
        let flags: Vec<&String> = flags.iter().filter(|f| !f.eq_ignore_ascii_case(RECENT)).collect();
        let writing = self.trees.writing();
        let stored = (&self.trees.mailboxes, &self.trees.mail).transaction(|(mailboxes, mail)| {
            let mut info = read_mailbox(mailboxes, mailbox)?;
            let mut modseq = None;
            let mut stored = FlagsStored { changes: Vec::with_capacity(uids.len()), modified: Vec::new() };
            for &uid in uids {
                let Some(mut entry) = read_entry(mail, mailbox, uid)? else { continue };
                if unchanged_since.is_some_and(|since| entry.modseq > since) {
                    stored.modified.push(uid);
                    continue;
                }
                let before = entry.flags.clone();
                match update {
                    FlagUpdate::Add => {
                        for f in &flags {
                            if !has(&entry.flags, f) {
                                entry.flags.push((*f).clone());
                            }
                        }
                    }
                    FlagUpdate::Remove => {
                        entry.flags.retain(|have| !flags.iter().any(|f| f.eq_ignore_ascii_case(have)))
                    }
                    FlagUpdate::Replace => {
                        let recent = has(&entry.flags, RECENT);
                        entry.flags = flags.iter().map(|f| (*f).clone()).collect();
                        if recent {
                            entry.flags.push(RECENT.into());
                        }
                    }
                }
                if entry.flags != before {
                    entry.modseq = *modseq.get_or_insert_with(|| next_modseq(&mut info));
                    mail.insert(&mail_key(mailbox, uid)[..], encode(&entry))?;
                }
                stored.changes.push(FlagChange { uid, flags: entry.flags, modseq: entry.modseq });
            }
            if modseq.is_some() {
                write_mailbox(mailboxes, &info)?;
            }
            Ok(stored)
        })?;
        drop(writing);
        self.flush().await?;
        self.notify(mailbox);
        Ok(stored)
    }

    /// EXPUNGE: removes the messages flagged `\Deleted` (only those among `only`, for UID
    /// EXPUNGE); returns the UIDs removed, ascending.
    pub async fn expunge(&self, mailbox: MailboxId, only: Option<&[Uid]>) -> Result<Vec<Uid>, MailboxOpError> {
        let candidates: Vec<Uid> = self
            .mail(mailbox)?
            .into_iter()
            .filter(|m| has(&m.flags, DELETED))
            .filter(|m| only.is_none_or(|only| only.binary_search(&m.uid).is_ok()))
            .map(|m| m.uid)
            .collect();
        if candidates.is_empty() {
            return Ok(Vec::new());
        }
        let removed = self.trees.transaction(|tx| {
            let holders = RefTrees { refs: tx.message_refs, collected: tx.collected, message_ids: tx.message_ids };
            let mut info = read_mailbox(tx.mailboxes, mailbox)?;
            let mut modseq = None;
            let mut removed = Vec::with_capacity(candidates.len());
            for &uid in &candidates {
                // Re-read: another session may have cleared \Deleted since the scan.
                let Some(entry) = read_entry(tx.mail, mailbox, uid)? else { continue };
                if has(&entry.flags, DELETED) {
                    tx.mail.remove(&mail_key(mailbox, uid)[..])?;
                    holders.release(entry.message)?;
                    let modseq = *modseq.get_or_insert_with(|| next_modseq(&mut info));
                    record_expunge(tx.expunged, mailbox, modseq, uid)?;
                    removed.push(uid);
                }
            }
            if modseq.is_some() {
                write_mailbox(tx.mailboxes, &info)?;
            }
            Ok(removed)
        })?;
        self.flush().await?;
        self.notify(mailbox);
        Ok(removed)
    }

    /// Fresh job ids, one per message that filing into an Ask folder may ask about. Taken outside
    /// the transaction, which may run more than once; unused ids are skipped.
    fn job_ids(&self, filing: Option<&Filing<'_>>, n: usize) -> Result<Vec<JobId>, StoreError> {
        let asks = filing.is_some_and(|f| f.ask.is_some());
        (0..if asks { n } else { 0 }).map(|_| Ok(JobId(self.db.generate_id()?))).collect()
    }

    /// COPY: copies the messages `uids` (those that still exist) into `to`, sharing their bytes.
    /// With `filing`, each copy is filed by that user (see [`Filing`]): indexed, and asked about
    /// if `to` is an Ask folder, in the same transaction.
    pub async fn copy_mail(
        &self,
        from: MailboxId,
        uids: &[Uid],
        to: MailboxId,
        filing: Option<&Filing<'_>>,
    ) -> Result<Copied, MailboxOpError> {
        let copied = self.transfer(from, uids, to, filing, Transfer::Copy).await?;
        self.notify_added(to);
        Ok(copied)
    }

    /// MOVE (RFC 6851 §3.1): COPY then EXPUNGE of the originals, as one atomic step, so no other
    /// session ever sees the message in both mailboxes or in neither. Each message keeps its
    /// holder count: one entry goes, one comes. `filing` as for [`Store::copy_mail`].
    pub async fn move_mail(
        &self,
        from: MailboxId,
        uids: &[Uid],
        to: MailboxId,
        filing: Option<&Filing<'_>>,
    ) -> Result<Copied, MailboxOpError> {
        let copied = self.transfer(from, uids, to, filing, Transfer::Move).await?;
        self.notify(from);
        self.notify_added(to);
        Ok(copied)
    }

    /// The one transaction of COPY or MOVE, flushed.
    async fn transfer(
        &self,
        from: MailboxId,
        uids: &[Uid],
        to: MailboxId,
        filing: Option<&Filing<'_>>,
        how: Transfer,
    ) -> Result<Copied, MailboxOpError> {
        let ids = self.job_ids(filing, uids.len())?;
        let now = Timestamp::now();
        let copied = self.trees.transaction(|tx| {
            let mut source = read_mailbox(tx.mailboxes, from)?;
            let mut entries = Vec::with_capacity(uids.len());
            let mut modseq = None;
            for &uid in uids {
                let Some(entry) = read_entry(tx.mail, from, uid)? else { continue };
                match how {
                    Transfer::Copy => hold(tx.message_refs, entry.message, 1, "")?,
                    // RFC 6851 §3.1: the originals are expunged, each a change of the source.
                    Transfer::Move => {
                        tx.mail.remove(&mail_key(from, uid)[..])?;
                        let modseq = *modseq.get_or_insert_with(|| next_modseq(&mut source));
                        record_expunge(tx.expunged, from, modseq, uid)?;
                    }
                }
                entries.push(entry);
            }
            if modseq.is_some() {
                write_mailbox(tx.mailboxes, &source)?;
            }
            let mut copied = put_copies(tx.mailboxes, tx.mail, to, &entries)?;
            copied.jobs = file_all(tx, filing, &entries, &ids, now)?;
            Ok(copied)
        })?;
        self.flush().await?;
        Ok(copied)
    }

    /// APPEND: stores `raw` as a new message in `mailbox` with `flags` and `internal_date`.
    /// `filing` as for [`Store::copy_mail`].
    pub async fn append_mail(
        &self,
        mailbox: MailboxId,
        raw: &[u8],
        flags: Vec<String>,
        internal_date: Timestamp,
        filing: Option<&Filing<'_>>,
    ) -> Result<Appended, MailboxOpError> {
        let mut all = self.append_all(mailbox, vec![NewMail { raw, flags, internal_date }], filing).await?;
        Ok(Appended { uid_validity: all.uid_validity, uid: all.uids[0], job: all.jobs.pop() })
    }

    /// MULTIAPPEND (RFC 3502 §6.3.11): stores `mails` in `mailbox` in one transaction, so either
    /// all of them are stored or none is; their UIDs are consecutive, in the given order.
    pub async fn append_all(
        &self,
        mailbox: MailboxId,
        mails: Vec<NewMail<'_>>,
        filing: Option<&Filing<'_>>,
    ) -> Result<AppendedAll, MailboxOpError> {
        let keys = mails.iter().map(|_| self.new_message_key()).collect::<Result<Vec<_>, _>>()?;
        let ids = self.job_ids(filing, mails.len())?;
        let now = Timestamp::now();
        let entries: Vec<MailEntry> = mails
            .iter()
            .zip(&keys)
            .map(|(mail, &key)| {
                let mut flags: Vec<String> =
                    mail.flags.iter().filter(|f| !f.eq_ignore_ascii_case(RECENT)).cloned().collect();
                flags.push(RECENT.into());
                MailEntry {
                    uid: Uid(0),
                    message: key,
                    flags,
                    internal_date: mail.internal_date,
                    size: mail.raw.len() as u64,
                    modseq: ModSeq::FIRST,
                }
            })
            .collect();
        let _staged = self.stage(keys.iter().copied().zip(mails.iter().map(|m| m.raw)))?;
        let appended = self.trees.transaction(|tx| {
            let mut info = read_mailbox(tx.mailboxes, mailbox)?;
            let mut stored = Vec::with_capacity(entries.len());
            for (entry, mail) in entries.iter().zip(&mails) {
                let uid = info.uid_next;
                info.uid_next = Uid(uid.0 + 1);
                let entry = MailEntry { uid, modseq: next_modseq(&mut info), ..entry.clone() };
                hold_new(tx.message_refs, entry.message, 1, "", mail.raw)?;
                tx.mail.insert(&mail_key(mailbox, uid)[..], encode(&entry))?;
                stored.push(entry);
            }
            tx.mailboxes.insert(&mailbox.to_be_bytes(), encode(&info))?;
            let jobs = file_all(tx, filing, &stored, &ids, now)?;
            let uids = stored.iter().map(|e| e.uid).collect();
            Ok(AppendedAll { uid_validity: info.uid_validity, uids, jobs })
        })?;
        self.flush().await?;
        self.notify_added(mailbox);
        Ok(appended)
    }

    /// SELECT claims `\Recent` (RFC 3501 §2.3.2): the messages that carry it are recent to this
    /// session only, and lose the flag in the store so no later session sees them as recent.
    pub async fn claim_recent(&self, mailbox: MailboxId) -> Result<Vec<Uid>, MailboxOpError> {
        let recent: Vec<Uid> =
            self.mail(mailbox)?.into_iter().filter(|m| has(&m.flags, RECENT)).map(|m| m.uid).collect();
        if recent.is_empty() {
            return Ok(recent);
        }
        let claimed = self.claim_recent_of(mailbox, &recent)?;
        self.flush().await?;
        Ok(claimed)
    }

    /// A session that has the mailbox selected claims `\Recent` of the new mail it is told of
    /// (RFC 3501 §2.3.2: recent in exactly one session): of `uids`, those still carrying the flag,
    /// which lose it in the same transaction, so two sessions never both claim one. Not flushed:
    /// after a crash a message is recent once more, which harms nothing.
    pub fn claim_recent_of(&self, mailbox: MailboxId, uids: &[Uid]) -> Result<Vec<Uid>, MailboxOpError> {
        let writing = self.trees.writing();
        let claimed = self.trees.mail.transaction(|mail| {
            let mut claimed = Vec::with_capacity(uids.len());
            for &uid in uids {
                let Some(mut entry) = read_entry(mail, mailbox, uid)? else { continue };
                if has(&entry.flags, RECENT) {
                    entry.flags.retain(|f| !f.eq_ignore_ascii_case(RECENT));
                    mail.insert(&mail_key(mailbox, uid)[..], encode(&entry))?;
                    claimed.push(uid);
                }
            }
            Ok(claimed)
        })?;
        drop(writing);
        Ok(claimed)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use nightmail_types::Timestamp;

    use crate::{FlagUpdate, Store, Uid};

    /// Many sessions writing at once (as eight IMAP clients appending do) must all finish: sled
    /// 0.34's `flush_async` deadlocks under this load, which `Store::flush` avoids. The writers run
    /// on their own runtime and thread, so a deadlock fails this test instead of hanging it.
    #[test]
    fn concurrent_appends_and_flag_changes_all_complete() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let (done, finished) = std::sync::mpsc::channel();
        let writer_store = store.clone();
        std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(4).enable_all().build().unwrap();
            runtime.block_on(async move {
                let inbox = writer_store.create_mailbox("me", "INBOX").await.unwrap().id;
                let writers: Vec<_> = (0..16)
                    .map(|w| {
                        let store = writer_store.clone();
                        tokio::spawn(async move {
                            for i in 0..40 {
                                let raw = format!("Subject: {w}-{i}\r\n\r\nbody\r\n");
                                let made = store
                                    .append_mail(inbox, raw.as_bytes(), vec![], Timestamp::now(), None)
                                    .await
                                    .unwrap();
                                store
                                    .update_flags(inbox, &[made.uid], FlagUpdate::Add, &["\\Seen".into()])
                                    .await
                                    .unwrap();
                            }
                        })
                    })
                    .collect();
                for writer in writers {
                    writer.await.unwrap();
                }
                done.send(inbox).unwrap();
            });
        });
        let inbox = finished.recv_timeout(Duration::from_secs(120)).expect("the store deadlocked");
        let mail = store.mail(inbox).unwrap();
        assert_eq!(mail.len(), 640);
        assert_eq!(mail.last().unwrap().uid, Uid(640), "UIDs are dense and unique under concurrency");
    }
}
