//! The network, as small parts with one job each. An architecture is a choice of parts; the
//! weights come from a [`Checkpoint`](crate::format::Checkpoint) and, for routed experts, through
//! an [`ExpertStore`] keyed by [`ExpertId`].

mod attention;
mod attn_res;
mod compressor;
mod delta_rule;
mod dense;
mod expert;
mod f16;
mod gated_delta_net;
mod ggml;
mod hyper;
mod kda;
mod latent_moe;
mod layers;
mod matvec;
mod mla;
mod moe;
pub(crate) mod mtp;
pub mod mxfp4;
mod q4_0;
mod q4_1;
mod q8_0;
mod rope;
mod router;
mod situ;
mod sliding_mqa;
mod source;
mod state;
mod transformer;

pub use attention::Attention;
pub use attn_res::{LayerResidual, ResidualBank, ResidualScore};
pub use delta_rule::DeltaState;
pub(crate) use dense::LayerBuilder;
pub use dense::LayerStore;
pub use expert::{Expert, ExpertId, ExpertStore, ResidentExperts};
pub use f16::F16Matrix;
pub use gated_delta_net::GatedDeltaNet;
pub use ggml::Numerics;
pub use hyper::{HyperHead, HyperMix};
pub use kda::Kda;
pub use latent_moe::LatentProjection;
pub use layers::{Linear, MATVEC_ENV, MatVecPath, RmsNorm, matvec_path};
pub use mla::{Mla, MlaQuery};
pub use moe::{MoeBlock, SharedExpert};
pub use mxfp4::Mxfp4Matrix;
pub use q4_0::Q4_0Matrix;
pub use q4_1::Q4_1Matrix;
pub use q8_0::Q8_0Matrix;
pub use rope::Rope;
pub use router::{Route, Router};
pub use sliding_mqa::SlidingMqa;
pub(crate) use source::{Recorded, WeightSource};
pub(crate) use state::LayerSnapshot;
pub use state::SequenceState;
pub use transformer::{DecoderLayer, FeedForward, LayerRecall, Transformer};
