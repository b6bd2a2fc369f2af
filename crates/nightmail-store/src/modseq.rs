//! Mod-sequences for IMAP CONDSTORE and QRESYNC (RFC 7162): each mailbox counts its changes in
//! `MailboxInfo::highest_modseq` (HIGHESTMODSEQ, §3.1.2.1); every message carries the value of
//! the last change to it (§3.1.1: APPEND, COPY or MOVE in, a flag change), and every expunge is
//! kept in the `expunged` tree with the value of its change, so a client that was told of
//! mod-sequence `n` can be told exactly which UIDs vanished since (§3.2.5.1 VANISHED (EARLIER)).
//!
//! One store operation takes one new value per mailbox it changes, shared by every message it
//! touches there: the order of operations is what CHANGEDSINCE and UNCHANGEDSINCE compare, and
//! one transaction is one step of it. The counter lives in the mailbox record, which every such
//! transaction already writes (UIDNEXT) or now reads and writes, so two writers to one mailbox
//! conflict and sled runs one of them again: values are never shared across operations.

use sled::transaction::TransactionalTree;

use crate::ids::id_u64;
use crate::{MailboxId, MailboxInfo, Store, StoreError, Uid};

id_u64!(
    /// A mod-sequence value (RFC 7162 §3.1.1): positive, and per mailbox strictly ascending with
    /// each change. A store opened at schema 10 has given every message one.
    ModSeq
);

impl ModSeq {
    /// What a new mailbox, and every message a store migrated to schema 10 held, starts with
    /// (RFC 7162 §7: `mod-sequence-value` is at least 1).
    pub const FIRST: ModSeq = ModSeq(1);
}

impl Default for ModSeq {
    fn default() -> Self {
        ModSeq::FIRST
    }
}

/// Key of one expunge in the `expunged` tree: mailbox, then the mod-sequence of the expunge, then
/// the UID, so "expunged after n" is one range scan of the mailbox's keys.
pub(crate) fn expunged_key(mailbox: MailboxId, modseq: ModSeq, uid: Uid) -> [u8; 20] {
    let mut key = [0u8; 20];
    key[..8].copy_from_slice(&mailbox.to_be_bytes());
    key[8..16].copy_from_slice(&modseq.to_be_bytes());
    key[16..].copy_from_slice(&uid.0.to_be_bytes());
    key
}

/// The parts of an `expunged` key.
pub(crate) fn parse_expunged_key(key: &[u8]) -> Option<(MailboxId, ModSeq, Uid)> {
    let mailbox = MailboxId::from_be_slice(key.get(..8)?)?;
    let modseq = ModSeq::from_be_slice(key.get(8..16)?)?;
    let uid = Uid(u32::from_be_bytes(key.get(16..20)?.try_into().ok()?));
    Some((mailbox, modseq, uid))
}

/// Takes the next mod-sequence of `mailbox` for one operation; the caller writes the record back.
pub(crate) fn next_modseq(mailbox: &mut MailboxInfo) -> ModSeq {
    mailbox.highest_modseq = ModSeq(mailbox.highest_modseq.0 + 1);
    mailbox.highest_modseq
}

/// Records that `uid` left `mailbox` at `modseq`.
pub(crate) fn record_expunge(
    expunged: &TransactionalTree,
    mailbox: MailboxId,
    modseq: ModSeq,
    uid: Uid,
) -> Result<(), sled::transaction::UnabortableTransactionError> {
    expunged.insert(&expunged_key(mailbox, modseq, uid)[..], &[])?;
    Ok(())
}

impl Store {
    /// The UIDs expunged from `mailbox` by changes after `since`, ascending (RFC 7162 §3.2.5.1,
    /// §3.2.6: what VANISHED (EARLIER) reports).
    pub fn expunged_since(&self, mailbox: MailboxId, since: ModSeq) -> Result<Vec<Uid>, StoreError> {
        let Some(after) = since.0.checked_add(1) else { return Ok(Vec::new()) };
        let start = expunged_key(mailbox, ModSeq(after), Uid(0));
        let end = expunged_key(mailbox, ModSeq(u64::MAX), Uid(u32::MAX));
        let mut uids = Vec::new();
        for key in self.trees.expunged.range(start..=end).keys() {
            let key = key?;
            let (_, _, uid) = parse_expunged_key(&key)
                .ok_or(StoreError::Corrupt { tree: crate::schema::EXPUNGED, message: "short key".into() })?;
            uids.push(uid);
        }
        uids.sort_unstable();
        uids.dedup();
        Ok(uids)
    }
}

#[cfg(test)]
mod tests {
    use nightmail_types::Timestamp;

    use crate::{FlagUpdate, ModSeq, Store, Uid};

    /// Each operation takes one new mod-sequence per mailbox it changes (RFC 7162 §3.1.1): COPY
    /// and MOVE in give the copies a new one; MOVE out records the source's expunges; a STORE
    /// that changes nothing keeps the old one; DELETE takes its expunge records with it.
    #[tokio::test]
    async fn every_change_takes_a_new_mod_sequence_and_expunges_are_kept() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let inbox = store.create_mailbox("me", "INBOX").await.unwrap().id;
        let other = store.create_mailbox("me", "Other").await.unwrap().id;
        for i in 0..3 {
            let raw = format!("Subject: {i}\r\n\r\nbody\r\n");
            store.append_mail(inbox, raw.as_bytes(), vec![], Timestamp::now(), None).await.unwrap();
        }
        let modseqs: Vec<u64> = store.mail(inbox).unwrap().iter().map(|m| m.modseq.0).collect();
        assert_eq!(modseqs, [2, 3, 4]);
        let same = store.update_flags(inbox, &[Uid(1)], FlagUpdate::Remove, &["\\Seen".into()]).await.unwrap();
        assert_eq!(same[0].modseq, ModSeq(2), "a STORE that changes nothing keeps the mod-sequence");

        store.copy_mail(inbox, &[Uid(1)], other, None).await.unwrap();
        store.move_mail(inbox, &[Uid(2), Uid(3)], other, None).await.unwrap();
        let copies: Vec<(u32, u64)> = store.mail(other).unwrap().iter().map(|m| (m.uid.0, m.modseq.0)).collect();
        assert_eq!(copies, [(1, 2), (2, 3), (3, 3)]);
        assert_eq!(store.mailbox("me", "INBOX").unwrap().unwrap().highest_modseq, ModSeq(5));
        assert_eq!(store.expunged_since(inbox, ModSeq(4)).unwrap(), [Uid(2), Uid(3)]);

        store.update_flags(other, &[Uid(1)], FlagUpdate::Add, &["\\Deleted".into()]).await.unwrap();
        store.expunge(other, None).await.unwrap();
        assert_eq!(store.expunged_since(other, ModSeq::FIRST).unwrap(), [Uid(1)]);
        store.delete_mailbox("me", "Other").await.unwrap();
        assert!(store.expunged_since(other, ModSeq::FIRST).unwrap().is_empty());
        assert!(store.check().unwrap().is_whole());
    }

    /// `check` reads the expunge records: one naming a UID that is still there, or one from the
    /// mailbox's future, is reported.
    #[tokio::test]
    async fn the_integrity_check_reports_an_expunge_record_that_cannot_be() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let inbox = store.create_mailbox("me", "INBOX").await.unwrap().id;
        store.append_mail(inbox, b"Subject: x\r\n\r\nx\r\n", vec![], Timestamp::now(), None).await.unwrap();
        assert!(store.check().unwrap().is_whole());
        store.trees.expunged.insert(super::expunged_key(inbox, ModSeq(2), Uid(1)), &[]).unwrap();
        store.trees.expunged.insert(super::expunged_key(inbox, ModSeq(99), Uid(7)), &[]).unwrap();
        let problems = store.check().unwrap().problems;
        assert!(problems.iter().any(|p| p.contains("UID 1") && p.contains("still there")), "{problems:?}");
        assert!(problems.iter().any(|p| p.contains("UID 7") && p.contains("future")), "{problems:?}");
    }
}
