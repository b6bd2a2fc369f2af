//! Schema 4: `message_refs`, the count of what holds each stored message (mailbox entries, jobs,
//! outbound entries) and the Message-ID it is indexed under, so EXPUNGE can delete the bytes of a
//! message nothing holds any more (see `refs.rs` in the store).
//!
//! The counts are rebuilt from scratch, so a re-run after a crash gives the same result. Messages
//! nothing holds (expunged before schema 4) are collected here, with their index entries.

use std::collections::BTreeMap;

use crate::delivery::MessageRef;
use crate::job::Job;
use crate::mailbox::MailEntry;
use crate::outbound::Outbound;
use crate::refs::Holders;
use crate::schema::{JOBS, MAIL, MESSAGE_IDS, MESSAGE_REFS, MESSAGES, OUTBOUND, decode, encode};
use crate::{MessageKey, StoreError};

pub fn apply(db: &sled::Db) -> Result<(), StoreError> {
    let mut holders: BTreeMap<MessageKey, Holders> = BTreeMap::new();
    let mut count = |key: MessageKey| holders.entry(key).or_default().count += 1;
    for entry in db.open_tree(MAIL)?.iter().values() {
        count(decode::<MailEntry>(MAIL, &entry?)?.message);
    }
    for job in db.open_tree(JOBS)?.iter().values() {
        count(decode::<Job>(JOBS, &job?)?.message);
    }
    for outbound in db.open_tree(OUTBOUND)?.iter().values() {
        count(decode::<Outbound>(OUTBOUND, &outbound?)?.message);
    }
    let index = db.open_tree(MESSAGE_IDS)?;
    for entry in index.iter() {
        let (id, copies) = entry?;
        let mut copies: Vec<MessageRef> = decode(MESSAGE_IDS, &copies)?;
        for copy in &copies {
            if let Some(h) = holders.get_mut(&copy.key) {
                h.message_id = String::from_utf8_lossy(&id).into_owned();
            }
        }
        // Index entries of messages nothing holds go with their bytes.
        copies.retain(|c| holders.contains_key(&c.key));
        if copies.is_empty() {
            index.remove(&id)?;
        } else {
            index.insert(&id, encode(&copies))?;
        }
    }
    let refs = db.open_tree(MESSAGE_REFS)?;
    refs.clear()?;
    for (key, h) in &holders {
        refs.insert(key.to_be_bytes(), encode(h))?;
    }
    let messages = db.open_tree(MESSAGES)?;
    for key in messages.iter().keys() {
        let key = key?;
        let held = MessageKey::from_be_slice(&key).is_some_and(|k| holders.contains_key(&k));
        if !held {
            messages.remove(&key)?;
        }
    }
    Ok(())
}
