//! The kill -9 soak: steady submission of local mail and of questions to a model (answered by a
//! fast OpenAI-compatible stand-in on loopback) while the daemon is SIGKILLed at random moments.
//! Afterwards every message that got its 250 is in its mailbox exactly once, every question that
//! got its 250 has exactly one reply, and nothing without a 250 is there twice (RFC 5321 §6.1:
//! a 250 is a promise to deliver). `NIGHTMAIL_SOAK_KILLS` sets the number of kills (CI: 12;
//! `benches/kill_soak.sh` runs 1,000); `NIGHTMAIL_SOAK_SEED` repeats a run.

mod common;

use common::{Daemon, PASSWORD, base64_plain, header};
use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

/// xorshift64*: the kill moments, reproducible from the printed seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
}

/// An OpenAI-compatible server that answers every chat completion at once with one streamed
/// chunk, a finish reason and `[DONE]` (the shape the worker's openai backend reads).
fn stand_in_backend() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/v1", listener.local_addr().unwrap());
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(conn) = conn else { continue };
            std::thread::spawn(move || {
                let _ = answer(conn);
            });
        }
    });
    url
}

fn answer(mut conn: TcpStream) -> std::io::Result<()> {
    let mut reader = BufReader::new(conn.try_clone()?);
    let mut length = 0usize;
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line)? == 0 {
            return Ok(());
        }
        if let Some((name, value)) = line.split_once(':')
            && name.eq_ignore_ascii_case("content-length")
        {
            length = value.trim().parse().unwrap_or(0);
        }
        if line == "\r\n" {
            break;
        }
    }
    let mut body = vec![0; length];
    reader.read_exact(&mut body)?;
    let chunk = r#"{"choices":[{"delta":{"content":"Answered."},"finish_reason":"stop"}]}"#;
    let events = format!("data: {chunk}\n\ndata: [DONE]\n\n");
    write!(
        conn,
        "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{events}",
        events.len()
    )
}

/// One SMTP submission as `me` that reports a broken connection instead of panicking: the
/// daemon may die at any byte.
fn submit(addr: SocketAddr, to: &str, id: &str) -> std::io::Result<bool> {
    let stream = TcpStream::connect(addr)?;
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut writer = stream;
    let mut reply = || -> std::io::Result<String> {
        let mut line = String::new();
        loop {
            line.clear();
            if reader.read_line(&mut line)? == 0 {
                return Err(std::io::ErrorKind::UnexpectedEof.into());
            }
            if line.as_bytes().get(3) != Some(&b'-') {
                return Ok(line);
            }
        }
    };
    let ok = |r: String, code: &str| -> std::io::Result<()> {
        if r.starts_with(code) { Ok(()) } else { Err(std::io::Error::other(format!("expected {code}, got {r}"))) }
    };
    ok(reply()?, "220")?;
    let token = base64_plain("me", PASSWORD);
    let body = format!(
        "From: me@nightmail.test\r\nTo: {to}\r\nSubject: soak {id}\r\nMessage-ID: {id}\r\n\r\nbody {id}\r\n.\r\n"
    );
    for (line, code) in [
        ("EHLO soak".to_string(), "250"),
        (format!("AUTH PLAIN {token}"), "235"),
        ("MAIL FROM:<me@nightmail.test>".into(), "250"),
        (format!("RCPT TO:<{to}>"), "250"),
        ("DATA".into(), "354"),
    ] {
        writer.write_all(format!("{line}\r\n").as_bytes())?;
        ok(reply()?, code)?;
    }
    writer.write_all(body.as_bytes())?;
    let end = reply()?;
    Ok(end.starts_with("250 2.0.0 queued as "))
}

#[test]
fn every_acknowledged_message_and_question_survives_random_kills_exactly_once() {
    let kills: usize = std::env::var("NIGHTMAIL_SOAK_KILLS").ok().and_then(|v| v.parse().ok()).unwrap_or(12);
    let seed: u64 = std::env::var("NIGHTMAIL_SOAK_SEED").ok().and_then(|v| v.parse().ok()).unwrap_or_else(|| {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64 | 1
    });
    eprintln!("kill soak: {kills} kills, NIGHTMAIL_SOAK_SEED={seed}");
    let mut rng = Rng(seed);
    let url = stand_in_backend();
    let mut daemon = Daemon::start_with(|dir| {
        common::config_answering(dir, "", &url, 2).replace(
            "[worker]\n",
            "[worker]\nmax_attempts = 100000\nmax_replies_per_sender_per_hour = 1000000\nlease_secs = 5\n",
        )
    });
    // Each Message-ID sent, and whether its 250 came back.
    let mut acknowledged: BTreeSet<String> = BTreeSet::new();
    let mut sent: BTreeSet<String> = BTreeSet::new();
    let mut questions: BTreeSet<String> = BTreeSet::new();
    let mut n = 0u64;
    for round in 0..kills {
        if round > 0 {
            daemon.restart();
        }
        // The kill lands 20-300 ms into the round: mid-DATA, mid-answer or between transactions.
        let after = Duration::from_millis(20 + rng.next() % 280);
        let pid = daemon.pid();
        let killer = std::thread::spawn(move || {
            std::thread::sleep(after);
            std::process::Command::new("kill").args(["-KILL", &pid.to_string()]).status().unwrap();
        });
        loop {
            n += 1;
            let question = n % 2 == 1;
            let to = if question { "kimi@nightmail.test" } else { "ann@nightmail.test" };
            let id = format!("<soak{n}@client>");
            sent.insert(id.clone());
            if question {
                questions.insert(id.clone());
            }
            match submit(daemon.smtp, to, &id) {
                Ok(true) => {
                    acknowledged.insert(id);
                }
                Ok(false) => panic!("{id} was refused while the daemon ran"),
                Err(_) => break,
            }
        }
        killer.join().unwrap();
        daemon.kill9();
    }
    daemon.restart();
    let asked: Vec<&String> = questions.iter().filter(|q| acknowledged.contains(*q)).collect();
    eprintln!("kill soak: {} submitted, {} acknowledged ({} questions)", sent.len(), acknowledged.len(), asked.len());
    assert!(acknowledged.len() >= kills, "too few submissions between kills to test anything");
    // Every job that exists ends done (none failed: the attempt limit is out of reach).
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let jobs = daemon.jobs();
        let open: Vec<_> = jobs.iter().filter(|j| j["state"] != "done").collect();
        assert!(open.iter().all(|j| j["state"] != "failed"), "a job failed: {open:?}");
        if open.is_empty() && jobs.len() >= asked.len() {
            break;
        }
        assert!(Instant::now() < deadline, "jobs still open after 120 s: {open:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
    daemon.stop();

    let mut delivered: BTreeMap<String, usize> = BTreeMap::new();
    for m in daemon.mailbox("ann", "INBOX") {
        *delivered.entry(header(&m, "Message-ID").unwrap()).or_default() += 1;
    }
    let mut replies: BTreeMap<String, usize> = BTreeMap::new();
    for m in daemon.mailbox("me", "INBOX") {
        if let Some(to) = header(&m, "In-Reply-To") {
            *replies.entry(to).or_default() += 1;
        }
    }
    for id in &sent {
        let (count, what) =
            if questions.contains(id) { (replies.get(id), "replies to") } else { (delivered.get(id), "copies of") };
        let count = count.copied().unwrap_or(0);
        if acknowledged.contains(id) {
            assert_eq!(count, 1, "{count} {what} {id}, which got its 250 (seed {seed})");
        } else {
            assert!(count <= 1, "{count} {what} {id}, which got no 250 (seed {seed})");
        }
    }
    assert!(delivered.keys().all(|id| sent.contains(id)), "mail nobody sent: {delivered:?}");
}
