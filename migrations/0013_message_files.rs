//! Schema 13: message bytes leave the `messages` tree for files under the store's directory
//! (`message_files.rs` in the store), so that reading mail no longer grows sled's cache, which
//! `cache_capacity` does not bound for large values. Each message's file is written and synced,
//! its size and SHA-256 recorded with its holders, and its entry removed; then the tree is dropped.
//!
//! Re-running is safe: a file is durable before its entry goes, and one written again by a re-run
//! replaces the same bytes. A message nothing holds (no `message_refs` record) gets no file.

use std::path::Path;

use crate::message_files::MessageFiles;
use crate::refs::Holders;
use crate::schema::{MESSAGE_REFS, MESSAGES, decode, encode};
use crate::{MessageKey, StoreError};

pub fn apply(db: &sled::Db, dir: &Path) -> Result<(), StoreError> {
    let messages = db.open_tree(MESSAGES)?;
    let refs = db.open_tree(MESSAGE_REFS)?;
    let files = MessageFiles::new(dir);
    let mut moved = 0u64;
    for entry in messages.iter() {
        let (key, raw) = entry?;
        let Ok(bytes) = <[u8; 8]>::try_from(&key[..]) else {
            messages.remove(&key)?;
            continue;
        };
        let key_id = MessageKey(u64::from_be_bytes(bytes));
        if let Some(value) = refs.get(&key)? {
            files.write(key_id, &raw)?;
            let mut holders: Holders = decode(MESSAGE_REFS, &value)?;
            holders.size = raw.len() as u64;
            holders.sha256 = crate::stable_digest(&raw);
            refs.insert(&key, encode(&holders))?;
            moved += 1;
        }
        messages.remove(&key)?;
    }
    db.flush()?;
    db.drop_tree(MESSAGES)?;
    tracing::info!(moved, "message bytes moved to files");
    Ok(())
}
