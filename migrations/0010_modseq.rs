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

pub fn apply(db: &sled::Db) -> Result<(), StoreError> {
    let mailboxes = db.open_tree(MAILBOXES)?;
    for entry in mailboxes.iter() {
        let (key, value) = entry?;
        let info: MailboxInfo = decode(MAILBOXES, &value)?;
        let info = MailboxInfo { highest_modseq: info.highest_modseq.max(ModSeq::FIRST), ..info };
        mailboxes.insert(key, encode(&info))?;
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
