//! CONDSTORE and QRESYNC (RFC 7162), driven by Python's imaplib against the real daemon: a flag
//! change one session makes is seen by another through CHANGEDSINCE and SEARCH MODSEQ; a
//! conditional STORE that lost the race gets MODIFIED; a client that comes back with QRESYNC
//! learns what another session expunged (VANISHED (EARLIER)); a store migrated to schema 10 serves
//! all of it; and each kind of bad input gets the BAD the RFC names.

mod common;

use common::{Daemon, imaplib};

/// Helpers on top of `common`'s prelude. `cmd` runs one command through imaplib (so the command
/// line and the responses are imaplib's), and returns the tagged result and the untagged responses
/// by kind, decoded; a BAD comes back as typ "BAD" rather than an exception.
const PRELUDE: &str = r#"
def cmd(m, name, *args):
    m.untagged_responses.clear()
    try:
        typ, data = m._simple_command(name, *args)
    except imaplib.IMAP4.error as e:
        return "BAD", str(e), {}
    got = {k: [x.decode() if isinstance(x, bytes) else x for x in v] for k, v in m.untagged_responses.items()}
    m.untagged_responses.clear()
    text = data[-1].decode() if data and isinstance(data[-1], bytes) else str(data)
    return typ, text, got
def put(m, n):
    for i in range(n):
        m.append("INBOX", None, None, ("Subject: message %d\r\n\r\nbody %d\r\n" % (i + 1, i + 1)).encode())
def select(m, *args):
    typ, text, got = cmd(m, "SELECT", "INBOX", *args)
    assert typ == "OK", (typ, text)
    m.state = "SELECTED"
    return got
"#;

fn run(daemon: &Daemon, script: &str) -> String {
    imaplib(daemon, &format!("{PRELUDE}{script}"))
}

fn line<'a>(out: &'a str, key: &str) -> &'a str {
    out.lines().find(|l| l.starts_with(&format!("{key} "))).unwrap_or_else(|| panic!("no {key} line in:\n{out}"))
}

/// RFC 7162 §3.1.4.1, §3.1.5, §3.1.6: session B flags a message; session A, which selected with
/// CONDSTORE, asks what changed since its HIGHESTMODSEQ and gets exactly that message with its new
/// MODSEQ; SEARCH MODSEQ finds it and names the highest mod-sequence, as SORT and ESEARCH do; STATUS
/// reports it.
#[test]
fn a_flag_change_is_seen_through_changedsince_from_a_second_session() {
    let daemon = Daemon::start();
    let out = run(
        &daemon,
        r#"
a = login(); b = login()
put(a, 3)
got = select(a, "(CONDSTORE)")
h = int(got["HIGHESTMODSEQ"][0])
print("SELECT", h)
b.select("INBOX")
b.store("2", "+FLAGS", "(\\Flagged)")
typ, text, got = cmd(a, "FETCH", "1:*", "(FLAGS)", "(CHANGEDSINCE %d)" % h)
print("CHANGED", typ, got.get("FETCH"))
typ, text, got = cmd(a, "UID", "FETCH", "1:*", "(UID)", "(CHANGEDSINCE %d)" % (h + 1))
print("NOTHING", typ, got.get("FETCH"))
typ, text, got = cmd(a, "SEARCH", "MODSEQ", str(h + 1))
print("SEARCH", typ, got.get("SEARCH"))
typ, text, got = cmd(a, "SORT", "(REVERSE SUBJECT)", "UTF-8", "MODSEQ", "1")
print("SORT", typ, got.get("SORT"))
for opts in ["(ALL)", "(MIN)"]:
    typ, text, got = cmd(a, "SEARCH", "RETURN", opts, "MODSEQ", "1")
    print("ESEARCH", opts, typ, got.get("ESEARCH"))
typ, text, got = cmd(b, "STATUS", "INBOX", "(HIGHESTMODSEQ MESSAGES)")
print("STATUS", typ, got.get("STATUS"))
typ, caps = a.capability()
print("CAPS", caps[0].decode())
"#,
    );
    let h: u64 = line(&out, "SELECT")[7..].parse().unwrap();
    // A appended the messages and selected them first, so they are recent to it (RFC 3501 §2.3.2).
    let want = format!("CHANGED OK ['2 (FLAGS (\\\\Flagged \\\\Recent) MODSEQ ({}))']", h + 1);
    assert_eq!(line(&out, "CHANGED"), want, "only message 2, flagged, once");
    assert_eq!(line(&out, "NOTHING"), "NOTHING OK None", "nothing changed after it");
    assert_eq!(line(&out, "SEARCH"), format!("SEARCH OK ['2 (MODSEQ {})']", h + 1));
    // By subject ("message 1" to "message 3"): APPENDs in the same second would tie on ARRIVAL.
    assert_eq!(line(&out, "SORT"), format!("SORT OK ['3 2 1 (MODSEQ {})']", h + 1));
    // RFC 7162 §3.1.5 with ESEARCH: the highest of what is reported, all matches for ALL, the
    // first one's for MIN (message 1, the first APPEND: mod-sequence 2).
    assert!(line(&out, "ESEARCH (ALL)").ends_with(&format!("ALL 1:3 MODSEQ {}']", h + 1)), "{out}");
    assert!(line(&out, "ESEARCH (MIN)").ends_with("MIN 1 MODSEQ 2']"), "{out}");
    assert!(line(&out, "STATUS").contains(&format!("HIGHESTMODSEQ {}", h + 1)), "{out}");
    let caps = line(&out, "CAPS");
    assert!(caps.contains("CONDSTORE") && caps.contains("QRESYNC"), "{caps}");
}

/// RFC 7162 §3.1.3: both sessions read message 1's mod-sequence; B's conditional STORE wins, A's
/// (sent with the same UNCHANGEDSINCE) is refused with OK [MODIFIED 1] and changes nothing, even
/// with .SILENT, which still tells the stored message's new MODSEQ once CONDSTORE is on.
#[test]
fn a_conditional_store_that_lost_the_race_gets_modified() {
    let daemon = Daemon::start();
    let out = run(
        &daemon,
        r#"
a = login(); b = login()
put(a, 2)
select(a, "(CONDSTORE)"); select(b, "(CONDSTORE)")
typ, text, got = cmd(a, "FETCH", "1:2", "(MODSEQ)")
m = max(int(f.split("MODSEQ (")[1].rstrip("))")) for f in got["FETCH"])
print("READ", m)
typ, text, got = cmd(b, "STORE", "1", "(UNCHANGEDSINCE %d)" % m, "+FLAGS", "(\\Seen)")
print("WINNER", typ, text, got.get("FETCH"))
typ, text, got = cmd(a, "STORE", "1:2", "(UNCHANGEDSINCE %d)" % m, "+FLAGS.SILENT", "(\\Deleted)")
print("LOSER", typ, text, got.get("FETCH"))
typ, text, got = cmd(a, "UID", "STORE", "1", "(UNCHANGEDSINCE %d)" % m, "FLAGS", "(\\Answered)")
print("LOSER-UID", typ, text)
typ, data = a.fetch("1", "(FLAGS)")
print("FLAGS", data)
"#,
    );
    let m: u64 = line(&out, "READ")[5..].parse().unwrap();
    let winner = line(&out, "WINNER");
    assert!(winner.contains("OK") && !winner.contains("MODIFIED"), "{winner}");
    assert!(winner.contains(&format!("MODSEQ ({})", m + 1)), "B's store is the mailbox's next change: {winner}");
    let loser = line(&out, "LOSER");
    assert!(loser.contains("OK") && loser.contains("[MODIFIED 1]"), "{loser}");
    assert!(loser.contains(&format!("'2 (UID 2 MODSEQ ({}))'", m + 2)), "message 2 was stored, silently: {loser}");
    assert!(line(&out, "LOSER-UID").contains("[MODIFIED 1]"), "{out}");
    let flags = line(&out, "FLAGS");
    assert!(flags.contains("\\\\Seen") && !flags.contains("Deleted") && !flags.contains("Answered"), "{flags}");
}

/// RFC 7162 §3.2.5, §3.2.6, §3.2.10, §3.2.11: a client that knew the mailbox at (UIDVALIDITY,
/// HIGHESTMODSEQ) comes back after another session expunged and flagged: SELECT (QRESYNC ...)
/// gives VANISHED (EARLIER) with the expunged UID and a FETCH of the flagged one; UID FETCH
/// (CHANGEDSINCE ... VANISHED) says the same; a live expunge is VANISHED, not EXPUNGE; and the next
/// SELECT is preceded by OK [CLOSED].
#[test]
fn qresync_after_another_session_expunges_gives_vanished_earlier() {
    let daemon = Daemon::start();
    let out = run(
        &daemon,
        r#"
a = login()
put(a, 4)
typ, text, got = cmd(a, "ENABLE", "QRESYNC")
print("ENABLED", typ, got.get("ENABLED"))
got = select(a)
v, h = got["UIDVALIDITY"][0], got["HIGHESTMODSEQ"][0]
a.logout()
b = login(); b.select("INBOX")
b.store("2", "+FLAGS", "(\\Deleted)"); b.expunge()
b.store("2", "+FLAGS", "(\\Seen)")
c = login()
cmd(c, "ENABLE", "QRESYNC")
got = select(c, "(QRESYNC (%s %s 1:4))" % (v, h))
print("RESYNC", got.get("VANISHED"), got.get("FETCH"))
typ, text, got = cmd(c, "UID", "FETCH", "1:*", "(FLAGS)", "(CHANGEDSINCE %s VANISHED)" % h)
print("UIDFETCH", typ, got.get("VANISHED"), got.get("FETCH"))
b.store("3", "+FLAGS", "(\\Deleted)"); b.expunge()
typ, text, got = cmd(c, "NOOP")
print("LIVE", got.get("VANISHED"), got.get("EXPUNGE"))
typ, text, got = cmd(c, "EXAMINE", "INBOX")
print("CLOSED", "CLOSED" in got, got.get("EXISTS"))
"#,
    );
    assert!(line(&out, "ENABLED").contains("QRESYNC"), "{out}");
    let resync = line(&out, "RESYNC");
    assert!(resync.contains("['(EARLIER) 2']"), "UID 2 vanished: {resync}");
    assert!(resync.contains("UID 3") && resync.contains("\\\\Seen"), "UID 3 was flagged: {resync}");
    assert!(!resync.contains("UID 1") && !resync.contains("UID 4"), "only what changed: {resync}");
    let fetch = line(&out, "UIDFETCH");
    assert!(fetch.contains("['(EARLIER) 2']") && fetch.contains("UID 3") && !fetch.contains("UID 1"), "{fetch}");
    assert_eq!(line(&out, "LIVE"), "LIVE ['4'] None", "VANISHED instead of EXPUNGE");
    assert_eq!(line(&out, "CLOSED"), "CLOSED True ['2']");
}

/// Each kind of bad input gets a BAD (RFC 7162 §3.1.4.1 and §7: a mod-sequence is a positive
/// number, so CHANGEDSINCE 0 or a word is a syntax error; §3.2.5: QRESYNC before ENABLE QRESYNC;
/// §3.2.6: VANISHED outside UID FETCH, without CHANGEDSINCE, or before ENABLE QRESYNC), and the
/// session goes on.
#[test]
fn bad_condstore_and_qresync_input_gets_bad() {
    let daemon = Daemon::start();
    let out = run(
        &daemon,
        r#"
a = login()
put(a, 1)
for name, args in [
    ("QRESYNC-UNENABLED", ("SELECT", "INBOX", "(QRESYNC (1 1))")),
]:
    print(name, *cmd(a, *args)[:2])
select(a)
for name, args in [
    ("ZERO", ("FETCH", "1", "(FLAGS)", "(CHANGEDSINCE 0)")),
    ("WORD", ("FETCH", "1", "(FLAGS)", "(CHANGEDSINCE soon)")),
    ("UNCHANGED-WORD", ("STORE", "1", "(UNCHANGEDSINCE x)", "+FLAGS", "(\\Seen)")),
    ("VANISHED-UNENABLED", ("UID", "FETCH", "1:*", "(FLAGS)", "(CHANGEDSINCE 1 VANISHED)")),
]:
    print(name, *cmd(a, *args)[:2])
a.logout()
b = login()
cmd(b, "ENABLE", "QRESYNC")
select(b)
for name, args in [
    ("VANISHED-SEQ", ("FETCH", "1", "(FLAGS)", "(CHANGEDSINCE 1 VANISHED)")),
    ("VANISHED-ALONE", ("UID", "FETCH", "1:*", "(FLAGS)", "(VANISHED)")),
    ("STILL-FINE", ("UID", "FETCH", "1:*", "(FLAGS)", "(CHANGEDSINCE 1 VANISHED)")),
]:
    print(name, *cmd(b, *args)[:2])
"#,
    );
    for bad in
        ["QRESYNC-UNENABLED", "ZERO", "WORD", "UNCHANGED-WORD", "VANISHED-UNENABLED", "VANISHED-SEQ", "VANISHED-ALONE"]
    {
        assert!(line(&out, bad).starts_with(&format!("{bad} BAD")), "{bad} must be BAD:\n{out}");
    }
    assert!(line(&out, "QRESYNC-UNENABLED").contains("ENABLE QRESYNC"), "{out}");
    assert!(line(&out, "STILL-FINE").starts_with("STILL-FINE OK"), "{out}");
}

/// A store written by the schema-8 binary (`crates/nightmail-store/tests/fixtures/schema8/`) is
/// migrated to schema 10 at start-up: its mail starts at mod-sequence 1, the first change takes
/// 2, and `nightmail check` still finds the store whole.
#[test]
fn a_migrated_store_serves_mod_sequences() {
    let fixture = concat!(env!("CARGO_MANIFEST_DIR"), "/../nightmail-store/tests/fixtures/schema8");
    let daemon = Daemon::start_with(|dir| {
        let store = dir.join("data/store");
        std::fs::create_dir_all(&store).unwrap();
        for file in ["conf", "db"] {
            std::fs::copy(format!("{fixture}/{file}"), store.join(file)).unwrap();
        }
        common::config(dir, "")
    });
    let out = run(
        &daemon,
        r#"
a = login()
got = select(a, "(CONDSTORE)")
print("HIGHEST", got["HIGHESTMODSEQ"][0])
typ, text, got = cmd(a, "FETCH", "1:*", "(MODSEQ)")
print("MODSEQS", got["FETCH"])
typ, text, got = cmd(a, "STORE", "1", "+FLAGS", "(\\Flagged)")
print("STORED", typ, got.get("FETCH"))
typ, text, got = cmd(a, "FETCH", "1:*", "(UID)", "(CHANGEDSINCE 1)")
print("CHANGED", got.get("FETCH"))
"#,
    );
    assert_eq!(line(&out, "HIGHEST"), "HIGHEST 1");
    assert!(line(&out, "MODSEQS").contains("'1 (MODSEQ (1))'"), "{out}");
    assert!(line(&out, "STORED").contains("MODSEQ (2)"), "{out}");
    assert!(line(&out, "CHANGED").starts_with("CHANGED ['1 (UID 1 MODSEQ (2))']"), "{out}");
    let check = daemon.cli(&["check"]);
    assert!(check.status.success(), "{}", String::from_utf8_lossy(&check.stdout));
}
