//! What a model is, read from its own metadata (GGUF keys or `config.json`), never from a table
//! of known sizes. Both transformers 4 and 5 spellings are accepted (`rope_theta` or
//! `rope_parameters.rope_theta`, `num_experts` or `num_local_experts`).

use serde::Serialize;
use serde_json::Value as Json;

use crate::error::{EngineError, Result};
use crate::format::{Checkpoint, GgufFile, HfDir};

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
}

impl Routing {
    pub fn top_k(&self) -> usize {
        match self {
            Routing::SoftmaxTopK { top_k, .. } | Routing::TopKSoftmax { top_k } => *top_k,
        }
    }
}

/// The gated activation inside an expert's feed-forward.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Activation {
    /// `silu(gate) ⊙ up` (Shazeer, arXiv 2002.05202).
    SwiGlu,
    /// gpt-oss's: the gate clamped from above at `limit`, the up projection to ±`limit`, then
    /// `gate · σ(alpha · gate) · (up + 1)` (transformers `GptOssExperts`, openai/gpt-oss
    /// `swiglu`).
    ClampedSwiGlu { alpha: f32, limit: f32 },
}

impl Activation {
    /// gpt-oss's defaults (transformers' `swiglu_alpha`, `swiglu_limit`), which llama.cpp builds
    /// into its graph.
    const GPT_OSS_ALPHA: f32 = 1.702;
    const GPT_OSS_LIMIT: f32 = 7.0;
}

#[derive(Debug, Clone, Serialize)]
pub struct AttentionSpec {
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub rope_theta: f64,
    pub rope_style: RopeStyle,
    /// Per layer: attend to at most this many previous positions (Mistral's sliding window).
    pub sliding_window: Vec<Option<usize>>,
    /// A learned per-head logit that joins each softmax and is dropped after it (gpt-oss's
    /// attention sinks; Xiao et al., arXiv 2309.17453).
    pub sinks: bool,
}

#[derive(Debug, Clone, Serialize)]
pub struct MoeSpec {
    pub experts: usize,
    pub routing: Routing,
    pub expert_ffn: usize,
    /// Qwen-MoE's always-on shared expert, scaled by its own sigmoid gate.
    pub shared_expert_ffn: Option<usize>,
    pub activation: Activation,
}

/// A model's shape and parts.
#[derive(Debug, Clone, Serialize)]
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
    pub bos_token: Option<u32>,
    pub eos_tokens: Vec<u32>,
}

impl ModelSpec {
    pub(crate) fn read(ck: &Checkpoint) -> Result<Self> {
        let mut spec = match ck {
            Checkpoint::Gguf(g) => from_gguf(g)?,
            Checkpoint::Hf(h) => from_hf(h)?,
        };
        spec.moe_layers = (0..spec.layers)
            .map(|l| ck.tensor(&format!("blk.{l}.ffn_gate_inp.weight")).map(|t| t.is_some()))
            .collect::<Result<_>>()?;
        if spec.moe.is_none() && spec.moe_layers.iter().any(|m| *m) {
            return Err(EngineError::MissingMetadata { key: "expert count (the file has router weights)".into() });
        }
        Ok(spec)
    }
}

fn missing(key: &str) -> EngineError {
    EngineError::MissingMetadata { key: key.to_string() }
}

fn from_gguf(g: &GgufFile) -> Result<ModelSpec> {
    let arch_name = g.string("general.architecture").ok_or_else(|| missing("general.architecture"))?.to_string();
    let key = |k: &str| format!("{arch_name}.{k}");
    let need = |k: &str| g.uint(&key(k)).map(|v| v as usize).ok_or_else(|| missing(&key(k)));
    let experts = g.uint(&key("expert_count")).unwrap_or(0) as usize;
    let architecture = match (arch_name.as_str(), experts) {
        ("llama", 0) => Architecture::Llama,
        ("llama", _) => Architecture::Mixtral,
        ("qwen2moe", _) => Architecture::Qwen2Moe,
        ("qwen3moe", _) => Architecture::Qwen3Moe,
        ("gpt-oss", _) => Architecture::GptOss,
        (other, _) => return Err(EngineError::UnsupportedArchitecture(other.to_string())),
    };
    let hidden_size = need("embedding_length")?;
    let layers = need("block_count")?;
    let heads = need("attention.head_count")?;
    let head_dim = g.uint(&key("attention.key_length")).map(|v| v as usize).unwrap_or(hidden_size / heads);
    if let Some(scaling) = g.string(&key("rope.scaling.type")).filter(|s| *s != "none") {
        return Err(EngineError::Unsupported {
            what: format!("rope scaling `{scaling}`"),
            hint: "this engine implements plain RoPE; use a model without rope scaling".into(),
        });
    }
    let window = g.uint(&key("attention.sliding_window")).map(|v| v as usize).filter(|w| *w > 0);
    let sliding_window = (0..layers)
        .map(|l| match architecture {
            // GGUF has no per-layer list: llama.cpp's `set_swa_pattern(2)` for gpt-oss makes the
            // even layers sliding and the odd ones full, as transformers' default `layer_types`.
            Architecture::GptOss => window.filter(|_| l % 2 == 0),
            _ => window,
        })
        .collect();
    let vocab_size = match g.uint(&key("vocab_size")) {
        Some(v) => v as usize,
        None => g.tensor_shape("token_embd.weight").map(|s| s[0]).ok_or_else(|| missing("vocab_size"))?,
    };
    let moe = if experts > 0 {
        let top_k = need("expert_used_count")?;
        // llama.cpp's build_moe_ffn: Mixtral and Qwen3-MoE renormalize, Qwen2-MoE does not.
        let default_norm = !matches!(architecture, Architecture::Qwen2Moe);
        let normalize = g.boolean(&key("expert_weights_norm")).unwrap_or(default_norm);
        let expert_ffn = g.uint(&key("expert_feed_forward_length")).map(|v| v as usize);
        let (routing, activation) = match architecture {
            // llama.cpp's converter writes no limit for gpt-oss (its graph has 7.0 built in);
            // read one if a file carries it.
            Architecture::GptOss => (
                Routing::TopKSoftmax { top_k },
                Activation::ClampedSwiGlu {
                    alpha: Activation::GPT_OSS_ALPHA,
                    limit: g.float(&key("swiglu_limit")).map_or(Activation::GPT_OSS_LIMIT, |v| v as f32),
                },
            ),
            _ => (Routing::SoftmaxTopK { top_k, normalize }, Activation::SwiGlu),
        };
        Some(MoeSpec {
            experts,
            routing,
            activation,
            expert_ffn: match expert_ffn {
                Some(f) => f,
                None => need("feed_forward_length")?,
            },
            shared_expert_ffn: g.uint(&key("expert_shared_feed_forward_length")).map(|v| v as usize).filter(|v| *v > 0),
        })
    } else {
        None
    };
    let mut eos_tokens = Vec::new();
    for k in ["tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"] {
        if let Some(id) = g.uint(k).map(|id| id as u32).filter(|id| !eos_tokens.contains(id)) {
            eos_tokens.push(id);
        }
    }
    Ok(ModelSpec {
        architecture,
        vocab_size,
        hidden_size,
        layers,
        ffn: g.uint(&key("feed_forward_length")).unwrap_or(0) as usize,
        rms_norm_eps: g
            .float(&key("attention.layer_norm_rms_epsilon"))
            .ok_or_else(|| missing(&key("attention.layer_norm_rms_epsilon")))?,
        context_length: need("context_length")?,
        attention: AttentionSpec {
            heads,
            kv_heads: g.uint(&key("attention.head_count_kv")).map(|v| v as usize).unwrap_or(heads),
            head_dim,
            rope_theta: g.float(&key("rope.freq_base")).unwrap_or(10000.0),
            rope_style: match architecture {
                Architecture::Llama | Architecture::Mixtral => RopeStyle::Interleaved,
                Architecture::Qwen2Moe | Architecture::Qwen3Moe | Architecture::GptOss => RopeStyle::HalfSplit,
            },
            sliding_window,
            sinks: architecture == Architecture::GptOss,
        },
        moe,
        moe_layers: Vec::new(),
        bos_token: g.uint("tokenizer.ggml.bos_token_id").map(|v| v as u32),
        eos_tokens,
    })
}

fn from_hf(h: &HfDir) -> Result<ModelSpec> {
    let c = h.config();
    let path = h.dir().join("config.json");
    let get = |k: &str| c.get(k).filter(|v| !v.is_null());
    let uint = |k: &str| get(k).and_then(Json::as_u64).map(|v| v as usize);
    let need = |k: &str| {
        uint(k).ok_or_else(|| EngineError::BadConfig {
            path: path.clone(),
            reason: format!("`{k}` is missing or not a number"),
        })
    };
    let model_type = get("model_type").and_then(Json::as_str).unwrap_or_default();
    let architecture = match model_type {
        "llama" => Architecture::Llama,
        "mixtral" => Architecture::Mixtral,
        "qwen2_moe" => Architecture::Qwen2Moe,
        "qwen3_moe" => Architecture::Qwen3Moe,
        "gpt_oss" => Architecture::GptOss,
        other => return Err(EngineError::UnsupportedArchitecture(other.to_string())),
    };
    let hidden_size = need("hidden_size")?;
    let layers = need("num_hidden_layers")?;
    let heads = need("num_attention_heads")?;
    // transformers 5 moved rope settings into `rope_parameters`; 4 had `rope_theta` + `rope_scaling`.
    let rope = get("rope_parameters");
    let rope_type = rope
        .and_then(|r| r.get("rope_type"))
        .or_else(|| get("rope_scaling").and_then(|r| r.get("rope_type").or_else(|| r.get("type"))))
        .and_then(Json::as_str)
        .unwrap_or("default");
    if rope_type != "default" {
        return Err(EngineError::Unsupported {
            what: format!("rope_type `{rope_type}`"),
            hint: "this engine implements plain RoPE; use a model without rope scaling".into(),
        });
    }
    let rope_theta =
        rope.and_then(|r| r.get("rope_theta")).or_else(|| get("rope_theta")).and_then(Json::as_f64).unwrap_or(10000.0);
    // Mixtral: `sliding_window` (null or 0 = none) on every layer. Qwen-MoE: only with
    // `use_sliding_window`, and only from `max_window_layers` on (transformers' layer_types).
    let window = uint("sliding_window").filter(|w| *w > 0);
    let sliding_window = (0..layers)
        .map(|l| match architecture {
            Architecture::Mixtral => window,
            Architecture::Qwen2Moe | Architecture::Qwen3Moe => {
                let on = get("use_sliding_window").and_then(Json::as_bool).unwrap_or(false);
                let from = uint("max_window_layers").unwrap_or(0);
                window.filter(|_| on && l >= from)
            }
            Architecture::Llama => None,
            // gpt-oss names each layer's kind in `layer_types`; transformers' default alternates,
            // sliding first.
            Architecture::GptOss => {
                let kind = get("layer_types").and_then(|t| t.get(l)).and_then(Json::as_str);
                let sliding = kind.map_or(l % 2 == 0, |k| k == "sliding_attention");
                window.filter(|_| sliding)
            }
        })
        .collect();
    let experts = uint("num_local_experts").or_else(|| uint("num_experts")).unwrap_or(0);
    let moe = if experts > 0 && architecture != Architecture::Llama {
        let top_k = need("num_experts_per_tok")?;
        let normalize = match architecture {
            Architecture::Mixtral => true,
            _ => get("norm_topk_prob").and_then(Json::as_bool).unwrap_or(false),
        };
        let (routing, activation) = match architecture {
            Architecture::GptOss => (
                Routing::TopKSoftmax { top_k },
                Activation::ClampedSwiGlu {
                    alpha: get("swiglu_alpha").and_then(Json::as_f64).map_or(Activation::GPT_OSS_ALPHA, |v| v as f32),
                    limit: get("swiglu_limit").and_then(Json::as_f64).map_or(Activation::GPT_OSS_LIMIT, |v| v as f32),
                },
            ),
            _ => (Routing::SoftmaxTopK { top_k, normalize }, Activation::SwiGlu),
        };
        Some(MoeSpec {
            experts,
            routing,
            activation,
            expert_ffn: uint("moe_intermediate_size").map_or_else(|| need("intermediate_size"), Ok)?,
            shared_expert_ffn: uint("shared_expert_intermediate_size").filter(|v| *v > 0),
        })
    } else {
        None
    };
    let generation = crate::format::read_json_opt(&h.dir().join("generation_config.json"));
    let ids = |v: Option<&Json>| -> Vec<u32> {
        match v {
            Some(Json::Number(n)) => n.as_u64().map(|v| vec![v as u32]).unwrap_or_default(),
            Some(Json::Array(a)) => a.iter().filter_map(Json::as_u64).map(|v| v as u32).collect(),
            _ => Vec::new(),
        }
    };
    let mut eos_tokens = ids(get("eos_token_id"));
    for id in ids(generation.as_ref().and_then(|g| g.get("eos_token_id"))) {
        if !eos_tokens.contains(&id) {
            eos_tokens.push(id);
        }
    }
    Ok(ModelSpec {
        architecture,
        vocab_size: need("vocab_size")?,
        hidden_size,
        layers,
        ffn: uint("intermediate_size").unwrap_or(0),
        rms_norm_eps: get("rms_norm_eps").and_then(Json::as_f64).unwrap_or(1e-6),
        context_length: uint("max_position_embeddings").unwrap_or(4096),
        attention: AttentionSpec {
            heads,
            kv_heads: uint("num_key_value_heads").unwrap_or(heads),
            head_dim: uint("head_dim").unwrap_or(hidden_size / heads),
            rope_theta,
            rope_style: RopeStyle::HalfSplit,
            sliding_window,
            sinks: architecture == Architecture::GptOss,
        },
        moe,
        moe_layers: Vec::new(),
        bos_token: ids(get("bos_token_id")).first().copied(),
        eos_tokens,
    })
}
