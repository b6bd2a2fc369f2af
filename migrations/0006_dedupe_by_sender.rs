//! Schema 6: dedupe marks are keyed on the sender too, by a stable digest, and expire. The old
//! marks (recipient and Message-ID, no sender) cannot be converted, since they never recorded the
//! sender: they are dropped. The cost is that a client resending, across this upgrade, a message
//! accepted before it gets a second copy; the gain is that no user's earlier mail can make another
//! user's later mail vanish. Clearing a tree is safe to re-run.

use crate::StoreError;
use crate::schema::DEDUPE;

pub fn apply(db: &sled::Db) -> Result<(), StoreError> {
    db.open_tree(DEDUPE)?.clear()?;
    Ok(())
}
