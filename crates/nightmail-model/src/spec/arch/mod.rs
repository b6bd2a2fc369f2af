//! One file per architecture, each with its GGUF and Hugging Face readers side by side over the
//! shared readers of `source.rs` (the keys every architecture reads the same way), `moe.rs` (the
//! router keys, applied with each architecture's own defaults once for both formats) and
//! `rope.rs` (YaRN and partial rotary). `ROWS` names every architecture once: llama.cpp's
//! `general.architecture`, transformers' `model_type`, and its readers.

use crate::error::ModelError;
use nightmail_formats::FormatError;
use serde_json::Value as Json;

use super::{Architecture, ModelSpec};
use crate::error::Result;
use nightmail_formats::{GgufFile, HfDir};

pub(super) mod deepseek_v3;
pub(super) mod deepseek_v32;
pub(super) mod deepseek_v4;
mod glm4_moe;
mod glm_moe_dsa;
mod gpt_oss;
pub(super) mod kimi_k3;
pub(super) mod kimi_linear;
mod llama;
mod minimax_m2;
mod mixtral;
mod moe;
mod qwen2_moe;
mod qwen3_5_moe;
mod qwen3_moe;
mod qwen3_next;
pub(super) mod rope;
mod source;

use source::{Gguf, Hf};

/// One architecture's names and readers.
struct Row {
    architecture: Architecture,
    /// llama.cpp's `general.architecture` names (src/llama-arch.cpp).
    gguf: &'static [&'static str],
    /// Where a GGUF name serves two architectures: whether this one is the one with experts.
    gguf_experts: Option<bool>,
    /// llama.cpp's converter counts the multi-token-prediction blocks in `block_count` and says
    /// how many in `nextn_predict_layers`; the graph runs the others only.
    gguf_mtp_in_blocks: bool,
    /// transformers' `model_type` names (the checkpoint's own, not its `text_config`'s).
    hf: &'static [&'static str],
    /// `architectures` classes taken as this one when `model_type` is none of the above.
    hf_classes: &'static [&'static str],
    read_gguf: fn(&Gguf) -> Result<ModelSpec>,
    read_hf: fn(&Hf) -> Result<ModelSpec>,
}

const ROWS: [Row; 15] = [
    llama::ROW,
    mixtral::ROW,
    qwen2_moe::ROW,
    qwen3_moe::ROW,
    gpt_oss::ROW,
    deepseek_v3::ROW,
    kimi_linear::ROW,
    kimi_k3::ROW,
    qwen3_next::ROW,
    qwen3_5_moe::ROW,
    glm4_moe::ROW,
    minimax_m2::ROW,
    deepseek_v4::ROW,
    deepseek_v32::ROW,
    glm_moe_dsa::ROW,
];

fn row(architecture: Architecture) -> &'static Row {
    ROWS.iter().find(|r| r.architecture == architecture).expect("every architecture has a row")
}

/// Multi-head latent attention: DeepSeek-V3 and the models built on its attention.
fn is_latent(architecture: Architecture) -> bool {
    matches!(
        architecture,
        Architecture::DeepseekV3
            | Architecture::DeepseekV32
            | Architecture::GlmMoeDsa
            | Architecture::KimiLinear
            | Architecture::KimiK3
    )
}

pub(super) fn from_gguf(g: &GgufFile) -> Result<ModelSpec> {
    let name = g.string("general.architecture").ok_or_else(|| missing("general.architecture"))?;
    let experts = g.uint(&format!("{name}.expert_count")).unwrap_or(0) > 0;
    let row = ROWS
        .iter()
        .find(|r| r.gguf.contains(&name) && r.gguf_experts.is_none_or(|e| e == experts))
        .ok_or_else(|| ModelError::UnsupportedArchitecture(name.to_string()))?;
    (row.read_gguf)(&Gguf::new(g, name, row.architecture))
}

pub(super) fn from_hf(h: &HfDir) -> Result<ModelSpec> {
    // The checkpoint's own model_type names the architecture (K3's text_config says `kimi_k3_text`).
    let model_type = h.config().get("model_type").and_then(Json::as_str).unwrap_or_default();
    let classes = h.text_config().get("architectures").and_then(Json::as_array);
    let declares = |class: &str| classes.is_some_and(|a| a.iter().any(|x| x.as_str() == Some(class)));
    let row = ROWS
        .iter()
        .find(|r| r.hf.contains(&model_type))
        .or_else(|| ROWS.iter().find(|r| r.hf_classes.iter().any(|c| declares(c))))
        .ok_or_else(|| ModelError::UnsupportedArchitecture(model_type.to_string()))?;
    (row.read_hf)(&Hf::new(h, model_type, row.architecture))
}

fn missing(key: &str) -> ModelError {
    ModelError::from(FormatError::MissingMetadata { key: key.to_string() })
}

#[cfg(test)]
pub(super) mod tests;
