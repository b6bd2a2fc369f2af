//! Qwen3-MoE (transformers `Qwen3MoeForCausalLM`, llama.cpp `qwen3moe`): Qwen2-MoE's reading
//! (qwen2_moe.rs) with per-head q/k norms (read from the tensors), no shared expert, and its own
//! renormalization default.

use super::Row;
use super::qwen2_moe::{read_qwen_moe_gguf, read_qwen_moe_hf};
use crate::spec::Architecture;

pub(super) const ROW: Row = Row {
    architecture: Architecture::Qwen3Moe,
    gguf: &["qwen3moe"],
    gguf_experts: None,
    gguf_mtp_in_blocks: false,
    hf: &["qwen3_moe"],
    hf_classes: &[],
    read_gguf: read_qwen_moe_gguf::<NORMALIZE>,
    read_hf: read_qwen_moe_hf::<NORMALIZE>,
};

/// The chosen experts' weights are renormalized unless the file says otherwise: every released
/// Qwen3-MoE config.json sets `norm_topk_prob: true` and llama.cpp's qwen3moe graph always
/// renormalizes (`norm_w = true`); only transformers' `Qwen3MoeConfig` class defaults to false.
const NORMALIZE: bool = true;
