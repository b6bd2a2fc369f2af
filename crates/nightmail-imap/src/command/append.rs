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

/// The APPEND with UTF8 data in `bytes` (see [`utf8_data`]), parsed by imap-codec.
pub(crate) fn utf8_append(bytes: &[u8]) -> Option<imap_next::imap_types::command::Command<'static>> {
    use imap_codec::decode::Decoder;
    use imap_next::imap_types::IntoStatic;
    let plain = utf8_data(bytes)?;
    let (_, command) = imap_codec::CommandCodec::default().decode(&plain).ok()?;
    Some(command.into_static())
}

/// RFC 6855 §4: `APPEND mailbox [flags] [date] UTF8 (literal8)`, which imap-codec does not
/// parse: the command without the `UTF8 (` and `)` around the literal8, for imap-codec to parse as
/// an APPEND of a literal8; `None` when `bytes` is not such a command.
pub(crate) fn utf8_data(bytes: &[u8]) -> Option<Vec<u8>> {
    let line_end = bytes.windows(2).position(|w| w == b"\r\n")?;
    let line = bytes[..line_end].to_ascii_uppercase();
    let words: Vec<&[u8]> = line.split(|&b| b == b' ').collect();
    if words.get(1) != Some(&&b"APPEND"[..]) {
        return None;
    }
    let start = line.windows(9).rposition(|w| w == b" UTF8 (~{")?;
    let body = bytes.strip_suffix(b")\r\n")?;
    let mut plain = Vec::with_capacity(bytes.len());
    plain.extend_from_slice(&bytes[..start]);
    plain.extend_from_slice(b" ");
    plain.extend_from_slice(&body[start + 7..]);
    plain.extend_from_slice(b"\r\n");
    Some(plain)
}

#[cfg(test)]
mod tests {
    #[test]
    fn utf8_append_data_is_unwrapped() {
        let cmd = b"a1 APPEND INBOX (\\Seen) UTF8 (~{4}\r\nabcd)\r\n";
        assert_eq!(super::utf8_data(cmd).unwrap(), b"a1 APPEND INBOX (\\Seen) ~{4}\r\nabcd\r\n");
        assert!(super::utf8_data(b"a1 APPEND INBOX {4}\r\nabcd\r\n").is_none());
    }
}
