//! Schema 1: messages, mailboxes, mail, jobs, dedupe and meta. Jobs were found by scanning `jobs`.

use crate::StoreError;
use crate::schema::{DEDUPE, JOBS, MAIL, MAILBOX_NAMES, MAILBOXES, MESSAGES, META};

pub fn apply(db: &sled::Db) -> Result<(), StoreError> {
    for tree in [META, MESSAGES, MAILBOXES, MAILBOX_NAMES, MAIL, JOBS, DEDUPE] {
        db.open_tree(tree)?;
    }
    Ok(())
}
