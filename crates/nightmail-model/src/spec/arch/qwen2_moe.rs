//! Qwen2-MoE (transformers `Qwen2MoeForCausalLM`, llama.cpp `qwen2moe`): softmax routing and a
//! shared expert behind its own sigmoid gate. Qwen3-MoE reads the same way (qwen3_moe.rs).

use super::Row;
use super::moe::MoeKeys;
use super::source::{Gguf, Hf};
use crate::error::Result;
use crate::spec::{Activation, Architecture, ModelSpec, MoeSpec, Routing};

pub(super) const ROW: Row = Row {
    architecture: Architecture::Qwen2Moe,
    gguf: &["qwen2moe"],
    gguf_experts: None,
    gguf_mtp_in_blocks: false,
    hf: &["qwen2_moe"],
    hf_classes: &[],
    read_gguf: read_qwen_moe_gguf::<NORMALIZE>,
    read_hf: read_qwen_moe_hf::<NORMALIZE>,
};

/// `norm_topk_prob` defaults to false (transformers `Qwen2MoeConfig`; llama.cpp's qwen2moe graph
/// passes `norm_w = false`).
const NORMALIZE: bool = false;

/// Softmax over the experts, the top k renormalized as the file says, else when `NORMALIZE`; the
/// shared expert as wide as `shared_expert_intermediate_size`.
fn moe<const NORMALIZE: bool>(k: MoeKeys) -> MoeSpec {
    let routing = Routing::SoftmaxTopK { top_k: k.top_k, normalize: k.normalize.unwrap_or(NORMALIZE) };
    k.spec(routing, k.shared_ffn, Activation::SwiGlu)
}

pub(super) fn read_qwen_moe_gguf<const NORMALIZE: bool>(g: &Gguf) -> Result<ModelSpec> {
    let mut s = g.base()?;
    s.attention.rope_scaling = g.yarn()?;
    s.moe = g.moe_keys()?.map(moe::<NORMALIZE>);
    Ok(s)
}

pub(super) fn read_qwen_moe_hf<const NORMALIZE: bool>(h: &Hf) -> Result<ModelSpec> {
    let mut s = h.base()?;
    s.attention.rope_scaling = h.yarn()?;
    // The window only with `use_sliding_window`, and only from `max_window_layers` on
    // (transformers' `layer_types` for Qwen2-MoE and Qwen3-MoE).
    let window = h.uint("sliding_window").filter(|w| *w > 0);
    let on = h.boolean("use_sliding_window").unwrap_or(false);
    let from = h.uint("max_window_layers").unwrap_or(0);
    s.attention.sliding_window = (0..s.layers).map(|l| window.filter(|_| on && l >= from)).collect();
    s.moe = h.moe_keys()?.map(moe::<NORMALIZE>);
    Ok(s)
}
