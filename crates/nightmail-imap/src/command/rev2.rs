//! IMAP4rev2 (RFC 9051) in a session that enabled it (§6.3.1: `ENABLE IMAP4rev2`; a session that
//! did not stays IMAP4rev1, RFC 3501). What changes for the client, per Appendix E:
//! - mailbox names are UTF-8 both ways (§5.1; modified UTF-7 is IMAP4rev1's), as after
//!   UTF8=ACCEPT (`mailbox_name`, `wire_name`);
//! - no `\Recent` and no RECENT response (E.6: removed): the session claims no new mail
//!   (`Selected::rev2`), so no other session's `\Recent` is taken either;
//! - SELECT and EXAMINE send a LIST line of the mailbox and no UNSEEN code (§6.3.2);
//! - SEARCH is answered with ESEARCH (§6.4.4, §7.3.4), as RETURN (ALL).
//!
//! The rest of Appendix E is spoken to both: ESEARCH, SEARCHRES (`searchres.rs`), NAMESPACE,
//! UNSELECT, UIDPLUS, MOVE, LITERAL- (as LITERAL+), BINARY, LIST-EXTENDED and LIST-STATUS,
//! SPECIAL-USE, STATUS DELETED and SIZE, IDLE, SASL-IR, ENABLE, `[CLOSED]` on every SELECT over a
//! selected mailbox (`select.rs`), and subscriptions that outlive their mailbox (`\NonExistent`,
//! store schema 11). LSUB, CHECK and the STATUS RECENT item, which RFC 9051 drops, are still
//! answered. Not done: OLDNAME (§6.3.9.7).

use imap_next::imap_types::command::CommandBody;
use imap_next::imap_types::core::{Atom, Tag};
use imap_next::imap_types::extensions::enable::CapabilityEnable;
use imap_next::imap_types::mailbox::{ListMailbox, Mailbox};

use super::list_extended::ListRequest;
use super::{Done, esearch};
use crate::ImapError;
use crate::session::Session;

/// ENABLE IMAP4rev2: what ENABLED names.
pub(crate) fn enable(s: &mut Session) -> CapabilityEnable<'static> {
    s.rev2 = true;
    s.utf8 = true;
    CapabilityEnable::from(Atom::unvalidated("IMAP4rev2"))
}

/// RFC 9051 §6.3.2: "The server MUST return a LIST response with the mailbox name" on SELECT.
pub(crate) fn list_selected(s: &mut Session, name: &str) -> Result<(), ImapError> {
    let Ok(pattern) = ListMailbox::try_from(name.to_string()) else { return Ok(()) };
    let reference = Mailbox::try_from(String::new()).unwrap_or(Mailbox::Inbox);
    super::list::list(s, &ListRequest::plain(reference, pattern)).map(|_| ())
}

/// SEARCH in a rev2 session: the ESEARCH line goes out after what was queued before it.
pub(crate) fn search(s: &mut Session, tag: &Tag<'static>, body: CommandBody<'static>) -> Result<Done, ImapError> {
    let uid = matches!(body, CommandBody::Search { uid: true, .. });
    let line = esearch::as_esearch(s, tag, body)?;
    s.write_raw(&line);
    Ok(Done::ok(if uid { "UID SEARCH completed" } else { "SEARCH completed" }))
}
