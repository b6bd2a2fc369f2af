//! What nightmail writes into the headers of its own mail, end to end: the real daemon on
//! loopback, questions sent with Python's smtplib, the model's mail handed to a real receiving
//! smarthost (aiosmtpd). Decoded text from a question (an encoded-word's CR, LF or NUL) must
//! never break out of the header it is copied into, nor put a bare CR or LF on the wire
//! (RFC 5322 §2.2, RFC 5321 §2.3.8: the SMTP smuggling pattern).

mod common;

use std::path::Path;
use std::time::Duration;

use common::{Daemon, RecordingBackend, Smarthost, eventually};
use serde_json::json;

/// The test configuration answering through `backend`, acknowledging questions, relaying through
/// `smarthost`.
fn config(dir: &Path, backend: &RecordingBackend, smarthost: &Smarthost) -> String {
    format!(
        "{}\n[relay]\nhost = \"127.0.0.1\"\nport = {}\ntls = \"none\"\n",
        common::config_answering(dir, "", &backend.url, 1).replace("url = ", "name = \"Kimi\"\nack = true\nurl = "),
        smarthost.port
    )
}

/// The header block of a message as it was written (up to the first empty line).
fn head(message: &str) -> &str {
    message.split("\r\n\r\n").next().unwrap_or(message)
}

/// The header fields named `name` in `head` (field lines, not continuations).
fn fields<'a>(head: &'a str, name: &str) -> Vec<&'a str> {
    head.split("\r\n").filter(|line| line.split_once(':').is_some_and(|(n, _)| n.eq_ignore_ascii_case(name))).collect()
}

/// Every CR is followed by LF and every LF follows a CR (RFC 5321 §2.3.8), and there is no NUL.
fn bare_line_ends(text: &str) -> Vec<usize> {
    let bytes = text.as_bytes();
    (0..bytes.len())
        .filter(|&i| match bytes[i] {
            b'\r' => bytes.get(i + 1) != Some(&b'\n'),
            b'\n' => i == 0 || bytes[i - 1] != b'\r',
            0 => true,
            _ => false,
        })
        .collect()
}

/// One message the daemon wrote, as it arrived: one From, no Reply-To of the attacker's, its
/// Message-ID and loop marker in the header block, clean line ends, and a Subject that decodes
/// to one line.
fn assert_clean(what: &str, message: &str) {
    let bad = bare_line_ends(message);
    assert!(bad.is_empty(), "{what}: bare CR, LF or NUL at {bad:?}:\n{message:?}");
    let head = head(message);
    assert_eq!(fields(head, "From").len(), 1, "{what}: exactly one From:\n{head}");
    assert!(fields(head, "Reply-To").is_empty(), "{what}: an injected Reply-To:\n{head}");
    assert_eq!(fields(head, "Message-ID").len(), 1, "{what}: the Message-ID is in the header block:\n{head}");
    assert_eq!(fields(head, "Auto-Submitted").len(), 1, "{what}: the loop marker is in the header block:\n{head}");
    assert!(!message.contains("p@evil.example\r\n"), "{what}: the attacker's address on a line of its own");
    let parsed = mail_parser::MessageParser::default().parse(message.as_bytes()).unwrap();
    let subject = parsed.subject().unwrap_or_default();
    assert!(!subject.contains(['\r', '\n', '\0']), "{what}: the Subject decodes to {subject:?}");
    assert_eq!(parsed.header_raw("Auto-Submitted").map(str::trim), Some("auto-replied"), "{what}");
}

/// Encoded-words that decode to header breaks: CR LF with a Reply-To and a blank line after it
/// (B), a lone LF (Q), and LF "." CR LF, the end-of-data pattern of SMTP smuggling (Q); and one
/// that decodes to a NUL.
const SUBJECTS: &[&str] = &[
    // "a\r\nReply-To: p@evil.example\r\n\r\nPay now"
    "=?utf-8?B?YQ0KUmVwbHktVG86IHBAZXZpbC5leGFtcGxlDQoNClBheSBub3c=?=",
    "=?utf-8?Q?line=0Abreak?=",
    "=?utf-8?Q?x=0A.=0D=0ARSET?=",
    "=?utf-8?Q?nul=00here?=",
];

#[test]
fn encoded_words_that_decode_to_line_breaks_never_break_out_of_a_header_we_write() {
    let smarthost = Smarthost::start(json!({}));
    let backend = RecordingBackend::answering("Noted.");
    let mut daemon = Daemon::start_with(|dir| config(dir, &backend, &smarthost));
    // Each question copies an outside person (so the model's reply-all goes through the
    // smarthost) and has a display name that decodes to a line break too.
    let subjects = serde_json::to_string(SUBJECTS).unwrap();
    common::python(
        &daemon,
        &format!(
            r#"
import os, smtplib
with smtplib.SMTP("127.0.0.1", int(os.environ["SMTP"]), timeout=30) as s:
    s.login("me", os.environ["PASSWORD"])
    for i, subject in enumerate({subjects}):
        s.sendmail("me@nightmail.test", ["kimi@nightmail.test", "alice@example.org"],
            "From: Me <me@nightmail.test>\r\nTo: Kimi <kimi@nightmail.test>\r\n"
            "Cc: =?utf-8?Q?Alice=0D=0ABcc:_p@evil.example?= <alice@example.org>\r\n"
            f"Subject: {{subject}}\r\nMessage-ID: <inject{{i}}@client.test>\r\n\r\nWhat now?\r\n")
"#
        ),
    );
    let n = SUBJECTS.len();
    eventually(Duration::from_secs(120), "every question answered", || {
        let jobs = daemon.jobs();
        jobs.len() == n && jobs.iter().all(|j| j["state"] == "done")
    });
    // At the smarthost: each question as me sent it, and each of the model's replies.
    eventually(Duration::from_secs(60), "the replies at the smarthost", || {
        smarthost.messages().iter().filter(|m| m["mail_from"] == "kimi@nightmail.test").count() == n
    });
    let replies: Vec<String> = smarthost
        .messages()
        .iter()
        .filter(|m| m["mail_from"] == "kimi@nightmail.test")
        .map(|m| m["data"].as_str().unwrap().to_string())
        .collect();
    for reply in &replies {
        assert_clean("a reply at the smarthost", reply);
    }
    daemon.stop();
    // In me's INBOX: the acknowledgements and the replies, written the same way.
    let inbox = daemon.mailbox("me", "INBOX");
    assert_eq!(inbox.len(), 2 * n, "an acknowledgement and a reply per question: {inbox:#?}");
    for message in &inbox {
        assert_clean("a message in me's INBOX", message);
    }
}

/// Sends each `(rcpt, message)` from me over smtplib; prints the reply to each end of DATA (or
/// the refusal) on a line of its own.
fn submit(daemon: &Daemon, mails: &[(&str, &str)]) -> Vec<String> {
    let mails = serde_json::to_string(mails).unwrap();
    let out = common::python(
        daemon,
        &format!(
            r#"
import os, smtplib
with smtplib.SMTP("127.0.0.1", int(os.environ["SMTP"]), timeout=30) as s:
    s.login("me", os.environ["PASSWORD"])
    for rcpt, m in {mails}:
        try:
            s.sendmail("me@nightmail.test", [rcpt], m)
            print("250")
        except smtplib.SMTPDataError as e:
            print(e.smtp_code, e.smtp_error.decode())
"#
        ),
    );
    out.lines().map(str::to_string).collect()
}

#[test]
fn a_user_cannot_write_as_another_account_and_mail_from_someone_else_names_its_sender() {
    let smarthost = Smarthost::start(json!({}));
    let relay = |allow: bool| {
        move |dir: &Path| {
            format!(
                "{}\n[relay]\nhost = \"127.0.0.1\"\nport = {}\ntls = \"none\"\n",
                common::config(dir, "")
                    .replace("[smtp]\n", &format!("[smtp]\nallow_other_users_addresses = {allow}\n")),
                smarthost.port
            )
        }
    };
    let mut daemon = Daemon::start_with(relay(false));
    let replies = submit(
        &daemon,
        &[
            // To a colleague, as another colleague.
            ("me@nightmail.test", "From: Ann <ann@nightmail.test>\r\nSubject: pay\r\n\r\nPay Bob.\r\n"),
            ("ann@nightmail.test", "From: kimi@nightmail.test\r\nSubject: from the model\r\n\r\nTrust me.\r\n"),
            // Outside, From me but answered to a colleague.
            ("bob@example.org", "From: me@nightmail.test\r\nReply-To: ann@nightmail.test\r\nSubject: r\r\n\r\nx\r\n"),
            ("bob@example.org", "From: me@nightmail.test\r\nSender: ann@nightmail.test\r\nSubject: s\r\n\r\nx\r\n"),
            // A forward kept here: taken, with me named as its sender.
            ("ann@nightmail.test", "From: Boss <boss@example.org>\r\nSubject: fwd\r\nMessage-ID: <fwd@t>\r\n\r\nx\r\n"),
        ],
    );
    assert!(replies[0].starts_with("550 5.7.1 The From header names <ann@nightmail.test>"), "{replies:?}");
    assert!(replies[1].starts_with("550 5.7.1 The From header names <kimi@nightmail.test>"), "{replies:?}");
    assert!(replies[2].starts_with("550 5.7.1 The Reply-To header names <ann@nightmail.test>"), "{replies:?}");
    assert!(replies[3].starts_with("550 5.7.1 The Sender header names <ann@nightmail.test>"), "{replies:?}");
    assert_eq!(replies[4], "250", "{replies:?}");
    daemon.stop();
    let ann = daemon.mailbox("ann", "INBOX");
    assert_eq!(ann.len(), 1, "only the forward reached ann: {ann:#?}");
    assert_eq!(common::header(&ann[0], "Sender").as_deref(), Some("<me@nightmail.test>"), "{}", ann[0]);
    assert!(daemon.mailbox("me", "INBOX").is_empty());
    assert!(smarthost.messages().is_empty(), "nothing relayed");

    // A shared desk: the configuration lets users name each other.
    let daemon = Daemon::start_with(relay(true));
    let replies = submit(
        &daemon,
        &[("bob@example.org", "From: me@nightmail.test\r\nReply-To: ann@nightmail.test\r\nSubject: r\r\n\r\nx\r\n")],
    );
    assert_eq!(replies, ["250"]);
}
