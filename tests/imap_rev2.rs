//! IMAP4rev2 (RFC 9051) in a session that sent `ENABLE IMAP4rev2`, beside an IMAP4rev1 session
//! on the same mailbox, over raw sockets from Python (imaplib speaks IMAP4rev1 only); and
//! STATUS SIZE (RFC 8438, part of RFC 9051 §6.3.11).

mod common;

use common::{Daemon, imaplib};

const MESSAGES: &str = r#"
ONE = b"Subject: one\r\n\r\nfirst\r\n"
TWO = b"Subject: two\r\n\r\nsecond message\r\n"
m = login()
m.append("INBOX", r"(\Seen)", None, ONE)
m.append("INBOX", None, None, TWO)
def run(tag, command):
    s.sendall(("%s %s\r\n" % (tag, command)).encode())
    print(tag, until(tag))
"#;

/// RFC 9051 §6.3.1 ENABLE IMAP4rev2; §6.3.2 SELECT with a LIST line, no RECENT and no UNSEEN;
/// Appendix E: no `\Recent` (new mail is claimed by no rev2 session, so a rev1 session still
/// gets it), SEARCH answered with ESEARCH (§6.4.4), UTF-8 mailbox names (§5.1), `[CLOSED]` when
/// SELECT replaces the selected mailbox (§7.1); the rev1 session keeps RFC 3501's answers.
#[test]
fn an_imap4rev2_session_gets_rev2_answers_and_a_rev1_session_keeps_its_own() {
    let daemon = Daemon::start();
    let out = imaplib(
        &daemon,
        &format!(
            r#"{MESSAGES}
s, f = raw_login()
run("e1", "ENABLE IMAP4rev2")
run("s1", "SELECT INBOX")
run("f1", "FETCH 1:* (FLAGS)")
run("q1", "SEARCH UNSEEN")
run("q2", "UID SEARCH ALL")
run("q3", "SEARCH DELETED")
m.append("INBOX", None, None, b"Subject: three\r\n\r\nx\r\n")
run("n1", "NOOP")
run("c1", 'CREATE "Entwürfe"')
run("l1", 'LIST "" "Entw*"')
run("s2", "SELECT Sent")
s, f = raw_login()
run("r1", "SELECT INBOX")
run("r2", "SEARCH ALL")
run("r3", 'LIST "" "Entw*"')
"#
        ),
    );
    let line = |tag: &str| out.lines().find(|l| l.starts_with(&format!("{tag} "))).unwrap_or_default().to_string();
    assert!(line("e1").contains("* ENABLED IMAP4rev2"), "{out}");
    let select = line("s1");
    assert!(select.contains("* 2 EXISTS") && select.contains(r#"* LIST (\\HasNoChildren) "/" INBOX"#), "{select}");
    assert!(!select.contains("RECENT") && !select.contains("UNSEEN"), "{select}");
    assert!(select.contains("s1 OK [READ-WRITE]"), "{select}");
    let fetch = line("f1");
    assert!(fetch.contains("* 2 FETCH (FLAGS ())") && !fetch.contains("Recent"), "{fetch}");
    assert!(line("q1").contains(r#"'* ESEARCH (TAG "q1") ALL 2', 'q1 OK"#), "{out}");
    assert!(line("q2").contains(r#"'* ESEARCH (TAG "q2") UID ALL 1:2', 'q2 OK"#), "{out}");
    assert!(line("q3").contains(r#"'* ESEARCH (TAG "q3")', 'q3 OK"#), "{out}");
    assert!(["q1", "q2", "q3"].iter().all(|t| !line(t).contains("* SEARCH")), "{out}");
    let noop = line("n1");
    assert!(noop.contains("* 3 EXISTS") && !noop.contains("RECENT"), "{noop}");
    assert!(line("c1").contains("c1 OK"), "{out}");
    assert!(line("l1").contains(r#"* LIST (\\HasNoChildren) "/" "Entwürfe""#), "UTF-8 names: {out}");
    assert!(line("s2").contains("'* OK [CLOSED]"), "{out}");
    // The rev1 session: the three messages are still \Recent (no rev2 session took them).
    let rev1 = line("r1");
    assert!(rev1.contains("* 3 RECENT") && rev1.contains("[UNSEEN 2]") && !rev1.contains("* LIST"), "{rev1}");
    assert!(line("r2").contains("'* SEARCH 1 2 3'"), "{out}");
    assert!(line("r3").contains(r#""/" Entw&APw-rfe"#), "modified UTF-7 for rev1: {out}");
}

/// RFC 8438: STATUS SIZE is the octets of every message (RFC822.SIZE summed), in STATUS and in
/// LIST-STATUS (RFC 5819); an unknown item beside it is BAD.
#[test]
fn status_size_sums_the_messages_octets() {
    let daemon = Daemon::start();
    let out = imaplib(
        &daemon,
        &format!(
            r#"{MESSAGES}
s, f = raw_login()
run("t1", "STATUS INBOX (SIZE MESSAGES)")
run("t2", 'LIST "" INBOX RETURN (STATUS (SIZE))')
run("t3", "STATUS Sent (SIZE)")
run("t4", "STATUS INBOX (SIZE BOGUS)")
print("CAPS", m.capability()[1][0].decode())
print("EXPECTED", len(ONE) + len(TWO))
"#
        ),
    );
    let expected = out.lines().find_map(|l| l.strip_prefix("EXPECTED ")).unwrap().to_string();
    assert!(out.contains(&format!("* STATUS INBOX (SIZE {expected} MESSAGES 2)")), "{out}");
    assert!(out.contains(&format!("* STATUS INBOX (SIZE {expected})")), "LIST-STATUS: {out}");
    assert!(out.contains("* STATUS Sent (SIZE 0)"), "{out}");
    assert!(out.contains("t4 BAD"), "{out}");
    assert!(out.lines().any(|l| l.starts_with("CAPS") && l.contains("STATUS=SIZE")), "{out}");
}
