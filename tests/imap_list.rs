//! LIST-EXTENDED (RFC 5258), LIST-STATUS (RFC 5819) and SPECIAL-USE's LIST options (RFC 6154),
//! driven by Python's imaplib (its `_simple_command` sends the arguments as given) and, for the
//! exact order of the lines, a raw socket.

mod common;

use common::{Daemon, imaplib};

const SETUP: &str = r#"
m = login()
for name in ["Lists", "Lists/a", "Lists/b/c", "Lists/d"]:
    assert m.create(name)[0] == "OK", name
for name in ["Lists/a", "Lists/b/c"]:
    assert m.subscribe(name)[0] == "OK", name
m.append("Lists/a", None, None, b"Subject: one\r\n\r\nx\r\n")
m.append("Lists/a", r"(\Seen)", None, b"Subject: two\r\n\r\ny\r\n")
def show(label, *args):
    typ, data = m._simple_command("LIST", *args)
    lists = m.untagged_responses.pop("LIST", [])
    status = m.untagged_responses.pop("STATUS", [])
    print(label, typ, sorted(x.decode() for x in lists if x), sorted(x.decode() for x in status if x))
"#;

/// RFC 5258 §3: several patterns; SUBSCRIBED and RECURSIVEMATCH select with CHILDINFO; RETURN
/// (SUBSCRIBED CHILDREN); a level that is no mailbox is `\NonExistent` in an extended LIST and
/// `\Noselect` in a plain one (RFC 3501 §6.3.8); RFC 6154's SPECIAL-USE selection; RFC 5819's
/// STATUS after each selectable mailbox.
#[test]
fn list_extended_selects_returns_and_reports_status() {
    let daemon = Daemon::start();
    let out = imaplib(
        &daemon,
        &format!(
            r#"{SETUP}
show("PATTERNS", '""', "(Lists/a Lists/d)")
show("RETURN", '""', "Lists/%", "RETURN", "(SUBSCRIBED CHILDREN)")
show("SUBSCRIBED", "(SUBSCRIBED)", '""', "Lists/*")
show("RECURSIVE", "(SUBSCRIBED RECURSIVEMATCH)", '""', "Lists/%")
show("SPECIAL", "(SPECIAL-USE)", '""', "*")
show("PLAIN", '""', "Lists/%")
show("STATUS", '""', "Lists/%", "RETURN", "(STATUS (MESSAGES UNSEEN))")
typ, caps = m.capability()
print("CAPS", caps[0].decode())
"#
        ),
    );
    let line = |label: &str| out.lines().find(|l| l.starts_with(&format!("{label} "))).unwrap_or_default().to_string();
    assert!(out.contains("LIST-EXTENDED") && out.contains("LIST-STATUS"), "{out}");
    let patterns = line("PATTERNS");
    assert!(patterns.contains(r#"(\\HasNoChildren) "/" Lists/a"#), "{patterns}");
    assert!(
        patterns.contains(r#"(\\HasNoChildren) "/" Lists/d"#) && patterns.matches("Lists").count() == 2,
        "{patterns}"
    );
    let returns = line("RETURN");
    assert!(returns.contains(r#"(\\Subscribed \\HasNoChildren) "/" Lists/a"#), "{returns}");
    assert!(returns.contains(r#"(\\NonExistent \\HasChildren) "/" Lists/b"#), "{returns}");
    assert!(returns.contains(r#"(\\HasNoChildren) "/" Lists/d"#), "{returns}");
    let subscribed = line("SUBSCRIBED");
    assert!(
        subscribed.contains(r#""/" Lists/a"#) && subscribed.contains(r#"(\\Subscribed \\HasNoChildren) "/" Lists/b/c"#)
    );
    assert!(!subscribed.contains("Lists/d") && !subscribed.contains(r#"Lists/b'"#), "{subscribed}");
    let recursive = line("RECURSIVE");
    assert!(
        recursive.contains(r#"(\\NonExistent \\HasChildren) "/" Lists/b ("CHILDINFO" ("SUBSCRIBED"))"#),
        "{recursive}"
    );
    assert!(
        recursive.contains(r#"(\\Subscribed \\HasNoChildren) "/" Lists/a"#) && !recursive.contains("Lists/d"),
        "{recursive}"
    );
    let special = line("SPECIAL");
    for role in ["Sent", "Drafts", "Trash", "Archive"] {
        assert!(special.contains(&format!(r#"\\{role}) "/" {role}"#)), "{special}");
    }
    assert!(!special.contains("INBOX") && !special.contains("Lists"), "{special}");
    let plain = line("PLAIN");
    assert!(plain.contains(r#"(\\Noselect \\HasChildren) "/" Lists/b"#), "{plain}");
    let status = line("STATUS");
    assert!(
        status.contains("Lists/a (MESSAGES 2 UNSEEN 1)") && status.contains("Lists/d (MESSAGES 0 UNSEEN 0)"),
        "{status}"
    );
    assert!(!status.contains("Lists/b ("), "no STATUS for a level that is no mailbox: {status}");
}

/// RFC 5258 §3: unknown selection or return options, RECURSIVEMATCH alone, unknown STATUS items
/// and broken syntax get a tagged BAD, and the session goes on; a pattern may be a literal;
/// RFC 5819 §2: each STATUS line follows its LIST line.
#[test]
fn bad_list_extended_options_get_bad_and_status_follows_its_list() {
    let daemon = Daemon::start();
    let out = imaplib(
        &daemon,
        r#"
s, f = raw_login()
for tag, args in [("b1", '(BOGUS) "" *'), ("b2", '(RECURSIVEMATCH) "" *'), ("b3", '(RECURSIVEMATCH REMOTE) "" *'),
                  ("b4", '"" * RETURN (BOGUS)'), ("b5", '"" * RETURN (STATUS (BOGUS))'), ("b6", '"" (INBOX Sent'),
                  ("b7", '"" * RETURN (STATUS)'), ("b8", '(SUBSCRIBED) "" * RETURN')]:
    s.sendall(("%s LIST %s\r\n" % (tag, args)).encode())
    print("BAD", tag, until(tag)[-1])
s.sendall(b'c list (remote) "" (inbox {4}\r\n')
print("CONTINUE", f.readline().decode().strip())
s.sendall(b'Sen*) return (status (messages uidnext) children)\r\nd NOOP\r\n')
print("ORDER", until("d"))
"#,
    );
    for tag in ["b1", "b2", "b3", "b4", "b5", "b6", "b7", "b8"] {
        assert!(out.contains(&format!("BAD {tag} {tag} BAD ")), "{tag}: {out}");
    }
    assert!(out.contains("CONTINUE +"), "{out}");
    let order = out.lines().find(|l| l.starts_with("ORDER")).unwrap();
    let expected = r#"ORDER ['* LIST (\\HasNoChildren) "/" INBOX', '* STATUS INBOX (MESSAGES 0 UIDNEXT 1)', '* LIST (\\HasNoChildren \\Sent) "/" Sent', '* STATUS Sent (MESSAGES 0 UIDNEXT 1)', 'c OK LIST completed', 'd OK NOOP completed']"#;
    assert_eq!(order, expected);
}

/// RFC 9051 §6.3.7 and RFC 5258 §3.1 (imaptest's `listext`): a subscription outlives DELETE and
/// is listed by LIST (SUBSCRIBED) as `\Subscribed \NonExistent`, by LSUB as `\Noselect`, counts
/// for RECURSIVEMATCH's CHILDINFO, never shows in a plain LIST, and goes with UNSUBSCRIBE; RENAME
/// takes the subscriptions of the names it moves along.
#[test]
fn a_subscription_outlives_delete_and_follows_rename() {
    let daemon = Daemon::start();
    let out = imaplib(
        &daemon,
        r#"
s, f = raw_login()
def run(tag, command):
    s.sendall(("%s %s\r\n" % (tag, command)).encode())
    print(tag, until(tag))
for i, name in enumerate(["t/test1", "t/test6", "t/test8/test9", "t/r", "t/r/a"]):
    run("c%d" % i, "CREATE %s" % name)
    run("s%d" % i, "SUBSCRIBE %s" % name)
run("d1", "DELETE t/test6")
run("d2", "DELETE t/test8/test9")
run("l1", 'LIST (SUBSCRIBED) "" t/*')
run("l2", 'LIST (SUBSCRIBED RECURSIVEMATCH) "" t/%')
run("l3", 'LIST "" t/*')
run("l4", 'LSUB "" t/*')
run("r1", "RENAME t/r t/q")
run("l5", 'LSUB "" t/*')
run("u1", "UNSUBSCRIBE t/test6")
run("u2", "UNSUBSCRIBE t/test6")
run("l6", 'LIST (SUBSCRIBED) "" t/*')
"#,
    );
    let line = |tag: &str| out.lines().find(|l| l.starts_with(&format!("{tag} "))).unwrap_or_default().to_string();
    let subscribed = line("l1");
    assert!(subscribed.contains(r#"* LIST (\\NonExistent \\Subscribed \\HasNoChildren) "/" t/test6"#), "{subscribed}");
    assert!(subscribed.contains(r#"* LIST (\\Subscribed \\HasNoChildren) "/" t/test1"#), "{subscribed}");
    assert!(subscribed.contains(r#"(\\NonExistent \\Subscribed \\HasNoChildren) "/" t/test8/test9"#), "{subscribed}");
    let recursive = line("l2");
    assert!(
        recursive.contains(r#"* LIST (\\NonExistent \\HasNoChildren) "/" t/test8 ("CHILDINFO" ("SUBSCRIBED"))"#),
        "a deleted subscribed child still counts: {recursive}"
    );
    let plain = line("l3");
    assert!(!plain.contains("test6") && !plain.contains("test9") && plain.contains("t/test1"), "{plain}");
    let lsub = line("l4");
    assert!(lsub.contains(r#"* LSUB (\\Noselect) "/" t/test6"#) && lsub.contains("t/test1"), "{lsub}");
    let renamed = line("l5");
    assert!(
        renamed.contains(r#""/" t/q/a"#) && renamed.contains(r#""/" t/q'"#) && !renamed.contains("t/r"),
        "{renamed}"
    );
    assert!(line("u1").contains("u1 OK"), "{out}");
    assert!(line("u2").contains("u2 NO"), "neither subscribed nor a mailbox: {out}");
    let after = line("l6");
    assert!(!after.contains("test6") && after.contains("t/test1"), "{after}");
}
