//! Moonshot's Kimi Linear (transformers `KimiLinearForCausalLM`, llama.cpp `kimi-linear`): KDA
//! linear-attention layers between NoPE latent-attention layers, DeepSeek-V3's MoE. The KDA
//! readers here serve Kimi K3 too.

use nightmail_formats::FormatError;
use std::path::Path;

use serde_json::Value as Json;

use super::Row;
use super::deepseek_v3::{mla_from_gguf, mla_from_hf, set_latent_gguf, set_latent_hf};
use super::moe::{Scoring, SigmoidDefaults};
use super::source::{Gguf, Hf};
use crate::error::{ModelError, Result};
use crate::spec::{Activation, Architecture, KdaSpec, MlaSpec, ModelSpec, delta_net};

pub(super) const ROW: Row = Row {
    architecture: Architecture::KimiLinear,
    gguf: &["kimi-linear"],
    gguf_experts: None,
    gguf_mtp_in_blocks: false,
    hf: &["kimi_linear"],
    hf_classes: &[],
    read_gguf,
    read_hf,
};

/// `KimiLinearConfig`'s router: sigmoid, renormalized, scale 1, no shared expert unless told.
pub(super) const ROUTER: SigmoidDefaults = SigmoidDefaults { normalize: true, scale: 1.0, shared_experts: 0 };

fn read_gguf(g: &Gguf) -> Result<ModelSpec> {
    let mut s = g.base()?;
    // llama.cpp's kimi-linear graph rotates nothing in its MLA layers, as transformers' does not.
    set_latent_gguf(g, &mut s, MlaSpec { nope: true, ..mla_from_gguf(g)? });
    s.kda = Some(kda_from_gguf(g, s.layers, s.attention.heads)?);
    s.moe = g.moe_keys()?.map(|k| k.sigmoid_moe(ROUTER, Scoring::Sigmoid, Activation::SwiGlu)).transpose()?;
    Ok(s)
}

fn read_hf(h: &Hf) -> Result<ModelSpec> {
    let mut s = h.base()?;
    set_latent_hf(h, &mut s, mla_from_hf(h, true, false)?);
    s.kda = Some(kda_from_hf(h.c, &h.path, s.layers)?);
    s.moe = h.moe_keys()?.map(|k| k.sigmoid_moe(ROUTER, Scoring::Sigmoid, Activation::SwiGlu)).transpose()?;
    Ok(s)
}

/// Kimi Linear's layer kinds and KDA widths, with transformers' `KimiLinearConfig` precedence:
/// `layer_types` (`linear_attention` / `full_attention`), else the checkpoint's
/// `linear_attn_config` lists (`kda_layers`, `full_attn_layers`, numbered from 1), else every
/// 4th layer after the first full. Widths from `linear_attn_config` or the flat `linear_*` keys.
pub(crate) fn kda_from_hf(c: &Json, path: &Path, layers: usize) -> Result<KdaSpec> {
    let bad = |reason: String| ModelError::from(FormatError::BadConfig { path: path.to_path_buf(), reason });
    let lin = c.get("linear_attn_config").filter(|v| v.is_object());
    let width = |nested: &str, flat: &str, default: u64| -> Result<usize> {
        let v = lin.and_then(|l| l.get(nested)).or_else(|| c.get(flat)).filter(|v| !v.is_null());
        match v {
            None => Ok(default as usize),
            Some(v) => Ok(v.as_u64().filter(|n| *n > 0).map(|n| n as usize).ok_or_else(|| {
                bad(format!("`linear_attn_config.{nested}` (or `{flat}`) is {v}, not a positive number"))
            })?),
        }
    };
    let (heads, head_dim) = (width("num_heads", "linear_num_heads", 32)?, width("head_dim", "linear_head_dim", 128)?);
    let conv_kernel = width("short_conv_kernel_size", "linear_conv_kernel_dim", 4)?;
    let kda_layers: Vec<usize> = if let Some(types) = c.get("layer_types").filter(|v| !v.is_null()) {
        delta_net::linear_layers(types, layers).map_err(bad)?
    } else if let Some((kda, full)) =
        lin.and_then(|l| Some((l.get("kda_layers")?.as_array()?, l.get("full_attn_layers")?.as_array()?)))
    {
        let mut kind: Vec<Option<bool>> = vec![None; layers];
        for (list, is_kda, key) in [(full, false, "full_attn_layers"), (kda, true, "kda_layers")] {
            for n in list {
                match n.as_u64().map(|n| n as usize) {
                    Some(n) if (1..=layers).contains(&n) => kind[n - 1] = Some(is_kda),
                    _ => {
                        return Err(bad(format!(
                            "`linear_attn_config.{key}` names layer {n}: layers are numbered 1 to {layers}"
                        )));
                    }
                }
            }
        }
        let mut out = Vec::new();
        for (l, k) in kind.iter().enumerate() {
            match k {
                Some(true) => out.push(l),
                Some(false) => {}
                None => {
                    return Err(bad(format!(
                        "layer {} is in neither `linear_attn_config.kda_layers` nor `full_attn_layers`",
                        l + 1
                    )));
                }
            }
        }
        out
    } else {
        (0..layers).filter(|i| !(*i > 0 && i % 4 == 0)).collect()
    };
    // transformers' KimiLinearAttention never rotates; a checkpoint asking for rotary MLA is
    // something its reference does not run.
    if c.get("mla_use_nope").and_then(Json::as_bool) == Some(false) {
        return Err(FormatError::Unsupported {
            what: "Kimi Linear with `mla_use_nope: false`".into(),
            hint: "its reference (transformers' KimiLinearAttention) applies no rotary encoding".into(),
        }
        .into());
    }
    let gate_lower_bound = lin.and_then(|l| l.get("gate_lower_bound")).and_then(Json::as_f64).map(|v| v as f32);
    Ok(KdaSpec { heads, head_dim, conv_kernel, layers: kda_layers, gate_lower_bound, full_rank_output_gate: false })
}

/// Kimi Linear's KDA layers as llama.cpp's converter marks them: a per-layer
/// `attention.head_count_kv` that is 0 for a KDA layer, `kda.head_dim`, `ssm.conv_kernel`; the
/// KDA heads are the attention heads (llama.cpp's kimi-linear sizes them by `n_head`).
pub(super) fn kda_from_gguf(g: &Gguf, layers: usize, heads: usize) -> Result<KdaSpec> {
    let need = |k: &str| g.uint(k).ok_or_else(|| super::missing(&g.key(k)));
    let kv = g.key("attention.head_count_kv");
    let per_layer = match g.g.value(&kv) {
        Some(candle_core::quantized::gguf_file::Value::Array(a)) if a.len() == layers => {
            a.iter().map(nightmail_formats::gguf_value_as_u64).collect::<Option<Vec<u64>>>()
        }
        _ => None,
    };
    let per_layer =
        per_layer.ok_or_else(|| super::missing(&format!("{kv} (one entry per layer, 0 for a KDA layer)")))?;
    Ok(KdaSpec {
        heads,
        head_dim: need("kda.head_dim")?,
        conv_kernel: need("ssm.conv_kernel")?,
        layers: per_layer.iter().enumerate().filter(|(_, n)| **n == 0).map(|(l, _)| l).collect(),
        gate_lower_bound: None,
        full_rank_output_gate: false,
    })
}
