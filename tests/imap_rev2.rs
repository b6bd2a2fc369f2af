//! IMAP4rev2 (RFC 9051) in a session that sent `ENABLE IMAP4rev2`, beside an IMAP4rev1 session
//! on the same mailbox, over raw sockets from Python (imaplib speaks IMAP4rev1 only); and
//! STATUS SIZE (RFC 8438, part of RFC 9051 §6.3.11).

mod common;

use common::{Daemon, imaplib};

/// Runs `script` after [`MESSAGES`] against a fresh daemon; `line(out, tag)` is what `run` printed
/// for that tag.
fn replies(script: &str) -> String {
    let daemon = Daemon::start();
    imaplib(&daemon, &format!("{MESSAGES}{script}"))
}

fn line(out: &str, tag: &str) -> String {
    out.lines().find(|l| l.starts_with(&format!("{tag} "))).unwrap_or_default().to_string()
}

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
    let out = replies(
        r#"
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
"#,
    );
    let line = |tag: &str| line(&out, tag);
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
    let out = replies(
        r#"
s, f = raw_login()
run("t1", "STATUS INBOX (SIZE MESSAGES)")
run("t2", 'LIST "" INBOX RETURN (STATUS (SIZE))')
run("t3", "STATUS Sent (SIZE)")
run("t4", "STATUS INBOX (SIZE BOGUS)")
print("CAPS", m.capability()[1][0].decode())
print("EXPECTED", len(ONE) + len(TWO))
"#,
    );
    let expected = out.lines().find_map(|l| l.strip_prefix("EXPECTED ")).unwrap().to_string();
    assert!(out.contains(&format!("* STATUS INBOX (SIZE {expected} MESSAGES 2)")), "{out}");
    assert!(out.contains(&format!("* STATUS INBOX (SIZE {expected})")), "LIST-STATUS: {out}");
    assert!(out.contains("* STATUS Sent (SIZE 0)"), "{out}");
    assert!(out.contains("t4 BAD"), "{out}");
    assert!(out.lines().any(|l| l.starts_with("CAPS") && l.contains("STATUS=SIZE")), "{out}");
}

/// RFC 5182 SEARCHRES (RFC 9051 §6.4.4.1): RETURN (SAVE) alone answers no ESEARCH; `$` stands
/// for the saved messages in FETCH, UID FETCH, STORE, COPY and inside SEARCH criteria; with MIN
/// only the lowest is kept; an empty result is an empty set; an expunge takes its message out;
/// a failed SEARCH (SAVE) empties it, and so does SELECT.
#[test]
fn searchres_saves_a_result_and_dollar_reuses_it() {
    let out = replies(
        r#"
m.append("INBOX", None, None, b"Subject: three\r\n\r\nx\r\n")
s, f = raw_login()
run("a0", "SELECT INBOX")
run("a1", "SEARCH RETURN (SAVE) UNSEEN")
run("a2", "FETCH $ (FLAGS)")
run("a3", "UID FETCH $ (FLAGS)")
run("a4", "SEARCH $ SUBJECT three")
run("a5", "STORE $ +FLAGS.SILENT (\\Flagged)")
run("a6", "SEARCH FLAGGED")
run("a7", "UID SEARCH RETURN (SAVE MIN) UNSEEN")
run("a8", "FETCH $ (FLAGS)")
run("b1", "SEARCH RETURN (SAVE) DELETED")
run("b2", "FETCH $ (FLAGS)")
run("b3", "COPY $ Sent")
run("c1", "SEARCH RETURN (SAVE) ALL")
run("c2", "STORE 1 +FLAGS.SILENT (\\Deleted)")
run("c3", "EXPUNGE")
run("c4", "FETCH $ (UID)")
run("d1", "SEARCH RETURN (SAVE) NOSUCHKEY")
run("d2", "FETCH $ (UID)")
run("e1", "SEARCH RETURN (SAVE) ALL")
run("e2", "SELECT INBOX")
run("e3", "FETCH $ (UID)")
print("CAPS", m.capability()[1][0].decode())
"#,
    );
    let line = |tag: &str| line(&out, tag);
    assert_eq!(line("a1"), "a1 ['a1 OK SEARCH completed']", "SAVE alone answers nothing: {out}");
    let fetch = line("a2");
    assert!(fetch.contains("* 2 FETCH") && fetch.contains("* 3 FETCH") && !fetch.contains("* 1 FETCH"), "{fetch}");
    let uid_fetch = line("a3");
    assert!(uid_fetch.contains("UID 2") && uid_fetch.contains("UID 3") && !uid_fetch.contains("UID 1"), "{uid_fetch}");
    assert!(line("a4").contains("'* SEARCH 3'"), "{out}");
    assert!(line("a6").contains("'* SEARCH 2 3'"), "STORE $ flagged the saved two: {out}");
    assert!(line("a7").contains(r#"* ESEARCH (TAG "a7") UID MIN 2"#), "{out}");
    let min = line("a8");
    assert!(min.contains("* 2 FETCH") && !min.contains("* 3 FETCH"), "only the MIN is kept: {min}");
    // An empty `$` runs as the UID form over no message: OK and nothing else.
    let nothing = |tag: &str| line(tag).starts_with(&format!("{tag} ['{tag} OK ")) && !line(tag).contains("'*");
    assert!(nothing("b2"), "an empty result is an empty set: {out}");
    assert!(line("b3").contains("b3 OK"), "{out}");
    let after_expunge = line("c4");
    assert!(
        after_expunge.contains("* 1 FETCH (UID 2)") && after_expunge.contains("* 2 FETCH (UID 3)"),
        "{after_expunge}"
    );
    assert!(line("d1").contains("d1 BAD"), "{out}");
    assert!(nothing("d2"), "a failed SAVE empties $: {out}");
    assert!(nothing("e3"), "SELECT empties $: {out}");
    assert!(out.lines().any(|l| l.starts_with("CAPS") && l.contains("SEARCHRES") && l.contains("IMAP4rev2")), "{out}");
}
