#!/usr/bin/env python3
"""A scripted IMAP conversation; each step checks the server's reply against what RFC 3501 (and
the extension RFCs named) say it must contain. Prints each step and the fraction that passed.

    python3 tests/e2e/imap_compliance.py HOST PORT USER PASSWORD

Run against a fresh account (it creates and deletes a mailbox `compliance-test` and appends to
INBOX). The figure in docs/IMAP.md comes from running it against `nightmail serve`.
"""
import re
import socket
import sys


class Conn:
    def __init__(self, host, port):
        self.sock = socket.create_connection((host, port), timeout=10)
        self.buf = b""
        self.n = 0
        self.greeting = self.line()

    def line(self):
        out = b""
        while True:
            while b"\r\n" not in self.buf:
                chunk = self.sock.recv(65536)
                if not chunk:
                    return (out + self.buf).decode("latin-1")
                self.buf += chunk
            line, self.buf = self.buf.split(b"\r\n", 1)
            out += line + b"\r\n"
            m = re.search(rb"\{(\d+)\}$", line)
            if not m:
                return out.decode("latin-1")
            size = int(m.group(1))
            while len(self.buf) < size:
                self.buf += self.sock.recv(65536)
            out += self.buf[:size]
            self.buf = self.buf[size:]

    def cmd(self, text, literal=None):
        self.n += 1
        tag = "c%d" % self.n
        if literal is not None:
            self.sock.sendall(("%s %s {%d}\r\n" % (tag, text, len(literal))).encode())
            cont = self.line()
            if not cont.startswith("+"):
                return cont
            self.sock.sendall(literal + b"\r\n")
        else:
            self.sock.sendall(("%s %s\r\n" % (tag, text)).encode())
        lines = []
        while True:
            line = self.line()
            lines.append(line)
            if line.startswith(tag + " ") or line == "":
                return "".join(lines)


MSG = (b"From: Ann <ann@example.org>\r\nTo: me@example.org\r\nSubject: compliance\r\n"
       b"Message-ID: <c@x>\r\nDate: Mon, 02 Mar 2026 10:00:00 +0000\r\nMIME-Version: 1.0\r\n"
       b"Content-Type: multipart/alternative; boundary=b\r\n\r\n--b\r\nContent-Type: text/plain\r\n\r\n"
       b"plain part\r\n--b\r\nContent-Type: text/html\r\n\r\n<p>html part</p>\r\n--b--\r\n")

# (RFC section, command, literal, regex the reply must match)
STEPS = [
    ("3501 7.1.1 greeting", None, None, r"^\* (OK|PREAUTH)"),
    ("3501 6.1.1 CAPABILITY", "CAPABILITY", None, r"(?i)\* CAPABILITY .*IMAP4rev1.*\r\nc\d+ OK"),
    ("3501 6.1.2 NOOP", "NOOP", None, r"c\d+ OK"),
    ("3501 6.3.1 SELECT before login", "SELECT INBOX", None, r"c\d+ (BAD|NO)"),
    ("3501 6.2.3 LOGIN wrong password", "LOGIN {user} wrongpassword", None, r"c\d+ NO"),
    ("3501 6.2.3 LOGIN", "LOGIN {user} {password}", None, r"c\d+ OK"),
    ("3501 6.3.8 LIST delimiter", 'LIST "" ""', None, r'\* LIST \(.*\) "/" ""'),
    ("3501 6.3.8 LIST INBOX", 'LIST "" INBOX', None, r'\* LIST \(.*\) "/" "?INBOX"?\r\nc\d+ OK'),
    ("6154 LIST special-use", 'LIST "" *', None, r"\\Sent"),
    ("3501 6.3.3 CREATE", "CREATE compliance-test", None, r"c\d+ OK"),
    ("3501 6.3.3 CREATE existing", "CREATE compliance-test", None, r"c\d+ NO"),
    ("3501 6.3.6 SUBSCRIBE", "SUBSCRIBE compliance-test", None, r"c\d+ OK"),
    ("3501 6.3.9 LSUB", 'LSUB "" compliance*', None, r"\* LSUB .*compliance-test"),
    ("3501 6.3.11 APPEND", "APPEND compliance-test (\\Seen) \"02-Mar-2026 10:00:00 +0000\"", MSG, r"c\d+ OK"),
    ("4315 APPENDUID", "APPEND compliance-test", MSG, r"OK \[APPENDUID \d+ 2\]"),
    ("3501 6.3.11 APPEND no mailbox", "APPEND nonexistent-box", MSG, r"c\d+ NO \[TRYCREATE\]"),
    ("3501 6.3.10 STATUS", "STATUS compliance-test (MESSAGES UIDNEXT UNSEEN)", None,
     r"\* STATUS \"?compliance-test\"? \((?=.*MESSAGES 2)(?=.*UIDNEXT 3)(?=.*UNSEEN 1).*\)"),
    ("3501 6.3.1 SELECT", "SELECT compliance-test", None,
     r"(?s)(?=.*\* FLAGS)(?=.*\* 2 EXISTS)(?=.*\* \d+ RECENT)(?=.*UIDVALIDITY \d+)(?=.*UIDNEXT 3)(?=.*PERMANENTFLAGS).*c\d+ OK \[READ-WRITE\]"),
    ("3501 6.4.5 FETCH FLAGS", "FETCH 1 (FLAGS)", None, r"\* 1 FETCH \(FLAGS \(.*\\Seen.*\)\)"),
    ("3501 6.4.5 FETCH RFC822.SIZE", "FETCH 1 (RFC822.SIZE)", None, r"\* 1 FETCH \(RFC822.SIZE %d\)" % len(MSG)),
    ("3501 6.4.5 FETCH INTERNALDATE", "FETCH 1 (INTERNALDATE)", None, r'INTERNALDATE "02-Mar-2026 10:00:00 \+0000"'),
    ("3501 6.4.5 FETCH ENVELOPE", "FETCH 1 (ENVELOPE)", None, r'ENVELOPE \("Mon, 02 Mar 2026 10:00:00 \+0000" "compliance" \(\("Ann" NIL "ann" "example.org"\)\)'),
    ("3501 6.4.5 FETCH BODYSTRUCTURE", "FETCH 1 (BODYSTRUCTURE)", None, r'BODYSTRUCTURE \(\("TEXT" "PLAIN".*\)\("TEXT" "HTML".*\) "ALTERNATIVE"'),
    ("3501 6.4.5 FETCH BODY[1]", "FETCH 1 (BODY.PEEK[1])", None, r"BODY\[1\] \{10\}\r\nplain part"),
    ("3501 6.4.5 FETCH HEADER.FIELDS", "FETCH 1 (BODY.PEEK[HEADER.FIELDS (SUBJECT)])", None, r"Subject: compliance\r\n\r\n"),
    ("3501 6.4.5 FETCH partial", "FETCH 1 (BODY.PEEK[TEXT]<0.4>)", None, r"BODY\[TEXT\]<0> \{4\}\r\n--b\r"),
    ("3501 6.4.5 FETCH sets \\Seen", "FETCH 2 (BODY[TEXT])", None, r"(?s)FLAGS \(.*\\Seen.*\)"),
    ("3501 6.4.8 UID FETCH", "UID FETCH 2 (FLAGS)", None, r"\* 2 FETCH \((?=.*UID 2).*\)"),
    ("3501 6.4.5 FETCH bad seq", "FETCH 9 (FLAGS)", None, r"c\d+ (BAD|NO)"),
    ("3501 6.4.6 STORE", "STORE 1 +FLAGS (\\Flagged)", None, r"\* 1 FETCH \(FLAGS \(.*\\Flagged.*\)\)"),
    ("3501 6.4.6 STORE .SILENT", "STORE 1 -FLAGS.SILENT (\\Flagged)", None, r"^c\d+ OK"),
    ("3501 6.4.4 SEARCH", "SEARCH SUBJECT compliance", None, r"\* SEARCH 1 2\r\n"),
    ("3501 6.4.4 SEARCH OR/NOT", "SEARCH OR FLAGGED NOT SEEN", None, r"\* SEARCH\r\n"),
    ("3501 6.4.4 SEARCH BODY", "SEARCH BODY \"html part\"", None, r"\* SEARCH 1 2\r\n"),
    ("3501 6.4.8 UID SEARCH", "UID SEARCH UID 2:*", None, r"\* SEARCH 2\r\n"),
    ("3501 6.4.7 COPY + 4315 COPYUID", "COPY 1 INBOX", None, r"c\d+ OK \[COPYUID \d+ 1 \d+\]"),
    ("3501 6.4.7 COPY no mailbox", "COPY 1 nonexistent-box", None, r"c\d+ NO \[TRYCREATE\]"),
    ("6851 MOVE", "UID MOVE 2 INBOX", None, r"\* OK \[COPYUID \d+ 2 \d+\].*\r\n\* 2 EXPUNGE\r\nc\d+ OK"),
    ("3501 6.4.6 STORE \\Deleted", "STORE 1 +FLAGS.SILENT (\\Deleted)", None, r"c\d+ OK"),
    ("3501 6.4.3 EXPUNGE", "EXPUNGE", None, r"\* 1 EXPUNGE\r\nc\d+ OK"),
    ("3501 6.4.1 CHECK", "CHECK", None, r"c\d+ OK"),
    ("3501 6.4.2 CLOSE", "CLOSE", None, r"c\d+ OK"),
    ("3501 6.3.2 EXAMINE", "EXAMINE INBOX", None, r"c\d+ OK \[READ-ONLY\]"),
    ("3501 6.4.6 STORE read-only", "STORE 1 +FLAGS (\\Seen)", None, r"c\d+ (NO|BAD)"),
    ("3691 UNSELECT", "UNSELECT", None, r"c\d+ OK"),
    ("3501 6.3.5 RENAME", "RENAME compliance-test compliance-renamed", None, r"c\d+ OK"),
    ("3501 6.3.7 UNSUBSCRIBE", "UNSUBSCRIBE compliance-renamed", None, r"c\d+ OK"),
    ("3501 6.3.4 DELETE", "DELETE compliance-renamed", None, r"c\d+ OK"),
    ("3501 6.3.4 DELETE missing", "DELETE compliance-renamed", None, r"c\d+ NO"),
    ("2342 NAMESPACE", "NAMESPACE", None, r'\* NAMESPACE \(\(""? ?"/"\)\)'),
    ("2971 ID", "ID NIL", None, r"\* ID \("),
    ("5161 ENABLE", "ENABLE UTF8=ACCEPT", None, r"c\d+ OK"),
    ("3501 6.1.2 NOOP authenticated", "NOOP", None, r"c\d+ OK"),
    ("3501 syntax error", "FETCH (((", None, r"c\d+ BAD"),
    ("3501 6.1.3 LOGOUT", "LOGOUT", None, r"\* BYE.*\r\nc\d+ OK"),
]


def main():
    host, port, user, password = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
    conn = Conn(host, port)
    passed = 0
    for section, command, literal, pattern in STEPS:
        if command is None:
            reply = conn.greeting
        else:
            reply = conn.cmd(command.format(user=user, password='"%s"' % password), literal)
        ok = re.search(pattern, reply) is not None
        passed += ok
        print("%s  %-36s %s" % ("PASS" if ok else "FAIL", section, "" if ok else repr(reply[:300])))
    print("compliance: %d/%d = %.3f" % (passed, len(STEPS), passed / len(STEPS)))


if __name__ == "__main__":
    main()
