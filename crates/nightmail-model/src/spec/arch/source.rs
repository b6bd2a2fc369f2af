//! The keys every architecture reads the same way, from a GGUF (`{arch}.*`, as llama.cpp's
//! converter writes them) or from `config.json` (transformers' names, 4 and 5 spellings).

use crate::error::ModelError;
use nightmail_formats::FormatError;
use std::path::PathBuf;

use candle_core::quantized::gguf_file::Value;
use serde_json::Value as Json;

use super::{is_latent, missing, rope, row};
use crate::error::Result;
use crate::spec::{Activation, Architecture, AttentionSpec, ModelSpec, RopeStyle};
use nightmail_formats::{GgufFile, HfDir};

/// A GGUF and its `general.architecture` name, which prefixes its keys.
pub(super) struct Gguf<'a> {
    pub g: &'a GgufFile,
    pub arch: &'a str,
    pub architecture: Architecture,
}

impl<'a> Gguf<'a> {
    pub fn new(g: &'a GgufFile, arch: &'a str, architecture: Architecture) -> Self {
        Gguf { g, arch, architecture }
    }

    pub fn key(&self, k: &str) -> String {
        format!("{}.{k}", self.arch)
    }

    pub fn uint(&self, k: &str) -> Option<usize> {
        self.g.uint(&self.key(k)).map(|v| v as usize)
    }

    pub fn float(&self, k: &str) -> Option<f64> {
        self.g.float(&self.key(k))
    }

    pub fn boolean(&self, k: &str) -> Option<bool> {
        self.g.boolean(&self.key(k))
    }

    /// A key llama.cpp's converters write as one value or as one per layer (`[v] * block_count`,
    /// `add_swiglu_clamp_exp`): the value all layers share, where `counts` says which entries
    /// count (an expert width of 0 marks a dense layer). Layers that differ are refused: the spec
    /// holds one value.
    pub fn per_layer(&self, k: &str, counts: impl Fn(f64) -> bool) -> Result<Option<f64>> {
        let key = self.key(k);
        let number = |v: &Value| -> Option<f64> {
            match v {
                Value::F32(x) => Some(*x as f64),
                Value::F64(x) => Some(*x),
                other => nightmail_formats::gguf_value_as_u64(other).map(|x| x as f64),
            }
        };
        let bad = |reason: String| ModelError::from(FormatError::BadMetadata { key: key.clone(), reason });
        let Some(value) = self.g.value(&key) else { return Ok(None) };
        let Value::Array(list) = value else {
            return number(value).map(Some).ok_or_else(|| bad("as something other than a number".into()));
        };
        let mut shared = None;
        for (layer, v) in list.iter().enumerate() {
            let v = number(v).ok_or_else(|| bad(format!("with layer {layer} not a number")))?;
            match shared {
                _ if !counts(v) => {}
                None => shared = Some(v),
                Some(s) if s == v => {}
                Some(s) => {
                    return Err(FormatError::Unsupported {
                        what: format!("`{key}` differing between layers ({s} and {v} at layer {layer})"),
                        hint: "nightmail reads one value for all layers; convert with a config that gives one".into(),
                    }
                    .into());
                }
            }
        }
        Ok(shared)
    }

    /// A size the graph divides by or counts with: 0 is a corrupt file, not a model.
    pub fn need(&self, k: &str) -> Result<usize> {
        match self.uint(k) {
            Some(0) => Err(FormatError::BadMetadata { key: self.key(k), reason: "as 0".into() }.into()),
            Some(v) => Ok(v),
            None => Err(missing(&self.key(k))),
        }
    }

    /// What every architecture's GGUF gives the same way: sizes, norms, rotary base, the
    /// uniform sliding window, the tokens; grouped-query attention with full heads unless the
    /// architecture's reader says otherwise.
    pub fn base(&self) -> Result<ModelSpec> {
        let g = self.g;
        let hidden_size = self.need("embedding_length")?;
        let blocks = layers_within(self.need("block_count")?, g.tensor_count(), &self.key("block_count"))?;
        let layers = if row(self.architecture).gguf_mtp_in_blocks {
            let nextn = self.uint("nextn_predict_layers").unwrap_or(0);
            if nextn >= blocks {
                let reason = format!("as {nextn}, with {blocks} blocks in all");
                return Err(FormatError::BadMetadata { key: self.key("nextn_predict_layers"), reason }.into());
            }
            blocks - nextn
        } else {
            blocks
        };
        let heads = self.need("attention.head_count")?;
        let head_dim = self.uint("attention.key_length").unwrap_or(hidden_size / heads);
        let rope_dim = if is_latent(self.architecture) { head_dim } else { rope::rope_dim_from_gguf(self, head_dim)? };
        let window = self.uint("attention.sliding_window").filter(|w| *w > 0);
        let vocab_size = match self.uint("vocab_size") {
            Some(v) => v,
            // A corrupt shape may have no dimensions at all.
            None => g
                .tensor_shape("token_embd.weight")
                .and_then(|s| s.first().copied())
                .ok_or_else(|| missing("vocab_size"))?,
        };
        let mut eos_tokens = Vec::new();
        for k in ["tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"] {
            if let Some(id) = g.uint(k).map(|id| id as u32).filter(|id| !eos_tokens.contains(id)) {
                eos_tokens.push(id);
            }
        }
        let eps = "attention.layer_norm_rms_epsilon";
        let kv_heads = self.uint("attention.head_count_kv").unwrap_or(heads);
        let rope_theta = self.float("rope.freq_base").unwrap_or(10000.0);
        Ok(ModelSpec {
            vocab_size,
            hidden_size,
            layers,
            ffn: self.uint("feed_forward_length").unwrap_or(0),
            rms_norm_eps: self.float(eps).ok_or_else(|| missing(&self.key(eps)))?,
            context_length: self.need("context_length")?,
            mtp_layers: blocks - layers,
            mtp_key: self.key("nextn_predict_layers"),
            bos_token: g.uint("tokenizer.ggml.bos_token_id").map(|v| v as u32),
            eos_tokens,
            ..plain(self.architecture, grouped(heads, kv_heads, head_dim, rope_dim, rope_theta, vec![window; layers]))
        })
    }
}

/// A Hugging Face directory's text-model settings (`text_config` where the checkpoint nests
/// them, as Kimi K3's does).
pub(super) struct Hf<'a> {
    pub h: &'a HfDir,
    pub c: &'a Json,
    pub path: PathBuf,
    pub model_type: &'a str,
    pub architecture: Architecture,
}

impl<'a> Hf<'a> {
    pub fn new(h: &'a HfDir, model_type: &'a str, architecture: Architecture) -> Self {
        Hf { h, c: h.text_config(), path: h.dir().join("config.json"), model_type, architecture }
    }

    /// A key, null as absent; Kimi Linear's checkpoints spell some keys their own way
    /// (transformers' `KimiLinearConfig.attribute_map`), and either spelling is read.
    pub fn get(&self, k: &str) -> Option<&'a Json> {
        let alias = match k {
            "max_position_embeddings" => Some("model_max_length"),
            "norm_topk_prob" => Some("moe_renormalize"),
            "n_group" => Some("num_expert_group"),
            "num_experts_per_tok" => Some("num_experts_per_token"),
            "n_shared_experts" => Some("num_shared_experts"),
            _ => None,
        };
        let c = self.c;
        c.get(k).filter(|v| !v.is_null()).or_else(|| alias.and_then(|a| c.get(a)).filter(|v| !v.is_null()))
    }

    pub fn uint(&self, k: &str) -> Option<usize> {
        self.get(k).and_then(Json::as_u64).map(|v| v as usize)
    }

    pub fn float(&self, k: &str) -> Option<f64> {
        self.get(k).and_then(Json::as_f64)
    }

    pub fn boolean(&self, k: &str) -> Option<bool> {
        self.get(k).and_then(Json::as_bool)
    }

    pub fn need(&self, k: &str) -> Result<usize> {
        self.uint(k).ok_or_else(|| self.bad(format!("`{k}` is missing or not a number")))
    }

    pub fn bad(&self, reason: String) -> ModelError {
        ModelError::from(FormatError::BadConfig { path: self.path.clone(), reason })
    }

    /// What every architecture's config.json gives the same way (see `Gguf::base`).
    pub fn base(&self) -> Result<ModelSpec> {
        let hidden_size = self.need("hidden_size")?;
        let layers = layers_within(self.need("num_hidden_layers")?, self.h.tensor_count(), "num_hidden_layers")?;
        let heads = self.need("num_attention_heads")?;
        // transformers 5 moved rope settings into `rope_parameters`; 4 had `rope_theta`.
        let rope_theta = (self.get("rope_parameters").and_then(|r| r.get("rope_theta")))
            .or_else(|| self.get("rope_theta"))
            .and_then(Json::as_f64)
            .unwrap_or(10000.0);
        let head_dim = self.uint("head_dim").unwrap_or(hidden_size / heads);
        let rope_dim =
            if is_latent(self.architecture) { head_dim } else { rope::rope_dim_from_hf(self, head_dim, 1.0)? };
        let generation = nightmail_formats::read_json_opt(&self.h.dir().join("generation_config.json"));
        let ids = |v: Option<&Json>| -> Vec<u32> {
            match v {
                Some(Json::Number(n)) => n.as_u64().map(|v| vec![v as u32]).unwrap_or_default(),
                Some(Json::Array(a)) => a.iter().filter_map(Json::as_u64).map(|v| v as u32).collect(),
                _ => Vec::new(),
            }
        };
        let mut eos_tokens = ids(self.get("eos_token_id"));
        for id in ids(generation.as_ref().and_then(|g| g.get("eos_token_id"))) {
            if !eos_tokens.contains(&id) {
                eos_tokens.push(id);
            }
        }
        let kv_heads = self.uint("num_key_value_heads").unwrap_or(heads);
        let attention = grouped(heads, kv_heads, head_dim, rope_dim, rope_theta, vec![None; layers]);
        Ok(ModelSpec {
            vocab_size: self.need("vocab_size")?,
            hidden_size,
            layers,
            ffn: self.uint("intermediate_size").unwrap_or(0),
            rms_norm_eps: self.float("rms_norm_eps").unwrap_or(1e-6),
            context_length: self.uint("max_position_embeddings").unwrap_or(4096),
            // transformers' DeepseekV3Config says 1 whether or not the checkpoint holds the
            // layer: the MTP's load looks for its tensors.
            mtp_layers: self.uint("num_nextn_predict_layers").unwrap_or(0),
            mtp_key: "num_nextn_predict_layers".into(),
            bos_token: ids(self.get("bos_token_id")).first().copied(),
            eos_tokens,
            ..plain(self.architecture, attention)
        })
    }
}

/// Grouped-query attention over `sliding_window`, rotating half-split pairs, without YaRN,
/// sinks, latents or gates: what an architecture's reader starts from.
fn grouped(
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
    rope_dim: usize,
    rope_theta: f64,
    sliding_window: Vec<Option<usize>>,
) -> AttentionSpec {
    AttentionSpec {
        heads,
        kv_heads,
        head_dim,
        rope_dim,
        rope_theta,
        rope_style: RopeStyle::HalfSplit,
        rope_scaling: None,
        sliding_window,
        sinks: false,
        mla: None,
        output_gate: false,
    }
}

/// `attention` and SwiGLU feed-forwards with no other part, its sizes still to be given.
fn plain(architecture: Architecture, attention: AttentionSpec) -> ModelSpec {
    ModelSpec {
        architecture,
        vocab_size: 0,
        hidden_size: 0,
        layers: 0,
        ffn: 0,
        rms_norm_eps: 0.0,
        context_length: 0,
        attention,
        moe: None,
        moe_layers: Vec::new(),
        kda: None,
        ffn_activation: Activation::SwiGlu,
        attn_res_block: None,
        delta_net: None,
        deepseek_v4: None,
        sparse_attention: None,
        zero_centered_norms: false,
        mtp_layers: 0,
        mtp_key: String::new(),
        bos_token: None,
        eos_tokens: Vec::new(),
    }
}

/// A layer holds at least one tensor: a layer count past the file's tensor count is corrupt, and
/// is refused before anything is sized by it (a block count of four billion would otherwise
/// size a per-layer list of 64 GB).
pub(super) fn layers_within(layers: usize, tensors: usize, key: &str) -> Result<usize> {
    if layers > tensors {
        let reason = format!("as {layers}, but the model holds {tensors} tensors");
        return Err(FormatError::BadMetadata { key: key.into(), reason }.into());
    }
    Ok(layers)
}
