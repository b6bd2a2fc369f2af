//! Implicit TLS (RFC 8314): submission and IMAP with TLS from the first byte, as phones and most
//! desktop clients are set up by default (ports 465 and 993), beside the STARTTLS listeners.
//! Python's smtplib.SMTP_SSL and imaplib.IMAP4_SSL are the clients, verifying the daemon's
//! self-signed certificate.

mod common;

use common::Daemon;

#[test]
fn submission_and_imap_over_implicit_tls() {
    let daemon = Daemon::start_with(|dir| {
        common::config(dir, "")
            .replace("[smtp]\n", "[tls]\nself_signed = true\n\n[smtp]\nlisten_tls = \"127.0.0.1:0\"\n")
            .replace("[imap]\n", "[imap]\nlisten_tls = \"127.0.0.1:0\"\n")
    });
    let cert = daemon.data_dir().join("tls/cert.pem");
    let script = format!(
        r#"
import imaplib, smtplib, ssl, os, time
ctx = ssl.create_default_context(cafile={cert:?})
ctx.check_hostname = False  # the certificate names nightmail.test; we connect to 127.0.0.1
s = smtplib.SMTP_SSL("127.0.0.1", {smtps}, context=ctx)
code, ehlo = s.ehlo()
print("EHLO", code, b"STARTTLS" in ehlo, b"AUTH" in ehlo)
s.login("me", os.environ["PASSWORD"])
s.sendmail("me@nightmail.test", ["ann@nightmail.test"], b"From: me@nightmail.test\r\nSubject: over 465\r\n\r\nsecret\r\n")
s.quit()
m = imaplib.IMAP4_SSL("127.0.0.1", {imaps}, ssl_context=ctx)
print("CAPS", "STARTTLS" in m.capabilities, "LOGINDISABLED" in m.capabilities)
m.login("ann", os.environ["PASSWORD"])
m.select("INBOX")
print("SEARCH", m.search(None, 'SUBJECT "over 465"')[1][0].decode())
m.logout()
# A client speaking plain text to the TLS port gets no greeting, and the daemon keeps serving.
import socket
raw = socket.create_connection(("127.0.0.1", {smtps}), timeout=5)
raw.sendall(b"EHLO plain\r\n")
try:
    print("PLAIN", raw.recv(100)[:3])
except (ConnectionResetError, socket.timeout):
    print("PLAIN refused")
"#,
        smtps = daemon.listener("smtps").port(),
        imaps = daemon.listener("imaps").port(),
    );
    let out = common::python(&daemon, &script);
    assert!(out.contains("EHLO 250 False True"), "AUTH offered, STARTTLS not (already TLS): {out}");
    assert!(out.contains("CAPS False False"), "no STARTTLS, LOGIN allowed inside TLS: {out}");
    assert!(out.contains("SEARCH 1"), "{out}");
    assert!(!out.contains("PLAIN b'220'"), "no greeting in the clear on the TLS port: {out}");
    // The STARTTLS listener still works beside it.
    let mut plain = common::Raw::connect(daemon.smtp);
    assert!(plain.reply().starts_with("220 "));
    assert!(plain.cmd("EHLO test").starts_with("250"));
    assert!(plain.cmd("STARTTLS").starts_with("220"), "STARTTLS is still offered there");
}
