//! A message file's life around the transactions that reference it (`message_files.rs` holds the
//! files): written before the transaction that may reference it ([`Store::stage`]), removed only
//! once the release of its last holder is flushed ([`reap`]), and any file nothing references
//! removed when the store opens ([`sweep`]), so no reference ever points at a missing file.

use crate::message_files::{Listed, MessageFiles};
use crate::schema::Trees;
use crate::{MessageKey, Store, StoreError};

fn key_of(bytes: &[u8]) -> Option<MessageKey> {
    Some(MessageKey(u64::from_be_bytes(bytes.try_into().ok()?)))
}

/// The keys in `collected` now. Taken before a flush: that flush makes their release durable,
/// and only then may [`reap`] remove their files.
pub(crate) fn collected(trees: &Trees) -> Result<Vec<MessageKey>, StoreError> {
    if trees.collected.is_empty() {
        return Ok(Vec::new());
    }
    trees.collected.iter().keys().map(|k| Ok(key_of(&k?).unwrap_or(MessageKey(u64::MAX)))).collect()
}

/// Removes the files of `keys` (from [`collected`], before a flush that has since returned),
/// unless a backup is copying files: then they wait for the next flush.
pub(crate) fn reap(trees: &Trees, keys: &[MessageKey]) -> Result<(), StoreError> {
    if keys.is_empty() {
        return Ok(());
    }
    // Under the gate: a backup takes it to start holding the files.
    let _writing = trees.writing();
    if trees.files.copying() {
        return Ok(());
    }
    for &key in keys {
        // Nothing holds it again; but a count this build did not keep is never acted on.
        if !trees.message_refs.contains_key(key.to_be_bytes())? {
            trees.files.remove(key)?;
        }
        trees.collected.remove(key.to_be_bytes())?;
    }
    Ok(())
}

/// At open, once what sled recovered is flushed: removes every file nothing references (a
/// crash between a file's write and its transaction, or between a release and its removal) and
/// empties `collected`. Returns how many files went.
pub(crate) fn sweep(trees: &Trees) -> Result<usize, StoreError> {
    let mut removed = 0;
    for listed in trees.files.list()? {
        match listed {
            Listed::Message(key) if trees.message_refs.contains_key(key.to_be_bytes())? => {}
            Listed::Message(key) => {
                trees.files.remove(key)?;
                removed += 1;
            }
            Listed::Stray(path) if path.is_file() => {
                trees.files.remove_stray(&path)?;
                removed += 1;
            }
            Listed::Stray(_) => {}
        }
    }
    trees.collected.clear()?;
    Ok(removed)
}

/// Files written ahead of the transaction that may reference them. Dropped after that
/// transaction, it removes those the transaction did not keep (it aborted, or every recipient
/// had the message already): a file nothing references and nothing ever will.
pub(crate) struct Staged {
    files: MessageFiles,
    refs: sled::Tree,
    keys: Vec<MessageKey>,
}

impl Drop for Staged {
    fn drop(&mut self) {
        for &key in &self.keys {
            match self.refs.contains_key(key.to_be_bytes()) {
                Ok(true) => {}
                Ok(false) => {
                    if let Err(e) = self.files.remove(key) {
                        tracing::warn!(%key, error = %e, "could not remove an unused message file (it goes at the next start)");
                    }
                }
                Err(e) => tracing::warn!(%key, error = %e, "message file left for the next start"),
            }
        }
    }
}

impl Store {
    /// Writes each message's file, durably, before the transaction that references it.
    pub(crate) fn stage<'a>(
        &self,
        messages: impl IntoIterator<Item = (MessageKey, &'a [u8])>,
    ) -> Result<Staged, StoreError> {
        let files = self.trees.files.clone();
        let mut staged = Staged { files: files.clone(), refs: self.trees.message_refs.clone(), keys: Vec::new() };
        for (key, raw) in messages {
            staged.keys.push(key);
            files.write(key, raw)?;
        }
        Ok(staged)
    }
}
