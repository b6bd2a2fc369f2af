//! Limits that hold against a user or a stranger trying to get around them: the daily relay quota
//! under parallel sessions, bytes that SMTP refuses and IMAP must survive, the store's file modes,
//! the login limiter, and the slots of sessions that never log in. Each test drives the real daemon
//! with real clients (smtplib, imaplib).

mod common;

use common::*;

/// `[relay]` towards a port where nothing listens: outside mail is queued and stays queued, so the
/// outbound entries are what the quota let through.
fn relay_to_nowhere(dir: &std::path::Path, quota: usize) -> String {
    config(
        dir,
        &format!(
            "[relay]\nhost = \"127.0.0.1\"\nport = 9\ntls = \"none\"\nmax_relay_recipients_per_user_per_day = {quota}\n"
        ),
    )
}

fn outbound_entries(daemon: &Daemon) -> usize {
    daemon.status()["outbound"].as_array().unwrap().len()
}

#[test]
fn parallel_sessions_of_one_user_relay_no_more_than_the_daily_quota() {
    let daemon = Daemon::start_with(|dir| relay_to_nowhere(dir, 200));
    // Ten sessions open their transactions together, each asks for 100 outside recipients, and
    // none sends DATA before every one has asked: the recipients held by open transactions
    // must count.
    let out = python(
        &daemon,
        r#"
import os, smtplib, threading
SESSIONS = 10
ready, asked = threading.Barrier(SESSIONS, timeout=60), threading.Barrier(SESSIONS, timeout=60)
accepted, sent, errors = [0] * SESSIONS, [None] * SESSIONS, []
def session(i):
    try:
        c = smtplib.SMTP("127.0.0.1", int(os.environ["SMTP"]))
        c.login("me", os.environ["PASSWORD"])
        c.mail("me@nightmail.test")
        ready.wait()
        # A client stops at the quota's permanent refusal, as it would at any 5xx RCPT.
        for j in range(100):
            if c.rcpt("r%d-%d@example.org" % (i, j))[0] != 250:
                break
            accepted[i] += 1
        asked.wait()
        if accepted[i]:
            sent[i] = c.data(b"From: me@nightmail.test\r\nSubject: many\r\n\r\nhello\r\n")[0]
        c.quit()
    except Exception as e:
        errors.append(repr(e))
threads = [threading.Thread(target=session, args=(i,)) for i in range(SESSIONS)]
for t in threads: t.start()
for t in threads: t.join()
assert not errors, errors
print(sum(accepted), sorted(set(code for code in sent if code is not None)))
"#,
    );
    assert_eq!(out.trim(), "200 [250]", "recipients accepted overall, and the DATA replies");
    assert_eq!(outbound_entries(&daemon), 200);
}

#[test]
fn a_held_place_in_the_quota_is_released_by_rset_and_by_a_dropped_connection() {
    let daemon = Daemon::start_with(|dir| relay_to_nowhere(dir, 2));
    let mut first = Raw::login(daemon.smtp);
    assert!(first.cmd("MAIL FROM:<me@nightmail.test>").starts_with("250"));
    assert!(first.cmd("RCPT TO:<a@example.org>").starts_with("250"));
    assert!(first.cmd("RCPT TO:<b@example.org>").starts_with("250"));
    let mut second = Raw::login(daemon.smtp);
    assert!(second.cmd("MAIL FROM:<me@nightmail.test>").starts_with("250"));
    let over = second.cmd("RCPT TO:<c@example.org>");
    assert!(over.starts_with("550 5.7.1 Daily relay quota reached"), "{over}");
    assert!(first.cmd("RSET").starts_with("250"));
    assert!(second.cmd("RCPT TO:<c@example.org>").starts_with("250"), "RSET released the first session's places");
    assert!(first.cmd("MAIL FROM:<me@nightmail.test>").starts_with("250"));
    assert!(first.cmd("RCPT TO:<a@example.org>").starts_with("250"));
    let over = first.cmd("RCPT TO:<b@example.org>");
    assert!(over.starts_with("550 5.7.1"), "{over}");
    second.hang_up();
    assert!(first.cmd("RCPT TO:<b@example.org>").starts_with("250"), "a vanished session's place is released");
    assert!(first.cmd("DATA").starts_with("354"));
    first.send(b"From: me@nightmail.test\r\nSubject: q\r\n\r\nx\r\n.\r\n");
    assert!(first.reply().starts_with("250"));
    assert_eq!(outbound_entries(&daemon), 2);
    let mut third = Raw::login(daemon.smtp);
    assert!(third.cmd("MAIL FROM:<me@nightmail.test>").starts_with("250"));
    assert!(third.cmd("RCPT TO:<d@example.org>").starts_with("550 5.7.1"), "the sent two count once stored");
}

/// Sends `message` (already dot-stuffed, without the final dot) to ann@ and returns the reply to
/// the end of DATA.
fn submit(daemon: &Daemon, message: &[u8]) -> String {
    let mut c = Raw::login(daemon.smtp);
    assert!(c.cmd("MAIL FROM:<me@nightmail.test>").starts_with("250"));
    assert!(c.cmd("RCPT TO:<ann@nightmail.test>").starts_with("250"));
    assert!(c.cmd("DATA").starts_with("354"));
    c.send(message);
    c.send(b"\r\n.\r\n");
    c.reply()
}

#[test]
fn smtp_refuses_nul_and_bare_cr_in_a_message_and_keeps_eight_bit() {
    let daemon = Daemon::start();
    let nul_header = submit(&daemon, b"From: me@nightmail.test\r\nSubject: a\0b\r\n\r\nbody");
    assert!(nul_header.starts_with("554 5.6.0 Line 2 holds a NUL byte"), "{nul_header}");
    let nul_body = submit(&daemon, b"From: me@nightmail.test\r\nSubject: x\r\n\r\nbody\0here");
    assert!(nul_body.starts_with("554 5.6.0 Line 4 holds a NUL byte"), "{nul_body}");
    let bare_cr = submit(&daemon, b"From: me@nightmail.test\r\nSubject: x\r\n\r\nx\r.\rRSET");
    assert!(bare_cr.starts_with("554 5.6.0 Line 4 holds a bare CR"), "{bare_cr}");
    let eight_bit = submit(&daemon, b"From: me@nightmail.test\r\nSubject: x\r\n\r\n8-bit \xe4\xff fine");
    assert!(eight_bit.starts_with("250 "), "{eight_bit}");
    let inbox = imaplib(&daemon, "print(login('ann').status('INBOX', '(MESSAGES)')[1][0].decode())");
    assert!(inbox.trim().ends_with("(MESSAGES 1)"), "only the 8-bit message was stored: {inbox}");
}

#[test]
fn unknown_local_parts_at_our_own_domains_are_refused_at_rcpt() {
    let daemon = Daemon::start_with(|dir| relay_to_nowhere(dir, 10));
    let mut c = Raw::login(daemon.smtp);
    assert!(c.cmd("MAIL FROM:<me@nightmail.test>").starts_with("250"));
    for nobody in ["nobody@nightmail.test", "NoBody@NIGHTMAIL.TEST"] {
        assert_eq!(c.cmd(&format!("RCPT TO:<{nobody}>")), "550 5.1.1 No such user or model here");
    }
    assert!(c.cmd("RCPT TO:<ann@nightmail.test>").starts_with("250"));
    assert!(c.cmd("RCPT TO:<kimi@nightmail.test>").starts_with("250"));
    assert!(c.cmd("RCPT TO:<someone@example.org>").starts_with("250"), "other domains are relayed");
    assert!(c.cmd("DATA").starts_with("354"));
    c.send(b"From: me@nightmail.test\r\nSubject: x\r\n\r\ny\r\n.\r\n");
    assert!(c.reply().starts_with("250"));
    let outbound = daemon.status()["outbound"].as_array().unwrap().clone();
    let recipients: Vec<&str> = outbound.iter().map(|o| o["recipient"].as_str().unwrap()).collect();
    assert_eq!(recipients, ["someone@example.org"], "nothing at our own domain went to the smarthost");
}

/// A message no client should send but a store may hold (APPEND takes a literal8 as it is):
/// NUL in the Subject and the first part, a bare CR, a bare LF, 8-bit octets; the second part
/// is clean.
const HOSTILE: &[u8] = b"From: Nul <nul@example.org>\r\nSubject: a\0b \xe4\xff\rc\r\n\
Content-Type: multipart/mixed; boundary=\"yy\"\r\n\r\n--yy\r\nContent-Type: text/plain; charset=utf-8\r\n\
Content-Transfer-Encoding: 8bit\r\n\r\nnul \0 bare\rcr lf\n8-bit \xe4\xff\x80\r\n--yy\r\n\
Content-Type: text/plain\r\n\r\nclean\r\n--yy--\r\n";

#[test]
fn every_fetch_of_a_stored_nul_bare_cr_and_eight_bit_message_answers_and_the_session_lives() {
    let daemon = Daemon::start();
    let hostile: String = HOSTILE.iter().map(|b| format!("{b:02x}")).collect();
    // Each FETCH prints its tagged reply's status, whether a literal8 came, and its text; the
    // session must answer every one and NOOP after.
    let out = imaplib(
        &daemon,
        &format!(
            r#"
hostile = bytes.fromhex("{hostile}")
s, f = raw_login()
s.sendall(b"b APPEND INBOX {{8}}\r\n"); f.readline(); s.sendall(b"x: y\r\n\r\n\r\n"); until("b")
s.sendall(b"c APPEND INBOX ~{{%d}}\r\n" % len(hostile)); f.readline(); s.sendall(hostile + b"\r\n")
assert until("c")[-1].startswith("c OK"), "APPEND"
s.sendall(b"d SELECT INBOX\r\n"); until("d")
def fetch(n, items):
    s.sendall(("t FETCH %s (%s)\r\n" % (n, items)).encode())
    raw = b""
    while True:
        line = f.readline()
        assert line, "the session ended on FETCH %s (%s)" % (n, items)
        raw += line
        if line.startswith(b"t "):
            break
    status = line.decode().split(" ")[1]
    print("%s %s|%s|%s|%s" % (n, items, status, b"~{{" in raw, line.decode().strip()))
    return raw
for items in ["BINARY.PEEK[]", "BINARY.PEEK[1]", "BINARY.PEEK[1]<0.6>", "BINARY.SIZE[1]", "BINARY.PEEK[2]",
              "BODY.PEEK[]", "BODY.PEEK[HEADER]", "BODY.PEEK[TEXT]", "BODY.PEEK[1]", "BODY.PEEK[1.MIME]",
              "BODY.PEEK[2]", "BODY.PEEK[HEADER.FIELDS (FROM)]", "BODY.PEEK[HEADER.FIELDS.NOT (FROM)]",
              "BODY.PEEK[]<0.10>", "RFC822", "RFC822.HEADER", "RFC822.TEXT", "RFC822.SIZE", "ENVELOPE",
              "BODY", "BODYSTRUCTURE"]:
    fetch("2", items)
print("first sent:", b"* 1 FETCH" in fetch("1:2", "BODY.PEEK[]"))
s.sendall(b"z NOOP\r\n"); print(until("z")[-1])
"#
        ),
    );
    let lines: Vec<&str> = out.lines().collect();
    let answer = |items: &str| -> (String, bool, String) {
        let line =
            lines.iter().find(|l| l.starts_with(&format!("2 {items}|"))).unwrap_or_else(|| panic!("{items}: {out}"));
        let mut parts = line.splitn(4, '|').skip(1);
        let status = parts.next().unwrap().to_string();
        let literal8 = parts.next().unwrap() == "True";
        (status, literal8, parts.next().unwrap().to_string())
    };
    // BINARY sends the NUL as a literal8 (RFC 3516 §4.2); the clean part as a literal.
    for items in ["BINARY.PEEK[]", "BINARY.PEEK[1]", "BINARY.PEEK[1]<0.6>"] {
        assert_eq!(answer(items).0, "OK", "{items}: {out}");
        assert!(answer(items).1, "{items} came as a literal8: {out}");
    }
    for items in ["BINARY.SIZE[1]", "BINARY.PEEK[2]", "BODY.PEEK[1.MIME]", "BODY.PEEK[2]"] {
        assert_eq!(answer(items), ("OK".into(), false, "t OK FETCH completed".to_string()), "{items}: {out}");
    }
    for items in
        ["BODY.PEEK[HEADER.FIELDS (FROM)]", "BODY.PEEK[]<0.10>", "RFC822.SIZE", "ENVELOPE", "BODY", "BODYSTRUCTURE"]
    {
        assert_eq!(answer(items).0, "OK", "{items}: {out}");
    }
    // Anything else with the NUL in it: a clean NO that names BINARY[].
    for items in [
        "BODY.PEEK[]",
        "BODY.PEEK[HEADER]",
        "BODY.PEEK[TEXT]",
        "BODY.PEEK[1]",
        "BODY.PEEK[HEADER.FIELDS.NOT (FROM)]",
        "RFC822",
        "RFC822.HEADER",
        "RFC822.TEXT",
    ] {
        let (status, _, text) = answer(items);
        assert_eq!(status, "NO", "{items}: {out}");
        assert!(text.contains("UID 2") && text.contains("BINARY[]"), "{items}: {text}");
    }
    // RFC 2180 §4.1.3's way: the messages that can be sent are, and the FETCH answers NO.
    assert!(out.contains("1:2 BODY.PEEK[]|NO") && out.contains("first sent: True"), "{out}");
    assert_eq!(lines.last().copied(), Some("z OK NOOP completed"), "{out}");
}

/// Every path under `dir` that its group or others may use, with its mode.
fn shared_paths(dir: &std::path::Path) -> Vec<String> {
    use std::os::unix::fs::PermissionsExt;
    let mut found = Vec::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(path) = pending.pop() {
        let meta = std::fs::symlink_metadata(&path).unwrap();
        let mode = meta.permissions().mode() & 0o7777;
        if mode & 0o077 != 0 {
            found.push(format!("{} {mode:o}", path.display()));
        }
        if meta.is_dir() {
            pending.extend(std::fs::read_dir(&path).unwrap().map(|e| e.unwrap().path()));
        }
    }
    found
}

#[test]
fn under_umask_022_the_data_dir_is_for_its_owner_alone_and_older_modes_are_repaired() {
    use std::os::unix::fs::PermissionsExt;
    let mut daemon = Daemon::start_with_umask("022", |dir| {
        config(dir, "").replace("max_message_bytes = 100000", "max_message_bytes = 400000")
    });
    // A message, a file of its own under store/messages/; large, as sled once kept such a one in
    // a blob file.
    let body = "a line of a long message, long enough for sled's blob files\r\n".repeat(3500);
    let reply = submit(&daemon, format!("From: me@nightmail.test\r\nSubject: big\r\n\r\n{body}").as_bytes());
    assert!(reply.starts_with("250 "), "{reply}");
    let data = daemon.data_dir();
    let shards = std::fs::read_dir(data.join("store/messages")).unwrap().count();
    assert!(shards > 0, "the message went to a file of its own");
    assert!(data.join("store/db").exists() && data.join("control.sock").exists());
    assert_eq!(shared_paths(&data), Vec::<String>::new(), "paths the umask left open to others");

    // A store an older build left readable by all is made private at the next start, and said so.
    daemon.stop();
    let mut pending = vec![data.clone()];
    while let Some(path) = pending.pop() {
        let dir = path.is_dir();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(if dir { 0o755 } else { 0o644 })).unwrap();
        if dir {
            pending.extend(std::fs::read_dir(&path).unwrap().map(|e| e.unwrap().path()));
        }
    }
    assert!(!shared_paths(&data).is_empty());
    daemon.restart();
    assert_eq!(shared_paths(&data), Vec::<String>::new(), "paths left open after the repair");
    let log = daemon.log();
    assert!(log.contains("made private"), "{log}");
}

/// The test configuration with `auth` keys added to `[auth]` and `imap` keys to `[imap]`.
fn with_keys(dir: &std::path::Path, auth: &str, imap: &str) -> String {
    config(dir, "")
        .replacen("[auth]\nfailure_delay_ms = 100\n", &format!("[auth]\nfailure_delay_ms = 100\n{auth}\n"), 1)
        .replacen("[imap]\nlisten = \"127.0.0.1:0\"\n", &format!("[imap]\nlisten = \"127.0.0.1:0\"\n{imap}\n"), 1)
}

#[test]
fn a_local_guesser_slows_only_wrong_answers_whatever_the_spelling_or_loopback_address() {
    let daemon = Daemon::start_with(|dir| with_keys(dir, "max_failures = 3\nfailure_window_secs = 3", ""));
    let out = imaplib(
        &daemon,
        r#"
import smtplib, threading, time
answered, three = [], threading.Event()
def guess():
    try:
        imaplib.IMAP4("127.0.0.1", PORT).login("me", "wrong")
    except imaplib.IMAP4.error:
        answered.append(time.time())
        if len(answered) == 3:
            three.set()
guessers = [threading.Thread(target=guess) for _ in range(7)]
for t in guessers: t.start()
three.wait(20)
# Seven guesses at once from 127.0.0.1: three answered, four held past the budget. The right
# password is answered at once all the same, over IMAP and SMTP.
began = time.time()
imaplib.IMAP4("127.0.0.1", PORT).login("me", os.environ["PASSWORD"])
smtp = smtplib.SMTP("127.0.0.1", int(os.environ["SMTP"]))
smtp.login("me@nightmail.test", os.environ["PASSWORD"])
print("right password in %.1f s with %d answered" % (time.time() - began, len(answered)))
# Another spelling of the account from another loopback address is the same budget.
began = time.time()
other = smtplib.SMTP("127.0.0.1", int(os.environ["SMTP"]), source_address=("127.0.0.2", 0))
try:
    other.login("ME@NIGHTMAIL.TEST", "wrong")
except smtplib.SMTPAuthenticationError as e:
    print("other spelling %d after %.1f s" % (e.smtp_code, time.time() - began))
for t in guessers: t.join()
print("guesses answered", len(answered))
"#,
    );
    let right = out.lines().find(|l| l.starts_with("right password")).unwrap_or_default();
    let secs: f64 = right.split(' ').nth(3).unwrap().parse().unwrap();
    assert!(secs < 2.0 && right.ends_with("with 3 answered"), "{out}");
    let other = out.lines().find(|l| l.starts_with("other spelling")).unwrap_or_default();
    let after: f64 = other.split(' ').nth(4).unwrap().parse().unwrap();
    assert!(other.starts_with("other spelling 535") && after >= 2.5, "held for the window: {out}");
    assert!(out.contains("guesses answered 7"), "{out}");
}

#[test]
fn silent_connections_cannot_hold_the_places_of_logged_in_users_and_are_logged_out_early() {
    let daemon = Daemon::start_with(|dir| {
        with_keys(dir, "", "max_connections = 6\nmax_unauthenticated = 3\nlogin_timeout_secs = 2")
    });
    let out = imaplib(
        &daemon,
        r#"
import time
users = [login("me"), login("ann")]
def greeted():
    s = socket.create_connection(("127.0.0.1", PORT), timeout=20)
    return s, s.makefile("rb").readline().decode().strip()
silent = [greeted() for _ in range(3)]
print("silent greeted", [line.split(" ")[1] for _, line in silent])
print("fourth", greeted()[1])
print("users", [u.noop()[0] for u in users])
began = time.time()
for s, _ in silent:
    rest = s.makefile("rb").read().decode()
    print("silent ended", rest.strip(), "after %.1f s" % (time.time() - began))
print("login after", login("me").noop()[0])
"#,
    );
    assert!(out.contains("silent greeted ['OK', 'OK', 'OK']"), "{out}");
    assert!(out.contains("fourth * BYE [UNAVAILABLE] too many connections waiting to log in"), "{out}");
    assert!(out.contains("users ['OK', 'OK']"), "logged-in users keep their places: {out}");
    let ended: Vec<&str> = out.lines().filter(|l| l.starts_with("silent ended")).collect();
    assert_eq!(ended.len(), 3, "{out}");
    for line in ended {
        let secs: f64 = line.rsplit(' ').nth(1).unwrap().parse().unwrap();
        assert!(line.contains("* BYE autologout: not logged in in time") && secs < 10.0, "{out}");
    }
    assert!(out.contains("login after OK"), "{out}");
}

/// The daemon's resident memory in KiB, from `/proc/PID/status`.
fn rss_kib(daemon: &Daemon) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{}/status", daemon.pid())).unwrap();
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).expect("VmRSS");
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

/// Mail in and out: `messages` messages of about 90 KB to `me` over one SMTP session, then all
/// of the INBOX fetched over IMAP.
fn churn(daemon: &Daemon, messages: usize) {
    imaplib(
        daemon,
        &format!(
            r#"
import smtplib
body = ("%s\r\n" % ("x" * 76)) * 1150
smtp = smtplib.SMTP("127.0.0.1", int(os.environ["SMTP"]))
smtp.login("me", os.environ["PASSWORD"])
for i in range({messages}):
    smtp.sendmail("me@nightmail.test", ["me@nightmail.test"], "From: me@nightmail.test\r\nSubject: %d\r\n\r\n%s" % (i, body))
smtp.quit()
c = login()
c.select("INBOX", readonly=True)
typ, data = c.fetch("1:*", "(BODY.PEEK[])")
assert typ == "OK"
c.logout()
"#
        ),
    );
}

/// Mail in and out again and again, with sled's page cache bounded (`store.cache_mb`), raises the
/// daemon's memory no further once it is warm: the delivery, store and FETCH paths keep nothing
/// per session. A guard, not a regression test: the build before `cache_mb` passes it too, and
/// the pages sled's cache fails to bound (docs/OPERATIONS.md, Memory) are not what it measures.
#[test]
fn mail_in_and_out_again_and_again_raises_the_daemons_memory_no_further() {
    let daemon = Daemon::start_with(|dir| config(dir, "[store]\ncache_mb = 8\n"));
    churn(&daemon, 100);
    let warm = rss_kib(&daemon);
    for _ in 0..3 {
        churn(&daemon, 100);
    }
    let after = rss_kib(&daemon);
    eprintln!("RSS warm {warm} KiB, after 300 more messages of 90 KB in and out: {after} KiB");
    assert!(after < warm + 16 * 1024, "grew from {warm} KiB to {after} KiB");
}
