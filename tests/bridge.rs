//! The bridge, end to end: the real daemon reads the bot's mailbox on a real Dovecot (a test
//! instance on loopback, running as a non-root user, passdb in a temp dir), answers through
//! llama.cpp's server with the demo model, and sends the reply through a real SMTP server
//! (Python's aiosmtpd, `tests/fixtures/smarthost.py`, with AUTH), appending it to the upstream
//! Sent folder. The test plays the provider's other users with imaplib
//! (`tests/fixtures/upstream.py`), writing the `Authentication-Results` header the provider would.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{Daemon, Smarthost, header};
use serde_json::{Value, json};

const BOT: &str = "bot@fastmail.test";
const PASS: &str = "fastmail.test; spf=pass smtp.mailfrom=example.com;\r\n dkim=pass header.d=example.com; dmarc=pass header.from=example.com";

/// A Dovecot IMAP server on a loopback port, its mail and state in a temp dir. As root it runs as
/// the `dovecot` user (Dovecot's login processes refuse root), else as the current user.
struct Dovecot {
    dir: tempfile::TempDir,
    port: u16,
    /// imaps only, with a certificate from this CA (which the test's own client trusts).
    ca: Option<PathBuf>,
    child: Option<Child>,
}

impl Dovecot {
    fn start() -> Dovecot {
        Dovecot::start_with(|_| {})
    }

    /// `prepare` may fill the maildir (`mail/bot`) before the server starts.
    fn start_with(prepare: impl FnOnce(&Path)) -> Dovecot {
        Dovecot::start_full(prepare, None, "")
    }

    /// TLS from the first byte (imaps) with this certificate and key, and nothing else.
    fn start_tls(ca: &Path, cert: &Path, key: &Path) -> Dovecot {
        Dovecot::start_full(|_| {}, Some((ca, cert, key)), "")
    }

    /// A server that does not offer IDLE (RFC 2177) after login.
    fn start_without_idle() -> Dovecot {
        Dovecot::start_full(|_| {}, None, "imap_capability = IMAP4rev1 SASL-IR LITERAL+ UIDPLUS\n")
    }

    /// `extra` is added to the configuration.
    fn start_full(prepare: impl FnOnce(&Path), tls: Option<(&Path, &Path, &Path)>, extra: &str) -> Dovecot {
        common::external("dovecot", "dovecot-imapd");
        let dir = tempfile::tempdir().unwrap();
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let root = dir.path();
        for sub in ["run", "mail/bot/cur", "mail/bot/new", "mail/bot/tmp"] {
            std::fs::create_dir_all(root.join(sub)).unwrap();
        }
        let (user, group) = Dovecot::identity();
        let (ssl, plain_port, imaps) = match tls {
            Some((_, cert, key)) => {
                std::fs::copy(cert, root.join("cert.pem")).unwrap();
                std::fs::copy(key, root.join("key.pem")).unwrap();
                let ssl =
                    format!("ssl = required\nssl_cert = <{r}/cert.pem\nssl_key = <{r}/key.pem", r = root.display());
                (ssl, 0, format!("  inet_listener imaps {{\n    port = {port}\n    ssl = yes\n  }}\n"))
            }
            None => ("ssl = no".to_string(), port, String::new()),
        };
        std::fs::write(
            root.join("dovecot.conf"),
            format!(
                r#"base_dir = {r}/run
state_dir = {r}/run
log_path = {r}/dovecot.log
protocols = imap
listen = 127.0.0.1
{ssl}
disable_plaintext_auth = no
auth_mechanisms = plain login
default_internal_user = {user}
default_internal_group = {group}
default_login_user = {user}
first_valid_uid = 0
mail_location = maildir:{r}/mail/%u
service imap-login {{
  chroot =
  inet_listener imap {{
    port = {plain_port}
  }}
{imaps}}}
service anvil {{
  chroot =
}}
passdb {{
  driver = passwd-file
  args = scheme=PLAIN username_format=%u {r}/passwd
}}
userdb {{
  driver = static
  args = uid={user} gid={group} home={r}/mail/%u
}}
{extra}"#,
                r = root.display()
            ),
        )
        .unwrap();
        std::fs::write(root.join("passwd"), "bot:{PLAIN}secret\n").unwrap();
        prepare(&root.join("mail/bot"));
        if is_root() {
            let status = Command::new("chown").args(["-R", "dovecot:dovecot"]).arg(root).status().unwrap();
            assert!(status.success());
        }
        let mut dovecot = Dovecot { dir, port, ca: tls.map(|(ca, _, _)| ca.to_path_buf()), child: None };
        dovecot.run();
        dovecot
    }

    fn identity() -> (String, String) {
        if is_root() {
            return ("dovecot".into(), "dovecot".into());
        }
        let id = |flag: &str| {
            String::from_utf8(Command::new("id").arg(flag).output().unwrap().stdout).unwrap().trim().to_string()
        };
        (id("-un"), id("-gn"))
    }

    fn run(&mut self) {
        let conf = self.dir.path().join("dovecot.conf");
        let _ = std::fs::remove_file(self.dir.path().join("run/master.pid"));
        let mut command = if is_root() {
            let mut c = Command::new("setpriv");
            c.args(["--reuid=dovecot", "--regid=dovecot", "--init-groups", "dovecot"]);
            c
        } else {
            Command::new("dovecot")
        };
        // Its own process group, so that killing it takes its login and imap processes too.
        std::os::unix::process::CommandExt::process_group(&mut command, 0);
        let child =
            command.arg("-F").arg("-c").arg(&conf).stdout(Stdio::null()).stderr(Stdio::inherit()).spawn().unwrap();
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(20);
        while !self.answers() {
            assert!(
                Instant::now() < deadline,
                "dovecot did not answer on port {} within 20 s: {}",
                self.port,
                self.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn answers(&self) -> bool {
        use std::io::Read;
        let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", self.port)) else { return false };
        if self.ca.is_some() {
            return true;
        }
        let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
        let mut greeting = [0u8; 4];
        s.read_exact(&mut greeting).is_ok() && &greeting == b"* OK"
    }

    /// SIGKILL to the whole server: every connection drops at once.
    fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            // `--`: procps-ng 4.0.2 reads a bare `-PID` after the signal wrongly (as -1: every process).
            let _ = Command::new("kill").args(["-KILL", "--", &format!("-{}", child.id())]).status();
            let _ = child.wait();
        }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("dovecot.log")).unwrap_or_default()
    }

    fn upstream(&self, args: &[&str]) -> String {
        let fixture = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/fixtures/upstream.py");
        let mut command = Command::new("python3");
        if let Some(ca) = &self.ca {
            command.env("UPSTREAM_CA", ca);
        }
        let out = command.arg(fixture).arg(self.port.to_string()).args(args).output().unwrap();
        assert!(out.status.success(), "upstream.py {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).unwrap()
    }

    /// Delivers `message` to the bot's INBOX (INTERNALDATE `at`, Unix seconds, if given).
    fn deliver(&self, message: &str, at: Option<u64>) {
        let file = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(file.path(), message.replace('\n', "\r\n").replace("\r\r\n", "\r\n")).unwrap();
        let path = file.path().to_str().unwrap().to_string();
        let at = at.map(|t| t.to_string());
        let mut args = vec!["append", "INBOX", path.as_str()];
        args.extend(at.as_deref());
        self.upstream(&args);
    }

    fn mailbox(&self, name: &str) -> Vec<Value> {
        serde_json::from_str(&self.upstream(&["list", name])).unwrap_or_default()
    }

    fn uidvalidity(&self) -> u64 {
        self.upstream(&["uidvalidity", "INBOX"]).trim().parse().unwrap()
    }
}

impl Drop for Dovecot {
    fn drop(&mut self) {
        self.kill();
    }
}

fn is_root() -> bool {
    String::from_utf8(Command::new("id").arg("-u").output().unwrap().stdout).unwrap().trim() == "0"
}

/// The replies `smarthost` accepted whose In-Reply-To is `id`.
fn replies_to(smarthost: &Smarthost, id: &str) -> Vec<Value> {
    smarthost
        .messages()
        .into_iter()
        .filter(|m| header(m["data"].as_str().unwrap(), "In-Reply-To").as_deref() == Some(id))
        .collect()
}

/// The llama.cpp server, the bridge's Dovecot and submission server, and the daemon wired to them.
struct Rig {
    daemon: Daemon,
    dovecot: Dovecot,
    /// aiosmtpd as the provider's submission server, requiring the bot's login.
    submission: Smarthost,
    /// Between the daemon and llama.cpp's server: what the model was asked.
    proxy: common::RecordingProxy,
    _llama: common::LlamaServer,
}

impl Rig {
    fn start(dovecot: Dovecot) -> Rig {
        Rig::start_with(dovecot, "imap_tls = \"none\"\n")
    }

    /// `imap` holds the bridge's IMAP TLS keys.
    fn start_with(dovecot: Dovecot, imap: &str) -> Rig {
        let llama = common::LlamaServer::start();
        let proxy = common::RecordingProxy::start(
            llama.url.trim_start_matches("http://").trim_end_matches("/v1").parse().unwrap(),
        );
        let url = format!("http://{}/v1", proxy.addr);
        let submission =
            Smarthost::start(json!({"auth": {"user": "bot", "password": "secret"}, "auth_require_tls": false}));
        let (imap_port, smtp_port) = (dovecot.port, submission.port);
        let daemon = Daemon::start_with(|dir| {
            std::fs::write(dir.join("bot.pw"), "secret\n").unwrap();
            let base = common::config_answering(dir, "", &url, 1)
                .replace("url = ", "name = \"Kimi\"\nmax_tokens = 4\ntemperature = 0\nurl = ");
            format!(
                "{base}\n[[bridge]]\nmodel = \"kimi@nightmail.test\"\naddress = \"{BOT}\"\nimap_host = \"127.0.0.1\"\nimap_port = {imap_port}\n{imap}smtp_host = \"127.0.0.1\"\nsmtp_port = {smtp_port}\nsmtp_tls = \"none\"\nuser = \"bot\"\npassword_file = \"{}\"\nallow = [\"me@example.com\", \"*@team.example\"]\nauth_serv_id = \"fastmail.test\"\npoll_secs = 2\ntimeout_secs = 10\n",
                dir.join("bot.pw").display()
            )
        });
        Rig { daemon, dovecot, submission, proxy, _llama: llama }
    }

    /// Waits for the bridge to have read its mailbox up to `uid`.
    fn until_taken(&self, uid: u64) {
        until(Duration::from_secs(30), &format!("the bridge to take UID {uid}"), || {
            self.daemon.status()["bridges"]
                .as_array()
                .is_some_and(|b| b.iter().any(|b| b["last_uid"].as_u64() >= Some(uid)))
        });
    }

    /// Waits for exactly one reply to `id` at the submission server, and returns it.
    fn reply_to(&self, id: &str) -> Value {
        until(Duration::from_secs(60), &format!("a reply to {id}"), || !replies_to(&self.submission, id).is_empty());
        let replies = replies_to(&self.submission, id);
        assert_eq!(replies.len(), 1, "one reply to {id}: {replies:#?}");
        replies[0].clone()
    }
}

fn until(limit: Duration, what: &str, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !check() {
        assert!(Instant::now() < deadline, "timed out waiting for: {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn question(from: &str, results: &[&str], subject: &str, id: &str) -> String {
    let mut m = String::new();
    for r in results {
        m.push_str(&format!("Authentication-Results: {r}\r\n"));
    }
    m.push_str(&format!(
        "From: Me <{from}>\r\nTo: Kimi <{BOT}>\r\nCc: Carol <carol@team.example>\r\nSubject: {subject}\r\nMessage-ID: {id}\r\nDate: Thu, 3 Dec 2026 10:00:00 +0000\r\n\r\nSay hello.\r\n"
    ));
    m
}

fn now_secs() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs()
}

fn flags(dovecot: &Dovecot, uid: u64) -> Vec<String> {
    let inbox = dovecot.mailbox("INBOX");
    let m = inbox.iter().find(|m| m["uid"] == uid).unwrap_or_else(|| panic!("no UID {uid}"));
    m["flags"].as_array().unwrap().iter().map(|f| f.as_str().unwrap().to_string()).collect()
}

/// 500 messages in the mailbox at the first start are not answered; a new one is, once, to all
/// its people, threaded, from the bot's address, and kept in the upstream Sent folder; the
/// question is flagged \Seen. Mail that came while the daemon was stopped is answered after the
/// restart, and a SIGKILL right after a job is queued neither loses nor repeats an answer.
#[test]
fn a_question_is_answered_once_threaded_and_kept_in_sent_across_restarts() {
    let dovecot = Dovecot::start_with(|maildir| {
        for n in 0..500 {
            let m = question("me@example.com", &[PASS], &format!("old {n}"), &format!("<old{n}@example.com>"));
            std::fs::write(maildir.join(format!("cur/{n}.M{n}P1.test:2,")), m).unwrap();
        }
    });
    let mut rig = Rig::start(dovecot);
    rig.until_taken(500);

    rig.dovecot.deliver(&question("me@example.com", &[PASS], "first", "<q1@example.com>"), None);
    let reply = rig.reply_to("<q1@example.com>");
    let data = reply["data"].as_str().unwrap();
    assert_eq!(reply["mail_from"], BOT);
    let mut rcpts: Vec<&str> = reply["rcpt_tos"].as_array().unwrap().iter().map(|r| r.as_str().unwrap()).collect();
    rcpts.sort();
    assert_eq!(rcpts, ["carol@team.example", "me@example.com"], "reply-all, never to the bot itself");
    assert!(header(data, "From").unwrap().contains(BOT), "{data}");
    assert_eq!(header(data, "Subject").as_deref(), Some("Re: first"));
    assert_eq!(header(data, "References").as_deref(), Some("<q1@example.com>"));
    let reply_id = header(data, "Message-ID").unwrap();
    until(Duration::from_secs(20), "the reply in the upstream Sent folder", || {
        rig.dovecot
            .mailbox("Sent")
            .iter()
            .any(|m| header(m["message"].as_str().unwrap(), "Message-ID") == Some(reply_id.clone()))
    });
    until(Duration::from_secs(10), "the question flagged \\Seen", || {
        flags(&rig.dovecot, 501).contains(&"\\Seen".to_string())
    });
    assert!(!flags(&rig.dovecot, 500).contains(&"\\Seen".to_string()), "old mail is left alone");

    // Mail that arrives while nightmail is stopped is answered after the restart. It follows up
    // the first answer, which the model sees as its own earlier turn (kept in the store, though
    // the reply left by SMTP).
    rig.daemon.stop();
    let follow_up = question("me@example.com", &[PASS], "Re: first", "<q2@example.com>")
        .replace("Date:", &format!("In-Reply-To: {reply_id}\r\nReferences: <q1@example.com> {reply_id}\r\nDate:"));
    rig.dovecot.deliver(&follow_up, None);
    rig.daemon.restart();
    rig.reply_to("<q2@example.com>");
    let asked = rig.proxy.chat_requests();
    let turns: Vec<&str> =
        asked[1]["messages"].as_array().unwrap().iter().map(|m| m["role"].as_str().unwrap()).collect();
    assert_eq!(turns, ["user", "assistant", "user"], "the thread's question and answer come first: {asked:#?}");

    // SIGKILL as soon as the third question's job is queued.
    rig.dovecot.deliver(&question("me@example.com", &[PASS], "third", "<q3@example.com>"), None);
    until(Duration::from_secs(30), "the third job", || rig.daemon.jobs().len() == 3);
    rig.daemon.kill9();
    let sent_before_restart = replies_to(&rig.submission, "<q3@example.com>").len();
    rig.daemon.restart();
    rig.dovecot.deliver(&question("me@example.com", &[PASS], "fourth", "<q4@example.com>"), None);
    rig.reply_to("<q4@example.com>");
    until(Duration::from_secs(30), "the third reply", || !replies_to(&rig.submission, "<q3@example.com>").is_empty());
    let third = replies_to(&rig.submission, "<q3@example.com>").len();
    if sent_before_restart == 0 {
        assert_eq!(third, 1, "killed before the reply was sent: it is sent once, after the restart");
    } else {
        // Killed between the server's 250 and settling the entry: sent again, at most once.
        assert!(third <= 2, "at most one duplicate: {third}");
    }
    for id in ["<q1@example.com>", "<q2@example.com>"] {
        assert_eq!(replies_to(&rig.submission, id).len(), 1, "nothing answered twice across restarts: {id}");
    }
    assert_eq!(rig.daemon.jobs().len(), 4, "one job per new question, none for the 500 old ones");
    // Every question flagged, the one whose job was queued just before the SIGKILL too (from the
    // mark's list of UIDs still to flag).
    until(Duration::from_secs(20), "all four questions flagged", || {
        (501..=504).all(|uid| flags(&rig.dovecot, uid).contains(&"\\Seen".to_string()))
    });
    assert!(rig.submission.messages().iter().all(|m| !m["data"].as_str().unwrap().contains("Subject: Re: old")));
}

/// A forged From (no Authentication-Results, a failing one above a passing one the sender wrote,
/// or a passing one from another authserv-id) and a sender not on the allow list get no answer;
/// a message with a broken MIME tree is answered and the bridge keeps going.
#[test]
fn forged_and_unlisted_senders_get_no_answer_and_broken_mime_does_not_stop_the_bridge() {
    let rig = Rig::start(Dovecot::start());
    rig.until_taken(0);
    let fail = "fastmail.test; dkim=fail header.d=example.com; dmarc=fail header.from=example.com";
    let other = "example.com; dkim=pass header.d=example.com; dmarc=pass header.from=example.com";
    rig.dovecot.deliver(&question("me@example.com", &[], "no results", "<f1@example.com>"), None);
    rig.dovecot.deliver(&question("me@example.com", &[fail, PASS], "forged", "<f2@example.com>"), None);
    rig.dovecot.deliver(&question("me@example.com", &[other], "other id", "<f3@example.com>"), None);
    rig.dovecot.deliver(&question("stranger@example.com", &[PASS], "unlisted", "<f4@example.com>"), None);
    let broken = question("me@example.com", &[PASS], "broken", "<f5@example.com>")
        .replace("Date:", "MIME-Version: 1.0\r\nContent-Type: multipart/mixed; boundary=\"zz\r\nDate:")
        + "--zz\r\nContent-Type: text/plain\r\n\r\nSay hi.\r\n--zz";
    rig.dovecot.deliver(&broken, None);
    // An allowed sender naming 30 more people: the reply reaches at most 20, and names the rest.
    let crowd: Vec<String> = (0..30).map(|n| format!("p{n}@team.example")).collect();
    let good = question(
        "ann@team.example",
        &[PASS.replace("example.com", "team.example").as_str()],
        "good",
        "<f6@example.com>",
    )
    .replace("Cc: Carol <carol@team.example>", &format!("Cc: {}", crowd.join(",\r\n ")));
    rig.dovecot.deliver(&good, None);
    let reply = rig.reply_to("<f6@example.com>");
    assert_eq!(reply["rcpt_tos"].as_array().unwrap().len(), 20, "bridge.max_recipients_per_reply");
    // Quoted-printable: soft line breaks joined.
    let text = reply["data"].as_str().unwrap().replace("=\r\n", "").replace("\r\n", " ");
    assert!(text.contains("Not sent to these people") && text.contains("p29@team.example"), "{text}");
    rig.reply_to("<f5@example.com>");
    // The bridge takes mail in UID order, and the last one is answered: every one before it has
    // been looked at.
    rig.until_taken(6);
    for id in ["<f1@example.com>", "<f2@example.com>", "<f3@example.com>", "<f4@example.com>"] {
        assert!(replies_to(&rig.submission, id).is_empty(), "{id} was answered");
    }
    assert_eq!(rig.daemon.jobs().len(), 2, "jobs only for the two admitted messages");
    for uid in 1..=4 {
        assert!(!flags(&rig.dovecot, uid).contains(&"\\Seen".to_string()), "ignored mail stays unread for a person");
    }
}

/// Dovecot killed while the bridge is in IDLE and started again: the bridge logs in again and
/// answers the next message, and nothing earlier twice.
#[test]
fn the_bridge_reconnects_when_the_server_dies_mid_idle() {
    let mut rig = Rig::start(Dovecot::start());
    rig.until_taken(0);
    rig.dovecot.deliver(&question("me@example.com", &[PASS], "before", "<i1@example.com>"), None);
    rig.reply_to("<i1@example.com>");
    // Flagged just before the bridge goes back to IDLE.
    until(Duration::from_secs(10), "the question flagged", || flags(&rig.dovecot, 1).contains(&"\\Seen".to_string()));
    rig.dovecot.kill();
    rig.dovecot.run();
    rig.dovecot.deliver(&question("me@example.com", &[PASS], "after", "<i2@example.com>"), None);
    rig.reply_to("<i2@example.com>");
    assert_eq!(replies_to(&rig.submission, "<i1@example.com>").len(), 1);
    assert_eq!(rig.daemon.jobs().len(), 2);
}

/// A server without IDLE is polled: new mail is still answered, once, and flagged with the
/// configured keyword.
#[test]
fn a_server_without_idle_is_polled_and_the_flag_is_a_keyword() {
    // With a keyword for a flag (RFC 3501 §2.3.2), as `flag` allows.
    let rig = Rig::start_with(Dovecot::start_without_idle(), "imap_tls = \"none\"\nflag = \"$Nightmail\"\n");
    rig.until_taken(0);
    for n in 1..=2 {
        let id = format!("<p{n}@example.com>");
        rig.dovecot.deliver(&question("me@example.com", &[PASS], "polled", &id), None);
        rig.reply_to(&id);
    }
    assert_eq!(rig.daemon.jobs().len(), 2);
    until(Duration::from_secs(10), "both flagged $Nightmail", || {
        (1..=2).all(|uid| flags(&rig.dovecot, uid).contains(&"$Nightmail".to_string()))
    });
    assert!(!flags(&rig.dovecot, 1).contains(&"\\Seen".to_string()), "only the configured flag is set");
}

/// A new UIDVALIDITY (the server rebuilt its index): the old messages get new UIDs but are not
/// answered again; a message newer than the last one taken is.
#[test]
fn a_uidvalidity_change_answers_only_newer_mail() {
    let mut rig = Rig::start(Dovecot::start());
    rig.until_taken(0);
    let t0 = now_secs();
    rig.dovecot.deliver(&question("me@example.com", &[PASS], "before", "<v1@example.com>"), Some(t0));
    rig.reply_to("<v1@example.com>");
    let before = rig.dovecot.uidvalidity();
    rig.dovecot.kill();
    let maildir = rig.dovecot.dir.path().join("mail/bot");
    for entry in std::fs::read_dir(&maildir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_str().unwrap().to_string();
        if name == "dovecot-uidlist" || name.starts_with("dovecot.index") {
            std::fs::remove_file(&path).unwrap();
        }
    }
    rig.dovecot.run();
    let after = rig.dovecot.uidvalidity();
    assert_ne!(before, after, "Dovecot gave the rebuilt mailbox a new UIDVALIDITY");
    rig.dovecot.deliver(&question("me@example.com", &[PASS], "after", "<v2@example.com>"), Some(t0 + 2));
    rig.reply_to("<v2@example.com>");
    until(Duration::from_secs(20), "the bridge on the new UIDVALIDITY", || {
        rig.daemon.status()["bridges"][0]["uidvalidity"].as_u64() == Some(after)
    });
    assert_eq!(replies_to(&rig.submission, "<v1@example.com>").len(), 1, "the old message is not answered again");
    assert_eq!(rig.daemon.jobs().len(), 2);
}

/// IMAP over TLS from the first byte: a certificate that does not verify is refused, with the
/// reason in `status`; with the CA given in `ca_file`, the bridge reads and answers.
#[test]
fn the_upstream_certificate_is_verified() {
    let certs = tempfile::tempdir().unwrap();
    let (ca, cert, key) = common::test_ca(certs.path());
    let mut rig = Rig::start_with(Dovecot::start_tls(&ca, &cert, &key), "imap_tls = \"implicit\"\n");
    until(Duration::from_secs(30), "the TLS failure in status", || {
        rig.daemon.status()["bridges"][0]["last_error"].as_str().is_some_and(|e| e.contains("TLS failed"))
    });
    let error = rig.daemon.status()["bridges"][0]["last_error"].as_str().unwrap().to_string();
    assert!(error.contains("bridge.ca_file") && error.to_lowercase().contains("certificate"), "{error}");
    assert!(!serde_json::to_string(&rig.daemon.status()).unwrap().contains("secret"), "no password in status");

    rig.daemon.stop();
    let text = std::fs::read_to_string(&rig.daemon.config).unwrap();
    let trusted = text
        .replace("imap_tls = \"implicit\"\n", &format!("imap_tls = \"implicit\"\nca_file = \"{}\"\n", ca.display()));
    std::fs::write(&rig.daemon.config, trusted).unwrap();
    rig.daemon.restart();
    rig.until_taken(0);
    rig.dovecot.deliver(&question("me@example.com", &[PASS], "tls", "<t1@example.com>"), None);
    rig.reply_to("<t1@example.com>");
    assert!(rig.daemon.status()["bridges"][0].get("last_error").is_none(), "the error is cleared once connected");
}
