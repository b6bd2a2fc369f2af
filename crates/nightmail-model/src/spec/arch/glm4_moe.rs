//! Zhipu's GLM-4.5 (transformers `Glm4MoeForCausalLM`, llama.cpp `glm4moe`): grouped-query
//! attention with q/k/v biases, rotary on part of each head and optional per-head q/k norms
//! (read from the tensors); DeepSeek-V3's sigmoid routing and shared expert.

use super::Row;
use super::moe::{Scoring, SigmoidDefaults};
use super::rope::rope_dim_from_hf;
use super::source::{Gguf, Hf};
use crate::error::Result;
use crate::spec::{Activation, Architecture, ModelSpec};

pub(super) const ROW: Row = Row {
    architecture: Architecture::Glm4Moe,
    gguf: &["glm4moe"],
    gguf_experts: None,
    // The NextN/MTP block past the last layer, which llama.cpp's glm4moe graph loads and skips
    // (convert_hf_to_gguf.py `Glm4MoeModel`).
    gguf_mtp_in_blocks: true,
    hf: &["glm4_moe"],
    hf_classes: &[],
    read_gguf,
    read_hf,
};

/// `Glm4MoeConfig`'s router: renormalized, scale 1, one shared expert; sigmoid scoring, the only
/// router either reference has for it (llama.cpp's glm4moe loader defaults to it too).
const ROUTER: SigmoidDefaults = SigmoidDefaults { normalize: true, scale: 1.0, shared_experts: 1 };

/// `Glm4MoeConfig.partial_rotary_factor`'s default; llama.cpp's converter writes the width.
pub(super) const ROTARY_FACTOR: f64 = 0.5;

fn read_gguf(g: &Gguf) -> Result<ModelSpec> {
    let mut s = g.base()?;
    s.attention.rope_scaling = g.yarn()?;
    s.moe = g.moe_keys()?.map(|k| k.sigmoid_moe(ROUTER, Scoring::Sigmoid, Activation::SwiGlu)).transpose()?;
    Ok(s)
}

fn read_hf(h: &Hf) -> Result<ModelSpec> {
    let mut s = h.base()?;
    s.attention.rope_scaling = h.yarn()?;
    s.attention.rope_dim = rope_dim_from_hf(h, s.attention.head_dim, ROTARY_FACTOR)?;
    s.moe = h.moe_keys()?.map(|k| k.sigmoid_moe(ROUTER, Scoring::Sigmoid, Activation::SwiGlu)).transpose()?;
    Ok(s)
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::spec::Routing;
    use crate::spec::arch::rope::rotary_width;
    use crate::spec::arch::tests::check_both;
    use crate::spec::test_files::renamed;

    #[test]
    fn glm4_moe_reads_the_same_from_config_json_and_from_its_gguf_keys() {
        // The GGUF counts a NextN block past the 3 layers, as GLM-4.5's conversions do; the first
        // layer is dense.
        let routing = Routing::GroupedSigmoid { top_k: 2, groups: 1, top_groups: 1, normalize: true, scale: 2.5 };
        check_both("glm4_moe", Architecture::Glm4Moe, routing, Some(32), &[false, true, true]);
    }

    #[test]
    fn a_missing_router_bias_is_named_with_the_file_in_either_format() {
        // MiniMax-M2's bias lives on its MoE block; a router without it would choose otherwise.
        let dir = renamed(
            "minimax_m2",
            "model.safetensors",
            "model.layers.1.block_sparse_moe.e_score_correction_bias",
            "model.layers.1.block_sparse_moe.x_score_correction_bias",
        );
        let err = crate::spec::test_files::load_error(dir.path()).expect("the bias is missing");
        // Named by one of the spellings checkpoints use for it, with llama.cpp's name and the file.
        let named = err.starts_with("tensor `model.layers.1.")
            && err.contains(".e_score_correction_bias` (GGUF `blk.1.exp_probs_b.bias`)");
        assert!(named && err.contains(&format!("is missing from {}", dir.path().display())), "{err}");
        let dir = renamed("glm4_moe", "model.gguf", "blk.2.exp_probs_b.bias", "blk.2.exp_probs_x.bias");
        let path = dir.path().join("model.gguf");
        let err = crate::spec::test_files::load_error(&path).expect("the bias is missing");
        let want = format!("tensor `blk.2.exp_probs_b.bias` is missing from {}", path.display());
        assert!(err.starts_with(&want), "{err}");
    }

    #[test]
    fn half_a_q_k_norm_pair_is_refused_naming_the_missing_one() {
        // GLM-4.5's norms are optional as a pair (`use_qk_norm`); one alone is a broken file.
        let dir = renamed("glm4_moe", "model.gguf", "blk.0.attn_q_norm.weight", "blk.0.attn_q_xorm.weight");
        let path = dir.path().join("model.gguf");
        let err = crate::spec::test_files::load_error(&path).expect("no q norm");
        let want = format!("tensor `blk.0.attn_q_norm.weight` is missing from {}", path.display());
        assert!(err.starts_with(&want), "{err}");
    }

    #[test]
    fn the_rotary_width_comes_from_the_factor_or_rotary_dim_and_must_fit_a_head() {
        let dim = |config: &str, arch| {
            let factor = if arch == Architecture::Glm4Moe { ROTARY_FACTOR } else { 1.0 };
            rotary_width(&serde_json::from_str(config).unwrap(), 128, factor, Path::new("c"))
        };
        assert_eq!(dim(r#"{"rope_parameters": {"partial_rotary_factor": 0.5}}"#, Architecture::Glm4Moe).unwrap(), 64);
        // MiniMax-M2's released config.json.
        assert_eq!(dim(r#"{"rotary_dim": 64}"#, Architecture::MinimaxM2).unwrap(), 64);
        assert_eq!(dim("{}", Architecture::Glm4Moe).unwrap(), 64, "Glm4MoeConfig's default factor");
        assert_eq!(dim("{}", Architecture::MinimaxM2).unwrap(), 128);
        let err = dim(r#"{"rotary_dim": 130}"#, Architecture::MinimaxM2).unwrap_err().to_string();
        assert!(err.contains("rotary_dim") && err.contains("as 130") && err.contains("head of 128"), "{err}");
    }
}
