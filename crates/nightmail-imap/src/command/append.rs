//! APPEND (RFC 3501 §6.3.11) with flags and internal date, answered with APPENDUID (RFC 4315
//! §3). The literal's size was checked against the limit before it was read (see `session`).

use std::num::NonZeroU32;

use imap_next::imap_types::datetime::DateTime;
use imap_next::imap_types::extensions::binary::LiteralOrLiteral8;
use imap_next::imap_types::flag::Flag;
use imap_next::imap_types::mailbox::Mailbox;
use imap_next::imap_types::response::Code;
use nightmail_types::Timestamp;

use super::copy::destination;
use super::{Done, flag_names};
use crate::ImapError;
use crate::session::Session;

pub(crate) async fn run(
    s: &mut Session,
    mailbox: Mailbox<'static>,
    flags: Vec<Flag<'static>>,
    date: Option<DateTime>,
    message: LiteralOrLiteral8<'static>,
) -> Result<Done, ImapError> {
    let to = destination(s, &mailbox)?;
    let bytes = match &message {
        LiteralOrLiteral8::Literal(l) => l.data(),
        LiteralOrLiteral8::Literal8(l) => l.data.as_ref(),
    };
    if bytes.is_empty() {
        return Err(ImapError::no("an empty message cannot be appended"));
    }
    let when = match date {
        Some(d) => Timestamp(d.as_ref().timestamp_millis().max(0) as u64),
        None => Timestamp::now(),
    };
    let appended = s.shared.store.append_mail(to.id, bytes, flag_names(&flags), when).await?;
    Ok(match (NonZeroU32::new(appended.uid_validity), NonZeroU32::new(appended.uid.0)) {
        (Some(uid_validity), Some(uid)) => Done::with_code(Code::AppendUid { uid_validity, uid }, "APPEND completed"),
        _ => Done::ok("APPEND completed"),
    })
}
