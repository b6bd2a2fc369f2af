//! One client's whole IMAP session from arbitrary bytes, through the real session code
//! (`nightmail_imap::serve_stream`) over an in-memory pipe, with a fresh store per input: shared
//! by the fuzz target (`fuzz_targets/session.rs`) and the seeds' replay under `cargo test`
//! (`tests/fuzz_seeds.rs`).
//!
//! The first byte picks where the session starts: before login, logged in (a `LOGIN` is sent
//! first), or with INBOX selected; the store holds four messages (one multipart, one with NUL,
//! bare CR and LF and 8-bit bytes: [`HOSTILE`], one with every byte value in a header and in a
//! part: [`every_byte`]) so FETCH, SEARCH, STORE, COPY, MOVE and EXPUNGE have something to work
//! on. The session must end by itself once the input ends, without panicking, within [`LIMIT`].

use std::net::SocketAddr;
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use nightmail_auth::Authenticator;
use nightmail_config::Config;
use nightmail_imap::Shared;
use nightmail_store::Store;
use nightmail_types::Timestamp;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// How long one session may take before it counts as hung.
const LIMIT: Duration = Duration::from_secs(20);

const CONFIG: &str = r#"
hostname = "nightmail.test"
[auth]
failure_delay_ms = 0
[[user]]
name = "me"
address = "me@nightmail.test"
password = "pw"
"#;

const MIME: &[u8] = b"From: Ann <ann@nightmail.test>\r\nTo: me@nightmail.test\r\nSubject: =?utf-8?q?h=C3=A9?=\r\n\
Message-ID: <m@x>\r\nDate: Mon, 02 Mar 2026 10:00:00 +0000\r\nMIME-Version: 1.0\r\n\
Content-Type: multipart/mixed; boundary=\"zz\"\r\n\r\n--zz\r\nContent-Type: text/plain; charset=utf-8\r\n\r\n\
hello body\r\n--zz\r\nContent-Type: message/rfc822\r\n\r\nSubject: inner\r\n\r\ninner body\r\n--zz--\r\n";

/// Bytes mail should not hold but a store may (an APPEND literal8, an older build's delivery):
/// NUL in the header and a body, a bare CR, a bare LF and 8-bit octets, in a multipart message
/// whose second part is clean. Every FETCH of it must answer (BINARY as a literal8) or refuse
/// cleanly, never end the session.
const HOSTILE: &[u8] = b"From: Nul <nul@nightmail.test>\r\nSubject: a\0b \xe4\xff\rc\r\n\
Content-Type: multipart/mixed; boundary=\"yy\"\r\n\r\n--yy\r\nContent-Type: text/plain; charset=utf-8\r\n\
Content-Transfer-Encoding: 8bit\r\n\r\nnul \0 bare\rcr lf\n8-bit \xe4\xff\x80\r\n--yy\r\n\
Content-Type: text/plain\r\n\r\nclean\r\n--yy--\r\n";

/// A message holding each of the 256 byte values in a header field and in a binary part (RFC 3516
/// §4.2 lets BINARY carry any octet; BODY[] of it must still answer or refuse cleanly).
fn every_byte() -> Vec<u8> {
    let all: Vec<u8> = (0..=255).collect();
    let mut raw = b"From: All <all@nightmail.test>\r\nX-All: ".to_vec();
    raw.extend_from_slice(&all);
    raw.extend_from_slice(
        b"\r\nContent-Type: multipart/mixed; boundary=\"bb\"\r\n\r\n--bb\r\n\
Content-Type: application/octet-stream\r\nContent-Transfer-Encoding: binary\r\n\r\n",
    );
    raw.extend_from_slice(&all);
    raw.extend_from_slice(b"\r\n--bb\r\nContent-Type: text/plain\r\n\r\nclean\r\n--bb--\r\n");
    raw
}

static EVERY_BYTE: LazyLock<Vec<u8>> = LazyLock::new(every_byte);

static CONFIG_PARSED: LazyLock<Config> = LazyLock::new(|| Config::parse(CONFIG, None).expect("the fuzz config"));

pub async fn session(data: &[u8]) -> Result<(), String> {
    let Some((&mode, input)) = data.split_first() else { return Ok(()) };
    let dir = tempfile::Builder::new().tempdir_in("/dev/shm").or_else(|_| tempfile::tempdir()).expect("a temp dir");
    let store = Store::open(dir.path()).expect("a store");
    let inbox = store.create_mailbox("me", "INBOX").await.expect("INBOX");
    for raw in [&b"Subject: plain\r\n\r\nfirst\r\n"[..], MIME, HOSTILE, EVERY_BYTE.as_slice()] {
        store
            .append_mail(inbox.id, raw, vec!["\\Seen".into()], Timestamp(1_700_000_000_000), None)
            .await
            .expect("seed");
    }
    let config = CONFIG_PARSED.clone();
    let auth = Authenticator::new(config.users.clone(), config.auth.clone());
    let shared = Arc::new(Shared { config: Arc::new(config), store, auth, tls: None });
    let (client, server) = tokio::io::duplex(64 * 1024);
    let (_stop, stop) = tokio::sync::watch::channel(false);
    let addr: SocketAddr = "127.0.0.1:1143".parse().expect("an address");
    let served = tokio::spawn(nightmail_imap::serve_stream(server, addr, addr, shared, stop));
    let (mut from_server, mut to_server) = tokio::io::split(client);
    let drain = tokio::spawn(async move {
        let mut sink = [0u8; 16 * 1024];
        while matches!(from_server.read(&mut sink).await, Ok(n) if n > 0) {}
    });
    let prelude: &[u8] = match mode % 3 {
        0 => b"",
        1 => b"a LOGIN me pw\r\n",
        _ => b"a LOGIN me pw\r\nb SELECT INBOX\r\n",
    };
    // A session that has closed stops reading; what it did not read is simply not sent.
    let _ = to_server.write_all(prelude).await;
    let _ = to_server.write_all(input).await;
    let _ = to_server.shutdown().await;
    drop(to_server);
    let ended = match tokio::time::timeout(LIMIT, served).await {
        Err(_) => Err(format!("the session did not end within {LIMIT:?} of its input ending")),
        Ok(Err(e)) if e.is_panic() => Err(format!("the session panicked: {e}")),
        Ok(_) => Ok(()),
    };
    let _ = drain.await;
    ended
}
