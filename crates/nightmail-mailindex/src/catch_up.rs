//! Bringing a user's index up to their mailboxes, reading only what changed: a mailbox whose
//! HIGHESTMODSEQ is as recorded is skipped, and otherwise only UIDs above the last one indexed
//! are read, with the store's expunge records (RFC 7162 §3.2.5.1) saying what to take out.

use nightmail_store::{MailEntry, MailboxInfo, Store, Uid};
use nightmail_types::Address;
use tantivy::collector::Count;
use tantivy::query::TermQuery;
use tantivy::schema::{IndexRecordOption, Term};
use tantivy::{IndexWriter, TantivyDocument};

use crate::schema::doc_key;
use crate::state::{IndexedMailbox, IndexedMailboxes};
use crate::text::MailText;
use crate::{CatchUp, IndexError, MailIndex, RebuildReport, UserIndex};

/// The writer's memory before it writes a segment. One thread: the daemon's cores belong to the
/// model, and a catch-up is small.
const WRITER_MEMORY: usize = 32 * 1024 * 1024;

impl MailIndex {
    /// Indexes what is new in `user`'s mailboxes since the last catch-up, and takes out what was
    /// expunged or deleted.
    pub fn catch_up(&self, store: &Store, user: &Address) -> Result<CatchUp, IndexError> {
        let owner = self.owner(user)?;
        self.user_index(user, true)?.catch_up(store, user, owner, false)
    }

    /// Indexes every configured user's mail from scratch.
    pub fn rebuild(&self, store: &Store) -> Result<RebuildReport, IndexError> {
        let mut report = RebuildReport::default();
        for (user, owner) in self.users() {
            let index = self.user_index(user, true)?;
            index.catch_up(store, user, owner, true)?;
            report.users.push((user.clone(), index.count()?));
        }
        let configured: Vec<&str> = self.users().into_iter().map(|(_, owner)| owner).collect();
        report.skipped_owners = store.owners()?.into_iter().filter(|o| !configured.contains(&o.as_str())).collect();
        Ok(report)
    }
}

impl UserIndex {
    pub(crate) fn writer(&self) -> Result<IndexWriter<TantivyDocument>, IndexError> {
        self.index.writer_with_num_threads(1, WRITER_MEMORY).map_err(|e| self.error(e))
    }

    pub(crate) fn error(&self, e: tantivy::TantivyError) -> IndexError {
        IndexError::tantivy(&self.path, e)
    }

    /// Messages in the index as last committed.
    pub(crate) fn count(&self) -> Result<usize, IndexError> {
        Ok(self.reader.searcher().num_docs() as usize)
    }

    /// Messages of one mailbox in the index as last committed.
    fn count_mailbox(&self, mailbox_id: u64) -> Result<usize, IndexError> {
        let term = Term::from_field_u64(self.fields.mailbox_id, mailbox_id);
        let query = TermQuery::new(term, IndexRecordOption::Basic);
        self.reader.searcher().search(&query, &Count).map_err(|e| self.error(e))
    }

    /// `from_scratch`: forget every document and record first (a rebuild).
    fn catch_up(&self, store: &Store, user: &Address, owner: &str, from_scratch: bool) -> Result<CatchUp, IndexError> {
        let _writing = self.writing.lock().unwrap_or_else(|p| p.into_inner());
        // Another handle or process may have committed since this reader last looked.
        self.reader.reload().map_err(|e| self.error(e))?;
        let before = self.index.load_metas().map_err(|e| self.error(e))?;
        let before = IndexedMailboxes::from_payload(before.payload.as_deref()).unwrap_or_else(IndexedMailboxes::empty);
        let mut state = if from_scratch { IndexedMailboxes::empty() } else { before.clone() };
        // Read before any mail: a change after this read has a higher mod-sequence than the one
        // recorded below, so the next catch-up sees it.
        let mailboxes = store.mailboxes(owner)?;
        let mut done = CatchUp::default();

        let gone: Vec<u64> =
            state.mailboxes.keys().copied().filter(|id| !mailboxes.iter().any(|m| m.id.0 == *id)).collect();
        let changed = |m: &MailboxInfo| {
            state.mailboxes.get(&m.id.0).is_none_or(|r| !r.same_mailbox(m) || r.highest_modseq != m.highest_modseq)
        };
        if !from_scratch && gone.is_empty() && !mailboxes.iter().any(changed) {
            // The common case: no writer (and no lock file) for a catch-up with nothing to do.
            return Ok(done);
        }
        let mut writer = self.writer()?;
        if from_scratch {
            writer.delete_all_documents().map_err(|e| self.error(e))?;
        }
        for id in gone {
            state.mailboxes.remove(&id);
            done.removed += self.count_mailbox(id)?;
            writer.delete_term(Term::from_field_u64(self.fields.mailbox_id, id));
        }

        for mailbox in &mailboxes {
            let known = state.mailboxes.get(&mailbox.id.0).filter(|r| r.same_mailbox(mailbox)).cloned();
            let (mut record, new_mail) = match known {
                Some(record) if record.highest_modseq == mailbox.highest_modseq => continue,
                Some(record) => {
                    for uid in store.expunged_since(mailbox.id, record.highest_modseq)? {
                        if uid.0 <= record.last_uid {
                            let key = doc_key(mailbox.id.0, uid.0);
                            writer.delete_term(Term::from_field_text(self.fields.doc_key, &key));
                            done.removed += 1;
                        }
                    }
                    let new_mail = store.mail_after(mailbox.id, Uid(record.last_uid))?;
                    (record, new_mail)
                }
                None => {
                    if !from_scratch && state.mailboxes.contains_key(&mailbox.id.0) {
                        done.removed += self.count_mailbox(mailbox.id.0)?;
                        writer.delete_term(Term::from_field_u64(self.fields.mailbox_id, mailbox.id.0));
                    }
                    done.reindexed.push(mailbox.name.clone());
                    (IndexedMailbox::first(mailbox), store.mail(mailbox.id)?)
                }
            };
            for entry in &new_mail {
                self.add(&mut writer, store, user, mailbox, entry, &mut done)?;
                record.last_uid = record.last_uid.max(entry.uid.0);
            }
            record.highest_modseq = mailbox.highest_modseq;
            state.mailboxes.insert(mailbox.id.0, record);
        }

        if from_scratch || state != before {
            let mut commit = writer.prepare_commit().map_err(|e| self.error(e))?;
            commit.set_payload(&state.to_payload());
            commit.commit().map_err(|e| self.error(e))?;
            self.reader.reload().map_err(|e| self.error(e))?;
        }
        // Merges finish before the writer's lock is let go, so the next writer finds it free.
        writer.wait_merging_threads().map_err(|e| self.error(e))?;
        Ok(done)
    }

    /// Adds one message. A message the store has lost (a corrupt entry) is skipped with a
    /// warning: `nightmail check` reports it.
    fn add(
        &self,
        writer: &mut IndexWriter<TantivyDocument>,
        store: &Store,
        user: &Address,
        mailbox: &MailboxInfo,
        entry: &MailEntry,
        done: &mut CatchUp,
    ) -> Result<(), IndexError> {
        let Some(raw) = store.message(entry.message)? else {
            tracing::warn!(mailbox = %mailbox.name, uid = entry.uid.0, "mail entry without its message; not indexed");
            return Ok(());
        };
        let text = MailText::read(&raw, entry.internal_date);
        let f = &self.fields;
        let mut doc = TantivyDocument::default();
        doc.add_text(f.user, user.as_str());
        doc.add_u64(f.mailbox_id, mailbox.id.0);
        doc.add_text(f.doc_key, doc_key(mailbox.id.0, entry.uid.0));
        doc.add_text(f.mailbox, &mailbox.name);
        doc.add_u64(f.uid, u64::from(entry.uid.0));
        doc.add_text(f.subject, &text.subject);
        doc.add_text(f.from, &text.from);
        doc.add_text(f.body, &text.body);
        if let Some(date) = &text.date {
            doc.add_text(f.date, date);
        }
        if let Some(id) = &text.message_id {
            doc.add_text(f.message_id, id);
        }
        writer.add_document(doc).map_err(|e| self.error(e))?;
        done.indexed += 1;
        done.unreadable += usize::from(text.unreadable);
        Ok(())
    }
}
