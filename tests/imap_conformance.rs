//! Regression tests for what Dovecot's imaptest found wrong (issue 15): each replays the exchange
//! with Python's imaplib (or a raw socket where imaplib hides the order of responses) against the
//! real daemon, and asserts what RFC 3501 and its companions require.

mod common;

use common::{Daemon, imaplib};

/// RFC 3501 §2.3.2: a message APPENDed or COPYed into a mailbox that sessions have selected is
/// `\Recent` in exactly one of them, and not to a session that only asks STATUS afterwards.
#[test]
fn new_mail_is_recent_in_exactly_one_session_that_has_the_mailbox_selected() {
    let daemon = Daemon::start();
    let out = imaplib(
        &daemon,
        r#"
one, two, three = login(), login(), login()
three.create("Shared")
one.select("Shared"); two.select("Shared")
typ, _ = one.append("Shared", r"(\Seen \Flagged)", None, b"Subject: a\r\n\r\nbody\r\n")
two.noop()
typ, status = three.status("Shared", "(MESSAGES RECENT)")
print("STATUS", status[0].decode())
recent = 0
for m in (one, two):
    typ, data = m.fetch("1", "(FLAGS)")
    recent += "\\Recent" in data[0].decode()
print("RECENT-HOLDERS", recent)
three.select("INBOX")
three.append("INBOX", None, None, b"Subject: b\r\n\r\nbody\r\n")
three.copy("1", "Shared")
typ, data = two.noop()
print("TWO-RECENT", two.untagged_responses.get("RECENT"))
typ, data = one.noop()
holders = 0
for m in (one, two):
    typ, data = m.fetch("2", "(FLAGS)")
    holders += "\\Recent" in data[0].decode()
print("COPY-HOLDERS", holders)
typ, status = three.status("Shared", "(MESSAGES RECENT)")
print("STATUS2", status[0].decode())
"#,
    );
    assert!(out.contains("(MESSAGES 1 RECENT 0)"), "a selected session claimed it: {out}");
    assert!(out.contains("RECENT-HOLDERS 1"), "{out}");
    assert!(out.contains("COPY-HOLDERS 1"), "{out}");
    assert!(out.contains("(MESSAGES 2 RECENT 0)"), "{out}");
}

/// RFC 2046 §5.1.5: the parts of a multipart/digest default to message/rfc822, so the messages
/// inside have a HEADER and a TEXT (imaptest's fetch-body-message-rfc822-mime).
#[test]
fn digest_parts_are_messages_with_header_and_text() {
    let daemon = Daemon::start();
    let out = imaplib(
        &daemon,
        r#"
m = login()
digest = (b"From: list@example.com\r\nSubject: digest\r\nMIME-Version: 1.0\r\n"
          b"Content-Type: multipart/mixed; boundary=\"outer\"\r\n\r\n"
          b"--outer\r\nContent-Type: multipart/digest; boundary=\"d\"\r\n\r\n"
          b"--d\r\n\r\nFrom: m1@example.com\r\nSubject: m1\r\n\r\nm1 body\r\n"
          b"--d\r\n\r\nFrom: m2@example.com\r\nSubject: m2\r\n\r\nm2 body\r\n"
          b"--d--\r\n--outer--\r\n")
m.append("INBOX", None, None, digest)
m.select("INBOX")
for section in ("1.1.HEADER", "1.1.TEXT", "1.2.HEADER", "1.2.TEXT"):
    typ, data = m.fetch("1", "(BODY.PEEK[%s])" % section)
    print(section, repr(data[0][1]))
typ, data = m.fetch("1", "(BODYSTRUCTURE)")
print("BS", data[0].decode())
"#,
    );
    assert!(out.contains(r"1.1.HEADER b'From: m1@example.com\r\nSubject: m1\r\n\r\n'"), "{out}");
    // The CRLF before a boundary belongs to the boundary (RFC 2046 §5.1.1).
    assert!(out.contains(r"1.1.TEXT b'm1 body'"), "{out}");
    assert!(out.contains(r"1.2.HEADER b'From: m2@example.com\r\nSubject: m2\r\n\r\n'"), "{out}");
    assert!(out.contains(r"1.2.TEXT b'm2 body'"), "{out}");
    assert!(out.contains("(\"MESSAGE\" \"RFC822\""), "digest parts are described as messages: {out}");
}

/// RFC 3501 §7.4.2: a group in an address list is (NIL NIL "name" NIL) ... (NIL NIL NIL NIL), an
/// empty group included, and a source route goes to the at-domain-list (imaptest's
/// fetch-envelope).
#[test]
fn envelope_keeps_groups_and_source_routes() {
    let daemon = Daemon::start();
    let out = imaplib(
        &daemon,
        r#"
m = login()
m.append("INBOX", None, None, b"Date: Thu, 15 Feb 2007 01:02:03 +0200\r\nFrom: user@domain (Real Name)\r\n"
         b"To: group: g1@d1.org, g2@d2.org;, group2: g3@d3.org;\r\nCc: group:;, group2: (foo) ;\r\n\r\nbody\r\n")
m.append("INBOX", None, None, b"Date: Thu, 15 Feb 2007 01:02:03 +0200\r\nFrom: <@route:user@domain>\r\n\r\nbody\r\n")
m.select("INBOX")
typ, data = m.fetch("1:2", "(ENVELOPE)")
for d in data:
    print(d.decode())
"#,
    );
    let to = r#"((NIL NIL "group" NIL)(NIL NIL "g1" "d1.org")(NIL NIL "g2" "d2.org")(NIL NIL NIL NIL)(NIL NIL "group2" NIL)(NIL NIL "g3" "d3.org")(NIL NIL NIL NIL))"#;
    let cc = r#"((NIL NIL "group" NIL)(NIL NIL NIL NIL)(NIL NIL "group2" NIL)(NIL NIL NIL NIL))"#;
    assert!(out.contains(&format!("{to} {cc}")), "{out}");
    assert!(out.contains(r#"((NIL "@route" "user" "domain"))"#), "{out}");
}

/// RFC 3501 §6.3.3 and §6.3.9: CREATE does not subscribe; LSUB with `%` names an unsubscribed
/// parent of a subscribed mailbox with \Noselect (imaptest's subscribe).
#[test]
fn create_does_not_subscribe_and_lsub_percent_shows_noselect_parents() {
    let daemon = Daemon::start();
    let out = imaplib(
        &daemon,
        r#"
m = login()
for name in ("box", "box/test", "box/test2", "box/test2/test", "box/test3", "box/test3/test3"):
    m.create(name)
typ, data = m.lsub('""', "box*")
print("FRESH", data)
for name in ("box/test", "box/test2/test", "box/test3/test3"):
    m.subscribe(name)
typ, data = m.lsub('""', "box/%")
for d in sorted(x.decode() for x in data):
    print("LSUB", d)
typ, data = m.lsub('""', "*test")
print("STAR", sorted(x.decode() for x in data))
"#,
    );
    assert!(out.contains("FRESH [None]"), "CREATE subscribes nothing: {out}");
    assert!(out.contains(r#"LSUB (\Noselect) "/" box/test2"#), "{out}");
    assert!(out.contains(r#"LSUB (\Noselect) "/" box/test3"#), "{out}");
    assert!(out.contains(r#""/" box/test"#), "{out}");
    assert!(!out.contains("LSUB () \"/\" box/test2/test"), "% does not descend: {out}");
    assert!(!out.contains("\\Noselect) \"/\" box\n"), "{out}");
    assert!(out.contains("box/test2/test"), "* lists the subscribed child itself: {out}");
}

/// A name made of legal atom characters that is not modified UTF-7 names no mailbox: SELECT gets
/// NO (not BAD), LIST matches nothing and says OK, CREATE gets NO [CANNOT] (imaptest's atoms).
#[test]
fn names_that_are_not_modified_utf7_get_no_and_list_nothing() {
    let daemon = Daemon::start();
    let out = imaplib(
        &daemon,
        r#"
m = login()
name = "!#$&'+,-.0123456789:;<=>?@^_`|[}"
tag = m._new_tag().decode()
m.send(("%s SELECT %s\r\n" % (tag, name)).encode())
while True:
    line = m.readline().decode()
    if line.startswith(tag):
        print("SELECT", line.strip()); break
typ, data = m.list('""', name + "%*")
print("LIST", typ, data)
typ, data = m.create("&Jjo!")
print("CREATE", typ, data)
"#,
    );
    assert!(out.contains(" NO "), "{out}");
    assert!(out.lines().any(|l| l.starts_with("SELECT") && l.contains(" NO ")), "{out}");
    assert!(out.contains("LIST OK [None]"), "{out}");
    assert!(out.contains("[CANNOT]"), "{out}");
}

/// Lines up to 64 KiB are commands, before login too: ID (RFC 2971) with 30 values of 1000
/// octets gets OK (imaptest's id).
#[test]
fn a_32k_id_command_before_login_gets_ok() {
    let daemon = Daemon::start();
    let out = imaplib(
        &daemon,
        r#"
m = imaplib.IMAP4("127.0.0.1", PORT)
fields = " ".join('"k%02d" "%s"' % (i, "1234567890" * 100) for i in range(30))
typ, data = m.xatom("ID", "(%s)" % fields)
print("ID", typ, len(fields))
m.login("me", os.environ["PASSWORD"])
print("LOGIN OK")
"#,
    );
    assert!(out.contains("ID OK"), "{out}");
    assert!(out.contains("LOGIN OK"), "{out}");
}

/// RFC 3501 §7.2.6: a keyword a STORE adds is announced in FLAGS and PERMANENTFLAGS before a FETCH
/// shows it, to the storing session and to another that has the mailbox selected; SELECT lists
/// the keywords in use.
#[test]
fn stored_keywords_are_announced_in_flags_before_they_are_fetched() {
    let daemon = Daemon::start();
    let out = imaplib(
        &daemon,
        r#"
a, b = login(), login()
a.append("INBOX", None, None, b"Subject: k\r\n\r\nbody\r\n")
a.select("INBOX"); b.select("INBOX")
a.untagged_responses.clear()
typ, data = a.store("1", "+FLAGS", "($Forwarded $Work)")
print("STORE", data)
print("A-FLAGS", a.untagged_responses.get("FLAGS"))
b.noop()
print("B-FLAGS", b.untagged_responses.get("FLAGS"))
c = login()
typ, data = c.select("INBOX")
print("C-FLAGS", c.untagged_responses.get("FLAGS"))
print("C-PERM", [x for x in c.untagged_responses.get("OK", []) if b"PERMANENTFLAGS" in x])
"#,
    );
    for who in ["A-FLAGS", "B-FLAGS", "C-FLAGS"] {
        let line = out.lines().find(|l| l.starts_with(who)).unwrap_or_default();
        assert!(line.contains("$Forwarded") && line.contains("$Work"), "{who}: {out}");
    }
    assert!(out.contains("$Forwarded $Work \\\\*") || out.contains("$Forwarded $Work \\*"), "{out}");
}

/// RFC 3501 §6.1.3 and §7.4.1: updates pending for the selected mailbox are sent before the
/// BYE of LOGOUT, never after it. A raw socket, since imaplib keeps no order of responses.
#[test]
fn logout_sends_pending_updates_before_bye() {
    let daemon = Daemon::start();
    let out = imaplib(
        &daemon,
        r#"
other = login()
other.append("INBOX", None, None, b"Subject: gone\r\n\r\nbody\r\n")
s, f = raw_login()
s.sendall(b"b SELECT INBOX\r\n"); until("b")
other.select("INBOX")
other.store("1", "+FLAGS", r"(\Deleted)")
other.expunge()
other.append("INBOX", None, None, b"Subject: new\r\n\r\nbody\r\n")
s.sendall(b"c LOGOUT\r\n")
for line in until("c"):
    print("LINE", line)
"#,
    );
    let lines: Vec<&str> = out.lines().filter_map(|l| l.strip_prefix("LINE ")).collect();
    let bye = lines.iter().position(|l| l.starts_with("* BYE")).expect("a BYE");
    let expunge = lines.iter().position(|l| l.ends_with("EXPUNGE")).expect("the EXPUNGE");
    let exists = lines.iter().position(|l| l.ends_with("EXISTS")).expect("the EXISTS");
    assert!(expunge < bye && exists < bye, "{lines:?}");
    assert_eq!(lines.len(), bye + 2, "nothing between BYE and the tagged OK: {lines:?}");
}

/// RFC 3501 §6.3.11: APPEND without a date-time stores the time of the APPEND as INTERNALDATE.
#[test]
fn append_without_a_date_stores_the_time_of_append() {
    let daemon = Daemon::start();
    let out = imaplib(
        &daemon,
        r#"
import time
m = login()
before = time.time()
m.append("INBOX", None, None, b"Subject: now\r\n\r\nbody\r\n")
m.select("INBOX")
typ, data = m.fetch("1", "(INTERNALDATE)")
t = time.mktime(imaplib.Internaldate2tuple(data[0]))
print("SKEW", abs(t - before) < 120, data[0].decode())
"#,
    );
    assert!(out.contains("SKEW True"), "{out}");
}
