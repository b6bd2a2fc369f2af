//! `[store]`: the store's memory.

use serde::Deserialize;
use toml::Spanned;

use crate::error::{ConfigError, Locator};

#[derive(Clone, Debug)]
pub struct StoreConfig {
    /// The most sled keeps of the store's pages in memory, in bytes. sled's own default is 1 GiB,
    /// which a busy daemon fills and never gives back: the daemon's resident memory is this plus
    /// what its sessions and models use.
    pub cache_bytes: u64,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(crate) struct RawStore {
    cache_mb: Spanned<u64>,
}

impl Default for RawStore {
    fn default() -> Self {
        RawStore { cache_mb: Spanned::new(0..0, 64) }
    }
}

pub(crate) fn check(raw: &RawStore, loc: &Locator<'_>) -> Result<StoreConfig, ConfigError> {
    match *raw.cache_mb.get_ref() {
        0 => Err(loc.spanned(&raw.cache_mb, "store.cache_mb must be greater than 0".into())),
        mb => Ok(StoreConfig { cache_bytes: mb.saturating_mul(1024 * 1024) }),
    }
}
