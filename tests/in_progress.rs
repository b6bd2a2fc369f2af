//! The `In Progress` folder, end to end: while a model writes an answer (a model server streaming
//! slowly), the asker's `In Progress` mailbox holds one message with the answer so far, threaded
//! under the question and replaced as it grows; it is gone when the answer is delivered. Read with
//! Python's imaplib and with mutt; and a daemon killed mid-answer leaves exactly one.

mod common;

use std::time::Duration;

use common::{Daemon, RecordingBackend, header, wait_for_jobs};

/// A model server writing `n` pieces (`word0 word1 ...`), `gap` apart.
fn slow_backend(n: usize, gap: Duration) -> RecordingBackend {
    let pieces: Vec<String> = (0..n).map(|i| format!("word{i} ")).collect();
    let pieces: Vec<&str> = pieces.iter().map(String::as_str).collect();
    RecordingBackend::streaming(&pieces, gap)
}

/// The test configuration answering through `backend`, the In Progress message replaced every second.
fn config(dir: &std::path::Path, backend: &RecordingBackend) -> String {
    common::config_answering(dir, "", &backend.url, 1).replace("[worker]\n", "progress_every_secs = 1\n\n[worker]\n")
}

/// Asks the model over SMTP (smtplib), as me@.
const ASK: &str = r#"
import imaplib, os, smtplib, sys, time
from email.message import EmailMessage
q = EmailMessage()
q["From"] = "Me <me@nightmail.test>"
q["To"] = "kimi@nightmail.test"
q["Subject"] = "A slow answer"
q["Message-ID"] = "<slow-q@client.test>"
q.set_content("Count for me, slowly.")
with smtplib.SMTP("127.0.0.1", int(os.environ["SMTP"]), timeout=30) as s:
    s.login("me", os.environ["PASSWORD"])
    s.send_message(q)
"#;

/// imaplib: waits until `In Progress` holds the answer so far, and prints that message's headers
/// and text.
const WAIT_FOR_PARTIAL: &str = r#"
m = imaplib.IMAP4("127.0.0.1", int(os.environ["IMAP"]))
m.login("me", os.environ["PASSWORD"])
deadline = time.time() + 60
while True:
    typ, data = m.select('"In Progress"', readonly=True)
    if typ == "OK" and int(data[0]) == 1:
        typ, data = m.fetch("1", "(BODY.PEEK[])")
        # Replaced between the SELECT and the FETCH: the server answers NO (RFC 2180 4.1.3).
        if typ == "OK" and isinstance(data[0], tuple) and "word1 " in data[0][1].decode():
            print(data[0][1].decode())
            break
    if time.time() > deadline:
        sys.exit("In Progress never held the answer so far")
    time.sleep(0.1)
m.logout()
"#;

/// imaplib: a session selected on `In Progress` sees the message replaced (EXPUNGE, then EXISTS)
/// and then removed; prints what it saw.
const WATCH_UNTIL_DELIVERED: &str = r#"
m = imaplib.IMAP4("127.0.0.1", int(os.environ["IMAP"]))
m.login("me", os.environ["PASSWORD"])
typ, data = m.select('"In Progress"')
count = int(data[0])
expunges = exists = 0
deadline = time.time() + 120
while True:
    m.noop()
    got = m.untagged_responses
    for n in got.pop("EXPUNGE", []):
        if n is not None:
            expunges += 1
            count -= 1
    for n in got.pop("EXISTS", []):
        if n is not None:
            exists += 1
            count = int(n)
    typ, data = m.status("INBOX", "(MESSAGES)")
    if count == 0 and b"MESSAGES 1" in data[0]:
        break
    if time.time() > deadline:
        sys.exit(f"still {count} in In Progress, or no answer in INBOX: {data}")
    time.sleep(0.1)
typ, data = m.select('"In Progress"', readonly=True)
print(f"expunges={expunges} exists={exists} left={int(data[0])}")
m.logout()
"#;

#[test]
fn the_in_progress_folder_holds_the_answer_so_far_until_it_is_delivered() {
    // 50 pieces, 200 ms apart: an answer that takes 10 s.
    let backend = slow_backend(50, Duration::from_millis(200));
    let daemon = Daemon::start_with(|dir| config(dir, &backend));
    let partial = common::python(&daemon, &format!("{ASK}{WAIT_FOR_PARTIAL}"));
    assert_eq!(header(&partial, "In-Reply-To").as_deref(), Some("<slow-q@client.test>"), "{partial}");
    assert_eq!(header(&partial, "Subject").as_deref(), Some("Re: A slow answer"), "{partial}");
    assert!(partial.contains("This answer is being written"), "{partial}");
    assert!(!partial.contains("word49"), "the answer is not finished yet: {partial}");

    // mutt lists the message in the In Progress folder.
    let rc = daemon.dir.path().join("muttrc-progress");
    std::fs::write(
        &rc,
        format!(
            "set folder=imap://me@127.0.0.1:{}/\nset spoolfile=\"+In Progress\"\nset imap_pass=\"{}\"\nset ssl_starttls=no\n\
set ssl_force_tls=no\nset index_format=\"%4C %s\"\nset timeout=1\nset mail_check=1\n",
            daemon.imap.port(),
            common::PASSWORD
        ),
    )
    .unwrap();
    let tmux = common::Tmux::start(
        &format!("inprogress{}", std::process::id()),
        &format!("mutt -n -F {}", rc.display()),
        daemon.dir.path(),
    );
    tmux.wait_for("Re: A slow answer");
    assert!(tmux.screen().contains("In Progress"), "{}", tmux.screen());
    tmux.keys(&["q"]);

    let seen = common::python(&daemon, &format!("import imaplib, os, sys, time\n{WATCH_UNTIL_DELIVERED}"));
    assert!(seen.contains("left=0"), "{seen}");
    let expunges: u32 = seen.split("expunges=").nth(1).unwrap().split(' ').next().unwrap().parse().unwrap();
    assert!(expunges >= 2, "replaced at least once, then removed: {seen}");
    let jobs = wait_for_jobs(&daemon, 1, Duration::from_secs(60));
    assert_eq!(jobs[0]["state"], "done");
}

/// The Message-IDs in me@'s In Progress folder, read with imaplib.
fn progress_ids(daemon: &Daemon) -> Vec<String> {
    let script = r#"
import imaplib, os
m = imaplib.IMAP4("127.0.0.1", int(os.environ["IMAP"]))
m.login("me", os.environ["PASSWORD"])
typ, data = m.select('"In Progress"', readonly=True)
if typ == "OK" and int(data[0]) > 0:
    typ, data = m.fetch("1:*", "(BODY.PEEK[HEADER.FIELDS (MESSAGE-ID)])")
    for item in data:
        if isinstance(item, tuple):
            print(item[1].decode().split(":", 1)[1].strip())
m.logout()
"#;
    common::python(daemon, script).lines().map(str::to_string).collect()
}

#[test]
fn a_job_killed_mid_answer_leaves_one_progress_message_after_restart() {
    // 100 pieces, 100 ms apart: 10 s, long enough to be killed in the middle.
    let backend = slow_backend(100, Duration::from_millis(100));
    let mut daemon = Daemon::start_with(|dir| config(dir, &backend));
    common::python(&daemon, &format!("{ASK}{WAIT_FOR_PARTIAL}"));
    daemon.kill9();
    let left = daemon.mailbox("me", "In Progress");
    assert_eq!(left.len(), 1, "the killed attempt's message is still there");
    let before = header(&left[0], "Message-ID").unwrap();

    daemon.restart();
    // The job runs again and replaces its old message: never two, and in the end a new one.
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let ids = progress_ids(&daemon);
        assert!(ids.len() <= 1, "one progress message per job: {ids:?}");
        if ids.len() == 1 && ids[0] != before {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "the resumed job never replaced {before}: {ids:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
    let jobs = wait_for_jobs(&daemon, 1, Duration::from_secs(60));
    assert_eq!(jobs[0]["state"], "done");
    assert!(progress_ids(&daemon).is_empty(), "gone once the answer is delivered");
}

/// `progress_mail_every_hours`: a long answer also mails its asker the answer so far, threaded
/// under the question, before the answer itself.
#[test]
fn a_long_answer_mails_the_answer_so_far_when_asked_to() {
    // 40 pieces, 100 ms apart (4 s), a progress mail every 1.8 s (0.0005 h).
    let backend = slow_backend(40, Duration::from_millis(100));
    let mut daemon = Daemon::start_with(|dir| {
        config(dir, &backend)
            .replace("progress_every_secs = 1\n", "progress_every_secs = 1\nprogress_mail_every_hours = 0.0005\n")
    });
    common::python(&daemon, ASK);
    let jobs = wait_for_jobs(&daemon, 1, Duration::from_secs(60));
    assert_eq!(jobs[0]["state"], "done");
    daemon.stop();
    let inbox = daemon.mailbox("me", "INBOX");
    let text = |m: &String| {
        let parsed = mail_parser::MessageParser::default().parse(m.as_bytes()).unwrap();
        parsed.body_text(0).unwrap().into_owned()
    };
    let progress: Vec<&String> = inbox.iter().filter(|m| text(m).contains("still being answered")).collect();
    assert!(!progress.is_empty(), "no progress mail: {inbox:?}");
    for mail in &progress {
        assert_eq!(header(mail, "In-Reply-To").as_deref(), Some("<slow-q@client.test>"), "{mail}");
        assert!(text(mail).contains("word0 "), "{mail}");
    }
    let answer = text(inbox.last().unwrap());
    assert!(answer.contains("word39") && !answer.contains("still being answered"), "the answer comes last: {answer}");
    assert!(daemon.mailbox("me", "In Progress").is_empty());
}
