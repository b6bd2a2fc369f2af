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
ready, asked = threading.Barrier(SESSIONS), threading.Barrier(SESSIONS)
accepted, sent = [0] * SESSIONS, [None] * SESSIONS
def session(i):
    c = smtplib.SMTP("127.0.0.1", int(os.environ["SMTP"]))
    c.login("me", os.environ["PASSWORD"])
    c.mail("me@nightmail.test")
    ready.wait()
    for j in range(100):
        if c.rcpt("r%d-%d@example.org" % (i, j))[0] == 250:
            accepted[i] += 1
    asked.wait()
    if accepted[i]:
        sent[i] = c.data(b"From: me@nightmail.test\r\nSubject: many\r\n\r\nhello\r\n")[0]
    c.quit()
threads = [threading.Thread(target=session, args=(i,)) for i in range(SESSIONS)]
for t in threads: t.start()
for t in threads: t.join()
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
