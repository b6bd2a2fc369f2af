//! What a user's index holds of each mailbox, saved as the payload of the index's own commit:
//! the documents and this record are written by one atomic step, so a crash between them cannot
//! leave messages indexed twice or skipped.

use std::collections::BTreeMap;

use nightmail_store::{MailboxInfo, ModSeq};
use serde::{Deserialize, Serialize};

use crate::schema::SCHEMA_VERSION;

/// One mailbox as it was when last indexed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct IndexedMailbox {
    pub name: String,
    pub uid_validity: u32,
    /// The highest UID indexed: the next catch-up reads only the UIDs above it.
    pub last_uid: u32,
    /// The mailbox's HIGHESTMODSEQ when indexed (RFC 7162 §3.1.2.1): unchanged means nothing
    /// was added or expunged since, so the mailbox is skipped without a read.
    pub highest_modseq: ModSeq,
}

impl IndexedMailbox {
    /// A mailbox about to be indexed from its first UID.
    pub(crate) fn first(info: &MailboxInfo) -> IndexedMailbox {
        IndexedMailbox {
            name: info.name.clone(),
            uid_validity: info.uid_validity,
            last_uid: 0,
            highest_modseq: info.highest_modseq,
        }
    }

    /// Whether `info` is still the mailbox these documents came from. A new UIDVALIDITY is a new
    /// mailbox under an old name (RFC 3501 §2.3.1.1); a rename keeps UIDs but changes the name
    /// every document carries.
    pub(crate) fn same_mailbox(&self, info: &MailboxInfo) -> bool {
        self.uid_validity == info.uid_validity && self.name == info.name
    }
}

/// Every mailbox in one user's index, by the store's mailbox id.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct IndexedMailboxes {
    pub schema: u32,
    pub mailboxes: BTreeMap<u64, IndexedMailbox>,
}

impl IndexedMailboxes {
    pub(crate) fn empty() -> IndexedMailboxes {
        IndexedMailboxes { schema: SCHEMA_VERSION, mailboxes: BTreeMap::new() }
    }

    /// The record in a commit's payload. `None` when it is missing or from another schema: the
    /// caller then starts the index afresh.
    pub(crate) fn from_payload(payload: Option<&str>) -> Option<IndexedMailboxes> {
        let state: IndexedMailboxes = serde_json::from_str(payload?).ok()?;
        (state.schema == SCHEMA_VERSION).then_some(state)
    }

    pub(crate) fn to_payload(&self) -> String {
        serde_json::to_string(self).expect("the record is plain data")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_payload_round_trips_and_another_schema_is_refused() {
        let mut state = IndexedMailboxes::empty();
        let mailbox = IndexedMailbox { name: "INBOX".into(), uid_validity: 7, last_uid: 3, highest_modseq: ModSeq(9) };
        state.mailboxes.insert(42, mailbox);
        let payload = state.to_payload();
        assert_eq!(IndexedMailboxes::from_payload(Some(&payload)), Some(state.clone()));
        state.schema = SCHEMA_VERSION + 1;
        assert_eq!(IndexedMailboxes::from_payload(Some(&state.to_payload())), None);
        assert_eq!(IndexedMailboxes::from_payload(Some("not json")), None);
        assert_eq!(IndexedMailboxes::from_payload(None), None);
    }
}
