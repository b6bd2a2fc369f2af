//! What happens to a message between the end of DATA and the store: content checks, header
//! extraction (mail-parser, which must never take the server down), and the headers a submission
//! server adds (RFC 5321 §4.4 trace, RFC 6409 §8 Message-ID and Date).

use std::net::SocketAddr;

use mail_builder::headers::date::Date;
use nightmail_store::{MessageKey, Summary, stable_digest};

use crate::reply::Reply;

/// Refuses content a submission server should not accept.
pub(crate) fn check(raw: &[u8], max_line: usize, max_header_lines: usize) -> Result<(), Reply> {
    // RFC 5321 §2.3.8: lines end in CRLF; a bare LF is what SMTP smuggling hides behind.
    if let Some(pos) = raw.iter().enumerate().position(|(i, &b)| b == b'\n' && (i == 0 || raw[i - 1] != b'\r')) {
        let line = raw[..pos].iter().filter(|&&b| b == b'\n').count() + 1;
        return Err(Reply::owned(
            554,
            [5, 6, 0],
            format!("Line {line} ends in a bare LF: lines must end in CRLF (RFC 5321 §2.3.8)"),
        ));
    }
    // RFC 5322 §2.3: CR and LF only together; a bare CR is the other half of the smuggling pair.
    if let Some(pos) = raw.iter().enumerate().position(|(i, &b)| b == b'\r' && raw.get(i + 1) != Some(&b'\n')) {
        let line = raw[..pos].iter().filter(|&&b| b == b'\n').count() + 1;
        return Err(Reply::owned(
            554,
            [5, 6, 0],
            format!("Line {line} holds a bare CR: CR is allowed only before LF (RFC 5322 §2.3)"),
        ));
    }
    // RFC 5322 §3.5 text and RFC 2045 §2.7-2.8 exclude NUL from mail (only obsolete syntax had it),
    // and no IMAP client could fetch it but through BINARY (RFC 3516 §4.2).
    if let Some(pos) = raw.iter().position(|&b| b == 0) {
        let line = raw[..pos].iter().filter(|&&b| b == b'\n').count() + 1;
        return Err(Reply::owned(
            554,
            [5, 6, 0],
            format!(
                "Line {line} holds a NUL byte, which mail may not carry (RFC 5322 §3.5): encode binary data as base64"
            ),
        ));
    }
    let mut header_lines = 0;
    let mut in_header = true;
    for (n, line) in raw.split(|&b| b == b'\n').enumerate() {
        let len = line.strip_suffix(b"\r").unwrap_or(line).len();
        if len > max_line {
            return Err(Reply::owned(
                554,
                [5, 6, 0],
                format!("Line {} is {len} octets long; the limit is {max_line} (RFC 5322 §2.1.1)", n + 1),
            ));
        }
        if in_header {
            if len == 0 {
                in_header = false;
            } else {
                header_lines += 1;
                if header_lines > max_header_lines {
                    return Err(Reply::owned(
                        552,
                        [5, 3, 4],
                        format!("The header has more than {max_header_lines} lines"),
                    ));
                }
            }
        }
    }
    Ok(())
}

/// Where a message came from, for its `Received:` line.
pub(crate) struct Trace<'a> {
    pub helo: &'a str,
    pub peer: SocketAddr,
    pub hostname: &'a str,
    /// RFC 3848: ESMTPA (authenticated), ESMTPSA (authenticated over TLS).
    pub protocol: &'static str,
    pub user: &'a str,
    pub key: MessageKey,
}

pub(crate) struct Checked {
    pub raw: Vec<u8>,
    /// The addresses in the From header, as written (empty if it has none or is unreadable).
    pub from_addresses: Vec<String>,
    pub summary: Summary,
    pub dedupe_id: String,
}

/// Reads the headers the queue needs and prepends the trace and any missing required headers.
/// Malformed MIME is kept as it is: parsing problems only leave fields empty.
pub(crate) fn prepare(raw: Vec<u8>, trace: &Trace<'_>) -> Checked {
    let fields = read_fields(&raw);
    let now = Date::now().to_rfc822();
    let mut head = format!(
        "Received: from {} ({}) by {} (nightmail) with {} id {}{};\r\n\t{}\r\n",
        sanitize(trace.helo),
        trace.peer.ip(),
        trace.hostname,
        trace.protocol,
        trace.key,
        if trace.user.is_empty() { String::new() } else { format!(" (authenticated as {})", sanitize(trace.user)) },
        now
    );
    let (message_id, dedupe_id) = match &fields.message_id {
        Some(id) => (id.clone(), id.clone()),
        None => {
            // RFC 6409 §8.3: the submission server may add a Message-ID. A resend of the same
            // bytes must still count as one message, so deduplicate on a digest of them.
            let id = format!("<{}.{:016x}@{}>", trace.key, rand::random::<u64>(), trace.hostname);
            head.push_str(&format!("Message-ID: {id}\r\n"));
            (id, format!("digest:{}:{}", stable_digest(&raw), raw.len()))
        }
    };
    if !fields.has_date {
        // RFC 6409 §8.2.
        head.push_str(&format!("Date: {now}\r\n"));
    }
    let mut stored = Vec::with_capacity(head.len() + raw.len());
    stored.extend_from_slice(head.as_bytes());
    stored.extend_from_slice(&raw);
    Checked {
        raw: stored,
        from_addresses: fields.from_addresses,
        summary: Summary { from: fields.from, subject: fields.subject, message_id },
        dedupe_id,
    }
}

#[derive(Default)]
struct Fields {
    message_id: Option<String>,
    subject: String,
    from: String,
    from_addresses: Vec<String>,
    has_date: bool,
}

/// Header fields via mail-parser, behind `catch_unwind`: a parser panic on hostile input costs
/// this message its summary, never the server (mail-parser #145).
fn read_fields(raw: &[u8]) -> Fields {
    std::panic::catch_unwind(|| {
        let Some(message) = mail_parser::MessageParser::new().parse_headers(raw) else {
            return Fields::default();
        };
        // Groups included (RFC 5322 §3.4): every mailbox the header names.
        let from_addresses = message
            .from()
            .map(|a| a.iter().map(|m| m.address().unwrap_or_default().to_string()).collect())
            .unwrap_or_default();
        Fields {
            from_addresses,
            message_id: nightmail_store::message_id(&message),
            subject: message.subject().unwrap_or_default().to_string(),
            from: nightmail_store::author(&message),
            has_date: message.date().is_some(),
        }
    })
    .unwrap_or_else(|_| {
        tracing::warn!("mail-parser panicked on a message's headers; storing it without a summary");
        Fields::default()
    })
}

/// Relayed mail must be From the authenticated user (RFC 6409 §6.1 lets a submission server
/// enforce this): anyone else's name on it would be forged, and the smarthost would sign it.
pub(crate) fn check_relayed_from(from: &[String], user: &nightmail_types::Address) -> Result<(), Reply> {
    if from.is_empty() {
        return Err(Reply::owned(
            550,
            [5, 7, 1],
            format!("Mail to outside addresses needs a From header with your address <{user}>"),
        ));
    }
    for written in from {
        if nightmail_types::Address::parse(written).ok().as_ref() != Some(user) {
            return Err(Reply::owned(
                550,
                [5, 7, 1],
                format!(
                    "The From header <{}> is not your address <{user}>: mail to outside addresses must be From you",
                    sanitize(written)
                ),
            ));
        }
    }
    Ok(())
}

/// Keeps text from the client fit for a header comment.
fn sanitize(text: &str) -> String {
    text.chars().filter(|c| !c.is_control() && !"()\\".contains(*c)).take(255).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn trace() -> Trace<'static> {
        Trace {
            helo: "client(x)",
            peer: "127.0.0.1:5000".parse().unwrap(),
            hostname: "nightmail.local",
            protocol: "ESMTPA",
            user: "me",
            key: MessageKey(7),
        }
    }

    #[test]
    fn checks_name_the_problem() {
        assert!(check(b"Subject: x\r\n\r\nok\r\n", 1000, 10).is_ok());
        let bare = check(b"Subject: x\r\n\r\nbad\nline\r\n", 1000, 10).unwrap_err();
        assert_eq!((bare.code, bare.esc), (554, [5, 6, 0]));
        assert!(bare.text.contains("Line 3"), "{}", bare.text);
        let long = format!("Subject: x\r\n\r\n{}\r\n", "a".repeat(1001));
        assert_eq!(check(long.as_bytes(), 1000, 10).unwrap_err().code, 554);
        let many: String = (0..11).map(|i| format!("X-{i}: y\r\n")).collect::<String>() + "\r\nbody\r\n";
        assert_eq!(check(many.as_bytes(), 1000, 10).unwrap_err().code, 552);
        let cr = check(b"Subject: x\r\n\r\nbad\rline\r\n", 1000, 10).unwrap_err();
        assert_eq!((cr.code, cr.esc), (554, [5, 6, 0]));
        assert!(cr.text.contains("Line 3 holds a bare CR"), "{}", cr.text);
        let nul = check(b"Subject: a\0b\r\n\r\nok\r\n", 1000, 10).unwrap_err();
        assert_eq!((nul.code, nul.esc), (554, [5, 6, 0]));
        assert!(nul.text.contains("Line 1 holds a NUL"), "{}", nul.text);
        assert!(check(b"Subject: x\r\n\r\n8-bit \xe4\xff is fine\r\n", 1000, 10).is_ok());
        // Lines after the header do not count as header lines.
        let body: String = "X: y\r\n\r\n".to_string() + &"line\r\n".repeat(50);
        assert!(check(body.as_bytes(), 1000, 10).is_ok());
    }

    #[test]
    fn prepare_adds_trace_and_missing_headers() {
        let c = prepare(b"From: Ann <ann@x.org>\r\nSubject: Hello\r\n\r\nbody\r\n".to_vec(), &trace());
        let text = String::from_utf8(c.raw).unwrap();
        assert!(text.starts_with("Received: from clientx (127.0.0.1) by nightmail.local (nightmail) with ESMTPA id 7 (authenticated as me);"), "{text}");
        assert!(text.contains("\r\nMessage-ID: <7."), "{text}");
        assert!(text.contains("\r\nDate: "), "{text}");
        assert!(text.ends_with("From: Ann <ann@x.org>\r\nSubject: Hello\r\n\r\nbody\r\n"));
        assert_eq!(c.summary.from, "Ann <ann@x.org>");
        assert_eq!(c.summary.subject, "Hello");
        assert!(c.dedupe_id.starts_with("digest:"));

        let again = prepare(b"From: Ann <ann@x.org>\r\nSubject: Hello\r\n\r\nbody\r\n".to_vec(), &trace());
        assert_eq!(again.dedupe_id, c.dedupe_id, "the same bytes dedupe alike");
    }

    #[test]
    fn prepare_keeps_an_existing_message_id_and_date() {
        let raw = b"Message-ID: <abc@x.org>\r\nDate: Mon, 1 Dec 2025 10:00:00 +0000\r\n\r\nbody\r\n";
        let c = prepare(raw.to_vec(), &trace());
        assert_eq!(c.summary.message_id, "<abc@x.org>");
        assert_eq!(c.dedupe_id, "<abc@x.org>");
        let text = String::from_utf8(c.raw).unwrap();
        assert_eq!(text.matches("Message-ID:").count(), 1);
        assert_eq!(text.matches("Date:").count(), 1);
    }

    #[test]
    fn relayed_mail_must_be_from_the_user() {
        let me = nightmail_types::Address::parse("me@x.org").unwrap();
        let from = |raw: &[u8]| prepare(raw.to_vec(), &trace()).from_addresses;
        assert!(check_relayed_from(&from(b"From: Me <ME@x.org>\r\n\r\nb\r\n"), &me).is_ok());
        let forged = check_relayed_from(&from(b"From: Boss <boss@x.org>\r\n\r\nb\r\n"), &me).unwrap_err();
        assert_eq!((forged.code, forged.esc), (550, [5, 7, 1]));
        assert!(forged.text.contains("From header <boss@x.org>"), "{}", forged.text);
        let two = from(b"From: me@x.org, boss@x.org\r\n\r\nb\r\n");
        assert!(check_relayed_from(&two, &me).is_err(), "every From mailbox must be the user");
        assert!(check_relayed_from(&from(b"Subject: x\r\n\r\nb\r\n"), &me).unwrap_err().text.contains("needs a From"));
    }

    #[test]
    fn malformed_mime_is_kept_byte_for_byte() {
        let raw = b"Content-Type: multipart/mixed; boundary=\"never\"\r\nSubject: =?bogus?Q?x\r\n\r\n--nope\r\n\xff\xfe garbage\r\n".to_vec();
        let c = prepare(raw.clone(), &trace());
        assert!(c.raw.ends_with(&raw));
    }
}
