//! Schema 10: mod-sequences for IMAP CONDSTORE and QRESYNC (RFC 7162; see `modseq.rs` in the
//! store). Every mailbox gets HIGHESTMODSEQ 1 and every message it holds the mod-sequence 1, as if
//! all of them had been stored in one change; the `expunged` tree starts empty. No client can
//! hold a mod-sequence from before this step, so no expunge before it needs remembering.
//!
//! Records are rewritten with the fields set; a re-run finds them set and writes the same.

use crate::StoreError;
use crate::mailbox::{MailEntry, MailboxInfo};
use crate::modseq::ModSeq;
use crate::schema::{EXPUNGED, MAIL, MAILBOXES, decode, encode};

fn encode_value(modseq: ModSeq) -> serde_json::Value {
    serde_json::to_value(modseq).expect("a mod-sequence serialises")
}

pub fn apply(db: &sled::Db) -> Result<(), StoreError> {
    let mailboxes = db.open_tree(MAILBOXES)?;
    for entry in mailboxes.iter() {
        let (key, value) = entry?;
        // Checked as a `MailboxInfo`, but rewritten as it was with the one field set: a field a
        // later step takes out of the type (schema 11's `subscribed`) must reach that step.
        let info: MailboxInfo = decode(MAILBOXES, &value)?;
        let mut record: serde_json::Map<String, serde_json::Value> = decode(MAILBOXES, &value)?;
        record.insert("highest_modseq".into(), encode_value(info.highest_modseq.max(ModSeq::FIRST)));
        mailboxes.insert(key, encode(&record))?;
    }
    let mail = db.open_tree(MAIL)?;
    for entry in mail.iter() {
        let (key, value) = entry?;
        let entry: MailEntry = decode(MAIL, &value)?;
        let entry = MailEntry { modseq: entry.modseq.max(ModSeq::FIRST), ..entry };
        mail.insert(key, encode(&entry))?;
    }
    db.open_tree(EXPUNGED)?;
    Ok(())
}
