//! What a model is, read from its own metadata (GGUF keys or `config.json`), never from a table
//! of known sizes. Both transformers 4 and 5 spellings are accepted (`rope_theta` or
//! `rope_parameters.rope_theta`, `rope_scaling` or `rope_parameters`, `num_experts` or
//! `num_local_experts`).

use nightmail_formats::FormatError;
use serde::Serialize;

use crate::error::Result;
use nightmail_formats::ModelFile;

mod arch;
mod delta_net;
pub use arch::deepseek_v4::{DeepseekV4Spec, V4AttentionKind};
pub use arch::deepseek_v32::DsaSpec;
pub use delta_net::DeltaNetSpec;

/// The architectures this engine runs. Each picks its attention and routing parts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Architecture {
    Llama,
    Mixtral,
    Qwen2Moe,
    Qwen3Moe,
    /// OpenAI's gpt-oss (transformers `GptOssForCausalLM`, llama.cpp `gpt-oss`).
    GptOss,
    /// DeepSeek-V3 and Kimi K2 (GGUF `deepseek2`): multi-head latent attention and grouped
    /// sigmoid routing.
    DeepseekV3,
    /// Moonshot's Kimi Linear (transformers `KimiLinearForCausalLM`, llama.cpp `kimi-linear`):
    /// KDA linear-attention layers between NoPE latent-attention layers, DeepSeek-V3's MoE.
    KimiLinear,
    /// Moonshot's Kimi K3 (`model_type: kimi_k3`, text model under `text_config`, weights under
    /// `language_model.`; llama.cpp `kimi-k3`): Kimi Linear's layers with the lower-bounded KDA
    /// gate and full-rank output gate, gated MLA, Stable LatentMoE, SiTU and AttnRes residuals.
    KimiK3,
    /// Qwen3-Next (transformers `Qwen3NextForCausalLM`, llama.cpp `qwen3next`): Gated DeltaNet
    /// layers between gated full-attention layers, Qwen-MoE experts with a gated shared expert.
    Qwen3Next,
    /// Qwen3.5-MoE's text model (transformers `qwen3_5_moe`, llama.cpp `qwen35moe`): Qwen3-Next's
    /// layers with the DeltaNet projections stored apart.
    Qwen35Moe,
    /// Zhipu's GLM-4.5 (transformers `Glm4MoeForCausalLM`, llama.cpp `glm4moe`): grouped-query
    /// attention with q/k/v biases, rotary on part of each head and optional per-head q/k norms;
    /// DeepSeek-V3's sigmoid routing and shared expert.
    Glm4Moe,
    /// MiniMax-M2 (transformers `MiniMaxM2ForCausalLM`, llama.cpp `minimax-m2`): grouped-query
    /// attention with q/k norms across all heads and partial rotary; sigmoid routing with a
    /// correction bias, no shared expert.
    MinimaxM2,
    /// DeepSeek-V4 (transformers `DeepseekV4ForCausalLM`): hyper-connection residual streams,
    /// sliding-window MQA with heavily-compressed or compressed-sparse entries, the grouped
    /// output projection, sqrt-softplus and hash routing (spec/arch/deepseek_v4.rs).
    DeepseekV4,
    /// DeepSeek-V3.2 (transformers `DeepseekV32ForCausalLM`, llama.cpp `deepseek32`) and GLM-5
    /// (`GlmMoeDsaForCausalLM`, `glm-dsa`): DeepSeek-V3's layers with DeepSeek Sparse Attention.
    DeepseekV32,
    GlmMoeDsa,
}

impl Architecture {
    /// Qwen3-Next and Qwen3.5-MoE: Gated DeltaNet layers between gated full attention.
    pub fn is_qwen_hybrid(self) -> bool {
        matches!(self, Architecture::Qwen3Next | Architecture::Qwen35Moe)
    }

    /// Kimi Linear and K3: KDA layers between NoPE latent-attention layers.
    pub fn is_kimi_hybrid(self) -> bool {
        matches!(self, Architecture::KimiLinear | Architecture::KimiK3)
    }

    /// Grouped-query attention with DeepSeek-V3's sigmoid router (spec/arch/glm4_moe.rs, minimax_m2.rs).
    pub fn is_sigmoid_gqa(self) -> bool {
        matches!(self, Architecture::Glm4Moe | Architecture::MinimaxM2)
    }
}

/// How rotary embeddings pair a head's dimensions (RoFormer, arXiv 2104.09864).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RopeStyle {
    /// Dimension i with i + d/2: transformers' `rotate_half`, llama.cpp's NEOX type.
    HalfSplit,
    /// Dimensions 2i and 2i+1: llama.cpp's NORM type, used for GGUF `llama`, whose converter
    /// permutes the q/k rows to match.
    Interleaved,
}

/// How a router turns its logits into expert choices and weights.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Routing {
    /// Softmax over all experts, keep the top k, optionally renormalize them to sum to 1
    /// (Mixtral, arXiv 2401.04088 §2.1; Qwen-MoE `norm_topk_prob`).
    SoftmaxTopK { top_k: usize, normalize: bool },
    /// The top k of the raw logits, then a softmax over those k only (gpt-oss:
    /// transformers `GptOssTopKRouter`, llama.cpp's `SOFTMAX_WEIGHT` gating).
    TopKSoftmax { top_k: usize },
    /// DeepSeek-V3 (arXiv 2412.19437 §2.1.2): sigmoid scores; a per-expert correction bias
    /// added for the choice only; the experts split into `groups`, each scored by the sum of its
    /// two best biased scores, and only the best `top_groups` groups eligible; the top k of
    /// those weighted by their unbiased scores, normalized when `normalize`, times `scale`.
    GroupedSigmoid { top_k: usize, groups: usize, top_groups: usize, normalize: bool, scale: f32 },
    /// DeepSeek-V4 (transformers `DeepseekV4TopKRouter`): scores `sqrt(softplus(logit))`; the
    /// correction bias added for the choice only; the top k weighted by their scores,
    /// renormalized, times `scale`. A hash-routed layer takes the same weights for the experts
    /// its token id names (`DeepseekV4HashRouter`).
    SqrtSoftplus { top_k: usize, scale: f32 },
}

impl Routing {
    pub fn top_k(&self) -> usize {
        match self {
            Routing::SoftmaxTopK { top_k, .. }
            | Routing::TopKSoftmax { top_k }
            | Routing::GroupedSigmoid { top_k, .. }
            | Routing::SqrtSoftplus { top_k, .. } => *top_k,
        }
    }
}

/// The gated activation inside an expert's feed-forward.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Activation {
    /// `silu(gate) ⊙ up` (Shazeer, arXiv 2002.05202).
    #[serde(rename = "swiglu")]
    SwiGlu,
    /// gpt-oss's: the gate clamped from above at `limit`, the up projection to ±`limit`, then
    /// `gate · σ(alpha · gate) · (up + 1)` (transformers `GptOssExperts`, openai/gpt-oss
    /// `swiglu`).
    #[serde(rename = "clamped_swiglu")]
    ClampedSwiGlu { alpha: f32, limit: f32 },
    /// Kimi K3's SiTU: `β·tanh(g/β)·σ(g) · β_lin·tanh(u/β_lin)` (`activation_situ_beta`,
    /// `activation_situ_linear_beta`; llama.cpp `kimi_k3_situ`).
    #[serde(rename = "situ")]
    Situ { beta: f32, linear_beta: Option<f32> },
    /// DeepSeek-V4's: the gate clamped from above and the up projection to ±`limit`, then
    /// `silu(gate) ⊙ up` (transformers `DeepseekV4Experts._apply_gate`, `DeepseekV4MLP`).
    #[serde(rename = "clamped_silu")]
    ClampedSilu { limit: f32 },
}

/// Multi-head latent attention (DeepSeek-V2, arXiv 2405.04434 §2.1): keys and values are
/// up-projected per head from one shared latent of `kv_lora_rank`, beside a rotary key part of
/// `qk_rope_head_dim` shared by all heads; queries optionally through a latent of `q_lora_rank`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct MlaSpec {
    pub q_lora_rank: Option<usize>,
    pub kv_lora_rank: usize,
    pub qk_nope_head_dim: usize,
    pub qk_rope_head_dim: usize,
    pub v_head_dim: usize,
    /// The `qk_rope_head_dim` part is not rotated (Kimi Linear's `mla_use_nope`: transformers'
    /// `KimiLinearAttention` keeps the shared key part but applies no position encoding).
    pub nope: bool,
    /// Kimi K3's gated MLA: the attention output times σ(g_proj(x)) before o_proj
    /// (llama.cpp src/models/kimi-k3.cpp `build_mla_layer`).
    pub output_gate: bool,
}

/// Kimi Delta Attention (Kimi Linear, arXiv 2510.26692; fla `naive_recurrent_kda`): a linear
/// attention whose per-head state is updated by the gated delta rule with a per-channel decay.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct KdaSpec {
    pub heads: usize,
    /// Key and value width per head (the state is `head_dim × head_dim` per head).
    pub head_dim: usize,
    /// The causal depthwise convolution over q, k and v (`short_conv_kernel_size`).
    pub conv_kernel: usize,
    /// The layers (from 0) that are KDA; the others are full (latent) attention.
    pub layers: Vec<usize>,
    /// Kimi K3's `linear_attn_config.gate_lower_bound`: the decay gate becomes
    /// `lb·σ(exp(A_log)·(f_b(f_a(x)) + dt_bias))` instead of `−exp(A_log)·softplus(…)` (fla
    /// `naive_kda_lowerbound_gate`). None for Kimi Linear.
    pub gate_lower_bound: Option<f32>,
    /// Kimi K3's output gate is one full-rank `g_proj` (kimi-k3.cpp `build_kda_layer`, `ssm_g`)
    /// where Kimi Linear has the low-rank `g_b(g_a(x))`.
    pub full_rank_output_gate: bool,
}

/// YaRN rope scaling (Peng et al., arXiv 2309.00071), with transformers'
/// `_compute_yarn_parameters` defaults.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Yarn {
    /// Context extension: interpolated frequencies are divided by it.
    pub factor: f64,
    /// The context the model was pretrained with (`original_max_position_embeddings`).
    pub original_context: usize,
    /// Frequencies that turn more than `beta_fast` times over the original context keep their
    /// value; fewer than `beta_slow` times, they are interpolated; a linear ramp between.
    pub beta_fast: f64,
    pub beta_slow: f64,
    /// Round the ramp's ends to whole dimensions (transformers' default; gpt-oss sets false).
    pub truncate: bool,
    /// Multiplies cos and sin (the paper's √(1/t)).
    pub attention_factor: f64,
    /// DeepSeek's `mscale_all_dim` (0 when absent): MLA also scales its softmax by
    /// `yarn_mscale(factor, mscale_all_dim)²` (transformers' `yarn_apply_mscale`).
    pub mscale_all_dim: f64,
}

impl Yarn {
    /// The factor on the attention softmax scale (1 unless `mscale_all_dim` is set).
    pub fn softmax_factor(&self) -> f64 {
        if self.mscale_all_dim == 0.0 {
            return 1.0;
        }
        let m = yarn_mscale(self.factor, self.mscale_all_dim);
        m * m
    }
}

/// YaRN's Eq. 21: `0.1 · mscale · ln(scale) + 1` (transformers' `yarn_get_mscale`).
pub fn yarn_mscale(scale: f64, mscale: f64) -> f64 {
    if scale <= 1.0 { 1.0 } else { 0.1 * mscale * scale.ln() + 1.0 }
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AttentionSpec {
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    /// Grouped attention: the dimensions of each head that rotate, from its start (GLM-4.5's
    /// and MiniMax-M2's partial rotary; head_dim for the others); the rest pass unrotated.
    pub rope_dim: usize,
    pub rope_theta: f64,
    pub rope_style: RopeStyle,
    /// YaRN context extension, when the model was trained with it.
    pub rope_scaling: Option<Yarn>,
    /// Per layer: attend to at most this many previous positions (Mistral's sliding window).
    pub sliding_window: Vec<Option<usize>>,
    /// A learned per-head logit that joins each softmax and is dropped after it (gpt-oss's
    /// attention sinks; Xiao et al., arXiv 2309.17453).
    pub sinks: bool,
    /// Latent attention (DeepSeek-V3): then `head_dim` is the query/key width (nope + rope) and
    /// `kv_heads` is 1, the one latent all heads read.
    pub mla: Option<MlaSpec>,
    /// Qwen3-Next's gated attention: q_proj also gives a gate per head, and the attention output
    /// is multiplied by its sigmoid before o_proj (transformers `Qwen3NextAttention`).
    pub output_gate: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MoeSpec {
    pub experts: usize,
    pub routing: Routing,
    pub expert_ffn: usize,
    /// The always-on shared expert's width: Qwen-MoE's, scaled by its own sigmoid gate, or
    /// DeepSeek's `n_shared_experts` experts fused into one, added unweighted.
    pub shared_expert_ffn: Option<usize>,
    pub activation: Activation,
    /// Kimi K3's Stable LatentMoE: the routed experts work in this narrower width.
    pub latent: Option<LatentSpec>,
}

/// Stable LatentMoE (llama.cpp src/models/kimi-k3.cpp `build_latent_moe`): the router reads the
/// full width; each token is projected down to `width`, runs its experts there, the weighted sum
/// is RMS-normed (when `norm`) and projected back up.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct LatentSpec {
    pub width: usize,
    /// `latent_moe_use_norm`: RMSNorm the routed sum in the latent width.
    pub norm: bool,
}

impl MoeSpec {
    /// The width a routed expert reads and writes: the latent's, or the model's.
    pub fn expert_width(&self, hidden: usize) -> usize {
        self.latent.map_or(hidden, |l| l.width)
    }
}

/// A model's shape and parts.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ModelSpec {
    pub architecture: Architecture,
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub layers: usize,
    /// The dense feed-forward width (llama, and MoE models' dense layers).
    pub ffn: usize,
    pub rms_norm_eps: f64,
    pub context_length: usize,
    pub attention: AttentionSpec,
    pub moe: Option<MoeSpec>,
    /// Per layer: whether its feed-forward is a routed MoE block (router weights present).
    pub moe_layers: Vec<bool>,
    /// Kimi Linear's linear-attention layers, where the model has them.
    pub kda: Option<KdaSpec>,
    /// The gated activation of the dense layers and shared experts (K3's SiTU; SwiGLU elsewhere).
    pub ffn_activation: Activation,
    /// Kimi K3's AttnRes block residuals (`attn_res_block_size`): None for a plain residual.
    pub attn_res_block: Option<usize>,
    /// Qwen3-Next's Gated DeltaNet layers, where the model has them.
    pub delta_net: Option<DeltaNetSpec>,
    /// DeepSeek-V4's hyper-connections, attention kinds and hash routing.
    pub deepseek_v4: Option<DeepseekV4Spec>,
    /// DeepSeek Sparse Attention's indexer on every latent-attention layer (DeepSeek-V3.2, GLM-5).
    pub sparse_attention: Option<DsaSpec>,
    /// The file stores RMSNorm weights as w where the norm multiplies by (1 + w) (transformers'
    /// `Qwen3NextRMSNorm`; llama.cpp's converter adds the 1, so its GGUFs do not).
    pub zero_centered_norms: bool,
    /// Multi-token-prediction layers past the last one (DeepSeek-V3's `num_nextn_predict_layers`,
    /// GGUF `nextn_predict_layers`), which only `draft = "mtp"` runs (`model/mtp.rs`), and where
    /// the count is read from (for messages).
    pub mtp_layers: usize,
    pub mtp_key: String,
    pub bos_token: Option<u32>,
    pub eos_tokens: Vec<u32>,
}

impl ModelSpec {
    /// Whether layer `l` mixes tokens with KDA rather than attention.
    pub fn is_kda(&self, l: usize) -> bool {
        self.kda.as_ref().is_some_and(|k| k.layers.contains(&l))
    }

    /// Whether layer `l` mixes tokens with Gated DeltaNet.
    pub fn is_delta_net(&self, l: usize) -> bool {
        self.delta_net.as_ref().is_some_and(|d| d.layers.contains(&l))
    }

    /// Whether layer `l` keeps a fixed-size recurrent state instead of a key/value cache.
    pub fn is_recurrent(&self, l: usize) -> bool {
        self.is_kda(l) || self.is_delta_net(l)
    }
}

impl ModelSpec {
    pub fn read(ck: &ModelFile) -> Result<Self> {
        let mut spec = match ck {
            ModelFile::Gguf(g) => arch::from_gguf(g)?,
            ModelFile::Hf(h) => arch::from_hf(h)?,
        };
        spec.moe_layers = (0..spec.layers)
            .map(|l| ck.tensor(&format!("blk.{l}.ffn_gate_inp.weight")).map(|t| t.is_some()))
            .collect::<Result<_, FormatError>>()?;
        if spec.moe.is_none() && spec.moe_layers.iter().any(|m| *m) {
            return Err(
                FormatError::MissingMetadata { key: "expert count (the file has router weights)".into() }.into()
            );
        }
        spec.check()?;
        Ok(spec)
    }

    /// The sizes every part divides by or indexes with, checked once here so that a corrupt or
    /// mislabelled file is refused with the value it gives, never met as a division by zero or an
    /// index past the end mid-forward.
    fn check(&self) -> Result<()> {
        let bad = |key: &str, reason: String| Err(FormatError::BadMetadata { key: key.into(), reason }.into());
        let a = &self.attention;
        for (key, value) in [
            ("vocab_size", self.vocab_size),
            ("hidden_size", self.hidden_size),
            ("layers", self.layers),
            ("attention heads", a.heads),
            ("key/value heads", a.kv_heads),
            ("head size", a.head_dim),
            ("context length", self.context_length),
        ] {
            if value == 0 {
                return bad(key, "as 0".into());
            }
        }
        if !a.heads.is_multiple_of(a.kv_heads) {
            return bad(
                "key/value heads",
                format!("as {}, which does not divide {} attention heads", a.kv_heads, a.heads),
            );
        }
        if let Some(moe) = &self.moe {
            let top_k = moe.routing.top_k();
            if top_k == 0 || top_k > moe.experts {
                return bad("experts used per token", format!("as {top_k}, with {} experts", moe.experts));
            }
            if moe.expert_ffn == 0 {
                return bad("expert feed-forward width", "as 0".into());
            }
            if let Routing::GroupedSigmoid { groups, top_groups, .. } = moe.routing
                && (moe.experts % groups != 0 || top_groups > groups)
            {
                let reason = format!("as {groups} groups of which {top_groups} are used, for {} experts", moe.experts);
                return bad("expert groups", reason);
            }
        }
        Ok(())
    }
}

/// Fixture copies for the spec modules' bad-input tests.
#[cfg(test)]
pub(crate) mod test_files {
    use std::sync::Arc;

    use nightmail_formats::ModelFile;

    use crate::parts::expert::{ExpertStore, ResidentExperts};
    use crate::spec::ModelSpec;
    use crate::stack::Transformer;

    /// What loading the model at `path` resident refuses, as the engine's `Model::load` says it
    /// (the file, its spec, its experts and layers; the tokenizer and template aside).
    pub(crate) fn load_error(path: impl AsRef<std::path::Path>) -> Option<String> {
        let load = || -> crate::error::Result<()> {
            let ck = ModelFile::open(path.as_ref())?;
            let spec = ModelSpec::read(&ck)?;
            let experts: Arc<dyn ExpertStore> = Arc::new(ResidentExperts::load(&ck, &spec)?);
            Transformer::load(&ck, &spec, experts, 0, &[])?;
            Ok(())
        };
        load().err().map(|e| e.to_string())
    }

    pub(crate) fn fixture(name: &str) -> std::path::PathBuf {
        std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures").join(name)
    }

    /// A copy of `fixture`'s `file` (and config.json) with one tensor's name changed in place:
    /// `from` and `to` of one length, so that every offset holds.
    pub(crate) fn renamed(fixture_dir: &str, file: &str, from: &str, to: &str) -> tempfile::TempDir {
        assert_eq!(from.len(), to.len());
        let src = fixture(fixture_dir);
        let dir = tempfile::tempdir().unwrap();
        std::fs::copy(src.join("config.json"), dir.path().join("config.json")).unwrap();
        let mut bytes = std::fs::read(src.join(file)).unwrap();
        let at = bytes.windows(from.len()).position(|w| w == from.as_bytes()).expect("the fixture has it");
        bytes[at..at + to.len()].copy_from_slice(to.as_bytes());
        std::fs::write(dir.path().join(file), bytes).unwrap();
        dir
    }
}

#[cfg(test)]
mod tests {
    use super::arch::from_gguf;
    use super::arch::kimi_linear::kda_from_hf;
    use super::arch::rope::{yarn_from_gguf, yarn_from_hf};
    use super::*;
    use nightmail_formats::GgufFile;

    #[test]
    fn gpt_oss_reads_the_same_from_config_json_and_from_its_gguf_keys() {
        let dir = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/gpt_oss");
        for path in [dir.clone(), dir.join("model.gguf")] {
            let s = ModelSpec::read(&ModelFile::open(&path).unwrap()).unwrap();
            let at = path.display();
            assert_eq!(s.architecture, Architecture::GptOss, "{at}");
            assert_eq!(s.attention.sliding_window, vec![Some(5), None], "{at}: sliding layers first");
            assert!(s.attention.sinks, "{at}");
            assert_eq!(s.attention.rope_style, RopeStyle::HalfSplit, "{at}");
            let y = s.attention.rope_scaling.expect("YaRN");
            assert_eq!((y.factor, y.original_context, y.truncate), (8.0, 256, false), "{at}");
            assert!((y.attention_factor - yarn_mscale(8.0, 1.0)).abs() < 1e-12, "{at}");
            let moe = s.moe.expect("experts");
            assert_eq!(moe.routing, Routing::TopKSoftmax { top_k: 2 }, "{at}");
            assert_eq!(moe.activation, Activation::ClampedSwiGlu { alpha: 1.702, limit: 7.0 }, "{at}");
            assert_eq!((moe.experts, moe.expert_ffn), (4, 64), "{at}");
            assert_eq!(s.moe_layers, vec![true, true], "{at}");
        }
    }

    fn fixture(name: &str) -> std::path::PathBuf {
        std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures").join(name)
    }

    #[test]
    fn kimi_linear_reads_the_same_from_config_json_and_from_its_gguf_keys() {
        // config.json as transformers saves it (`layer_types`, `linear_attn_config`, Kimi's key
        // spellings); the GGUF as llama.cpp's converter writes it (zeros in head_count_kv).
        for path in [fixture("kimi_linear"), fixture("kimi_linear/model.gguf")] {
            let at = path.display();
            let s = ModelSpec::read(&ModelFile::open(&path).unwrap()).unwrap();
            assert_eq!(s.architecture, Architecture::KimiLinear, "{at}");
            let kda = s.kda.as_ref().expect("KDA layers");
            assert_eq!((kda.heads, kda.head_dim, kda.conv_kernel, &kda.layers[..]), (4, 8, 4, &[0, 1, 3][..]), "{at}");
            assert!(s.is_kda(0) && !s.is_kda(2), "{at}");
            let mla = s.attention.mla.expect("latent attention");
            assert!(mla.nope && mla.q_lora_rank.is_none(), "{at}");
            let widths = (mla.kv_lora_rank, mla.qk_nope_head_dim, mla.qk_rope_head_dim, mla.v_head_dim);
            assert_eq!(widths, (16, 16, 8, 16), "{at}");
            assert_eq!((s.attention.heads, s.attention.kv_heads, s.attention.rope_scaling), (4, 1, None), "{at}");
            assert_eq!((s.context_length, s.ffn), (1048576, 64), "{at}: model_max_length, intermediate_size");
            let moe = s.moe.expect("experts");
            let routing = Routing::GroupedSigmoid { top_k: 2, groups: 1, top_groups: 1, normalize: true, scale: 2.5 };
            assert_eq!(
                (moe.experts, moe.routing, moe.expert_ffn, moe.shared_expert_ffn),
                (8, routing, 16, Some(16)),
                "{at}"
            );
            assert_eq!(s.moe_layers, vec![false, true, true, true], "{at}: the first layer is dense");
        }
    }

    #[test]
    fn kimi_k3_reads_its_text_config_and_names_its_extra_parts() {
        let s = ModelSpec::read(&ModelFile::open(&fixture("kimi_k3")).unwrap()).unwrap();
        assert_eq!(s.architecture, Architecture::KimiK3);
        assert_eq!((s.hidden_size, s.layers, s.vocab_size, s.attn_res_block), (32, 6, 256, Some(2)));
        let kda = s.kda.as_ref().expect("KDA layers");
        assert_eq!(&kda.layers[..], &[0, 1, 2, 4]);
        assert_eq!((kda.gate_lower_bound, kda.full_rank_output_gate), (Some(-5.0), true));
        let mla = s.attention.mla.expect("latent attention");
        assert!(mla.nope && mla.output_gate && mla.q_lora_rank == Some(16));
        let situ = Activation::Situ { beta: 4.0, linear_beta: Some(25.0) };
        assert_eq!(s.ffn_activation, situ);
        let moe = s.moe.expect("experts");
        assert_eq!((moe.experts, moe.expert_ffn, moe.shared_expert_ffn, moe.activation), (8, 8, Some(16), situ));
        assert_eq!(moe.latent, Some(LatentSpec { width: 16, norm: true }));
        assert_eq!(s.moe_layers, vec![false, true, true, true, true, true]);
    }

    fn kda_of(config: &str) -> Result<KdaSpec> {
        kda_from_hf(&serde_json::from_str(config).unwrap(), std::path::Path::new("/m/config.json"), 4)
    }

    #[test]
    fn kda_layers_come_from_the_checkpoints_1_based_lists_or_transformers_default() {
        // Kimi-Linear-48B's own config.json has only linear_attn_config, numbered from 1.
        let k = kda_of(
            r#"{"linear_attn_config": {"kda_layers": [1, 3, 4], "full_attn_layers": [2], "num_heads": 2,
               "head_dim": 8, "short_conv_kernel_size": 3}}"#,
        )
        .unwrap();
        let want = KdaSpec {
            heads: 2,
            head_dim: 8,
            conv_kernel: 3,
            layers: vec![0, 2, 3],
            gate_lower_bound: None,
            full_rank_output_gate: false,
        };
        assert_eq!(k, want);
        // Neither: every 4th layer after the first is full attention (KimiLinearConfig).
        let k = kda_of(r#"{"linear_num_heads": 2, "linear_head_dim": 8}"#).unwrap();
        assert_eq!(k.layers, vec![0, 1, 2, 3]);
        let k = kda_from_hf(&serde_json::json!({}), std::path::Path::new("c"), 9).unwrap();
        assert_eq!((k.heads, k.head_dim, k.conv_kernel, k.layers), (32, 128, 4, vec![0, 1, 2, 3, 5, 6, 7]));
    }

    #[test]
    fn an_unknown_layer_kind_or_a_layer_of_no_kind_is_refused_naming_the_config() {
        let err = kda_of(r#"{"layer_types": ["linear_attention", "mamba", "full_attention", "linear_attention"]}"#)
            .unwrap_err()
            .to_string();
        assert!(err.contains("/m/config.json") && err.contains("layer 1") && err.contains("\"mamba\""), "{err}");
        let err = kda_of(r#"{"linear_attn_config": {"kda_layers": [1, 2], "full_attn_layers": [4]}}"#)
            .unwrap_err()
            .to_string();
        assert!(err.contains("/m/config.json") && err.contains("layer 3 is in neither"), "{err}");
        let err = kda_of(r#"{"linear_attn_config": {"kda_layers": [1, 2, 3], "full_attn_layers": [5]}}"#)
            .unwrap_err()
            .to_string();
        assert!(err.contains("names layer 5"), "{err}");
        let err = kda_of(r#"{"mla_use_nope": false}"#).unwrap_err().to_string();
        assert!(err.contains("mla_use_nope"), "{err}");
        // And through a whole load: the fixture with one layer renamed to an unknown kind.
        let dir = tempfile::tempdir().unwrap();
        for f in ["model.safetensors", "config.json"] {
            std::fs::copy(fixture("kimi_linear").join(f), dir.path().join(f)).unwrap();
        }
        let config = std::fs::read_to_string(dir.path().join("config.json")).unwrap();
        let config = config.replacen("\"full_attention\"", "\"sliding_attention\"", 1);
        std::fs::write(dir.path().join("config.json"), config).unwrap();
        let err = crate::spec::test_files::load_error(dir.path()).expect("an unknown layer kind");
        assert!(err.contains("config.json") && err.contains("sliding_attention"), "{err}");
    }

    fn yarn(config: &str) -> Option<Yarn> {
        yarn_from_hf(&serde_json::from_str(config).unwrap(), std::path::Path::new("config.json")).unwrap()
    }

    /// A GGUF holding only `metadata`.
    fn gguf_with(dir: &std::path::Path, metadata: &[(&str, candle_core::quantized::gguf_file::Value)]) -> GgufFile {
        // A new file each time: an earlier one may still be mapped.
        static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let path = dir.join(format!("meta{}.gguf", N.fetch_add(1, std::sync::atomic::Ordering::Relaxed)));
        let metadata: Vec<(String, _)> = metadata.iter().map(|(k, v)| (k.to_string(), v.clone())).collect();
        nightmail_formats::gguf_write::write_gguf(&path, &metadata, &[], 32, |_, _| Ok(())).unwrap();
        GgufFile::open(&path).unwrap()
    }

    #[test]
    fn a_head_count_the_weights_do_not_have_is_refused_without_reserving_it() {
        use candle_core::quantized::gguf_file::Value;

        use nightmail_formats::gguf_write::{TensorHeader, write_gguf};
        // KDA's convolution must be sized from the tensors, not reserved by heads × head size ×
        // kernel from the metadata (2^26 heads would be 48 GB).
        let src = GgufFile::open(&fixture("kimi_linear/model.gguf")).unwrap();
        let mut metadata: Vec<(String, Value)> = src.metadata().iter().map(|(k, v)| (k.clone(), v.clone())).collect();
        let heads = metadata.iter_mut().find(|(k, _)| k == "kimi-linear.attention.head_count").expect("a head count");
        heads.1 = Value::U32(1 << 26);
        let tensors = src.all_tensors().unwrap();
        let headers: Vec<TensorHeader> =
            tensors.iter().map(|t| TensorHeader::new(&t.name, t.dtype, &t.shape)).collect();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("model.gguf");
        write_gguf(&path, &metadata, &headers, 32, |i, w| w.write_all(tensors[i].bytes)).unwrap();
        let err = crate::spec::test_files::load_error(&path).expect("2^26 heads");
        assert!(err.contains("has shape"), "{err}");
    }

    #[test]
    fn an_embedding_of_no_dimensions_is_no_vocabulary() {
        use candle_core::quantized::gguf_file::Value;

        use nightmail_formats::gguf_write::{TensorHeader, write_gguf};
        // With no `vocab_size` key the vocabulary is the embedding's first dimension, which a
        // tensor of no dimensions does not have.
        let metadata: Vec<(String, Value)> = [
            ("general.architecture", Value::String("llama".into())),
            ("llama.embedding_length", Value::U32(64)),
            ("llama.block_count", Value::U32(1)),
            ("llama.attention.head_count", Value::U32(4)),
            ("llama.context_length", Value::U32(128)),
            ("llama.attention.layer_norm_rms_epsilon", Value::F32(1e-5)),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("model.gguf");
        let scalar = TensorHeader::new("token_embd.weight", nightmail_tensor::WeightDType::F32, &[]);
        write_gguf(&path, &metadata, &[scalar], 32, |_, w| w.write_all(&[0; 4])).unwrap();
        let err = from_gguf(&GgufFile::open(&path).unwrap()).expect_err("no vocabulary").to_string();
        assert!(err.contains("vocab_size"), "{err}");
    }

    #[test]
    fn sizes_the_graph_divides_by_are_refused_when_zero_or_inconsistent() {
        use candle_core::quantized::gguf_file::Value;
        let dir = tempfile::tempdir().unwrap();
        let file = std::cell::Cell::new(0);
        let model = |layers: u32, heads: u32, kv_heads: u32| {
            let meta: Vec<(String, Value)> = [
                ("general.architecture", Value::String("llama".into())),
                ("llama.embedding_length", Value::U32(64)),
                ("llama.block_count", Value::U32(layers)),
                ("llama.attention.head_count", Value::U32(heads)),
                ("llama.attention.head_count_kv", Value::U32(kv_heads)),
                ("llama.context_length", Value::U32(128)),
                ("llama.attention.layer_norm_rms_epsilon", Value::F32(1e-5)),
                ("llama.vocab_size", Value::U32(32)),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect();
            let tensor = nightmail_formats::gguf_write::TensorHeader::new(
                "blk.0.attn_norm.weight",
                nightmail_tensor::WeightDType::F32,
                &[64],
            );
            file.set(file.get() + 1);
            let path = dir.path().join(format!("{}.gguf", file.get()));
            nightmail_formats::gguf_write::write_gguf(&path, &meta, &[tensor], 32, |_, w| w.write_all(&[0; 256]))
                .unwrap();
            from_gguf(&GgufFile::open(&path).unwrap()).and_then(|spec| spec.check().map(|()| spec))
        };
        let llama = |heads, kv_heads| model(1, heads, kv_heads);
        // A head count of 0 would divide the hidden size by zero, and a block count of four
        // billion would size a per-layer list before any tensor is looked at.
        let err = model(4_000_000_000, 4, 2).expect_err("more layers than tensors").to_string();
        assert!(err.contains("`llama.block_count` as 4000000000, but the model holds 1 tensors"), "{err}");
        let err = llama(0, 1).expect_err("no heads").to_string();
        assert!(err.contains("`llama.attention.head_count` as 0"), "{err}");
        let err = llama(4, 0).expect_err("no key/value heads").to_string();
        assert!(err.contains("key/value heads") && err.contains("as 0"), "{err}");
        let err = llama(4, 3).expect_err("3 key/value heads for 4").to_string();
        assert!(err.contains("does not divide 4 attention heads"), "{err}");
        assert!(llama(4, 2).is_ok());
    }

    #[test]
    fn yarn_reads_llama_cpp_keys_with_ggml_defaults_and_deepseek2_log_multiplier() {
        use candle_core::quantized::gguf_file::Value;
        let dir = tempfile::tempdir().unwrap();
        let yarn = |arch: &str, extra: &[(&str, Value)]| {
            let key = |k: &str| format!("{arch}.rope.scaling.{k}");
            let (t, f, o) = (key("type"), key("factor"), key("original_context_length"));
            let mut meta = vec![
                (t.as_str(), Value::String("yarn".into())),
                (f.as_str(), Value::F32(32.0)),
                (o.as_str(), Value::U32(4096)),
            ];
            meta.extend(extra.iter().cloned());
            yarn_from_gguf(&gguf_with(dir.path(), &meta), arch).unwrap().unwrap()
        };
        // gpt-oss as its converter writes it: betas given, ggml's own attention factor.
        let g = yarn("gpt-oss", &[("gpt-oss.rope.scaling.yarn_beta_fast", Value::F32(16.0))]);
        assert_eq!((g.factor, g.original_context, g.beta_fast, g.beta_slow), (32.0, 4096, 16.0, 1.0));
        assert!((g.attention_factor - (0.1 * 32f64.ln() + 1.0)).abs() < 1e-6);
        assert_eq!(g.softmax_factor(), 1.0);
        // deepseek2: log multiplier 0.1 · mscale_all_dim; cos/sin unscaled.
        let d = yarn("deepseek2", &[("deepseek2.rope.scaling.yarn_log_multiplier", Value::F32(0.1))]);
        assert_eq!(d.attention_factor, 1.0);
        let m = 0.1 * 32f64.ln() + 1.0;
        assert!((d.softmax_factor() - m * m).abs() < 1e-6);
        let none = gguf_with(dir.path(), &[("llama.rope.scaling.type", Value::String("none".into()))]);
        assert_eq!(yarn_from_gguf(&none, "llama").unwrap(), None);
        let linear = gguf_with(dir.path(), &[("llama.rope.scaling.type", Value::String("linear".into()))]);
        assert!(yarn_from_gguf(&linear, "llama").is_err());
    }

    #[test]
    fn yarn_reads_transformers_4_and_5_spellings_with_the_reference_defaults() {
        // DeepSeek-V3's config.json (transformers 4 spelling): mscale over mscale_all_dim is 1.
        let v4 = yarn(
            r#"{"max_position_embeddings": 163840, "rope_theta": 10000, "rope_scaling": {"type": "yarn",
               "factor": 40, "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0,
               "original_max_position_embeddings": 4096}}"#,
        )
        .unwrap();
        assert_eq!((v4.factor, v4.original_context, v4.truncate), (40.0, 4096, true));
        assert_eq!(v4.attention_factor, 1.0);
        let m = 0.1 * 40f64.ln() + 1.0;
        assert!((v4.softmax_factor() - m * m).abs() < 1e-12);
        // gpt-oss (transformers 5): no mscale, so 0.1·ln(factor) + 1 on cos/sin; no truncation.
        let v5 = yarn(
            r#"{"max_position_embeddings": 131072, "rope_parameters": {"rope_type": "yarn", "rope_theta": 150000,
               "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0, "truncate": false,
               "original_max_position_embeddings": 4096}}"#,
        )
        .unwrap();
        assert!(!v5.truncate);
        assert!((v5.attention_factor - (0.1 * 32f64.ln() + 1.0)).abs() < 1e-12);
        assert_eq!(v5.softmax_factor(), 1.0);
        assert_eq!(yarn(r#"{"rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}}"#), None);
        assert_eq!(yarn(r#"{"rope_theta": 10000.0, "rope_scaling": null}"#), None);
    }
}
