//! Text for a header field nightmail writes. A field body is one logical line (RFC 5322 §2.2):
//! a CR or LF in it ends the field and starts another, and a blank line ends the header block;
//! NUL is allowed nowhere in mail (RFC 5322 §4.1). Text decoded from someone's message can hold
//! any of them (an encoded-word decodes to any byte, RFC 2047 §5), so every value we write into a
//! header (subjects, display names, notices, status lines) is a [`HeaderText`], and the only way
//! to make one puts the text on one line. mail-builder then writes it as it is, or as RFC 2047
//! encoded-words when it holds non-ASCII.

use std::fmt;

use mail_builder::headers::HeaderType;
use mail_builder::headers::address::Address as MbAddress;
use mail_builder::headers::text::Text;

use crate::address::Address;

/// One line of text, safe to write as a header field body: no control character (CR, LF, NUL,
/// TAB, DEL, the C1 set) and no Unicode line or paragraph separator.
#[derive(Clone, PartialEq, Eq, Hash, Default)]
pub struct HeaderText(String);

impl HeaderText {
    /// `text` on one line: each run of line breaks and other control characters becomes one
    /// space, and the ends are trimmed.
    pub fn new(text: &str) -> HeaderText {
        let breaks = |c: char| c.is_control() || matches!(c, '\u{2028}' | '\u{2029}');
        let mut line = String::with_capacity(text.len());
        for piece in text.split(breaks).filter(|p| !p.is_empty()) {
            if !line.is_empty() && !line.ends_with(' ') && !piece.starts_with(' ') {
                line.push(' ');
            }
            line.push_str(piece);
        }
        HeaderText(line.trim().to_string())
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// A mailbox for an address header: `address`, with this text as its display name when it
    /// has any (mail-builder quotes it, or encodes it as RFC 2047 words).
    pub fn mailbox(name: Option<&HeaderText>, address: &Address) -> MbAddress<'static> {
        match name.filter(|n| !n.is_empty()) {
            Some(name) => (name.0.clone(), address.to_string()).into(),
            None => address.to_string().into(),
        }
    }
}

/// Whether a bare Message-ID (no angle brackets) can be written between them: RFC 5322 §3.6.4's
/// `id-left "@" id-right` is visible ASCII, so an id read from someone's header with a space, a
/// control or a bracket in it is left out of what we write.
pub fn is_msg_id(id: &str) -> bool {
    !id.is_empty() && id.bytes().all(|b| b.is_ascii_graphic() && b != b'<' && b != b'>')
}

/// The one way our text becomes a mail-builder header value.
impl<'a> From<&'a HeaderText> for Text<'a> {
    #[allow(clippy::disallowed_methods)]
    fn from(text: &'a HeaderText) -> Text<'a> {
        Text::new(text.0.as_str())
    }
}

impl<'a> From<&'a HeaderText> for HeaderType<'a> {
    fn from(text: &'a HeaderText) -> HeaderType<'a> {
        HeaderType::Text(text.into())
    }
}

impl fmt::Display for HeaderText {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for HeaderText {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.0, f)
    }
}

#[cfg(test)]
mod tests {
    use mail_builder::MessageBuilder;

    use super::*;

    #[test]
    fn line_breaks_and_controls_become_one_space() {
        let text = HeaderText::new("a\r\nReply-To: p@evil.example\r\n\r\nPay now");
        assert_eq!(text.as_str(), "a Reply-To: p@evil.example Pay now");
        assert_eq!(HeaderText::new("x\n.\r\nRSET").as_str(), "x . RSET");
        assert_eq!(HeaderText::new("nul\0here\u{2028}and\u{85}there").as_str(), "nul here and there");
        assert_eq!(HeaderText::new("  two  spaces \r\n kept ").as_str(), "two  spaces  kept");
        assert_eq!(HeaderText::new("\r\n").as_str(), "");
    }

    #[test]
    fn message_ids_are_visible_ascii() {
        assert!(is_msg_id("1.2@x.org"));
        assert!(!is_msg_id("a\r\nBcc: b@x") && !is_msg_id("a b@x") && !is_msg_id("a>@x") && !is_msg_id(""));
    }

    #[test]
    fn written_by_mail_builder_it_stays_in_its_field() {
        let subject = HeaderText::new("Grüße\r\nBcc: p@evil.example");
        let name = HeaderText::new("Ann\0\r\nX: y");
        let raw = MessageBuilder::new()
            .from(HeaderText::mailbox(Some(&name), &Address::parse("ann@x.org").unwrap()))
            .subject(&subject)
            .text_body("hi")
            .write_to_string()
            .unwrap();
        let head = raw.split("\r\n\r\n").next().unwrap();
        assert!(!head.contains('\0') && !head.contains("\r\nBcc") && !head.contains("\r\nX:"), "{head}");
        assert!(head.contains("Subject: =?utf-8?"), "non-ASCII as RFC 2047 encoded-words: {head}");
        let parsed = mail_parser::MessageParser::default().parse(raw.as_bytes()).unwrap();
        assert_eq!(parsed.subject(), Some("Grüße Bcc: p@evil.example"));
    }
}
