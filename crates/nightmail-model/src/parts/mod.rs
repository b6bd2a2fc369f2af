//! The parts a decoder layer is built from, one job each, each with `load` and `forward`.

pub mod attention;
pub mod attn_res;
pub mod compressor;
pub mod delta_rule;
pub mod dsa;
pub mod embedding;
pub mod expert;
pub mod gated_delta_net;
pub mod hyper;
pub mod kda;
pub mod latent_moe;
pub mod mla;
pub mod moe;
pub mod norm;
pub mod rope;
pub mod router;
pub mod situ;
pub mod sliding_mqa;
