//! Weights streamed from the SSD: routed experts through a RAM cache (`store.rs`, fed by direct
//! reads into aligned buffers, `io.rs`), dense layers that a memory budget does not keep
//! resident, read ahead in layer order (`dense.rs`), and the plan that splits one budget between
//! them (`plan.rs`). The math does not know whether a weight came from here or from RAM.

mod dense;
mod expert_cache;
pub mod io;
mod plan;

pub use dense::{DenseStats, LayerExtent, StreamingLayers};
pub use expert_cache::{CachePolicy, FileStats, StreamConfig, StreamStats, StreamingExperts};
pub use plan::{DEFAULT_KV_TOKENS, LayerSize, MemoryBudget, MemoryPlan, ModelSizes, MtpSize};
