//! Schema 8: the `bridges` tree, one `BridgeState` per bridged upstream mailbox (where its reading
//! stands). Jobs and outbound entries gain `via` (the bridge they came in or go out through),
//! which serde defaults to `None` (local mail, the `[relay]`) in records written before: nothing to
//! convert. Creating a tree is safe to re-run.

use crate::StoreError;
use crate::schema::BRIDGES;

pub fn apply(db: &sled::Db) -> Result<(), StoreError> {
    db.open_tree(BRIDGES)?;
    Ok(())
}
