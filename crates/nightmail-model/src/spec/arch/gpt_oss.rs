//! OpenAI's gpt-oss (transformers `GptOssForCausalLM`, llama.cpp `gpt-oss`): attention sinks,
//! alternating sliding and full layers, top-k-then-softmax routing, the clamped SwiGLU.

use super::Row;
use super::source::{Gguf, Hf};
use crate::error::Result;
use crate::spec::{Activation, Architecture, ModelSpec, Routing};

pub(super) const ROW: Row = Row {
    architecture: Architecture::GptOss,
    gguf: &["gpt-oss"],
    gguf_experts: None,
    gguf_mtp_in_blocks: false,
    hf: &["gpt_oss"],
    hf_classes: &[],
    read_gguf,
    read_hf,
};

/// transformers' `swiglu_alpha` and `swiglu_limit` defaults, which llama.cpp builds into its
/// graph (its converter writes neither).
const ALPHA: f32 = 1.702;
const LIMIT: f32 = 7.0;

fn read_gguf(g: &Gguf) -> Result<ModelSpec> {
    let mut s = g.base()?;
    s.attention.rope_scaling = g.yarn()?;
    s.attention.sinks = true;
    // GGUF has no per-layer list: llama.cpp's `set_swa_pattern(2)` for gpt-oss makes the even
    // layers sliding and the odd ones full, as transformers' default `layer_types`.
    let window = g.uint("attention.sliding_window").filter(|w| *w > 0);
    s.attention.sliding_window = (0..s.layers).map(|l| window.filter(|_| l % 2 == 0)).collect();
    let limit = g.float("swiglu_limit").map_or(LIMIT, |v| v as f32);
    let activation = Activation::ClampedSwiGlu { alpha: ALPHA, limit };
    s.moe = g.moe_keys()?.map(|k| k.spec(Routing::TopKSoftmax { top_k: k.top_k }, k.shared_ffn, activation));
    Ok(s)
}

fn read_hf(h: &Hf) -> Result<ModelSpec> {
    let mut s = h.base()?;
    s.attention.rope_scaling = h.yarn()?;
    s.attention.sinks = true;
    // `layer_types` names each layer's kind; transformers' default alternates, sliding first.
    let window = h.uint("sliding_window").filter(|w| *w > 0);
    let types = h.get("layer_types");
    s.attention.sliding_window = (0..s.layers)
        .map(|l| {
            let kind = types.and_then(|t| t.get(l)).and_then(serde_json::Value::as_str);
            window.filter(|_| kind.map_or(l % 2 == 0, |k| k == "sliding_attention"))
        })
        .collect();
    let activation = Activation::ClampedSwiGlu {
        alpha: h.float("swiglu_alpha").map_or(ALPHA, |v| v as f32),
        limit: h.float("swiglu_limit").map_or(LIMIT, |v| v as f32),
    };
    s.moe = h.moe_keys()?.map(|k| k.spec(Routing::TopKSoftmax { top_k: k.top_k }, k.shared_ffn, activation));
    Ok(s)
}
