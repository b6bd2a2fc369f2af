//! Per-user mailboxes (RFC 3501 §2.3.1.1 for the UID rules they keep).

use nightmail_types::Timestamp;
use serde::{Deserialize, Serialize};
use sled::Transactional;
use sled::transaction::{ConflictableTransactionError, TransactionalTree};

use crate::ids::{mail_key, uid_of_mail_key};
use crate::modseq::{ModSeq, next_modseq};
use crate::schema::{KEY_LAST_UIDVALIDITY, MAIL, MAILBOXES, decode, encode, u32_of};
use crate::{MailboxId, MessageKey, Store, StoreError, Uid};

/// RFC 3501 §5.1: INBOX is case-insensitive; every other name is kept as given.
pub(crate) fn canonical_name(name: &str) -> &str {
    if name.eq_ignore_ascii_case("INBOX") { "INBOX" } else { name }
}

pub(crate) fn name_key(owner: &str, name: &str) -> Vec<u8> {
    let mut key = Vec::with_capacity(owner.len() + name.len() + 1);
    key.extend_from_slice(owner.as_bytes());
    key.push(0);
    key.extend_from_slice(canonical_name(name).as_bytes());
    key
}

/// A mailbox as stored.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MailboxInfo {
    pub id: MailboxId,
    /// The user name (from configuration) that owns it.
    pub owner: String,
    pub name: String,
    pub uid_validity: u32,
    pub uid_next: Uid,
    /// RFC 7162 §3.1.2.1 HIGHESTMODSEQ: the mod-sequence of the last change to the mailbox's
    /// messages (schema 10; see `modseq.rs`).
    #[serde(default)]
    pub highest_modseq: ModSeq,
}

/// One message in one mailbox.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MailEntry {
    #[serde(skip)]
    pub uid: Uid,
    pub message: MessageKey,
    pub flags: Vec<String>,
    pub internal_date: Timestamp,
    pub size: u64,
    /// RFC 7162 §3.1.1: the mod-sequence of the last change to this entry (schema 10).
    #[serde(default)]
    pub modseq: ModSeq,
}

type TxResult<T> = Result<T, ConflictableTransactionError<StoreError>>;

/// Finds `owner`'s mailbox `name`, creating it (with a fresh UIDVALIDITY) if missing.
/// `new_id` is used only when it is created.
pub(crate) fn ensure_mailbox(
    meta: &TransactionalTree,
    mailboxes: &TransactionalTree,
    names: &TransactionalTree,
    owner: &str,
    name: &str,
    new_id: MailboxId,
    now: Timestamp,
) -> TxResult<MailboxInfo> {
    let key = name_key(owner, name);
    if let Some(id) = names.get(&key)? {
        let id = MailboxId::from_be_slice(&id).expect("mailbox ids are 8 bytes");
        let record = mailboxes.get(id.to_be_bytes())?.ok_or_else(|| {
            ConflictableTransactionError::Abort(StoreError::Corrupt {
                tree: MAILBOXES,
                message: format!("name {owner}/{name} points at missing mailbox {id}"),
            })
        })?;
        return decode(MAILBOXES, &record).map_err(ConflictableTransactionError::Abort);
    }
    // UIDVALIDITY must change whenever a name is reused for a new mailbox (RFC 3501 §2.3.1.1):
    // take the clock, but never less than one above the last value handed out.
    let last = meta.get(KEY_LAST_UIDVALIDITY)?.and_then(|v| u32_of(&v)).unwrap_or(0);
    let uid_validity = (now.secs() as u32).max(last + 1);
    meta.insert(KEY_LAST_UIDVALIDITY, &uid_validity.to_be_bytes())?;
    let info = MailboxInfo {
        id: new_id,
        owner: owner.to_string(),
        name: canonical_name(name).to_string(),
        uid_validity,
        uid_next: Uid(1),
        highest_modseq: ModSeq::FIRST,
    };
    mailboxes.insert(&new_id.to_be_bytes(), encode(&info))?;
    names.insert(key, &new_id.to_be_bytes())?;
    Ok(info)
}

/// Appends a message to a mailbox, taking the next UID and the next mod-sequence (RFC 7162
/// §3.1.1: a new message has a mod-sequence of its own).
pub(crate) fn append(
    mailboxes: &TransactionalTree,
    mail: &TransactionalTree,
    mut mailbox: MailboxInfo,
    entry: &MailEntry,
) -> TxResult<Uid> {
    let uid = mailbox.uid_next;
    mailbox.uid_next = Uid(uid.0 + 1);
    let entry = MailEntry { modseq: next_modseq(&mut mailbox), ..entry.clone() };
    mailboxes.insert(&mailbox.id.to_be_bytes(), encode(&mailbox))?;
    mail.insert(&mail_key(mailbox.id, uid)[..], encode(&entry))?;
    Ok(uid)
}

/// A record of the `mail` tree as a [`MailEntry`], its UID taken from the key.
fn mail_entry(record: sled::Result<(sled::IVec, sled::IVec)>) -> Result<MailEntry, StoreError> {
    let (key, value) = record?;
    let mut entry: MailEntry = decode(MAIL, &value)?;
    entry.uid = uid_of_mail_key(&key).ok_or(StoreError::Corrupt { tree: MAIL, message: "short key".into() })?;
    Ok(entry)
}

impl Store {
    pub fn mailbox(&self, owner: &str, name: &str) -> Result<Option<MailboxInfo>, StoreError> {
        let Some(id) = self.trees.mailbox_names.get(name_key(owner, name))? else {
            return Ok(None);
        };
        let id = MailboxId::from_be_slice(&id).expect("mailbox ids are 8 bytes");
        self.trees.mailboxes.get(id.to_be_bytes())?.map(|v| decode(MAILBOXES, &v)).transpose()
    }

    /// `owner`'s mailboxes, by name.
    pub fn mailboxes(&self, owner: &str) -> Result<Vec<MailboxInfo>, StoreError> {
        let mut prefix = owner.as_bytes().to_vec();
        prefix.push(0);
        let mut list = Vec::new();
        for entry in self.trees.mailbox_names.scan_prefix(&prefix) {
            let (_, id) = entry?;
            if let Some(record) = self.trees.mailboxes.get(&id)? {
                list.push(decode(MAILBOXES, &record)?);
            }
        }
        Ok(list)
    }

    /// Every owner that has a mailbox, in byte order: the users a rebuild of the mail index
    /// walks, including owners no longer configured (so it can say which it left out).
    pub fn owners(&self) -> Result<Vec<String>, StoreError> {
        let mut owners: Vec<String> = Vec::new();
        for key in self.trees.mailbox_names.iter().keys() {
            let key = key?;
            let owner = key.split(|&b| b == 0).next().unwrap_or_default();
            let owner = String::from_utf8_lossy(owner);
            if owners.last().map(String::as_str) != Some(&*owner) {
                owners.push(owner.into_owned());
            }
        }
        Ok(owners)
    }

    /// The messages of a mailbox, in UID order.
    pub fn mail(&self, mailbox: MailboxId) -> Result<Vec<MailEntry>, StoreError> {
        self.trees.mail.scan_prefix(mailbox.to_be_bytes()).map(mail_entry).collect()
    }

    /// The messages of a mailbox with a UID above `uid`, in UID order: what an IMAP session
    /// that knows the mailbox up to `uid` reads when mail was only added ([`ChangeKind::Added`]).
    ///
    /// [`ChangeKind::Added`]: crate::ChangeKind::Added
    pub fn mail_after(&self, mailbox: MailboxId, uid: Uid) -> Result<Vec<MailEntry>, StoreError> {
        let Some(first) = uid.0.checked_add(1) else { return Ok(Vec::new()) };
        let start = mail_key(mailbox, Uid(first));
        let end = mail_key(mailbox, Uid(u32::MAX));
        self.trees.mail.range(start..=end).map(mail_entry).collect()
    }

    /// Creates `owner`'s mailbox `name` if it does not exist.
    /// The mailboxes the server makes (INBOX, Sent, ...) start subscribed.
    pub async fn create_mailbox(&self, owner: &str, name: &str) -> Result<MailboxInfo, StoreError> {
        self.create_mailbox_subscribed(owner, name, true).await
    }

    /// Creates `owner`'s mailbox `name` if it does not exist, subscribing to it if asked (in the
    /// same transaction); an existing one is returned as it is, its subscription untouched.
    pub(crate) async fn create_mailbox_subscribed(
        &self,
        owner: &str,
        name: &str,
        subscribed: bool,
    ) -> Result<MailboxInfo, StoreError> {
        let new_id = MailboxId(self.db.generate_id()?);
        let now = Timestamp::now();
        let t = &self.trees;
        let writing = self.trees.writing();
        let info = (&t.meta, &t.mailboxes, &t.mailbox_names, &t.subscriptions).transaction(
            |(meta, mailboxes, names, subscriptions)| {
                let info = ensure_mailbox(meta, mailboxes, names, owner, name, new_id, now)?;
                if info.id == new_id && subscribed {
                    subscriptions.insert(name_key(owner, &info.name), &[])?;
                }
                Ok(info)
            },
        )?;
        drop(writing);
        self.flush().await?;
        // RFC 5465 §5.4: a NOTIFY session watching for MailboxName learns of the new mailbox.
        self.notify(info.id);
        Ok(info)
    }
}

#[cfg(test)]
mod tests {
    use crate::Store;

    /// Owners come once each however many mailboxes they have, and one whose name is a prefix of
    /// another's stays apart from it (the key's `\0` ends the owner).
    #[tokio::test]
    async fn owners_lists_each_mailbox_owner_once() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        assert!(store.owners().unwrap().is_empty());
        for (owner, name) in [("bob", "INBOX"), ("al", "INBOX"), ("al", "Sent"), ("alice", "INBOX")] {
            store.create_mailbox(owner, name).await.unwrap();
        }
        assert_eq!(store.owners().unwrap(), ["al", "alice", "bob"]);
    }
}
