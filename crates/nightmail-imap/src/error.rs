//! Why a command failed, as a typed value that maps straight to the tagged reply
//! (RFC 3501 §7.1: NO is "the command failed", BAD is "the command was not understood or not
//! allowed here").

use std::borrow::Cow;

use imap_next::imap_types::response::{Code, CodeOther, StatusKind};
use nightmail_store::{MailboxOpError, StoreError};
use nightmail_types::utf7::InvalidUtf7;

#[derive(Debug, thiserror::Error)]
pub enum ImapError {
    /// Wrong state, wrong arguments, invalid sequence numbers: tagged BAD.
    #[error("{0}")]
    Bad(Cow<'static, str>),
    /// A well-formed command that failed: tagged NO, with an optional response code.
    #[error("{text}")]
    No { code: Option<Code<'static>>, text: Cow<'static, str> },
    /// The store failed: tagged NO [SERVERBUG] (RFC 5530), logged.
    #[error("internal error, try again later")]
    Store(String),
}

impl ImapError {
    pub fn bad(text: impl Into<Cow<'static, str>>) -> ImapError {
        ImapError::Bad(text.into())
    }

    pub fn no(text: impl Into<Cow<'static, str>>) -> ImapError {
        ImapError::No { code: None, text: text.into() }
    }

    pub fn no_with(code: Code<'static>, text: impl Into<Cow<'static, str>>) -> ImapError {
        ImapError::No { code: Some(code), text: text.into() }
    }

    /// RFC 3501 §6.3.11 and §6.4.7: a missing destination mailbox gets `[TRYCREATE]`.
    pub fn try_create() -> ImapError {
        ImapError::no_with(Code::TryCreate, "mailbox does not exist")
    }

    /// RFC 5530 §3 NONEXISTENT.
    pub fn nonexistent() -> ImapError {
        ImapError::no_with(other_code("NONEXISTENT"), "mailbox does not exist")
    }

    /// The status kind, code and text of the tagged reply.
    pub fn reply(self) -> (StatusKind, Option<Code<'static>>, String) {
        match self {
            ImapError::Bad(text) => (StatusKind::Bad, None, text.into_owned()),
            ImapError::No { code, text } => (StatusKind::No, code, text.into_owned()),
            ImapError::Store(message) => {
                tracing::error!("imap: store error: {message}");
                (StatusKind::No, Some(other_code("SERVERBUG")), "internal error, try again later".into())
            }
        }
    }
}

/// A response code imap-types has no variant for (RFC 5530 codes).
pub fn other_code(atom: &'static str) -> Code<'static> {
    // Only called with the constant atoms of RFC 5530, which are valid codes.
    Code::Other(CodeOther::unvalidated(atom.as_bytes()))
}

impl From<StoreError> for ImapError {
    fn from(e: StoreError) -> Self {
        ImapError::Store(e.to_string())
    }
}

/// RFC 3501 §5.1.3: a mailbox name that is not modified UTF-7 names no mailbox that can exist.
/// The command was understood (any astring is a mailbox name in the grammar), so NO [CANNOT]
/// (RFC 5530 §3), as Dovecot answers, not BAD. Response text must be ASCII.
impl From<InvalidUtf7> for ImapError {
    fn from(_: InvalidUtf7) -> Self {
        ImapError::no_with(other_code("CANNOT"), "mailbox name is not valid modified UTF-7 (RFC 3501 section 5.1.3)")
    }
}

impl From<MailboxOpError> for ImapError {
    fn from(e: MailboxOpError) -> Self {
        match e {
            MailboxOpError::NoSuchMailbox(_) => ImapError::nonexistent(),
            MailboxOpError::AlreadyExists(_) => {
                ImapError::no_with(other_code("ALREADYEXISTS"), "mailbox already exists")
            }
            MailboxOpError::InboxIsPermanent => ImapError::no("INBOX cannot be deleted"),
            MailboxOpError::Store(e) => e.into(),
        }
    }
}
