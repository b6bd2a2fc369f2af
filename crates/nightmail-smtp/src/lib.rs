//! The SMTP submission server: RFC 5321 as profiled for submission by RFC 6409. Commands and DATA
//! are parsed by `smtp-proto` (Stalwart's codec); this crate holds the policy (who may send what,
//! to whom, how much) and hands accepted messages to the store.
//!
//! A message is answered `250` only after [`nightmail_store::Store::deliver`] has flushed it and
//! its jobs to disk.

mod command;
mod identity;
mod message;
mod reply;
mod session;

use std::net::SocketAddr;
use std::sync::Arc;

use nightmail_auth::{Authenticator, Full};
use nightmail_config::Config;
use nightmail_store::Store;
use nightmail_tls::TlsAcceptor;
pub use nightmail_tls::Wrap;
use tokio::net::TcpListener;
use tokio::sync::watch;

pub use reply::Reply;

/// Everything a session needs, shared by all sessions.
pub struct Shared {
    pub config: Arc<Config>,
    pub store: Store,
    pub auth: Authenticator,
    pub tls: Option<TlsAcceptor>,
}

/// Serves SMTP on `listener` until `shutdown` turns true.
///
/// `current` holds the configuration new sessions start with: the daemon replaces it on SIGHUP,
/// and each session keeps the one it began with. The connection limits are the first one's.
pub async fn serve(
    listener: TcpListener,
    current: watch::Receiver<Arc<Shared>>,
    shutdown: watch::Receiver<bool>,
    wrap: Wrap,
) {
    let (max, per_client) = {
        let first = &current.borrow().config.smtp;
        (first.max_connections, first.max_connections_per_ip)
    };
    nightmail_auth::accept(listener, "smtp", max, per_client, shutdown, move |stream, peer, local, place| {
        let shared = current.borrow().clone();
        let wrap = wrap.with(shared.tls.as_ref());
        async move {
            match place {
                Ok(_place) => session::run(stream, peer, local, shared, wrap).await,
                Err(Full::Server) => session::refuse(stream, reply::BUSY).await,
                Err(Full::Client) => session::refuse(stream, reply::BUSY_CLIENT).await,
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
) {
    session::run(stream, peer, local, shared, Wrap::Plain).await
}

/// Whether a listener address is loopback: there, AUTH is allowed without TLS (nothing crosses
/// a network); elsewhere RFC 4954 §4 wants TLS first.
pub(crate) fn is_loopback(addr: &SocketAddr) -> bool {
    addr.ip().is_loopback()
}
