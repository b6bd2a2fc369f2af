//! What the expert cache counts: hits, misses, prefetches, evictions and the disk's share.

use serde::Serialize;

/// Counters since the store was made (or since [`StreamingExperts::reset_stats`]).
#[derive(Debug, Clone, Default, Serialize)]
pub struct StreamStats {
    /// Experts the MoE blocks asked for.
    pub requests: u64,
    /// Asked-for experts already in the cache from an earlier request.
    pub hits: u64,
    /// Asked-for experts that a prefetch had read or was reading.
    pub prefetch_hits: u64,
    /// Asked-for experts read on demand.
    pub misses: u64,
    pub disk_reads: u64,
    pub disk_bytes: u64,
    pub prefetch_reads: u64,
    pub prefetch_bytes: u64,
    /// Prefetched experts evicted before any use.
    pub prefetch_wasted: u64,
    pub evictions: u64,
    /// Seconds during which at least one read was in flight.
    pub disk_busy_s: f64,
    pub cache_used_bytes: u64,
    pub cache_budget_bytes: u64,
    /// Per MoE layer (in layer order), the distinct experts asked for.
    pub distinct_experts: Vec<(usize, usize)>,
    /// Per expert file (a striped model's parts, each on its own disk): what was read from it.
    pub files: Vec<FileStats>,
}

/// The reads of one expert file.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct FileStats {
    pub path: std::path::PathBuf,
    pub disk_reads: u64,
    pub disk_bytes: u64,
    /// Seconds during which at least one read of this file was in flight.
    pub busy_s: f64,
}

impl FileStats {
    /// The rate its reads achieved while any was in flight.
    pub fn busy_gbps(&self) -> f64 {
        if self.busy_s > 0.0 { self.disk_bytes as f64 / self.busy_s / 1e9 } else { 0.0 }
    }
}
