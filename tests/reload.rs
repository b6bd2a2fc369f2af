//! SIGHUP reloads the configuration without dropping a connection: sessions opened before keep
//! working, a new login needs the new password, a new TLS handshake presents the new certificate
//! (python's ssl), and a configuration that does not parse, or names a certificate that does not
//! load, is refused with a log line while the daemon keeps serving the running one. A changed
//! `[[model]]` list takes effect (added, changed, removed) without dropping a queued job; a
//! restart without a queued question's model ends that question with a notice to its asker.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::path::Path;
use std::time::{Duration, Instant};

use common::{Daemon, PASSWORD, Raw, RecordingBackend, base64_plain};

const NEW_PASSWORD: &str = "new battery staple";

/// A self-signed certificate for localhost, written as `name.pem` and `name.key`; returns its DER
/// in hex, as python prints the peer's.
fn certificate(dir: &Path, name: &str) -> String {
    let made = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).unwrap();
    std::fs::write(dir.join(format!("{name}.pem")), made.cert.pem()).unwrap();
    std::fs::write(dir.join(format!("{name}.key")), made.signing_key.serialize_pem()).unwrap();
    made.cert.der().iter().map(|b| format!("{b:02x}")).collect()
}

fn config(dir: &Path, cert: &str, password: &str) -> String {
    let tls = format!(
        "[tls]\ncert = \"{}\"\nkey = \"{}\"\n\n[smtp]\n",
        dir.join(format!("{cert}.pem")).display(),
        dir.join(format!("{cert}.key")).display()
    );
    common::config(dir, "").replace("[smtp]\n", &tls).replacen(
        &format!("password = \"{PASSWORD}\""),
        &format!("password = \"{password}\""),
        1,
    )
}

/// The certificate a new STARTTLS handshake presents, as DER in hex.
fn presented(daemon: &Daemon) -> String {
    let script = r#"
import os, smtplib, ssl
ctx = ssl.create_default_context()
ctx.check_hostname = False
ctx.verify_mode = ssl.CERT_NONE
s = smtplib.SMTP("127.0.0.1", int(os.environ["SMTP"]), timeout=30)
s.starttls(context=ctx)
print(s.sock.getpeercert(binary_form=True).hex())
s.quit()
"#;
    common::python(daemon, script).trim().to_string()
}

/// A new SMTP login as `me` with `password`: the reply to AUTH.
fn login(daemon: &Daemon, password: &str) -> String {
    let mut raw = Raw::connect(daemon.smtp);
    assert!(raw.reply().starts_with("220 "));
    assert!(raw.cmd("EHLO test").starts_with("250 "));
    raw.cmd(&format!("AUTH PLAIN {}", base64_plain("me", password)))
}

fn hup(daemon: &Daemon) {
    let status = std::process::Command::new("kill").args(["-HUP", &daemon.pid().to_string()]).status().unwrap();
    assert!(status.success());
}

/// Waits until the daemon's log holds `count` lines containing `text`.
fn wait_for_log(daemon: &Daemon, text: &str, count: usize) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while daemon.log().matches(text).count() < count {
        assert!(Instant::now() < deadline, "no log line {text:?} (×{count}) within 30 s:\n{}", daemon.log());
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// An IMAP connection in the clear (loopback), logged in as `me`.
struct Imap {
    stream: TcpStream,
    reader: BufReader<TcpStream>,
}

impl Imap {
    fn login(daemon: &Daemon) -> Imap {
        let stream = TcpStream::connect(daemon.imap).unwrap();
        stream.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        let mut imap = Imap { reader: BufReader::new(stream.try_clone().unwrap()), stream };
        let mut greeting = String::new();
        imap.reader.read_line(&mut greeting).unwrap();
        assert!(greeting.starts_with("* OK"), "{greeting}");
        let done = imap.cmd("a1", &format!("LOGIN me \"{PASSWORD}\""));
        assert!(done.starts_with("a1 OK"), "{done}");
        imap
    }

    /// Sends `tag command` and returns the tagged completion.
    fn cmd(&mut self, tag: &str, command: &str) -> String {
        self.stream.write_all(format!("{tag} {command}\r\n").as_bytes()).unwrap();
        loop {
            let mut line = String::new();
            assert!(self.reader.read_line(&mut line).unwrap() > 0, "the IMAP connection was closed");
            if line.starts_with(tag) {
                return line.trim_end().to_string();
            }
        }
    }
}

#[test]
fn sighup_reloads_passwords_and_certificates_and_keeps_sessions() {
    let daemon = Daemon::start_logged(|dir| {
        let first = certificate(dir, "first");
        std::fs::write(dir.join("first.hex"), first).unwrap();
        config(dir, "first", PASSWORD)
    });
    let dir = daemon.dir.path().to_path_buf();
    let first = std::fs::read_to_string(dir.join("first.hex")).unwrap();
    let second = certificate(&dir, "second");
    assert_eq!(presented(&daemon), first);

    // Sessions opened under the old configuration.
    let mut smtp = Raw::login(daemon.smtp);
    let mut imap = Imap::login(&daemon);

    std::fs::write(&daemon.config, config(&dir, "second", NEW_PASSWORD)).unwrap();
    hup(&daemon);
    wait_for_log(&daemon, "SIGHUP: configuration reloaded", 1);

    assert_eq!(login(&daemon, NEW_PASSWORD), "235 2.7.0 Authentication successful");
    assert!(login(&daemon, PASSWORD).starts_with("535 "), "the old password still works");
    assert_eq!(presented(&daemon), second, "a new handshake presents the old certificate");

    // The old sessions go on: a message over the SMTP session logged in before, and IMAP commands.
    assert!(smtp.cmd("MAIL FROM:<me@nightmail.test>").starts_with("250"));
    assert!(smtp.cmd("RCPT TO:<ann@nightmail.test>").starts_with("250"));
    assert!(smtp.cmd("DATA").starts_with("354"));
    let queued = smtp.cmd("Subject: across the reload\r\n\r\nstill here\r\n.");
    assert!(queued.starts_with("250 "), "{queued}");
    assert!(imap.cmd("a2", "SELECT INBOX").starts_with("a2 OK"));
    assert!(imap.cmd("a3", "NOOP").starts_with("a3 OK"));

    // A file that does not parse: refused, logged, the running configuration kept.
    std::fs::write(&daemon.config, "this is = = not toml\n").unwrap();
    hup(&daemon);
    wait_for_log(&daemon, "SIGHUP: kept the running configuration", 1);
    assert_eq!(login(&daemon, NEW_PASSWORD), "235 2.7.0 Authentication successful");
    assert_eq!(presented(&daemon), second);

    // A certificate that does not load: the same.
    let broken = config(&dir, "missing", "a third password");
    std::fs::write(&daemon.config, broken).unwrap();
    hup(&daemon);
    wait_for_log(&daemon, "SIGHUP: kept the running configuration", 2);
    assert!(daemon.log().contains("missing.pem"), "the log names the file: {}", daemon.log());
    assert_eq!(login(&daemon, NEW_PASSWORD), "235 2.7.0 Authentication successful");
    assert!(login(&daemon, "a third password").starts_with("535 "));
    assert_eq!(presented(&daemon), second);
    assert!(imap.cmd("a4", "NOOP").starts_with("a4 OK"), "the IMAP session survived every reload");
    assert!(smtp.cmd("NOOP").starts_with("250"), "the SMTP session survived every reload");
}

/// The test configuration with one worker, kimi answered by `kimi_url` with system prompt
/// `prompt`, and, if `second` is given, a second model `second@` answered by that URL.
fn models_config(dir: &Path, kimi_url: &str, prompt: &str, second: Option<&str>) -> String {
    let mut text = common::config_answering(dir, "", kimi_url, 1)
        .replace("[worker]\n", &format!("system_prompt = \"{prompt}\"\n\n[worker]\n"));
    if let Some(url) = second {
        let entry =
            format!("[[model]]\naddress = \"second@nightmail.test\"\nbackend = \"openai\"\nurl = \"{url}\"\n\n");
        text = text.replace("[worker]\n", &format!("{entry}[worker]\n"));
    }
    text
}

/// The state of the job whose subject is `subject`, if it exists.
fn state(daemon: &Daemon, subject: &str) -> Option<String> {
    let jobs = daemon.jobs();
    jobs.iter().find(|j| j["subject"] == subject).map(|j| j["state"].as_str().unwrap_or("").to_string())
}

/// Asks `to` with Python's smtplib, logged in as me.
fn ask(daemon: &Daemon, to: &str, subject: &str) {
    let script = format!(
        r#"
import os, smtplib
with smtplib.SMTP("127.0.0.1", int(os.environ["SMTP"]), timeout=30) as s:
    s.login("me", os.environ["PASSWORD"])
    s.sendmail("me@nightmail.test", ["{to}"], "From: me@nightmail.test\r\nTo: {to}\r\nSubject: {subject}\r\n\r\nWhat now?\r\n")
print("sent")
"#
    );
    assert_eq!(common::python(daemon, &script).trim(), "sent");
}

#[test]
fn sighup_adds_changes_and_removes_models_without_dropping_jobs() {
    // kimi answers slowly (two pieces, a second apart), so a second question waits behind it.
    let kimi = RecordingBackend::streaming(&["Slowly ", "noted."], Duration::from_secs(1));
    let second = RecordingBackend::answering("Second here.");
    let daemon = Daemon::start_logged(|dir| models_config(dir, &kimi.url, "PROMPT-ONE", None));
    let dir = daemon.dir.path().to_path_buf();
    let mut before = Raw::login(daemon.smtp);

    // Added: second@ becomes a recipient and is answered; kimi's system prompt changes.
    std::fs::write(&daemon.config, models_config(&dir, &kimi.url, "PROMPT-TWO", Some(&second.url))).unwrap();
    hup(&daemon);
    wait_for_log(&daemon, "SIGHUP: configuration reloaded", 1);
    ask(&daemon, "second@nightmail.test", "to the new model");
    common::eventually(Duration::from_secs(30), "the new model's answer", || {
        state(&daemon, "to the new model").as_deref() == Some("done")
    });
    assert_eq!(second.prompts().len(), 1);

    // Changed: the next kimi job runs with the new system prompt.
    ask(&daemon, "kimi@nightmail.test", "under the new prompt");
    common::eventually(Duration::from_secs(30), "kimi's job running", || !kimi.prompts().is_empty());
    let prompt = &kimi.prompts()[0];
    assert!(prompt.contains("PROMPT-TWO") && !prompt.contains("PROMPT-ONE"), "{prompt}");

    // Removed while a question to it waits behind kimi's answer: refused as a recipient from now
    // on, and the waiting question is still answered. kimi moves to another server in the same
    // reload: its running answer finishes on the first, the next question goes to the new one.
    let moved = RecordingBackend::answering("From the new server.");
    ask(&daemon, "second@nightmail.test", "queued before the removal");
    std::fs::write(&daemon.config, models_config(&dir, &moved.url, "PROMPT-TWO", None)).unwrap();
    hup(&daemon);
    wait_for_log(&daemon, "SIGHUP: configuration reloaded", 2);
    assert_eq!(
        state(&daemon, "queued before the removal").as_deref(),
        Some("queued"),
        "the question was not waiting at the reload: kimi answered too fast for this test"
    );
    let mut after = Raw::login(daemon.smtp);
    assert!(after.cmd("MAIL FROM:<me@nightmail.test>").starts_with("250"));
    // Refused as any address that is no user and no model is.
    let refused = after.cmd("RCPT TO:<second@nightmail.test>");
    assert!(refused.starts_with("550 "), "{refused}");
    assert_eq!(refused, after.cmd("RCPT TO:<nobody@nightmail.test>"));
    common::eventually(Duration::from_secs(30), "the queued question answered", || {
        state(&daemon, "queued before the removal").as_deref() == Some("done")
    });
    assert_eq!(second.prompts().len(), 2);
    assert_eq!(state(&daemon, "under the new prompt").as_deref(), Some("done"));
    assert_eq!((kimi.prompts().len(), moved.prompts().len()), (1, 0), "the running job changed servers");

    // A local model whose file is not there: refused, logged, the running models kept.
    let missing = dir.join("no-such-model.gguf");
    let bad = models_config(&dir, &moved.url, "PROMPT-TWO", None).replace(
        "[worker]\n",
        &format!(
            "[[model]]\naddress = \"local@nightmail.test\"\nbackend = \"local\"\npath = \"{}\"\n\n[worker]\n",
            missing.display()
        ),
    );
    std::fs::write(&daemon.config, bad).unwrap();
    hup(&daemon);
    wait_for_log(&daemon, "SIGHUP: kept the running configuration", 1);
    assert!(daemon.log().contains("no-such-model.gguf"), "the log names the file: {}", daemon.log());
    let local = after.cmd("RCPT TO:<local@nightmail.test>");
    assert!(local.starts_with("550 "), "{local}");
    assert!(after.cmd("RCPT TO:<kimi@nightmail.test>").starts_with("250"));

    // The session opened before every reload still takes a question.
    assert!(before.cmd("MAIL FROM:<me@nightmail.test>").starts_with("250"));
    assert!(before.cmd("RCPT TO:<kimi@nightmail.test>").starts_with("250"));
    assert!(before.cmd("DATA").starts_with("354"));
    let queued = before.cmd("Subject: across three reloads\r\n\r\nstill here\r\n.");
    assert!(queued.starts_with("250 "), "{queued}");
    common::eventually(Duration::from_secs(30), "the last question answered", || {
        state(&daemon, "across three reloads").as_deref() == Some("done")
    });
    assert_eq!((kimi.prompts().len(), moved.prompts().len()), (1, 1), "the next job went to the new server");
}

#[test]
fn sighup_keeps_the_running_worker_settings_and_says_a_restart_is_needed() {
    let daemon = Daemon::start_logged(|dir| common::config(dir, ""));
    let changed = common::config(daemon.dir.path(), "").replace("concurrency = 0", "concurrency = 3");
    std::fs::write(&daemon.config, changed).unwrap();
    hup(&daemon);
    wait_for_log(&daemon, "need a restart", 1);
    assert!(daemon.log().contains("[worker]"), "{}", daemon.log());
    // The worker still has no slots: mail to the model is queued, not answered.
    common::ask_kimi(&daemon, "Subject: still queued\r\n\r\nhello");
    assert_eq!(state(&daemon, "still queued").as_deref(), Some("queued"));
}

#[test]
fn sighup_refuses_to_remove_the_model_of_a_running_bridge() {
    let bridged = |dir: &Path| {
        std::fs::write(dir.join("bridge.pw"), "secret").unwrap();
        format!(
            "[[model]]\naddress = \"bot@nightmail.test\"\nbackend = \"openai\"\nurl = \"http://127.0.0.1:9/v1\"\n\n\
             [[bridge]]\nmodel = \"bot@nightmail.test\"\naddress = \"bot@fastmail.test\"\nimap_host = \"127.0.0.1\"\n\
             imap_port = 9\nimap_tls = \"none\"\nsmtp_host = \"127.0.0.1\"\nsmtp_port = 9\nsmtp_tls = \"none\"\n\
             user = \"bot\"\npassword_file = \"{}\"\nallow = [\"me@example.com\"]\nauth_serv_id = \"fastmail.test\"\n",
            dir.join("bridge.pw").display()
        )
    };
    let daemon = Daemon::start_logged(|dir| common::config(dir, &bridged(dir)));
    // The file drops the bridge and its model: the bridge runs until a restart, so it is refused.
    std::fs::write(&daemon.config, common::config(daemon.dir.path(), "")).unwrap();
    hup(&daemon);
    wait_for_log(&daemon, "SIGHUP: kept the running configuration", 1);
    assert!(daemon.log().contains("bridges need a restart"), "{}", daemon.log());
    let mut raw = Raw::login(daemon.smtp);
    assert!(raw.cmd("MAIL FROM:<me@nightmail.test>").starts_with("250"));
    let bot = raw.cmd("RCPT TO:<bot@nightmail.test>");
    assert!(bot.starts_with("250"), "the bridge's model is still taken: {bot}");
}

#[test]
fn a_restart_without_a_questions_model_ends_it_with_a_notice_from_that_address() {
    let second =
        "[[model]]\naddress = \"second@nightmail.test\"\nbackend = \"openai\"\nurl = \"http://127.0.0.1:9/v1\"\n";
    // No worker: the question waits in the queue.
    let mut daemon = Daemon::start_with(|dir| common::config(dir, second));
    ask(&daemon, "second@nightmail.test", "asked before the restart");
    assert_eq!(state(&daemon, "asked before the restart").as_deref(), Some("queued"));
    daemon.stop();

    // Restarted with a worker and without second@: the question cannot be answered, and says so.
    let kimi = RecordingBackend::answering("not asked");
    std::fs::write(&daemon.config, common::config_answering(daemon.dir.path(), "", &kimi.url, 1)).unwrap();
    daemon.restart();
    common::eventually(Duration::from_secs(30), "the question to end", || {
        state(&daemon, "asked before the restart").as_deref() == Some("failed")
    });
    let job = daemon.jobs().into_iter().find(|j| j["subject"] == "asked before the restart").unwrap();
    assert!(job["reason"].as_str().unwrap().contains("no longer a model address"), "{job}");
    daemon.stop();
    let inbox = daemon.mailbox("me", "INBOX");
    assert_eq!(inbox.len(), 1, "{inbox:?}");
    let notice = &inbox[0];
    assert!(common::header(notice, "From").unwrap().contains("second@nightmail.test"), "{notice}");
    assert_eq!(common::header(notice, "Subject").as_deref(), Some("Re: asked before the restart"));
    let failure = common::header(notice, "X-Nightmail-Failure").unwrap();
    assert!(failure.contains("second@nightmail.test is no longer a model address"), "{failure}");
    assert!(kimi.prompts().is_empty(), "no other model was asked");
}
