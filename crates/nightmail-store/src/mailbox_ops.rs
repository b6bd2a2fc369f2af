//! Mailbox management for IMAP: the default set of mailboxes, CREATE, DELETE and RENAME
//! (RFC 3501 §6.3.3–6.3.5), and special-use roles (RFC 6154). Subscriptions: `subscriptions.rs`.
//!
//! sled transactions cannot scan, so DELETE and RENAME list the affected keys first and then
//! change them in one transaction. A message delivered to a mailbox between the two steps of its
//! DELETE is left under the dead mailbox id, unreachable (ids are never reused), and its bytes
//! stay held by that entry. DELETE releases the messages it removes, as EXPUNGE does (`refs`).

use sled::Transactional;
use sled::transaction::ConflictableTransactionError;

use crate::mailbox::{MailEntry, canonical_name, name_key};
use crate::refs::RefTrees;
use crate::schema::{MAIL, MAILBOXES, decode, encode};
use crate::{MailboxId, MailboxInfo, Store, StoreError};

/// The role a mailbox plays (RFC 6154 §2), advertised in LIST so clients file sent mail, drafts
/// and deleted mail where the user expects. The role follows the well-known name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SpecialUse {
    Sent,
    Drafts,
    Trash,
    Archive,
}

impl SpecialUse {
    pub const ALL: [SpecialUse; 4] = [SpecialUse::Sent, SpecialUse::Drafts, SpecialUse::Trash, SpecialUse::Archive];

    /// The mailbox name made for each user.
    pub fn name(self) -> &'static str {
        match self {
            SpecialUse::Sent => "Sent",
            SpecialUse::Drafts => "Drafts",
            SpecialUse::Trash => "Trash",
            SpecialUse::Archive => "Archive",
        }
    }

    /// The role of the mailbox called `name`, if any.
    pub fn of_name(name: &str) -> Option<SpecialUse> {
        SpecialUse::ALL.into_iter().find(|s| s.name() == name)
    }
}

/// Why a mailbox operation was refused.
#[derive(Debug, thiserror::Error)]
pub enum MailboxOpError {
    #[error("no mailbox named {0:?}")]
    NoSuchMailbox(String),
    #[error("a mailbox named {0:?} already exists")]
    AlreadyExists(String),
    #[error("INBOX cannot be deleted")]
    InboxIsPermanent,
    #[error(transparent)]
    Store(#[from] StoreError),
}

pub(crate) type Abort = ConflictableTransactionError<MailboxOpError>;

impl From<sled::transaction::TransactionError<MailboxOpError>> for MailboxOpError {
    fn from(e: sled::transaction::TransactionError<MailboxOpError>) -> Self {
        match e {
            sled::transaction::TransactionError::Abort(e) => e,
            sled::transaction::TransactionError::Storage(e) => MailboxOpError::Store(e.into()),
        }
    }
}

impl Store {
    /// A mailbox by id, if it still exists.
    pub fn mailbox_by_id(&self, id: MailboxId) -> Result<Option<MailboxInfo>, StoreError> {
        self.trees.mailboxes.get(id.to_be_bytes())?.map(|v| decode(MAILBOXES, &v)).transpose()
    }

    /// Makes INBOX and the special-use mailboxes (Sent, Drafts, Trash, Archive) for `owner` if
    /// they are missing. Cheap when they exist: the IMAP server calls it at every login.
    pub async fn ensure_default_mailboxes(&self, owner: &str) -> Result<(), StoreError> {
        let mut names = vec!["INBOX".to_string()];
        names.extend(SpecialUse::ALL.iter().map(|s| s.name().to_string()));
        self.ensure_mailboxes(owner, &names).await
    }

    /// Makes each of `owner`'s mailboxes `names` that is missing.
    pub async fn ensure_mailboxes(&self, owner: &str, names: &[String]) -> Result<(), StoreError> {
        for name in names {
            if self.mailbox(owner, name)?.is_none() {
                self.create_mailbox(owner, name).await?;
            }
        }
        Ok(())
    }

    /// RFC 3501 §6.3.3: creates a new mailbox; an existing name is an error. It starts
    /// unsubscribed (§6.3.6: subscribing is the client's to do, as Dovecot and others leave it).
    pub async fn create_new_mailbox(&self, owner: &str, name: &str) -> Result<MailboxInfo, MailboxOpError> {
        if self.mailbox(owner, name)?.is_some() {
            return Err(MailboxOpError::AlreadyExists(name.to_string()));
        }
        let info = self.create_mailbox_subscribed(owner, name, false).await?;
        Ok(info)
    }

    /// RFC 3501 §6.3.4: deletes a mailbox and its messages. INBOX cannot be deleted. Its UIDVALIDITY
    /// is never reused: a mailbox created later under the same name gets a new one.
    pub async fn delete_mailbox(&self, owner: &str, name: &str) -> Result<(), MailboxOpError> {
        if canonical_name(name) == "INBOX" {
            return Err(MailboxOpError::InboxIsPermanent);
        }
        let info = self.mailbox(owner, name)?.ok_or_else(|| MailboxOpError::NoSuchMailbox(name.to_string()))?;
        let mail_keys: Vec<sled::IVec> = self
            .trees
            .mail
            .scan_prefix(info.id.to_be_bytes())
            .keys()
            .collect::<Result<_, _>>()
            .map_err(StoreError::from)?;
        let expunged = || -> Result<Vec<sled::IVec>, MailboxOpError> {
            let keys = self.trees.expunged.scan_prefix(info.id.to_be_bytes()).keys();
            Ok(keys.collect::<Result<_, _>>().map_err(StoreError::from)?)
        };
        let expunged_keys = expunged()?;
        let key = name_key(owner, name);
        self.trees.transaction(|tx| {
            if tx.mailbox_names.get(&key)?.as_deref() != Some(&info.id.to_be_bytes()[..]) {
                return Err(Abort::Abort(MailboxOpError::NoSuchMailbox(name.to_string())));
            }
            tx.mailbox_names.remove(key.as_slice())?;
            tx.mailboxes.remove(&info.id.to_be_bytes())?;
            let holders = RefTrees { refs: tx.message_refs, collected: tx.collected, message_ids: tx.message_ids };
            for k in &mail_keys {
                if let Some(v) = tx.mail.remove(k)? {
                    let entry: MailEntry = decode(MAIL, &v).map_err(|e| Abort::Abort(e.into()))?;
                    holders.release(entry.message)?;
                }
            }
            // Its expunge records go with it: no client can resynchronise a mailbox that is gone.
            for k in &expunged_keys {
                tx.expunged.remove(k)?;
            }
            Ok(())
        })?;
        // An expunge that committed between the scan and the delete: every writer of the tree
        // reads the mailbox record, which is gone now, so nothing follows these.
        for k in expunged()? {
            let _writing = self.trees.writing();
            self.trees.expunged.remove(k).map_err(StoreError::from)?;
        }
        self.flush().await?;
        self.notify(info.id);
        Ok(())
    }

    /// RFC 3501 §6.3.5: renames a mailbox and every mailbox below it in the hierarchy (`/`).
    /// A mailbox keeps its id, UIDs and UIDVALIDITY. Renaming INBOX moves its messages to a new
    /// mailbox and leaves INBOX empty.
    pub async fn rename_mailbox(&self, owner: &str, from: &str, to: &str) -> Result<MailboxInfo, MailboxOpError> {
        let info = self.mailbox(owner, from)?.ok_or_else(|| MailboxOpError::NoSuchMailbox(from.to_string()))?;
        if self.mailbox(owner, to)?.is_some() {
            return Err(MailboxOpError::AlreadyExists(to.to_string()));
        }
        if info.name == "INBOX" {
            return self.rename_inbox(owner, info, to).await;
        }
        let prefix = format!("{}/", info.name);
        let mut moving: Vec<MailboxInfo> =
            self.mailboxes(owner)?.into_iter().filter(|m| m.name.starts_with(&prefix)).collect();
        moving.push(info.clone());
        let renamed = |m: &MailboxInfo| -> String {
            if m.id == info.id { to.to_string() } else { format!("{to}/{}", &m.name[prefix.len()..]) }
        };
        for m in &moving {
            if self.mailbox(owner, &renamed(m))?.is_some() {
                return Err(MailboxOpError::AlreadyExists(renamed(m)));
            }
        }
        let subscribed = self.subscriptions_below(owner, &info.name)?;
        let t = &self.trees;
        let writing = self.trees.writing();
        (&t.mailboxes, &t.mailbox_names, &t.subscriptions).transaction(|(mailboxes, names, subscriptions)| {
            // The subscriptions go with the names (as Dovecot does): a subscription is to a name,
            // and the client that renamed the mailbox still wants it listed.
            for old in &subscribed {
                let new_name =
                    if *old == info.name { to.to_string() } else { format!("{to}/{}", &old[prefix.len()..]) };
                subscriptions.remove(name_key(owner, old))?;
                subscriptions.insert(name_key(owner, &new_name), &[])?;
            }
            for m in &moving {
                let new_name = renamed(m);
                if names.get(name_key(owner, &new_name))?.is_some() {
                    return Err(Abort::Abort(MailboxOpError::AlreadyExists(new_name)));
                }
                names.remove(name_key(owner, &m.name))?;
                names.insert(name_key(owner, &new_name), &m.id.to_be_bytes())?;
                let record = mailboxes
                    .get(m.id.to_be_bytes())?
                    .ok_or_else(|| Abort::Abort(MailboxOpError::NoSuchMailbox(m.name.clone())))?;
                let mut current: MailboxInfo =
                    decode(MAILBOXES, &record).map_err(|e| Abort::Abort(MailboxOpError::Store(e)))?;
                current.name = new_name;
                mailboxes.insert(&m.id.to_be_bytes(), encode(&current))?;
            }
            Ok(())
        })?;
        drop(writing);
        self.flush().await?;
        // RFC 5465 §5.4: NOTIFY sessions learn the new names (each keeps its id).
        for m in &moving {
            self.notify(m.id);
        }
        self.mailbox(owner, to)?.ok_or_else(|| MailboxOpError::NoSuchMailbox(to.to_string()))
    }

    async fn rename_inbox(&self, owner: &str, inbox: MailboxInfo, to: &str) -> Result<MailboxInfo, MailboxOpError> {
        let created = self.create_new_mailbox(owner, to).await?;
        let uids: Vec<crate::Uid> = self.mail(inbox.id)?.iter().map(|m| m.uid).collect();
        self.move_mail(inbox.id, &uids, created.id, None).await?;
        self.mailbox(owner, to)?.ok_or_else(|| MailboxOpError::NoSuchMailbox(to.to_string()))
    }
}
