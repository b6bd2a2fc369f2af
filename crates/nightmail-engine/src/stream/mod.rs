//! Weights streamed from the SSD: routed experts through a RAM cache (issue "Inference engine
//! II"): the index of where each expert lies on disk, direct reads into aligned buffers, and the
//! store the MoE block fetches from; dense layers that a memory budget does not keep resident,
//! read ahead in layer order (`dense.rs`); and the plan that splits one budget between them
//! (`plan.rs`). The math does not know whether a weight came from here or from RAM.

mod buf;
mod dense;
mod index;
pub mod io;
mod plan;
mod store;
pub mod timeline;

pub use buf::{ALIGN, AlignedBuf, WeightBytes};
pub use dense::{DenseStats, LayerExtent, StreamingLayers};
pub use index::{ExpertExtent, ExpertIndex, MatrixExtent, aligned_span};
pub(crate) use index::{expert_biases, expert_layers, expert_views};
pub use plan::{DEFAULT_KV_TOKENS, LayerSize, MemoryBudget, MemoryPlan, ModelSizes, MtpSize};
pub use store::{CachePolicy, FileStats, StreamConfig, StreamStats, StreamingExperts};
