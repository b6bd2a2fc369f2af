//! Qwen3.5-MoE's text model (transformers `qwen3_5_moe`, or `qwen3_5_moe_text` for
//! `Qwen3_5MoeForCausalLM` alone; llama.cpp `qwen35moe`): Qwen3-Next's layers with the DeltaNet
//! projections stored apart; llama.cpp's converter tiles the value heads (spec/delta_net.rs).
//! Its interleaved MRoPE gives text positions the same angles as NEOX (half-split) rotary.

use super::Row;
use super::qwen3_next::{read_hybrid_gguf, read_hybrid_hf};
use crate::spec::Architecture;

pub(super) const ROW: Row = Row {
    architecture: Architecture::Qwen35Moe,
    gguf: &["qwen35moe"],
    gguf_experts: None,
    // conversion/qwen.py `_Qwen35MtpMixin`.
    gguf_mtp_in_blocks: true,
    hf: &["qwen3_5_moe", "qwen3_5_moe_text"],
    hf_classes: &[],
    read_gguf: read_hybrid_gguf,
    read_hf: read_hybrid_hf,
};
