//! End-to-end tests of the IMAP server: the real daemon on port 0, driven by async-imap (Rust),
//! a raw socket for the conversations no well-behaved client has, Python's imaplib, curl, mutt
//! under tmux, and mbsync.

mod common;

use std::collections::HashSet;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use async_imap::types::Fetch;
use common::{Daemon, PASSWORD, eventually, external};
use futures::TryStreamExt;
use lettre::Transport;

type Session = async_imap::Session<tokio::net::TcpStream>;

async fn login(addr: SocketAddr, user: &str) -> Session {
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let mut client = async_imap::Client::new(tcp);
    client.read_response().await.unwrap().expect("greeting");
    client.login(user, PASSWORD).await.map_err(|(e, _)| e).unwrap()
}

/// Sends a message to `me` over SMTP, as a real delivery would arrive.
fn deliver(daemon: &Daemon, subject: &str, body: &str) {
    deliver_to(daemon.smtp, subject, body)
}

fn deliver_to(smtp: SocketAddr, subject: &str, body: &str) {
    let email = lettre::Message::builder()
        .from("ann@nightmail.test".parse().unwrap())
        .to("me@nightmail.test".parse().unwrap())
        .subject(subject)
        .body(body.to_string())
        .unwrap();
    let mailer = lettre::SmtpTransport::builder_dangerous(smtp.ip().to_string())
        .port(smtp.port())
        .credentials(lettre::transport::smtp::authentication::Credentials::new("ann".into(), PASSWORD.into()))
        .build();
    mailer.send(&email).unwrap();
}

const MIME: &str = "From: Ann <ann@nightmail.test>\r\nTo: me@nightmail.test\r\nSubject: structured\r\n\
Message-ID: <mime@x>\r\nDate: Mon, 02 Mar 2026 10:00:00 +0000\r\nMIME-Version: 1.0\r\n\
Content-Type: multipart/mixed; boundary=\"zz\"\r\n\r\n--zz\r\nContent-Type: text/plain; charset=utf-8\r\n\r\n\
hello body\r\n--zz\r\nContent-Type: application/octet-stream; name=\"a.bin\"\r\nContent-Transfer-Encoding: base64\r\n\r\n\
AAEC\r\n--zz--\r\n";

fn plain(subject: &str, body: &str) -> String {
    format!(
        "From: ann@nightmail.test\r\nTo: me@nightmail.test\r\nSubject: {subject}\r\nMessage-ID: <{subject}@x>\r\n\r\n{body}\r\n"
    )
}

async fn fetch_all(session: &mut Session, set: &str, query: &str, uid: bool) -> Vec<Fetch> {
    if uid {
        session.uid_fetch(set, query).await.unwrap().try_collect().await.unwrap()
    } else {
        session.fetch(set, query).await.unwrap().try_collect().await.unwrap()
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn login_capability_id_namespace_enable_and_special_use_list() {
    let daemon = Daemon::start();
    let mut s = login(daemon.imap, "me").await;
    let caps = s.capabilities().await.unwrap();
    for cap in ["IMAP4rev1", "IDLE", "UIDPLUS", "MOVE", "UNSELECT", "SPECIAL-USE", "ENABLE", "ID", "NAMESPACE"] {
        assert!(caps.has_str(cap), "missing {cap}");
    }
    let id = s.id([("name", Some("test"))]).await.unwrap().unwrap();
    assert_eq!(id.get("name").map(String::as_str), Some("nightmail"));
    s.run_command_and_check_ok("ENABLE UTF8=ACCEPT").await.unwrap();
    let names: Vec<async_imap::types::Name> = s.list(Some(""), Some("*")).await.unwrap().try_collect().await.unwrap();
    let listed: HashSet<String> = names.iter().map(|n| n.name().to_string()).collect();
    // The defaults, and the model's Ask folder under its parent (docs/MAIL.md).
    let expected = ["INBOX", "Sent", "Drafts", "Trash", "Archive", "Ask", "Ask/kimi"];
    assert_eq!(listed, expected.iter().map(|s| s.to_string()).collect());
    let sent = names.iter().find(|n| n.name() == "Sent").unwrap();
    assert!(format!("{:?}", sent.attributes()).contains("Sent"), "{:?}", sent.attributes());
    assert_eq!(sent.delimiter(), Some("/"));
    s.noop().await.unwrap();
    s.logout().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn create_rename_delete_subscribe_status_lsub() {
    let daemon = Daemon::start();
    let mut s = login(daemon.imap, "me").await;
    s.create("Projects").await.unwrap();
    s.create("Projects/Old").await.unwrap();
    assert!(s.create("Projects").await.is_err(), "creating an existing mailbox fails");
    s.rename("Projects", "Work").await.unwrap();
    let names: Vec<_> = s.list(Some(""), Some("Work*")).await.unwrap().try_collect().await.unwrap();
    let mut names: Vec<String> = names.iter().map(|n| n.name().to_string()).collect();
    names.sort();
    assert_eq!(names, vec!["Work", "Work/Old"], "children are renamed too");
    s.subscribe("Work").await.unwrap();
    let subscribed: Vec<_> = s.lsub(Some(""), Some("Work*")).await.unwrap().try_collect().await.unwrap();
    assert_eq!(subscribed.iter().map(|n| n.name().to_string()).collect::<Vec<_>>(), vec!["Work"]);
    s.subscribe("Work/Old").await.unwrap();
    s.append("Work", Some("(\\Seen)"), None, plain("a", "x")).await.unwrap();
    s.append("Work", None, None, plain("b", "y")).await.unwrap();
    let status = s.status("Work", "(MESSAGES UIDNEXT UIDVALIDITY UNSEEN RECENT)").await.unwrap();
    assert_eq!((status.exists, status.unseen, status.recent, status.uid_next), (2, Some(1), 2, Some(3)));
    assert!(status.uid_validity.unwrap() > 0);
    s.delete("Work/Old").await.unwrap();
    s.delete("Work").await.unwrap();
    assert!(s.delete("INBOX").await.is_err(), "INBOX cannot be deleted");
    assert!(s.status("Work", "(MESSAGES)").await.is_err());
    s.logout().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn select_fetch_items_sections_and_seen() {
    let daemon = Daemon::start();
    deliver(&daemon, "first", "hello from smtp");
    let mut s = login(daemon.imap, "me").await;
    s.append("INBOX", None, Some("\"02-Mar-2026 10:00:00 +0000\""), MIME).await.unwrap();
    let inbox = s.select("INBOX").await.unwrap();
    assert_eq!((inbox.exists, inbox.recent, inbox.unseen), (2, 2, Some(1)));
    assert_eq!(inbox.uid_next.unwrap(), 3);
    let all = fetch_all(&mut s, "1:*", "(UID FLAGS INTERNALDATE RFC822.SIZE ENVELOPE BODYSTRUCTURE)", false).await;
    assert_eq!(all.len(), 2);
    assert_eq!(all[0].envelope().unwrap().subject.as_deref(), Some(&b"first"[..]));
    let second = &all[1];
    assert_eq!(second.uid, Some(2));
    assert_eq!(second.size, Some(MIME.len() as u32));
    assert_eq!(second.internal_date().unwrap().to_rfc3339(), "2026-03-02T10:00:00+00:00");
    let structure = format!("{:?}", second.bodystructure().unwrap());
    assert!(structure.contains("OCTET-STREAM") && structure.contains("PLAIN"), "{structure}");

    let peek =
        fetch_all(&mut s, "2", "(BODY.PEEK[HEADER.FIELDS (SUBJECT)] BODY.PEEK[1] BODY.PEEK[TEXT]<0.4>)", true).await;
    assert_eq!(peek[0].header(), Some(&b"Subject: structured\r\n\r\n"[..]));
    let part1 = peek[0].section(&async_imap::imap_proto::SectionPath::Part(vec![1], None)).unwrap();
    assert_eq!(part1, b"hello body");
    assert!(!peek[0].flags().any(|f| f == async_imap::types::Flag::Seen), "PEEK does not set \\Seen");

    let full = fetch_all(&mut s, "2", "(BODY[])", true).await;
    assert_eq!(full[0].body(), Some(MIME.as_bytes()));
    let flags = fetch_all(&mut s, "2", "(FLAGS)", true).await;
    assert!(flags[0].flags().any(|f| f == async_imap::types::Flag::Seen), "BODY[] sets \\Seen");
    s.check().await.unwrap();
    s.close().await.unwrap();

    let read_only = s.examine("INBOX").await.unwrap();
    assert_eq!((read_only.exists, read_only.recent), (2, 0), "SELECT claimed \\Recent");
    s.run_command_and_check_ok("UNSELECT").await.unwrap();
    s.logout().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn store_search_copy_move_and_expunge() {
    let daemon = Daemon::start();
    let mut s = login(daemon.imap, "me").await;
    for (subject, body) in [("alpha", "apples"), ("beta", "bananas"), ("gamma", "cherries")] {
        s.append("INBOX", None, None, plain(subject, body)).await.unwrap();
    }
    s.select("INBOX").await.unwrap();
    let changed = s.store("1:2", "+FLAGS (\\Flagged)").await.unwrap().try_collect::<Vec<_>>().await.unwrap();
    assert_eq!(changed.len(), 2);
    let silent =
        s.uid_store("3", "+FLAGS.SILENT (\\Seen $Label)").await.unwrap().try_collect::<Vec<_>>().await.unwrap();
    assert!(silent.is_empty(), ".SILENT returns no FETCH");
    s.store("2", "-FLAGS (\\Flagged)").await.unwrap().try_collect::<Vec<_>>().await.unwrap();

    let set = |v: &[u32]| v.iter().copied().collect::<HashSet<u32>>();
    assert_eq!(s.search("FLAGGED").await.unwrap(), set(&[1]));
    assert_eq!(s.search("SUBJECT beta").await.unwrap(), set(&[2]));
    assert_eq!(s.search("BODY cherries").await.unwrap(), set(&[3]));
    assert_eq!(s.search("TEXT ALPHA").await.unwrap(), set(&[1]));
    assert_eq!(s.search("FROM ann@nightmail.test NOT SEEN").await.unwrap(), set(&[1, 2]));
    assert_eq!(s.search("OR KEYWORD $Label UID 1").await.unwrap(), set(&[1, 3]));
    assert_eq!(s.search("HEADER Message-ID <gamma@x>").await.unwrap(), set(&[3]));
    assert_eq!(s.search("SINCE 1-Jan-2020 BEFORE 1-Jan-2100").await.unwrap(), set(&[1, 2, 3]));
    assert_eq!(s.search("ON 1-Jan-2000").await.unwrap(), set(&[]));
    assert_eq!(s.search("LARGER 10 SMALLER 100000").await.unwrap(), set(&[1, 2, 3]));
    assert_eq!(s.uid_search("2:*").await.unwrap(), set(&[2, 3]));

    s.copy("1", "Archive").await.unwrap();
    s.uid_mv("2", "Trash").await.unwrap();
    assert_eq!(s.status("Archive", "(MESSAGES)").await.unwrap().exists, 1);
    assert_eq!(s.status("Trash", "(MESSAGES)").await.unwrap().exists, 1);
    let left: Vec<u32> = fetch_all(&mut s, "1:*", "(UID)", false).await.iter().filter_map(|f| f.uid).collect();
    assert_eq!(left, vec![1, 3], "MOVE expunged the original");

    s.store("1:2", "+FLAGS.SILENT (\\Deleted)").await.unwrap().try_collect::<Vec<_>>().await.unwrap();
    let gone: Vec<u32> = s.uid_expunge("3").await.unwrap().try_collect().await.unwrap();
    assert_eq!(gone, vec![2], "UID EXPUNGE removes only the named UIDs (seq 2 = UID 3)");
    let gone: Vec<u32> = s.expunge().await.unwrap().try_collect().await.unwrap();
    assert_eq!(gone, vec![1]);
    s.append("INBOX", None, None, plain("delta", "d")).await.unwrap();
    s.noop().await.unwrap();
    let uids: Vec<u32> = fetch_all(&mut s, "1:*", "(UID)", false).await.iter().filter_map(|f| f.uid).collect();
    assert_eq!(uids, vec![4], "UIDs are never reused after EXPUNGE");
    s.logout().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn idle_announces_a_delivery_within_a_second() {
    let daemon = Daemon::start();
    let mut s = login(daemon.imap, "me").await;
    s.select("INBOX").await.unwrap();
    let mut idle = s.idle();
    idle.init().await.unwrap();
    let (wait, _stop) = idle.wait_with_timeout(Duration::from_secs(20));
    let smtp = daemon.smtp;
    // Delivered from another thread while this task waits in IDLE; the instant is taken at 250.
    let deliverer = tokio::task::spawn_blocking(move || {
        deliver_to(smtp, "news", "arrived while idling");
        Instant::now()
    });
    let response = wait.await.unwrap();
    let announced = Instant::now();
    let delivered = deliverer.await.unwrap();
    assert!(announced.saturating_duration_since(delivered) < Duration::from_secs(1), "EXISTS came late");
    let async_imap::extensions::idle::IdleResponse::NewData(data) = response else { panic!("{response:?}") };
    assert!(format!("{:?}", data.parsed()).contains("Exists(1)"), "{:?}", data.parsed());
    let mut s = idle.done().await.unwrap();
    let got = fetch_all(&mut s, "1", "(BODY.PEEK[HEADER.FIELDS (SUBJECT)])", false).await;
    assert_eq!(got[0].header(), Some(&b"Subject: news\r\n\r\n"[..]));
    s.logout().await.unwrap();
}

/// A raw IMAP connection, for the conversations no well-behaved client would have.
struct Raw {
    stream: TcpStream,
    reader: BufReader<TcpStream>,
    next_tag: u32,
}

impl Raw {
    fn connect(addr: SocketAddr) -> (Raw, String) {
        let stream = TcpStream::connect(addr).unwrap();
        stream.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        let reader = BufReader::new(stream.try_clone().unwrap());
        let mut raw = Raw { stream, reader, next_tag: 0 };
        let greeting = raw.line();
        (raw, greeting)
    }

    fn login(addr: SocketAddr, user: &str) -> Raw {
        let (mut raw, greeting) = Raw::connect(addr);
        assert!(greeting.starts_with("* OK"), "{greeting}");
        let (_, done) = raw.cmd(&format!("LOGIN {user} \"{PASSWORD}\""));
        assert!(done.contains(" OK "), "{done}");
        raw
    }

    /// One response line, with any literals it announces read into it.
    fn line(&mut self) -> String {
        let mut out = String::new();
        loop {
            let mut line = Vec::new();
            let n = self.reader.read_until(b'\n', &mut line).unwrap();
            assert!(n > 0, "connection closed; got so far: {out:?}");
            let text = String::from_utf8_lossy(&line).into_owned();
            out.push_str(&text);
            let trimmed = text.trim_end();
            if let Some(open) = trimmed.rfind('{')
                && trimmed.ends_with('}')
                && let Ok(len) = trimmed[open + 1..trimmed.len() - 1].parse::<usize>()
            {
                let mut literal = vec![0; len];
                self.reader.read_exact(&mut literal).unwrap();
                out.push_str(&String::from_utf8_lossy(&literal));
                continue;
            }
            return out.trim_end().to_string();
        }
    }

    fn send(&mut self, bytes: &[u8]) {
        self.stream.write_all(bytes).unwrap();
    }

    fn tag(&mut self) -> String {
        self.next_tag += 1;
        format!("t{}", self.next_tag)
    }

    /// Sends `TAG command` and returns the untagged lines and the tagged completion.
    fn cmd(&mut self, command: &str) -> (Vec<String>, String) {
        let tag = self.tag();
        self.send(format!("{tag} {command}\r\n").as_bytes());
        self.until(&tag)
    }

    fn until(&mut self, tag: &str) -> (Vec<String>, String) {
        let mut untagged = Vec::new();
        loop {
            let line = self.line();
            if line.starts_with(&format!("{tag} ")) {
                return (untagged, line);
            }
            untagged.push(line);
        }
    }

    /// True once the server has closed the connection.
    fn closed(&mut self) -> bool {
        let mut rest = Vec::new();
        self.reader.read_to_end(&mut rest).is_ok()
    }
}

fn append_raw(raw: &mut Raw, mailbox: &str, message: &str) -> String {
    let tag = raw.tag();
    raw.send(format!("{tag} APPEND {mailbox} {{{}}}\r\n", message.len()).as_bytes());
    let cont = raw.line();
    assert!(cont.starts_with('+'), "{cont}");
    raw.send(format!("{message}\r\n").as_bytes());
    raw.until(&tag).1
}

#[test]
fn unauthenticated_commands_get_bad_and_no_data() {
    let daemon = Daemon::start();
    let (mut raw, greeting) = Raw::connect(daemon.imap);
    assert!(greeting.to_ascii_uppercase().contains("CAPABILITY IMAP4REV1"), "{greeting}");
    for command in
        ["SELECT INBOX", "LIST \"\" *", "FETCH 1 BODY[]", "STATUS INBOX (MESSAGES)", "APPEND INBOX {0+}\r\n", "IDLE"]
    {
        let (untagged, done) = raw.cmd(command);
        assert!(untagged.is_empty(), "{command}: {untagged:?}");
        assert!(done.contains(" BAD ") || done.contains(" NO "), "{command}: {done}");
    }
    let (_, done) = raw.cmd("NOOP");
    assert!(done.contains(" OK "), "{done}");
    let (untagged, done) = raw.cmd("NAMESPACE");
    assert!(untagged.is_empty() && done.contains(" BAD "), "{untagged:?} {done}");
    let mut raw = Raw::login(daemon.imap, "me");
    let (untagged, done) = raw.cmd("NAMESPACE");
    assert_eq!(untagged, vec![r#"* NAMESPACE (("" "/")) NIL NIL"#], "{done}");
}

#[test]
fn wrong_passwords_are_refused_and_delayed_and_the_right_one_is_not() {
    let daemon = Daemon::start_with(|dir| {
        common::config(dir, "").replace("failure_delay_ms = 100", "failure_delay_ms = 100\nmax_failures = 2")
    });
    let (mut raw, _) = Raw::connect(daemon.imap);
    let started = Instant::now();
    let (_, done) = raw.cmd("LOGIN me wrong");
    assert!(done.contains(" NO [AUTHENTICATIONFAILED]"), "{done}");
    assert!(started.elapsed() >= Duration::from_millis(100), "failures are delayed");
    let (_, done) = raw.cmd("AUTHENTICATE PLAIN AG1lAGd1ZXNz"); // \0me\0guess
    assert!(done.contains(" NO "), "{done}");
    // Past the budget wrong answers wait; the right password is answered at once all the same.
    let (mut again, _) = Raw::connect(daemon.imap);
    let started = Instant::now();
    let (_, done) = again.cmd(&format!("LOGIN me \"{PASSWORD}\""));
    assert!(done.contains(" OK "), "{done}");
    assert!(started.elapsed() < Duration::from_secs(5));
}

#[test]
fn authenticate_plain_with_and_without_initial_response() {
    let daemon = Daemon::start();
    let token = common::base64_plain("me", PASSWORD);
    let (mut raw, _) = Raw::connect(daemon.imap);
    let (_, done) = raw.cmd(&format!("AUTHENTICATE PLAIN {token}"));
    assert!(done.contains(" OK "), "{done}");
    let (mut raw, _) = Raw::connect(daemon.imap);
    raw.send(b"a AUTHENTICATE PLAIN\r\n");
    assert!(raw.line().starts_with('+'));
    raw.send(format!("{token}\r\n").as_bytes());
    let (_, done) = raw.until("a");
    assert!(done.contains(" OK "), "{done}");
}

#[test]
fn garbage_unbalanced_and_huge_literals_get_bad_and_the_daemon_keeps_serving() {
    let daemon = Daemon::start();
    let mut raw = Raw::login(daemon.imap, "me");
    raw.send(b"\x00\xff garbage\r\n");
    let bad = raw.line();
    assert!(bad.starts_with("* BAD"), "{bad}");
    raw.send(b"g1 FETCH (((\r\n");
    assert!(raw.line().starts_with("g1 BAD"));
    // Over the size limit (100000 in the test config): refused before any literal byte is sent.
    raw.send(b"h1 APPEND INBOX {999999999}\r\n");
    let refused = raw.line();
    assert!(refused.starts_with("h1 BAD"), "{refused}");
    // An unbalanced literal: announced 10, followed by a command line; the server waits for the
    // bytes, takes them as the literal, and the command is then malformed.
    raw.send(b"u1 LOGIN {10}\r\n");
    assert!(raw.line().starts_with('+'));
    raw.send(b"abc\r\nu2 NOOP\r\n");
    let after = raw.line();
    assert!(after.starts_with("u1 BAD") || after.starts_with("* BAD"), "{after}");
    let (_, done) = raw.cmd("NOOP");
    assert!(done.contains(" OK "), "the session survives: {done}");
    let mut other = Raw::login(daemon.imap, "me");
    assert!(other.cmd("NOOP").1.contains(" OK "), "the daemon keeps serving");
}

/// `me`'s mailbox `name` as the store holds it: (UID, message key) pairs. The daemon must be stopped.
fn stored_mail(daemon: &Daemon, name: &str) -> Vec<(u32, nightmail_store::MessageKey)> {
    let store = nightmail_store::Store::open(&daemon.data_dir().join("store")).unwrap();
    let mailbox = store.mailbox("me", name).unwrap().unwrap();
    store.mail(mailbox.id).unwrap().iter().map(|m| (m.uid.0, m.message)).collect()
}

#[test]
fn expunging_the_last_copy_deletes_the_bytes_and_a_copy_in_another_mailbox_keeps_them() {
    let mut daemon = Daemon::start();
    let mut raw = Raw::login(daemon.imap, "me");
    append_raw(&mut raw, "INBOX", &plain("doomed", "x"));
    append_raw(&mut raw, "INBOX", &plain("kept", "y"));
    drop(raw);
    daemon.stop();
    let keys: Vec<_> = stored_mail(&daemon, "INBOX").into_iter().map(|(_, key)| key).collect();
    daemon.restart();

    let mut a = Raw::login(daemon.imap, "me");
    let mut b = Raw::login(daemon.imap, "me");
    a.cmd("SELECT INBOX");
    b.cmd("SELECT INBOX");
    assert!(a.cmd("COPY 2 Archive").1.contains(" OK "));
    a.cmd("STORE 1:2 +FLAGS.SILENT (\\Deleted)");
    let (untagged, done) = a.cmd("EXPUNGE");
    assert_eq!(untagged, vec!["* 2 EXPUNGE", "* 1 EXPUNGE"], "{done}");
    // b has not been told yet (no EXPUNGE during FETCH by number, RFC 3501 §7.4.1), and the bytes
    // of message 1 are gone: RFC 2180 §4.1.3's NO, then NOOP brings the view up to date.
    let (untagged, done) = b.cmd("FETCH 1:2 (BODY.PEEK[])");
    assert!(done.contains(" NO [EXPUNGEISSUED]"), "{untagged:?} {done}");
    assert!(untagged.iter().all(|l| !l.contains("doomed")), "{untagged:?}");
    assert!(untagged.iter().any(|l| l.starts_with("* 2 FETCH") && l.contains("Subject: kept")), "{untagged:?}");
    let (untagged, _) = b.cmd("NOOP");
    assert_eq!(&untagged[..2], &["* 2 EXPUNGE", "* 1 EXPUNGE"]);
    drop((a, b));
    daemon.stop();

    let store = nightmail_store::Store::open(&daemon.data_dir().join("store")).unwrap();
    assert_eq!(store.message(keys[0]).unwrap(), None, "the last copy was expunged: bytes deleted");
    let kept = store.message(keys[1]).unwrap().expect("Archive still holds the copy");
    assert!(String::from_utf8_lossy(&kept).contains("Subject: kept"));
    let archive = store.mailbox("me", "Archive").unwrap().unwrap();
    assert_eq!(store.mail(archive.id).unwrap()[0].message, keys[1]);
}

#[test]
fn before_login_only_small_literals_are_read_and_after_login_the_message_limit_applies() {
    let daemon = Daemon::start();
    let (mut raw, _) = Raw::connect(daemon.imap);
    // Refused before any literal byte is sent: the client is told at once, and need not send it.
    raw.send(b"a1 LOGIN {100000}\r\n");
    let refused = raw.line();
    assert!(refused.starts_with("a1 BAD"), "{refused}");
    raw.send(b"a2 LOGIN {8193}\r\n");
    assert!(raw.line().starts_with("a2 BAD"), "8 KiB is the bound before login");
    raw.send(b"a3 LOGIN {2}\r\n");
    assert!(raw.line().starts_with('+'));
    // A command pipelined right after LOGIN survives the change of limits.
    raw.send(format!("me \"{PASSWORD}\"\r\na4 NOOP\r\n").as_bytes());
    assert!(raw.until("a3").1.contains(" OK "));
    assert!(raw.until("a4").1.contains(" OK "));
    let line = format!("{}\r\n", "x".repeat(98));
    let big = format!("Subject: big\r\n\r\n{}", line.repeat(499));
    assert!(big.len() > 40_000 && big.len() < 100_000, "under the test config's message limit");
    let done = append_raw(&mut raw, "INBOX", &big);
    assert!(done.contains(" OK [APPENDUID"), "{done}");

    // AUTHENTICATE lifts the limit as LOGIN does.
    let (mut other, _) = Raw::connect(daemon.imap);
    let (_, done) = other.cmd(&format!("AUTHENTICATE PLAIN {}", common::base64_plain("me", PASSWORD)));
    assert!(done.contains(" OK "), "{done}");
    other.send(b"b1 APPEND INBOX {20000}\r\n");
    assert!(other.line().starts_with('+'), "a logged-in client may send a large literal");
    other.send(format!("{}\r\n", "y".repeat(20000)).as_bytes());
    assert!(other.until("b1").1.contains(" OK "));
    let mut third = Raw::login(daemon.imap, "me");
    assert!(third.cmd("NOOP").1.contains(" OK "), "the daemon keeps serving");
}

#[tokio::test(flavor = "multi_thread")]
async fn mailbox_names_are_modified_utf7_on_the_wire_and_utf8_in_the_store() {
    let mut daemon = Daemon::start();
    let mut s = login(daemon.imap, "me").await;
    // RFC 3501 §5.1.3: clients send and see "Entwürfe" as "Entw&APw-rfe", "Ä" as "&AMQ-".
    s.create("Entw&APw-rfe").await.unwrap();
    s.create("&AMQ-/Unter").await.unwrap();
    s.create("Tom &- Jerry").await.unwrap();
    let names = |list: Vec<async_imap::types::Name>| {
        let mut names: Vec<String> = list.iter().map(|n| n.name().to_string()).collect();
        names.sort();
        names
    };
    let all = names(s.list(Some(""), Some("*")).await.unwrap().try_collect().await.unwrap());
    for name in ["Entw&APw-rfe", "&AMQ-/Unter", "Tom &- Jerry"] {
        assert!(all.contains(&name.to_string()), "{name} in {all:?}");
    }
    let found = names(s.list(Some(""), Some("Entw&APw-%")).await.unwrap().try_collect().await.unwrap());
    assert_eq!(found, ["Entw&APw-rfe"], "patterns are matched on the decoded names");
    let found = names(s.list(Some("&AMQ-/"), Some("%")).await.unwrap().try_collect().await.unwrap());
    assert_eq!(found, ["&AMQ-/Unter"]);
    s.append("Entw&APw-rfe", None, None, plain("draft", "d")).await.unwrap();
    assert_eq!(s.select("Entw&APw-rfe").await.unwrap().exists, 1);
    s.rename("Entw&APw-rfe", "Entw&APw-rfe (alt)").await.unwrap();
    assert_eq!(s.status("Entw&APw-rfe (alt)", "(MESSAGES)").await.unwrap().exists, 1);
    for invalid in ["&Jjo!", "&AGE-", "&AMQ", "&AOQ-&APY-"] {
        let err = s.create(invalid).await.unwrap_err();
        assert!(matches!(err, async_imap::error::Error::No(_)), "{invalid}: {err:?}");
    }
    s.logout().await.unwrap();
    let mut raw = Raw::login(daemon.imap, "me");
    raw.send("r1 CREATE {9}\r\n".as_bytes());
    assert!(raw.line().starts_with('+'));
    raw.send("Entwürfe\r\n".as_bytes());
    let (_, done) = raw.until("r1");
    assert!(done.starts_with("r1 NO [CANNOT]"), "8-bit names are not modified UTF-7: {done}");
    drop(raw);
    daemon.stop();

    let store = nightmail_store::Store::open(&daemon.data_dir().join("store")).unwrap();
    let mut stored: Vec<String> = store.mailboxes("me").unwrap().into_iter().map(|m| m.name).collect();
    stored.sort();
    assert_eq!(
        stored,
        ["Archive", "Ask", "Ask/kimi", "Drafts", "Entwürfe (alt)", "INBOX", "Sent", "Tom & Jerry", "Trash", "Ä/Unter"]
    );
}

#[test]
fn out_of_range_sequence_sets_are_bad_and_unknown_uids_are_empty() {
    let daemon = Daemon::start();
    let mut raw = Raw::login(daemon.imap, "me");
    append_raw(&mut raw, "INBOX", &plain("one", "1"));
    raw.cmd("SELECT INBOX");
    for command in
        ["FETCH 2 FLAGS", "FETCH 0 FLAGS", "STORE 1:4294967295 +FLAGS (\\Seen)", "COPY 5 Trash", "FETCH 1:* NOTANITEM"]
    {
        let (untagged, done) = raw.cmd(command);
        assert!(done.contains(" BAD "), "{command}: {done}");
        assert!(untagged.iter().all(|l| !l.contains("FETCH")), "{command}: {untagged:?}");
    }
    let (untagged, done) = raw.cmd("UID FETCH 4000000000:* FLAGS");
    assert!(done.contains(" OK "), "{done}");
    assert_eq!(untagged.len(), 1, "n:* always includes the highest UID: {untagged:?}");
    let (untagged, done) = raw.cmd("UID FETCH 7:9 FLAGS");
    assert!(done.contains(" OK ") && untagged.is_empty(), "{untagged:?} {done}");
}

#[test]
fn a_user_never_sees_another_users_mailboxes() {
    let daemon = Daemon::start();
    let mut me = Raw::login(daemon.imap, "me");
    append_raw(&mut me, "INBOX", &plain("private", "mine"));
    me.cmd("CREATE Secret");
    let mut ann = Raw::login(daemon.imap, "ann");
    let (list, _) = ann.cmd("LIST \"\" *");
    assert!(list.iter().all(|l| !l.contains("Secret")), "{list:?}");
    let (untagged, done) = ann.cmd("SELECT INBOX");
    assert!(done.contains(" OK ") && untagged.iter().any(|l| l == "* 0 EXISTS"), "{untagged:?}");
    for command in
        ["SELECT Secret", "STATUS Secret (MESSAGES)", "SELECT me/INBOX", "DELETE Secret", "RENAME Secret Mine"]
    {
        let (untagged, done) = ann.cmd(command);
        assert!(done.contains(" NO "), "{command}: {done}");
        assert!(untagged.iter().all(|l| !l.contains("EXISTS") && !l.contains("STATUS")), "{command}: {untagged:?}");
    }
    ann.cmd("SELECT INBOX");
    let (untagged, _) = ann.cmd("SEARCH TEXT mine");
    assert_eq!(untagged, vec!["* SEARCH"]);
}

#[test]
fn uidplus_codes_and_move_order() {
    let daemon = Daemon::start();
    let mut raw = Raw::login(daemon.imap, "me");
    let done = append_raw(&mut raw, "INBOX", &plain("one", "1"));
    assert!(done.contains("[APPENDUID ") && done.ends_with(" 1] APPEND completed") || done.contains(" 1]"), "{done}");
    append_raw(&mut raw, "INBOX", &plain("two", "2"));
    assert!(append_raw(&mut raw, "Nowhere", &plain("x", "x")).contains("NO [TRYCREATE]"));
    raw.cmd("SELECT INBOX");
    let (_, done) = raw.cmd("UID COPY 1:2 Archive");
    assert!(done.contains("[COPYUID ") && done.contains(" 1:2 1:2]"), "{done}");
    let (untagged, done) = raw.cmd("MOVE 1 Trash");
    assert!(done.contains(" OK "), "{done}");
    assert!(untagged[0].starts_with("* OK [COPYUID ") && untagged[1] == "* 1 EXPUNGE", "{untagged:?}");
    let (_, done) = raw.cmd("COPY 1 Nowhere");
    assert!(done.contains("NO [TRYCREATE]"), "{done}");
}

#[test]
fn another_sessions_changes_arrive_as_expunge_then_exists() {
    let daemon = Daemon::start();
    let mut a = Raw::login(daemon.imap, "me");
    let mut b = Raw::login(daemon.imap, "me");
    for subject in ["one", "two", "three"] {
        append_raw(&mut a, "INBOX", &plain(subject, "x"));
    }
    a.cmd("SELECT INBOX");
    b.cmd("SELECT INBOX");
    b.cmd("STORE 1,3 +FLAGS.SILENT (\\Deleted)");
    b.cmd("EXPUNGE");
    append_raw(&mut b, "INBOX", &plain("four", "x"));
    b.cmd("STORE 1 +FLAGS.SILENT (\\Flagged)");
    let (untagged, _) = a.cmd("NOOP");
    // Highest first, so each number is valid when sent; then the flag change and the new count.
    assert_eq!(&untagged[..2], &["* 3 EXPUNGE", "* 1 EXPUNGE"], "{untagged:?}");
    assert!(untagged.iter().any(|l| l.starts_with("* 1 FETCH (FLAGS (\\Flagged")), "{untagged:?}");
    assert!(untagged.iter().any(|l| l == "* 2 EXISTS"), "{untagged:?}");
    let (untagged, _) = a.cmd("UID FETCH 1:* (UID)");
    assert_eq!(untagged, vec!["* 1 FETCH (UID 2)", "* 2 FETCH (UID 4)"]);
}

#[test]
fn deep_and_malformed_mime_gets_a_bodystructure_not_a_crash() {
    let daemon = Daemon::start();
    let mut raw = Raw::login(daemon.imap, "me");
    let mut deep = String::from("Subject: deep\r\n");
    for i in 0..300 {
        deep.push_str(&format!("Content-Type: multipart/mixed; boundary=\"b{i}\"\r\n\r\n--b{i}\r\n"));
    }
    deep.push_str("Content-Type: text/plain\r\n\r\nleaf\r\n");
    let broken = "Subject: broken\r\nContent-Type: multipart/mixed; boundary=\r\nContent-Transfer-Encoding: base64\r\n\r\n--\r\n=?x?\r\n--x--\r\n--";
    append_raw(&mut raw, "INBOX", &deep);
    append_raw(&mut raw, "INBOX", broken);
    append_raw(&mut raw, "INBOX", "no header at all, just bytes \u{1}\u{7f}");
    raw.cmd("SELECT INBOX");
    let (untagged, done) = raw.cmd("FETCH 1:3 (BODYSTRUCTURE ENVELOPE BODY[1.2.3] BODY.PEEK[2.MIME])");
    assert!(done.contains(" OK "), "{done}");
    assert_eq!(untagged.iter().filter(|l| l.contains("BODYSTRUCTURE")).count(), 3, "{untagged:?}");
    assert!(raw.cmd("NOOP").1.contains(" OK "));
}

#[test]
fn starttls_is_offered_and_login_is_disabled_before_it_off_loopback() {
    let daemon = Daemon::start_with(|dir| {
        common::config(dir, "[tls]\nself_signed = true\n").replacen(
            "[imap]\nlisten = \"127.0.0.1:0\"",
            "[imap]\nlisten = \"0.0.0.0:0\"",
            1,
        )
    });
    let addr = SocketAddr::from(([127, 0, 0, 1], daemon.imap.port()));
    let (mut raw, greeting) = Raw::connect(addr);
    assert!(greeting.contains("STARTTLS") && greeting.contains("LOGINDISABLED"), "{greeting}");
    let (_, done) = raw.cmd(&format!("LOGIN me \"{PASSWORD}\""));
    assert!(done.contains(" NO "), "{done}");
    let (_, done) = raw.cmd("STARTTLS");
    assert!(done.contains(" OK "), "{done}");
    // The handshake itself is exercised by curl below (--ssl-reqd).
    let out = external("curl", "curl")
        .args(["-s", "--ssl-reqd", "-k", "--user", &format!("me:{PASSWORD}")])
        .arg(format!("imap://127.0.0.1:{}/", daemon.imap.port()))
        .output()
        .unwrap();
    assert!(out.status.success(), "curl over STARTTLS: {}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stdout).contains("INBOX"));
}

#[test]
fn logout_says_bye_and_closes() {
    let daemon = Daemon::start();
    let mut raw = Raw::login(daemon.imap, "me");
    let (untagged, done) = raw.cmd("LOGOUT");
    assert!(untagged[0].starts_with("* BYE"), "{untagged:?}");
    assert!(done.contains(" OK "), "{done}");
    assert!(raw.closed());
}

#[test]
fn uidvalidity_and_uids_survive_a_restart() {
    let mut daemon = Daemon::start();
    let (before, uidnext) = {
        let mut raw = Raw::login(daemon.imap, "me");
        append_raw(&mut raw, "INBOX", &plain("keep", "x"));
        let (untagged, _) = raw.cmd("SELECT INBOX");
        let find = |code: &str| untagged.iter().find(|l| l.contains(code)).cloned().unwrap();
        (find("UIDVALIDITY"), find("UIDNEXT"))
    };
    daemon.stop();
    daemon.restart();
    let mut raw = Raw::login(daemon.imap, "me");
    let (untagged, _) = raw.cmd("SELECT INBOX");
    assert!(untagged.contains(&before) && untagged.contains(&uidnext), "{untagged:?}");
}

fn python(daemon: &Daemon, script: &str) -> String {
    let out = external("python3", "python3")
        .arg("-c")
        .arg(script)
        .env("PORT", daemon.imap.port().to_string())
        .env("PASSWORD", PASSWORD)
        .output()
        .unwrap();
    assert!(out.status.success(), "python failed: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn python_imaplib_lists_fetches_and_searches() {
    let daemon = Daemon::start();
    deliver(&daemon, "from smtp", "hello imaplib");
    let out = python(
        &daemon,
        r#"
import imaplib, os
m = imaplib.IMAP4("127.0.0.1", int(os.environ["PORT"]))
m.login("me", os.environ["PASSWORD"])
typ, boxes = m.list()
print("LIST", typ, sorted(b.decode().split(' "/" ')[1] for b in boxes))
typ, data = m.select("INBOX")
print("SELECT", typ, data[0].decode())
typ, data = m.search(None, "SUBJECT", '"from smtp"')
print("SEARCH", typ, data[0].decode())
typ, data = m.fetch("1", "(BODY.PEEK[TEXT])")
print("FETCH", typ, data[0][1].decode().strip())
typ, data = m.uid("FETCH", "1", "(FLAGS)")
print("UID", typ, data[0].decode())
m.logout()
"#,
    );
    assert!(out.contains("LIST OK ['Archive', 'Ask', 'Ask/kimi', 'Drafts', 'INBOX', 'Sent', 'Trash']"), "{out}");
    assert!(out.contains("SELECT OK 1"), "{out}");
    assert!(out.contains("SEARCH OK 1"), "{out}");
    assert!(out.contains("FETCH OK hello imaplib"), "{out}");
    assert!(out.contains("UID OK 1 (UID 1 FLAGS (\\Recent))"), "{out}");
}

#[test]
fn curl_lists_fetches_and_searches() {
    let daemon = Daemon::start();
    deliver(&daemon, "for curl", "hello curl");
    let base = format!("imap://127.0.0.1:{}", daemon.imap.port());
    let curl = |url: String, extra: &[&str]| {
        let out = external("curl", "curl")
            .args(["-s", "--user", &format!("me:{PASSWORD}")])
            .args(extra)
            .arg(url)
            .output()
            .unwrap();
        assert!(out.status.success(), "curl: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).unwrap()
    };
    let list = curl(format!("{base}/"), &[]);
    assert!(list.contains("INBOX") && list.contains("\\Sent"), "{list}");
    let message = curl(format!("{base}/INBOX;UID=1"), &[]);
    assert!(message.contains("Subject: for curl") && message.contains("hello curl"), "{message}");
    let search = curl(format!("{base}/INBOX?SUBJECT%20curl"), &[]);
    assert!(search.contains("* SEARCH 1"), "{search}");
}

#[test]
fn mutt_opens_inbox_shows_reads_and_saves_a_sent_copy() {
    let daemon = Daemon::start();
    deliver(&daemon, "Question for mutt", "the body mutt opens");
    let dir = daemon.dir.path();
    let port = daemon.imap.port();
    let rc = dir.join("muttrc");
    std::fs::write(
        &rc,
        format!(
            "set folder=imap://me@127.0.0.1:{port}/\nset spoolfile=+INBOX\nset record=+Sent\nset imap_pass=\"{PASSWORD}\"\n\
set ssl_starttls=no\nset ssl_force_tls=no\nset imap_idle=yes\nset sort=threads\nset from=me@nightmail.test\n\
set smtp_url=smtp://me@127.0.0.1:{}/\nset smtp_pass=\"{PASSWORD}\"\nset copy=yes\nset mail_check=1\nset timeout=1\n\
set confirmappend=no\nset abort_unmodified=no\nset editor=true\nset edit_headers=no\nset autoedit=no\nset fast_reply=yes\nset include=yes\n",
            daemon.smtp.port()
        ),
    )
    .unwrap();
    external("mutt", "mutt");
    let name = format!("mutt{}", std::process::id());
    let tmux = common::Tmux::start(&name, &format!("mutt -n -F {}", rc.display()), dir);
    tmux.wait_for("Question for mutt");
    tmux.keys(&["Enter"]);
    tmux.wait_for("the body mutt opens");
    tmux.keys(&["q"]);
    // Reply: the editor is `true`, so the reply is sent as quoted, and Fcc'd to Sent by APPEND.
    tmux.keys(&["r"]);
    tmux.wait_for("y:Send");
    tmux.keys(&["y"]);
    eventually(Duration::from_secs(30), "the reply's copy in Sent", || {
        let mut raw = Raw::login(daemon.imap, "me");
        let (untagged, _) = raw.cmd("STATUS Sent (MESSAGES)");
        untagged.iter().any(|l| l.contains("MESSAGES 1"))
    });
    // mutt marks the opened message read and stores \Seen when it leaves the mailbox.
    tmux.keys(&["q"]);
    eventually(Duration::from_secs(30), "\\Seen on the message mutt opened", || {
        let mut raw = Raw::login(daemon.imap, "me");
        raw.cmd("EXAMINE INBOX");
        let (untagged, _) = raw.cmd("FETCH 1 (FLAGS)");
        untagged[0].contains("\\Seen")
    });
}

#[test]
fn mbsync_mirrors_inbox_to_a_maildir_and_back() {
    let daemon = Daemon::start();
    deliver(&daemon, "sync me", "body");
    deliver(&daemon, "and me", "body");
    let dir = daemon.dir.path();
    let maildir = dir.join("mirror");
    std::fs::create_dir_all(&maildir).unwrap();
    let rc = dir.join("mbsyncrc");
    std::fs::write(
        &rc,
        format!(
            "IMAPAccount nm\nHost 127.0.0.1\nPort {}\nUser me\nPass \"{PASSWORD}\"\nSSLType None\nAuthMechs LOGIN\n\n\
IMAPStore remote\nAccount nm\n\nMaildirStore local\nPath {}/\nInbox {}/INBOX\n\n\
Channel inbox\nFar :remote:INBOX\nNear :local:INBOX\nSync All\nCreate Near\nExpunge Both\nSyncState *\n",
            daemon.imap.port(),
            maildir.display(),
            maildir.display()
        ),
    )
    .unwrap();
    let run = || {
        let out = external("mbsync", "isync").arg("-c").arg(&rc).arg("inbox").env("HOME", dir).output().unwrap();
        assert!(
            out.status.success(),
            "mbsync: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    };
    run();
    let cur_new = |sub: &str| std::fs::read_dir(maildir.join("INBOX").join(sub)).unwrap().count();
    assert_eq!(cur_new("new") + cur_new("cur"), 2, "both messages mirrored");
    // Mark one read locally (Maildir flag S), then sync back: the server sees \Seen.
    let mut moved = false;
    for sub in ["new", "cur"] {
        for entry in std::fs::read_dir(maildir.join("INBOX").join(sub)).unwrap() {
            let path = entry.unwrap().path();
            if moved {
                continue;
            }
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            let base = name.split(":2,").next().unwrap().to_string();
            std::fs::rename(&path, maildir.join("INBOX/cur").join(format!("{base}:2,S"))).unwrap();
            moved = true;
        }
    }
    run();
    let mut raw = Raw::login(daemon.imap, "me");
    raw.cmd("EXAMINE INBOX");
    let (untagged, _) = raw.cmd("SEARCH SEEN");
    assert_eq!(untagged.len(), 1);
    assert_eq!(untagged[0].split(' ').count(), 3, "exactly one message is \\Seen: {untagged:?}");
}
