//! `nightmail check --reindex` through the real binary: through a running daemon (which holds the
//! store) and with none; a line per user with their message count, and afterwards each user's
//! search finds their own mail and never another's.

mod common;

use common::{Daemon, Raw};
use nightmail_mailindex::MailIndex;
use nightmail_types::Address;

fn send(daemon: &Daemon, to: &str, subject: &str, body: &str) {
    let mut smtp = Raw::login(daemon.smtp);
    assert!(smtp.cmd("MAIL FROM:<me@nightmail.test>").starts_with("250"));
    assert!(smtp.cmd(&format!("RCPT TO:<{to}>")).starts_with("250"));
    assert!(smtp.cmd("DATA").starts_with("354"));
    smtp.send(format!("From: me@nightmail.test\r\nTo: {to}\r\nSubject: {subject}\r\n\r\n{body}\r\n.\r\n").as_bytes());
    assert!(smtp.reply().starts_with("250"));
}

fn stdout(out: &std::process::Output) -> String {
    assert!(out.status.success(), "{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn check_reindex_prints_each_users_count_and_search_then_works() {
    let mut daemon = Daemon::start();
    send(&daemon, "me@nightmail.test", "Lighthouse", "the lighthouse keeper wrote back");
    send(&daemon, "me@nightmail.test", "Groceries", "eggs and flour");
    send(&daemon, "ann@nightmail.test", "Lighthouse lighthouse", "ann's lighthouse lighthouse secret");

    let text = stdout(&daemon.cli(&["check", "--reindex"]));
    assert!(text.contains("every index points at existing records and bytes"), "{text}");
    assert!(text.contains("mail index of me@nightmail.test: 2 messages"), "{text}");
    assert!(text.contains("mail index of ann@nightmail.test: 1 messages"), "{text}");
    daemon.stop();

    // With no daemon, the command opens the store itself; the rebuild starts from scratch again.
    let text = stdout(&daemon.cli(&["check", "--reindex"]));
    assert!(text.contains("mail index of me@nightmail.test: 2 messages"), "{text}");

    let index = MailIndex::open(&daemon.data_dir().join("mail_index")).unwrap();
    let me = Address::parse("me@nightmail.test").unwrap();
    let hits = index.search(&me, "lighthouse secret", 10).unwrap();
    assert_eq!(hits.len(), 1, "{hits:?}");
    assert_eq!((hits[0].subject.as_str(), hits[0].mailbox.as_str()), ("Lighthouse", "INBOX"));
    assert!(hits.iter().all(|h| !h.snippet.contains("secret")), "ann's mail reached me: {hits:?}");
    let ann = Address::parse("ann@nightmail.test").unwrap();
    assert_eq!(index.search(&ann, "lighthouse", 10).unwrap()[0].subject, "Lighthouse lighthouse");
}
