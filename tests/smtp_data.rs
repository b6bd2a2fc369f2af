//! What DATA stores: the dot rules (RFC 5321 §4.5.2) on the first line of a message, where
//! smtp-proto 0.2.5's receiver applies neither, and resends from the null sender. Python's raw
//! sockets and smtplib send, its imaplib reads back what was stored.

mod common;

use common::{Daemon, python};

#[test]
fn a_dot_on_the_first_line_ends_an_empty_message_and_a_leading_double_dot_is_unstuffed() {
    let daemon = Daemon::start();
    let out = python(
        &daemon,
        r#"
import base64, imaplib, os, socket
s = socket.create_connection(("127.0.0.1", int(os.environ["SMTP"])), timeout=10)
f = s.makefile("rb")
def reply():
    while True:
        line = f.readline().decode().strip()
        if line[3:4] != "-":
            return line
def send(data):
    s.sendall(data)
    return reply()
reply()
send(b"EHLO t\r\n")
send(b"AUTH PLAIN " + base64.b64encode(b"\0me\0" + os.environ["PASSWORD"].encode()) + b"\r\n")
for body in (b"", b"..first line\r\nSubject: dots\r\n\r\n..body line\r\n"):
    send(b"MAIL FROM:<me@nightmail.test>\r\n")
    send(b"RCPT TO:<me@nightmail.test>\r\n")
    print("data", send(b"DATA\r\n")[:3])
    # A read timeout here (the server still waiting for the end) fails the script.
    print("end", send(body + b".\r\n")[:3])
send(b"QUIT\r\n")

m = imaplib.IMAP4("127.0.0.1", int(os.environ["IMAP"]))
m.login("me", os.environ["PASSWORD"])
m.select("INBOX")
for n in (b"1", b"2"):
    raw = m.fetch(n, "(BODY.PEEK[])")[1][0][1]
    # The daemon adds its trace lines above what was sent: what follows them is the message.
    print("stored", n.decode(), repr(raw.split(b"\r\n")[-5:]))
"#,
    );
    assert_eq!(out.matches("data 354").count(), 2, "{out}");
    assert_eq!(out.matches("end 250").count(), 2, "{out}");
    // The second message as sent, each leading ".." unstuffed to ".", the first line too.
    assert!(out.contains(r#"stored 2 [b'.first line', b'Subject: dots', b'', b'.body line', b'']"#), "{out}");
}

/// Dedupe marks are keyed on the envelope sender, which every user may leave null (`<>`): then
/// the user who sent it counts instead, so one user's bounce never makes another's vanish, while
/// a user's own resend is still a resend.
#[test]
fn a_null_sender_does_not_share_one_dedupe_key_across_users() {
    let daemon = Daemon::start();
    let out = python(
        &daemon,
        r#"
import imaplib, os, smtplib
msg = b"From: postmaster\r\nTo: me@nightmail.test\r\nSubject: bounce\r\nMessage-ID: <same@x>\r\n\r\nundeliverable\r\n"
for user in ("ann", "me", "me"):
    c = smtplib.SMTP("127.0.0.1", int(os.environ["SMTP"]), timeout=10)
    c.login(user, os.environ["PASSWORD"])
    print(user, "mail", c.mail("")[0])
    c.rcpt("me@nightmail.test")
    code, text = c.data(msg)
    print(user, "data", code, text.decode())
    c.quit()
m = imaplib.IMAP4("127.0.0.1", int(os.environ["IMAP"]))
m.login("me", os.environ["PASSWORD"])
print("inbox", m.select("INBOX")[1][0].decode())
"#,
    );
    assert_eq!(out.matches("mail 250").count(), 3, "{out}");
    assert!(out.contains("ann data 250 2.0.0 queued as"), "{out}");
    assert!(out.contains("me data 250 2.0.0 queued as"), "{out}");
    assert!(out.contains("me data 250 2.0.0 Already queued"), "{out}");
    assert!(out.contains("inbox 2"), "{out}");
}
