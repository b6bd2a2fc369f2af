//! A session's view of its selected mailbox (RFC 3501 §2.3.1): the messages it has announced,
//! in UID order, so that message sequence number n is the n-th of them. The view changes only
//! when the session tells its client (EXISTS, EXPUNGE, FETCH FLAGS), which keeps sequence numbers
//! the client holds valid while other sessions change the mailbox.

use std::collections::{BTreeSet, HashSet};
use std::num::NonZeroU32;

use imap_next::imap_types::response::Data;
use imap_next::imap_types::sequence::{SeqOrUid, Sequence, SequenceSet};
use nightmail_store::{ChangeKind, MailEntry, MailboxChange, MailboxInfo, Store, Uid};
use tokio::sync::broadcast;

use crate::ImapError;
use crate::command::condstore::{self, Tracking};

/// A message sequence number (RFC 3501 §2.3.1.2): 1-based position in the view. Distinct from a
/// [`Uid`] so one cannot be passed for the other.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct SeqNum(pub NonZeroU32);

impl SeqNum {
    fn of_index(index: usize) -> SeqNum {
        SeqNum(NonZeroU32::new(index as u32 + 1).expect("index + 1 is never zero"))
    }
}

/// Which numbers a command's sequence set speaks of (RFC 3501 §6.4.8: the UID prefix).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Numbers {
    Seq,
    Uid,
}

impl Numbers {
    pub fn of(uid: bool) -> Numbers {
        if uid { Numbers::Uid } else { Numbers::Seq }
    }
}

pub struct Selected {
    pub info: MailboxInfo,
    pub read_only: bool,
    /// The messages as announced, in UID order; `\Recent` is kept in `recent`, not in flags.
    pub messages: Vec<MailEntry>,
    /// UIDs recent to this session (RFC 3501 §2.3.2).
    pub recent: HashSet<Uid>,
    /// The keywords the client was told of in FLAGS and PERMANENTFLAGS (RFC 3501 §7.2.6): every
    /// keyword a message of the view carries must be among them before a FETCH shows it.
    pub keywords: BTreeSet<String>,
    /// A keyword joined `keywords` that the client has not been told of yet.
    pub keywords_changed: bool,
    /// Searches kept up to date while this mailbox is selected (RFC 5267 §4.1 UPDATE).
    pub live: Vec<crate::command::context::LiveSearch>,
    /// Selected by an IMAP4rev2 session (`command/rev2.rs`): RFC 9051 has no `\Recent`, so new
    /// mail is claimed by no one here and no RECENT is sent.
    pub rev2: bool,
    /// RFC 5182 search result variable (`$`), as UIDs: empty at SELECT, set by RETURN (SAVE).
    pub saved: Vec<Uid>,
    changes: broadcast::Receiver<MailboxChange>,
    /// The largest change announced that the client has not been told about yet: mail only
    /// added is read from the last UID on, anything else needs the whole mailbox.
    pending: Option<ChangeKind>,
}

/// Whether a stored flag is a keyword (RFC 3501 §2.3.2: flags without a backslash).
fn is_keyword(flag: &str) -> bool {
    !flag.starts_with('\\')
}

pub(crate) fn without_recent(mut entry: MailEntry) -> MailEntry {
    entry.flags.retain(|f| !f.eq_ignore_ascii_case("\\Recent"));
    entry
}

impl Selected {
    /// Loads `info`'s messages. Listening starts before the read, so no change is missed.
    pub fn load(
        store: &Store,
        info: MailboxInfo,
        read_only: bool,
        recent: HashSet<Uid>,
    ) -> Result<Selected, ImapError> {
        let changes = store.changes();
        let messages: Vec<MailEntry> = store.mail(info.id)?.into_iter().map(without_recent).collect();
        let keywords = messages.iter().flat_map(|m| m.flags.iter()).filter(|f| is_keyword(f)).cloned().collect();
        Ok(Selected {
            info,
            read_only,
            messages,
            recent,
            keywords,
            keywords_changed: false,
            live: Vec::new(),
            rev2: false,
            saved: Vec::new(),
            changes,
            pending: None,
        })
    }

    /// Notes the keywords among `flags`; sets `keywords_changed` when one is new.
    pub fn learn_keywords(&mut self, flags: &[String]) {
        for flag in flags.iter().filter(|f| is_keyword(f)) {
            if self.keywords.insert(flag.clone()) {
                self.keywords_changed = true;
            }
        }
    }

    pub fn exists(&self) -> u32 {
        self.messages.len() as u32
    }

    pub fn seq_of(&self, index: usize) -> SeqNum {
        SeqNum::of_index(index)
    }

    pub fn index_of_uid(&self, uid: Uid) -> Option<usize> {
        self.messages.binary_search_by_key(&uid, |m| m.uid).ok()
    }

    /// The view positions a sequence set names, ascending, each once.
    ///
    /// Sequence numbers outside the view are a client error (RFC 9051 §6.4.5 and Dovecot answer
    /// BAD); UIDs that do not exist are simply not there (RFC 3501 §6.4.8), and `*` is the
    /// highest UID in the view, so `n:*` always includes it.
    pub fn resolve(&self, set: &SequenceSet, numbers: Numbers) -> Result<Vec<usize>, ImapError> {
        let mut out = Vec::new();
        match numbers {
            Numbers::Seq => {
                let count = self.messages.len() as u32;
                for seq in set.0.as_ref() {
                    let (a, b) = bounds(seq, count);
                    let (lo, hi) = (a.min(b), a.max(b));
                    if lo == 0 || hi > count {
                        return Err(ImapError::bad("invalid message sequence number (see EXISTS)"));
                    }
                    out.extend((lo as usize - 1)..(hi as usize));
                }
            }
            Numbers::Uid => {
                let largest = self.messages.last().map_or(0, |m| m.uid.0);
                for seq in set.0.as_ref() {
                    let (a, b) = bounds(seq, largest);
                    let (lo, hi) = (a.min(b), a.max(b));
                    let start = self.messages.partition_point(|m| m.uid.0 < lo);
                    let end = self.messages.partition_point(|m| m.uid.0 <= hi);
                    out.extend(start..end);
                }
            }
        }
        out.sort_unstable();
        out.dedup();
        Ok(out)
    }

    fn note(&mut self, kind: ChangeKind) {
        self.pending = self.pending.max(Some(kind));
    }

    /// Notes announcements that arrived since the last look. Cheap; never blocks.
    fn drain(&mut self) {
        loop {
            match self.changes.try_recv() {
                Ok(change) if change.mailbox == self.info.id => self.note(change.kind),
                Ok(_) => {}
                Err(broadcast::error::TryRecvError::Lagged(_)) => self.note(ChangeKind::Changed),
                Err(_) => break,
            }
        }
    }

    /// Waits until the selected mailbox changes (for IDLE). Every store write announces itself;
    /// as a safety net for a writer that does not, UIDNEXT is also checked each second, so new
    /// mail is never more than a second late.
    pub async fn changed(&mut self, store: &Store) {
        let mut tick = tokio::time::interval(std::time::Duration::from_secs(1));
        loop {
            tokio::select! {
                received = self.changes.recv() => match received {
                    Ok(change) if change.mailbox == self.info.id => {
                        self.note(change.kind);
                        return;
                    }
                    Ok(_) => {}
                    Err(broadcast::error::RecvError::Lagged(_)) => {
                        self.note(ChangeKind::Changed);
                        return;
                    }
                    Err(broadcast::error::RecvError::Closed) => std::future::pending::<()>().await,
                },
                _ = tick.tick() => {
                    let now = store.mailbox_by_id(self.info.id).ok().flatten();
                    match now {
                        None => {
                            self.note(ChangeKind::Changed);
                            return;
                        }
                        Some(m) if m.uid_next != self.info.uid_next => {
                            self.note(ChangeKind::Added);
                            return;
                        }
                        Some(_) => {}
                    }
                }
            }
        }
    }

    /// Brings the view up to date with the store and returns what the client must be told:
    /// EXPUNGE for each vanished message (highest first, so each number is valid when sent),
    /// FETCH FLAGS for changed flags, then EXISTS and RECENT for new mail (RFC 3501 §7.3.1, §7.4.1).
    ///
    /// With `expunges_allowed` false (during FETCH, STORE and SEARCH, RFC 3501 §7.4.1), nothing
    /// is reported and the changes wait for a later command.
    ///
    /// Once CONDSTORE is on, a change of mod-sequence alone is told too, with UID and MODSEQ, and
    /// once QRESYNC is, expunges are one VANISHED (RFC 7162 §3.1, §3.2.10).
    ///
    /// With `flags` false (NOTIFY without FlagChange for the selected mailbox, RFC 5465 §5.1)
    /// other sessions' flag changes are taken into the view without a FETCH.
    pub fn sync(
        &mut self,
        store: &Store,
        expunges_allowed: bool,
        tracking: Tracking,
        flags: bool,
    ) -> Result<Vec<Data<'static>>, ImapError> {
        self.drain();
        let Some(kind) = self.pending.filter(|_| expunges_allowed) else { return Ok(Vec::new()) };
        self.update(store, kind, true, tracking, flags)
    }

    /// RFC 5465 §6.1 `selected-delayed`: new mail and flag changes are told now, expunges wait
    /// for a command that allows them (the view keeps the messages until then).
    pub fn sync_holding_expunges(
        &mut self,
        store: &Store,
        tracking: Tracking,
        flags: bool,
    ) -> Result<Vec<Data<'static>>, ImapError> {
        self.drain();
        let Some(kind) = self.pending else { return Ok(Vec::new()) };
        self.update(store, kind, false, tracking, flags)
    }

    fn update(
        &mut self,
        store: &Store,
        kind: ChangeKind,
        expunges: bool,
        tracking: Tracking,
        flags: bool,
    ) -> Result<Vec<Data<'static>>, ImapError> {
        self.pending = None;
        let mut out = Vec::new();
        let last_known = self.messages.last().map_or(Uid(0), |m| m.uid);
        // `whole`: `now` is every message, so one missing from it was expunged.
        let (now, whole): (Vec<MailEntry>, bool) = match store.mailbox_by_id(self.info.id)? {
            Some(info) => {
                self.info = info;
                match kind {
                    // Only new mail: the messages above the last one known, not the whole mailbox.
                    ChangeKind::Added => (store.mail_after(self.info.id, last_known)?, false),
                    ChangeKind::Changed => (store.mail(self.info.id)?, true),
                }
            }
            // Deleted by another session: every message is gone.
            None => (Vec::new(), true),
        };
        // New mail still marked `\Recent` is recent to the first session that learns of it
        // (RFC 3501 §2.3.2); EXAMINE claims nothing.
        let last = self.messages.last().map_or(0, |m| m.uid.0);
        let unclaimed: Vec<Uid> = now
            .iter()
            .filter(|m| m.uid.0 > last && m.flags.iter().any(|f| f.eq_ignore_ascii_case("\\Recent")))
            .map(|m| m.uid)
            .collect();
        if !self.read_only && !self.rev2 && !unclaimed.is_empty() {
            self.recent.extend(store.claim_recent_of(self.info.id, &unclaimed)?);
        }
        let now: Vec<MailEntry> = now.into_iter().map(without_recent).collect();
        for entry in &now {
            self.learn_keywords(&entry.flags);
        }
        let present: HashSet<Uid> = now.iter().map(|m| m.uid).collect();
        if whole {
            let gone: Vec<Uid> = self.messages.iter().map(|m| m.uid).filter(|u| !present.contains(u)).collect();
            if expunges {
                out.extend(condstore::expunged(self, &gone, tracking));
            } else if !gone.is_empty() {
                self.note(ChangeKind::Changed);
            }
        }
        let last = self.messages.last().map_or(0, |m| m.uid.0);
        let mut added = false;
        for entry in now {
            if entry.uid.0 > last {
                self.messages.push(entry);
                added = true;
            } else if let Some(index) = self.index_of_uid(entry.uid) {
                let known = &self.messages[index];
                let told = known.flags != entry.flags || (tracking.condstore() && known.modseq != entry.modseq);
                self.messages[index].flags = entry.flags;
                self.messages[index].modseq = entry.modseq;
                if told && flags {
                    out.extend(condstore::flags_fetch(self, index, tracking));
                }
            }
        }
        if added {
            out.push(Data::Exists(self.exists()));
            if !self.rev2 {
                out.push(Data::Recent(self.recent.len() as u32));
            }
        }
        Ok(out)
    }
}

fn bounds(seq: &Sequence, largest: u32) -> (u32, u32) {
    let value = |s: &SeqOrUid| match s {
        SeqOrUid::Value(v) => v.get(),
        SeqOrUid::Asterisk => largest,
    };
    match seq {
        Sequence::Single(s) => (value(s), value(s)),
        Sequence::Range(a, b) => (value(a), value(b)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view(uids: &[u32]) -> Vec<MailEntry> {
        uids.iter()
            .map(|&u| MailEntry {
                uid: Uid(u),
                message: nightmail_store::MessageKey(u as u64),
                flags: vec![],
                internal_date: nightmail_types::Timestamp(0),
                size: 1,
                modseq: nightmail_store::ModSeq::FIRST,
            })
            .collect()
    }

    async fn selected(uids: &[u32]) -> (tempfile::TempDir, Selected) {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let info = store.create_mailbox("me", "INBOX").await.unwrap();
        let mut s = Selected::load(&store, info, false, HashSet::new()).unwrap();
        s.messages = view(uids);
        (dir, s)
    }

    #[tokio::test]
    async fn sequence_numbers_out_of_range_are_bad_and_uids_are_not() {
        let (_dir, s) = selected(&[3, 7, 9]).await;
        let set = |t: &str| SequenceSet::try_from(t).unwrap();
        assert_eq!(s.resolve(&set("1:*"), Numbers::Seq).unwrap(), vec![0, 1, 2]);
        assert_eq!(s.resolve(&set("3,1,2:1"), Numbers::Seq).unwrap(), vec![0, 1, 2]);
        assert!(s.resolve(&set("4"), Numbers::Seq).is_err());
        assert!(s.resolve(&set("2:4294967295"), Numbers::Seq).is_err());
        assert_eq!(s.resolve(&set("4:8"), Numbers::Uid).unwrap(), vec![1]);
        assert_eq!(s.resolve(&set("100:*"), Numbers::Uid).unwrap(), vec![2], "n:* includes the highest UID");
        assert_eq!(s.resolve(&set("1:4294967295"), Numbers::Uid).unwrap(), vec![0, 1, 2]);
        assert!(s.resolve(&set("10"), Numbers::Uid).unwrap().is_empty());
    }

    #[tokio::test]
    async fn an_empty_mailbox_has_no_sequence_numbers() {
        let (_dir, s) = selected(&[]).await;
        assert!(s.resolve(&SequenceSet::try_from("1:*").unwrap(), Numbers::Seq).is_err());
        assert!(s.resolve(&SequenceSet::try_from("1:*").unwrap(), Numbers::Uid).unwrap().is_empty());
    }
}
