"""A full SMTP session with CPython's smtplib against a running nightmail.

usage: smtplib_session.py PORT PASSWORD
Sends one message in the clear (loopback allows AUTH) and one after STARTTLS, and checks the
extensions and replies a submission client relies on. Exits non-zero on the first surprise.
"""
import smtplib
import ssl
import sys
from email.message import EmailMessage

port, password = int(sys.argv[1]), sys.argv[2]


def message(subject):
    m = EmailMessage()
    m["From"] = "me@nightmail.test"
    m["To"] = "kimi@nightmail.test"
    m["Subject"] = subject
    m.set_content("Hello from smtplib.\n")
    return m


with smtplib.SMTP("127.0.0.1", port, timeout=30) as s:
    code, _ = s.ehlo("smtplib.test")
    assert code == 250, code
    for ext in ("size", "8bitmime", "pipelining", "enhancedstatuscodes", "smtputf8", "starttls", "auth"):
        assert s.has_extn(ext), f"EHLO lacks {ext}: {s.esmtp_features}"
    assert s.esmtp_features["size"] == "100000", s.esmtp_features
    try:
        s.send_message(message("refused before auth"))
        raise SystemExit("sent without AUTH")
    except smtplib.SMTPSenderRefused as e:
        assert e.smtp_code == 530, e
    s.login("me", password)
    refused = s.send_message(message("smtplib plain"))
    assert refused == {}, refused
    print("plain: ok")

with smtplib.SMTP("127.0.0.1", port, timeout=30) as s:
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE  # the daemon's certificate is self-signed
    s.starttls(context=context)
    s.ehlo("smtplib.test")
    assert not s.has_extn("starttls"), "STARTTLS offered again inside TLS"
    try:
        s.login("me", "wrong password")
        raise SystemExit("wrong password accepted")
    except smtplib.SMTPAuthenticationError as e:
        assert e.smtp_code == 535, e
    s.login("me", password)
    s.send_message(message("smtplib over starttls"))
    print("starttls: ok")
