//! The IMAP server: RFC 3501 (IMAP4rev1) with the extensions mail clients rely on, several of
//! which RFC 9051 (IMAP4rev2) folds in: IDLE (RFC 2177), UIDPLUS (RFC 4315), MOVE (RFC 6851),
//! UNSELECT (RFC 3691), ENABLE (RFC 5161), ID (RFC 2971), NAMESPACE (RFC 2342), SPECIAL-USE
//! (RFC 6154), SASL-IR (RFC 4959), LITERAL+ (RFC 7888), SORT and THREAD=REFERENCES/ORDEREDSUBJECT (RFC 5256),
//! ESEARCH (RFC 4731), ESORT (RFC 5267), BINARY (RFC 3516), UTF8=ACCEPT (RFC 6855),
//! COMPRESS=DEFLATE (RFC 4978), NOTIFY (RFC 5465).
//!
//! The grammar, literals, AUTHENTICATE and IDLE framing are imap-codec's and imap-next's (its
//! sans-I/O server flow); this crate holds the session state, one module per command in
//! `command/`, and the mapping from the store to IMAP's views (sequence numbers, sections).

mod command;
mod error;
mod imap_url;
mod mime;
mod notify;
mod order;
mod session;
mod transport;
mod view;

use std::net::SocketAddr;
use std::sync::Arc;

use nightmail_auth::{Authenticator, Full};
use nightmail_config::Config;
use nightmail_store::Store;
use nightmail_tls::TlsAcceptor;
pub use nightmail_tls::Wrap;
use tokio::net::TcpListener;
use tokio::sync::{Semaphore, watch};

pub use error::ImapError;

/// Everything a session needs, shared by all sessions.
pub struct Shared {
    pub config: Arc<Config>,
    pub store: Store,
    pub auth: Authenticator,
    pub tls: Option<TlsAcceptor>,
}

/// Serves IMAP on `listener` until `shutdown` turns true.
///
/// `current` holds the configuration new sessions start with: the daemon replaces it on SIGHUP,
/// and each session keeps the one it began with. The connection limits are the first one's.
pub async fn serve(
    listener: TcpListener,
    current: watch::Receiver<Arc<Shared>>,
    shutdown: watch::Receiver<bool>,
    wrap: Wrap,
) {
    // More connections than these are greeted with BYE (RFC 3501 §7.1.5).
    let (max, per_client, unauthenticated) = {
        let first = &current.borrow().config.imap;
        (first.max_connections, first.max_connections_per_ip, first.max_unauthenticated)
    };
    // Sessions not yet logged in take one of these too, and give it back at login: silent
    // connections can hold no more than these of the server's places.
    let waiting = Arc::new(Semaphore::new(unauthenticated));
    let stop = shutdown.clone();
    nightmail_auth::accept(listener, "imap", max, per_client, shutdown, move |stream, peer, local, place| {
        let shared = current.borrow().clone();
        let wrap = wrap.with(shared.tls.as_ref());
        let stop = stop.clone();
        let login_place = waiting.clone().try_acquire_owned();
        async move {
            match (place, login_place) {
                (Ok(_place), Ok(login_place)) => {
                    let _ = stream.set_nodelay(true);
                    let quick_ack = transport::QuickAck::of(&stream);
                    session::run(stream, peer, local, shared, stop, wrap, quick_ack, Some(login_place)).await
                }
                (Ok(_), Err(_)) => {
                    tracing::info!(%peer, "imap: too many connections waiting to log in");
                    session::refuse(stream, "too many connections waiting to log in, try again later").await
                }
                (Err(Full::Server), _) => session::refuse(stream, "too many connections, try again later").await,
                (Err(Full::Client), _) => {
                    session::refuse(stream, "too many connections from your address, close some and try again").await
                }
            }
        }
    })
    .await
}

/// Serves one session over any byte stream, as `serve` does for each TCP connection: how the fuzz
/// target (`fuzz/`) drives the real session code over an in-memory pipe.
#[doc(hidden)]
pub async fn serve_stream(
    stream: impl tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    peer: SocketAddr,
    local: SocketAddr,
    shared: Arc<Shared>,
    stop: watch::Receiver<bool>,
) {
    session::run(stream, peer, local, shared, stop, Wrap::Plain, transport::QuickAck::none(), None).await
}

/// On a loopback listener nothing crosses a network, so LOGIN is allowed without TLS; elsewhere
/// RFC 3501 §6.2.3 and RFC 8314 want TLS first (LOGINDISABLED until STARTTLS).
pub(crate) fn is_loopback(addr: &SocketAddr) -> bool {
    addr.ip().is_loopback()
}
