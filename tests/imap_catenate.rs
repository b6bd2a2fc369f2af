//! CATENATE (RFC 4469), alone and with MULTIAPPEND (RFC 3502), replayed over a raw socket from
//! Python (imaplib has no CATENATE): TEXT and URL parts (RFC 5092 relative, absolute and
//! `;UID=`-relative forms, with sections and partial ranges), and each kind of bad input with the
//! response code RFC 4469 §5 gives it, after which nothing has been appended.

mod common;

use common::{Daemon, imaplib};

/// The helpers the scripts share: `cat(tag, box, parts)` sends an APPEND whose messages are
/// CATENATE lists (lists of ("TEXT", bytes) / ("URL", str)) or plain bytes, with LITERAL+.
const HELPERS: &str = r#"
import re
s, f = raw_login()
def cmd(tag, text):
    s.sendall(text)
    return until(tag)
def lit(b):
    return b"{%d+}\r\n%s" % (len(b), b)
def cat(tag, box, *messages):
    out = b"%s APPEND %s" % (tag.encode(), box)
    for m in messages:
        if isinstance(m, bytes):
            out += b" " + lit(m)
            continue
        parts = []
        for kind, value in m:
            parts.append(b"TEXT " + lit(value) if kind == "TEXT" else b'URL "%s"' % value.encode())
        out += b" CATENATE (" + b" ".join(parts) + b")"
    return cmd(tag, out + b"\r\n")
def body(n):
    s.sendall(b"f%d FETCH %d BODY.PEEK[]\r\n" % (n, n))
    size = int(re.search(rb"\{(\d+)\}\r\n$", f.readline()).group(1))
    data = f.read(size)
    until("f%d" % n)
    return data.decode().replace("\r\n", "|")
def messages(box):
    return re.search(r"MESSAGES (\d+)", cmd("st", b"st STATUS %s (MESSAGES)\r\n" % box)[0]).group(1)
one = b"From: a@example.com\r\nSubject: one\r\n\r\nHello body\r\n"
two = (b'From: b@example.com\r\nSubject: two\r\nMIME-Version: 1.0\r\nContent-Type: multipart/mixed; boundary="B"\r\n\r\n'
       b"--B\r\nContent-Type: text/plain\r\n\r\npart one\r\n--B\r\nContent-Type: text/plain\r\n\r\npart two\r\n--B--\r\n")
big = b"Subject: big\r\n\r\n" + (b"x" * 78 + b"\r\n") * 750
for tag, m in [("a1", one), ("a2", two), ("a3", big)]:
    cmd(tag, b"%s APPEND INBOX %s\r\n" % (tag.encode(), lit(m)))
uidv = re.search(r"UIDVALIDITY (\d+)", cmd("s1", b"s1 STATUS INBOX (UIDVALIDITY)\r\n")[0]).group(1)
cmd("c1", b"c1 CREATE Out\r\n")
"#;

/// RFC 4469 §3: TEXT and URL parts joined in order; a URL names a whole message, a section
/// (HEADER, TEXT, a part number, HEADER.FIELDS) or a partial range, in the relative, absolute and
/// selected-mailbox forms of RFC 5092; with MULTIAPPEND every message is catenated or a literal,
/// and APPENDUID names them all. A synchronising TEXT literal gets its continuation request, and
/// the URLs leave the source's `\Seen` alone.
#[test]
fn catenate_joins_text_and_urls_and_multiappends() {
    let daemon = Daemon::start();
    let out = imaplib(
        &daemon,
        &format!(
            r#"{HELPERS}
print("T1", cat("t1", b"Out", [("TEXT", b"New: header\r\n\r\n"), ("URL", "/INBOX;UIDVALIDITY=%s/;UID=1/;SECTION=TEXT" % uidv), ("TEXT", b"--\r\n")])[-1])
print("T2", cat("t2", b"Out", [("URL", "imap://me@nightmail.test/INBOX/;UID=2/;SECTION=HEADER"), ("URL", "//me;AUTH=*@nightmail.test/inbox/;uid=2/;section=2"), ("URL", "/INBOX/;UID=1/;PARTIAL=37.5")])[-1])
cmd("sel", b"sel EXAMINE INBOX\r\n")
print("T3", cat("t3", b"Out", [("URL", ";UID=2/;SECTION=HEADER.FIELDS%20(SUBJECT)"), ("URL", ";UID=1/;SECTION=1")])[-1])
s.sendall(b"t4 APPEND Out CATENATE (TEXT {{9}}\r\n")
print("T4", f.readline().decode().strip())
s.sendall(b"X: sync\r\n URL \"/INBOX/;UID=1/;SECTION=1\")\r\n")
print("T4", until("t4")[-1])
print("M1", cat("m1", b"Out", [("URL", "/INBOX/;UID=1")], b"Plain: literal\r\n\r\nbody\r\n", [("TEXT", b"Last: one\r\n\r\n"), ("URL", "/INBOX/;UID=2/;SECTION=1")])[-1])
cmd("sel2", b"sel2 EXAMINE Out\r\n")
for n in range(1, 8):
    print("F", body(n))
print("FLAGS", cmd("fl", b"fl STATUS INBOX (UNSEEN)\r\n")[0])
print("CAPS", cmd("cap", b"cap CAPABILITY\r\n")[0])
"#
        ),
    );
    let line = |label: &str| -> Vec<&str> { out.lines().filter(|l| l.starts_with(&format!("{label} "))).collect() };
    assert!(line("CAPS")[0].contains(" CATENATE"), "{out}");
    for tag in ["t1", "t2", "t3"] {
        let reply = line(&tag.to_uppercase())[0].to_string();
        assert!(reply.contains(&format!("{tag} OK [APPENDUID ")), "{reply}\n{out}");
    }
    assert_eq!(line("T4")[0], "T4 + ready for the literal", "{out}");
    assert!(line("T4")[1].contains("t4 OK [APPENDUID "), "{out}");
    // RFC 4315 §3 uid-set: three messages, UIDs 5 to 7.
    assert!(line("M1")[0].contains(" 5:7] "), "{out}");
    // The seven messages of Out, as FETCH BODY[] gives them (CRLF shown as `|`).
    let expect = [
        "New: header||Hello body|--|",
        "From: b@example.com|Subject: two|MIME-Version: 1.0|Content-Type: multipart/mixed; boundary=\"B\"||part twoHello",
        "Subject: two||Hello body|",
        "X: sync|Hello body|",
        "From: a@example.com|Subject: one||Hello body|",
        "Plain: literal||body|",
        "Last: one||part one",
    ];
    let bodies: Vec<&str> = line("F").iter().map(|l| &l[2..]).collect();
    assert_eq!(bodies, expect, "{out}");
    // BODY.PEEK semantics (RFC 4469 §3): the sources are still unseen.
    assert!(line("FLAGS")[0].contains("UNSEEN 3"), "{out}");
}

/// RFC 4469 §5: a URL that is malformed, names a missing message or section, another user's
/// mailbox, another server, a mailbox whose UIDVALIDITY has changed, or URLAUTH gets
/// `NO [BADURL url]`; a joined message over the size limit `NO [TOOBIG]`; a missing destination
/// `NO [TRYCREATE]`; broken CATENATE syntax BAD. After each, nothing was appended, also when the
/// failure is in the second message of a MULTIAPPEND whose first was fine.
#[test]
fn bad_catenate_parts_get_their_codes_and_append_nothing() {
    let daemon = Daemon::start();
    let out = imaplib(
        &daemon,
        &format!(
            r#"ann = login("ann")
ann.append("INBOX", None, None, b"Subject: ann's\r\n\r\nprivate\r\n")
ann.logout()
{HELPERS}
ok = [("TEXT", b"Subject: fine\r\n\r\n")]
cases = [
    ("b1", [("URL", "INBOX/;UID=1")]),
    ("b2", [("TEXT", b"H: 1\r\n\r\n"), ("URL", "/INBOX/;UID=99")]),
    ("b3", [("URL", "imap://ann@nightmail.test/INBOX/;UID=1")]),
    ("b4", [("URL", "/INBOX;UIDVALIDITY=%d/;UID=1/;SECTION=HEADER" % (int(uidv) + 1))]),
    ("b5", [("URL", "imap://me@elsewhere.example/INBOX/;UID=1")]),
    ("b6", [("URL", "/INBOX/;UID=1;URLAUTH=anonymous:internal:91354a473744909de610943775f92038")]),
    ("b7", [("URL", "/INBOX/;UID=1/;SECTION=4")]),
    ("b8", [("URL", "/Nowhere/;UID=1")]),
    ("b9", [("URL", ";UID=1")]),
]
for tag, parts in cases:
    print("BADURL", tag, cat(tag, b"Out", parts)[-1], messages(b"Out"))
print("TOOBIG", cat("z1", b"Out", [("URL", "/INBOX/;UID=3"), ("URL", "/INBOX/;UID=3")])[-1], messages(b"Out"))
print("MULTI", cat("z2", b"Out", ok, [("URL", "/INBOX/;UID=1"), ("URL", "/INBOX/;UID=99")])[-1], messages(b"Out"))
print("MULTI", cat("z3", b"Out", b"Plain: one\r\n\r\nx\r\n", [("URL", "/INBOX;UIDVALIDITY=1/;UID=1")])[-1], messages(b"Out"))
print("TRYCREATE", cat("z4", b"Nowhere", [("URL", "/INBOX;UIDVALIDITY=1/;UID=1")])[-1])
print("SYNTAX", cmd("z5", b"z5 APPEND Out CATENATE ()\r\n")[-1], messages(b"Out"))
print("SYNTAX", cmd("z6", b'z6 APPEND Out CATENATE (TEXT "inline")\r\n')[-1], messages(b"Out"))
print("SYNTAX", cmd("z7", b'z7 APPEND Out CATENATE (URL "/INBOX/;UID=1"\r\n')[-1], messages(b"Out"))
print("FINE", cat("z8", b"Out", ok)[-1], messages(b"Out"))
"#
        ),
    );
    let lines = |label: &str| -> Vec<&str> { out.lines().filter(|l| l.starts_with(&format!("{label} "))).collect() };
    let bad_urls = lines("BADURL");
    assert_eq!(bad_urls.len(), 9, "{out}");
    for (line, url) in bad_urls.iter().zip([
        "INBOX/;UID=1",
        "/INBOX/;UID=99",
        "imap://ann@nightmail.test/INBOX/;UID=1",
        "/INBOX;UIDVALIDITY=",
        "imap://me@elsewhere.example/INBOX/;UID=1",
        "/INBOX/;UID=1;URLAUTH=anonymous:internal:",
        "/INBOX/;UID=1/;SECTION=4",
        "/Nowhere/;UID=1",
        ";UID=1",
    ]) {
        assert!(line.contains(&format!(" NO [BADURL {url}")), "{url}: {line}");
        assert!(line.ends_with(" 0"), "nothing appended: {line}");
    }
    let toobig = lines("TOOBIG")[0];
    assert!(toobig.contains("z1 NO [TOOBIG]") && toobig.ends_with(" 0"), "{out}");
    let multi = lines("MULTI");
    assert!(multi[0].contains("z2 NO [BADURL /INBOX/;UID=99]") && multi[0].ends_with(" 0"), "{out}");
    assert!(multi[1].contains("z3 NO [BADURL /INBOX;UIDVALIDITY=1/;UID=1]") && multi[1].ends_with(" 0"), "{out}");
    assert!(lines("TRYCREATE")[0].contains("z4 NO [TRYCREATE]"), "{out}");
    for (line, tag) in lines("SYNTAX").iter().zip(["z5", "z6", "z7"]) {
        assert!(line.contains(&format!("{tag} BAD ")) && line.ends_with(" 0"), "{line}");
    }
    let fine = lines("FINE")[0];
    assert!(fine.contains("z8 OK [APPENDUID ") && fine.ends_with(" 1"), "{out}");
}
