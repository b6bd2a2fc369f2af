//! Llama (transformers `LlamaForCausalLM`, llama.cpp `llama` without experts).

use super::Row;
use super::source::{Gguf, Hf};
use crate::error::Result;
use crate::spec::{Architecture, ModelSpec, RopeStyle};

pub(super) const ROW: Row = Row {
    architecture: Architecture::Llama,
    gguf: &["llama"],
    gguf_experts: Some(false),
    gguf_mtp_in_blocks: false,
    hf: &["llama"],
    hf_classes: &[],
    read_gguf,
    read_hf,
};

fn read_gguf(g: &Gguf) -> Result<ModelSpec> {
    let mut s = g.base()?;
    // llama.cpp's converter permutes the q/k rows so that its NORM rope rotates adjacent pairs
    // (convert_hf_to_gguf.py `LlamaModel.permute`): the same model, another layout.
    s.attention.rope_style = RopeStyle::Interleaved;
    s.attention.rope_scaling = g.yarn()?;
    Ok(s)
}

fn read_hf(h: &Hf) -> Result<ModelSpec> {
    let mut s = h.base()?;
    s.attention.rope_scaling = h.yarn()?;
    Ok(s)
}
