//! Change announcements: every write to a mailbox's contents (delivery, APPEND, COPY, MOVE, flag
//! changes, EXPUNGE) is published here after it is flushed, so an IMAP session in IDLE
//! (RFC 2177, RFC 9051 §6.3.13) can tell its client at once instead of polling the store.
//!
//! A broadcast channel: senders never block, and a session that falls behind gets `Lagged` and
//! simply resynchronises the whole mailbox, which is what it does for any change anyway.

use tokio::sync::broadcast;

use crate::{MailboxId, Receipt, Store};

/// A mailbox whose contents (messages or flags) changed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MailboxChange {
    pub mailbox: MailboxId,
    pub kind: ChangeKind,
}

/// What a change did, so a listener can look at no more of the mailbox than it must.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum ChangeKind {
    /// Messages were added (delivery, APPEND, COPY or MOVE into it), each under a UID above every
    /// UID the mailbox had; nothing else changed: [`Store::mail_after`] has all of it.
    Added,
    /// Flags changed or messages went (and maybe some came): only the whole mailbox tells.
    Changed,
}

/// How many announcements a slow listener may fall behind before it sees `Lagged`.
const CAPACITY: usize = 1024;

#[derive(Clone)]
pub(crate) struct Changes(broadcast::Sender<MailboxChange>);

impl Default for Changes {
    fn default() -> Self {
        Changes(broadcast::channel(CAPACITY).0)
    }
}

impl Store {
    /// Listens for changes to any mailbox, from now on.
    pub fn changes(&self) -> broadcast::Receiver<MailboxChange> {
        self.changes.0.subscribe()
    }

    /// Announces that `mailbox` changed. Call only after the change is flushed.
    pub(crate) fn notify(&self, mailbox: MailboxId) {
        // No listener is not an error: nobody is in IDLE.
        let _ = self.changes.0.send(MailboxChange { mailbox, kind: ChangeKind::Changed });
    }

    /// Announces that messages were only added to `mailbox` (see [`ChangeKind::Added`]).
    pub(crate) fn notify_added(&self, mailbox: MailboxId) {
        let _ = self.changes.0.send(MailboxChange { mailbox, kind: ChangeKind::Added });
    }

    /// Announces the INBOX of every local user a delivery reached.
    pub(crate) fn announce(&self, receipt: &Receipt) {
        for (user, _) in &receipt.mail {
            if let Ok(Some(inbox)) = self.mailbox(user, "INBOX") {
                self.notify_added(inbox.id);
            }
        }
    }
}
