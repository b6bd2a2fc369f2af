//! The Ask folder, end to end: Python's imaplib COPYs, MOVEs and APPENDs mail into `Ask/Kimi` on
//! the real daemon, nightmail's own engine answers (the demo model, as the worker tests run it),
//! and each answer lands once, threaded under the asked message, in the asker's INBOX alone.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{Daemon, header, python, wait_for_jobs};

/// The test configuration with `Kimi` answered by nightmail's engine from the demo model.
fn local_config(dir: &std::path::Path, concurrency: usize) -> String {
    let model = format!(
        "name = \"Kimi\"\nbackend = \"local\"\npath = \"{}\"\nmax_tokens = 16\ntemperature = 0",
        common::demo_model().display()
    );
    common::config_answering(dir, "", "unused", concurrency).replace("backend = \"openai\"\nurl = \"unused\"", &model)
}

/// Python helpers the scripts share: Ann mails `me` over SMTP; `me` logs in over IMAP.
const PRELUDE: &str = r#"
import imaplib, os, smtplib, sys, time
from email.message import EmailMessage
P = os.environ["PASSWORD"]
def from_ann(subject, mid, body, **extra):
    m = EmailMessage()
    m["From"] = "Ann <ann@nightmail.test>"
    m["To"] = "Me <me@nightmail.test>"
    m["Subject"] = subject
    m["Message-ID"] = mid
    for k, v in extra.items():
        m[k.replace("_", "-")] = v
    m.set_content(body)
    with smtplib.SMTP("127.0.0.1", int(os.environ["SMTP"]), timeout=30) as s:
        s.login("ann", P)
        s.send_message(m)
def imap():
    m = imaplib.IMAP4("127.0.0.1", int(os.environ["IMAP"]))
    m.login("me", P)
    return m
# imaplib's uid() returns untagged data only; the tagged OK's text names the job.
def uid_of(m, mid):
    typ, data = m.uid("SEARCH", "HEADER", "Message-ID", mid)
    (uid,) = data[0].split()
    return uid.decode()
"#;

/// The replies in `inbox` threaded under `parent`.
fn replies_to<'a>(inbox: &'a [String], parent: &str) -> Vec<&'a String> {
    inbox.iter().filter(|m| header(m, "In-Reply-To").as_deref() == Some(parent)).collect()
}

#[test]
fn copy_move_and_append_into_ask_each_get_one_private_threaded_answer() {
    let mut daemon = Daemon::start_with(|dir| local_config(dir, 1));
    let script = format!(
        "{PRELUDE}{}",
        r#"
from_ann("Offsite", "<offsite@ann.test>", "Shall we hold the offsite in Lisbon or Porto? Please book by Friday.")
from_ann("Budget", "<budget@ann.test>", "The budget is 5000 euros. Is that enough for ten people?")
m = imap()
print("LIST%", m.list(pattern="%")[1])
print("LIST*", m.list(pattern="Ask/*")[1])
m.select("INBOX")
print("COPY", m._simple_command("UID", "COPY", uid_of(m, "<offsite@ann.test>"), "Ask/Kimi"))
print("MOVE", m._simple_command("UID", "MOVE", uid_of(m, "<budget@ann.test>"), "Ask/Kimi"))
# An automatic mail, saved straight into the folder: the user asks about it on purpose.
shop = b"From: Shop <noreply@shop.test>\r\nTo: me@nightmail.test\r\nSubject: Your order shipped\r\nMessage-ID: <order@shop.test>\r\nAuto-Submitted: auto-generated\r\n\r\nYour order 42 ships on Tuesday.\r\n"
print("APPEND", m.append("Ask/Kimi", None, None, shop))
# Bad input: no message at all, and bytes that are no mail message.
print("EMPTY", m.append("Ask/Kimi", None, None, b""))
print("GARBAGE", m.append("Ask/Kimi", None, None, b"just some words, no header at all"))
m.logout()
"#
    );
    let out = python(&daemon, &script);
    let line = |prefix: &str| {
        out.lines().find(|l| l.starts_with(prefix)).unwrap_or_else(|| panic!("no {prefix} in {out}")).to_string()
    };
    // RFC 3501 §6.3.8: `%` shows the parent, with children; `Ask/*` shows the model's folder.
    assert!(line("LIST%").contains(r#"(\\HasChildren) "/" Ask"#), "{out}");
    assert!(line("LIST*").contains(r#""/" Ask/Kimi"#), "{out}");
    for command in ["COPY", "MOVE", "APPEND"] {
        let l = line(command);
        assert!(l.contains("'OK'") && l.contains("asked kimi@nightmail.test (job"), "{l}");
    }
    assert!(line("EMPTY").contains("'NO'"), "{out}");
    let garbage = line("GARBAGE");
    assert!(garbage.contains("'NO'") && garbage.contains("[CANNOT] not a mail message"), "{garbage}");

    let jobs = wait_for_jobs(&daemon, 3, Duration::from_secs(300));
    assert!(jobs.iter().all(|j| j["state"] == "done"), "{jobs:#?}");
    daemon.stop();
    let inbox = daemon.mailbox("me", "INBOX");
    for asked in ["<offsite@ann.test>", "<budget@ann.test>", "<order@shop.test>"] {
        let replies = replies_to(&inbox, asked);
        assert_eq!(replies.len(), 1, "one answer to {asked} in INBOX: {inbox:#?}");
        let reply = replies[0];
        assert_eq!(header(reply, "From").as_deref(), Some("\"Kimi\" <kimi@nightmail.test>"));
        assert_eq!(header(reply, "To").as_deref(), Some("<me@nightmail.test>"), "to the asker alone: {reply}");
        assert_eq!(header(reply, "Cc"), None, "{reply}");
        assert!(header(reply, "References").unwrap().ends_with(asked), "{reply}");
    }
    assert_eq!(inbox.len(), 4, "Ann's offsite mail, and the three answers (the budget mail was moved out)");
    assert_eq!(daemon.mailbox("me", "Ask/Kimi").len(), 3, "the asked messages stay in the folder");
    assert!(daemon.mailbox("ann", "INBOX").is_empty(), "the thread's author never sees the private answer");
}

#[test]
fn a_question_filed_before_a_crash_is_answered_once_after_it() {
    // No worker at first, so the answer cannot start before the kill.
    let mut daemon = Daemon::start_with(|dir| local_config(dir, 0));
    let script = format!(
        "{PRELUDE}{}",
        r#"
from_ann("Crash", "<crash@ann.test>", "Will the server survive a crash?")
m = imap()
m.select("INBOX")
print("COPY", m._simple_command("UID", "COPY", uid_of(m, "<crash@ann.test>"), "Ask/Kimi"))
"#
    );
    let out = python(&daemon, &script);
    assert!(out.contains("'OK'") && out.contains("asked kimi@nightmail.test"), "{out}");
    daemon.kill9();
    let config = std::fs::read_to_string(&daemon.config).unwrap();
    std::fs::write(&daemon.config, config.replace("concurrency = 0", "concurrency = 1")).unwrap();
    daemon.restart();
    let jobs = wait_for_jobs(&daemon, 1, Duration::from_secs(300));
    assert_eq!(jobs[0]["state"], "done", "{jobs:#?}");
    daemon.stop();
    let inbox = daemon.mailbox("me", "INBOX");
    assert_eq!(replies_to(&inbox, "<crash@ann.test>").len(), 1, "{inbox:#?}");
    assert_eq!(inbox.len(), 2);
}

/// An OpenAI-compatible server on loopback that answers every chat request with "Noted." and
/// keeps the requests, so a test can read the prompt nightmail built.
struct RecordingBackend {
    url: String,
    requests: Arc<Mutex<Vec<serde_json::Value>>>,
}

impl RecordingBackend {
    fn start() -> RecordingBackend {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}/v1", listener.local_addr().unwrap());
        let requests = Arc::new(Mutex::new(Vec::new()));
        let log = requests.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(mut stream) = stream else { break };
                let mut reader = BufReader::new(stream.try_clone().unwrap());
                let mut length = 0;
                loop {
                    let mut line = String::new();
                    if reader.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
                        break;
                    }
                    if let Some((name, value)) = line.split_once(':')
                        && name.eq_ignore_ascii_case("content-length")
                    {
                        length = value.trim().parse().unwrap_or(0);
                    }
                }
                let mut body = vec![0; length];
                if reader.read_exact(&mut body).is_err() {
                    continue;
                }
                log.lock().unwrap().extend(serde_json::from_slice::<serde_json::Value>(&body).ok());
                let events = "data: {\"choices\":[{\"delta\":{\"content\":\"Noted.\"},\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n";
                let _ = stream.write_all(
                    format!(
                        "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{events}",
                        events.len()
                    )
                    .as_bytes(),
                );
            }
        });
        RecordingBackend { url, requests }
    }

    /// The text of every message of every request so far, one string per request.
    fn prompts(&self) -> Vec<String> {
        self.requests.lock().unwrap().iter().map(|r| r["messages"].to_string()).collect()
    }
}

#[test]
fn mail_appended_to_sent_is_thread_context_for_a_later_question() {
    let backend = RecordingBackend::start();
    let mut daemon = Daemon::start_with(|dir| common::config_answering(dir, "", &backend.url, 1));
    let script = format!(
        "{PRELUDE}{}",
        r#"
m = imap()
# mutt's `record`: the user's own message, sent elsewhere, kept in Sent by APPEND only.
mine = b"From: Me <me@nightmail.test>\r\nTo: ann@nightmail.test\r\nSubject: Meeting\r\nMessage-ID: <plan@me.test>\r\n\r\nI propose Thursday at the harbour cafe.\r\n"
print("SENT", m.append("Sent", "(\\Seen)", None, mine))
from_ann("Re: Meeting", "<reply@ann.test>", "Thursday works. Which place did you mean?", In_Reply_To="<plan@me.test>", References="<plan@me.test>")
m.select("INBOX")
deadline = time.time() + 30
while not m.uid("SEARCH", "HEADER", "Message-ID", "<reply@ann.test>")[1][0]:
    if time.time() > deadline:
        sys.exit("Ann's reply never arrived")
    time.sleep(0.1)
    m.noop()
print("COPY", m._simple_command("UID", "COPY", uid_of(m, "<reply@ann.test>"), "Ask/kimi"))
"#
    );
    let out = python(&daemon, &script);
    assert!(out.contains("asked kimi@nightmail.test"), "{out}");
    // The same thread by mail: a follow-up to the model that refers to the Sent message.
    let mut smtp = common::Raw::login(daemon.smtp);
    assert!(smtp.cmd("MAIL FROM:<me@nightmail.test>").starts_with("250"));
    assert!(smtp.cmd("RCPT TO:<kimi@nightmail.test>").starts_with("250"));
    assert!(smtp.cmd("DATA").starts_with("354"));
    smtp.send(b"From: me@nightmail.test\r\nTo: kimi@nightmail.test\r\nSubject: Re: Meeting\r\nMessage-ID: <ask2@me.test>\r\nReferences: <plan@me.test>\r\nIn-Reply-To: <plan@me.test>\r\n\r\nWhat place did I propose?\r\n.\r\n");
    assert!(smtp.reply().starts_with("250"));
    let jobs = wait_for_jobs(&daemon, 2, Duration::from_secs(60));
    assert!(jobs.iter().all(|j| j["state"] == "done"), "{jobs:#?}");
    let prompts = backend.prompts();
    assert_eq!(prompts.len(), 2, "{prompts:#?}");
    let asked = prompts.iter().find(|p| p.contains("Which place did you mean?")).expect("the Ask job's prompt");
    assert!(asked.contains("I propose Thursday at the harbour cafe."), "the Sent message is context: {asked}");
    assert!(asked.contains("The email I am asking about"), "{asked}");
    let mailed = prompts.iter().find(|p| p.contains("What place did I propose?")).expect("the mailed follow-up");
    assert!(mailed.contains("I propose Thursday at the harbour cafe."), "{mailed}");
    daemon.stop();
    let inbox = daemon.mailbox("me", "INBOX");
    assert_eq!(replies_to(&inbox, "<reply@ann.test>").len(), 1);
    assert!(daemon.mailbox("ann", "INBOX").is_empty(), "Ann gets neither answer");
}

/// mutt, as a user would: `s` saves Ann's message into `=Ask/Kimi` (a server-side COPY), and the
/// answer shows up in INBOX's thread view right under her message.
#[test]
fn mutt_saves_a_message_into_ask_and_sees_the_answer_in_the_thread() {
    let daemon = Daemon::start_with(|dir| local_config(dir, 1));
    python(&daemon, &format!("{PRELUDE}from_ann(\"Offsite plans\", \"<mutt@ann.test>\", \"Lisbon or Porto?\")\n"));
    let tmux = common::mutt_threads(&daemon, "ask");
    tmux.wait_for("Offsite plans");
    tmux.keys(&["s"]);
    tmux.wait_for("Save to mailbox");
    tmux.keys(&["C-u", "=Ask/Kimi", "Enter"]);
    let deadline = std::time::Instant::now() + Duration::from_secs(300);
    let mut screen = tmux.screen();
    while !screen.contains("Re: Offsite plans") {
        assert!(
            std::time::Instant::now() < deadline,
            "no answer in mutt's INBOX; jobs {:#?}, screen:\n{screen}",
            daemon.jobs()
        );
        std::thread::sleep(Duration::from_millis(100));
        screen = tmux.screen();
    }
    common::assert_drawn_under(&screen, "Offsite plans", "Re: Offsite plans");
    tmux.keys(&["q"]);
    assert_eq!(daemon.jobs().len(), 1, "one save, one question");
}

/// Filing the same message twice asks twice (docs/MAIL.md): a second answer may be what the user
/// wants, and nothing about a COPY says it was a mistake.
#[test]
fn asking_twice_is_two_questions() {
    let mut daemon = Daemon::start_with(|dir| local_config(dir, 1));
    let script = format!(
        "{PRELUDE}{}",
        r#"
from_ann("Twice", "<twice@ann.test>", "Is Porto far from Lisbon?")
m = imap()
m.select("INBOX")
uid = uid_of(m, "<twice@ann.test>")
print("FIRST", m._simple_command("UID", "COPY", uid, "Ask/Kimi"))
print("SECOND", m._simple_command("UID", "COPY", uid, "Ask/Kimi"))
"#
    );
    let out = python(&daemon, &script);
    assert_eq!(out.matches("asked kimi@nightmail.test (job").count(), 2, "{out}");
    let jobs = wait_for_jobs(&daemon, 2, Duration::from_secs(300));
    assert!(jobs.iter().all(|j| j["state"] == "done"), "{jobs:#?}");
    daemon.stop();
    assert_eq!(replies_to(&daemon.mailbox("me", "INBOX"), "<twice@ann.test>").len(), 2);
}
