//! FETCH streams a large mailbox through a bounded buffer: `UID FETCH 1:* BODY.PEEK[]` of a
//! mailbox many times larger than the bound raises the daemon's peak resident memory (VmHWM,
//! reset through `/proc/PID/clear_refs` before the FETCH) by far less than the mailbox, while the
//! client at first reads nothing, so the daemon is held at a full socket. And mail stored and read
//! leaves the daemon's steady memory bounded by its configuration, not by the mail it has seen.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use common::{Daemon, PASSWORD, config};

const MESSAGES: usize = 48;
const MESSAGE_BYTES: usize = 1024 * 1024;

fn connect(daemon: &Daemon) -> (TcpStream, BufReader<TcpStream>) {
    let stream = TcpStream::connect(daemon.imap).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let mut greeting = String::new();
    reader.read_line(&mut greeting).unwrap();
    (stream, reader)
}

/// Reads lines (and skips the literals they announce) until the tagged line of `tag`.
fn until(reader: &mut BufReader<TcpStream>, tag: &str) -> String {
    loop {
        let mut line = Vec::new();
        assert!(reader.read_until(b'\n', &mut line).unwrap() > 0, "connection closed before {tag}");
        let text = String::from_utf8_lossy(&line).to_string();
        if text.starts_with(&format!("{tag} ")) {
            return text;
        }
    }
}

/// A `/proc/PID/status` figure in kB.
fn proc_kb(pid: u32, key: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with(key)).unwrap_or_else(|| panic!("no {key}"));
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

/// The send and receive queues (bytes) of the loopback TCP socket from `local` to `remote` port,
/// from `/proc/net/tcp` (`tx_queue:rx_queue`, hex).
fn queues(local: u16, remote: u16) -> Option<(u64, u64)> {
    let table = std::fs::read_to_string("/proc/net/tcp").ok()?;
    table.lines().skip(1).find_map(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let port = |addr: &str| u16::from_str_radix(addr.rsplit(':').next()?, 16).ok();
        if port(fields.get(1)?)? != local || port(fields.get(2)?)? != remote {
            return None;
        }
        let (tx, rx) = fields.get(4)?.split_once(':')?;
        Some((u64::from_str_radix(tx, 16).ok()?, u64::from_str_radix(rx, 16).ok()?))
    })
}

#[test]
fn fetching_a_large_mailbox_holds_a_bounded_buffer() {
    let daemon =
        Daemon::start_with(|dir| config(dir, "").replace("max_message_bytes = 100000", "max_message_bytes = 2000000"));
    let pid = daemon.pid();
    // The mailbox: MESSAGES messages of about 1 MiB, APPENDed with LITERAL+ in one stream.
    let (mut writer, mut reader) = connect(&daemon);
    writer.write_all(format!("a LOGIN me \"{PASSWORD}\"\r\n").as_bytes()).unwrap();
    assert!(until(&mut reader, "a").starts_with("a OK"));
    let line = "x".repeat(998) + "\r\n";
    for i in 0..MESSAGES {
        let mut message = format!("Subject: big {i}\r\nMessage-ID: <big{i}@test>\r\n\r\n").into_bytes();
        while message.len() + line.len() <= MESSAGE_BYTES {
            message.extend_from_slice(line.as_bytes());
        }
        writer.write_all(format!("p{i} APPEND INBOX {{{}+}}\r\n", message.len()).as_bytes()).unwrap();
        writer.write_all(&message).unwrap();
        writer.write_all(b"\r\n").unwrap();
        if i % 8 == 7 || i == MESSAGES - 1 {
            for j in (i + 1 - if i % 8 == 7 { 8 } else { MESSAGES % 8 })..=i {
                let tagged = until(&mut reader, &format!("p{j}"));
                assert!(tagged.starts_with(&format!("p{j} OK")), "{tagged}");
            }
        }
    }
    let mailbox_kb = (MESSAGES * MESSAGE_BYTES / 1024) as u64;

    // From here on, the peak is the FETCH's.
    std::fs::write(format!("/proc/{pid}/clear_refs"), "5").expect("reset VmHWM (Linux 4.0+)");
    let before = proc_kb(pid, "VmRSS:");
    let (mut writer, mut reader) = connect(&daemon);
    writer.write_all(format!("a LOGIN me \"{PASSWORD}\"\r\nb SELECT INBOX\r\n").as_bytes()).unwrap();
    until(&mut reader, "b");
    writer.write_all(b"c UID FETCH 1:* BODY.PEEK[]\r\n").unwrap();
    // The client reads nothing until the daemon is held: bytes wait in the client's receive
    // queue and more than 1 MiB in the daemon's send queue.
    let (client, server) = (writer.local_addr().unwrap().port(), daemon.imap.port());
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let held = matches!((queues(client, server), queues(server, client)), (Some((_, rx)), Some((tx, _))) if rx > 0 && tx > 1024 * 1024);
        if held {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the daemon never filled the socket: {:?} {:?}",
            queues(client, server),
            queues(server, client)
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let held_peak = proc_kb(pid, "VmHWM:");
    // Then it reads everything, in small pieces.
    let mut received = 0usize;
    let mut bodies = 0usize;
    let mut buf = vec![0u8; 64 * 1024];
    let mut tail = Vec::new();
    loop {
        let n = reader.read(&mut buf).unwrap();
        assert!(n > 0, "connection closed during the FETCH");
        received += n;
        tail.extend_from_slice(&buf[..n]);
        bodies += tail.windows(9).filter(|w| w == b"BODY[] {1").count();
        if tail.windows(4).any(|w| w == b"c OK") {
            break;
        }
        tail.drain(..tail.len().saturating_sub(8));
    }
    let peak = proc_kb(pid, "VmHWM:");
    assert_eq!(bodies, MESSAGES, "every message was sent");
    assert!(received >= MESSAGES * MESSAGE_BYTES * 99 / 100, "{received} bytes");
    let growth = peak.saturating_sub(before);
    eprintln!(
        "mailbox {mailbox_kb} kB; daemon RSS before {before} kB, peak while held {held_peak} kB, peak {peak} kB (+{growth} kB)"
    );
    assert!(growth < mailbox_kb / 4, "FETCH raised the peak by {growth} kB for a {mailbox_kb} kB mailbox");
}

/// APPENDs `count` messages of about `bytes` each to INBOX over one connection (LITERAL+).
fn append(daemon: &Daemon, first: usize, count: usize, bytes: usize) {
    let (mut writer, mut reader) = connect(daemon);
    writer.write_all(format!("a LOGIN me \"{PASSWORD}\"\r\n").as_bytes()).unwrap();
    assert!(until(&mut reader, "a").starts_with("a OK"));
    let line = "y".repeat(998) + "\r\n";
    for i in first..first + count {
        let mut message = format!("Subject: kept {i}\r\nMessage-ID: <kept{i}@test>\r\n\r\n").into_bytes();
        while message.len() + line.len() <= bytes {
            message.extend_from_slice(line.as_bytes());
        }
        writer.write_all(format!("p{i} APPEND INBOX {{{}+}}\r\n", message.len()).as_bytes()).unwrap();
        writer.write_all(&message).unwrap();
        writer.write_all(b"\r\n").unwrap();
        let tagged = until(&mut reader, &format!("p{i}"));
        assert!(tagged.starts_with(&format!("p{i} OK")), "{tagged}");
    }
}

/// Fetches the whole INBOX, reading as it comes; returns the bytes received.
fn fetch_all(daemon: &Daemon) -> usize {
    let (mut writer, mut reader) = connect(daemon);
    writer.write_all(format!("a LOGIN me \"{PASSWORD}\"\r\nb SELECT INBOX\r\n").as_bytes()).unwrap();
    until(&mut reader, "b");
    writer.write_all(b"c UID FETCH 1:* BODY.PEEK[]\r\nd LOGOUT\r\n").unwrap();
    let mut received = 0;
    let mut buf = vec![0u8; 64 * 1024];
    while let Ok(n) = reader.read(&mut buf) {
        if n == 0 {
            break;
        }
        received += n;
    }
    received
}

/// Storing and reading mail leaves the daemon's resident memory bounded by `store.cache_mb` and
/// the largest message, not by the mail read since start: 96 messages of 780 KB (73 MiB) are
/// APPENDed and FETCHed, and the steady RSS afterwards must be within sled's cache, eight
/// messages' worth of buffers and 8 MiB of the RSS once warm. Message bytes kept as sled values
/// stay on the heap whatever the cache size; as files, the kernel's page cache holds them.
#[test]
fn reading_mail_leaves_the_daemons_memory_bounded_by_its_configuration() {
    const CACHE_MB: u64 = 8;
    const MAX_MESSAGE: usize = 1_000_000;
    const SIZE: usize = 780_000;
    let daemon = Daemon::start_with(|dir| {
        config(dir, &format!("[store]\ncache_mb = {CACHE_MB}\n"))
            .replace("max_message_bytes = 100000", &format!("max_message_bytes = {MAX_MESSAGE}"))
    });
    let pid = daemon.pid();
    // Warm: the code paths, buffers and allocator arenas of an APPEND and a FETCH.
    append(&daemon, 0, 4, SIZE);
    fetch_all(&daemon);
    std::thread::sleep(Duration::from_secs(1));
    let warm = proc_kb(pid, "VmRSS:");

    let count = 96;
    append(&daemon, 4, count, SIZE);
    let received = fetch_all(&daemon);
    assert!(received >= (count + 4) * SIZE * 99 / 100, "{received} bytes");
    // Steady: what the daemon keeps once idle, not a peak.
    std::thread::sleep(Duration::from_secs(2));
    let steady = proc_kb(pid, "VmRSS:");
    let bound_kb = CACHE_MB * 1024 + 8 * MAX_MESSAGE as u64 / 1024 + 8 * 1024;
    let mail_kb = ((count + 4) * SIZE / 1024) as u64;
    eprintln!("{mail_kb} kB of mail stored and read; RSS warm {warm} kB, steady {steady} kB (bound +{bound_kb} kB)");
    assert!(
        steady < warm + bound_kb,
        "steady RSS grew from {warm} kB to {steady} kB, past the bound of +{bound_kb} kB, with {mail_kb} kB of mail read"
    );
}
