//! DeepSeek-V3.2 (transformers `DeepseekV32ForCausalLM`, model_type `deepseek_v32`; llama.cpp
//! `deepseek32`): DeepSeek-V3's layers with DeepSeek Sparse Attention, a lightning indexer per
//! layer that keeps the `index_topk` best keys for each query (parts/dsa.rs). The indexer keys
//! read here serve GLM-5 too.

use candle_core::quantized::gguf_file::Value;
use serde::Serialize;

use super::Row;
use super::deepseek_v3::{read_latent_gguf, read_latent_hf};
use super::moe::{Scoring, SigmoidDefaults};
use super::source::{Gguf, Hf};
use crate::error::Result;
use crate::spec::{Architecture, ModelSpec, RopeStyle};
use nightmail_formats::FormatError;

pub(super) const ROW: Row = Row {
    architecture: Architecture::DeepseekV32,
    gguf: &["deepseek32"],
    gguf_experts: None,
    // conversion/deepseek.py DeepseekV32Model keeps the MTP block, counted in block_count.
    gguf_mtp_in_blocks: true,
    hf: &["deepseek_v32"],
    hf_classes: &["DeepseekV32ForCausalLM"],
    read_gguf,
    read_hf,
};

/// `DeepseekV32Config`'s router (from `Glm4MoeLiteConfig`): renormalized, one shared expert.
const ROUTER: SigmoidDefaults = SigmoidDefaults { normalize: true, scale: 2.5, shared_experts: 1 };

/// DeepSeek Sparse Attention's lightning indexer (transformers `DeepseekV32Indexer`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DsaSpec {
    /// `index_n_heads`: query heads, each weighted per token by `weights_proj`.
    pub heads: usize,
    /// `index_head_dim`: the width of each query head and of the one key per token.
    pub head_dim: usize,
    /// `index_topk`: keys each query attends.
    pub top_k: usize,
    /// The rotation of the indexer's first `qk_rope_head_dim` channels: DeepSeek-V3.2 rotates
    /// halves, GLM-5 adjacent pairs (`GlmMoeDsaIndexer`), whatever MLA itself does.
    pub rope_style: RopeStyle,
    /// Per layer: whether it runs its own indexer, or reuses the choice of the last layer that did
    /// (GLM-5.2's `indexer_types` "shared", arXiv 2603.12201; llama.cpp `attention.indexer.types`).
    pub full: Vec<bool>,
}

impl DsaSpec {
    /// Whether layer `l` runs its own indexer (a layer past the list, the MTP layer, does).
    pub fn is_full(&self, l: usize) -> bool {
        self.full.get(l).copied().unwrap_or(true)
    }
}

fn read_gguf(g: &Gguf) -> Result<ModelSpec> {
    read_dsa_gguf(g, ROUTER, RopeStyle::HalfSplit)
}

fn read_hf(h: &Hf) -> Result<ModelSpec> {
    read_dsa_hf(h, ROUTER, RopeStyle::HalfSplit)
}

/// A DSA model's spec from its GGUF: DeepSeek-V3's latent attention and sigmoid router, and the
/// indexer's `attention.indexer.*` keys (conversion/deepseek.py `DeepseekV32Model`).
pub(super) fn read_dsa_gguf(g: &Gguf, router: SigmoidDefaults, style: RopeStyle) -> Result<ModelSpec> {
    let mut s = read_latent_gguf(g, router, Scoring::Sigmoid)?;
    let need = |k: &str| g.uint(k).ok_or_else(|| super::missing(&g.key(k)));
    // conversion/glm.py writes `indexer_types` as one bool per layer, true for "full".
    let key = g.key("attention.indexer.types");
    let full = match g.g.value(&key) {
        None => vec![true; s.layers],
        Some(Value::Array(types)) => types
            .iter()
            .map(|t| if let Value::Bool(b) = t { Ok(*b) } else { Err(not_types(&key)) })
            .collect::<Result<_>>()?,
        Some(_) => return Err(not_types(&key)),
    };
    let dsa = DsaSpec {
        heads: need("attention.indexer.head_count")?,
        head_dim: need("attention.indexer.key_length")?,
        top_k: need("attention.indexer.top_k")?,
        rope_style: style,
        full,
    };
    s.sparse_attention = Some(checked(dsa, &s, &g.key("attention.indexer.key_length"))?);
    Ok(s)
}

/// A DSA model's spec from its config.json (`index_n_heads`, `index_head_dim`, `index_topk`).
pub(super) fn read_dsa_hf(h: &Hf, router: SigmoidDefaults, style: RopeStyle) -> Result<ModelSpec> {
    let mut s = read_latent_hf(h, router)?;
    // `GlmMoeDsaConfig.indexer_types`, as saved (transformers derives it from the pattern keys).
    let full = match h.get("indexer_types") {
        None => vec![true; s.layers],
        Some(types) => types
            .as_array()
            .and_then(|t| {
                t.iter().map(|t| t.as_str().filter(|t| *t == "full" || *t == "shared")).collect::<Option<Vec<_>>>()
            })
            .ok_or_else(|| not_types("indexer_types"))?
            .into_iter()
            .map(|t| t == "full")
            .collect(),
    };
    let dsa = DsaSpec {
        heads: h.need("index_n_heads")?,
        head_dim: h.need("index_head_dim")?,
        top_k: h.need("index_topk")?,
        rope_style: style,
        full,
    };
    s.sparse_attention = Some(checked(dsa, &s, "index_head_dim")?);
    Ok(s)
}

/// The indexer rotates the first `qk_rope_head_dim` channels of each head, and needs the query
/// latent it projects from.
fn checked(dsa: DsaSpec, s: &ModelSpec, key: &str) -> Result<DsaSpec> {
    let mla = s.attention.mla.as_ref().expect("a DSA model has latent attention");
    let bad = |reason: String| FormatError::BadMetadata { key: key.into(), reason }.into();
    if dsa.head_dim < mla.qk_rope_head_dim || dsa.heads == 0 || dsa.top_k == 0 {
        return Err(bad(format!(
            "as {} ({} heads keeping {}), narrower than the {} rotated channels or empty",
            dsa.head_dim, dsa.heads, dsa.top_k, mla.qk_rope_head_dim
        )));
    }
    if mla.q_lora_rank.is_none() {
        return Err(bad("with no q_lora_rank: the indexer's queries come from the query latent".into()));
    }
    if dsa.full.len() != s.layers || dsa.full.first() == Some(&false) {
        return Err(not_types(if key == "index_head_dim" { "indexer_types" } else { "attention.indexer.types" }));
    }
    Ok(dsa)
}

fn not_types(key: &str) -> crate::error::ModelError {
    let reason = "not one entry per layer (full or shared), the first full".to_string();
    FormatError::BadMetadata { key: key.into(), reason }.into()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::test_files::{fixture, load_error, renamed};
    use nightmail_formats::ModelFile;

    #[test]
    fn the_indexer_reads_the_same_from_config_json_and_from_its_gguf_keys() {
        for (name, architecture, rope_style) in [
            ("deepseek_v32", Architecture::DeepseekV32, RopeStyle::HalfSplit),
            ("glm_moe_dsa", Architecture::GlmMoeDsa, RopeStyle::Interleaved),
        ] {
            for path in [fixture(name), fixture(name).join("model.gguf")] {
                let s = ModelSpec::read(&ModelFile::open(&path).unwrap()).unwrap();
                // GLM's fixture has a GLM-5.2 layer that reuses the one before's choice.
                let full = if name == "glm_moe_dsa" { vec![true, false, true] } else { vec![true; 3] };
                let want = DsaSpec { heads: 8, head_dim: 16, top_k: 4, rope_style, full };
                assert_eq!((s.architecture, s.sparse_attention), (architecture, Some(want)), "{}", path.display());
                // MLA itself rotates adjacent pairs in both.
                assert_eq!(s.attention.rope_style, RopeStyle::Interleaved, "{}", path.display());
            }
        }
    }

    #[test]
    fn a_first_layer_with_no_choice_to_share_is_refused_naming_the_key() {
        let dir = renamed("glm_moe_dsa", "model.safetensors", "indexer.wq_b", "indexer.wq_b");
        let config = std::fs::read_to_string(dir.path().join("config.json")).unwrap();
        let shared = config.replacen("\"full\"", "\"shared\"", 1);
        assert_ne!(config, shared, "the fixture's config.json lists its indexer types");
        std::fs::write(dir.path().join("config.json"), shared).unwrap();
        let err = load_error(dir.path()).expect("a shared first layer is refused");
        assert!(err.contains("indexer_types") && err.contains("the first full"), "{err}");
    }

    #[test]
    fn a_missing_indexer_tensor_is_named_in_either_format() {
        let dir = renamed("deepseek_v32", "model.gguf", "blk.2.indexer.k_norm.bias", "blk.2.indexer.k_norm.bia_");
        let err = load_error(dir.path().join("model.gguf")).expect("the bias is missing");
        assert!(err.starts_with("tensor `blk.2.indexer.k_norm.bias` is missing"), "{err}");
        let dir = renamed(
            "deepseek_v32",
            "model.safetensors",
            "layers.1.self_attn.indexer.wk.",
            "layers.1.self_attn.indexer.wx.",
        );
        let err = load_error(dir.path()).expect("wk is missing");
        assert!(err.contains("model.layers.1.self_attn.indexer.wk.weight"), "{err}");
    }
}
