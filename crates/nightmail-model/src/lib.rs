//! What a model is and how it computes. [`ModelSpec`] is read from the file's own metadata
//! (`spec.rs`); the network is small parts with one job each (`parts/`), built into a
//! [`DecoderLayer`] and stacked into a [`Transformer`]. An architecture is a choice of parts;
//! the weights come from a [`ModelFile`](nightmail_formats::ModelFile) and, for routed experts,
//! through an [`ExpertStore`] keyed by [`ExpertId`], and for layers the budget does not keep
//! resident, through a [`LayerStore`]: whether a weight is in RAM or streamed is not this crate's
//! business.

mod dense;
mod error;
pub mod expert_index;
pub mod layer;
pub mod mtp;
pub mod nextn;
pub mod parts;
mod source;
pub mod spec;
mod stack;
mod state;
pub mod timeline;

pub use dense::{HeldLayer, LayerBuilder, LayerStore};
pub use error::{ModelError, Result};
pub use expert_index::{
    ExpertExtent, ExpertIndex, MatrixExtent, aligned_span, expert_biases, expert_layers, expert_views,
};
pub use layer::{DecoderLayer, FeedForward, SelfAttention};
pub use nightmail_formats::ExpertId;
pub use parts::attention::Attention;
pub use parts::attn_res::{LayerResidual, ResidualBank, ResidualScore};
pub use parts::delta_rule::DeltaState;
pub use parts::expert::{Expert, ExpertStore, ExpertWork, ResidentExperts, UseExpert};
pub use parts::gated_delta_net::GatedDeltaNet;
pub use parts::hyper::{HyperHead, HyperMix};
pub use parts::kda::Kda;
pub use parts::latent_moe::LatentProjection;
pub use parts::mla::{Mla, MlaQuery};
pub use parts::moe::{MoeBlock, SharedExpert};
pub use parts::rope::Rope;
pub use parts::router::{ExpertRoute, Router};
pub use parts::sliding_mqa::SlidingMqa;
pub use source::{Recorded, Recording, WeightSource};
pub use spec::{
    Activation, Architecture, AttentionSpec, DeepseekV4Spec, DeltaNetSpec, KdaSpec, MlaSpec, ModelSpec, MoeSpec,
    RopeStyle, Routing, V4AttentionKind, Yarn,
};
pub use stack::{LayerRecall, Transformer};
pub use state::{LayerSnapshot, SequenceState};
