//! How the expert cache is set up: its byte budget, eviction policy, prefetch depth and readers.

use serde::Serialize;

/// Which cached expert to drop when the budget is full.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum CachePolicy {
    /// Least recently used.
    #[default]
    Lru,
    /// Least frequently used (ties: least recently), with counts that halve as the cache turns
    /// over, so that an expert hot an hour ago does not stay forever.
    Lfu,
}

impl std::str::FromStr for CachePolicy {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "lru" => Ok(CachePolicy::Lru),
            "lfu" => Ok(CachePolicy::Lfu),
            other => Err(format!("unknown cache policy `{other}`: use lru or lfu")),
        }
    }
}

/// How experts are streamed.
#[derive(Debug, Clone)]
pub struct StreamConfig {
    /// The expert cache's budget in bytes (in-flight reads count against it).
    pub cache_bytes: usize,
    pub policy: CachePolicy,
    /// Reads in flight at once.
    pub io_threads: usize,
    /// Experts of the next layer to prefetch from the prediction (0: no prefetch).
    pub prefetch_depth: usize,
    pub max_prefetch_in_flight: usize,
}

impl StreamConfig {
    pub fn with_cache_mb(mb: usize) -> Self {
        StreamConfig {
            cache_bytes: mb << 20,
            policy: CachePolicy::Lru,
            io_threads: 16,
            prefetch_depth: 8,
            max_prefetch_in_flight: 2,
        }
    }
}
