//! Identifiers, each its own type so that a UID is never mistaken for a sequence number or a
//! job id. All are stored big-endian, so sled's byte order is their numeric order.

use std::fmt;

use serde::{Deserialize, Serialize};

macro_rules! id_u64 {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize)]
        #[serde(transparent)]
        pub struct $name(pub u64);

        impl $name {
            pub fn to_be_bytes(self) -> [u8; 8] {
                self.0.to_be_bytes()
            }

            #[allow(dead_code)]
            pub(crate) fn from_be_slice(bytes: &[u8]) -> Option<Self> {
                Some($name(u64::from_be_bytes(bytes.get(..8)?.try_into().ok()?)))
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                write!(f, "{}", self.0)
            }
        }
    };
}
pub(crate) use id_u64;

id_u64!(
    /// A stored message's key. Messages are immutable; mailboxes and jobs refer to them by key.
    MessageKey
);
id_u64!(
    /// A job in the queue: one message for one model address.
    JobId
);
id_u64!(
    /// A mailbox, independent of its name (so RENAME does not move its messages).
    MailboxId
);

/// An IMAP unique identifier (RFC 3501 §2.3.1.1): strictly ascending within a mailbox, never
/// reused while its UIDVALIDITY stands.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Uid(pub u32);

impl fmt::Display for Uid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// Key of one message in one mailbox: mailbox id then UID, so a mailbox's messages are one
/// contiguous range in UID order.
pub(crate) fn mail_key(mailbox: MailboxId, uid: Uid) -> [u8; 12] {
    let mut key = [0u8; 12];
    key[..8].copy_from_slice(&mailbox.to_be_bytes());
    key[8..].copy_from_slice(&uid.0.to_be_bytes());
    key
}

pub(crate) fn uid_of_mail_key(key: &[u8]) -> Option<Uid> {
    Some(Uid(u32::from_be_bytes(key.get(8..12)?.try_into().ok()?)))
}
