//! Who a client is, for the limits that count per client, and how many connections each has open.
//!
//! An IPv4 address is one client. An IPv6 host is handed a whole /64 (RFC 4291 §2.5.1: interface
//! identifiers are 64 bits; RFC 8981 has hosts rotate among them at will), so per-address counts
//! would give it 2^64 budgets: an IPv6 client is its /64.

use std::collections::HashMap;
use std::future::Future;
use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, watch};

/// The client `ip` counts as: itself for IPv4 (also when written IPv4-mapped), its /64 for IPv6,
/// and one client for all of loopback (127.0.0.0/8 and ::1, RFC 1122 §3.2.1.3): every local
/// process may use any of those addresses, so each must not be a budget of its own.
pub fn client_of(ip: IpAddr) -> IpAddr {
    const LOOPBACK: IpAddr = IpAddr::V4(std::net::Ipv4Addr::LOCALHOST);
    match ip {
        ip if ip.is_loopback() => LOOPBACK,
        IpAddr::V6(v6) if v6.to_ipv4_mapped().is_some_and(|v4| v4.is_loopback()) => LOOPBACK,
        IpAddr::V4(v4) => IpAddr::V4(v4),
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6(Ipv6Addr::from(u128::from(v6) & !((1u128 << 64) - 1))),
        },
    }
}

/// Connections open per client, at most `per_client` each. Cheap to clone; clones share counts.
#[derive(Clone)]
pub struct ConnectionLimit {
    per_client: usize,
    open: Arc<Mutex<HashMap<IpAddr, usize>>>,
}

/// One admitted connection; dropping it frees its place.
pub struct Admitted {
    client: IpAddr,
    open: Arc<Mutex<HashMap<IpAddr, usize>>>,
}

impl ConnectionLimit {
    pub fn new(per_client: usize) -> ConnectionLimit {
        ConnectionLimit { per_client, open: Arc::default() }
    }

    /// A place for a connection from `ip`, or `None` when its client has `per_client` open.
    pub fn admit(&self, ip: IpAddr) -> Option<Admitted> {
        let client = client_of(ip);
        let mut open = self.open.lock().unwrap_or_else(|p| p.into_inner());
        let count = open.entry(client).or_default();
        if *count >= self.per_client {
            return None;
        }
        *count += 1;
        Some(Admitted { client, open: self.open.clone() })
    }
}

impl Drop for Admitted {
    fn drop(&mut self) {
        let mut open = self.open.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(count) = open.get_mut(&self.client) {
            *count -= 1;
            if *count == 0 {
                open.remove(&self.client);
            }
        }
    }
}

/// A connection's places, server-wide and its client's; dropping it (when the session ends) frees
/// both.
pub struct Place {
    _server: OwnedSemaphorePermit,
    _client: Admitted,
}

/// Why a connection was turned away when accepted: the server, or its client, has as many open as
/// allowed. The session says so in its protocol's words (SMTP 421, IMAP `* BYE`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Full {
    Server,
    Client,
}

/// The accept loop both servers run: accepts on `listener` until `shutdown` changes, and runs
/// `session` (which starts the session, or refuses it with the reason given) on a task of its own
/// for each connection, with the connection's local address (`listener`'s). `protocol` names the
/// server in log lines.
pub async fn accept<S, F>(
    listener: TcpListener,
    protocol: &'static str,
    max_connections: usize,
    per_client: usize,
    mut shutdown: watch::Receiver<bool>,
    mut session: S,
) where
    S: FnMut(TcpStream, SocketAddr, SocketAddr, Result<Place, Full>) -> F,
    F: Future<Output = ()> + Send + 'static,
{
    let server = Arc::new(Semaphore::new(max_connections));
    let clients = ConnectionLimit::new(per_client);
    let local = listener.local_addr().ok();
    loop {
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(pair) => pair,
                Err(e) => {
                    // EMFILE and friends: keep serving the connections we have.
                    tracing::warn!("{protocol} accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = shutdown.changed() => break,
        };
        let place = match (server.clone().try_acquire_owned(), clients.admit(peer.ip())) {
            (Ok(server), Some(client)) => Ok(Place { _server: server, _client: client }),
            (Err(_), _) => Err(Full::Server),
            (_, None) => {
                tracing::info!(%peer, "{protocol}: too many connections from this client");
                Err(Full::Client)
            }
        };
        tokio::spawn(session(stream, peer, local.unwrap_or(peer), place));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_ipv6_client_is_its_slash_64_and_a_mapped_ipv4_is_the_ipv4() {
        let a: IpAddr = "2001:db8:1:2:aaaa::1".parse().unwrap();
        let b: IpAddr = "2001:db8:1:2:ffff:ffff:ffff:ffff".parse().unwrap();
        let other: IpAddr = "2001:db8:1:3::1".parse().unwrap();
        assert_eq!(client_of(a), client_of(b));
        assert_eq!(client_of(a), "2001:db8:1:2::".parse::<IpAddr>().unwrap());
        assert_ne!(client_of(a), client_of(other));
        assert_eq!(client_of("::ffff:10.0.0.1".parse().unwrap()), "10.0.0.1".parse::<IpAddr>().unwrap());
        for loopback in ["127.0.0.1", "127.0.0.2", "127.200.1.9", "::1", "::ffff:127.0.0.5"] {
            assert_eq!(client_of(loopback.parse().unwrap()), client_of("127.0.0.1".parse().unwrap()), "{loopback}");
        }
    }

    #[test]
    fn connections_are_counted_per_client_and_freed_on_drop() {
        let limit = ConnectionLimit::new(2);
        let a: IpAddr = "2001:db8::1".parse().unwrap();
        let a2: IpAddr = "2001:db8::2".parse().unwrap();
        let first = limit.admit(a).unwrap();
        let _second = limit.admit(a2).unwrap();
        assert!(limit.admit(a).is_none(), "a third connection from the same /64");
        assert!(limit.admit("2001:db9::1".parse().unwrap()).is_some(), "another /64 is another client");
        drop(first);
        assert!(limit.admit(a2).is_some());
    }
}
