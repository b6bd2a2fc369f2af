//! The outbound queue: mail for remote recipients, one entry per recipient, waiting for the relay.
//! Entries are leased as jobs are (`queue.rs`), never popped: `queued -> sending(lease) -> sent |
//! bounced | dropped`, and a lease that is not settled expires and puts the entry back. A crash
//! between the lease and the smarthost's 250 leaves the entry to be sent again (at most one
//! duplicate, never a loss); the token guards settlement, so a sender whose lease was lost cannot
//! settle an entry another has taken.
//!
//! Each entry holds its message (`message_refs`) until it is sent, bounced or dropped; the
//! settled entry stays (without the hold) for `status` and the daily relay quota, and is purged
//! a week later.
//!
//! Time is passed in (`now`), never read here, so the schedule and the expiry can be tested
//! without waiting.

use std::time::Duration;

use nightmail_types::{Address, Timestamp};
use serde::{Deserialize, Serialize};
use sled::Transactional;
use sled::transaction::{ConflictableTransactionError, TransactionalTree};

use crate::delivery::deliver_in;
use crate::refs::RefTrees;
use crate::schema::{OUTBOUND, decode, encode};
use crate::{Incoming, MessageKey, Receipt, Store, StoreError};

crate::ids::id_u64!(
    /// A message waiting for the relay, for one remote recipient.
    OutboundId
);

/// Mail for one remote recipient.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Outbound {
    pub id: OutboundId,
    pub message: MessageKey,
    /// The envelope sender (`MAIL FROM`): the user who sent it, or the model that replied.
    pub sender: Option<Address>,
    pub recipient: Address,
    pub created_at: Timestamp,
    /// Delivery attempts so far. This and the fields below are absent in entries written before
    /// the relay existed; such an entry is queued and due.
    #[serde(default)]
    pub attempts: u32,
    #[serde(default)]
    pub state: OutboundState,
    /// What the smarthost (or the connection to it) last said, for `status`.
    #[serde(default)]
    pub last_error: Option<String>,
    /// The bridge (its upstream address) whose SMTP server sends this; `None`: the `[relay]`.
    /// Absent before bridges existed.
    #[serde(default)]
    pub via: Option<Address>,
    /// Whose daily relay quota this counts against when it is not the envelope sender: the asker
    /// a model wrote for. Absent in entries of users' own mail and written before models were
    /// counted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub charged_to: Option<Address>,
}

impl Outbound {
    /// Who sent this, as the daily relay quota counts it.
    pub fn charged(&self) -> Option<&Address> {
        self.charged_to.as_ref().or(self.sender.as_ref())
    }
}

/// Charges the entries `ids` (just made by `deliver_in`, in the same transaction) to `asker`: mail
/// a model sends on someone's behalf counts against that person's quota, not the model's.
pub(crate) fn charge_in(tree: &TransactionalTree, ids: &[OutboundId], asker: &Address) -> TxResult<()> {
    for id in ids {
        let Some(bytes) = tree.get(id.to_be_bytes())? else { continue };
        let mut entry: Outbound = decode(OUTBOUND, &bytes).map_err(ConflictableTransactionError::Abort)?;
        entry.charged_to = Some(asker.clone());
        tree.insert(&id.to_be_bytes(), encode(&entry))?;
    }
    Ok(())
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "lowercase")]
pub enum OutboundState {
    Queued {
        not_before: Timestamp,
    },
    Sending {
        lease_token: u64,
        lease_expires: Timestamp,
    },
    /// The smarthost took it: `reply` is its answer to the end of DATA.
    Sent {
        at: Timestamp,
        reply: String,
    },
    /// Refused for good, or expired: the sender got a delivery-status notice.
    Bounced {
        at: Timestamp,
        reason: String,
    },
    /// Removed by `nightmail outbound drop`.
    Dropped {
        at: Timestamp,
    },
}

impl Default for OutboundState {
    fn default() -> Self {
        OutboundState::Queued { not_before: Timestamp(0) }
    }
}

impl OutboundState {
    /// The name `nightmail status` shows.
    pub fn name(&self) -> &'static str {
        match self {
            OutboundState::Queued { .. } => "queued",
            OutboundState::Sending { .. } => "sending",
            OutboundState::Sent { .. } => "sent",
            OutboundState::Bounced { .. } => "bounced",
            OutboundState::Dropped { .. } => "dropped",
        }
    }

    /// Still to be sent: it holds its message.
    pub fn is_waiting(&self) -> bool {
        matches!(self, OutboundState::Queued { .. } | OutboundState::Sending { .. })
    }

    fn settled_at(&self) -> Option<Timestamp> {
        match self {
            OutboundState::Sent { at, .. } | OutboundState::Bounced { at, .. } | OutboundState::Dropped { at } => {
                Some(*at)
            }
            _ => None,
        }
    }
}

/// An entry this process holds a lease on. Only [`Store::lease_outbound`] makes one, and only
/// its holder can settle the entry.
#[derive(Debug)]
pub struct LeasedOutbound {
    entry: Outbound,
    token: u64,
}

impl LeasedOutbound {
    pub fn entry(&self) -> &Outbound {
        &self.entry
    }
}

/// How one attempt at one recipient ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Settle {
    Sent {
        reply: String,
    },
    /// A temporary failure: due again at `not_before`.
    Retry {
        error: String,
        not_before: Timestamp,
    },
    /// A permanent failure or expiry: settled for good (the notice goes with it).
    Bounced {
        error: String,
    },
}

/// Why `outbound retry` or `outbound drop` could not act.
#[derive(Debug, thiserror::Error)]
pub enum OutboundOpError {
    #[error("no outbound message {0}: `nightmail status` lists them")]
    NoSuch(OutboundId),
    #[error("outbound message {id} is {state} already")]
    Settled { id: OutboundId, state: &'static str },
    #[error("outbound message {0} is being sent right now; try again in a minute")]
    Sending(OutboundId),
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl From<sled::transaction::TransactionError<OutboundOpError>> for OutboundOpError {
    fn from(e: sled::transaction::TransactionError<OutboundOpError>) -> Self {
        match e {
            sled::transaction::TransactionError::Abort(e) => e,
            sled::transaction::TransactionError::Storage(e) => OutboundOpError::Store(e.into()),
        }
    }
}

type TxResult<T, E = StoreError> = Result<T, ConflictableTransactionError<E>>;

fn read<E: From<StoreError>>(outbound: &TransactionalTree, id: OutboundId) -> TxResult<Option<Outbound>, E> {
    match outbound.get(id.to_be_bytes())? {
        None => Ok(None),
        Some(v) => decode(OUTBOUND, &v).map(Some).map_err(|e| ConflictableTransactionError::Abort(e.into())),
    }
}

fn write(outbound: &TransactionalTree, entry: &Outbound) -> TxResult<(), StoreError> {
    outbound.insert(&entry.id.to_be_bytes()[..], encode(entry))?;
    Ok(())
}

impl Store {
    /// Every outbound entry (waiting, and settled within the last week), oldest first.
    pub fn outbound(&self) -> Result<Vec<Outbound>, StoreError> {
        self.trees.outbound.iter().values().map(|v| decode(OUTBOUND, &v?)).collect()
    }

    pub fn outbound_entry(&self, id: OutboundId) -> Result<Option<Outbound>, StoreError> {
        self.trees.outbound.get(id.to_be_bytes())?.map(|v| decode(OUTBOUND, &v)).transpose()
    }

    /// Outside recipients `sender` has sent to since `since`, themselves or through a model's
    /// mail on their behalf: the daily relay quota counts these.
    pub fn relayed_since(&self, sender: &Address, since: Timestamp) -> Result<usize, StoreError> {
        let mut n = 0;
        for entry in self.outbound()? {
            if entry.charged() == Some(sender) && entry.created_at >= since {
                n += 1;
            }
        }
        Ok(n)
    }

    /// Leases up to `max` entries for the `[relay]` due at `now`, oldest first, for `lease_for`.
    pub async fn lease_outbound(
        &self,
        now: Timestamp,
        lease_for: Duration,
        max: usize,
    ) -> Result<Vec<LeasedOutbound>, StoreError> {
        self.lease_outbound_via(now, lease_for, max, None).await
    }

    /// [`Store::lease_outbound`] for the entries sent through `via` (a bridge's address; `None`:
    /// the `[relay]`): each sender task leases only its own.
    pub async fn lease_outbound_via(
        &self,
        now: Timestamp,
        lease_for: Duration,
        max: usize,
        via: Option<&Address>,
    ) -> Result<Vec<LeasedOutbound>, StoreError> {
        let due: Vec<OutboundId> = self
            .outbound()?
            .into_iter()
            .filter(|e| e.via.as_ref() == via)
            .filter(|e| matches!(e.state, OutboundState::Queued { not_before } if not_before <= now))
            .map(|e| e.id)
            .take(max)
            .collect();
        if due.is_empty() {
            return Ok(Vec::new());
        }
        let token: u64 = rand::random();
        let writing = self.trees.writing();
        let leased = self.trees.outbound.transaction(|outbound| {
            let mut leased = Vec::new();
            for &id in &due {
                let Some(mut entry) = read::<StoreError>(outbound, id)? else { continue };
                // Re-read: retried, dropped or taken since the scan.
                if !matches!(entry.state, OutboundState::Queued { not_before } if not_before <= now) {
                    continue;
                }
                entry.attempts += 1;
                entry.state = OutboundState::Sending { lease_token: token, lease_expires: now.plus(lease_for) };
                write(outbound, &entry)?;
                leased.push(entry);
            }
            Ok(leased)
        })?;
        drop(writing);
        self.flush().await?;
        Ok(leased.into_iter().map(|entry| LeasedOutbound { entry, token }).collect())
    }

    /// Settles leased entries in one transaction, with `notice` (a delivery-status notice to the
    /// sender, if any entry bounced) delivered in it: a crash leaves either all of it or none.
    /// Sent and bounced entries release their hold on the message. An entry whose lease was lost
    /// is left as it is (another attempt has it).
    pub async fn settle_outbound(
        &self,
        settled: Vec<(LeasedOutbound, Settle)>,
        notice: Option<&Incoming>,
        now: Timestamp,
    ) -> Result<Option<Receipt>, StoreError> {
        let (ids, _staged) = self.ready(notice)?;
        let receipt = self.trees.transaction(|tx| {
            let holders = RefTrees { refs: tx.message_refs, collected: tx.collected, message_ids: tx.message_ids };
            for (leased, settle) in &settled {
                let Some(mut entry) = read::<StoreError>(tx.outbound, leased.entry.id)? else { continue };
                match entry.state {
                    OutboundState::Sending { lease_token, .. } if lease_token == leased.token => {}
                    _ => continue,
                }
                match settle {
                    Settle::Sent { reply } => {
                        entry.state = OutboundState::Sent { at: now, reply: reply.clone() };
                        holders.release::<StoreError>(entry.message)?;
                    }
                    Settle::Retry { error, not_before } => {
                        entry.state = OutboundState::Queued { not_before: *not_before };
                        entry.last_error = Some(error.clone());
                    }
                    Settle::Bounced { error } => {
                        entry.state = OutboundState::Bounced { at: now, reason: error.clone() };
                        entry.last_error = Some(error.clone());
                        holders.release::<StoreError>(entry.message)?;
                    }
                }
                write(tx.outbound, &entry)?;
            }
            match notice {
                Some(notice) => Ok(Some(deliver_in(tx, notice, &ids, now)?)),
                None => Ok(None),
            }
        })?;
        self.flush().await?;
        if let Some(receipt) = &receipt {
            self.announce(receipt);
        }
        Ok(receipt)
    }

    /// `nightmail outbound retry`: makes a waiting entry due now.
    pub async fn retry_outbound(&self, id: OutboundId, now: Timestamp) -> Result<Outbound, OutboundOpError> {
        let writing = self.trees.writing();
        let entry = self.trees.outbound.transaction(|outbound| {
            let mut entry = read::<OutboundOpError>(outbound, id)?
                .ok_or(ConflictableTransactionError::Abort(OutboundOpError::NoSuch(id)))?;
            match entry.state {
                OutboundState::Queued { .. } => {}
                OutboundState::Sending { .. } => {
                    return Err(ConflictableTransactionError::Abort(OutboundOpError::Sending(id)));
                }
                ref settled => {
                    return Err(ConflictableTransactionError::Abort(OutboundOpError::Settled {
                        id,
                        state: settled.name(),
                    }));
                }
            }
            entry.state = OutboundState::Queued { not_before: now };
            outbound.insert(&id.to_be_bytes()[..], encode(&entry))?;
            Ok(entry)
        })?;
        drop(writing);
        self.flush().await?;
        Ok(entry)
    }

    /// `nightmail outbound drop`: gives up on a waiting entry without a notice (the user asked),
    /// releasing its message.
    pub async fn drop_outbound(&self, id: OutboundId, now: Timestamp) -> Result<Outbound, OutboundOpError> {
        let t = &self.trees;
        let writing = self.trees.writing();
        let entry = (&t.outbound, &t.message_refs, &t.collected, &t.message_ids).transaction(
            |(outbound, refs, collected, message_ids)| {
                let mut entry = read::<OutboundOpError>(outbound, id)?
                    .ok_or(ConflictableTransactionError::Abort(OutboundOpError::NoSuch(id)))?;
                if !entry.state.is_waiting() {
                    return Err(ConflictableTransactionError::Abort(OutboundOpError::Settled {
                        id,
                        state: entry.state.name(),
                    }));
                }
                // A sender holding the lease will find it gone when it settles, and leave it.
                entry.state = OutboundState::Dropped { at: now };
                RefTrees { refs, collected, message_ids }.release::<OutboundOpError>(entry.message)?;
                outbound.insert(&id.to_be_bytes()[..], encode(&entry))?;
                Ok(entry)
            },
        )?;
        drop(writing);
        self.flush().await?;
        Ok(entry)
    }

    /// Puts back in the queue every entry being sent whose lease has expired, or, with `all`,
    /// every one (at start-up: the process that held those leases is gone). Returns how many.
    pub async fn recover_outbound(&self, all: bool, now: Timestamp) -> Result<usize, StoreError> {
        let stale: Vec<OutboundId> = self
            .outbound()?
            .into_iter()
            .filter(|e| matches!(e.state, OutboundState::Sending { lease_expires, .. } if all || lease_expires <= now))
            .map(|e| e.id)
            .collect();
        if stale.is_empty() {
            return Ok(0);
        }
        let writing = self.trees.writing();
        let recovered = self.trees.outbound.transaction(|outbound| {
            let mut n = 0;
            for &id in &stale {
                let Some(mut entry) = read::<StoreError>(outbound, id)? else { continue };
                if !matches!(entry.state, OutboundState::Sending { lease_expires, .. } if all || lease_expires <= now) {
                    continue;
                }
                entry.state = OutboundState::Queued { not_before: now };
                write(outbound, &entry)?;
                n += 1;
            }
            Ok(n)
        })?;
        drop(writing);
        self.flush().await?;
        Ok(recovered)
    }

    /// Removes entries settled before `before`. Returns how many.
    pub async fn purge_outbound(&self, before: Timestamp) -> Result<usize, StoreError> {
        let mut purged = 0;
        for entry in self.outbound()? {
            if entry.state.settled_at().is_some_and(|at| at < before) {
                let writing = self.trees.writing();
                self.trees.outbound.remove(entry.id.to_be_bytes())?;
                drop(writing);
                purged += 1;
            }
        }
        if purged > 0 {
            self.flush().await?;
        }
        Ok(purged)
    }
}
