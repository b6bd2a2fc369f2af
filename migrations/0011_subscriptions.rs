//! Schema 11: subscriptions leave the mailbox record for a tree of their own, `subscriptions`
//! (owner `\0` name), so that one outlives the mailbox it names (RFC 9051 §6.3.7; see
//! `subscriptions.rs` in the store). Each mailbox whose record says `subscribed: true` becomes an
//! entry; then the records are rewritten without the field.
//!
//! Re-running is safe: the entries are flushed before any record loses its field, so a run that
//! dies while rewriting finds every subscription already carried over.

use serde::Deserialize;

use crate::StoreError;
use crate::mailbox::{MailboxInfo, name_key};
use crate::schema::{MAILBOXES, SUBSCRIPTIONS, decode, encode};

/// The part of a schema 10 mailbox record this step reads.
#[derive(Deserialize)]
struct Schema10Mailbox {
    owner: String,
    name: String,
    #[serde(default)]
    subscribed: bool,
}

pub fn apply(db: &sled::Db) -> Result<(), StoreError> {
    let mailboxes = db.open_tree(MAILBOXES)?;
    let subscriptions = db.open_tree(SUBSCRIPTIONS)?;
    for entry in mailboxes.iter() {
        let (_, value) = entry?;
        let old: Schema10Mailbox = decode(MAILBOXES, &value)?;
        if old.subscribed {
            subscriptions.insert(name_key(&old.owner, &old.name), &[])?;
        }
    }
    db.flush()?;
    for entry in mailboxes.iter() {
        let (key, value) = entry?;
        let info: MailboxInfo = decode(MAILBOXES, &value)?;
        mailboxes.insert(key, encode(&info))?;
    }
    Ok(())
}
