//! The daily relay quota, held from RCPT on: an outside recipient of an open SMTP transaction
//! counts against its sender as the stored outbound entries do, so parallel sessions of one user
//! cannot each find the quota free and together go past it. Holds live in memory (sled admits
//! one process, so no other process relays from this store); a hold ends when its transaction
//! does, after the message's outbound entries are stored, so no recipient is ever counted by
//! neither.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use nightmail_types::{Address, Timestamp};

use crate::{Store, StoreError};

/// Outside recipients held by open transactions, per sender.
#[derive(Default)]
pub(crate) struct RelayHolds(Mutex<HashMap<Address, usize>>);

impl RelayHolds {
    fn lock(&self) -> MutexGuard<'_, HashMap<Address, usize>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// One outside recipient held against its sender's quota until this is dropped (the transaction
/// ended: RSET, QUIT, a refused message, a timeout, or its outbound entries stored).
pub struct RelayHold {
    holds: Arc<RelayHolds>,
    sender: Address,
}

impl Drop for RelayHold {
    fn drop(&mut self) {
        let mut holds = self.holds.lock();
        if let Some(n) = holds.get_mut(&self.sender) {
            *n -= 1;
            if *n == 0 {
                holds.remove(&self.sender);
            }
        }
    }
}

impl std::fmt::Debug for RelayHold {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "RelayHold({})", self.sender)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum HoldError {
    /// `used` outside recipients were sent or are held since the window began.
    #[error("the daily relay quota is reached: {used} outside recipients sent or being sent")]
    QuotaReached { used: usize },
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl Store {
    /// Holds one outside recipient for `sender` if what they relayed since `since` and what their
    /// open transactions hold stay under `quota`. The check and the hold are one step under one
    /// lock, so no two sessions can take the last place.
    pub fn hold_relay(&self, sender: &Address, quota: usize, since: Timestamp) -> Result<RelayHold, HoldError> {
        let mut holds = self.relay_holds.lock();
        let held = holds.get(sender).copied().unwrap_or(0);
        let used = self.relayed_since(sender, since)? + held;
        if used >= quota {
            return Err(HoldError::QuotaReached { used });
        }
        holds.insert(sender.clone(), held + 1);
        Ok(RelayHold { holds: self.relay_holds.clone(), sender: sender.clone() })
    }

    /// What counts against `sender`'s quota now: outside recipients relayed since `since` and
    /// those their open transactions hold.
    pub fn relay_used(&self, sender: &Address, since: Timestamp) -> Result<usize, StoreError> {
        let holds = self.relay_holds.lock();
        Ok(self.relayed_since(sender, since)? + holds.get(sender).copied().unwrap_or(0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holds_count_until_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let me = Address::parse("me@x.org").unwrap();
        let other = Address::parse("other@x.org").unwrap();
        let a = store.hold_relay(&me, 2, Timestamp(0)).unwrap();
        let b = store.hold_relay(&me, 2, Timestamp(0)).unwrap();
        assert!(matches!(store.hold_relay(&me, 2, Timestamp(0)), Err(HoldError::QuotaReached { used: 2 })));
        let _theirs = store.hold_relay(&other, 2, Timestamp(0)).expect("each sender has their own quota");
        drop(a);
        let _c = store.hold_relay(&me, 2, Timestamp(0)).expect("a released hold frees its place");
        assert_eq!(store.relay_used(&me, Timestamp(0)).unwrap(), 2, "held places count as used");
        drop(b);
    }
}
