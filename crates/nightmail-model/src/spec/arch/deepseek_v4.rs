//! DeepSeek-V4 (transformers 5.24 `DeepseekV4ForCausalLM`, model_type `deepseek_v4`; llama.cpp
//! `deepseek4`) and what it adds to the spec: manifold-constrained hyper-connections, per-layer
//! attention kinds (sliding-window MQA alone, or beside heavily-compressed or compressed-sparse
//! entries), the grouped output projection and the hash-routed MoE layers. Keys and defaults as
//! `DeepseekV4Config` reads them; the GGUF as llama.cpp's deepseek4 loader reads it.

use nightmail_formats::FormatError;
use std::path::Path;

use serde::Serialize;
use serde_json::Value as Json;

use super::Row;
use super::moe::{MoeKeys, Scoring};
use super::rope::{yarn_from_gguf, yarn_from_parameters};
use super::source::{Gguf, Hf};
use crate::error::{ModelError, Result};
use crate::spec::{Activation, Architecture, ModelSpec, MoeSpec, RopeStyle, Routing, Yarn};
use candle_core::quantized::gguf_file::Value;
use nightmail_formats::GgufFile;
use nightmail_formats::gguf_value_as_u64 as value_as_u64;

pub(super) const ROW: Row = Row {
    architecture: Architecture::DeepseekV4,
    gguf: &["deepseek4"],
    gguf_experts: None,
    gguf_mtp_in_blocks: false,
    hf: &["deepseek_v4"],
    hf_classes: &[],
    read_gguf,
    read_hf,
};

/// `DeepseekV4Config`'s defaults, which DeepSeek's released configs also give: one shared
/// expert, routed weights times 1.5, the SwiGLU clamped at 10; for a config.json or a GGUF
/// (`expert_shared_count`, `expert_weights_scale`, `swiglu_clamp_exp`) that omits them.
const SHARED_EXPERTS: usize = 1;
const ROUTED_SCALE: f32 = 1.5;
const SWIGLU_LIMIT: f64 = 10.0;

/// Sqrt-softplus scores, renormalized over the chosen, times the routed scale
/// (`DeepseekV4TopKRouter`; llama.cpp's gating function 4); hash-routed layers take the same
/// weights (`DeepseekV4HashRouter`).
fn moe(k: MoeKeys, activation: Activation) -> Result<MoeSpec> {
    k.expect_scoring(
        Scoring::SqrtSoftplus,
        Scoring::SqrtSoftplus,
        "nightmail runs DeepSeek-V4's sqrtsoftplus routing",
    )?;
    let routing = Routing::SqrtSoftplus { top_k: k.top_k, scale: k.scale.unwrap_or(ROUTED_SCALE) };
    Ok(k.spec(routing, k.deepseek_shared(SHARED_EXPERTS), activation))
}

/// What both formats share once the V4 parts are read: the sliding window and rotary are the
/// V4 attention's own (`DeepseekV4Spec`), and its weights rotate adjacent pairs (transformers
/// `apply_rotary_pos_emb_interleave`, llama.cpp's NORM rope).
fn with_v4_parts(mut s: ModelSpec, v4: DeepseekV4Spec, limit: f64, moe_keys: Option<MoeKeys>) -> Result<ModelSpec> {
    s.attention.rope_style = RopeStyle::Interleaved;
    s.attention.rope_dim = v4.rope_dim;
    s.attention.sliding_window = vec![None; s.layers];
    s.ffn_activation = Activation::ClampedSilu { limit: limit as f32 };
    s.moe = moe_keys.map(|k| moe(k, s.ffn_activation)).transpose()?;
    s.deepseek_v4 = Some(v4);
    Ok(s)
}

fn read_gguf(g: &Gguf) -> Result<ModelSpec> {
    let s = g.base()?;
    let v4 = from_gguf(g.g, g.arch, s.layers)?;
    // llama.cpp's `swiglu_clamp_exp`, one per layer as its converter writes it; the shared
    // expert's `swiglu_clamp_shexp` defaults to it, and nightmail clamps both alike.
    let limit = g.per_layer("swiglu_clamp_exp", |_| true)?.unwrap_or(SWIGLU_LIMIT);
    if let Some(shared) = g.per_layer("swiglu_clamp_shexp", |_| true)?
        && shared != limit
    {
        return Err(FormatError::Unsupported {
            what: format!("a shared expert clamped at {shared} beside routed experts clamped at {limit}"),
            hint: "nightmail clamps the shared and routed experts' SwiGLU alike".into(),
        }
        .into());
    }
    let keys = g.moe_keys()?;
    with_v4_parts(s, v4, limit, keys)
}

fn read_hf(h: &Hf) -> Result<ModelSpec> {
    let s = h.base()?;
    let v4 = from_hf(h.c, &h.path, s.layers, h.need("head_dim")?)?;
    let limit = h.float("swiglu_limit").unwrap_or(SWIGLU_LIMIT);
    let keys = h.moe_keys()?;
    with_v4_parts(s, v4, limit, keys)
}

/// How a DeepSeek-V4 layer attends (`layer_types`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum V4AttentionKind {
    /// `sliding_attention`: the last `sliding_window` positions only.
    Sliding,
    /// `heavily_compressed_attention` (HCA, paper §2.3.2): plus one compressed entry per
    /// `rate` positions, all of them.
    HeavilyCompressed { rate: usize },
    /// `compressed_sparse_attention` (CSA, paper §2.3.1): plus overlapping compressed entries
    /// every `rate` positions, of which the Lightning Indexer keeps the best `index_topk`.
    CompressedSparse { rate: usize },
}

/// DeepSeek-V4's parts beyond the shared attention and MoE spec.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DeepseekV4Spec {
    /// Residual streams per token (`hc_mult`), mixed by Sinkhorn-projected matrices.
    pub hc_mult: usize,
    pub hc_sinkhorn_iters: usize,
    pub hc_eps: f32,
    pub kinds: Vec<V4AttentionKind>,
    /// Per layer: whether its experts are chosen by the token id (`mlp_layer_types` `hash_moe`).
    pub hash_layers: Vec<bool>,
    pub sliding_window: usize,
    pub q_lora_rank: usize,
    /// The rotated width at the end of each head (`qk_rope_head_dim`).
    pub rope_dim: usize,
    /// The rotary base of the compressed layers and their compressors (`compress_rope_theta`).
    pub compress_rope_theta: f64,
    /// YaRN on that rotary only (the sliding layers keep the plain one), without YaRN's
    /// magnitude factor on cos and sin: `DeepseekV4Config.__post_init__` sets the compress
    /// entry's `attention_factor` to 1, as the V4 reference multiplies by nothing.
    pub compress_rope_scaling: Option<Yarn>,
    pub o_groups: usize,
    pub o_lora_rank: usize,
    pub index_heads: usize,
    pub index_head_dim: usize,
    pub index_topk: usize,
}

impl DeepseekV4Spec {
    /// Width of the hyper-connection mix row: pre and post weights and the `hc × hc` matrix.
    pub fn hc_mix(&self) -> usize {
        (2 + self.hc_mult) * self.hc_mult
    }
}

/// The V4 keys of `config.json` (`c`), with `DeepseekV4Config.__post_init__`'s defaults and
/// legacy spellings (`compress_ratios`, `num_hash_layers`).
pub(in crate::spec) fn from_hf(c: &Json, path: &Path, layers: usize, head_dim: usize) -> Result<DeepseekV4Spec> {
    let bad = |reason: String| ModelError::from(FormatError::BadConfig { path: path.to_path_buf(), reason });
    let get = |k: &str| c.get(k).filter(|v| !v.is_null());
    let uint = |k: &str, default: usize| -> Result<usize> {
        match get(k) {
            None => Ok(default),
            Some(v) => Ok(v.as_u64().map(|n| n as usize).ok_or_else(|| bad(format!("`{k}` is {v}, not a number")))?),
        }
    };
    let rates = get("compress_rates");
    let rate = |kind: &str, default: usize| -> Result<usize> {
        match rates.and_then(|r| r.get(kind)) {
            None => Ok(default),
            Some(v) => Ok(v
                .as_u64()
                .filter(|n| *n > 0)
                .map(|n| n as usize)
                .ok_or_else(|| bad(format!("`compress_rates.{kind}` is {v}, not a positive number")))?),
        }
    };
    let (csa, hca) = (rate("compressed_sparse_attention", 4)?, rate("heavily_compressed_attention", 128)?);
    let kind_of = |name: &str| match name {
        "sliding_attention" => Ok(V4AttentionKind::Sliding),
        "compressed_sparse_attention" => Ok(V4AttentionKind::CompressedSparse { rate: csa }),
        "heavily_compressed_attention" => Ok(V4AttentionKind::HeavilyCompressed { rate: hca }),
        other => Err(bad(format!("`layer_types` names `{other}`, not a DeepSeek-V4 attention kind"))),
    };
    let kinds: Vec<V4AttentionKind> = match get("layer_types") {
        Some(Json::Array(a)) if a.len() >= layers => {
            a[..layers].iter().map(|v| kind_of(v.as_str().unwrap_or_default())).collect::<Result<_>>()?
        }
        Some(v) => return Err(bad(format!("`layer_types` is {v}: one entry per layer ({layers})"))),
        // The default: two HCA layers, then CSA and HCA alternating.
        None => (0..layers)
            .map(|l| match l {
                _ if l < 2 || l % 2 == 0 => V4AttentionKind::HeavilyCompressed { rate: hca },
                _ => V4AttentionKind::CompressedSparse { rate: csa },
            })
            .collect(),
    };
    let hash_layers: Vec<bool> = match get("mlp_layer_types") {
        Some(Json::Array(a)) if a.len() >= layers => a[..layers]
            .iter()
            .map(|v| match v.as_str() {
                Some("hash_moe") => Ok(true),
                Some("moe") => Ok(false),
                _ => Err(bad(format!("`mlp_layer_types` names {v}: `hash_moe` or `moe`"))),
            })
            .collect::<Result<_>>()?,
        Some(v) => {
            return Err(bad(format!("`mlp_layer_types` is {v}: one entry per layer ({layers})")));
        }
        None => {
            let hashed = uint("num_hash_layers", 3)?;
            (0..layers).map(|l| l < hashed).collect()
        }
    };
    let rope_dim = match (get("qk_rope_head_dim"), get("partial_rotary_factor").and_then(Json::as_f64)) {
        (Some(v), _) => v.as_u64().map(|n| n as usize).ok_or_else(|| bad(format!("`qk_rope_head_dim` is {v}")))?,
        (None, Some(f)) => (head_dim as f64 * f) as usize,
        (None, None) => head_dim / 8,
    };
    if rope_dim > head_dim || rope_dim % 2 == 1 {
        return Err(bad(format!("the rotated width {rope_dim} does not fit heads of {head_dim} in pairs")));
    }
    // `DeepseekV4Config` nests `rope_parameters` as {main, compress} (what it saves); a flat
    // `rope_parameters`, or the released configs' `rope_scaling`, is the compress rotary's, with
    // `attention_factor` 1 unless given (its `__post_init__`). DeepSeek's own inference/model.py
    // (`precompute_freqs_cis`) blends YaRN's frequencies and leaves cos and sin at magnitude 1.
    let compress = get("rope_parameters").and_then(|r| r.get("compress")).filter(|r| r.is_object());
    let flat =
        ["rope_parameters", "rope_scaling"].into_iter().find_map(|k| Some((k, get(k).filter(|v| v.is_object())?)));
    let compress_rope_scaling = match (compress, flat) {
        (Some(r), _) => compress_yarn(r, "rope_parameters.compress", c, path)?,
        (None, Some((key, r))) => {
            let mut r = r.clone();
            if let Some(o) = r.as_object_mut() {
                o.entry("attention_factor").or_insert(1.0.into());
            }
            compress_yarn(&r, key, c, path)?
        }
        (None, None) => None,
    };
    let compress_rope_theta = compress
        .and_then(|r| r.get("rope_theta"))
        .or_else(|| get("compress_rope_theta"))
        .and_then(Json::as_f64)
        .unwrap_or(160000.0);
    let positive = |k: &str, default: usize| -> Result<usize> {
        let v = uint(k, default)?;
        if v == 0 {
            return Err(bad(format!("`{k}` is 0")));
        }
        Ok(v)
    };
    Ok(DeepseekV4Spec {
        hc_mult: positive("hc_mult", 4)?,
        hc_sinkhorn_iters: positive("hc_sinkhorn_iters", 20)?,
        hc_eps: get("hc_eps").and_then(Json::as_f64).unwrap_or(1e-6) as f32,
        kinds,
        hash_layers,
        sliding_window: positive("sliding_window", 128)?,
        q_lora_rank: positive("q_lora_rank", 1024)?,
        rope_dim,
        compress_rope_theta,
        compress_rope_scaling,
        o_groups: positive("o_groups", 8)?,
        o_lora_rank: positive("o_lora_rank", 1024)?,
        index_heads: positive("index_n_heads", 64)?,
        index_head_dim: positive("index_head_dim", 128)?,
        index_topk: positive("index_topk", 512)?,
    })
}

/// The compressed branches' YaRN from the rope-parameters object at `key` of `config.json`;
/// a rotary kind other than default or YaRN is refused with the key and the file.
fn compress_yarn(r: &Json, key: &str, c: &Json, path: &Path) -> Result<Option<Yarn>> {
    match r.get("rope_type").or_else(|| r.get("type")).and_then(Json::as_str) {
        None | Some("default" | "yarn") => yarn_from_parameters(r, c, path),
        Some(other) => Err(FormatError::Unsupported {
            what: format!("`{key}.rope_type` `{other}` in {}", path.display()),
            hint: "nightmail runs DeepSeek-V4's compressed branches with the default rotary or YaRN".into(),
        }
        .into()),
    }
}

/// The V4 keys of a GGUF as llama.cpp's deepseek4 loader reads them (src/models/deepseek4.cpp
/// `load_arch_hparams`; key names from src/llama-arch.cpp): a layer's kind from its
/// `attention.compress_ratios` entry (0 sliding; 4 compressed-sparse, with the indexer, as the
/// loader's `coff = ratio == 4 ? 2 : 1` has it; any other heavily-compressed), the first
/// `hash_layer_count` layers hash-routed.
pub(in crate::spec) fn from_gguf(g: &GgufFile, arch: &str, layers: usize) -> Result<DeepseekV4Spec> {
    let key = |k: &str| format!("{arch}.{k}");
    let need = |k: &str| -> Result<usize> {
        match g.uint(&key(k)) {
            Some(0) => Err(FormatError::BadMetadata { key: key(k), reason: "as 0".into() }.into()),
            Some(v) => Ok(v as usize),
            None => Err(FormatError::MissingMetadata { key: key(k) }.into()),
        }
    };
    let ratios_key = key("attention.compress_ratios");
    let ratios: Vec<usize> = match g.value(&ratios_key) {
        Some(Value::Array(a)) if a.len() >= layers => {
            a[..layers].iter().map(|v| value_as_u64(v).map(|v| v as usize)).collect::<Option<_>>().ok_or_else(|| {
                FormatError::BadMetadata { key: ratios_key.clone(), reason: "holds a non-integer".into() }
            })?
        }
        Some(_) => {
            return Err(FormatError::BadMetadata {
                key: ratios_key,
                reason: format!("is not an array of one ratio per layer ({layers})"),
            }
            .into());
        }
        None => return Err(FormatError::MissingMetadata { key: ratios_key }.into()),
    };
    let kinds = ratios
        .iter()
        .map(|&rate| match rate {
            0 => V4AttentionKind::Sliding,
            4 => V4AttentionKind::CompressedSparse { rate },
            _ => V4AttentionKind::HeavilyCompressed { rate },
        })
        .collect();
    let hashed = g.uint(&key("hash_layer_count")).unwrap_or(0) as usize;
    // llama.cpp's deepseek4 (src/models/deepseek4.cpp, `build_attention_impl`) rotates the
    // compressed layers with the shared `rope.scaling.*` YaRN (type, factor,
    // original_context_length, yarn_beta_fast/slow) on `attention.compress_rope_freq_base`, and
    // the sliding layers without it. Its `dsv4_rope_attn_factor` divides ggml's YaRN magnitude
    // back out whatever `yarn_attn_factor` says: cos and sin stay at magnitude 1.
    let compress_rope_scaling = yarn_from_gguf(g, arch)?.map(|y| Yarn { attention_factor: 1.0, ..y });
    Ok(DeepseekV4Spec {
        hc_mult: need("hyper_connection.count")?,
        hc_sinkhorn_iters: need("hyper_connection.sinkhorn_iterations")?,
        hc_eps: g.float(&key("hyper_connection.epsilon")).unwrap_or(1e-6) as f32,
        kinds,
        hash_layers: (0..layers).map(|l| l < hashed).collect(),
        sliding_window: need("attention.sliding_window")?,
        q_lora_rank: need("attention.q_lora_rank")?,
        rope_dim: need("rope.dimension_count")?,
        compress_rope_theta: g.float(&key("attention.compress_rope_freq_base")).unwrap_or(160000.0),
        compress_rope_scaling,
        o_groups: need("attention.output_group_count")?,
        o_lora_rank: need("attention.output_lora_rank")?,
        index_heads: need("attention.indexer.head_count")?,
        index_head_dim: need("attention.indexer.key_length")?,
        index_topk: need("attention.indexer.top_k")?,
    })
}

#[cfg(test)]
mod tests {
    use crate::spec::test_files::{fixture, renamed};
    use crate::spec::{Activation, Architecture, ModelSpec, Routing, V4AttentionKind};
    use nightmail_formats::ModelFile;

    #[test]
    fn the_fixture_reads_as_its_config_says() {
        let s = ModelSpec::read(&ModelFile::open(&fixture("deepseek_v4")).unwrap()).unwrap();
        assert_eq!(s.architecture, Architecture::DeepseekV4);
        let v4 = s.deepseek_v4.expect("V4 parts");
        use V4AttentionKind::*;
        assert_eq!(v4.kinds, [Sliding, CompressedSparse { rate: 4 }, HeavilyCompressed { rate: 8 }]);
        assert_eq!((v4.hash_layers, v4.hc_mult, v4.rope_dim, v4.sliding_window), (vec![true, false, false], 4, 8, 8));
        assert_eq!((v4.index_heads, v4.index_head_dim, v4.index_topk, v4.o_groups), (4, 12, 3, 2));
        // YaRN on the compress rotary alone (`rope_parameters.compress`), without the magnitude
        // factor; the sliding layers' main rotary stays plain.
        let y = v4.compress_rope_scaling.expect("YaRN on the compressed branches");
        assert_eq!((y.factor, y.original_context, y.attention_factor), (4.0, 16, 1.0));
        assert_eq!(s.attention.rope_scaling, None);
        let m = s.moe.expect("experts");
        assert_eq!(
            (m.routing, m.activation),
            (Routing::SqrtSoftplus { top_k: 2, scale: 1.5 }, Activation::ClampedSilu { limit: 0.4 })
        );
        assert_eq!(s.moe_layers, [true, true, true]);
    }

    #[test]
    fn the_compress_yarn_reads_the_same_from_config_json_and_from_the_gguf() {
        let read = |p: &std::path::Path| {
            let s = ModelSpec::read(&ModelFile::open(p).unwrap()).unwrap();
            (s.deepseek_v4.expect("V4 parts").compress_rope_scaling, s.attention.rope_scaling)
        };
        let hf = read(&fixture("deepseek_v4"));
        assert!(hf.0.is_some());
        assert_eq!(hf, read(&fixture("deepseek_v4").join("model.gguf")));
    }

    #[test]
    fn the_released_configs_flat_rope_scaling_is_the_compress_rotarys_yarn_at_magnitude_one() {
        // DeepSeek-V4-Flash's config.json: YaRN under the legacy `rope_scaling`, the compress
        // base apart; `DeepseekV4Config.__post_init__` gives it `attention_factor` 1.
        let c = serde_json::json!({"rope_theta": 10000, "compress_rope_theta": 160000,
            "rope_scaling": {"type": "yarn", "factor": 16, "original_max_position_embeddings": 65536,
                             "beta_fast": 32, "beta_slow": 1}});
        let v4 = super::from_hf(&c, std::path::Path::new("config.json"), 4, 512).unwrap();
        let y = v4.compress_rope_scaling.expect("YaRN");
        assert_eq!((y.factor, y.original_context, y.beta_fast, y.beta_slow), (16.0, 65536, 32.0, 1.0));
        assert_eq!((y.attention_factor, v4.compress_rope_theta), (1.0, 160000.0));
    }

    #[test]
    fn a_compress_rotary_of_another_kind_is_refused_naming_the_key_and_the_file() {
        let (src, dir) = (fixture("deepseek_v4"), tempfile::tempdir().unwrap());
        let mut c: serde_json::Value =
            serde_json::from_slice(&std::fs::read(src.join("config.json")).unwrap()).unwrap();
        c["rope_parameters"]["compress"]["rope_type"] = "longrope".into();
        std::fs::write(dir.path().join("config.json"), serde_json::to_vec(&c).unwrap()).unwrap();
        std::fs::copy(src.join("model.safetensors"), dir.path().join("model.safetensors")).unwrap();
        let err = crate::spec::test_files::load_error(dir.path()).expect("refused");
        let config = dir.path().join("config.json");
        let want = format!("`rope_parameters.compress.rope_type` `longrope` in {}", config.display());
        assert!(err.starts_with(&want), "{err}");
    }

    /// The load error for the fixture with `from` renamed to `to` in its safetensors: it must
    /// name the tensor as the checkpoint spells it, llama.cpp-style, and the directory.
    fn missing(from: &str, to: &str, gguf: &str) {
        let dir = renamed("deepseek_v4", "model.safetensors", from, to);
        let err = crate::spec::test_files::load_error(dir.path()).expect("a tensor is missing");
        let want = format!("tensor `{from}` (GGUF `{gguf}`) is missing from {}", dir.path().display());
        assert!(err.starts_with(&want), "{err}");
    }

    #[test]
    fn a_missing_hash_table_indexer_compressor_or_hyper_connection_tensor_is_named_with_the_file() {
        missing("model.layers.0.ffn.gate.tid2eid", "model.layers.0.ffn.gate.tid2eix", "blk.0.ffn_gate_tid2eid.weight");
        missing(
            "model.layers.1.attn.indexer.wq_b.weight",
            "model.layers.1.attn.indexer.wq_x.weight",
            "blk.1.indexer.attn_q_b.weight",
        );
        missing(
            "model.layers.2.attn.compressor.ape",
            "model.layers.2.attn.compressor.apx",
            "blk.2.attn_compressor_ape.weight",
        );
        missing("model.layers.2.hc_ffn_fn", "model.layers.2.hc_ffn_fx", "blk.2.hc_ffn_fn.weight");
        missing("model.hc_head.hc_base", "model.hc_head.hc_basx", "output_hc_base.weight");
        // The GGUF names its own.
        for (from, to) in [
            ("blk.0.ffn_gate_tid2eid.weight", "blk.0.ffn_gate_tid2eix.weight"),
            ("blk.1.indexer_compressor_ape.weight", "blk.1.indexer_compressor_apx.weight"),
        ] {
            let dir = renamed("deepseek_v4", "model.gguf", from, to);
            let path = dir.path().join("model.gguf");
            let err = crate::spec::test_files::load_error(&path).expect("a tensor is missing");
            assert!(err.starts_with(&format!("tensor `{from}` is missing from {}", path.display())), "{err}");
        }
    }

    #[test]
    fn the_ggufs_i32_hash_table_reads_as_the_safetensors_i64_one() {
        // llama.cpp stores `tid2eid` as GGML_TYPE_I32 (26), as the fixture does: an index table,
        // read apart from the weights.
        let name = "blk.0.ffn_gate_tid2eid.weight";
        let gg = ModelFile::open(&fixture("deepseek_v4").join("model.gguf")).unwrap();
        assert!(gg.tensor(name).unwrap().is_none(), "an I32 table is no weight");
        let hf = ModelFile::open(&fixture("deepseek_v4")).unwrap();
        let (a, b) = (hf.index_table(name).unwrap().unwrap(), gg.index_table(name).unwrap().unwrap());
        assert_eq!(a, b);
        assert!(a.0.iter().any(|&e| e > 0));
    }

    #[test]
    fn the_gguf_reads_as_the_config_json() {
        let read = |p: std::path::PathBuf| ModelSpec::read(&ModelFile::open(&p).unwrap()).unwrap();
        let (hf, gg) = (read(fixture("deepseek_v4")), read(fixture("deepseek_v4").join("model.gguf")));
        assert_eq!((hf.deepseek_v4, hf.ffn_activation), (gg.deepseek_v4, gg.ffn_activation));
        let (a, b) = (hf.moe.unwrap(), gg.moe.unwrap());
        assert_eq!((a.routing, a.activation, a.shared_expert_ffn), (b.routing, b.activation, b.shared_expert_ffn));
        assert_eq!((hf.attention.heads, hf.attention.kv_heads, hf.attention.head_dim), (2, 1, 16));
        assert_eq!(
            (gg.attention.heads, gg.attention.kv_heads, gg.attention.head_dim, gg.attention.rope_theta),
            (2, 1, 16, hf.attention.rope_theta)
        );
    }

    /// The fixture with its config.json edited by `edit`: the load error.
    fn with_config(edit: impl Fn(&mut serde_json::Value)) -> (tempfile::TempDir, String) {
        let src = fixture("deepseek_v4");
        let dir = tempfile::tempdir().unwrap();
        std::fs::copy(src.join("model.safetensors"), dir.path().join("model.safetensors")).unwrap();
        let mut c: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(src.join("config.json")).unwrap()).unwrap();
        edit(&mut c);
        std::fs::write(dir.path().join("config.json"), c.to_string()).unwrap();
        let err = crate::spec::test_files::load_error(dir.path()).expect("the config is refused");
        (dir, err)
    }

    #[test]
    fn a_missing_or_unknown_config_key_is_named_with_the_file() {
        let (dir, err) = with_config(|c| {
            c.as_object_mut().unwrap().remove("head_dim");
        });
        let path = dir.path().join("config.json");
        assert!(err.contains("`head_dim` is missing") && err.contains(&path.display().to_string()), "{err}");
        let (dir, err) = with_config(|c| c["layer_types"][1] = "linear_attention".into());
        let path = dir.path().join("config.json");
        assert!(
            err.contains("`layer_types` names `linear_attention`") && err.contains(&path.display().to_string()),
            "{err}"
        );
        let (_, err) = with_config(|c| c["mlp_layer_types"] = serde_json::json!(["moe"]));
        assert!(err.contains("`mlp_layer_types`") && err.contains("one entry per layer (3)"), "{err}");
    }
}
