//! The delivery-status notice a sender gets when a recipient cannot be reached: RFC 3464's
//! `multipart/report; report-type=delivery-status` (RFC 6522) with a human-readable part, the
//! per-recipient fields and the original headers, threaded under the original message (RFC 5322
//! §3.6.4) so the sender's client shows it in the thread.

use mail_builder::MessageBuilder;
use mail_builder::headers::content_type::ContentType;
use mail_builder::headers::date::Date;
use mail_builder::mime::{BodyPart, MimePart};
use nightmail_types::{Address, HeaderText, Timestamp, is_msg_id};

/// One recipient the message did not reach.
pub struct Failed<'a> {
    pub recipient: &'a Address,
    /// The smarthost's reply (`550 5.1.1 ...`), or why it was not reached.
    pub error: &'a str,
    /// It expired after temporary failures, rather than being refused.
    pub expired: bool,
}

pub struct Report<'a> {
    /// Our hostname (`Reporting-MTA`, the notice's From and Message-ID).
    pub hostname: &'a str,
    /// The smarthost (`Remote-MTA`).
    pub remote: &'a str,
    /// Who sent the original.
    pub to: &'a Address,
    pub original: &'a [u8],
    pub arrived: Timestamp,
    pub failed: Vec<Failed<'a>>,
    pub message_id: &'a str,
}

/// The notice's bytes and its Subject.
pub fn write(report: &Report<'_>) -> (Vec<u8>, String) {
    let original = Original::read(report.original);
    // The original's Subject as decoded may hold line breaks: one line, as every header we write.
    let subject = HeaderText::new(&format!(
        "Undelivered mail: {}",
        if original.subject.is_empty() { "(no subject)" } else { &original.subject }
    ));
    let mut human = String::from("Your message could not be delivered to ");
    human.push_str(if report.failed.len() == 1 { "this recipient:\n\n" } else { "these recipients:\n\n" });
    for f in &report.failed {
        let why = if f.expired { "not reached in time" } else { "refused" };
        human.push_str(&format!("  <{}>: {why}: {}\n", f.recipient, f.error));
    }
    human.push_str(&format!(
        "\nIt went through the smarthost {}. Any other recipients are not affected.\n\n-- \nnightmail at {}\n",
        report.remote, report.hostname
    ));

    // RFC 3464 §2.2: per-message fields, then a block per recipient.
    let mut status = format!(
        "Reporting-MTA: dns; {}\r\nArrival-Date: {}\r\n",
        report.hostname,
        Date::new(report.arrived.0 as i64 / 1000).to_rfc822()
    );
    for f in &report.failed {
        status.push_str(&format!(
            "\r\nFinal-Recipient: rfc822; {}\r\nAction: failed\r\nStatus: {}\r\nRemote-MTA: dns; {}\r\nDiagnostic-Code: smtp; {}\r\n",
            f.recipient,
            status_code(f.error, f.expired),
            report.remote.split(':').next().unwrap_or(report.remote),
            one_line(f.error)
        ));
    }
    let headers = original.headers;
    let headers_encoding = if headers.is_ascii() { "7bit" } else { "8bit" };
    let parts = vec![
        MimePart::new("text/plain", human),
        MimePart::new(ContentType::new("message/delivery-status"), BodyPart::Binary(status.into_bytes().into()))
            .transfer_encoding("7bit"),
        MimePart::new(ContentType::new("text/rfc822-headers"), BodyPart::Binary(headers.into()))
            .transfer_encoding(headers_encoding),
    ];
    let auto_replied = HeaderText::new("auto-replied");
    let mut builder = MessageBuilder::new()
        .from(("Mail Delivery System".to_string(), format!("MAILER-DAEMON@{}", report.hostname)))
        .to(report.to.to_string())
        .subject(&subject)
        .message_id(bare(report.message_id).to_string())
        // RFC 3834 §5: an automatic message; no responder (nor a model) answers it.
        .header("Auto-Submitted", &auto_replied)
        .body(MimePart::new(
            ContentType::new("multipart/report").attribute("report-type", "delivery-status"),
            BodyPart::Multipart(parts),
        ));
    if let Some(id) = original.message_id.as_ref().filter(|id| is_msg_id(id)) {
        let mut references: Vec<String> = original.references.iter().filter(|r| is_msg_id(r)).cloned().collect();
        references.push(id.clone());
        builder = builder.in_reply_to(id.clone()).references(references);
    }
    (builder.write_to_vec().expect("writing a message to a Vec cannot fail"), subject.to_string())
}

/// RFC 3464 §2.3.4 `Status`: the enhanced code in the reply if it has one (RFC 3463), else 4.4.7
/// (delivery time expired) or 5.0.0.
fn status_code(error: &str, expired: bool) -> String {
    if expired {
        return "4.4.7".into();
    }
    error
        .split_whitespace()
        .find(|w| {
            let parts: Vec<&str> = w.split('.').collect();
            parts.len() == 3
                && parts.iter().all(|p| !p.is_empty() && p.chars().all(|c| c.is_ascii_digit()))
                && (parts[0] == "5" || parts[0] == "4")
        })
        .map_or_else(|| "5.0.0".to_string(), str::to_string)
}

fn one_line(text: &str) -> String {
    text.chars().map(|c| if c.is_control() { ' ' } else { c }).collect()
}

fn bare(id: &str) -> &str {
    id.trim().trim_start_matches('<').trim_end_matches('>')
}

/// What the notice takes from the original.
#[derive(Default)]
struct Original {
    subject: String,
    message_id: Option<String>,
    references: Vec<String>,
    headers: Vec<u8>,
}

impl Original {
    /// mail-parser behind `catch_unwind`, as everywhere a stored message is read: an unreadable
    /// original still gets its notice, with fewer details.
    fn read(raw: &[u8]) -> Original {
        let end = raw.windows(4).position(|w| w == b"\r\n\r\n").map_or(raw.len(), |p| p + 2);
        let headers = raw[..end].to_vec();
        let parsed = std::panic::catch_unwind(|| {
            let message = mail_parser::MessageParser::new().parse_headers(raw)?;
            let references = match message.references() {
                mail_parser::HeaderValue::Text(t) => vec![t.to_string()],
                mail_parser::HeaderValue::TextList(l) => l.iter().map(|t| t.to_string()).collect(),
                _ => Vec::new(),
            };
            Some(Original {
                subject: message.subject().unwrap_or_default().to_string(),
                message_id: message.message_id().map(str::to_string),
                references,
                headers: Vec::new(),
            })
        });
        let mut original = parsed.ok().flatten().unwrap_or_default();
        original.headers = headers;
        original
    }
}

#[cfg(test)]
mod tests {
    use mail_parser::MimeHeaders;

    use super::*;

    #[test]
    fn a_notice_is_a_threaded_delivery_status_report() {
        let original = b"Message-ID: <q@nightmail.test>\r\nReferences: <p@x>\r\nFrom: me@nightmail.test\r\nSubject: Lunch\r\n\r\nbody\r\n";
        let me = Address::parse("me@nightmail.test").unwrap();
        let bob = Address::parse("bob@example.com").unwrap();
        let carol = Address::parse("carol@example.com").unwrap();
        let report = Report {
            hostname: "nightmail.test",
            remote: "smtp.example.com:587 (starttls)",
            to: &me,
            original,
            arrived: Timestamp(1_700_000_000_000),
            failed: vec![
                Failed { recipient: &bob, error: "550 5.1.1 no such user", expired: false },
                Failed { recipient: &carol, error: "gave up after 72 hours; 451 later", expired: true },
            ],
            message_id: "<dsn.1@nightmail.test>",
        };
        let (raw, subject) = write(&report);
        assert_eq!(subject, "Undelivered mail: Lunch");
        let message = mail_parser::MessageParser::new().parse(&raw).unwrap();
        assert_eq!(message.in_reply_to().as_text(), Some("q@nightmail.test"));
        assert_eq!(message.references().as_text_list().map(|l| l.len()), Some(2));
        let ct = message.content_type().unwrap();
        assert_eq!((ct.ctype(), ct.subtype()), ("multipart", Some("report")));
        assert_eq!(ct.attribute("report-type"), Some("delivery-status"));
        let types: Vec<String> = message.parts[1..]
            .iter()
            .map(|p| {
                p.content_type().map(|c| format!("{}/{}", c.ctype(), c.subtype().unwrap_or(""))).unwrap_or_default()
            })
            .collect();
        assert_eq!(types, ["text/plain", "message/delivery-status", "text/rfc822-headers"]);
        let text = String::from_utf8_lossy(&raw);
        assert!(
            text.contains("Final-Recipient: rfc822; bob@example.com\r\nAction: failed\r\nStatus: 5.1.1\r\n"),
            "{text}"
        );
        assert!(
            text.contains("Final-Recipient: rfc822; carol@example.com\r\nAction: failed\r\nStatus: 4.4.7\r\n"),
            "{text}"
        );
        assert!(text.contains("Diagnostic-Code: smtp; 550 5.1.1 no such user"), "{text}");
        assert!(text.contains("Auto-Submitted: auto-replied"), "{text}");
    }
}
