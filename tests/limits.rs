//! Bounded resources under abuse, each shown with a real client (Python's socket, smtplib, ssl
//! and imaplib) against the real daemon: per-client connection caps, deadlines on whole commands,
//! messages, TLS handshakes and writes, mailbox limits, and the login limiter under parallel
//! guessing.

mod common;

use std::path::Path;

use common::{Daemon, python};

/// The test configuration with `smtp` and `imap` keys added to those sections, and `auth`
/// replacing the `[auth]` section's keys.
fn limited(dir: &Path, smtp: &str, imap: &str, auth: &str) -> String {
    common::config(dir, "[tls]\nself_signed = true\n")
        .replacen("timeout_secs = 30\n", &format!("timeout_secs = 30\n{smtp}\n"), 1)
        .replacen("[imap]\nlisten = \"127.0.0.1:0\"\n", &format!("[imap]\nlisten = \"127.0.0.1:0\"\n{imap}\n"), 1)
        .replacen("[auth]\nfailure_delay_ms = 100\n", &format!("[auth]\nfailure_delay_ms = 100\n{auth}\n"), 1)
}

/// Helpers every script starts with: `greeting(port)` opens a socket and returns it with the
/// first line; `until_closed(sock, limit)` reads until EOF and returns what came and how long it
/// took (or raises if the server keeps it open past `limit`).
const PRELUDE: &str = r#"
import os, socket, ssl, time, threading, imaplib, smtplib
SMTP, IMAP, PASSWORD = int(os.environ["SMTP"]), int(os.environ["IMAP"]), os.environ["PASSWORD"]
def greeting(port):
    s = socket.create_connection(("127.0.0.1", port), timeout=20)
    line = b""
    while not line.endswith(b"\n"):
        chunk = s.recv(1)
        if not chunk:
            break
        line += chunk
    return s, line.decode().strip()
def until_closed(s, limit):
    start, got = time.monotonic(), b""
    s.settimeout(limit)
    while True:
        try:
            chunk = s.recv(4096)
        except ConnectionResetError:
            # Closed while our trickle's bytes were unread: TCP answers them with a reset
            # (RFC 1122 4.2.2.13). What arrived before it is still checked.
            chunk = b""
        if not chunk:
            return got.decode(errors="replace"), time.monotonic() - start
        got += chunk
def cut(s, data):
    """Sends `data` a byte every half second from a thread; returns the last line the server
    sent before it closed the connection, and how long that took."""
    def trickle():
        try:
            for b in data:
                s.send(bytes([b]))
                time.sleep(0.5)
        except OSError:
            pass
    threading.Thread(target=trickle, daemon=True).start()
    got, took = until_closed(s, 15)
    return got.strip().splitlines()[-1], took
"#;

/// Holds two connections to each server, opens a third, closes one of the two, and opens
/// another: prints each greeting.
const THIRD_CONNECTION: &str = r#"
for name, port in (("SMTP", SMTP), ("IMAP", IMAP)):
    held = [greeting(port) for _ in range(2)]
    for _, line in held:
        print(name, "served", line[:4].strip())
    third, line = greeting(port)
    print(name, "third", line)
    print(name, "third closed", until_closed(third, 10)[0] == "")
    held[0][0].close()
    # The place is freed when the server sees the close: poll for it.
    deadline = time.monotonic() + 10
    while True:
        again, line = greeting(port)
        if "too many" not in line.lower() or time.monotonic() > deadline:
            break
        again.close()
        time.sleep(0.05)
    print(name, "after close", line[:4].strip())
"#;

/// With two places (`key = 2` in both servers' sections), the third connection gets `smtp` and
/// `imap` as its greeting and is closed; a place freed is taken again.
fn third_connection_refused(key: &str, smtp: &str, imap: &str) {
    let setting = format!("{key} = 2");
    let daemon = Daemon::start_with(|dir| limited(dir, &setting, &setting, ""));
    let out = python(&daemon, &format!("{PRELUDE}{THIRD_CONNECTION}"));
    assert_eq!(out.matches("SMTP served 220\n").count(), 2, "{out}");
    assert!(out.contains(&format!("SMTP third {smtp}\n")), "{out}");
    assert!(out.contains("SMTP after close 220\n"), "{out}");
    assert_eq!(out.matches("IMAP served * OK\n").count(), 2, "{out}");
    assert!(out.contains(&format!("IMAP third {imap}\n")), "{out}");
    assert!(out.contains("IMAP after close * OK\n"), "{out}");
    assert_eq!(out.matches("third closed True").count(), 2, "{out}");
}

#[test]
fn connections_are_capped_per_client_for_smtp_and_imap() {
    third_connection_refused(
        "max_connections_per_ip",
        "421 4.7.0 Too many connections from your address; close some and try again",
        "* BYE [UNAVAILABLE] too many connections from your address, close some and try again",
    );
}

#[test]
fn connections_are_capped_server_wide_for_smtp_and_imap() {
    third_connection_refused(
        "max_connections",
        "421 4.7.0 Too many connections; try again later",
        "* BYE [UNAVAILABLE] too many connections, try again later",
    );
}

/// A client that sends a byte every half second never goes idle, but its command never ends:
/// the deadline counts from the command's first byte, for a command line, a message and a TLS
/// handshake alike.
#[test]
fn smtp_deadlines_hold_for_a_trickled_command_message_and_handshake() {
    let daemon = Daemon::start_with(|dir| {
        limited(dir, "", "", "").replacen("timeout_secs = 30\n", "timeout_secs = 2\ndata_timeout_secs = 3\n", 1)
    });
    let out = python(
        &daemon,
        &format!(
            r#"{PRELUDE}
s, _ = greeting(SMTP)
line, took = cut(s, b"NOOP and on and on and on and on and on and on")
print("command", line, took < 5)

s, _ = greeting(SMTP)
s.sendall(b"EHLO t\r\nAUTH PLAIN " + __import__("base64").b64encode(b"\0me\0" + PASSWORD.encode()) + b"\r\n")
s.sendall(b"MAIL FROM:<me@nightmail.test>\r\nRCPT TO:<ann@nightmail.test>\r\nDATA\r\n")
time.sleep(0.5)
line, took = cut(s, b"Subject: slow\r\n\r\n" + b"x" * 40)
print("message", line, 2.5 < took < 6)

s, _ = greeting(SMTP)
s.sendall(b"EHLO t\r\nSTARTTLS\r\n")
time.sleep(0.5)
got, took = until_closed(s, 15)
print("handshake", got.strip().splitlines()[-1], took < 5)
"#
        ),
    );
    assert!(out.contains("command 421 4.4.2 Timeout: closing connection True"), "{out}");
    assert!(out.contains("message 421 4.4.2 Timeout: closing connection True"), "{out}");
    assert!(out.contains("handshake 220 2.0.0"), "{out}");
    assert!(out.trim_end().ends_with("True"), "the TLS handshake was not cut: {out}");
}

#[test]
fn imap_deadlines_hold_for_a_trickled_command_and_handshake() {
    let daemon = Daemon::start_with(|dir| limited(dir, "", "command_timeout_secs = 2", ""));
    let out = python(
        &daemon,
        &format!(
            r#"{PRELUDE}
s, _ = greeting(IMAP)
line, took = cut(s, b"a1 NOOP and on and on and on and on and on")
print("command", line, took < 5)

s, _ = greeting(IMAP)
s.sendall(b"a1 STARTTLS\r\n")
got, took = until_closed(s, 15)
print("handshake", got.strip().splitlines()[-1], took < 5)
"#
        ),
    );
    assert!(out.contains("command * BYE the command did not arrive in time True"), "{out}");
    assert!(out.contains("handshake a1 OK"), "{out}");
    assert!(out.trim_end().ends_with("True"), "the TLS handshake was not cut: {out}");
}

#[test]
fn mailbox_count_and_name_length_are_limited() {
    let daemon = Daemon::start_with(|dir| limited(dir, "", "max_mailboxes = 12\nmax_mailbox_name_bytes = 20", ""));
    let out = python(
        &daemon,
        &format!(
            r#"{PRELUDE}
m = imaplib.IMAP4("127.0.0.1", IMAP)
m.login("me", PASSWORD)
made = 0
while made < 20:
    typ, data = m.create("box%d" % made)
    if typ != "OK":
        break
    made += 1
print("refused at", len(m.list()[1]), "after", made > 0, typ, data)
print("long", m.create("x" * 21))
print("exact", m.delete("box0"), m.create("y" * 20))
print("rename", m.rename("box1", "z" * 21))
print("still", m.select("box1")[0])
"#
        ),
    );
    assert!(
        out.contains(
            "refused at 12 after True NO [b'[LIMIT] you have 12 mailboxes, the most allowed: delete one first']"
        ),
        "{out}"
    );
    assert!(out.contains("long ('NO', [b'[LIMIT] mailbox names are at most 20 bytes long'])"), "{out}");
    assert!(out.contains("exact ('OK', [b'DELETE completed']) ('OK', [b'CREATE completed'])"), "{out}");
    assert!(out.contains("rename ('NO', [b'[LIMIT] mailbox names are at most 20 bytes long'])"), "{out}");
    assert!(out.contains("still OK"), "{out}");
}

/// Twelve connections guessing at once get no more answers per window than one would: past the
/// budget of three, wrong answers wait for the window (2 s here), three at a time; SMTP's
/// guesses from the same client wait behind them.
#[test]
fn parallel_guesses_get_no_more_answers_than_the_budget_over_imap_and_smtp() {
    let daemon = Daemon::start_with(|dir| limited(dir, "", "", "max_failures = 3\nfailure_window_secs = 2"));
    let out = python(
        &daemon,
        &format!(
            r#"{PRELUDE}
results = []
start = time.time()
def imap_guess():
    m = imaplib.IMAP4("127.0.0.1", IMAP)
    try:
        m.login("me", "wrong")
        results.append(("accepted", 0))
    except imaplib.IMAP4.error as e:
        results.append(("invalid", time.time() - start))
threads = [threading.Thread(target=imap_guess) for _ in range(12)]
for t in threads: t.start()
for t in threads: t.join()
print("imap", sorted(set(r for r, _ in results)), " ".join("%d" % int(t // 2) for t in sorted(t for _, t in results)))
def smtp_guess():
    c = smtplib.SMTP("127.0.0.1", SMTP, timeout=30)
    c.ehlo()
    began = time.time()
    try:
        c.login("me", "wrong")
        print("smtp accepted")
    except smtplib.SMTPAuthenticationError as e:
        print("smtp", e.smtp_code, "after %.1f s" % (time.time() - began))
smtp_guess()
"#
        ),
    );
    // Answers come three per 2-second window: windows 0, 1, 2 and 3 (sometimes a little later
    // on a loaded machine, never earlier).
    let imap = out.lines().find(|l| l.starts_with("imap")).unwrap_or_default();
    assert!(imap.starts_with("imap ['invalid'] "), "{out}");
    let windows: Vec<u32> = imap.rsplit("] ").next().unwrap().split(' ').map(|w| w.parse().unwrap()).collect();
    for (i, w) in windows.iter().enumerate() {
        assert!(*w >= (i / 3) as u32, "answer {i} came in window {w}: {out}");
    }
    // The budget is the client's and the account's, over both protocols.
    let smtp = out.lines().find(|l| l.starts_with("smtp")).unwrap_or_default();
    let after: f64 = smtp.split("after ").nth(1).unwrap().trim_end_matches(" s").parse().unwrap();
    assert!(smtp.starts_with("smtp 535") && after >= 1.0, "{out}");
}

/// A client that pipelines FETCHes and never reads what they return would block the server's
/// write forever, holding its connection slot: the write has the command deadline too.
#[test]
fn an_imap_client_that_stops_reading_loses_its_connection_at_the_write_deadline() {
    let daemon = Daemon::start_with(|dir| {
        limited(dir, "", "command_timeout_secs = 2\nmax_connections_per_ip = 1", "").replacen(
            "max_message_bytes = 100000",
            "max_message_bytes = 1000000",
            1,
        )
    });
    let out = python(
        &daemon,
        &format!(
            r#"{PRELUDE}
def served():
    deadline = time.monotonic() + 15
    while True:
        s, line = greeting(IMAP)
        if line.startswith("* OK") or time.monotonic() > deadline:
            return s, line
        s.close()
        time.sleep(0.05)
m = imaplib.IMAP4("127.0.0.1", IMAP)
m.login("me", PASSWORD)
body = b"Subject: big\r\n\r\n" + (b"y" * 998 + b"\r\n") * 900
print("append", m.append("INBOX", None, None, body)[0])
m.logout()

s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
s.settimeout(20)
deadline = time.monotonic() + 15
while True:
    s.connect(("127.0.0.1", IMAP))
    if s.recv(4096).startswith(b"* OK") or time.monotonic() > deadline:
        break
    s.close(); s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096); s.settimeout(20)
    time.sleep(0.05)
s.sendall(b"a0 LOGIN me \"" + PASSWORD.encode() + b"\"\r\na1 SELECT INBOX\r\n")
s.sendall(b"".join(b"f%d FETCH 1 BODY.PEEK[]\r\n" % i for i in range(60)))
start = time.monotonic()
other, line = served()
print("next client", line[:4], round(time.monotonic() - start) >= 1)
"#
        ),
    );
    assert!(out.contains("append OK"), "{out}");
    assert!(out.contains("next client * OK True"), "{out}");
}

/// Every client here shares 127.0.0.1, as behind Docker's port publishing: guesses at one user's
/// password slow that user's wrong answers, not the others', until the address's total reaches
/// its budget; and the right password is never refused.
#[test]
fn guesses_at_one_user_do_not_slow_another_on_a_shared_address() {
    let daemon = Daemon::start_with(|dir| {
        limited(dir, "", "", "max_failures = 2\nmax_client_failures = 4\nfailure_window_secs = 600")
    });
    let out = python(
        &daemon,
        &format!(
            r#"{PRELUDE}
def login(user, password, wait=20):
    m = imaplib.IMAP4("127.0.0.1", IMAP, timeout=wait)
    try:
        m.login(user, password)
        m.logout()
        return "ok"
    except imaplib.IMAP4.error as e:
        return "invalid"
    except (socket.timeout, TimeoutError):
        return "held"
print("guess me", login("me", "wrong"), login("me", "wrong"))
print("me wrong again", login("me", "wrong", wait=3))
print("me now", login("me", PASSWORD))
print("ann wrong", login("ann", "wrong"))
print("spray", login("ghost1", "x", wait=3))
print("ann after", login("ann", PASSWORD))
"#
        ),
    );
    assert!(out.contains("guess me invalid invalid"), "{out}");
    assert!(out.contains("me wrong again held"), "past me's budget a wrong answer waits: {out}");
    assert!(out.contains("me now ok"), "{out}");
    assert!(out.contains("ann wrong invalid"), "ann's budget is her own: {out}");
    assert!(out.contains("spray held"), "the client's budget of four is spent: {out}");
    assert!(out.contains("ann after ok"), "{out}");
}

/// The same for SMTP: a client that pipelines commands and never reads their replies loses its
/// connection (and frees its place) once a write has waited `smtp.timeout_secs`.
#[test]
fn an_smtp_client_that_stops_reading_loses_its_connection_at_the_write_deadline() {
    let daemon = Daemon::start_with(|dir| {
        limited(dir, "max_connections_per_ip = 1", "", "").replacen("timeout_secs = 30\n", "timeout_secs = 2\n", 1)
    });
    let out = python(
        &daemon,
        &format!(
            r#"{PRELUDE}
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
s.connect(("127.0.0.1", SMTP))
def flood():
    try:
        # Each HELP is answered with ~90 bytes: far more than the socket buffers hold.
        s.sendall(b"HELP\r\n" * 200000)
    except OSError:
        pass
threading.Thread(target=flood, daemon=True).start()
start = time.monotonic()
deadline = start + 20
while True:
    other, line = greeting(SMTP)
    if line.startswith("220") or time.monotonic() > deadline:
        break
    other.close()
    time.sleep(0.05)
print("next client", line[:3], round(time.monotonic() - start, 1) >= 1.5)
"#
        ),
    );
    assert!(out.contains("next client 220 True"), "{out}");
}
