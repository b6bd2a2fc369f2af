//! Mixtral (transformers `MixtralForCausalLM`; llama.cpp writes it as `llama` with experts).

use super::Row;
use super::source::{Gguf, Hf};
use crate::error::Result;
use crate::spec::{Activation, Architecture, ModelSpec, RopeStyle, Routing};

pub(super) const ROW: Row = Row {
    architecture: Architecture::Mixtral,
    gguf: &["llama"],
    gguf_experts: Some(true),
    gguf_mtp_in_blocks: false,
    hf: &["mixtral"],
    hf_classes: &[],
    read_gguf,
    read_hf,
};

/// Softmax over all experts, the top k renormalized (arXiv 2401.04088 §2.1; transformers
/// `MixtralSparseMoeBlock`, llama.cpp's llama graph passes `norm_w = true`), in both formats.
fn routing(top_k: usize) -> Routing {
    Routing::SoftmaxTopK { top_k, normalize: true }
}

fn read_gguf(g: &Gguf) -> Result<ModelSpec> {
    let mut s = g.base()?;
    // The converter permutes q/k as for llama (convert_hf_to_gguf.py `LlamaModel.permute`).
    s.attention.rope_style = RopeStyle::Interleaved;
    s.attention.rope_scaling = g.yarn()?;
    s.moe = g.moe_keys()?.map(|k| k.spec(routing(k.top_k), k.shared_ffn, Activation::SwiGlu));
    Ok(s)
}

fn read_hf(h: &Hf) -> Result<ModelSpec> {
    let mut s = h.base()?;
    s.attention.rope_scaling = h.yarn()?;
    // `sliding_window` (null or 0 = none) on every layer (transformers `MistralConfig`).
    let window = h.uint("sliding_window").filter(|w| *w > 0);
    s.attention.sliding_window = vec![window; s.layers];
    s.moe = h.moe_keys()?.map(|k| k.spec(routing(k.top_k), k.shared_ffn, Activation::SwiGlu));
    Ok(s)
}
