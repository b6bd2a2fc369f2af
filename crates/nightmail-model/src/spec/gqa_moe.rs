//! What GLM-4.5 (`glm4_moe`, GGUF `glm4moe`) and MiniMax-M2 (`minimax_m2`, GGUF `minimax-m2`)
//! add to the spec: rotary on part of each head, GLM's NextN/MTP block counted in the GGUF block
//! count, and each one's default for renormalizing the chosen experts' weights. The rest (q/k
//! norms per head or across heads, biases, sigmoid routing) is read from the tensors and the keys
//! DeepSeek-V3 already uses.

use nightmail_formats::FormatError;
use std::path::Path;

use serde_json::Value as Json;

use super::Architecture;
use crate::error::Result;
use nightmail_formats::GgufFile;

/// The layers the graph runs: GLM-4.5's converter counts its NextN/MTP block (a draft head past
/// the last layer, which llama.cpp's glm4moe graph loads and skips) in `block_count` and says how
/// many there are in `nextn_predict_layers` (convert_hf_to_gguf.py `Glm4MoeModel`).
pub(crate) fn layers_from_gguf(g: &GgufFile, arch: &str, blocks: usize) -> Result<usize> {
    // GLM-4.5's and Qwen3.5's converters count their multi-token-prediction blocks in block_count
    // (conversion/qwen.py `_Qwen35MtpMixin`); llama.cpp's main pass runs the others only.
    // DeepSeek-V3 with its MTP layer kept the same way (llama.cpp's DeepseekV2Model drops it,
    // DeepseekV32Model keeps it so).
    if !matches!(arch, "glm4moe" | "qwen3next" | "qwen35moe" | "deepseek2") {
        return Ok(blocks);
    }
    let key = format!("{arch}.nextn_predict_layers");
    let nextn = g.uint(&key).unwrap_or(0) as usize;
    if nextn >= blocks {
        let reason = format!("as {nextn}, with {blocks} blocks in all");
        return Err(FormatError::BadMetadata { key, reason }.into());
    }
    Ok(blocks - nextn)
}

/// `expert_weights_norm` where the file has none: llama.cpp's minimax-m2 graph always
/// renormalizes (as `MiniMaxM2TopKRouter` does), its glm4moe loader defaults to not.
pub(crate) fn normalize_from_gguf(architecture: Architecture, given: Option<bool>) -> Option<bool> {
    match architecture {
        Architecture::MinimaxM2 => Some(true),
        Architecture::Glm4Moe => Some(given.unwrap_or(false)),
        _ => given,
    }
}

/// The rotated width per head from `rope.dimension_count` (llama.cpp's `n_rot`, which every
/// arch's converter writes: head_dim · partial_rotary_factor for glm4moe, `rotary_dim` for
/// minimax-m2), head_dim where absent. Latent attention rotates its own `qk_rope_head_dim`.
pub(crate) fn rope_dim_from_gguf(g: &GgufFile, arch: &str, head_dim: usize, latent: bool) -> Result<usize> {
    if latent {
        return Ok(head_dim);
    }
    let key = format!("{arch}.rope.dimension_count");
    let dim = g.uint(&key).map_or(head_dim, |v| v as usize);
    Ok(checked(dim, head_dim).map_err(|reason| FormatError::BadMetadata { key, reason })?)
}

/// The rotated width per head from config.json: transformers 5's
/// `rope_parameters.partial_rotary_factor` (or a top-level one), or MiniMax-M2's released
/// checkpoints' `rotary_dim` (transformers' `MiniMaxM2Config.convert_rope_params_to_dict`);
/// `Glm4MoeConfig` defaults the factor to 0.5, the others rotate whole heads. transformers'
/// default rope computes `int(head_dim · factor)` dimensions.
pub(crate) fn rope_dim_from_hf(c: &Json, architecture: Architecture, head_dim: usize, path: &Path) -> Result<usize> {
    let factor = c
        .get("rope_parameters")
        .and_then(|r| r.get("partial_rotary_factor"))
        .or_else(|| c.get("partial_rotary_factor"))
        .and_then(Json::as_f64);
    let rotary_dim = c.get("rotary_dim").and_then(Json::as_u64).map(|d| d as usize);
    let dim = match (factor, rotary_dim) {
        (Some(f), _) => (head_dim as f64 * f) as usize,
        (None, Some(d)) => d,
        (None, None) if architecture == Architecture::Glm4Moe => head_dim / 2,
        (None, None) => head_dim,
    };
    Ok(checked(dim, head_dim).map_err(|reason| FormatError::BadConfig {
        path: path.to_path_buf(),
        reason: format!("the rotary width (`partial_rotary_factor` or `rotary_dim`) {reason}"),
    })?)
}

/// A rotary width rotates pairs within one head.
fn checked(dim: usize, head_dim: usize) -> std::result::Result<usize, String> {
    if dim == 0 || dim % 2 == 1 || dim > head_dim {
        return Err(format!("as {dim}, which is not an even number of dimensions within a head of {head_dim}"));
    }
    Ok(dim)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::test_files::{fixture, renamed};
    use crate::spec::{ModelSpec, Routing};
    use nightmail_formats::ModelFile;

    /// `name`'s spec from its config.json and from its GGUF, each checked for the grouped-query
    /// attention both fixtures share (4 heads over 2 kv heads of 16, half of each rotated) and
    /// for `routing`, the expert widths and which layers route.
    fn check_both(name: &str, architecture: Architecture, routing: Routing, shared: Option<usize>, moe: &[bool]) {
        for path in [fixture(name), fixture(name).join("model.gguf")] {
            let at = path.display();
            let s = ModelSpec::read(&ModelFile::open(&path).unwrap()).unwrap();
            assert_eq!((s.architecture, s.layers), (architecture, moe.len()), "{at}");
            let a = &s.attention;
            assert_eq!((a.heads, a.kv_heads, a.head_dim, a.rope_dim), (4, 2, 16, 8), "{at}");
            assert_eq!(a.rope_style, crate::spec::RopeStyle::HalfSplit, "{at}");
            let m = s.moe.expect("experts");
            assert_eq!((m.experts, m.routing, m.expert_ffn, m.shared_expert_ffn), (8, routing, 32, shared), "{at}");
            assert_eq!(s.moe_layers, moe, "{at}");
        }
    }

    #[test]
    fn glm4_moe_reads_the_same_from_config_json_and_from_its_gguf_keys() {
        // The GGUF counts a NextN block past the 3 layers, as GLM-4.5's conversions do; the first
        // layer is dense.
        let routing = Routing::GroupedSigmoid { top_k: 2, groups: 1, top_groups: 1, normalize: true, scale: 2.5 };
        check_both("glm4_moe", Architecture::Glm4Moe, routing, Some(32), &[false, true, true]);
    }

    #[test]
    fn minimax_m2_reads_the_same_from_config_json_and_from_its_gguf_keys() {
        let routing = Routing::GroupedSigmoid { top_k: 2, groups: 1, top_groups: 1, normalize: true, scale: 1.0 };
        check_both("minimax_m2", Architecture::MinimaxM2, routing, None, &[true, true]);
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
        let err = nightmail_engine::Model::load(dir.path()).err().expect("the bias is missing").to_string();
        // Named by one of the spellings checkpoints use for it, with llama.cpp's name and the file.
        let named = err.starts_with("tensor `model.layers.1.")
            && err.contains(".e_score_correction_bias` (GGUF `blk.1.exp_probs_b.bias`)");
        assert!(named && err.contains(&format!("is missing from {}", dir.path().display())), "{err}");
        let dir = renamed("glm4_moe", "model.gguf", "blk.2.exp_probs_b.bias", "blk.2.exp_probs_x.bias");
        let path = dir.path().join("model.gguf");
        let err = nightmail_engine::Model::load(&path).err().expect("the bias is missing").to_string();
        let want = format!("tensor `blk.2.exp_probs_b.bias` is missing from {}", path.display());
        assert!(err.starts_with(&want), "{err}");
    }

    #[test]
    fn half_a_q_k_norm_pair_is_refused_naming_the_missing_one() {
        // GLM-4.5's norms are optional as a pair (`use_qk_norm`); one alone is a broken file.
        let dir = renamed("glm4_moe", "model.gguf", "blk.0.attn_q_norm.weight", "blk.0.attn_q_xorm.weight");
        let path = dir.path().join("model.gguf");
        let err = nightmail_engine::Model::load(&path).err().expect("no q norm").to_string();
        let want = format!("tensor `blk.0.attn_q_norm.weight` is missing from {}", path.display());
        assert!(err.starts_with(&want), "{err}");
    }

    #[test]
    fn a_q_norm_neither_one_head_nor_all_heads_wide_is_refused_naming_it() {
        use candle_core::quantized::gguf_file::Value;

        use nightmail_formats::GgufFile;
        use nightmail_formats::gguf_write::{TensorHeader, write_gguf};
        // MiniMax-M2's GGUF with a q norm of 24 (neither 16 per head nor 64 across four).
        let src = GgufFile::open(&fixture("minimax_m2/model.gguf")).unwrap();
        let metadata: Vec<(String, Value)> = src.metadata().iter().map(|(k, v)| (k.clone(), v.clone())).collect();
        let tensors = src.all_tensors().unwrap();
        let narrowed = |t: &nightmail_tensor::TensorView<'_>| t.name == "blk.0.attn_q_norm.weight";
        let headers: Vec<TensorHeader> = tensors
            .iter()
            .map(|t| TensorHeader::new(&t.name, t.dtype, if narrowed(t) { &[24] } else { &t.shape }))
            .collect();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("model.gguf");
        write_gguf(&path, &metadata, &headers, 32, |i, w| {
            w.write_all(if narrowed(&tensors[i]) { &tensors[i].bytes[..24 * 4] } else { tensors[i].bytes })
        })
        .unwrap();
        let err = nightmail_engine::Model::load(&path).err().expect("a q norm of 24").to_string();
        assert!(err.contains("blk.0.attn_q_norm.weight") && err.contains("[24]"), "{err}");
    }

    #[test]
    fn the_rotary_width_comes_from_the_factor_or_rotary_dim_and_must_fit_a_head() {
        let dim =
            |config: &str, arch| rope_dim_from_hf(&serde_json::from_str(config).unwrap(), arch, 128, Path::new("c"));
        assert_eq!(dim(r#"{"rope_parameters": {"partial_rotary_factor": 0.5}}"#, Architecture::Glm4Moe).unwrap(), 64);
        // MiniMax-M2's released config.json.
        assert_eq!(dim(r#"{"rotary_dim": 64}"#, Architecture::MinimaxM2).unwrap(), 64);
        assert_eq!(dim("{}", Architecture::Glm4Moe).unwrap(), 64, "Glm4MoeConfig's default factor");
        assert_eq!(dim("{}", Architecture::MinimaxM2).unwrap(), 128);
        let err = dim(r#"{"rotary_dim": 130}"#, Architecture::MinimaxM2).unwrap_err().to_string();
        assert!(err.contains("rotary_dim") && err.contains("as 130") && err.contains("head of 128"), "{err}");
    }
}
