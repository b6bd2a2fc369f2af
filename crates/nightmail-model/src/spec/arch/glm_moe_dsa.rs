//! Zhipu's GLM-5, 5.1 and 5.2 (transformers `GlmMoeDsaForCausalLM`, model_type `glm_moe_dsa`;
//! llama.cpp `glm-dsa`): DeepSeek-V3.2's layers, with the indexer rotating adjacent pairs
//! (`GlmMoeDsaIndexer` applies `apply_rotary_pos_emb_interleave`; llama.cpp src/models/glm-dsa.cpp
//! ROPE_TYPE_NORM), and GLM-5.2's layers that reuse the last indexer's choice (`indexer_types`).

use super::Row;
use super::deepseek_v32::{read_dsa_gguf, read_dsa_hf};
use super::moe::SigmoidDefaults;
use super::source::{Gguf, Hf};
use crate::error::Result;
use crate::spec::{Architecture, ModelSpec, RopeStyle};

pub(super) const ROW: Row = Row {
    architecture: Architecture::GlmMoeDsa,
    gguf: &["glm-dsa"],
    gguf_experts: None,
    // conversion/glm.py GlmMoeDsaModel appends the NextN block past num_hidden_layers.
    gguf_mtp_in_blocks: true,
    hf: &["glm_moe_dsa"],
    hf_classes: &["GlmMoeDsaForCausalLM"],
    read_gguf,
    read_hf,
};

/// `GlmMoeDsaConfig`'s router: as DeepSeek-V3.2's.
const ROUTER: SigmoidDefaults = SigmoidDefaults { normalize: true, scale: 2.5, shared_experts: 1 };

fn read_gguf(g: &Gguf) -> Result<ModelSpec> {
    read_dsa_gguf(g, ROUTER, RopeStyle::Interleaved)
}

fn read_hf(h: &Hf) -> Result<ModelSpec> {
    read_dsa_hf(h, ROUTER, RopeStyle::Interleaved)
}
