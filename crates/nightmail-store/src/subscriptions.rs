//! The user's subscriptions (RFC 9051 §6.3.7–6.3.8, RFC 3501 §6.3.6–6.3.7): names, kept apart from
//! the mailboxes (schema 11), since a subscription outlives the mailbox it named (§6.3.7: the
//! server "MUST NOT unilaterally remove an existing mailbox name from the subscription list even if
//! a mailbox by that name no longer exists"). LIST (SUBSCRIBED) shows such a name as
//! `\Subscribed \NonExistent` (RFC 5258 §3.1).

use crate::mailbox::name_key;
use crate::mailbox_ops::{Abort, MailboxOpError};
use crate::schema::SUBSCRIPTIONS;
use crate::{Store, StoreError};

fn name_of(owner: &str, key: &[u8]) -> Result<String, StoreError> {
    let name = key.get(owner.len() + 1..).unwrap_or_default();
    String::from_utf8(name.to_vec())
        .map_err(|_| StoreError::Corrupt { tree: SUBSCRIPTIONS, message: "a subscribed name is not UTF-8".into() })
}

impl Store {
    /// `owner`'s subscribed names, in byte order; some may name no mailbox.
    pub fn subscriptions(&self, owner: &str) -> Result<Vec<String>, StoreError> {
        let prefix = name_key(owner, "");
        self.trees.subscriptions.scan_prefix(&prefix).keys().map(|k| name_of(owner, &k?)).collect()
    }

    /// The subscribed names `name` and those below it in the hierarchy (what RENAME moves).
    pub(crate) fn subscriptions_below(&self, owner: &str, name: &str) -> Result<Vec<String>, StoreError> {
        let below = format!("{name}/");
        let names = self.subscriptions(owner)?;
        Ok(names.into_iter().filter(|n| n == name || n.starts_with(&below)).collect())
    }

    /// SUBSCRIBE (RFC 9051 §6.3.7, which lets the server check that the mailbox exists: it does,
    /// so a typo is told at once) and UNSUBSCRIBE (§6.3.8: a subscribed name goes whether or not
    /// its mailbox still exists; a name neither subscribed nor existing is refused).
    pub async fn set_subscribed(&self, owner: &str, name: &str, subscribed: bool) -> Result<(), MailboxOpError> {
        let exists = self.mailbox(owner, name)?;
        let key = match &exists {
            Some(info) => name_key(owner, &info.name),
            None => name_key(owner, name),
        };
        let writing = self.trees.writing();
        let changed = self.trees.subscriptions.transaction(|subscriptions| {
            let was = match subscribed {
                true => subscriptions.insert(key.as_slice(), &[])?,
                false => subscriptions.remove(key.as_slice())?,
            };
            if exists.is_none() && (subscribed || was.is_none()) {
                return Err(Abort::Abort(MailboxOpError::NoSuchMailbox(name.to_string())));
            }
            Ok(was.is_some() != subscribed)
        })?;
        drop(writing);
        if changed {
            self.flush().await?;
            // RFC 5465 §5.5: NOTIFY's SubscriptionChange, told of a mailbox that exists.
            if let Some(info) = exists {
                self.notify(info.id);
            }
        }
        Ok(())
    }

    /// Whether `owner` is subscribed to `name` (NOTIFY's `subscribed` filter, RFC 5465 §6).
    pub fn is_subscribed(&self, owner: &str, name: &str) -> Result<bool, StoreError> {
        Ok(self.trees.subscriptions.contains_key(name_key(owner, name))?)
    }
}
