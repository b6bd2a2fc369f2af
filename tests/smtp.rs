//! The SMTP submission server, end to end: the real daemon on loopback, real clients (lettre,
//! Python's smtplib, swaks, curl) and raw sockets for the input no client would send.

mod common;

use std::time::Duration;

use common::{Daemon, PASSWORD, Raw, eventually, external};
use lettre::message::header::ContentType;
use lettre::transport::smtp::authentication::{Credentials, Mechanism};
use lettre::{Message, SmtpTransport, Transport};
use nightmail_store::Store;

/// Asserts a reply's beginning, showing the whole reply when it differs.
#[track_caller]
fn starts(reply: &str, prefix: &str) {
    assert!(reply.starts_with(prefix), "expected a reply starting {prefix:?}, got {reply:?}");
}

fn lettre(daemon: &Daemon) -> SmtpTransport {
    SmtpTransport::builder_dangerous(daemon.smtp.ip().to_string())
        .port(daemon.smtp.port())
        .credentials(Credentials::new("me".into(), PASSWORD.into()))
        .authentication(vec![Mechanism::Plain])
        .timeout(Some(Duration::from_secs(30)))
        .build()
}

fn message(to: &str, subject: &str, message_id: &str) -> Message {
    Message::builder()
        .from("Me <me@nightmail.test>".parse().unwrap())
        .to(to.parse().unwrap())
        .subject(subject)
        .message_id(Some(message_id.to_string()))
        .header(ContentType::TEXT_PLAIN)
        .body(format!("Question for {subject}\n"))
        .unwrap()
}

/// The INBOX of `user`, read from the store after the daemon has stopped.
fn inbox(daemon: &Daemon, user: &str) -> Vec<Vec<u8>> {
    let store = Store::open(&daemon.data_dir().join("store")).unwrap();
    let Some(inbox) = store.mailbox(user, "INBOX").unwrap() else { return Vec::new() };
    store.mail(inbox.id).unwrap().iter().map(|m| store.message(m.message).unwrap().unwrap()).collect()
}

#[test]
fn lettre_to_the_model_address_makes_a_job() {
    let daemon = Daemon::start();
    let response = lettre(&daemon).send(&message("kimi@nightmail.test", "capital of France", "<q1@client>")).unwrap();
    assert_eq!(response.code().to_string(), "250");
    assert!(response.message().any(|l| l.starts_with("2.0.0 queued as ")));

    let jobs = daemon.jobs();
    assert_eq!(jobs.len(), 1);
    let job = &jobs[0];
    assert_eq!(job["state"], "queued");
    assert_eq!(job["model"], "kimi@nightmail.test");
    assert_eq!(job["subject"], "capital of France");
    assert_eq!(job["message_id"], "<q1@client>");
    assert_eq!(job["from"], "Me <me@nightmail.test>");

    // The human form shows the same job.
    let table = daemon.cli(&["status"]);
    let table = String::from_utf8(table.stdout).unwrap();
    assert!(
        table.contains("queued") && table.contains("capital of France") && table.contains("<q1@client>"),
        "{table}"
    );
}

#[test]
fn lettre_to_a_local_user_lands_in_their_inbox() {
    let mut daemon = Daemon::start();
    lettre(&daemon).send(&message("ann@nightmail.test", "lunch?", "<l1@client>")).unwrap();
    assert!(daemon.jobs().is_empty(), "mail to a user is not a job");

    // sled admits one process: while the daemon runs, the store is locked to everyone else.
    let Err(locked) = Store::open(&daemon.data_dir().join("store")) else { panic!("opened a store in use") };
    assert!(locked.to_string().contains("in use by another process"), "{locked}");

    daemon.stop();
    let mail = inbox(&daemon, "ann");
    assert_eq!(mail.len(), 1);
    let text = String::from_utf8(mail[0].clone()).unwrap();
    assert!(text.starts_with("Received: from "), "a trace header comes first: {text}");
    assert!(text.contains("Subject: lunch?") && text.contains("Question for lunch?"), "{text}");
    assert!(inbox(&daemon, "me").is_empty());
}

#[test]
fn python_smtplib_full_session() {
    let daemon = Daemon::start_with(|dir| common::config(dir, "[tls]\nself_signed = true\n"));
    let out = external("python3", "python3")
        .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/e2e/smtplib_session.py"))
        .arg(daemon.smtp.port().to_string())
        .arg(PASSWORD)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "smtplib session failed:\n{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    let jobs = daemon.jobs();
    let subjects: Vec<&str> = jobs.iter().map(|j| j["subject"].as_str().unwrap()).collect();
    assert_eq!(subjects, ["smtplib plain", "smtplib over starttls"], "{stdout}");
}

#[test]
fn swaks_session_with_and_without_tls() {
    let daemon = Daemon::start_with(|dir| common::config(dir, "[tls]\nself_signed = true\n"));
    let server = daemon.smtp.to_string();
    for (subject, tls) in [("swaks plain", false), ("swaks starttls", true)] {
        let mut cmd = external("swaks", "swaks");
        cmd.args(["--server", &server, "--from", "me@nightmail.test", "--to", "kimi@nightmail.test"])
            .args(["--auth", "LOGIN", "--auth-user", "me", "--auth-password", PASSWORD])
            .args(["--header", &format!("Subject: {subject}"), "--body", "hello from swaks"]);
        if tls {
            cmd.arg("--tls");
        }
        let out = cmd.output().unwrap();
        let transcript = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "swaks failed:\n{transcript}");
        assert!(transcript.contains("250 2.0.0 queued as"), "{transcript}");
        assert!(transcript.contains("235 2.7.0 Authentication successful"), "{transcript}");
    }
    let subjects: Vec<String> = daemon.jobs().iter().map(|j| j["subject"].as_str().unwrap().to_string()).collect();
    assert_eq!(subjects, ["swaks plain", "swaks starttls"]);
}

#[test]
fn curl_sends_over_smtp() {
    let daemon = Daemon::start();
    let mail = daemon.dir.path().join("mail.txt");
    std::fs::write(&mail, "From: me@nightmail.test\r\nTo: kimi@nightmail.test\r\nSubject: from curl\r\n\r\nhi\r\n")
        .unwrap();
    let out = external("curl", "curl")
        .arg("--silent")
        .arg("--show-error")
        .arg(format!("smtp://{}/nightmail.test", daemon.smtp))
        .args(["--mail-from", "me@nightmail.test", "--mail-rcpt", "kimi@nightmail.test"])
        .args(["--user", &format!("me:{PASSWORD}"), "--upload-file"])
        .arg(&mail)
        .output()
        .unwrap();
    assert!(out.status.success(), "curl failed: {}", String::from_utf8_lossy(&out.stderr));
    let jobs = daemon.jobs();
    assert_eq!(jobs.len(), 1);
    assert_eq!(jobs[0]["subject"], "from curl");
    assert!(
        jobs[0]["message_id"].as_str().unwrap().ends_with("@nightmail.test>"),
        "a Message-ID is added when missing"
    );
}

#[test]
fn bad_input_gets_its_code_and_the_daemon_keeps_serving() {
    let daemon = Daemon::start();
    let mut c = daemon.connect();
    starts(&c.reply(), "220 nightmail.test ");

    // Garbage before anything else.
    assert_eq!(c.cmd("FOO BAR"), "500 5.5.1 Unrecognized command");
    assert_eq!(c.cmd("\u{1}\u{2}\u{3}"), "500 5.5.1 Unrecognized command");
    // Out of order.
    starts(&c.cmd("MAIL FROM:<me@nightmail.test>"), "503 5.5.1");
    starts(&c.cmd("EHLO client"), "250 ");
    // No AUTH yet.
    assert_eq!(c.cmd("MAIL FROM:<me@nightmail.test>"), "530 5.7.0 Authentication required");
    // Wrong password, then the right one.
    let wrong = common::base64_plain("me", "wrong");
    assert_eq!(c.cmd(&format!("AUTH PLAIN {wrong}")), "535 5.7.8 Authentication credentials invalid");
    starts(&c.cmd("AUTH PLAIN !!!notbase64"), "501 5.5.2");
    starts(&c.cmd("AUTH CRAM-MD5"), "504 5.5.4");
    let right = common::base64_plain("me", PASSWORD);
    assert_eq!(c.cmd(&format!("AUTH PLAIN {right}")), "235 2.7.0 Authentication successful");
    // Someone else's sender address.
    starts(&c.cmd("MAIL FROM:<ann@nightmail.test>"), "553 5.7.1");
    starts(&c.cmd("MAIL FROM:<me@nightmail.test>"), "250 2.1.0");
    // An outside recipient with no [relay] configured: the reply names the setting. And a
    // malformed recipient.
    let denied = c.cmd("RCPT TO:<victim@example.com>");
    starts(&denied, "550 5.7.1 Relaying denied");
    assert!(denied.contains("[relay]"), "the refusal names the setting that enables relaying: {denied}");
    starts(&c.cmd("RCPT TO:<not an address>"), "501 ");
    assert!(c.cmd("DATA").starts_with("554 5.5.1"), "DATA with no recipients");
    starts(&c.cmd("RCPT TO:<kimi@nightmail.test>"), "250 2.1.5");

    // A bare LF inside the message: refused whole, the session goes on.
    starts(&c.cmd("DATA"), "354 ");
    c.send(b"Subject: smuggle\r\n\r\nline one\nline two\r\n.\r\n");
    starts(&c.reply(), "554 5.6.0 Line 3 ends in a bare LF");

    // Oversized (the test config allows 100,000 bytes): refused after reading to the end.
    starts(&c.cmd("MAIL FROM:<me@nightmail.test>"), "250");
    starts(&c.cmd("RCPT TO:<kimi@nightmail.test>"), "250");
    starts(&c.cmd("DATA"), "354 ");
    let big = "x".repeat(998) + "\r\n";
    c.send(b"Subject: big\r\n\r\n");
    for _ in 0..150 {
        c.send(big.as_bytes());
    }
    c.send(b".\r\n");
    assert_eq!(c.reply(), "552 5.3.4 Message size exceeds the fixed maximum message size");
    // SIZE declared up front is refused at MAIL.
    starts(&c.cmd("MAIL FROM:<me@nightmail.test> SIZE=200000"), "552 5.3.4");

    // A 10,000-line header.
    starts(&c.cmd("MAIL FROM:<me@nightmail.test>"), "250");
    starts(&c.cmd("RCPT TO:<kimi@nightmail.test>"), "250");
    starts(&c.cmd("DATA"), "354 ");
    let header: String = (0..10_000).map(|i| format!("X{i}: y\r\n")).collect();
    c.send(header.as_bytes());
    c.send(b"\r\nbody\r\n.\r\n");
    assert_eq!(c.reply(), "552 5.3.4 The header has more than 1000 lines");

    // A line longer than max_line_bytes.
    starts(&c.cmd("MAIL FROM:<me@nightmail.test>"), "250");
    starts(&c.cmd("RCPT TO:<kimi@nightmail.test>"), "250");
    starts(&c.cmd("DATA"), "354 ");
    c.send(format!("Subject: long\r\n\r\n{}\r\n.\r\n", "y".repeat(9000)).as_bytes());
    starts(&c.reply(), "554 5.6.0 Line 3 is 9000 octets long");

    // A command line over smtp-proto's 4096-byte limit.
    assert_eq!(c.cmd(&format!("NOOP {}", "z".repeat(10_000))), "500 5.5.2 Line too long");
    assert_eq!(c.cmd("NOOP"), "250 2.0.0 OK");

    // Malformed MIME is still accepted, byte for byte.
    starts(&c.cmd("MAIL FROM:<me@nightmail.test>"), "250");
    starts(&c.cmd("RCPT TO:<kimi@nightmail.test>"), "250");
    starts(&c.cmd("DATA"), "354 ");
    c.send(b"Subject: broken mime\r\nContent-Type: multipart/mixed; boundary=\"b\r\n\r\n--b\r\nContent-Type: text/plain; charset=x-unknown\r\n\r\n\xff\xfe text\r\n.\r\n");
    starts(&c.reply(), "250 2.0.0 queued as ");
    assert_eq!(c.cmd("QUIT"), "221 2.0.0 Bye");

    // Nothing above took the daemon down, or let a refused message in.
    let mut other = Raw::login(daemon.smtp);
    starts(&other.cmd("MAIL FROM:<me@nightmail.test>"), "250");
    starts(&other.cmd("RCPT TO:<kimi@nightmail.test>"), "250");
    starts(&other.cmd("DATA"), "354 ");
    other.send(b"Subject: still here\r\n\r\nok\r\n.\r\n");
    starts(&other.reply(), "250 2.0.0 queued as ");
    let subjects: Vec<String> = daemon.jobs().iter().map(|j| j["subject"].as_str().unwrap().to_string()).collect();
    assert_eq!(subjects, ["broken mime", "still here"]);
}

#[test]
fn too_many_errors_close_the_connection() {
    let daemon = Daemon::start();
    let mut c = daemon.connect();
    c.reply();
    for _ in 0..19 {
        starts(&c.cmd("GARBAGE"), "500 ");
    }
    assert_eq!(c.cmd("GARBAGE"), "500 5.5.1 Unrecognized command");
    assert_eq!(c.reply(), "421 4.7.0 Too many errors: closing connection");
    assert!(c.closed());
}

#[test]
fn failed_logins_are_slowed_past_the_budget_and_the_right_password_is_not() {
    let daemon = Daemon::start_with(|dir| {
        common::config(dir, "")
            .replace("failure_delay_ms = 100", "failure_delay_ms = 10\nmax_failures = 3\nfailure_window_secs = 2")
    });
    let wrong = common::base64_plain("me", "guess");
    let mut c = daemon.connect();
    c.reply();
    c.cmd("EHLO x");
    for _ in 0..3 {
        starts(&c.cmd(&format!("AUTH PLAIN {wrong}")), "535 5.7.8");
    }
    // The budget is the account's from this client, not the connection's: past it a wrong
    // password waits for the window, and the right one does not wait at all.
    let mut again = daemon.connect();
    again.reply();
    again.cmd("EHLO x");
    let started = std::time::Instant::now();
    starts(&again.cmd(&format!("AUTH PLAIN {wrong}")), "535 5.7.8");
    assert!(started.elapsed() >= std::time::Duration::from_millis(1500), "{:?}", started.elapsed());
    let right = common::base64_plain("me", PASSWORD);
    let started = std::time::Instant::now();
    starts(&again.cmd(&format!("AUTH PLAIN {right}")), "235 2.7.0");
    assert!(started.elapsed() < std::time::Duration::from_secs(1), "{:?}", started.elapsed());
}

#[test]
fn connection_limit_and_idle_timeout() {
    let daemon = Daemon::start_with(|dir| {
        common::config(dir, "").replace("timeout_secs = 30", "timeout_secs = 1\nmax_connections = 2")
    });
    let mut a = daemon.connect();
    let mut b = daemon.connect();
    starts(&a.reply(), "220 ");
    starts(&b.reply(), "220 ");
    let mut c = daemon.connect();
    assert_eq!(c.reply(), "421 4.7.0 Too many connections; try again later");
    // An idle client is dropped with 421 4.4.2 (RFC 5321 §4.5.3.2), freeing its slot.
    assert_eq!(a.reply(), "421 4.4.2 Timeout: closing connection");
    assert_eq!(b.reply(), "421 4.4.2 Timeout: closing connection");
    eventually(Duration::from_secs(10), "a free connection slot", || {
        let mut d = daemon.connect();
        d.reply().starts_with("220 ")
    });
}

#[test]
fn sigkill_after_each_250_loses_and_duplicates_nothing() {
    let mut daemon = Daemon::start();
    let total = 6;
    for i in 0..total {
        if i > 0 {
            daemon.restart();
        }
        let mut c = Raw::login(daemon.smtp);
        starts(&c.cmd("MAIL FROM:<me@nightmail.test>"), "250");
        starts(&c.cmd("RCPT TO:<kimi@nightmail.test>"), "250");
        starts(&c.cmd("RCPT TO:<ann@nightmail.test>"), "250");
        starts(&c.cmd("DATA"), "354 ");
        c.send(format!("Message-ID: <crash{i}@client>\r\nSubject: crash {i}\r\n\r\nbody {i}\r\n.\r\n").as_bytes());
        starts(&c.reply(), "250 2.0.0 queued as ");
        daemon.kill9();
    }
    // A client that lost the connection before seeing 250 sends again: still one copy.
    daemon.restart();
    let mut c = Raw::login(daemon.smtp);
    starts(&c.cmd("MAIL FROM:<me@nightmail.test>"), "250");
    starts(&c.cmd("RCPT TO:<kimi@nightmail.test>"), "250");
    starts(&c.cmd("RCPT TO:<ann@nightmail.test>"), "250");
    starts(&c.cmd("DATA"), "354 ");
    c.send(b"Message-ID: <crash3@client>\r\nSubject: crash 3\r\n\r\nbody 3\r\n.\r\n");
    starts(&c.reply(), "250 2.0.0 Already queued");
    daemon.kill9();

    // `status` reads the store directly when no daemon answers.
    let status = daemon.status();
    assert_eq!(status["source"], "store");
    let mut ids: Vec<String> =
        status["jobs"].as_array().unwrap().iter().map(|j| j["message_id"].as_str().unwrap().to_string()).collect();
    ids.sort();
    let expected: Vec<String> = (0..total).map(|i| format!("<crash{i}@client>")).collect();
    assert_eq!(ids, expected);

    let mail = inbox(&daemon, "ann");
    assert_eq!(mail.len(), total);
    for (i, raw) in mail.iter().enumerate() {
        assert!(String::from_utf8_lossy(raw).contains(&format!("body {i}")));
    }
}

/// One traced system call: its name, the path of its file-descriptor argument (strace `-yy`), the
/// start of its text, and the trace line where it completed.
struct Call {
    name: String,
    path: String,
    text: String,
    done: usize,
}

/// Parses `strace -f -yy` output: calls split by another thread (`<unfinished ...>` /
/// `<... resumed>`) are joined and placed where they completed.
fn traced_calls(trace: &str) -> Vec<Call> {
    let mut pending: std::collections::HashMap<String, (String, String, String)> = Default::default();
    let mut calls = Vec::new();
    for (index, line) in trace.lines().enumerate() {
        let Some((pid, rest)) = line.split_once(' ') else { continue };
        let rest = rest.trim_start();
        if rest.starts_with("<... ") {
            if let Some((name, path, text)) = pending.remove(pid) {
                calls.push(Call { name, path, text, done: index });
            }
            continue;
        }
        let Some((name, args)) = rest.split_once('(') else { continue };
        let path = args
            .split_once('<')
            .filter(|(fd, _)| fd.chars().all(|c| c.is_ascii_digit()))
            .and_then(|(_, p)| p.split_once('>'))
            .map(|(p, _)| p.to_string())
            .unwrap_or_default();
        let call = (name.to_string(), path, args.to_string());
        if rest.ends_with("<unfinished ...>") {
            pending.insert(pid.to_string(), call);
        } else {
            calls.push(Call { name: call.0, path: call.1, text: call.2, done: index });
        }
    }
    calls
}

/// RFC 5321 §6.1: once 250 is sent the message must survive a power cut, not only `kill -9`.
/// The daemon runs under strace; one message (a file of its own under `store/messages/`) is
/// submitted, and every file the store wrote while receiving it must have been fsynced (or
/// fdatasynced: sled's `sync_file_range` flushes neither the drive's cache nor metadata) after its
/// last write and before the `250` went out, and the directory of each new file too.
#[test]
fn a_250_follows_an_fsync_of_every_file_holding_the_message() {
    external("strace", "strace");
    let trace_dir = tempfile::tempdir().unwrap();
    let trace_file = trace_dir.path().join("trace");
    let trace_arg = trace_file.to_str().unwrap();
    let mut daemon = Daemon::start_under(
        &[
            "strace",
            "-f",
            "-yy",
            "-s",
            "24",
            "-o",
            trace_arg,
            "-e",
            "trace=openat,write,pwrite64,writev,pwritev,sendto,sendmsg,fsync,fdatasync,sync_file_range",
        ],
        |dir| common::config(dir, "").replace("max_message_bytes = 100000", "max_message_bytes = 2000000"),
    );
    let mut c = Raw::login(daemon.smtp);
    starts(&c.cmd("MAIL FROM:<me@nightmail.test>"), "250");
    starts(&c.cmd("RCPT TO:<ann@nightmail.test>"), "250");
    starts(&c.cmd("DATA"), "354 ");
    // A 300 KiB attachment.
    let attachment: String = (0..4000).map(|i| format!("{:076}\r\n", i)).collect();
    c.send(
        format!(
            "Message-ID: <fsync@client>\r\nSubject: power cut\r\nContent-Type: multipart/mixed; boundary=b\r\n\r\n\
             --b\r\nContent-Type: text/plain\r\n\r\nsee attached\r\n--b\r\nContent-Type: application/octet-stream\r\n\
             Content-Transfer-Encoding: base64\r\n\r\n{attachment}--b--\r\n.\r\n"
        )
        .as_bytes(),
    );
    starts(&c.reply(), "250 2.0.0 queued as ");
    daemon.kill9();

    let trace = std::fs::read_to_string(&trace_file).unwrap();
    let calls = traced_calls(&trace);
    let store = daemon.data_dir().join("store").display().to_string();
    let is_write = |name: &str| matches!(name, "write" | "pwrite64" | "writev" | "pwritev");
    let socket_write = |call: &Call, reply: &str| {
        (is_write(&call.name) || call.name.starts_with("send"))
            && call.path.starts_with("TCP:")
            && call.text.contains(reply)
    };
    let data = calls.iter().position(|c| socket_write(c, "354 ")).expect("the 354 reply in the trace");
    let accepted = calls.iter().position(|c| socket_write(c, "250 2.0.0 queued")).expect("the 250 reply in the trace");
    let window = &calls[data..accepted];

    let mut written: Vec<&str> =
        window.iter().filter(|c| is_write(&c.name) && c.path.starts_with(&store)).map(|c| c.path.as_str()).collect();
    written.sort();
    written.dedup();
    assert!(written.iter().any(|p| p.contains("/messages/")), "no message file was written: {written:?}");
    let synced_after = |path: &str, index: usize| {
        window.iter().any(|c| matches!(c.name.as_str(), "fsync" | "fdatasync") && c.path == path && c.done > index)
    };
    for path in &written {
        let last = window.iter().filter(|c| is_write(&c.name) && c.path == *path).map(|c| c.done).max().unwrap();
        assert!(synced_after(path, last), "{path} was written at trace line {last} and not fsynced before the 250");
    }
    for path in written.iter().filter(|p| p.contains("/blobs/") || p.contains("/messages/")) {
        let dir = &path[..path.rfind('/').unwrap()];
        let last = window.iter().filter(|c| c.path == *path).map(|c| c.done).min().unwrap();
        assert!(synced_after(dir, last), "{dir}, holding the new {path}, was not fsynced before the 250");
    }
}

/// A small ext4 file system on a loop device, unmounted on drop: a disk that a test can fill.
/// Needs root and a loop device; without them the test fails and says so, it does not skip.
struct LoopDisk {
    _dir: tempfile::TempDir,
    mount: std::path::PathBuf,
}

impl LoopDisk {
    fn new(bytes: u64) -> LoopDisk {
        let dir = tempfile::tempdir().unwrap();
        let image = dir.path().join("disk.img");
        std::fs::File::create(&image).unwrap().set_len(bytes).unwrap();
        let mkfs = external("mkfs.ext4", "e2fsprogs").args(["-q", "-F"]).arg(&image).output().unwrap();
        assert!(mkfs.status.success(), "mkfs.ext4 failed: {}", String::from_utf8_lossy(&mkfs.stderr));
        let mount = dir.path().join("mnt");
        std::fs::create_dir(&mount).unwrap();
        let out = external("mount", "mount").args(["-o", "loop"]).arg(&image).arg(&mount).output().unwrap();
        assert!(
            out.status.success(),
            "mounting a loop device failed ({}): this test needs root and /dev/loop* (a privileged container)",
            String::from_utf8_lossy(&out.stderr).trim()
        );
        LoopDisk { _dir: dir, mount }
    }

    /// Bytes an unprivileged writer may still use (what the store looks at: statvfs's f_bavail).
    fn available(&self) -> u64 {
        let out = external("stat", "coreutils").args(["-f", "-c", "%a %S"]).arg(&self.mount).output().unwrap();
        let text = String::from_utf8(out.stdout).unwrap();
        let mut fields = text.split_whitespace().map(|f| f.parse::<u64>().unwrap());
        fields.next().unwrap() * fields.next().unwrap()
    }
}

impl Drop for LoopDisk {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount").arg(&self.mount).status();
    }
}

/// The IMAP view of `user`'s INBOX, through Python's imaplib: the Subject of every message.
fn imap_subjects(daemon: &Daemon, user: &str) -> Vec<String> {
    let script = format!(
        "import imaplib\n\
         c = imaplib.IMAP4('127.0.0.1', {port})\n\
         c.login('{user}', '{PASSWORD}')\n\
         typ, data = c.select('INBOX')\n\
         assert typ == 'OK', data\n\
         if int(data[0]) > 0:\n\
         \x20   typ, data = c.fetch('1:*', '(BODY.PEEK[HEADER.FIELDS (SUBJECT)])')\n\
         \x20   for part in data:\n\
         \x20       if isinstance(part, tuple):\n\
         \x20           print(part[1].decode().strip())\n\
         c.logout()\n",
        port = daemon.imap.port()
    );
    let out = external("python3", "python3").arg("-c").arg(script).output().unwrap();
    assert!(out.status.success(), "imaplib failed: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap().lines().map(str::to_string).collect()
}

/// RFC 1870 §6.1 / RFC 3463 X.3.1: while the disk holding the store is nearly full, MAIL and
/// DATA get `452 4.3.1` and nothing of the refused message is stored; once space returns, the same
/// daemon (no restart) accepts mail again, and IMAP shows only the accepted message.
#[test]
fn a_full_disk_gets_452_and_the_daemon_recovers_when_space_returns() {
    let disk = LoopDisk::new(64 << 20);
    let data = disk.mount.join("data");
    let daemon = Daemon::start_with(|dir| {
        common::config(dir, "").replace(
            &format!("data_dir = \"{}\"", dir.join("data").display()),
            &format!("data_dir = \"{}\"", data.display()),
        )
    });
    let mut c = Raw::login(daemon.smtp);
    starts(&c.cmd("MAIL FROM:<me@nightmail.test>"), "250 ");
    starts(&c.cmd("RCPT TO:<ann@nightmail.test>"), "250 ");

    // Leave half the store's floor free: below what it keeps for itself.
    let filler = disk.mount.join("filler");
    let target = nightmail_store::MIN_FREE_BYTES / 2;
    {
        let mut file = std::fs::File::create(&filler).unwrap();
        let chunk = vec![0u8; 1 << 20];
        while disk.available() > target + chunk.len() as u64 {
            std::io::Write::write_all(&mut file, &chunk).unwrap();
            file.sync_data().unwrap();
        }
    }
    assert!(disk.available() < nightmail_store::MIN_FREE_BYTES);

    starts(&c.cmd("DATA"), "354 ");
    c.send(b"Subject: lost in a full disk\r\n\r\nnot stored\r\n.\r\n");
    starts(&c.reply(), "452 4.3.1 ");
    starts(&c.cmd("MAIL FROM:<me@nightmail.test> SIZE=500"), "452 4.3.1 ");
    starts(&c.cmd("MAIL FROM:<me@nightmail.test>"), "452 4.3.1 ");
    assert_eq!(imap_subjects(&daemon, "ann"), Vec::<String>::new(), "a refused message is visible over IMAP");

    std::fs::remove_file(&filler).unwrap();
    eventually(Duration::from_secs(10), "the filler's space to come back", || {
        disk.available() > nightmail_store::MIN_FREE_BYTES * 3 / 2
    });
    starts(&c.cmd("MAIL FROM:<me@nightmail.test>"), "250 ");
    starts(&c.cmd("RCPT TO:<ann@nightmail.test>"), "250 ");
    starts(&c.cmd("DATA"), "354 ");
    c.send(b"Subject: after the cleanup\r\n\r\nstored\r\n.\r\n");
    starts(&c.reply(), "250 2.0.0 queued as ");
    assert_eq!(imap_subjects(&daemon, "ann"), vec!["Subject: after the cleanup".to_string()]);
    drop(c);
    drop(daemon);
}
