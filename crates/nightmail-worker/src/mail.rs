//! A stored message, parsed once with mail-parser into what the worker needs. mail-parser can
//! panic on crafted input: parsing runs under `catch_unwind`, and a message that cannot be read
//! becomes a clear failure, never a crash.

use mail_parser::{MessageParser, MimeHeaders};
use nightmail_types::Address;

use crate::voice::VoiceNote;

/// One address as written in a header: the checked address and its display form.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Person {
    pub address: Address,
    pub name: Option<String>,
}

impl Person {
    pub fn display(&self) -> String {
        match &self.name {
            Some(name) => format!("{name} <{}>", self.address),
            None => self.address.to_string(),
        }
    }
}

/// A message forwarded as a `message/rfc822` part.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Forwarded {
    pub from: String,
    pub subject: String,
    pub date: String,
    pub body: String,
}

#[derive(Clone, Debug, Default)]
pub struct Mail {
    /// With angle brackets, as stored in the thread index.
    pub message_id: Option<String>,
    pub subject: String,
    pub from: Vec<Person>,
    pub reply_to: Vec<Person>,
    pub to: Vec<Person>,
    pub cc: Vec<Person>,
    /// Message-IDs (with angle brackets), oldest first as the headers give them.
    pub in_reply_to: Vec<String>,
    pub references: Vec<String>,
    pub date: String,
    /// The text of the message: text/plain parts, or HTML converted to text.
    pub body: String,
    pub forwarded: Vec<Forwarded>,
    /// Text attachments (`.txt`, `.md`, `.vtt`, `.srt`, `.json`, text/*): name and content.
    pub text_attachments: Vec<(String, String)>,
    /// Other attachments: name, content type, size in bytes.
    pub other_attachments: Vec<(String, String, usize)>,
    /// Audio attachments (`nightmail_transcribe::is_audio`): name, content type, the audio.
    /// `voice::hear` turns them into `voice_notes` and empties this.
    pub audio_attachments: Vec<(String, String, Vec<u8>)>,
    /// What became of each audio attachment, once heard.
    pub voice_notes: Vec<VoiceNote>,
    pub auto_submitted: Option<String>,
    pub precedence: Option<String>,
    pub list_unsubscribe: bool,
    pub list_id: bool,
    pub auto_response_suppress: Option<String>,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum MailError {
    #[error("the message could not be parsed as RFC 5322 mail")]
    Unparsable,
    #[error("the mail parser failed on this message (its MIME structure is broken)")]
    ParserPanicked,
}

/// Attachments whose text is given to the model.
const TEXT_EXTENSIONS: &[&str] = &["txt", "md", "markdown", "vtt", "srt", "json", "csv", "log"];
/// Text attachments are cut to this many bytes each.
const MAX_ATTACHMENT_TEXT: usize = 256 * 1024;

pub fn parse(raw: &[u8]) -> Result<Mail, MailError> {
    guarded(|| parse_inner(raw))
}

/// Runs a parse under `catch_unwind`: a panic is [`MailError::ParserPanicked`], nothing is
/// [`MailError::Unparsable`].
fn guarded<T>(parse: impl FnOnce() -> Option<T> + std::panic::UnwindSafe) -> Result<T, MailError> {
    std::panic::catch_unwind(parse).map_err(|_| MailError::ParserPanicked)?.ok_or(MailError::Unparsable)
}

fn parse_inner(raw: &[u8]) -> Option<Mail> {
    let message = MessageParser::default().parse(raw)?;
    let mut mail = Mail {
        message_id: message.message_id().filter(|s| !s.trim().is_empty()).map(|s| format!("<{}>", s.trim())),
        subject: message.subject().unwrap_or_default().to_string(),
        from: people(message.from()),
        reply_to: people(message.reply_to()),
        to: people(message.to()),
        cc: people(message.cc()),
        in_reply_to: ids(message.in_reply_to()),
        references: ids(message.references()),
        date: message.date().map(|d| d.to_rfc822()).unwrap_or_default(),
        body: body_text(&message),
        auto_submitted: message.header_raw("Auto-Submitted").map(|s| s.trim().to_string()),
        precedence: message.header_raw("Precedence").map(|s| s.trim().to_string()),
        list_unsubscribe: message.header_raw("List-Unsubscribe").is_some(),
        list_id: message.header_raw("List-Id").is_some(),
        auto_response_suppress: message.header_raw("X-Auto-Response-Suppress").map(|s| s.trim().to_string()),
        ..Mail::default()
    };
    for part in message.attachments() {
        if let Some(inner) = part.message() {
            mail.forwarded.push(Forwarded {
                from: people(inner.from()).iter().map(Person::display).collect::<Vec<_>>().join(", "),
                subject: inner.subject().unwrap_or_default().to_string(),
                date: inner.date().map(|d| d.to_rfc822()).unwrap_or_default(),
                body: body_text(inner),
            });
            continue;
        }
        let name = part.attachment_name().unwrap_or("unnamed").to_string();
        let ctype = part
            .content_type()
            .map(|ct| format!("{}/{}", ct.ctype(), ct.subtype().unwrap_or("octet-stream")))
            .unwrap_or_else(|| "application/octet-stream".into());
        let extension = name.rsplit_once('.').map(|(_, e)| e.to_ascii_lowercase()).unwrap_or_default();
        let texty = TEXT_EXTENSIONS.contains(&extension.as_str())
            || ctype.starts_with("text/") && ctype != "text/html"
            || ctype == "application/json";
        if !texty && nightmail_transcribe::is_audio(&ctype, Some(&name)) {
            mail.audio_attachments.push((name, ctype, part.contents().to_vec()));
            continue;
        }
        match part.text_contents().filter(|_| texty) {
            Some(text) => {
                let mut text = text.to_string();
                if text.len() > MAX_ATTACHMENT_TEXT {
                    let mut cut = MAX_ATTACHMENT_TEXT;
                    while !text.is_char_boundary(cut) {
                        cut -= 1;
                    }
                    text.truncate(cut);
                    text.push_str("\n[... cut: the attachment is longer]");
                }
                mail.text_attachments.push((name, text));
            }
            None => mail.other_attachments.push((name, ctype, part.len())),
        }
    }
    Some(mail)
}

/// All text bodies (text/plain, or HTML converted to text by mail-parser), joined.
fn body_text(message: &mail_parser::Message<'_>) -> String {
    (0..message.text_body_count())
        .filter_map(|i| message.body_text(i))
        .map(|t| t.replace("\r\n", "\n"))
        .collect::<Vec<_>>()
        .join("\n\n")
}

fn people(address: Option<&mail_parser::Address<'_>>) -> Vec<Person> {
    let Some(address) = address else { return Vec::new() };
    address
        .iter()
        .filter_map(|a| {
            let parsed = Address::parse(a.address()?).ok()?;
            Some(Person { address: parsed, name: a.name().map(str::to_string).filter(|n| !n.trim().is_empty()) })
        })
        .collect()
}

fn ids(value: &mail_parser::HeaderValue<'_>) -> Vec<String> {
    let list: Vec<&str> = match value {
        mail_parser::HeaderValue::Text(t) => vec![t.as_ref()],
        mail_parser::HeaderValue::TextList(l) => l.iter().map(|s| s.as_ref()).collect(),
        _ => Vec::new(),
    };
    list.into_iter().map(str::trim).filter(|s| !s.is_empty()).map(|s| format!("<{s}>")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_and_text_are_read() {
        let raw = b"From: Ann <ann@x.org>\r\nTo: kimi@n.local, Bob <bob@x.org>\r\nCc: carol@x.org\r\nSubject: Plans\r\nMessage-ID: <m2@x.org>\r\nIn-Reply-To: <m1@x.org>\r\nReferences: <m0@x.org> <m1@x.org>\r\nAuto-Submitted: no\r\n\r\nHello\r\n";
        let m = parse(raw).unwrap();
        assert_eq!(m.message_id.as_deref(), Some("<m2@x.org>"));
        assert_eq!(m.from[0].display(), "Ann <ann@x.org>");
        assert_eq!(m.to.len(), 2);
        assert_eq!(m.cc[0].address.as_str(), "carol@x.org");
        assert_eq!(m.in_reply_to, vec!["<m1@x.org>"]);
        assert_eq!(m.references, vec!["<m0@x.org>", "<m1@x.org>"]);
        assert_eq!(m.body.trim(), "Hello");
        assert_eq!(m.auto_submitted.as_deref(), Some("no"));
    }

    #[test]
    fn html_only_mail_becomes_text() {
        let raw = b"From: a@x.org\r\nContent-Type: text/html; charset=utf-8\r\n\r\n<html><body><p>What is <b>MoE</b>?</p></body></html>\r\n";
        let m = parse(raw).unwrap();
        assert!(m.body.contains("What is MoE?"), "{:?}", m.body);
    }

    #[test]
    fn non_utf8_charsets_are_decoded() {
        let raw = b"From: a@x.org\r\nSubject: =?ISO-8859-1?Q?Caf=E9?=\r\nContent-Type: text/plain; charset=iso-8859-1\r\nContent-Transfer-Encoding: 8bit\r\n\r\nUn caf\xe9, s'il vous pla\xeet\r\n";
        let m = parse(raw).unwrap();
        assert_eq!(m.subject, "Café");
        assert!(m.body.contains("Un café, s'il vous plaît"), "{:?}", m.body);
    }

    #[test]
    fn forwarded_messages_and_attachments() {
        let raw = concat!(
            "From: a@x.org\r\nSubject: Fwd: notes\r\nMIME-Version: 1.0\r\n",
            "Content-Type: multipart/mixed; boundary=\"b\"\r\n\r\n",
            "--b\r\nContent-Type: text/plain\r\n\r\nSummarise please.\r\n",
            "--b\r\nContent-Type: message/rfc822\r\n\r\n",
            "From: Bob <bob@x.org>\r\nSubject: voice note\r\nDate: Mon, 1 Dec 2025 10:00:00 +0000\r\n\r\nTranscript text here.\r\n",
            "--b\r\nContent-Type: text/vtt; name=\"talk.vtt\"\r\nContent-Disposition: attachment; filename=\"talk.vtt\"\r\n\r\nWEBVTT\r\n\r\n00:00.000 --> 00:01.000\r\nhello\r\n",
            "--b\r\nContent-Type: image/png; name=\"p.png\"\r\nContent-Disposition: attachment; filename=\"p.png\"\r\nContent-Transfer-Encoding: base64\r\n\r\niVBORw0KGgo=\r\n",
            "--b--\r\n"
        );
        let m = parse(raw.as_bytes()).unwrap();
        assert!(m.body.contains("Summarise please."));
        assert_eq!(m.forwarded.len(), 1);
        assert_eq!(m.forwarded[0].from, "Bob <bob@x.org>");
        assert!(m.forwarded[0].body.contains("Transcript text here."));
        assert_eq!(m.text_attachments.len(), 1);
        assert_eq!(m.text_attachments[0].0, "talk.vtt");
        assert!(m.text_attachments[0].1.contains("00:00.000 --> 00:01.000"));
        assert_eq!(m.other_attachments, vec![("p.png".to_string(), "image/png".to_string(), 8)]);
    }

    /// Broken MIME gives what can be read and invents nothing: no text from a part whose
    /// boundary never closes, no sender from garbage; empty input is unparsable.
    #[test]
    fn broken_mime_yields_only_what_is_there() {
        let fields = |raw: &[u8]| {
            parse(raw).map(|m| (m.subject, m.body, m.from.len(), m.forwarded.len(), m.text_attachments.len()))
        };
        let empty = Ok((String::new(), String::new(), 0, 0, 0));
        assert_eq!(fields(b"Content-Type: multipart/mixed; boundary=\"x\r\n\r\n--x\r\n--x--"), empty);
        assert_eq!(fields(b"\xff\xfe\x00\x01"), empty);
        assert_eq!(fields(b""), Err(MailError::Unparsable));
        // Nested message/rfc822 parts down to an unterminated multipart: one forwarded message,
        // empty.
        let nested = fields(
            b"Content-Type: message/rfc822\r\n\r\nContent-Type: message/rfc822\r\n\r\nContent-Type: multipart/mixed; boundary=a\r\n\r\n--a\r\n",
        );
        assert_eq!(nested, Ok((String::new(), String::new(), 0, 1, 0)));
    }

    /// mail-parser can panic on crafted input: a panic is a clear error, not a crash.
    #[test]
    fn a_parser_panic_is_a_clear_error() {
        let panicked: Result<Mail, _> = guarded(|| panic!("crafted input"));
        assert_eq!(panicked.err(), Some(MailError::ParserPanicked));
    }
}
