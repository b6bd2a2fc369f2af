//! NOTIFY (RFC 5465) against the real daemon: one session asks to be told, another (Python's
//! imaplib) changes mailboxes, and the first must receive the exact unsolicited responses, with no
//! command of its own in progress, in IDLE, and for its selected mailbox; each kind of bad NOTIFY
//! gets the response the RFC names.

mod common;

use common::{Daemon, imaplib};

/// A reader of one raw connection that waits for a line up to a deadline (`select`), so a test
/// waits for the response it names and fails with what it saw instead, never sleeping.
const PRELUDE: &str = r#"
import select, time, re
class Conn:
    def __init__(self, rcvbuf=None):
        self.s = socket.socket()
        if rcvbuf:
            self.s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        self.s.connect(("127.0.0.1", PORT)); self.buf = b""
        self.line(10)
        self.cmd("a", "LOGIN me \"%s\"" % os.environ["PASSWORD"])
    def line(self, limit):
        deadline = time.monotonic() + limit
        while b"\r\n" not in self.buf:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self.s], [], [], left)[0]:
                return None
            data = self.s.recv(65536)
            if not data:
                return None
            self.buf += data
        line, self.buf = self.buf.split(b"\r\n", 1)
        return line.decode(errors="replace")
    def send(self, text):
        self.s.sendall(text.encode() + b"\r\n")
    def cmd(self, tag, text):
        self.send(tag + " " + text)
        seen = []
        while True:
            line = self.line(20)
            if line is None:
                raise SystemExit("no reply to %s %s; saw %r" % (tag, text, seen))
            seen.append(line)
            if line.startswith(tag + " "):
                return seen
    def expect(self, want, limit=10, prefix=False):
        """Reads until the line `want` (or one starting with it) arrives; every line read on the
        way is returned."""
        seen = []
        while True:
            line = self.line(limit)
            if line is None:
                raise SystemExit("never got %r; saw %r" % (want, seen))
            seen.append(line)
            if line == want or (prefix and line.startswith(want)):
                return seen
def validity(m, name):
    typ, data = m.status(name, "(UIDVALIDITY)")
    return int(re.search(rb"UIDVALIDITY (\d+)", data[0]).group(1))
"#;

fn run(daemon: &Daemon, script: &str) -> String {
    imaplib(daemon, &format!("{PRELUDE}{script}"))
}

/// RFC 5465 §3.1 STATUS, §5.2-§5.5: the initial STATUS of a watched mailbox, then STATUS for new
/// mail, a flag change and an expunge in it, and LIST for a mailbox created, renamed, subscribed
/// and deleted, all by another session while the watching one sends nothing; then the same in
/// IDLE; after NOTIFY NONE nothing more.
#[test]
fn a_watching_session_is_told_of_other_mailboxes_as_they_change() {
    let daemon = Daemon::start();
    let out = run(
        &daemon,
        r#"
b = login()
v = validity(b, "Sent")
a = Conn()
got = a.cmd("n", "NOTIFY SET STATUS (personal (MessageNew MessageExpunge FlagChange MailboxName SubscriptionChange))")
assert "* STATUS Sent (MESSAGES 0 UIDNEXT 1 UIDVALIDITY %d HIGHESTMODSEQ 1)" % v in got, got
assert got[-1] == "n OK NOTIFY completed", got
b.append("Sent", None, None, b"Subject: one\r\n\r\nbody\r\n")
a.expect("* STATUS Sent (MESSAGES 1 UIDNEXT 2 UIDVALIDITY %d HIGHESTMODSEQ 2)" % v)
b.select("Sent")
b.store("1", "+FLAGS", "(\\Flagged)")
a.expect("* STATUS Sent (MESSAGES 1 UIDNEXT 2 UIDVALIDITY %d HIGHESTMODSEQ 3)" % v)
b.store("1", "+FLAGS", "(\\Deleted)")
b.expunge()
a.expect("* STATUS Sent (MESSAGES 0 UIDNEXT 2 UIDVALIDITY %d HIGHESTMODSEQ 5)" % v)
b.create("Lists")
a.expect('* LIST () "/" Lists')
b.rename("Lists", "Folders")
a.expect('* LIST () "/" Folders ("OLDNAME" (Lists))')
b.subscribe("Folders")
a.expect('* LIST (\\Subscribed) "/" Folders')
b.delete("Folders")
a.expect('* LIST (\\NonExistent) "/" Folders')
a.send("i IDLE")
a.expect("+ idling")
b.append("Drafts", None, None, b"Subject: two\r\n\r\nbody\r\n")
d = validity(b, "Drafts")
a.expect("* STATUS Drafts (MESSAGES 1 UIDNEXT 2 UIDVALIDITY %d HIGHESTMODSEQ 2)" % d)
a.send("DONE")
a.expect("i OK IDLE terminated")
assert a.cmd("x", "NOTIFY NONE")[-1] == "x OK NOTIFY NONE completed"
b.append("Sent", None, None, b"Subject: three\r\n\r\nbody\r\n")
got = a.cmd("y", "NOOP")
assert not any(l.startswith("* STATUS") for l in got), got
print("DONE")
"#,
    );
    assert!(out.contains("DONE"), "{out}");
}

/// RFC 5465 §6: `subtree` names a mailbox and everything below it (a RENAME of it tells
/// each moved mailbox with its old name), `subscribed` only subscribed mailboxes; changes
/// elsewhere are not told (each `expect` sees no other line on the way).
#[test]
fn subtree_and_subscribed_filters_name_only_their_mailboxes() {
    let daemon = Daemon::start();
    let out = run(
        &daemon,
        r#"
b = login()
b.create("Lists")
b.create("Other")
a = Conn()
got = a.cmd("n", "NOTIFY SET (subtree Lists (MailboxName)) (subscribed (MessageNew MessageExpunge))")
assert got == ["n OK NOTIFY completed"], got
b.create("Other/x")
b.create("Lists/a")
assert a.expect('* LIST () "/" Lists/a') == ['* LIST () "/" Lists/a']
b.append("Other", None, None, b"Subject: unsubscribed\r\n\r\nbody\r\n")
b.append("Sent", None, None, b"Subject: subscribed\r\n\r\nbody\r\n")
v = validity(b, "Sent")
assert a.expect("* STATUS Sent (MESSAGES 1 UIDNEXT 2 UIDVALIDITY %d)" % v) == ["* STATUS Sent (MESSAGES 1 UIDNEXT 2 UIDVALIDITY %d)" % v]
b.rename("Lists", "Groups")
seen = a.expect('* LIST () "/" Groups/a ("OLDNAME" (Lists/a))')
assert seen[0] == '* LIST () "/" Groups ("OLDNAME" (Lists))' and len(seen) == 2, seen
print("DONE")
"#,
    );
    assert!(out.contains("DONE"), "{out}");
}

/// RFC 5465 §6.1, §5.2: with `selected` events the selected mailbox's changes are pushed while
/// the client sends nothing (EXISTS and MessageNew's FETCH items for new mail, EXPUNGE), and it
/// gets no STATUS of its own; a filter naming other mailboxes, here `mailboxes Drafts`, sees
/// only those; without FlagChange (§5.1) no flag change is told, with it one is. With
/// `selected-delayed` an expunge waits for a command that allows it
/// while new mail is still pushed.
#[test]
fn the_selected_mailbox_is_pushed_and_selected_delayed_holds_expunges() {
    let daemon = Daemon::start();
    let out = run(
        &daemon,
        r#"
b = login()
a = Conn()
a.cmd("s", "SELECT INBOX")
got = a.cmd("n", "NOTIFY SET (selected (MessageNew (UID FLAGS) MessageExpunge)) (mailboxes Drafts (MessageNew MessageExpunge))")
assert got[-1] == "n OK NOTIFY completed", got
b.append("INBOX", None, None, b"Subject: one\r\n\r\nbody\r\n")
seen = a.expect("* 1 FETCH (UID 1 FLAGS (\\Recent))")
assert "* 1 EXISTS" in seen, seen
b.append("Sent", None, None, b"Subject: elsewhere\r\n\r\nbody\r\n")
b.append("Drafts", None, None, b"Subject: draft\r\n\r\nbody\r\n")
seen = a.expect("* STATUS Drafts (MESSAGES 1 UIDNEXT 2 UIDVALIDITY %d)" % validity(b, "Drafts"))
assert not any("Sent" in l or "INBOX" in l for l in seen), seen
b.select("INBOX")
b.store("1", "+FLAGS", "(\\Flagged)")
b.store("1", "+FLAGS", "(\\Deleted)")
b.expunge()
seen = a.expect("* 1 EXPUNGE")
assert not any("FETCH" in l for l in seen), ("no FlagChange asked, no flags told", seen)
got = a.cmd("d", "NOTIFY SET (selected-delayed (MessageNew MessageExpunge))")
assert got[-1] == "d OK NOTIFY completed", got
b.append("INBOX", None, None, b"Subject: two\r\n\r\nbody\r\n")
a.expect("* 1 EXISTS")
b.append("INBOX", None, None, b"Subject: three\r\n\r\nbody\r\n")
a.expect("* 2 EXISTS")
b.select("INBOX")
b.store("1", "+FLAGS", "(\\Deleted)")
b.expunge()
# Pushed new mail shows the expunge was held: the view still has both messages.
b.append("INBOX", None, None, b"Subject: four\r\n\r\nbody\r\n")
seen = a.expect("* 3 EXISTS")
assert not any(l.endswith("EXPUNGE") for l in seen), seen
got = a.cmd("z", "NOOP")
assert "* 1 EXPUNGE" in got, got
assert a.cmd("f", "NOTIFY SET (selected (MessageNew MessageExpunge FlagChange))")[-1] == "f OK NOTIFY completed"
b.store("1", "+FLAGS", "(\\Seen)")
a.expect("* 1 FETCH (FLAGS (\\Seen", prefix=True)
print("DONE")
"#,
    );
    assert!(out.contains("DONE"), "{out}");
}

/// RFC 5465 §5.8: a session that falls behind (here blocked writing FETCH output to a client that
/// does not read, while another session makes more changes than the feed keeps) is told
/// `* OK [NOTIFICATIONOVERFLOW]` once it can be, and NOTIFY is off: a later change is not told.
#[test]
fn a_session_that_falls_behind_gets_notificationoverflow() {
    let daemon = Daemon::start();
    let out = run(
        &daemon,
        r#"
b = login()
b.append("INBOX", None, None, b"Subject: big\r\n\r\n" + b"x" * 90000 + b"\r\n")
b.append("Drafts", None, None, b"Subject: small\r\n\r\nbody\r\n")
a = Conn(rcvbuf=4096)
a.cmd("s", "SELECT INBOX")
assert a.cmd("n", "NOTIFY SET (personal (MessageNew MessageExpunge FlagChange))")[-1] == "n OK NOTIFY completed"
# About 12 MB of output the client does not read: the session blocks writing it.
a.s.sendall(b"".join(b"f%d FETCH 1 BODY.PEEK[]\r\n" % i for i in range(130)))
r = Conn()
r.cmd("d", "SELECT Drafts")
r.s.sendall(b"".join(b"t%d STORE 1 %sFLAGS (\\Flagged)\r\n" % (i, b"+-"[i % 2:i % 2 + 1]) for i in range(1200)))
r.expect("t1199 OK STORE completed", 60)
a.expect("f129 OK FETCH completed", 60)
a.expect("* OK [NOTIFICATIONOVERFLOW] NOTIFY is off: too many changes at once")
b.append("Drafts", None, None, b"Subject: later\r\n\r\nbody\r\n")
got = a.cmd("z", "NOOP")
assert not any(l.startswith("* STATUS") for l in got), got
print("DONE")
"#,
    );
    assert!(out.contains("DONE"), "{out}");
}

/// RFC 5465 §3.1, §5, §6.1, §8: what NOTIFY refuses, and how. Events this server does not offer
/// (AnnotationChange needs METADATA; an unknown event-ext) get NO [BADEVENT (the ones it does)];
/// a broken grammar, an unknown filter, MessageNew without MessageExpunge or FlagChange alone for
/// the selected mailbox (§5), two selected groups or a mailbox event for the selected mailbox
/// (§6.1), and FETCH items outside the selected group get BAD. NOTIFY is advertised.
#[test]
fn bad_notify_commands_get_the_rfc_responses() {
    let daemon = Daemon::start();
    let out = run(
        &daemon,
        r#"
a = Conn()
caps = a.cmd("c", "CAPABILITY")
assert " NOTIFY" in caps[0], caps
BADEVENT = "NO [BADEVENT (MessageNew MessageExpunge FlagChange MailboxName SubscriptionChange)]"
for i, (command, want) in enumerate([
    ("NOTIFY SET (personal (MessageNew MessageExpunge AnnotationChange))", BADEVENT),
    ("NOTIFY SET (inboxes (MessageNew Frobnicate))", BADEVENT),
    ("NOTIFY SET (elsewhere (MessageNew MessageExpunge))", "BAD"),
    ("NOTIFY SET (selected (MessageNew))", "BAD"),
    ("NOTIFY SET (selected (MessageExpunge))", "BAD"),
    ("NOTIFY SET (selected (FlagChange))", "BAD"),
    ("NOTIFY SET (selected (MessageNew MessageExpunge)) (selected-delayed (MessageNew MessageExpunge))", "BAD"),
    ("NOTIFY SET (selected (MessageNew MessageExpunge MailboxName))", "BAD"),
    ("NOTIFY SET (personal (MessageNew (UID) MessageExpunge))", "BAD"),
    ("NOTIFY SET (selected (MessageNew (BOGUS) MessageExpunge))", "BAD"),
    ("NOTIFY SET (personal ())", "BAD"),
    ("NOTIFY SET (subtree (MessageNew))", "BAD"),
    ("NOTIFY SET", "BAD"),
    ("NOTIFY NONE extra", "BAD"),
    ("NOTIFY SOMETIMES", "BAD"),
]):
    got = a.cmd("t%d" % i, command)
    assert got[-1].startswith("t%d %s" % (i, want)), (command, got)
got = a.cmd("ok", "NOTIFY SET (selected (MessageNew (UID BODY.PEEK[HEADER.FIELDS (SUBJECT)]) MessageExpunge FlagChange)) (subtree (INBOX \"Ask\") (MailboxName)) (subscribed NONE)")
assert got[-1] == "ok OK NOTIFY completed", got
s = socket.create_connection(("127.0.0.1", PORT)); f = s.makefile("rb"); f.readline()
s.sendall(b"p NOTIFY NONE\r\n")
assert f.readline().startswith(b"p BAD"), "NOTIFY needs a login"
print("DONE")
"#,
    );
    assert!(out.contains("DONE"), "{out}");
}
