//! SIGHUP reloads the configuration without dropping a connection: sessions opened before keep
//! working, a new login needs the new password, a new TLS handshake presents the new certificate
//! (python's ssl), and a configuration that does not parse, or names a certificate that does not
//! load, is refused with a log line while the daemon keeps serving the running one.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::path::Path;
use std::time::{Duration, Instant};

use common::{Daemon, PASSWORD, Raw, base64_plain};

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

#[test]
fn sighup_keeps_the_running_models_and_says_a_restart_is_needed() {
    let daemon = Daemon::start_logged(|dir| common::config(dir, ""));
    let changed = common::config(daemon.dir.path(), "").replace("kimi@nightmail.test", "other@nightmail.test");
    std::fs::write(&daemon.config, changed).unwrap();
    hup(&daemon);
    wait_for_log(&daemon, "need a restart", 1);
    assert!(daemon.log().contains("[[model]]"), "{}", daemon.log());
    // Mail to the running model is still taken as a question; the new address is not a model.
    let mut raw = Raw::login(daemon.smtp);
    assert!(raw.cmd("MAIL FROM:<me@nightmail.test>").starts_with("250"));
    assert!(raw.cmd("RCPT TO:<kimi@nightmail.test>").starts_with("250"));
    let other = raw.cmd("RCPT TO:<other@nightmail.test>");
    assert!(other.starts_with("550"), "{other}");
}
