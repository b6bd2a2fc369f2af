//! `model inspect`: what a model file holds, without building the network.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::error::Result;
use crate::format::{Checkpoint, Format, is_expert_tensor};
use crate::spec::ModelSpec;

#[derive(Debug, Clone, Default, Serialize)]
pub struct DtypeUse {
    pub tensors: usize,
    pub bytes: u64,
}

#[derive(Debug, Clone, Serialize)]
pub struct ModelInfo {
    pub path: PathBuf,
    pub format: Format,
    pub spec: ModelSpec,
    pub parameters: u64,
    /// Tensors and bytes per element type.
    pub dtypes: BTreeMap<String, DtypeUse>,
    /// Everything but routed experts: read for every token.
    pub dense_bytes: u64,
    pub expert_bytes: u64,
    /// Routed-expert bytes one token reads: top-k experts in each MoE layer.
    pub expert_bytes_per_token: u64,
    pub has_tokenizer: bool,
    pub has_chat_template: bool,
}

pub fn inspect(path: &Path) -> Result<ModelInfo> {
    let ck = Checkpoint::open(path)?;
    let spec = ModelSpec::read(&ck)?;
    let (mut dense, mut experts, mut parameters) = (0u64, 0u64, 0u64);
    let mut dtypes: BTreeMap<String, DtypeUse> = BTreeMap::new();
    for t in ck.all_tensors()? {
        let bytes = t.bytes.len() as u64;
        parameters += t.elem_count() as u64;
        let u = dtypes.entry(format!("{:?}", t.dtype)).or_default();
        u.tensors += 1;
        u.bytes += bytes;
        if is_expert_tensor(&t.name) {
            experts += bytes;
        } else {
            dense += bytes;
        }
    }
    let per_token = match &spec.moe {
        Some(m) => experts * m.routing.top_k() as u64 / m.experts as u64,
        None => 0,
    };
    let (has_tokenizer, has_chat_template) = match &ck {
        Checkpoint::Gguf(g) => {
            (g.string("tokenizer.ggml.model").is_some(), g.string("tokenizer.chat_template").is_some())
        }
        Checkpoint::Hf(h) => {
            (crate::TextTokenizer::in_hf_dir(h.dir()), crate::chat::ChatTemplate::from_hf_dir(h.dir()).is_some())
        }
    };
    Ok(ModelInfo {
        path: path.to_path_buf(),
        format: ck.format(),
        spec,
        parameters,
        dtypes,
        dense_bytes: dense,
        expert_bytes: experts,
        expert_bytes_per_token: per_token,
        has_tokenizer,
        has_chat_template,
    })
}
