//! DeepSeek-V3 and Kimi K2 (transformers `DeepseekV3ForCausalLM`, model_type `deepseek_v3` or
//! `kimi_k2`; llama.cpp `deepseek2`): multi-head latent attention and grouped sigmoid routing.
//! The latent attention readers here serve the Kimi models too.

use super::Row;
use super::moe::{Scoring, SigmoidDefaults};
use super::source::{Gguf, Hf};
use crate::error::Result;
use crate::spec::{Activation, Architecture, MlaSpec, ModelSpec, RopeStyle};
use nightmail_formats::FormatError;

pub(super) const ROW: Row = Row {
    architecture: Architecture::DeepseekV3,
    gguf: &["deepseek2"],
    gguf_experts: None,
    // DeepSeek-V3 with its MTP layer kept (llama.cpp's DeepseekV2Model drops it,
    // DeepseekV32Model keeps it so).
    gguf_mtp_in_blocks: true,
    // Kimi K2 ships config.json with model_type `kimi_k2` and the DeepSeek-V3 layout; any other
    // name that declares DeepSeek-V3's class is taken as it.
    hf: &["deepseek_v3", "kimi_k2"],
    hf_classes: &["DeepseekV3ForCausalLM"],
    read_gguf,
    read_hf,
};

/// transformers' `DeepseekV3Config`: no renormalization, scale 1, one shared expert.
const ROUTER: SigmoidDefaults = SigmoidDefaults { normalize: false, scale: 1.0, shared_experts: 1 };

fn read_gguf(g: &Gguf) -> Result<ModelSpec> {
    // A deepseek2 file without `expert_gating_func` is DeepSeek-V2's (llama.cpp's loader takes
    // softmax then), which is refused.
    read_latent_gguf(g, ROUTER, Scoring::Softmax)
}

fn read_hf(h: &Hf) -> Result<ModelSpec> {
    read_latent_hf(h, ROUTER)
}

/// DeepSeek-V3's layers from a GGUF (DeepSeek-V3.2 and GLM-5 build on them): latent attention,
/// YaRN, and the sigmoid router with `router` where the file is silent and `scoring` where it
/// names no gating function.
pub(super) fn read_latent_gguf(g: &Gguf, router: SigmoidDefaults, scoring: Scoring) -> Result<ModelSpec> {
    let mut s = g.base()?;
    set_latent_gguf(g, &mut s, MlaSpec { nope: false, output_gate: false, ..mla_from_gguf(g)? });
    s.attention.rope_scaling = g.yarn()?;
    s.moe = g.moe_keys()?.map(|k| k.sigmoid_moe(router, scoring, Activation::SwiGlu)).transpose()?;
    Ok(s)
}

/// DeepSeek-V3's layers from config.json, as `read_latent_gguf`.
pub(super) fn read_latent_hf(h: &Hf, router: SigmoidDefaults) -> Result<ModelSpec> {
    let mut s = h.base()?;
    set_latent_hf(h, &mut s, mla_from_hf(h, false, false)?);
    s.attention.rope_scaling = h.yarn()?;
    s.moe = h.moe_keys()?.map(|k| k.sigmoid_moe(router, Scoring::Sigmoid, Activation::SwiGlu)).transpose()?;
    Ok(s)
}

/// Latent attention's shape: the query/key width is nope + rope, and the one latent all heads
/// read is the only key/value head. DeepSeek's weights rotate adjacent pairs and llama.cpp's
/// converter leaves them so (its NORM rope type).
pub(super) fn set_latent_gguf(_: &Gguf, s: &mut ModelSpec, mla: MlaSpec) {
    set_latent(s, mla, RopeStyle::Interleaved);
}

/// As `set_latent_gguf`; transformers' `rope_interleave` (true unless told) says how pairs rotate.
pub(super) fn set_latent_hf(h: &Hf, s: &mut ModelSpec, mla: MlaSpec) {
    let style =
        if h.boolean("rope_interleave").unwrap_or(true) { RopeStyle::Interleaved } else { RopeStyle::HalfSplit };
    set_latent(s, mla, style);
}

fn set_latent(s: &mut ModelSpec, mla: MlaSpec, style: RopeStyle) {
    let a = &mut s.attention;
    a.head_dim = mla.qk_nope_head_dim + mla.qk_rope_head_dim;
    a.rope_dim = a.head_dim;
    a.kv_heads = 1;
    a.rope_style = style;
    a.mla = Some(mla);
}

/// MLA's widths from config.json.
pub(super) fn mla_from_hf(h: &Hf, nope: bool, output_gate: bool) -> Result<MlaSpec> {
    Ok(MlaSpec {
        q_lora_rank: h.uint("q_lora_rank"),
        kv_lora_rank: h.need("kv_lora_rank")?,
        qk_nope_head_dim: h.need("qk_nope_head_dim")?,
        qk_rope_head_dim: h.need("qk_rope_head_dim")?,
        v_head_dim: h.need("v_head_dim")?,
        nope,
        output_gate,
    })
}

/// MLA's widths as llama.cpp's converter writes them: since it stores MLA as MQA over the latent,
/// `key_length`/`value_length` are the latent's and the per-head widths are the `_mla` keys;
/// older files have no `_mla` keys and the per-head widths in `key_length`/`value_length`.
pub(super) fn mla_from_gguf(g: &Gguf) -> Result<MlaSpec> {
    let need = |k: &str| g.uint(k).ok_or_else(|| super::missing(&g.key(k)));
    let rope = need("rope.dimension_count")?;
    let (k_len, v_len) = match (g.uint("attention.key_length_mla"), g.uint("attention.value_length_mla")) {
        (Some(k), Some(v)) => (k, v),
        _ => (need("attention.key_length")?, need("attention.value_length")?),
    };
    if k_len <= rope {
        return Err(FormatError::MissingMetadata {
            key: format!("{} (larger than the rope dimensions)", g.key("attention.key_length_mla")),
        }
        .into());
    }
    Ok(MlaSpec {
        q_lora_rank: g.uint("attention.q_lora_rank").filter(|r| *r > 0),
        kv_lora_rank: need("attention.kv_lora_rank")?,
        qk_nope_head_dim: k_len - rope,
        qk_rope_head_dim: rope,
        v_head_dim: v_len,
        nope: false,
        output_gate: false,
    })
}
