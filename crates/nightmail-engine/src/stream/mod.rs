//! Routed experts streamed from the SSD through a RAM cache (issue "Inference engine II"): the
//! index of where each expert lies on disk, direct reads into aligned buffers, and the store the
//! MoE block fetches from. The math does not know whether an expert came from here or from
//! [`ResidentExperts`](crate::model::ResidentExperts).

mod buf;
mod index;
pub mod io;
mod store;

pub use buf::{ALIGN, AlignedBuf, WeightBytes};
pub use index::{ExpertExtent, ExpertIndex, MatrixExtent, aligned_span};
pub(crate) use index::{expert_biases, expert_views};
pub use store::{CachePolicy, StreamConfig, StreamStats, StreamingExperts};
