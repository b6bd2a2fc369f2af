//! Bridges: a model answers mail sent to a mailbox it owns at another provider (say
//! `kimi.bot@fastmail.com`), reached from any device. nightmail only connects out, so it runs
//! behind NAT:
//!
//! - `reader.rs`: IMAP with async-imap (IDLE or polling, reconnect with backoff) into the store:
//!   each new message after the mark (`mark.rs`, kept in the store) that `admit.rs` lets through
//!   becomes a job of the bridge's model, in one transaction with the mark, then is flagged.
//! - `admit.rs` and `auth_results.rs`: answered only for senders on the allow list whose From the
//!   provider vouches for (RFC 8601 `Authentication-Results`: DMARC, or aligned DKIM).
//! - The answer goes out through the provider's SMTP server: nightmail-relay's sender task, for
//!   this bridge's outbound entries only, and `sent.rs` appends it to the upstream Sent folder.
//!
//! Like the relay, this crate never sees models: it feeds the store, and the worker answers.

mod admit;
mod auth_results;
mod connect;
mod error;
mod mark;
mod reader;
mod sent;

use std::sync::Arc;

use nightmail_config::{BridgeConfig, Config};
use nightmail_relay::{Relay, Route};
use nightmail_store::Store;
use tokio::sync::watch;

pub use auth_results::{AuthResults, MethodResult, Verdict, parse as parse_auth_results, verdict};
pub use error::BridgeError;

/// One bridge: its reader and its sender.
pub struct Bridge {
    reader: reader::Reader,
    sender: Relay,
}

impl Bridge {
    /// Reads the bridge's password and CA file now, so a mistake is a start-up error.
    pub fn new(store: Store, config: Arc<Config>, bridge: &BridgeConfig) -> Result<Bridge, BridgeError> {
        let login = connect::Login::new(bridge)?;
        let route = Route::from_bridge(bridge, &config.hostname).map_err(|e| BridgeError::Config(e.to_string()))?;
        if bridge.tls_insecure {
            tracing::warn!(bridge = %bridge.address, "bridge.tls_insecure: the provider's certificates are not verified");
        }
        let (sent_login, sent_mailbox) = (login.clone(), bridge.sent_mailbox.clone());
        let on_sent: nightmail_relay::OnSent = Arc::new(move |raw: Vec<u8>| {
            let (login, mailbox) = (sent_login.clone(), sent_mailbox.clone());
            Box::pin(async move { sent::append(&login, &mailbox, &raw).await })
        });
        let sender = Relay::through(store.clone(), config, route, bridge.address.clone(), on_sent);
        Ok(Bridge { reader: reader::Reader { store, bridge: bridge.clone(), login }, sender })
    }

    /// Runs until `stop` turns true.
    pub async fn run(self, stop: watch::Receiver<bool>) {
        tokio::join!(self.reader.run(stop.clone()), self.sender.run(stop));
    }
}
