//! APPEND (RFC 3501 §6.3.11) with flags and internal date, answered with APPENDUID (RFC 4315
//! §3). The literal's size was checked against the limit before it was read (see `session`).
//! Filed as the user (see `copy`); into an Ask folder, only a message with a header is accepted,
//! since anything else has nothing a model could be asked about: NO [CANNOT] (RFC 5530) says so.
//! A literal8 (RFC 3516) is taken; see `binary` for what is stored.

use std::num::NonZeroU32;

use imap_next::imap_types::datetime::DateTime;
use imap_next::imap_types::extensions::binary::LiteralOrLiteral8;
use imap_next::imap_types::flag::Flag;
use imap_next::imap_types::mailbox::Mailbox;
use imap_next::imap_types::response::Code;
use nightmail_store::{Filing, Summary};
use nightmail_types::Timestamp;

use super::copy::{destination, done_text, filer};
use super::{Done, binary, flag_names};
use crate::ImapError;
use crate::error::other_code;
use crate::session::Session;

pub(crate) async fn run(
    s: &mut Session,
    mailbox: Mailbox<'static>,
    flags: Vec<Flag<'static>>,
    date: Option<DateTime>,
    message: LiteralOrLiteral8<'static>,
) -> Result<Done, ImapError> {
    let to = destination(s, &mailbox)?;
    // RFC 3516 §4.4: a literal8 may carry Content-Transfer-Encoding binary, kept as base64.
    let bytes = match &message {
        LiteralOrLiteral8::Literal(l) => std::borrow::Cow::Borrowed(l.data()),
        LiteralOrLiteral8::Literal8(l) => binary::for_storage(l.data.as_ref()),
    };
    let bytes = bytes.as_ref();
    if bytes.is_empty() {
        return Err(ImapError::no("an empty message cannot be appended"));
    }
    let when = match date {
        Some(d) => Timestamp(d.as_ref().timestamp_millis().max(0) as u64),
        None => Timestamp::now(),
    };
    let (by, ask) = filer(s, &to)?;
    if ask.is_some() && Summary::read(bytes).is_none() {
        return Err(ImapError::no_with(
            other_code("CANNOT"),
            "not a mail message (no header fields): nothing to ask the model about",
        ));
    }
    let filing = Filing { by: &by, ask: ask.as_ref() };
    let appended = s.shared.store.append_mail(to.id, bytes, flag_names(&flags), when, Some(&filing)).await?;
    let text = done_text("APPEND completed", ask.as_ref(), appended.job.as_slice());
    Ok(match (NonZeroU32::new(appended.uid_validity), NonZeroU32::new(appended.uid.0)) {
        (Some(uid_validity), Some(uid)) => Done::with_code(Code::AppendUid { uid_validity, uid }, text),
        _ => Done::ok(text),
    })
}
