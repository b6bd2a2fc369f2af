//! Synthetic mixture-of-experts models: random weights in a real layout (llama.cpp's GGUF
//! `qwen3moe`, `deepseek2` as its converter writes DeepSeek-V3, or `kimi-linear` as it writes
//! Kimi Linear), of any size, for streaming benchmarks.
//!
//! Random quantized bytes must decode to values symmetric around zero: uniform nibbles would
//! make Q4_0 weights average −0.5·d, every router logit would share that bias, and routing would
//! collapse onto a few experts per layer, which makes any cache look far better than it is. So a
//! Q4_0 nibble is drawn uniformly from 1..=15 (weight −7..=7, never −8) and a Q8_0 byte from
//! −127..=127. MXFP4 nibbles are uniform: its value table is symmetric already (ggml's has +0
//! twice, for E2M1's +0 and −0).

use nightmail_formats::FormatError;
use std::io::Write;
use std::path::{Path, PathBuf};

use candle_core::quantized::GgmlDType;
use candle_core::quantized::gguf_file::Value;
use half::f16;
use rayon::prelude::*;
use serde::Serialize;

use crate::pack::DenseQuant;
use crate::pack::requantize::{is_head, target_of};
use nightmail_engine::Result;
use nightmail_formats::GgufFile;
use nightmail_formats::gguf_write::{TensorHeader, write_gguf};
use nightmail_tensor::WeightDType;

/// The architectures `model synth` writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SynthArch {
    Qwen3Moe,
    DeepseekV3,
    /// Kimi Linear: three KDA layers to one NoPE latent-attention layer, DeepSeek-V3's MoE.
    KimiLinear,
    /// Kimi K3: Kimi Linear's layers (the last one latent attention too, as in K3) with the
    /// lower-bounded KDA gate and full-rank output gate, gated MLA with a query latent, Stable
    /// LatentMoE in half the width (K3: 7168 → 3584), SiTU and AttnRes blocks of 12 layers.
    /// Written as GGUF arch `kimi-k3` under llama.cpp's names and keys (convert_hf_to_gguf.py
    /// KimiK3Model, src/llama-arch.cpp).
    KimiK3,
    /// Qwen3-Next: three Gated DeltaNet layers to one gated full-attention layer, Qwen-MoE's
    /// experts with a gated shared expert, as llama.cpp's converter writes it (`qwen3next`).
    Qwen3Next,
}

impl std::str::FromStr for SynthArch {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "qwen3_moe" => Ok(SynthArch::Qwen3Moe),
            "deepseek_v3" => Ok(SynthArch::DeepseekV3),
            "kimi_linear" => Ok(SynthArch::KimiLinear),
            "kimi_k3" => Ok(SynthArch::KimiK3),
            "qwen3_next" => Ok(SynthArch::Qwen3Next),
            other => Err(format!(
                "unknown architecture `{other}`: use qwen3_moe, deepseek_v3, kimi_linear, kimi_k3 or qwen3_next"
            )),
        }
    }
}

/// The element type of the routed experts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SynthDtype {
    Q4_0,
    Q8_0,
    Mxfp4,
}

impl std::str::FromStr for SynthDtype {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "q4_0" => Ok(SynthDtype::Q4_0),
            "q8_0" => Ok(SynthDtype::Q8_0),
            "mxfp4" => Ok(SynthDtype::Mxfp4),
            other => Err(format!("unknown expert dtype `{other}`: use q4_0, q8_0 or mxfp4")),
        }
    }
}

#[derive(Debug, Clone)]
pub struct SynthSpec {
    pub arch: SynthArch,
    pub layers: usize,
    pub experts: usize,
    pub top_k: usize,
    pub hidden: usize,
    pub expert_ffn: usize,
    pub dtype: SynthDtype,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    /// Vocabulary size when no tokenizer is copied.
    pub vocab: usize,
    /// Copy `tokenizer.*` metadata (vocabulary, merges, chat template) from this GGUF.
    pub tokenizer_from: Option<PathBuf>,
    pub context_length: usize,
    pub seed: u64,
    /// Write the non-expert weights ("the spine") in this type instead of F16, the tensors
    /// `model pack --dense` would requantize: a model with deltafin's int8 spine in llama.cpp's
    /// own layout, so that llama.cpp runs the same file.
    pub dense: Option<DenseQuant>,
}

impl SynthSpec {
    /// Attention heads for a hidden size, as Qwen3-MoE sizes them: heads of 128 (or smaller for
    /// tiny models), a quarter as many key/value heads.
    pub fn default_heads(hidden: usize) -> (usize, usize, usize) {
        let head_dim = hidden.min(128);
        let heads = (hidden / head_dim).max(1);
        (heads, (heads / 4).max(1), head_dim)
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct SynthReport {
    pub path: PathBuf,
    pub bytes: u64,
    pub dense_bytes: u64,
    pub expert_bytes: u64,
    pub expert_bytes_per_token: u64,
}

/// splitmix64 (Steele et al. 2014): fast, and seeded per tensor and chunk so that parallel
/// generation is reproducible.
struct Rng(u64);

impl Rng {
    fn new(seed: u64, stream: u64) -> Self {
        let mut r = Rng(seed ^ stream.wrapping_mul(0x9E37_79B9_7F4A_7C15));
        r.next();
        r
    }
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in [0, 1).
    fn unit(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 24) as f32
    }
    /// Uniform in 0..n (Lemire's multiply-shift on 32 bits; bias below 2^-24 for small n).
    fn below(&mut self, n: u32) -> u32 {
        (((self.next() >> 32) * n as u64) >> 32) as u32
    }
}

/// How a tensor's values are drawn.
#[derive(Clone, Copy)]
enum Fill {
    Ones,
    /// Every value this one (KDA's decay and its bias).
    Constant(f32),
    /// Uniform with this standard deviation.
    Uniform(f32),
}

struct Planned {
    header: TensorHeader,
    fill: Fill,
    expert: bool,
}

/// The DeepSeek-V3 shape scaled to a head width d: its heads are 128 + 64 (rope) wide for
/// queries and keys, 128 for values, over a 512-wide kv latent and a 1536-wide q latent.
#[derive(Clone, Copy)]
struct LatentShape {
    q_lora: usize,
    kv_lora: usize,
    nope: usize,
    rope: usize,
    v: usize,
    /// Expert groups and how many of them a token may use (DeepSeek-V3: 8 and 4).
    groups: usize,
    top_groups: usize,
}

impl LatentShape {
    fn new(spec: &SynthSpec) -> Self {
        let d = spec.head_dim;
        // The most groups (up to 8) of at least two experts that still leave top-k experts in
        // half the groups.
        let groups = [8, 4, 2, 1]
            .into_iter()
            .find(|g| {
                spec.experts.is_multiple_of(*g)
                    && spec.experts / g >= 2
                    && (g / 2).max(1) * (spec.experts / g) >= spec.top_k
            })
            .unwrap_or(1);
        LatentShape {
            q_lora: (12 * d).min(spec.hidden),
            kv_lora: (4 * d).min(spec.hidden),
            nope: d,
            rope: (d / 2).max(2) & !1,
            v: d,
            groups,
            top_groups: (groups / 2).max(1),
        }
    }
}

/// Kimi Linear's short convolution (`short_conv_kernel_size`).
const KDA_CONV_KERNEL: usize = 4;

/// Write the model to `out`.
pub fn synth(spec: &SynthSpec, out: &Path) -> Result<SynthReport> {
    let (metadata, plan) = layout(spec)?;
    let headers: Vec<TensorHeader> = plan.iter().map(|p| p.header.clone()).collect();
    let io = |source| FormatError::Io { path: out.to_path_buf(), source };
    // 4 KiB alignment: every tensor, and so every expert slice of a stacked tensor whose size is
    // a multiple of 4 KiB, can be read with O_DIRECT in place.
    write_gguf(out, &metadata, &headers, 4096, |i, w| write_tensor(&plan[i], spec.seed, i as u64, w)).map_err(io)?;
    let file = std::fs::File::open(out).map_err(io)?;
    // What was just written need not stay in the page cache.
    nightmail_engine::stream::io::drop_from_page_cache(&file, 0, file.metadata().map_err(io)?.len() as usize);
    report(spec, out, &plan)
}

/// The model's headers at full size with no data (a sparse file reading as zeros): for `model
/// plan` and `model inspect` on a shape larger than the disk (Kimi K3's 1.5 TB), not for running.
pub fn synth_headers(spec: &SynthSpec, out: &Path) -> Result<SynthReport> {
    let (metadata, plan) = layout(spec)?;
    let headers: Vec<TensorHeader> = plan.iter().map(|p| p.header.clone()).collect();
    let io = |source| FormatError::Io { path: out.to_path_buf(), source };
    nightmail_formats::gguf_write::write_gguf_sparse(out, &metadata, &headers, 4096).map_err(io)?;
    report(spec, out, &plan)
}

fn report(spec: &SynthSpec, out: &Path, plan: &[Planned]) -> Result<SynthReport> {
    let bytes = std::fs::metadata(out).map_err(|source| FormatError::Io { path: out.to_path_buf(), source })?.len();
    let expert_bytes: u64 = plan.iter().filter(|p| p.expert).map(|p| p.header.byte_len() as u64).sum();
    let dense_bytes: u64 = plan.iter().filter(|p| !p.expert).map(|p| p.header.byte_len() as u64).sum();
    Ok(SynthReport {
        path: out.to_path_buf(),
        bytes,
        dense_bytes,
        expert_bytes,
        expert_bytes_per_token: expert_bytes * spec.top_k as u64 / spec.experts as u64,
    })
}

/// GGUF metadata: keys and values.
type Metadata = Vec<(String, Value)>;

/// The metadata and the tensors of the model `spec` describes.
fn layout(spec: &SynthSpec) -> Result<(Metadata, Vec<Planned>)> {
    let expert_dtype = match spec.dtype {
        SynthDtype::Q4_0 => WeightDType::Ggml(GgmlDType::Q4_0),
        SynthDtype::Q8_0 => WeightDType::Ggml(GgmlDType::Q8_0),
        SynthDtype::Mxfp4 => WeightDType::Mxfp4,
    };
    if !spec.hidden.is_multiple_of(32) || !spec.expert_ffn.is_multiple_of(32) {
        return Err(FormatError::Unsupported {
            what: format!("hidden {} / expert ffn {}", spec.hidden, spec.expert_ffn),
            hint: "quantized rows need multiples of 32".into(),
        }
        .into());
    }
    if spec.top_k == 0 || spec.top_k > spec.experts {
        return Err(FormatError::Unsupported {
            what: format!("top-k {} of {} experts", spec.top_k, spec.experts),
            hint: "choose 1 ≤ top-k ≤ experts".into(),
        }
        .into());
    }
    let arch = match spec.arch {
        SynthArch::Qwen3Moe => "qwen3moe",
        SynthArch::DeepseekV3 => "deepseek2",
        SynthArch::KimiLinear => "kimi-linear",
        SynthArch::KimiK3 => "kimi-k3",
        SynthArch::Qwen3Next => "qwen3next",
    };
    let next = spec.arch == SynthArch::Qwen3Next;
    // Qwen3-Next-80B's proportions: as many DeltaNet key heads as attention heads, twice as many
    // value heads, all of the attention's head size; every 4th layer full attention.
    let delta = DeltaShape { k_heads: spec.heads, v_heads: 2 * spec.heads, dim: spec.head_dim };
    let is_delta_net = |l: usize| next && !(l + 1).is_multiple_of(4);
    let k3 = spec.arch == SynthArch::KimiK3;
    let kimi = k3 || spec.arch == SynthArch::KimiLinear;
    // K3's routed experts work in half the width (7168 → 3584).
    let expert_width = if k3 { spec.hidden / 2 } else { spec.hidden };
    if !expert_width.is_multiple_of(32) {
        return Err(FormatError::Unsupported {
            what: format!("kimi_k3 hidden {}", spec.hidden),
            hint: "its expert latent is half the hidden width: use a multiple of 64".into(),
        }
        .into());
    }
    let mut latent = LatentShape::new(spec);
    // Kimi Linear and K3: their experts in one group (num_expert_group 1); Kimi Linear without a
    // query latent.
    if kimi {
        (latent.groups, latent.top_groups) = (1, 1);
    }
    if spec.arch == SynthArch::KimiLinear {
        latent.q_lora = 0;
    }
    // Kimi Linear's layers (from 1) 4, 8, ... are latent attention, the rest KDA; K3's last too.
    let is_kda = |l: usize| kimi && !(l + 1).is_multiple_of(4) && !(k3 && l + 1 == spec.layers);
    // DeepSeek-V3 keeps its first layers dense (3 of 61), the Kimis their first; here the
    // first, when there are more.
    let dense_layers = match spec.arch {
        SynthArch::DeepseekV3 | SynthArch::KimiLinear | SynthArch::KimiK3 if spec.layers > 1 => 1,
        _ => 0,
    };
    let mut metadata: Vec<(String, Value)> = Vec::new();
    let mut vocab = spec.vocab;
    if let Some(src) = &spec.tokenizer_from {
        let g = GgufFile::open(src)?;
        let mut keys: Vec<&String> = g.metadata().keys().filter(|k| k.starts_with("tokenizer.")).collect();
        keys.sort();
        for k in keys {
            metadata.push((k.clone(), g.metadata()[k].clone()));
        }
        vocab = g.value("tokenizer.ggml.tokens").and_then(|v| v.to_vec().ok()).map(Vec::len).ok_or_else(|| {
            FormatError::MissingMetadata { key: format!("tokenizer.ggml.tokens in {}", src.display()) }
        })?;
    }
    let k = |key: &str| format!("{arch}.{key}");
    let u32v = |v: usize| Value::U32(v as u32);
    metadata.splice(
        0..0,
        [
            ("general.architecture".to_string(), Value::String(arch.into())),
            ("general.name".to_string(), Value::String(format!("nightmail synthetic {arch}"))),
            (k("block_count"), u32v(spec.layers)),
            (k("context_length"), u32v(spec.context_length)),
            (k("embedding_length"), u32v(spec.hidden)),
            (k("feed_forward_length"), u32v(spec.expert_ffn * spec.top_k)),
            (k("attention.head_count"), u32v(spec.heads)),
            (k("attention.layer_norm_rms_epsilon"), Value::F32(1e-6)),
            (k("rope.freq_base"), Value::F32(1_000_000.0)),
            (k("expert_count"), u32v(spec.experts)),
            (k("expert_used_count"), u32v(spec.top_k)),
            (k("expert_feed_forward_length"), u32v(spec.expert_ffn)),
        ],
    );
    let l = latent;
    // DeepSeek-V3's latent widths and routing, which Kimi Linear shares.
    let latent_keys = |scale: f32| {
        vec![
            (k("attention.key_length"), u32v(l.kv_lora + l.rope)),
            (k("attention.value_length"), u32v(l.kv_lora)),
            (k("attention.key_length_mla"), u32v(l.nope + l.rope)),
            (k("attention.value_length_mla"), u32v(l.v)),
            (k("attention.kv_lora_rank"), u32v(l.kv_lora)),
            (k("rope.dimension_count"), u32v(l.rope)),
            (k("leading_dense_block_count"), u32v(dense_layers)),
            (k("expert_shared_count"), u32v(1)),
            (k("expert_weights_scale"), Value::F32(scale)),
            (k("expert_weights_norm"), Value::Bool(true)),
            (k("expert_gating_func"), u32v(2)),
            (k("expert_group_count"), u32v(l.groups)),
            (k("expert_group_used_count"), u32v(l.top_groups)),
        ]
    };
    let arch_keys = match spec.arch {
        // conversion/qwen.py Qwen3NextModel: the ssm keys give the DeltaNet widths; a quarter of
        // each attention head rotates.
        SynthArch::Qwen3Next => vec![
            (k("attention.head_count_kv"), u32v(spec.kv_heads)),
            (k("attention.key_length"), u32v(spec.head_dim)),
            (k("attention.value_length"), u32v(spec.head_dim)),
            (k("rope.dimension_count"), u32v(spec.head_dim / 4)),
            (k("expert_shared_feed_forward_length"), u32v(spec.expert_ffn)),
            (k("ssm.conv_kernel"), u32v(KDA_CONV_KERNEL)),
            (k("ssm.state_size"), u32v(delta.dim)),
            (k("ssm.group_count"), u32v(delta.k_heads)),
            (k("ssm.time_step_rank"), u32v(delta.v_heads)),
            (k("ssm.inner_size"), u32v(delta.v_heads * delta.dim)),
            (k("full_attention_interval"), u32v(4)),
        ],
        SynthArch::Qwen3Moe => vec![
            (k("attention.head_count_kv"), u32v(spec.kv_heads)),
            (k("attention.key_length"), u32v(spec.head_dim)),
            (k("attention.value_length"), u32v(spec.head_dim)),
        ],
        // convert_hf_to_gguf.py DeepseekV2Model: MLA as MQA over the latent, per-head widths in
        // the `_mla` keys; sigmoid routing in groups with DeepSeek-V3's scale and one shared expert.
        SynthArch::DeepseekV3 => {
            let mut keys = vec![(k("attention.head_count_kv"), u32v(1)), (k("attention.q_lora_rank"), u32v(l.q_lora))];
            keys.extend(latent_keys(2.5));
            keys
        }
        // convert_hf_to_gguf.py KimiLinearModel: zeros in head_count_kv mark the KDA layers;
        // the KDA heads are the attention heads (llama.cpp sizes them so); Kimi's scale 2.446.
        SynthArch::KimiLinear | SynthArch::KimiK3 => {
            let kv_heads = (0..spec.layers).map(|i| Value::U32(u32::from(!is_kda(i)))).collect();
            let mut keys = vec![
                (k("attention.head_count_kv"), Value::Array(kv_heads)),
                (k("kda.head_dim"), u32v(spec.head_dim)),
                (k("ssm.conv_kernel"), u32v(KDA_CONV_KERNEL)),
            ];
            keys.extend(latent_keys(2.446));
            if k3 {
                // K3's published config under llama.cpp's keys (convert_hf_to_gguf.py KimiK3Model):
                // a query latent, gate_lower_bound −5, SiTU betas 4 and 25, AttnRes blocks of 12;
                // the latent norm is there because its tensors are.
                keys.extend([
                    (k("attention.q_lora_rank"), u32v(l.q_lora)),
                    (k("kda.gate_lower_bound"), Value::F32(-5.0)),
                    (k("activation.situ_beta"), Value::F32(4.0)),
                    (k("activation.situ_linear_beta"), Value::F32(25.0)),
                    (k("attn_res.block_size"), u32v(12)),
                    (k("expert_latent_length"), u32v(expert_width)),
                ]);
            }
            keys
        }
    };
    metadata.extend(arch_keys);
    if spec.tokenizer_from.is_none() {
        metadata.push((k("vocab_size"), u32v(vocab)));
        // llama.cpp's LLAMA_VOCAB_TYPE_NONE: it loads a model driven by token ids only with this.
        metadata.push(("tokenizer.ggml.model".into(), Value::String("none".into())));
    }

    let (h, f, e) = (spec.hidden, spec.expert_ffn, spec.experts);
    let (q_dim, kv_dim) = (spec.heads * spec.head_dim, spec.kv_heads * spec.head_dim);
    let inv = |n: usize| 1.0 / (n as f32).sqrt();
    // Residual branches are scaled down with depth (GPT-2's 1/√(2·layers) init, Radford et al.
    // 2019, and further for attention): a random decoder's attention outputs average over the
    // same history at every step and add up across layers into one shared direction, which drowns
    // the token's own signal; deep layers then route every token to the same few experts. With
    // these scales routing stays nearly as diverse at the last layer as at the first, as in a
    // trained model.
    let layers = spec.layers.max(1) as f32;
    let attn_out = inv(q_dim) / layers;
    let ffn_down = inv(f) / (2.0 * layers).sqrt();
    let mut plan: Vec<Planned> = Vec::new();
    let mut add = |name: String, dtype: WeightDType, shape: &[usize], fill, expert| {
        plan.push(Planned { header: TensorHeader::new(name, dtype, shape), fill, expert })
    };
    add("token_embd.weight".into(), WeightDType::F16, &[vocab, h], Fill::Uniform(1.0), false);
    let (dense, f16) = (spec.expert_ffn * spec.top_k, WeightDType::F16);
    for l in 0..spec.layers {
        let b = |n: &str| format!("blk.{l}.{n}");
        add(b("attn_norm.weight"), WeightDType::F32, &[h], Fill::Ones, false);
        match spec.arch {
            SynthArch::Qwen3Next if is_delta_net(l) => {
                let (kd, vd, kernel, f32) =
                    (delta.k_heads * delta.dim, delta.v_heads * delta.dim, KDA_CONV_KERNEL, WeightDType::F32);
                add(b("attn_qkv.weight"), f16, &[2 * kd + vd, h], Fill::Uniform(inv(h)), false);
                add(b("attn_gate.weight"), f16, &[vd, h], Fill::Uniform(inv(h)), false);
                add(b("ssm_ba.weight"), f16, &[2 * delta.v_heads, h], Fill::Uniform(inv(h)), false);
                add(b("ssm_conv1d.weight"), f32, &[2 * kd + vd, kernel], Fill::Uniform(inv(kernel)), false);
                // As for KDA: decay rate 1 and a bias giving per-token decays of about 0.95.
                add(b("ssm_a"), f32, &[delta.v_heads], Fill::Constant(-1.0), false);
                add(b("ssm_dt.bias"), f32, &[delta.v_heads], Fill::Constant(-2.97), false);
                add(b("ssm_norm.weight"), f32, &[delta.dim], Fill::Ones, false);
                add(b("ssm_out.weight"), f16, &[h, vd], Fill::Uniform(inv(vd) / layers), false);
            }
            // Gated attention: q_proj gives each head's query and its output gate.
            SynthArch::Qwen3Next => {
                add(b("attn_q.weight"), f16, &[2 * q_dim, h], Fill::Uniform(inv(h)), false);
                add(b("attn_k.weight"), f16, &[kv_dim, h], Fill::Uniform(inv(h)), false);
                add(b("attn_v.weight"), f16, &[kv_dim, h], Fill::Uniform(inv(h)), false);
                add(b("attn_output.weight"), f16, &[h, q_dim], Fill::Uniform(attn_out), false);
                add(b("attn_q_norm.weight"), WeightDType::F32, &[spec.head_dim], Fill::Ones, false);
                add(b("attn_k_norm.weight"), WeightDType::F32, &[spec.head_dim], Fill::Ones, false);
            }
            SynthArch::KimiLinear | SynthArch::KimiK3 if is_kda(l) => {
                let (d, w, kernel) = (spec.head_dim, q_dim, KDA_CONV_KERNEL);
                let f32 = WeightDType::F32;
                // Split, as llama.cpp's kimi-linear and kimi-k3 graphs take them.
                for x in ["q", "k", "v"] {
                    add(b(&format!("attn_{x}.weight")), f16, &[w, h], Fill::Uniform(inv(h)), false);
                    let conv = &[1, w, 1, kernel];
                    add(b(&format!("ssm_conv1d_{x}.weight")), f32, conv, Fill::Uniform(inv(kernel)), false);
                }
                add(b("ssm_f_a.weight"), f16, &[d, h], Fill::Uniform(inv(h)), false);
                add(b("ssm_f_b.weight"), f16, &[w, d], Fill::Uniform(inv(d)), false);
                add(b("ssm_beta.weight"), f16, &[spec.heads, h], Fill::Uniform(inv(h)), false);
                // A = −exp(A_log) at decay rate 1, and a dt bias near fla's initial ones (the
                // inverse softplus of 0.05): per-token decays of about 0.95.
                // (llama.cpp's kimi-k3 takes a plain [heads], kimi-linear a padded one.)
                let a_shape: &[usize] = if k3 { &[spec.heads] } else { &[1, 1, spec.heads, 1] };
                add(b("ssm_a"), f32, a_shape, Fill::Constant(-1.0), false);
                add(b("ssm_dt.bias"), f32, &[w], Fill::Constant(-2.97), false);
                if k3 {
                    add(b("ssm_g.weight"), f16, &[w, h], Fill::Uniform(inv(h)), false);
                } else {
                    add(b("ssm_g_a.weight"), f16, &[d, h], Fill::Uniform(inv(h)), false);
                    add(b("ssm_g_b.weight"), f16, &[w, d], Fill::Uniform(inv(d)), false);
                }
                add(b("ssm_norm.weight"), f32, &[d], Fill::Ones, false);
                add(b("attn_output.weight"), f16, &[h, w], Fill::Uniform(attn_out), false);
            }
            SynthArch::Qwen3Moe => {
                add(b("attn_q.weight"), f16, &[q_dim, h], Fill::Uniform(inv(h)), false);
                add(b("attn_k.weight"), f16, &[kv_dim, h], Fill::Uniform(inv(h)), false);
                add(b("attn_v.weight"), f16, &[kv_dim, h], Fill::Uniform(inv(h)), false);
                add(b("attn_output.weight"), f16, &[h, q_dim], Fill::Uniform(attn_out), false);
                add(b("attn_q_norm.weight"), WeightDType::F32, &[spec.head_dim], Fill::Ones, false);
                add(b("attn_k_norm.weight"), WeightDType::F32, &[spec.head_dim], Fill::Ones, false);
            }
            // Latent attention: DeepSeek-V3's through a query latent, Kimi Linear's without.
            SynthArch::DeepseekV3 | SynthArch::KimiLinear | SynthArch::KimiK3 => {
                let (m, heads) = (latent, spec.heads);
                if k3 {
                    add(b("attn_gate.weight"), f16, &[heads * m.v, h], Fill::Uniform(inv(h)), false);
                }
                let q = heads * (m.nope + m.rope);
                if m.q_lora == 0 {
                    add(b("attn_q.weight"), f16, &[q, h], Fill::Uniform(inv(h)), false);
                } else {
                    add(b("attn_q_a.weight"), f16, &[m.q_lora, h], Fill::Uniform(inv(h)), false);
                    add(b("attn_q_a_norm.weight"), WeightDType::F32, &[m.q_lora], Fill::Ones, false);
                    add(b("attn_q_b.weight"), f16, &[q, m.q_lora], Fill::Uniform(inv(m.q_lora)), false);
                }
                add(b("attn_kv_a_mqa.weight"), f16, &[m.kv_lora + m.rope, h], Fill::Uniform(inv(h)), false);
                add(b("attn_kv_a_norm.weight"), WeightDType::F32, &[m.kv_lora], Fill::Ones, false);
                add(b("attn_k_b.weight"), f16, &[heads, m.kv_lora, m.nope], Fill::Uniform(inv(m.kv_lora)), false);
                add(b("attn_v_b.weight"), f16, &[heads, m.v, m.kv_lora], Fill::Uniform(inv(m.kv_lora)), false);
                let out = inv(heads * m.v) / layers;
                add(b("attn_output.weight"), f16, &[h, heads * m.v], Fill::Uniform(out), false);
            }
        }
        // llama.cpp's qwen3next names the norm before the feed-forward `post_attention_norm`.
        let ffn_norm = if next { "post_attention_norm.weight" } else { "ffn_norm.weight" };
        add(b(ffn_norm), WeightDType::F32, &[h], Fill::Ones, false);
        if k3 {
            // AttnRes's mixing points, as llama.cpp stores them (the norm's weight times the
            // projection): scores of a few tenths, as the reference fixture draws.
            for p in ["attn_res", "ffn_res"] {
                add(b(&format!("{p}_score.weight")), WeightDType::F32, &[h], Fill::Uniform(inv(h)), false);
            }
        }
        if l < dense_layers {
            add(b("ffn_gate.weight"), f16, &[dense, h], Fill::Uniform(inv(h)), false);
            add(b("ffn_up.weight"), f16, &[dense, h], Fill::Uniform(inv(h)), false);
            add(b("ffn_down.weight"), f16, &[h, dense], Fill::Uniform(inv(dense) / (2.0 * layers).sqrt()), false);
            continue;
        }
        add(b("ffn_gate_inp.weight"), WeightDType::F32, &[e, h], Fill::Uniform(inv(h)), false);
        if next {
            // Qwen-MoE's shared expert, scaled by σ of its own one-row gate.
            add(b("ffn_gate_inp_shexp.weight"), WeightDType::F32, &[1, h], Fill::Uniform(inv(h)), false);
            add(b("ffn_gate_shexp.weight"), f16, &[f, h], Fill::Uniform(inv(h)), false);
            add(b("ffn_up_shexp.weight"), f16, &[f, h], Fill::Uniform(inv(h)), false);
            add(b("ffn_down_shexp.weight"), f16, &[h, f], Fill::Uniform(ffn_down), false);
        } else if spec.arch != SynthArch::Qwen3Moe {
            // A correction bias about as large as trained ones (DeepSeek-V3's are ~0.1 of its
            // sigmoid scores' spread), and the shared expert.
            add(b("exp_probs_b.bias"), WeightDType::F32, &[e], Fill::Uniform(0.02), false);
            add(b("ffn_gate_shexp.weight"), f16, &[f, h], Fill::Uniform(inv(h)), false);
            add(b("ffn_up_shexp.weight"), f16, &[f, h], Fill::Uniform(inv(h)), false);
            add(b("ffn_down_shexp.weight"), f16, &[h, f], Fill::Uniform(ffn_down), false);
        }
        let x = expert_width;
        if k3 {
            add(b("ffn_routed_down.weight"), f16, &[x, h], Fill::Uniform(inv(h)), false);
            add(b("ffn_routed_norm.weight"), WeightDType::F32, &[x], Fill::Ones, false);
            add(b("ffn_routed_up.weight"), f16, &[h, x], Fill::Uniform(ffn_down), false);
        }
        add(b("ffn_gate_exps.weight"), expert_dtype, &[e, f, x], Fill::Uniform(inv(x)), true);
        add(b("ffn_up_exps.weight"), expert_dtype, &[e, f, x], Fill::Uniform(inv(x)), true);
        add(b("ffn_down_exps.weight"), expert_dtype, &[e, x, f], Fill::Uniform(ffn_down), true);
    }
    if k3 {
        add("output_res_score.weight".into(), WeightDType::F32, &[h], Fill::Uniform(inv(h)), false);
    }
    add("output_norm.weight".into(), WeightDType::F32, &[h], Fill::Ones, false);
    add("output.weight".into(), WeightDType::F16, &[vocab, h], Fill::Uniform(inv(h)), false);
    if let Some(to) = spec.dense {
        for p in plan.iter_mut().filter(|p| !p.expert) {
            let t = &mut p.header;
            // Never tied: synth writes its own `output.weight`.
            if let Some(q) = target_of(&t.name, t.dtype, &t.shape, to, is_head(&t.name, false)) {
                t.dtype = q.into();
            }
        }
    }

    Ok((metadata, plan))
}

/// A synthetic Qwen3-Next's Gated DeltaNet heads (key and value heads of one size).
#[derive(Clone, Copy)]
struct DeltaShape {
    k_heads: usize,
    v_heads: usize,
    dim: usize,
}

/// Generate and write one tensor, in parallel chunks of whole rows.
fn write_tensor(p: &Planned, seed: u64, index: u64, w: &mut dyn Write) -> std::io::Result<()> {
    let t = &p.header;
    let cols = *t.shape.last().expect("tensors have a shape");
    let rows: usize = t.shape.iter().product::<usize>() / cols;
    let row_bytes = t.byte_len() / rows;
    // About 4 MiB per chunk, 16 chunks generated at once.
    let rows_per_chunk = ((4 << 20) / row_bytes).clamp(1, rows);
    let chunks = rows.div_ceil(rows_per_chunk);
    for batch in (0..chunks).collect::<Vec<_>>().chunks(16) {
        let bufs: Vec<Vec<u8>> = batch
            .par_iter()
            .map(|&c| {
                let n = rows_per_chunk.min(rows - c * rows_per_chunk);
                let mut rng = Rng::new(seed, (index << 32) | c as u64);
                random_rows(t.dtype, p.fill, n * cols, &mut rng)
            })
            .collect();
        for b in bufs {
            w.write_all(&b)?;
        }
    }
    Ok(())
}

fn random_rows(dtype: WeightDType, fill: Fill, elems: usize, rng: &mut Rng) -> Vec<u8> {
    let sigma = match fill {
        Fill::Ones | Fill::Constant(_) => 0.0,
        Fill::Uniform(s) => s,
    };
    // Uniform on [−a, a] has standard deviation a/√3.
    let a = sigma * 3f32.sqrt();
    let mut uniform = || match fill {
        Fill::Ones => 1.0,
        Fill::Constant(v) => v,
        Fill::Uniform(_) => (rng.unit() * 2.0 - 1.0) * a,
    };
    let dtype = match dtype {
        WeightDType::Mxfp4 => {
            // Uniform nibbles give doubled values of variance 274/8; the E8M0 scale is the power of
            // two nearest the one that makes the standard deviation sigma.
            let e = (128.0 + (sigma / (274f32 / 8.0).sqrt()).log2().round()).clamp(1.0, 254.0) as u8;
            let mut out = Vec::with_capacity(elems / 32 * 17);
            for _ in 0..elems / 32 {
                out.push(e);
                out.extend((0..16).map(|_| rng.below(256) as u8));
            }
            return out;
        }
        WeightDType::Ggml(d) => d,
        WeightDType::LowBit(t) => unreachable!("synth writes no {t:?} tensors"),
    };
    match dtype {
        GgmlDType::F32 => (0..elems).flat_map(|_| uniform().to_le_bytes()).collect(),
        GgmlDType::F16 => (0..elems).flat_map(|_| f16::from_f32(uniform()).to_le_bytes()).collect(),
        GgmlDType::Q4_0 => {
            // q uniform on −7..=7 has variance (15² − 1)/12.
            let d = sigma / (224f32 / 12.0).sqrt();
            let mut out = Vec::with_capacity(elems / 32 * 18);
            for _ in 0..elems / 32 {
                let scale = f16::from_f32(d * (0.8 + 0.4 * rng.unit()));
                out.extend_from_slice(&scale.to_le_bytes());
                for _ in 0..16 {
                    let lo = 1 + rng.below(15) as u8;
                    let hi = 1 + rng.below(15) as u8;
                    out.push(lo | (hi << 4));
                }
            }
            out
        }
        GgmlDType::Q8_0 => {
            let d = sigma / (65024f32 / 12.0).sqrt();
            let mut out = Vec::with_capacity(elems / 32 * 34);
            for _ in 0..elems / 32 {
                let scale = f16::from_f32(d * (0.8 + 0.4 * rng.unit()));
                out.extend_from_slice(&scale.to_le_bytes());
                for _ in 0..32 {
                    out.push((rng.below(255) as i32 - 127) as i8 as u8);
                }
            }
            out
        }
        other => unreachable!("synth writes no {other:?}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn q4_0_nibbles_are_symmetric_and_never_minus_8() {
        let mut rng = Rng::new(7, 1);
        let bytes = random_rows(GgmlDType::Q4_0.into(), Fill::Uniform(0.05), 32 * 4096, &mut rng);
        let mut counts = [0u64; 16];
        for block in bytes.chunks_exact(18) {
            for b in &block[2..] {
                counts[(b & 0xF) as usize] += 1;
                counts[(b >> 4) as usize] += 1;
            }
        }
        assert_eq!(counts[0], 0, "nibble 0 decodes to −8");
        let n: u64 = counts.iter().sum();
        let mean: f64 = counts.iter().enumerate().map(|(q, c)| (q as f64 - 8.0) * *c as f64).sum::<f64>() / n as f64;
        assert!(mean.abs() < 0.02, "mean weight {mean} (in units of d) is not centred");
        for (q, c) in counts.iter().enumerate().skip(1) {
            let expect = n as f64 / 15.0;
            assert!((*c as f64 - expect).abs() < expect * 0.05, "nibble {q}: {c} of {n}");
        }
    }

    #[test]
    fn q8_0_bytes_span_minus_127_to_127() {
        let mut rng = Rng::new(7, 2);
        let bytes = random_rows(GgmlDType::Q8_0.into(), Fill::Uniform(0.05), 32 * 2048, &mut rng);
        let vals: Vec<i8> = bytes.chunks_exact(34).flat_map(|b| b[2..].iter().map(|x| *x as i8)).collect();
        assert!(!vals.contains(&i8::MIN));
        let mean = vals.iter().map(|v| *v as f64).sum::<f64>() / vals.len() as f64;
        assert!(mean.abs() < 1.0, "mean {mean}");
    }

    fn tiny(dtype: SynthDtype, arch: SynthArch) -> SynthSpec {
        let (heads, kv_heads, head_dim) = SynthSpec::default_heads(64);
        SynthSpec {
            arch,
            layers: 2,
            experts: 8,
            top_k: 2,
            hidden: 64,
            expert_ffn: 64,
            dtype,
            heads,
            kv_heads,
            head_dim,
            vocab: 64,
            tokenizer_from: None,
            context_length: 256,
            seed: 1,
            dense: None,
        }
    }

    #[test]
    fn a_deepseek_v3_is_written_in_the_deepseek2_layout_loaded_and_run() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("ds.gguf");
        synth(&tiny(SynthDtype::Q4_0, SynthArch::DeepseekV3), &out).unwrap();
        let info = crate::inspect(&out).unwrap();
        assert_eq!(info.spec.architecture, nightmail_engine::Architecture::DeepseekV3);
        assert_eq!(info.spec.moe_layers, vec![false, true], "the first layer is dense");
        let mla = info.spec.attention.mla.expect("latent attention");
        assert_eq!((mla.kv_lora_rank, mla.qk_nope_head_dim, mla.qk_rope_head_dim), (64, 64, 32));
        assert!(matches!(
            info.spec.moe.unwrap().routing,
            nightmail_engine::Routing::GroupedSigmoid { groups: 4, top_groups: 2, normalize: true, .. }
        ));
        let model = nightmail_engine::Model::load(&out).unwrap();
        let mut cache = model.new_cache();
        let logits = model.logits(&[1, 2, 3], &mut cache).unwrap();
        assert!(logits.len() == 64 && logits.iter().all(|v| v.is_finite()));
        assert!(model.logits(&[4], &mut cache).unwrap().iter().all(|v| v.is_finite()));
    }

    #[test]
    fn an_mxfp4_qwen3moe_is_written_loaded_and_run() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("mxfp4.gguf");
        let report = synth(&tiny(SynthDtype::Mxfp4, SynthArch::Qwen3Moe), &out).unwrap();
        // 2 layers × 3 matrices × 8 experts × 64·64 weights, 17 bytes per 32.
        assert_eq!(report.expert_bytes, 2 * 3 * 8 * 64 * 64 / 32 * 17);
        let info = crate::inspect(&out).unwrap();
        assert_eq!(info.dtypes["MXFP4"].tensors, 6, "{:?}", info.dtypes);
        let model = nightmail_engine::Model::load(&out).unwrap();
        let mut cache = model.new_cache();
        let logits = model.logits(&[1, 2, 3], &mut cache).unwrap();
        assert_eq!(logits.len(), 64);
        assert!(logits.iter().all(|v| v.is_finite()));
    }

    #[test]
    fn mxfp4_blocks_are_centred_with_the_asked_deviation_up_to_a_power_of_two() {
        let mut rng = Rng::new(7, 3);
        let sigma = 0.05f32;
        let bytes = random_rows(WeightDType::Mxfp4, Fill::Uniform(sigma), 32 * 2048, &mut rng);
        let mut w = vec![0f32; 32 * 2048];
        nightmail_tensor::kernel::mxfp4::dequantize(&bytes, &mut w);
        let n = w.len() as f64;
        let mean = w.iter().map(|v| *v as f64).sum::<f64>() / n;
        let sd = (w.iter().map(|v| (*v as f64 - mean).powi(2)).sum::<f64>() / n).sqrt();
        assert!(mean.abs() < 0.02 * sd, "mean {mean} for deviation {sd}");
        assert!(sd > sigma as f64 / 2f64.sqrt() * 0.95 && sd < sigma as f64 * 2f64.sqrt() * 1.05, "deviation {sd}");
    }

    #[test]
    fn a_kimi_k3_is_written_loaded_and_run_and_its_experts_stream_bit_identically() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("k3.gguf");
        synth(&SynthSpec { layers: 5, ..tiny(SynthDtype::Mxfp4, SynthArch::KimiK3) }, &out).unwrap();
        let info = crate::inspect(&out).unwrap();
        let s = &info.spec;
        assert_eq!(s.architecture, nightmail_engine::Architecture::KimiK3);
        let kda = s.kda.as_ref().expect("KDA layers");
        assert_eq!(&kda.layers[..], &[0, 1, 2], "layer 4 (from 1) and the last are latent attention");
        assert!(kda.full_rank_output_gate && kda.gate_lower_bound == Some(-5.0));
        let mla = s.attention.mla.expect("latent attention");
        assert!(mla.nope && mla.output_gate && mla.q_lora_rank.is_some());
        let moe = s.moe.as_ref().expect("experts");
        assert_eq!(moe.latent, Some(nightmail_model::spec::LatentSpec { width: 32, norm: true }));
        assert!(matches!(moe.activation, nightmail_model::spec::Activation::Situ { .. }));
        assert_eq!(
            (s.attn_res_block, info.layer_kinds.linear_attention, info.layer_kinds.latent_attention),
            (Some(12), 3, 2)
        );
        // 4 MoE layers × 8 experts × three 64×32 MXFP4 matrices.
        assert_eq!(info.expert_bytes, 4 * 8 * 3 * 64 * 32 / 32 * 17);
        let run = |model: &nightmail_engine::Model| {
            let mut cache = model.new_cache();
            let mut rows = vec![model.logits(&[1, 2, 3], &mut cache).unwrap()];
            rows.push(model.logits(&[4], &mut cache).unwrap());
            rows
        };
        let resident = run(&nightmail_engine::Model::load(&out).unwrap());
        assert!(resident.iter().flatten().all(|v| v.is_finite()) && resident[0] != resident[1]);
        let mut c = nightmail_engine::StreamConfig::with_cache_mb(0);
        c.cache_bytes = 2 * 4096;
        let streamed =
            nightmail_engine::Model::load_with(&out, &nightmail_engine::LoadOptions { stream: Some(c), memory: None })
                .unwrap();
        let bits = |r: &[Vec<f32>]| r.iter().flatten().map(|v| v.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&run(&streamed)), bits(&resident));
    }

    #[test]
    fn headers_only_make_a_sparse_file_of_the_full_size_that_inspects_as_the_written_one() {
        use std::os::unix::fs::MetadataExt;
        let dir = tempfile::tempdir().unwrap();
        let spec = SynthSpec { layers: 5, ..tiny(SynthDtype::Mxfp4, SynthArch::KimiK3) };
        let (full, sparse) = (dir.path().join("full.gguf"), dir.path().join("sparse.gguf"));
        let (a, b) = (synth(&spec, &full).unwrap(), synth_headers(&spec, &sparse).unwrap());
        assert_eq!((a.bytes, a.dense_bytes, a.expert_bytes), (b.bytes, b.dense_bytes, b.expert_bytes));
        let (fa, fb) = (std::fs::metadata(&full).unwrap(), std::fs::metadata(&sparse).unwrap());
        assert!(fb.blocks() * 4 < fa.blocks(), "the data is a hole: {} of {} blocks", fb.blocks(), fa.blocks());
        let (x, y) = (crate::inspect(&full).unwrap(), crate::inspect(&sparse).unwrap());
        assert_eq!((x.layer_kinds, x.expert_bytes, x.dense_bytes), (y.layer_kinds, y.expert_bytes, y.dense_bytes));
    }

    #[test]
    fn a_q8_0_spine_is_written_in_the_types_packing_would_give_it_and_runs() {
        let dir = tempfile::tempdir().unwrap();
        let (f16, spine, packed) = (dir.path().join("f16.gguf"), dir.path().join("q8.gguf"), dir.path().join("p.gguf"));
        synth(&tiny(SynthDtype::Q4_0, SynthArch::Qwen3Moe), &f16).unwrap();
        let report =
            synth(&SynthSpec { dense: Some(DenseQuant::Q8_0), ..tiny(SynthDtype::Q4_0, SynthArch::Qwen3Moe) }, &spine)
                .unwrap();
        crate::pack_with(&f16, &packed, &crate::PackOptions { dense: Some(DenseQuant::Q8_0), stripe: vec![] }).unwrap();
        let (s, p) =
            (nightmail_formats::ModelFile::open(&spine).unwrap(), nightmail_formats::ModelFile::open(&packed).unwrap());
        let dtypes = |ck: &nightmail_formats::ModelFile| -> std::collections::BTreeMap<String, WeightDType> {
            ck.all_tensors()
                .unwrap()
                .into_iter()
                .filter(|t| !nightmail_formats::is_expert_tensor(&t.name))
                .map(|t| (t.name, t.dtype))
                .collect()
        };
        let (ours, theirs) = (dtypes(&s), dtypes(&p));
        assert_eq!(ours, theirs, "the spine's types are those `model pack --dense q8_0` gives");
        let q8 = WeightDType::Ggml(GgmlDType::Q8_0);
        for name in ["blk.0.attn_q.weight", "blk.1.attn_output.weight", "output.weight", "token_embd.weight"] {
            assert_eq!(ours[name], q8, "{name}");
        }
        for name in ["blk.0.attn_norm.weight", "blk.0.ffn_gate_inp.weight", "output_norm.weight"] {
            assert_eq!(ours[name], WeightDType::F32, "{name}");
        }
        let experts: Vec<_> =
            s.all_tensors().unwrap().into_iter().filter(|t| nightmail_formats::is_expert_tensor(&t.name)).collect();
        assert!(experts.len() == 6 && experts.iter().all(|t| t.dtype == WeightDType::Ggml(GgmlDType::Q4_0)));
        // 34 bytes per 32 weights where F16 took 64: the report counts what was written.
        let dense_f16 = synth_headers(&tiny(SynthDtype::Q4_0, SynthArch::Qwen3Moe), &dir.path().join("h.gguf"))
            .unwrap()
            .dense_bytes;
        assert!(report.dense_bytes < dense_f16 * 6 / 10, "{} vs {dense_f16}", report.dense_bytes);
        runs_a_prompt_and_a_step(&spine);
    }

    /// The model at `path` loads, and a prompt and one more token give finite logits that differ.
    fn runs_a_prompt_and_a_step(path: &std::path::Path) {
        let model = nightmail_engine::Model::load(path).unwrap();
        let mut cache = model.new_cache();
        let logits = model.logits(&[1, 2, 3], &mut cache).unwrap();
        assert!(logits.len() == 64 && logits.iter().all(|v| v.is_finite()));
        let next = model.logits(&[4], &mut cache).unwrap();
        assert!(next.iter().all(|v| v.is_finite()) && next != logits);
    }

    #[test]
    fn a_qwen3_next_is_written_in_the_qwen3next_layout_loaded_and_run() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("next.gguf");
        synth(&SynthSpec { layers: 4, ..tiny(SynthDtype::Q4_0, SynthArch::Qwen3Next) }, &out).unwrap();
        let info = crate::inspect(&out).unwrap();
        assert_eq!(info.spec.architecture, nightmail_engine::Architecture::Qwen3Next);
        let d = info.spec.delta_net.as_ref().expect("Gated DeltaNet layers");
        assert_eq!((d.k_heads, d.v_heads, d.k_head_dim, d.v_head_dim, &d.layers[..]), (1, 2, 64, 64, &[0, 1, 2][..]));
        let a = &info.spec.attention;
        assert_eq!((a.output_gate, a.rope_dim, info.spec.zero_centered_norms), (true, 16, false));
        assert_eq!(info.spec.moe.as_ref().unwrap().shared_expert_ffn, Some(64));
        runs_a_prompt_and_a_step(&out);
    }

    #[test]
    fn a_kimi_linear_is_written_in_the_kimi_linear_layout_loaded_and_run() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("kimi.gguf");
        synth(&SynthSpec { layers: 5, ..tiny(SynthDtype::Q4_0, SynthArch::KimiLinear) }, &out).unwrap();
        let info = crate::inspect(&out).unwrap();
        assert_eq!(info.spec.architecture, nightmail_engine::Architecture::KimiLinear);
        let kda = info.spec.kda.as_ref().expect("KDA layers");
        assert_eq!((kda.heads, kda.head_dim, kda.conv_kernel, &kda.layers[..]), (1, 64, 4, &[0, 1, 2, 4][..]));
        assert_eq!(info.spec.moe_layers, vec![false, true, true, true, true], "the first layer is dense");
        let mla = info.spec.attention.mla.expect("latent attention");
        assert!(mla.nope && mla.q_lora_rank.is_none());
        runs_a_prompt_and_a_step(&out);
    }
}
