//! The sender task: leases due outbound entries, sends each message once to all its due
//! recipients through the route, and settles each recipient by its own outcome, with a
//! delivery-status notice to the sender for those that bounced, in the same transaction.

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use nightmail_config::Config;
use nightmail_store::{Incoming, LeasedOutbound, MessageKey, Recipient, Settle, Store, StoreError, Summary};
use nightmail_types::{Address, Timestamp};
use tokio::sync::watch;

use crate::dsn::{self, Failed};
use crate::error::RelayError;
use crate::route::{self, Envelope, Route};
use crate::schedule;

/// How often the queue is looked at for due entries.
const POLL: Duration = Duration::from_secs(1);
/// Entries taken per round.
const BATCH: usize = 64;
/// A lease outlives any one round's sends; one left by a crash is taken back at start-up.
const LEASE: Duration = Duration::from_secs(30 * 60);
/// Settled entries are kept this long for `status` and the daily quota.
const KEEP: Duration = Duration::from_secs(7 * 24 * 3600);

/// Called with a message once the server took it for at least one recipient, before the
/// entries are settled: a bridge appends it to the upstream Sent folder.
pub type OnSent = Arc<dyn Fn(Vec<u8>) -> Pin<Box<dyn Future<Output = ()> + Send>> + Send + Sync>;

/// The relay: the store's outbound queue worked through one route.
pub struct Relay {
    store: Store,
    config: Arc<Config>,
    route: Route,
    /// The entries this task sends: `None` for the `[relay]`, else a bridge's address.
    via: Option<Address>,
    give_up_after: Duration,
    on_sent: Option<OnSent>,
}

impl Relay {
    /// The relay `[relay]` describes, or `None` without one. Fails if its password or CA file
    /// cannot be read.
    pub fn new(store: Store, config: Arc<Config>) -> Result<Option<Relay>, RelayError> {
        let Some(relay) = &config.relay else { return Ok(None) };
        let route = Route::from_config(relay, &config.hostname)?;
        if route.tls_insecure {
            tracing::warn!(smarthost = %route.describe(), "relay.tls_insecure: the smarthost's certificate is not verified");
        }
        let give_up_after = relay.give_up_after;
        Ok(Some(Relay { store, config, route, via: None, give_up_after, on_sent: None }))
    }

    /// The sender task of the bridge for `via`: its entries, through its provider's `route`, each
    /// message handed to `on_sent` once taken. Bounces expire after 72 hours, as the relay's
    /// default.
    pub fn through(store: Store, config: Arc<Config>, route: Route, via: Address, on_sent: OnSent) -> Relay {
        let give_up_after = Duration::from_secs(72 * 3600);
        Relay { store, config, route, via: Some(via), give_up_after, on_sent: Some(on_sent) }
    }

    /// Runs until `stop` turns true. An entry being sent at that moment keeps its lease, and is
    /// sent again after the restart.
    pub async fn run(self, mut stop: watch::Receiver<bool>) {
        tracing::info!(smarthost = %self.route.describe(), via = ?self.via, "relay running");
        let mut purged_at = Timestamp(0);
        while !*stop.borrow() {
            let sent = tokio::select! {
                r = self.round() => r,
                _ = stop.changed() => break,
            };
            if let Err(e) = &sent {
                tracing::error!("relay: {e}");
            }
            let now = Timestamp::now();
            if now.since(purged_at) > Duration::from_secs(3600) {
                purged_at = now;
                let before = Timestamp(now.0.saturating_sub(KEEP.as_millis() as u64));
                if let Err(e) = self.store.purge_outbound(before).await {
                    tracing::error!("relay: purging settled entries: {e}");
                }
            }
            if !matches!(sent, Ok(n) if n > 0) {
                tokio::select! {
                    _ = tokio::time::sleep(POLL) => {}
                    _ = stop.changed() => {}
                }
            }
        }
    }

    /// Sends what is due now. Returns how many entries it settled or tried.
    pub async fn round(&self) -> Result<usize, StoreError> {
        let leased = self.store.lease_outbound_via(Timestamp::now(), LEASE, BATCH, self.via.as_ref()).await?;
        let n = leased.len();
        // One transaction per message and sender: its due recipients together.
        let mut groups: BTreeMap<(MessageKey, Option<Address>), Vec<LeasedOutbound>> = BTreeMap::new();
        for l in leased {
            groups.entry((l.entry().message, l.entry().sender.clone())).or_default().push(l);
        }
        for group in groups.into_values() {
            self.deliver(group).await?;
        }
        Ok(n)
    }

    async fn deliver(&self, group: Vec<LeasedOutbound>) -> Result<(), StoreError> {
        let first = group[0].entry().clone();
        let Some(raw) = self.store.message(first.message)? else {
            // Cannot happen while the entries hold it; settle rather than loop on it.
            tracing::error!(message = %first.message, "relay: the stored message is missing");
            let settled =
                group.into_iter().map(|l| (l, Settle::Bounced { error: "the stored message is missing".into() }));
            self.store.settle_outbound(settled.collect(), None, Timestamp::now()).await?;
            return Ok(());
        };
        let envelope =
            Envelope { from: first.sender.clone(), to: group.iter().map(|l| l.entry().recipient.clone()).collect() };
        let outcomes = route::send(&self.route, &envelope, &raw).await;
        if let Some(on_sent) = &self.on_sent
            && outcomes.iter().any(|o| matches!(o, route::Outcome::Accepted { .. }))
        {
            on_sent(raw.clone()).await;
        }
        let now = Timestamp::now();
        let give_up = self.give_up_after;
        let settled: Vec<(LeasedOutbound, Settle)> = group
            .into_iter()
            .zip(outcomes)
            .map(|(l, outcome)| {
                let settle = schedule::settle(l.entry(), &outcome, now, give_up);
                let (id, to) = (l.entry().id, &l.entry().recipient);
                match &settle {
                    Settle::Sent { reply } => tracing::info!(outbound = %id, %to, "relayed: {reply}"),
                    Settle::Retry { error, .. } => {
                        tracing::warn!(outbound = %id, %to, "relay attempt failed, will retry: {error}")
                    }
                    Settle::Bounced { error } => tracing::warn!(outbound = %id, %to, "bounced: {error}"),
                }
                (l, settle)
            })
            .collect();
        let notice = self.notice(&first.sender, first.created_at, &raw, &settled)?;
        self.store.settle_outbound(settled, notice.as_ref(), now).await?;
        Ok(())
    }

    /// A delivery-status notice for the bounced recipients, to a sender who is a local user (a
    /// model's bounced reply, or mail from `<>`, gets none: RFC 5321 §4.5.5, and no loops).
    fn notice(
        &self,
        sender: &Option<Address>,
        arrived: Timestamp,
        raw: &[u8],
        settled: &[(LeasedOutbound, Settle)],
    ) -> Result<Option<Incoming>, StoreError> {
        let Some(user) = sender.as_ref().and_then(|s| self.config.user_by_address(s)) else { return Ok(None) };
        let failed: Vec<Failed<'_>> = settled
            .iter()
            .filter_map(|(l, s)| match s {
                Settle::Bounced { error } => {
                    Some(Failed { recipient: &l.entry().recipient, error, expired: schedule::is_expiry(error) })
                }
                _ => None,
            })
            .collect();
        if failed.is_empty() {
            return Ok(None);
        }
        let first = settled[0].0.entry();
        let message_id =
            format!("<dsn.{}.{}.{:08x}@{}>", first.id, first.attempts, rand::random::<u32>(), self.config.hostname);
        let remote = self.route.describe();
        let report = dsn::Report {
            hostname: &self.config.hostname,
            remote: &remote,
            to: &user.address,
            original: raw,
            arrived,
            failed,
            message_id: &message_id,
        };
        let (raw, subject) = dsn::write(&report);
        Ok(Some(Incoming {
            key: self.store.new_message_key()?,
            raw,
            sender: None,
            recipients: vec![Recipient::User { user: user.name.clone(), address: user.address.clone() }],
            summary: Summary {
                from: format!("Mail Delivery System <MAILER-DAEMON@{}>", self.config.hostname),
                subject,
                message_id: message_id.clone(),
            },
            dedupe_id: message_id,
        }))
    }
}
