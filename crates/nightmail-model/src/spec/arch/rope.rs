//! Rotary settings read the same way for every architecture: YaRN (Peng et al., arXiv
//! 2309.00071) from llama.cpp's `rope.scaling.*` keys or transformers' rope parameters, and the
//! rotated width of a head.

use crate::error::ModelError;
use nightmail_formats::FormatError;
use std::path::Path;

use serde_json::Value as Json;

use super::missing;
use super::source::{Gguf, Hf};
use crate::error::Result;
use crate::spec::{Yarn, yarn_mscale};
use nightmail_formats::GgufFile;

fn unsupported_rope(kind: &str) -> ModelError {
    ModelError::from(FormatError::Unsupported {
        what: format!("rope scaling `{kind}`"),
        hint: "this engine implements plain RoPE and YaRN; use a model with one of those".into(),
    })
}

/// YaRN from llama.cpp's keys (`{arch}.rope.scaling.*`, written by convert_hf_to_gguf.py).
pub(crate) fn yarn_from_gguf(g: &GgufFile, arch: &str) -> Result<Option<Yarn>> {
    let key = |k: &str| format!("{arch}.rope.scaling.{k}");
    match g.string(&key("type")) {
        None | Some("none") => return Ok(None),
        Some("yarn") => {}
        Some(other) => return Err(unsupported_rope(other)),
    }
    let factor = g.float(&key("factor")).ok_or_else(|| missing(&key("factor")))?;
    let given = g.float(&key("yarn_attn_factor"));
    // deepseek2 (and deepseek32, glm-dsa, its converter's subclasses): the converter writes
    // 0.1 · mscale_all_dim as the log multiplier, and llama.cpp (TAG_DEEPSEEK2_YARN_LOG_MUL_FIX)
    // divides it back out, folds mscale² into the softmax scale and cancels ggml's own YaRN factor
    // on cos/sin.
    let (attention_factor, mscale_all_dim) = if matches!(arch, "deepseek2" | "deepseek32" | "glm-dsa") {
        (given.unwrap_or(1.0), g.float(&key("yarn_log_multiplier")).map_or(0.0, |m| m / 0.1))
    } else {
        (given.unwrap_or_else(|| yarn_mscale(factor, 1.0)), 0.0)
    };
    Ok(Some(Yarn {
        factor,
        original_context: g
            .uint(&key("original_context_length"))
            .map(|v| v as usize)
            .ok_or_else(|| missing(&key("original_context_length")))?,
        beta_fast: g.float(&key("yarn_beta_fast")).unwrap_or(32.0),
        beta_slow: g.float(&key("yarn_beta_slow")).unwrap_or(1.0),
        // ggml's `ggml_rope_yarn_corr_dims` always rounds the ramp's ends, and GGUF has no key
        // for it; gpt-oss's own reference does not round (transformers' GptOssConfig
        // `truncate: false`), and the engine follows the model's reference.
        truncate: arch != "gpt-oss",
        attention_factor,
        mscale_all_dim,
    }))
}

/// YaRN from `config.json`'s `rope_parameters` (transformers 5) or `rope_scaling` (4), with
/// transformers' `_compute_yarn_parameters` defaults.
pub(crate) fn yarn_from_hf(c: &Json, path: &Path) -> Result<Option<Yarn>> {
    let Some(r) = ["rope_parameters", "rope_scaling"].iter().find_map(|k| c.get(*k).filter(|v| v.is_object())) else {
        return Ok(None);
    };
    yarn_from_parameters(r, c, path)
}

/// YaRN from one rope-parameters object `r` of `config.json` `c` (DeepSeek-V4 keeps one per
/// rotary, `rope_parameters.main` and `.compress`).
pub(super) fn yarn_from_parameters(r: &Json, c: &Json, path: &Path) -> Result<Option<Yarn>> {
    let kind = r.get("rope_type").or_else(|| r.get("type")).and_then(Json::as_str).unwrap_or("default");
    match kind {
        "default" => return Ok(None),
        "yarn" => {}
        other => return Err(unsupported_rope(other)),
    }
    let num = |k: &str| r.get(k).and_then(Json::as_f64);
    // `or` in the reference: 0 and null fall back to the default too.
    let nonzero = |k: &str| num(k).filter(|v| *v != 0.0);
    let max_positions = c.get("max_position_embeddings").and_then(Json::as_u64);
    let original = r
        .get("original_max_position_embeddings")
        .or_else(|| c.get("original_max_position_embeddings"))
        .and_then(Json::as_u64)
        .or(max_positions)
        .ok_or_else(|| FormatError::BadConfig {
            path: path.to_path_buf(),
            reason: "YaRN needs `original_max_position_embeddings`".into(),
        })? as usize;
    let factor = match num("factor") {
        Some(f) => f,
        None => max_positions.unwrap_or(original as u64) as f64 / original as f64,
    };
    let (mscale, mscale_all_dim) = (nonzero("mscale"), nonzero("mscale_all_dim"));
    let attention_factor = match (num("attention_factor"), mscale, mscale_all_dim) {
        (Some(a), _, _) => a,
        (None, Some(m), Some(all)) => yarn_mscale(factor, m) / yarn_mscale(factor, all),
        _ => yarn_mscale(factor, 1.0),
    };
    Ok(Some(Yarn {
        factor,
        original_context: original,
        beta_fast: nonzero("beta_fast").unwrap_or(32.0),
        beta_slow: nonzero("beta_slow").unwrap_or(1.0),
        truncate: r.get("truncate").and_then(Json::as_bool).unwrap_or(true),
        attention_factor,
        mscale_all_dim: mscale_all_dim.unwrap_or(0.0),
    }))
}

/// The rotated width per head from `rope.dimension_count` (llama.cpp's `n_rot`, which every
/// arch's converter writes: head_dim · partial_rotary_factor for glm4moe, `rotary_dim` for
/// minimax-m2), head_dim where absent.
pub(super) fn rope_dim_from_gguf(g: &Gguf, head_dim: usize) -> Result<usize> {
    let dim = g.uint("rope.dimension_count").unwrap_or(head_dim);
    Ok(checked(dim, head_dim)
        .map_err(|reason| FormatError::BadMetadata { key: g.key("rope.dimension_count"), reason })?)
}

/// The rotated width per head from config.json: transformers 5's
/// `rope_parameters.partial_rotary_factor` (or a top-level one), or MiniMax-M2's released
/// checkpoints' `rotary_dim` (transformers' `MiniMaxM2Config.convert_rope_params_to_dict`),
/// else `default_factor`; transformers' default rope computes `int(head_dim · factor)`.
pub(super) fn rope_dim_from_hf(h: &Hf, head_dim: usize, default_factor: f64) -> Result<usize> {
    rotary_width(h.c, head_dim, default_factor, &h.path)
}

pub(super) fn rotary_width(c: &Json, head_dim: usize, default_factor: f64, path: &Path) -> Result<usize> {
    let factor = c
        .get("rope_parameters")
        .and_then(|r| r.get("partial_rotary_factor"))
        .or_else(|| c.get("partial_rotary_factor"))
        .and_then(Json::as_f64);
    let rotary_dim = c.get("rotary_dim").and_then(Json::as_u64).map(|d| d as usize);
    let dim = match (factor, rotary_dim) {
        (Some(f), _) => (head_dim as f64 * f) as usize,
        (None, Some(d)) => d,
        (None, None) => (head_dim as f64 * default_factor) as usize,
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

impl Gguf<'_> {
    pub fn yarn(&self) -> Result<Option<Yarn>> {
        yarn_from_gguf(self.g, self.arch)
    }
}

impl Hf<'_> {
    pub fn yarn(&self) -> Result<Option<Yarn>> {
        yarn_from_hf(self.c, &self.path)
    }
}
