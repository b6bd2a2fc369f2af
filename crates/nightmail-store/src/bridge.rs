//! Where each bridge's reading of its upstream mailbox stands: the mailbox's UIDVALIDITY (RFC
//! 3501 §2.3.1.1), the last UID taken, and the INTERNALDATE before which mail is old. A new upstream message
//! becomes a job in the same transaction that moves the mark past its UID, so a crash either
//! leaves both undone (the message is read again) or both done (it is never read again): nothing
//! is answered twice, nothing is skipped. Flagging the upstream message comes after, from
//! `unflagged`, which survives a crash between the two.

use nightmail_types::{Address, Timestamp};
use serde::{Deserialize, Serialize};

use crate::delivery::deliver_in;
use crate::schema::{BRIDGES, decode, encode};
use crate::{Incoming, Receipt, Store, StoreError};

/// One bridge's mark in its upstream mailbox.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BridgeState {
    /// The upstream mailbox's UIDVALIDITY when `last_uid` was taken; UIDs mean nothing under
    /// another one.
    pub uidvalidity: u32,
    /// Every message up to this UID has been taken (answered, refused or older than the bridge).
    pub last_uid: u32,
    /// Messages whose INTERNALDATE is not after this are old, whatever their UID: the bridge's
    /// first start, or the newest INTERNALDATE taken before a UIDVALIDITY change.
    pub floor: Timestamp,
    /// The newest INTERNALDATE taken: the floor after a UIDVALIDITY change.
    pub last_internal_date: Timestamp,
    /// UIDs whose job is queued but whose upstream flag is not yet known to be set.
    #[serde(default)]
    pub unflagged: Vec<u32>,
    /// Why the last connection failed, until one succeeds (for `status`). A mark with
    /// `uidvalidity` 0 (never a valid one, RFC 3501 §9 `nz-number`) holds only this: the bridge
    /// has not read its mailbox yet.
    #[serde(default)]
    pub last_error: Option<String>,
}

impl Store {
    /// The mark of the bridge for `address`, if it has ever run.
    pub fn bridge_state(&self, address: &Address) -> Result<Option<BridgeState>, StoreError> {
        self.trees.bridges.get(address.as_str().as_bytes())?.map(|v| decode(BRIDGES, &v)).transpose()
    }

    /// Every bridge's mark, by upstream address (for `status`).
    pub fn bridge_states(&self) -> Result<Vec<(String, BridgeState)>, StoreError> {
        self.trees
            .bridges
            .iter()
            .map(|kv| {
                let (k, v) = kv?;
                Ok((String::from_utf8_lossy(&k).into_owned(), decode(BRIDGES, &v)?))
            })
            .collect()
    }

    /// Records `state` for the bridge for `address`, and flushes.
    pub async fn set_bridge_state(&self, address: &Address, state: &BridgeState) -> Result<(), StoreError> {
        let writing = self.trees.writing();
        self.trees.bridges.insert(address.as_str().as_bytes(), encode(state))?;
        drop(writing);
        self.flush().await
    }

    /// Records why the bridge for `address` cannot read its mailbox (`None`: it can again),
    /// keeping the rest of its mark.
    pub async fn set_bridge_error(&self, address: &Address, error: Option<String>) -> Result<(), StoreError> {
        let mut state = self.bridge_state(address)?.unwrap_or_default();
        if state.last_error == error {
            return Ok(());
        }
        state.last_error = error;
        self.set_bridge_state(address, &state).await
    }

    /// Delivers `incoming` (the job for an upstream message; `None` for one that is not answered)
    /// and records `state` in one transaction, then flushes.
    pub async fn take_bridged(
        &self,
        address: &Address,
        incoming: Option<&Incoming>,
        state: &BridgeState,
    ) -> Result<Receipt, StoreError> {
        let (ids, _staged) = self.ready(incoming)?;
        let now = Timestamp::now();
        let receipt = self.trees.transaction(|tx| {
            let receipt = match incoming {
                Some(i) => deliver_in(tx, i, &ids, now)?,
                None => Receipt::default(),
            };
            tx.bridges.insert(address.as_str().as_bytes(), encode(state))?;
            Ok(receipt)
        })?;
        self.flush().await?;
        self.announce(&receipt);
        Ok(receipt)
    }
}
