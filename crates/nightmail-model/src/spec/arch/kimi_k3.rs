//! Moonshot's Kimi K3 (`model_type: kimi_k3`, text model under `text_config`, weights under
//! `language_model.`; llama.cpp `kimi-k3`, convert_hf_to_gguf.py `KimiK3Model`): Kimi Linear's
//! layers with the lower-bounded KDA gate and full-rank output gate, gated MLA, Stable
//! LatentMoE, SiTU and AttnRes residuals.

use super::Row;
use super::deepseek_v3::{mla_from_gguf, mla_from_hf, set_latent_gguf, set_latent_hf};
use super::kimi_linear::{ROUTER, kda_from_gguf, kda_from_hf};
use super::moe::Scoring;
use super::source::{Gguf, Hf};
use crate::error::Result;
use crate::spec::{Activation, Architecture, KdaSpec, LatentSpec, MlaSpec, ModelSpec};

pub(super) const ROW: Row = Row {
    architecture: Architecture::KimiK3,
    gguf: &["kimi-k3"],
    gguf_experts: None,
    gguf_mtp_in_blocks: false,
    hf: &["kimi_k3"],
    hf_classes: &[],
    read_gguf,
    read_hf,
};

/// SiTU's β where the file gives none (`activation_situ_beta`; llama.cpp `kimi_k3_situ`).
const SITU_BETA: f64 = 4.0;

fn situ(beta: Option<f64>, linear_beta: Option<f64>) -> Activation {
    Activation::Situ { beta: beta.unwrap_or(SITU_BETA) as f32, linear_beta: linear_beta.map(|v| v as f32) }
}

fn read_gguf(g: &Gguf) -> Result<ModelSpec> {
    let mut s = g.base()?;
    set_latent_gguf(g, &mut s, MlaSpec { nope: true, output_gate: true, ..mla_from_gguf(g)? });
    let kda = kda_from_gguf(g, s.layers, s.attention.heads)?;
    let gate_lower_bound = g.float("kda.gate_lower_bound").map(|v| v as f32);
    s.kda = Some(KdaSpec { gate_lower_bound, full_rank_output_gate: true, ..kda });
    s.ffn_activation = situ(g.float("activation.situ_beta"), g.float("activation.situ_linear_beta"));
    s.attn_res_block = g.uint("attn_res.block_size").filter(|b| *b > 0);
    // llama.cpp has no key for the latent norm: a layer has `ffn_routed_norm` or not.
    let norm = (0..s.layers).any(|l| g.g.tensor_shape(&format!("blk.{l}.ffn_routed_norm.weight")).is_some());
    let latent = g.uint("expert_latent_length").map(|width| LatentSpec { width, norm });
    s.moe = g.moe_keys()?.map(|k| k.sigmoid_moe(ROUTER, Scoring::Sigmoid, s.ffn_activation)).transpose()?;
    if let Some(m) = &mut s.moe {
        m.latent = latent;
    }
    Ok(s)
}

fn read_hf(h: &Hf) -> Result<ModelSpec> {
    let mut s = h.base()?;
    set_latent_hf(h, &mut s, mla_from_hf(h, true, true)?);
    s.kda = Some(KdaSpec { full_rank_output_gate: true, ..kda_from_hf(h.c, &h.path, s.layers)? });
    s.ffn_activation = situ(h.float("activation_situ_beta"), h.float("activation_situ_linear_beta"));
    s.attn_res_block = match h.uint("attn_res_block_size") {
        Some(0) => return Err(h.bad("`attn_res_block_size` is 0".into())),
        block => block,
    };
    // The routed experts work in `routed_expert_hidden_size` (kimi-k3.cpp build_latent_moe).
    let norm = h.boolean("latent_moe_use_norm").unwrap_or(true);
    let latent = h.uint("routed_expert_hidden_size").map(|width| LatentSpec { width, norm });
    s.moe = h.moe_keys()?.map(|k| k.sigmoid_moe(ROUTER, Scoring::Sigmoid, s.ffn_activation)).transpose()?;
    if let Some(m) = &mut s.moe {
        m.latent = latent;
    }
    Ok(s)
}
