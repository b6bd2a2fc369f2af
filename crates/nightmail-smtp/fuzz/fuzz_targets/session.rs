//! One client's whole SMTP session from arbitrary bytes, through the real session code
//! (`nightmail_smtp::serve_stream`) over an in-memory pipe, with a fresh store per input.
//!
//! The first byte picks where the session starts: before EHLO, after EHLO, or authenticated as
//! `me` (AUTH PLAIN, RFC 4954), so MAIL, RCPT, DATA, pipelining and delivery into the store are
//! reached. The session must end by itself once the input ends, without panicking,
//! within [`LIMIT`].

#![no_main]

use std::net::SocketAddr;
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use libfuzzer_sys::fuzz_target;
use nightmail_auth::Authenticator;
use nightmail_config::Config;
use nightmail_smtp::Shared;
use nightmail_store::Store;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// How long one session may take before it counts as hung.
const LIMIT: Duration = Duration::from_secs(20);

const CONFIG: &str = r#"
hostname = "nightmail.test"
[smtp]
max_message_bytes = 65536
[auth]
failure_delay_ms = 0
[[user]]
name = "me"
address = "me@nightmail.test"
password = "pw"
[[user]]
name = "ann"
address = "ann@nightmail.test"
password = "pw"
[[model]]
address = "kimi@nightmail.test"
backend = "openai"
url = "http://127.0.0.1:9/v1"
"#;

static RUNTIME: LazyLock<tokio::runtime::Runtime> = LazyLock::new(|| {
    // A panic that ends a session shows up as a failed join below, and aborts there.
    std::panic::set_hook(Box::new(|info| eprintln!("panic: {info}")));
    tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a runtime")
});

static CONFIG_PARSED: LazyLock<Config> = LazyLock::new(|| Config::parse(CONFIG, None).expect("the fuzz config"));

fuzz_target!(|data: &[u8]| RUNTIME.block_on(session(data)));

async fn session(data: &[u8]) {
    let Some((&mode, input)) = data.split_first() else { return };
    let dir = tempfile::Builder::new().tempdir_in("/dev/shm").or_else(|_| tempfile::tempdir()).expect("a temp dir");
    let store = Store::open(dir.path()).expect("a store");
    let config = CONFIG_PARSED.clone();
    let auth = Authenticator::new(config.users.clone(), config.auth.clone());
    let shared = Arc::new(Shared { config: Arc::new(config), store, auth, tls: None });
    let (client, server) = tokio::io::duplex(64 * 1024);
    // Loopback on both ends: AUTH is offered without TLS, as for a local mail client.
    let addr: SocketAddr = "127.0.0.1:587".parse().expect("an address");
    let served = tokio::spawn(nightmail_smtp::serve_stream(server, addr, addr, shared));
    let (mut from_server, mut to_server) = tokio::io::split(client);
    let drain = tokio::spawn(async move {
        let mut sink = [0u8; 16 * 1024];
        while matches!(from_server.read(&mut sink).await, Ok(n) if n > 0) {}
    });
    // "\0me\0pw" in base64.
    let prelude: &[u8] = match mode % 3 {
        0 => b"",
        1 => b"EHLO fuzz\r\n",
        _ => b"EHLO fuzz\r\nAUTH PLAIN AG1lAHB3\r\n",
    };
    // A session that has closed stops reading; what it did not read is simply not sent.
    let _ = to_server.write_all(prelude).await;
    let _ = to_server.write_all(input).await;
    let _ = to_server.shutdown().await;
    drop(to_server);
    match tokio::time::timeout(LIMIT, served).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => panic!("the session task failed: {e}"),
        Err(_) => panic!("the session did not end within {LIMIT:?} of its input ending"),
    }
    let _ = drain.await;
}
