//! Qwen3-Next (transformers `Qwen3NextForCausalLM`, llama.cpp `qwen3next`): Gated DeltaNet
//! layers (spec/delta_net.rs) between gated full-attention layers, Qwen-MoE experts with a
//! gated shared expert. Qwen3.5-MoE reads the same way (qwen3_5_moe.rs).

use super::Row;
use super::rope::rope_dim_from_hf;
use super::source::{Gguf, Hf};
use crate::error::Result;
use crate::spec::{Activation, Architecture, ModelSpec, Routing, delta_net};

pub(super) const ROW: Row = Row {
    architecture: Architecture::Qwen3Next,
    gguf: &["qwen3next"],
    gguf_experts: None,
    gguf_mtp_in_blocks: true,
    hf: &["qwen3_next"],
    hf_classes: &[],
    read_gguf: read_hybrid_gguf,
    read_hf: read_hybrid_hf,
};

/// The router renormalizes unless told not to: `Qwen3NextConfig` and the Qwen3.5-MoE router
/// (transformers `Qwen3VLMoeTextTopKRouter`) do, as llama.cpp's qwen3next and qwen35moe graphs do.
const NORMALIZE: bool = true;

/// `Qwen3NextConfig`'s `partial_rotary_factor` default (which `Qwen3_5MoeTextConfig` inherits);
/// llama.cpp's converter writes the rotated width itself.
const ROTARY_FACTOR: f64 = 0.25;

pub(super) fn read_hybrid_gguf(g: &Gguf) -> Result<ModelSpec> {
    let mut s = g.base()?;
    s.attention.rope_scaling = g.yarn()?;
    s.attention.output_gate = true;
    s.delta_net = Some(delta_net::from_gguf(g.g, g.arch, s.layers)?);
    // The converter adds 1 to the RMSNorm weights (conversion/qwen.py), so they are stored as
    // the multiplier itself: `zero_centered_norms` stays false.
    s.moe = g.moe_keys()?.map(|k| {
        let routing = Routing::SoftmaxTopK { top_k: k.top_k, normalize: k.normalize.unwrap_or(NORMALIZE) };
        k.spec(routing, k.shared_ffn, Activation::SwiGlu)
    });
    Ok(s)
}

pub(super) fn read_hybrid_hf(h: &Hf) -> Result<ModelSpec> {
    let mut s = h.base()?;
    s.attention.rope_scaling = h.yarn()?;
    s.attention.rope_dim = rope_dim_from_hf(h, s.attention.head_dim, ROTARY_FACTOR)?;
    s.attention.output_gate = true;
    s.delta_net = Some(delta_net::from_hf(h.c, &h.path, s.layers)?);
    // transformers' `Qwen3NextRMSNorm` multiplies by (1 + w).
    s.zero_centered_norms = true;
    s.moe = h.moe_keys()?.map(|k| {
        let routing = Routing::SoftmaxTopK { top_k: k.top_k, normalize: k.normalize.unwrap_or(NORMALIZE) };
        k.spec(routing, k.shared_ffn, Activation::SwiGlu)
    });
    Ok(s)
}
