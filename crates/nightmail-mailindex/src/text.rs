//! What of a message is indexed: subject, author, date, Message-ID and body text.

use mail_parser::MessageParser;
use nightmail_types::Timestamp;

/// How much of an unparsable message's bytes is indexed as its body.
const RAW_FALLBACK_BYTES: usize = 64 * 1024;

/// The searchable text of one message.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct MailText {
    pub subject: String,
    pub from: String,
    /// RFC 2822, from the Date header, else from the store's INTERNALDATE.
    pub date: Option<String>,
    pub message_id: Option<String>,
    pub body: String,
    /// The parser failed (or panicked) and the body is the raw bytes, lossily decoded.
    pub unreadable: bool,
}

impl MailText {
    /// Reads `raw` under `catch_unwind`: mail-parser can panic on crafted MIME, and one bad
    /// message must cost its own text, not the catch-up. Such a message is still indexed, by
    /// its raw bytes, so nothing drops out of search unannounced.
    pub(crate) fn read(raw: &[u8], internal_date: Timestamp) -> MailText {
        let arrived = || Some(mail_parser::DateTime::from_timestamp(internal_date.secs() as i64).to_rfc822());
        let parsed = std::panic::catch_unwind(|| {
            let message = MessageParser::default().parse(raw)?;
            Some(MailText {
                subject: message.subject().unwrap_or_default().to_string(),
                from: nightmail_store::author(&message),
                date: message.date().map(|d| d.to_rfc822()),
                message_id: nightmail_store::message_id(&message),
                body: body_text(&message),
                unreadable: false,
            })
        });
        match parsed {
            Ok(Some(text)) => MailText { date: text.date.clone().or_else(arrived), ..text },
            Ok(None) | Err(_) => {
                // A character cut at the end becomes U+FFFD, which no query matches anyway.
                let head = &raw[..raw.len().min(RAW_FALLBACK_BYTES)];
                MailText {
                    body: String::from_utf8_lossy(head).into_owned(),
                    date: arrived(),
                    unreadable: true,
                    ..MailText::default()
                }
            }
        }
    }
}

/// Every text body part: text/plain, or HTML that mail-parser turns into text when a part has no
/// plain alternative.
fn body_text(message: &mail_parser::Message<'_>) -> String {
    (0..message.text_body_count())
        .filter_map(|i| message.body_text(i))
        .map(|t| t.replace("\r\n", "\n"))
        .collect::<Vec<_>>()
        .join("\n\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_and_html_bodies_become_text() {
        let raw = b"From: Ann <ann@x.org>\r\nSubject: Hi\r\nMessage-ID: <1@x>\r\nDate: Tue, 1 Jul 2025 10:00:00 +0000\r\n\r\nplain words\r\n";
        let text = MailText::read(raw, Timestamp::now());
        assert_eq!((text.subject.as_str(), text.from.as_str()), ("Hi", "Ann <ann@x.org>"));
        assert_eq!(text.message_id.as_deref(), Some("<1@x>"));
        assert!(text.date.unwrap().contains("Jul 2025"));
        assert_eq!(text.body.trim(), "plain words");

        let html = b"Subject: H\r\nContent-Type: text/html\r\n\r\n<p>What is <b>MoE</b>?</p>\r\n";
        let text = MailText::read(html, Timestamp::now());
        assert!(text.body.contains("What is MoE?") && !text.body.contains("<b>"), "{}", text.body);
        assert!(text.date.is_some(), "no Date header: the arrival time stands in");
    }

    #[test]
    fn bytes_that_are_no_message_are_kept_as_raw_text() {
        let text = MailText::read(b"", Timestamp::now());
        assert!(text.unreadable);
    }
}
