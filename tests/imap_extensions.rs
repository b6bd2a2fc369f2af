//! The IMAP extensions beyond RFC 3501 that issue 15 asks for, each driven by a real client:
//! LITERAL+ (RFC 7888) over a raw socket (imaplib never sends one), SORT and THREAD=REFERENCES
//! (RFC 5256) with Python's imaplib, which has `sort` and `thread`.

mod common;

use common::{Daemon, imaplib};

/// RFC 7888: LITERAL+ is advertised, `{n+}` is read without a continuation request, and one over
/// the literal limit is refused with BAD after its bytes, which are never taken for commands.
#[test]
fn literal_plus_appends_without_a_continuation_request() {
    let daemon = Daemon::start();
    let out = imaplib(
        &daemon,
        r#"
s, f = raw()
print("GREETING", f.readline().decode().strip())
s.sendall(("a LOGIN me \"%s\"\r\n" % os.environ["PASSWORD"]).encode()); until("a")
s.sendall(b"c CAPABILITY\r\n")
print("CAPS", until("c"))
msg = b"Subject: plus\r\n\r\nsent at once\r\n"
s.sendall(b"b APPEND INBOX {%d+}\r\n" % len(msg) + msg + b"\r\n")
print("APPEND", until("b"))
big = b"x" * 200000
s.sendall(b"d APPEND INBOX {%d+}\r\n" % len(big) + b"e NOOP\r\n" + big[8:] + b"\r\n")
print("BIG", until("d"))
s.sendall(b"f SELECT INBOX\r\n")
print("SELECT", until("f"))
"#,
    );
    assert!(out.contains("LITERAL+"), "{out}");
    let append = out.lines().find(|l| l.starts_with("APPEND")).unwrap();
    assert!(!append.contains("'+ "), "no continuation request: {append}");
    assert!(append.contains("b OK [APPENDUID"), "{append}");
    let big = out.lines().find(|l| l.starts_with("BIG")).unwrap();
    assert!(big.contains("d BAD"), "{big}");
    assert!(!big.contains("e OK"), "bytes inside the literal are not a command: {big}");
    assert!(out.contains("* 1 EXISTS"), "only the small message was stored: {out}");
}

const THREADED: &str = r#"
m = login()
arrival = iter([1772704800, 1772701200, 1772708400, 1772712000, 1772715600, 1772719200])
def put(mid, subject, date, frm, size=0, refs=None, irt=None):
    head = "Message-ID: <%s>\r\nSubject: %s\r\nDate: %s\r\nFrom: %s\r\nTo: me@nightmail.test\r\n" % (mid, subject, date, frm)
    if refs: head += "References: %s\r\n" % refs
    if irt: head += "In-Reply-To: %s\r\n" % irt
    # INTERNALDATE: 2 arrived an hour before 1, the rest an hour apart after them.
    m.append("INBOX", None, imaplib.Time2Internaldate(next(arrival)), (head + "\r\n" + "x" * size + "\r\n").encode())
# 1: a thread root; 2: unrelated, earliest; 3: reply to 1; 4: reply to 3 by In-Reply-To;
# 5: reply to a message that is not here (a dummy parent with one child is pruned);
# 6: same base subject as 2, no references (gathered with 2 by subject).
put("a@x", "Plans", "Mon, 02 Mar 2026 10:00:00 +0000", "carol@x.org", 300)
put("b@x", "Lunch", "Sun, 01 Mar 2026 09:00:00 +0000", "alice@x.org", 100)
put("c@x", "Re: Plans", "Mon, 02 Mar 2026 11:00:00 +0000", "bob@x.org", 50, refs="<a@x>")
put("d@x", "Re: Re: Plans", "Mon, 02 Mar 2026 12:00:00 +0000", "alice@x.org", 10, irt="<c@x>")
put("e@x", "Re: Gone", "Tue, 03 Mar 2026 08:00:00 +0000", "dave@x.org", 20, refs="<missing@x>")
put("f@x", "Re: Lunch", "Wed, 04 Mar 2026 08:00:00 +0000", "bob@x.org", 200)
m.select("INBOX")
for crit in ["(DATE)", "(REVERSE DATE)", "(SUBJECT DATE)", "(FROM)", "(SIZE)", "(ARRIVAL)", "(REVERSE ARRIVAL)"]:
    typ, data = m.sort(crit, "UTF-8", "ALL")
    print("SORT", crit, typ, data[0].decode())
typ, data = m.sort("(SIZE)", "UTF-8", "SUBJECT", "plans")
print("SORT-SEARCH", typ, data[0].decode())
typ, data = m.uid("SORT", "(REVERSE SIZE)", "UTF-8", "ALL")
print("UID-SORT", typ, data[0].decode())
typ, data = m.thread("REFERENCES", "UTF-8", "ALL")
print("THREAD", typ, data[0].decode())
typ, data = m.uid("THREAD", "REFERENCES", "UTF-8", "FROM", "alice")
print("UID-THREAD", typ, data[0].decode())
typ, data = m.sort("(DATE)", "X-UNKNOWN", "ALL")
print("BADCHARSET", typ, data)
typ, data = m.thread("ORDEREDSUBJECT", "UTF-8", "ALL")
print("ORDERED", typ, data)
typ, caps = m.capability()
print("CAPS", caps[0].decode())
"#;

/// RFC 5256 §3: SORT by sent date, base subject, first From mailbox, size and arrival, REVERSE,
/// with search criteria, as sequence numbers and as UIDs; ties go by mailbox order.
#[test]
fn sort_orders_by_each_key_with_search_criteria() {
    let daemon = Daemon::start();
    let out = imaplib(&daemon, THREADED);
    assert!(out.contains("SORT (DATE) OK 2 1 3 4 5 6"), "{out}");
    assert!(out.contains("SORT (REVERSE DATE) OK 6 5 4 3 1 2"), "{out}");
    // Base subjects: GONE (5), LUNCH (2, 6), PLANS (1, 3, 4).
    assert!(out.contains("SORT (SUBJECT DATE) OK 5 2 6 1 3 4"), "{out}");
    // From mailboxes: alice (2, 4), bob (3, 6), carol (1), dave (5); ties by sequence number.
    assert!(out.contains("SORT (FROM) OK 2 4 3 6 1 5"), "{out}");
    assert!(out.contains("SORT (SIZE) OK 4 5 3 2 6 1"), "{out}");
    assert!(out.contains("SORT (ARRIVAL) OK 2 1 3 4 5 6"), "{out}");
    assert!(out.contains("SORT (REVERSE ARRIVAL) OK 6 5 4 3 1 2"), "{out}");
    assert!(out.contains("SORT-SEARCH OK 4 3 1"), "{out}");
    assert!(out.contains("UID-SORT OK 1 6 2 3 5 4"), "{out}");
    assert!(out.contains("BADCHARSET NO [b'[BADCHARSET]"), "an unknown charset: {out}");
    let caps = out.lines().find(|l| l.starts_with("CAPS")).unwrap();
    assert!(caps.contains(" SORT") && caps.contains("THREAD=REFERENCES"), "{caps}");
    assert!(caps.contains("UTF8=ACCEPT") && caps.contains("ESORT") && caps.contains("BINARY"), "{caps}");
    assert!(caps.contains("COMPRESS=DEFLATE"), "{caps}");
}

/// RFC 5957 SORT=DISPLAY: DISPLAYFROM and DISPLAYTO sort on the first address's display name
/// (RFC 2047-decoded), else its addr-spec, case-insensitively; an unknown sort key gets BAD.
#[test]
fn sort_display_orders_by_display_name_else_address() {
    let daemon = Daemon::start();
    let out = imaplib(
        &daemon,
        r#"
m = login()
def put(frm, to):
    m.append("INBOX", None, None, ("From: %s\r\nTo: %s\r\nSubject: s\r\n\r\nbody\r\n" % (frm, to)).encode())
put("foo bar <a@b.c>", "Zed <z@x.org>")             # 1: FOO BAR / ZED
put("b@c.d", "=?utf-8?q?Anna?= <y@x.org>")          # 2: B@C.D / ANNA
put("\"\" <d@e.f>", "mike@x.org")                    # 3: empty name: D@E.F / MIKE@X.ORG
put("=?iso-8859-1?q?foo_aar?= <e@f.g>", "<c@x.org>")  # 4: FOO AAR / C@X.ORG
put("Foo Car <f@g.h>", "bob <q@x.org>")             # 5: FOO CAR / BOB
m.select("INBOX")
for crit in ["(DISPLAYFROM)", "(REVERSE DISPLAYFROM)", "(DISPLAYTO)", "(FROM)"]:
    typ, data = m.sort(crit, "UTF-8", "ALL")
    print("SORT", crit, typ, data[0].decode())
try:
    print("UNKNOWN", m.sort("(DISPLAYNAME)", "UTF-8", "ALL"))
except imaplib.IMAP4.error as e:
    print("UNKNOWN-ERR", e)
typ, caps = m.capability()
print("CAPS", caps[0].decode())
"#,
    );
    assert!(out.contains("SORT (DISPLAYFROM) OK 2 3 4 1 5"), "{out}");
    assert!(out.contains("SORT (REVERSE DISPLAYFROM) OK 5 1 4 3 2"), "{out}");
    assert!(out.contains("SORT (DISPLAYTO) OK 2 5 4 3 1"), "{out}");
    // FROM sorts on the mailbox part only: a, b, d, e, f.
    assert!(out.contains("SORT (FROM) OK 1 2 3 4 5"), "{out}");
    assert!(out.contains("UNKNOWN-ERR SORT command error: BAD"), "an unknown sort key: {out}");
    let caps = out.lines().find(|l| l.starts_with("CAPS")).unwrap();
    assert!(caps.contains(" SORT ") && caps.contains(" SORT=DISPLAY"), "{caps}");
}

/// RFC 5256 §4 THREAD=REFERENCES: References and In-Reply-To link replies under their parents, a
/// missing parent leaves its only child at the top, a reply with the same base subject goes under
/// the thread it names, and threads are ordered by sent date; and THREAD=ORDEREDSUBJECT.
#[test]
fn thread_references_and_orderedsubject() {
    let daemon = Daemon::start();
    let out = imaplib(&daemon, THREADED);
    // (2 6): Lunch and Re: Lunch gathered (6 is a reply, so a child of 2); (1 3 4): a chain;
    // (5): its parent is not here.
    assert!(out.contains("THREAD OK (2 6)(1 3 4)(5)"), "{out}");
    // Only alice's messages (UIDs 2 and 4): 4's parent 3 is not among them.
    assert!(out.contains("UID-THREAD OK (2)(4)"), "{out}");
    // ORDEREDSUBJECT: by base subject, the first message (by date) the parent of the others.
    assert!(out.contains("ORDERED OK [b'(2 6)(1 (3)(4))(5)']"), "{out}");
}

/// RFC 4731 ESEARCH (and RFC 5267 ESORT): SEARCH RETURN (MIN MAX COUNT ALL) answers in one ESEARCH line tagged with
/// the command's tag, `()` means ALL, no match leaves out all but COUNT, and the tagged OK comes
/// whether or not another command is pipelined behind it.
#[test]
fn esearch_returns_min_max_count_and_all() {
    let daemon = Daemon::start();
    let out = imaplib(
        &daemon,
        r#"
m = login()
for i in range(1, 7):
    m.append("INBOX", r"(\Seen)" if i in (2, 4, 5) else None, None, b"Subject: s%d\r\n\r\nbody\r\n" % i)
m.select("INBOX")
for ret in ["(MIN MAX COUNT ALL)", "()", "(COUNT)"]:
    typ, data = m._simple_command("SEARCH", "RETURN", ret, "SEEN")
    print("ESEARCH", ret, typ, m.untagged_responses.pop("ESEARCH", None))
typ, data = m._simple_command("UID", "SEARCH", "RETURN", "(MIN ALL)", "UNSEEN")
print("UID", typ, m.untagged_responses.pop("ESEARCH", None))
typ, data = m._simple_command("SORT", "RETURN", "(MIN MAX COUNT ALL)", "(REVERSE SUBJECT)", "UTF-8", "SEEN")
print("ESORT", typ, data, m.untagged_responses.pop("ESEARCH", None))
typ, data = m._simple_command("SEARCH", "RETURN", "(MIN MAX ALL COUNT)", "1000")
print("NONE", typ, m.untagged_responses.pop("ESEARCH", None))
typ, data = m._simple_command("SEARCH", "RETURN", "(SAVE)", "ALL")
print("SAVE", typ, m.untagged_responses.pop("ESEARCH", None))
s, f = raw()
f.readline()
s.sendall(("a LOGIN me \"%s\"\r\nb SELECT INBOX\r\nc SEARCH RETURN (COUNT) ALL\r\nd NOOP\r\n" % os.environ["PASSWORD"]).encode())
lines = []
while not lines or not lines[-1].startswith("d "):
    lines.append(f.readline().decode().strip())
print("PIPELINED", [l for l in lines if l.startswith(("* ESEARCH", "c ", "d "))])
"#,
    );
    // Every ESEARCH carries a TAG correlator (imaplib picks its own tags, e.g. PNCJ9).
    let tagged = out.lines().filter(|l| l.contains("[b'(TAG \"")).count();
    assert_eq!(tagged, 6, "{out}");
    assert!(out.contains(r#"") MIN 2 MAX 5 COUNT 3 ALL 2,4:5']"#), "{out}");
    assert!(out.contains("ALL 2,4:5']") && out.contains("ESEARCH () OK"), "{out}");
    assert!(out.contains(r#"ESEARCH (COUNT) OK"#) && out.contains(r#"") COUNT 3']"#), "{out}");
    assert!(out.contains(r#"") UID MIN 1 ALL 1,3,6']"#), "{out}");
    assert!(out.contains("NONE OK") && out.contains(r#"") COUNT 0']"#), "{out}");
    assert!(out.contains("SAVE OK None"), "SAVE alone answers no ESEARCH (RFC 5182 §2.4): {out}");
    // RFC 5267 ESORT: MIN and MAX are the first and last in sort order, ALL is in that order.
    assert!(
        out.contains("ESORT OK [b'SORT completed']") && out.contains(r#"") MIN 5 MAX 2 COUNT 3 ALL 5,4,2']"#),
        "{out}"
    );
    assert!(
        out.contains(r#"PIPELINED ['* ESEARCH (TAG "c") COUNT 6', 'c OK SEARCH completed', 'd OK NOOP completed']"#),
        "{out}"
    );
}

/// RFC 3516 BINARY: APPEND of a literal8 with Content-Transfer-Encoding binary (stored as base64,
/// so BODY[1] has no NUL), BINARY[1] and BINARY.SIZE[1] give the decoded bytes (a literal8 when
/// they hold a NUL), a partial BINARY carries its origin, base64 and quoted-printable parts are
/// decoded, and an unknown encoding gets NO [UNKNOWN-CTE].
#[test]
fn binary_fetches_decoded_parts_and_appends_literal8() {
    let daemon = Daemon::start();
    let out = imaplib(
        &daemon,
        r#"
s, f = raw_login()
msg = (b"From: a@b.org\r\nContent-Type: application/octet-stream\r\n"
       b"Content-Transfer-Encoding: binary\r\n\r\n\x00-\xe4\r\n")
s.sendall(b"b APPEND INBOX ~{%d}\r\n" % len(msg))
print("CONT", f.readline()[:1])
s.sendall(msg + b"\r\n")
print("APPEND", until("b")[-1])
m = login()
mixed = (b"From: a@b.org\r\nMIME-Version: 1.0\r\nContent-Type: multipart/mixed; boundary=x\r\n\r\n"
         b"--x\r\nContent-Transfer-Encoding: base64\r\n\r\naGVs\r\nbG8=\r\n"
         b"--x\r\nContent-Transfer-Encoding: quoted-printable\r\n\r\ncaf=C3=A9 =\r\nbar\r\n"
         b"--x\r\nContent-Transfer-Encoding: x-unknown\r\n\r\nzzz\r\n--x--\r\n")
m.append("INBOX", None, None, mixed)
m.select("INBOX")
typ, data = m.fetch("1", "(BINARY.SIZE[1] BINARY.PEEK[1])")
print("BIN1", typ, data)
typ, data = m.fetch("1", "(BODY.PEEK[1])")
print("BODY1", typ, data)
typ, data = m.uid("FETCH", "1", "(BINARY.PEEK[1]<1.2>)")
print("PARTIAL", typ, data)
typ, data = m.fetch("2", "(BINARY.PEEK[1] BINARY.PEEK[2] BINARY.SIZE[2])")
print("BIN2", typ, data)
typ, data = m.fetch("2", "(BINARY.PEEK[3])")
print("UNKNOWN", typ, data)
typ, caps = m.capability()
print("CAPS", caps[0].decode())
"#,
    );
    assert!(out.contains("CONT b'+'"), "literal8 gets a continuation: {out}");
    assert!(out.contains("b OK [APPENDUID"), "{out}");
    assert!(out.contains(r"BINARY.SIZE[1] 5 BINARY[1] ~{5}', b'\x00-\xe4\r\n')"), "{out}");
    assert!(out.contains(r"b'AC3kDQo=\r\n'"), "stored as base64: {out}");
    assert!(out.contains(r"BINARY[1]<1> {2}', b'-\xe4'"), "{out}");
    assert!(out.contains("UID 1"), "UID FETCH's partial response carries the UID: {out}");
    // The CRLF before a boundary is the boundary's (RFC 2046 §5.1.1); "=" CRLF is a soft break.
    assert!(out.contains(r"b'hello'") && out.contains(r"b'caf\xc3\xa9 bar'"), "{out}");
    assert!(out.contains("BINARY.SIZE[2] 9"), "{out}");
    assert!(out.contains("UNKNOWN NO [b'[UNKNOWN-CTE]"), "{out}");
    assert!(out.contains(" BINARY"), "{out}");
}

/// RFC 6855 UTF8=ACCEPT: after ENABLE, mailbox names are UTF-8 both ways (quoted, no modified
/// UTF-7) and APPEND takes `UTF8 (literal8)`; a session that did not enable it still sees the
/// modified UTF-7 name. imaplib enables it and quotes UTF-8; its UTF8 APPEND puts `UTF8 (` inside
/// the literal (not RFC 6855), so that one goes over a raw socket.
#[test]
fn utf8_accept_names_and_append() {
    let daemon = Daemon::start();
    let out = imaplib(
        &daemon,
        r#"
m = login()
typ, data = m.enable("UTF8=ACCEPT")
print("ENABLE", typ, m.untagged_responses.get("ENABLED"))
print("CREATE", m.create('"Entwürfe"'))
typ, data = m.list('""', '"Entw*"')
print("LIST", typ, [d.decode("utf-8") if isinstance(d, bytes) else d for d in data])
s, f = raw()
f.readline()
s.sendall(("a LOGIN me \"%s\"\r\nb ENABLE UTF8=ACCEPT\r\n" % os.environ["PASSWORD"]).encode()); until("b")
msg = "Subject: Grüße\r\nFrom: jörg@example.org\r\n\r\nHallo\r\n".encode()
s.sendall(b"c APPEND \"Entw\xc3\xbcrfe\" UTF8 (~{%d}\r\n" % len(msg))
print("CONT", f.readline()[:1])
s.sendall(msg + b")\r\n")
print("APPEND", until("c")[-1])
s.sendall("d STATUS \"Entwürfe\" (MESSAGES)\r\n".encode()); print("STATUS", until("d"))
plain = login()
typ, data = plain.list('""', "Entw*")
print("PLAIN", data)
"#,
    );
    assert!(out.contains("ENABLE OK [b'UTF8=ACCEPT']"), "{out}");
    assert!(out.contains("CREATE ('OK'"), "{out}");
    assert!(out.contains(r#""/" "Entwürfe""#), "the name in UTF-8: {out}");
    assert!(out.contains("CONT b'+'") && out.contains("c OK [APPENDUID"), "{out}");
    assert!(out.contains("(MESSAGES 1)"), "{out}");
    assert!(out.contains("Entw&APw-rfe"), "without ENABLE, modified UTF-7: {out}");
}

/// RFC 4978 COMPRESS=DEFLATE: after the tagged OK both directions are raw DEFLATE (Python's zlib
/// with wbits=-15), each response readable at once (sync flush), and a second COMPRESS gets
/// NO [COMPRESSIONACTIVE].
#[test]
fn compress_deflate_carries_the_session() {
    let daemon = Daemon::start();
    let out = imaplib(
        &daemon,
        r#"
import zlib
s, f = raw()
f.readline()
s.sendall(("a LOGIN me \"%s\"\r\nb COMPRESS DEFLATE\r\n" % os.environ["PASSWORD"]).encode())
until("a")
print("COMPRESS", f.readline().decode().strip())
deflate, inflate = zlib.compressobj(wbits=-15), zlib.decompressobj(wbits=-15)
s.settimeout(10)
got = b""
def command(text, tag):
    global got
    s.sendall(deflate.compress(text) + deflate.flush(zlib.Z_SYNC_FLUSH))
    while not (b"\r\n" + tag + b" ") in b"\r\n" + got:
        got += inflate.decompress(s.recv(65536))
    out, got = got, b""
    return out.decode()
msg = b"Subject: squeezed\r\n\r\n" + b"all work and no play " * 200 + b"\r\n"
print("APPEND", command(b"c APPEND INBOX {%d+}\r\n" % len(msg) + msg + b"\r\n", b"c").strip())
print("FETCH", command(b"d SELECT INBOX\r\ne FETCH 1 (BODY.PEEK[HEADER.FIELDS (SUBJECT)])\r\n", b"e").count("squeezed"))
print("AGAIN", command(b"g COMPRESS DEFLATE\r\n", b"g").strip())
"#,
    );
    assert!(out.contains("COMPRESS b OK"), "{out}");
    assert!(out.contains("APPEND c OK [APPENDUID"), "{out}");
    assert!(out.contains("FETCH 1"), "{out}");
    assert!(out.contains("AGAIN g NO [COMPRESSIONACTIVE]"), "{out}");
}

/// RFC 3502 MULTIAPPEND over a raw socket (imaplib sends one message per APPEND): three messages
/// in one APPEND, each literal after its own continuation request, stored in order with one
/// APPENDUID naming their UIDs; one empty message (NO), a syntax error in one message (BAD) or a
/// missing mailbox (NO [TRYCREATE]) stores none of them.
#[test]
fn multiappend_stores_all_messages_or_none() {
    let daemon = Daemon::start();
    let out = imaplib(
        &daemon,
        r#"
s, f = raw_login()
def multi(tag, mailbox, parts):
    s.sendall(("%s APPEND %s" % (tag, mailbox)).encode())
    for opts, body in parts:
        s.sendall(b"%s {%d}\r\n" % (opts, len(body)))
        line = f.readline().decode()
        if not line.startswith("+"):
            return [line.strip()] + until(tag)
        s.sendall(body)
    s.sendall(b"\r\n")
    return until(tag)
def mail(n):
    return b"Subject: m%d\r\n\r\nbody %d\r\n" % (n, n)
print("MULTI", multi("b", "INBOX", [(b" (\\Seen)", mail(1)), (b' "24-Mar-2007 23:00:00 +0200"', mail(2)), (b" (\\Flagged) \"25-Mar-2007 23:00:00 +0200\"", mail(3))]))
print("EMPTY", multi("c", "INBOX", [(b"", mail(4)), (b"", b"")]))
print("SYNTAX", multi("d", "INBOX", [(b"", mail(5)), (b" (\\Seen", mail(6))]))
print("MISSING", multi("e", "Nowhere", [(b"", mail(7)), (b"", mail(8))]))
# Each message is under the literal limit (100,000 bytes here), both together over the
# command's (the limit and 8 KiB).
s.settimeout(20)
print("TOOBIG", multi("t", "INBOX", [(b"", mail(9) + b"x" * 60000), (b"", mail(10) + b"y" * 60000)]))
s.sendall(b"g SELECT INBOX\r\n")
print("SELECT", until("g"))
s.sendall(b"h UID FETCH 1:* (FLAGS INTERNALDATE BODY.PEEK[HEADER.FIELDS (SUBJECT)])\r\n")
print("FETCH", until("h"))
s.sendall(b"i CAPABILITY\r\n")
print("CAPS", until("i"))
"#,
    );
    let line = |name: &str| out.lines().find(|l| l.starts_with(name)).unwrap_or_else(|| panic!("{out}")).to_string();
    let multi = line("MULTI");
    assert!(multi.contains("b OK [APPENDUID ") && multi.contains(" 1:3]"), "{multi}");
    assert!(line("EMPTY").contains("c NO"), "{out}");
    assert!(line("SYNTAX").contains("d BAD"), "{out}");
    assert!(line("MISSING").contains("e NO [TRYCREATE]"), "{out}");
    assert!(line("TOOBIG").contains("t BAD"), "{out}");
    assert!(line("SELECT").contains("* 3 EXISTS"), "only the first MULTIAPPEND stored anything: {out}");
    let fetch = line("FETCH");
    let subjects: Vec<&str> = fetch.match_indices("Subject: m").map(|(i, _)| &fetch[i + 10..i + 11]).collect();
    assert_eq!(subjects, ["1", "2", "3"], "stored in the order sent: {fetch}");
    // The printed list escapes each backslash.
    assert!(fetch.contains(r"UID 1 FLAGS (\\Seen"), "{fetch}");
    assert!(fetch.contains(r#"UID 2 FLAGS (\\Recent) INTERNALDATE "24-Mar-2007 21:00:00 +0000""#), "{fetch}");
    assert!(fetch.contains(r"UID 3 FLAGS (\\Flagged"), "{fetch}");
    assert!(line("CAPS").contains(" MULTIAPPEND"), "{out}");
}

/// RFC 5267 CONTEXT=SEARCH over a raw socket: PARTIAL ranges (either way round, NIL past the
/// end, BAD when not a range), a SEARCH RETURN (UPDATE) told of STORE and EXPUNGE by ADDTO and
/// REMOVEFROM (the expunged message by its number, before its EXPUNGE), CANCELUPDATE ending it,
/// and BAD for an unknown tag and for UPDATE on SORT.
#[test]
fn context_search_partial_update_and_cancel() {
    let daemon = Daemon::start();
    let out = imaplib(
        &daemon,
        r#"
m = login()
for n in range(5):
    m.append("INBOX", None, None, ("Subject: s%d\r\n\r\nbody\r\n" % n).encode())
m.logout()
s, f = raw_login()
def cmd(tag, text):
    s.sendall(("%s %s\r\n" % (tag, text)).encode())
    print(tag.upper(), until(tag))
cmd("b", "SELECT INBOX")
cmd("p1", "SEARCH RETURN (PARTIAL 2:4) ALL")
cmd("p2", "SEARCH RETURN (PARTIAL 4:2) 1:2,4:5")
cmd("p3", "UID SEARCH RETURN (PARTIAL 6:6) ALL")
cmd("p4", "SEARCH RETURN (PARTIAL 1) ALL")
cmd("u", "SEARCH RETURN (UPDATE) SEEN")
cmd("e", "STORE 1,2,4 +FLAGS.SILENT (\\Seen)")
cmd("f", "STORE 1 -FLAGS.SILENT (\\Seen)")
cmd("g", "STORE 4 +FLAGS.SILENT (\\Deleted)")
cmd("h", "EXPUNGE")
cmd("i", "CANCELUPDATE \"u\"")
cmd("j", "STORE 3 +FLAGS.SILENT (\\Seen)")
cmd("k", "CANCELUPDATE \"nope\"")
cmd("l", "SORT RETURN (UPDATE) (DATE) UTF-8 ALL")
cmd("c", "CAPABILITY")
"#,
    );
    let line = |name: &str| {
        out.lines().find(|l| l.starts_with(&format!("{name} "))).unwrap_or_else(|| panic!("{name}: {out}")).to_string()
    };
    assert!(line("P1").contains(r#"* ESEARCH (TAG "p1") PARTIAL (2:4 2:4)"#), "{out}");
    assert!(line("P2").contains(r#"* ESEARCH (TAG "p2") PARTIAL (2:4 2,4:5)"#), "{out}");
    assert!(line("P3").contains(r#"* ESEARCH (TAG "p3") UID PARTIAL (6:6 NIL)"#), "{out}");
    assert!(line("P4").contains("p4 BAD"), "{out}");
    assert!(line("U").contains(r#"'* ESEARCH (TAG "u")', 'u OK"#), "UPDATE alone returns no result: {out}");
    assert!(line("E").contains(r#"* ESEARCH (TAG "u") ADDTO (0 1:2,4)"#), "{out}");
    assert!(line("F").contains(r#"* ESEARCH (TAG "u") REMOVEFROM (0 1)"#), "{out}");
    assert!(!line("G").contains("ESEARCH"), "\\Deleted does not change SEEN: {out}");
    assert!(line("H").contains(r#"'* ESEARCH (TAG "u") REMOVEFROM (0 4)', '* 4 EXPUNGE'"#), "{out}");
    assert!(line("I").contains("i OK"), "{out}");
    assert!(!line("J").contains("ESEARCH"), "a cancelled search is not updated: {out}");
    assert!(line("K").contains("k BAD"), "{out}");
    assert!(line("L").contains("l BAD"), "{out}");
    assert!(line("C").contains(" CONTEXT=SEARCH"), "{out}");
}
