//! `model inspect`: what a model file holds, without building the network.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Serialize;

use nightmail_engine::stream::{MemoryBudget, MemoryPlan, ModelSizes};
use nightmail_engine::{Result, TemplateSource, chat_template_of};
use nightmail_formats::{Format, ModelFile, is_expert_tensor, is_mtp_tensor};
use nightmail_model::spec::ModelSpec;

#[derive(Debug, Clone, Default, Serialize)]
pub struct DtypeUse {
    pub tensors: usize,
    pub bytes: u64,
}

/// How many layers of each kind: how they mix tokens, and what their feed-forward is.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct LayerKinds {
    /// Grouped-query attention (a key/value cache that grows with the context).
    pub attention: usize,
    /// Latent attention (MLA: one compressed latent per token).
    pub latent_attention: usize,
    /// Linear attention, KDA or Gated DeltaNet (a fixed-size recurrent state).
    pub linear_attention: usize,
    pub dense_ffn: usize,
    pub moe: usize,
}

impl LayerKinds {
    fn of(spec: &ModelSpec) -> Self {
        let mut k = LayerKinds::default();
        for l in 0..spec.layers {
            match (spec.is_recurrent(l), spec.attention.mla.is_some()) {
                (true, _) => k.linear_attention += 1,
                (false, true) => k.latent_attention += 1,
                (false, false) => k.attention += 1,
            }
            if spec.moe_layers[l] { k.moe += 1 } else { k.dense_ffn += 1 }
        }
        k
    }
}

/// The multi-token-prediction layers' tensors (`nightmail-model/src/mtp.rs`), counted apart from the model's.
#[derive(Debug, Clone, Default, Serialize)]
pub struct MtpTensors {
    pub tensors: usize,
    pub parameters: u64,
    pub bytes: u64,
    /// Their routed experts' share of `bytes`.
    pub expert_bytes: u64,
    /// Tensors and bytes per element type.
    pub dtypes: BTreeMap<String, DtypeUse>,
}

/// What a memory budget holds of the model (the split `model plan` and `--memory-mb` use).
#[derive(Debug, Clone, Serialize)]
pub struct RamFit {
    pub plan: MemoryPlan,
    /// Expected share of a token's routed experts found in the cache (uniform routing).
    pub expert_hit_rate: f64,
    /// Bytes read from disk per token at batch 1: streamed layers and missed experts.
    pub disk_bytes_per_token: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct ModelInfo {
    pub path: PathBuf,
    pub format: Format,
    pub spec: ModelSpec,
    pub layer_kinds: LayerKinds,
    /// Routed experts over all MoE layers.
    pub experts: usize,
    /// The model proper's: the MTP layers' are in `mtp`.
    pub parameters: u64,
    /// Tensors and bytes per element type (the model proper's).
    pub dtypes: BTreeMap<String, DtypeUse>,
    /// Everything but routed experts: read for every token.
    pub dense_bytes: u64,
    pub expert_bytes: u64,
    /// The multi-token-prediction layers past the last layer, where the file holds any: read
    /// only to draft with them (`draft = "mtp"`).
    pub mtp: Option<MtpTensors>,
    /// Routed-expert bytes one token reads: top-k experts in each MoE layer.
    pub expert_bytes_per_token: u64,
    pub has_tokenizer: bool,
    /// The file's own template, the family's built in, or none.
    pub chat_template: Option<TemplateSource>,
    /// What the budget given to [`inspect_with_memory`] holds.
    pub ram: Option<RamFit>,
}

pub fn inspect(path: &Path) -> Result<ModelInfo> {
    inspect_with_memory(path, None)
}

/// [`inspect`], and what `budget` holds of the model where one is given.
pub fn inspect_with_memory(path: &Path, budget: Option<MemoryBudget>) -> Result<ModelInfo> {
    let ck = ModelFile::open(path)?;
    let spec = ModelSpec::read(&ck)?;
    let (mut dense, mut experts, mut parameters) = (0u64, 0u64, 0u64);
    let mut dtypes: BTreeMap<String, DtypeUse> = BTreeMap::new();
    let mut mtp: Option<MtpTensors> = None;
    for t in ck.all_tensors()? {
        // By the type's size, not the view's bytes: a Hugging Face MXFP4 pair is viewed through
        // its blocks, and its scales count too.
        let bytes = t.dtype.byte_len(t.elem_count()) as u64;
        if is_mtp_tensor(&t.name, spec.layers) {
            let m = mtp.get_or_insert_default();
            m.tensors += 1;
            m.parameters += t.elem_count() as u64;
            m.bytes += bytes;
            if is_expert_tensor(&t.name) {
                m.expert_bytes += bytes;
            }
            let u = m.dtypes.entry(format!("{:?}", t.dtype)).or_default();
            u.tensors += 1;
            u.bytes += bytes;
            continue;
        }
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
    let has_tokenizer = match &ck {
        ModelFile::Gguf(g) => g.string("tokenizer.ggml.model").is_some(),
        ModelFile::Hf(h) => nightmail_formats::TextTokenizer::in_hf_dir(h.dir()),
    };
    let chat_template = chat_template_of(&ck, &spec).map(|(_, source)| source);
    let ram = match budget {
        Some(budget) => {
            let plan = MemoryPlan::new(ModelSizes::read(&ck, &spec)?, budget)?;
            Some(RamFit {
                expert_hit_rate: plan.expert_hit_rate(),
                disk_bytes_per_token: plan.disk_bytes_per_step(1),
                plan,
            })
        }
        None => None,
    };
    let moe_layers = spec.moe_layers.iter().filter(|m| **m).count();
    Ok(ModelInfo {
        path: path.to_path_buf(),
        format: ck.format(),
        layer_kinds: LayerKinds::of(&spec),
        experts: spec.moe.as_ref().map_or(0, |m| m.experts * moe_layers),
        spec,
        parameters,
        dtypes,
        dense_bytes: dense,
        expert_bytes: experts,
        mtp,
        expert_bytes_per_token: per_token,
        has_tokenizer,
        chat_template,
        ram,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use nightmail_model::spec::Architecture;

    #[test]
    fn a_k3_directory_states_its_layers_by_kind_its_weights_and_what_a_budget_holds() {
        let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/kimi_k3");
        let info = inspect_with_memory(&dir, Some(MemoryBudget::mb(64))).unwrap();
        assert_eq!(info.spec.architecture, Architecture::KimiK3);
        let kinds = LayerKinds { attention: 0, latent_attention: 2, linear_attention: 4, dense_ffn: 1, moe: 5 };
        assert_eq!((info.layer_kinds, info.experts), (kinds, 40));
        // Routed experts: 5 layers × 8 × three 8×16 F32 matrices; a token reads its top 2 of 8.
        assert_eq!(info.expert_bytes, 5 * 8 * 3 * 8 * 16 * 4);
        assert_eq!(info.expert_bytes_per_token, info.expert_bytes / 4);
        assert_eq!(info.dense_bytes + info.expert_bytes, info.dtypes["F32"].bytes);
        // 64 MiB holds the whole tiny model: nothing is read per token.
        let ram = info.ram.expect("a budget was given");
        assert!(ram.plan.experts_resident && ram.plan.streamed_layers.is_empty(), "{:?}", ram.plan);
        assert_eq!((ram.expert_hit_rate, ram.disk_bytes_per_token), (1.0, 0.0));
    }

    #[test]
    fn gpt_oss_mxfp4_pairs_count_as_mxfp4_expert_weights_with_their_scales() {
        let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/gpt_oss_mxfp4");
        let info = inspect(&dir).unwrap();
        assert_eq!(info.spec.architecture, Architecture::GptOss);
        let mxfp4 = &info.dtypes["MXFP4"];
        // Two layers' gate_up [4, 128, 64] and down [4, 64, 64] pairs, 17 bytes per 32 weights.
        assert_eq!(mxfp4.tensors, 4);
        assert_eq!(mxfp4.bytes, 2 * 4 * (128 * 64 + 64 * 64) / 32 * 17);
        // The experts' F32 biases are expert weights too.
        assert_eq!(info.expert_bytes, mxfp4.bytes + 2 * 4 * (128 + 64) * 4);
    }

    #[test]
    fn inspect_counts_the_weights_and_passes_over_the_hash_table() {
        // The I64 `tid2eid` is an index table, not a weight: inspecting the directory reads it
        // as the model does, not as a weight of a type it cannot compute with.
        let hf = crate::inspect::inspect(&deepseek_v4()).unwrap();
        let gg = crate::inspect::inspect(&deepseek_v4().join("model.gguf")).unwrap();
        assert_eq!((hf.experts, hf.expert_bytes), (gg.experts, gg.expert_bytes));
        assert!(hf.dense_bytes > 0 && hf.expert_bytes > 0);
    }

    fn deepseek_v4() -> std::path::PathBuf {
        std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/deepseek_v4")
    }
}
