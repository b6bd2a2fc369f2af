//! APPEND (RFC 3501 §6.3.11) with flags and internal date, answered with APPENDUID (RFC 4315
//! §3). The literal's size was checked against the limit before it was read (see `session`).
//! Filed as the user (see `copy`); into an Ask folder, only a message with a header is accepted,
//! since anything else has nothing a model could be asked about: NO [CANNOT] (RFC 5530) says so.
//! A literal8 (RFC 3516) is taken; see `binary` for what is stored. MULTIAPPEND (RFC 3502) is
//! read by `multiappend` and stored here, all or none.

use std::borrow::Cow;
use std::num::NonZeroU32;

use imap_next::imap_types::core::Vec1;
use imap_next::imap_types::datetime::DateTime;
use imap_next::imap_types::extensions::binary::LiteralOrLiteral8;
use imap_next::imap_types::extensions::uidplus::UidElement;
use imap_next::imap_types::flag::Flag;
use imap_next::imap_types::mailbox::Mailbox;
use imap_next::imap_types::response::{Code, CodeOther};
use nightmail_store::{AppendedAll, Filing, NewMail, Summary};
use nightmail_types::Timestamp;

use super::copy::{destination, done_text, filer, uid_set};
use super::{Done, binary, flag_names};
use crate::ImapError;
use crate::error::other_code;
use crate::session::Session;

/// One message of an APPEND: RFC 3502 §6 `append-message`.
pub(crate) struct AppendMessage {
    pub flags: Vec<Flag<'static>>,
    pub date: Option<DateTime>,
    pub message: LiteralOrLiteral8<'static>,
}

pub(crate) async fn run(
    s: &mut Session,
    mailbox: Mailbox<'static>,
    flags: Vec<Flag<'static>>,
    date: Option<DateTime>,
    message: LiteralOrLiteral8<'static>,
) -> Result<Done, ImapError> {
    run_all(s, mailbox, Vec1::from(AppendMessage { flags, date, message })).await
}

/// APPEND of one message, or MULTIAPPEND (RFC 3502 §6.3.11) of several: each is checked before
/// any is stored, and the store takes them in one transaction, so a refusal stores none.
pub(crate) async fn run_all(
    s: &mut Session,
    mailbox: Mailbox<'static>,
    messages: Vec1<AppendMessage>,
) -> Result<Done, ImapError> {
    let to = destination(s, &mailbox)?;
    let (by, ask) = filer(s, &to)?;
    // RFC 3516 §4.4: a literal8 may carry Content-Transfer-Encoding binary, kept as base64.
    let bytes: Vec<Cow<'_, [u8]>> = messages
        .as_ref()
        .iter()
        .map(|m| match &m.message {
            LiteralOrLiteral8::Literal(l) => Cow::Borrowed(l.data()),
            LiteralOrLiteral8::Literal8(l) => binary::for_storage(l.data.as_ref()),
        })
        .collect();
    for raw in &bytes {
        if raw.is_empty() {
            return Err(ImapError::no("an empty message cannot be appended"));
        }
        if ask.is_some() && Summary::read(raw).is_none() {
            return Err(ImapError::no_with(
                other_code("CANNOT"),
                "not a mail message (no header fields): nothing to ask the model about",
            ));
        }
    }
    let mails = messages
        .as_ref()
        .iter()
        .zip(&bytes)
        .map(|(m, raw)| NewMail {
            raw,
            flags: flag_names(&m.flags),
            internal_date: match &m.date {
                Some(d) => Timestamp(d.as_ref().timestamp_millis().max(0) as u64),
                None => Timestamp::now(),
            },
        })
        .collect();
    let filing = Filing { by: &by, ask: ask.as_ref() };
    let appended = s.shared.store.append_all(to.id, mails, Some(&filing)).await?;
    let text = done_text("APPEND completed", ask.as_ref(), &appended.jobs);
    Ok(match append_uid(&appended) {
        Some(code) => Done::with_code(code, text),
        None => Done::ok(text),
    })
}

/// RFC 4315 §3 APPENDUID: one UID, or for a MULTIAPPEND the set of them (`append-uid =
/// uniqueid / uid-set`, imap-types carries only the first form).
fn append_uid(appended: &AppendedAll) -> Option<Code<'static>> {
    let uid_validity = NonZeroU32::new(appended.uid_validity)?;
    match appended.uids.as_slice() {
        [one] => Some(Code::AppendUid { uid_validity, uid: NonZeroU32::new(one.0)? }),
        uids => {
            let set = uid_set(uids.iter().copied())?;
            let set: Vec<String> = set
                .0
                .as_ref()
                .iter()
                .map(|e| match e {
                    UidElement::Single(n) => n.to_string(),
                    UidElement::Range(a, b) => format!("{a}:{b}"),
                })
                .collect();
            let code = format!("APPENDUID {uid_validity} {}", set.join(","));
            Some(Code::Other(CodeOther::unvalidated(code.into_bytes())))
        }
    }
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
