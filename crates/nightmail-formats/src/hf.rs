//! Hugging Face model directories: `config.json`, `*.safetensors` (sharded with
//! `model.safetensors.index.json`, or single), read in place. The safetensors header is parsed here
//! (format: an 8-byte little-endian header length, a JSON header, then the data), so tensors stay
//! views into the map.

use nightmail_tensor::TensorError;
use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use memmap2::Mmap;

use super::fused_experts::{FusedExpert, FusedSource, convert_layer};
use super::mxfp4_pair::Mxfp4Pair;
use crate::error::{FormatError, Result};
use crate::names::ExpertId;
use crate::names::ExpertMatrix;
use nightmail_tensor::TensorView;
use nightmail_tensor::WeightDType;

struct Shard {
    path: PathBuf,
    map: Mmap,
}

struct Entry {
    shard: usize,
    /// The safetensors dtype, as the header spells it (`F32`, `BF16`, `U8`...).
    dtype: String,
    shape: Vec<usize>,
    start: usize,
    end: usize,
}

pub struct HfDir {
    dir: PathBuf,
    config: serde_json::Value,
    shards: Vec<Shard>,
    tensors: HashMap<String, Entry>,
    /// Where the text model's tensors live in a multimodal checkpoint (whose config.json nests
    /// the text model under `text_config`).
    prefix: TextPrefix,
    /// Per layer, gpt-oss's fused experts rebuilt per expert on first use (None: not fused).
    fused: Vec<OnceLock<Option<Vec<FusedExpert>>>>,
    /// `num_hidden_layers`: the index a multi-token-prediction layer takes (`mtp_names`).
    layers: usize,
}

impl HfDir {
    pub fn open(dir: &Path) -> Result<Self> {
        let config = read_json(&dir.join("config.json"))?;
        let files = shard_files(dir)?;
        let mut shards = Vec::new();
        let mut tensors = HashMap::new();
        for path in files {
            let io = |source| FormatError::Io { path: path.clone(), source };
            let file = File::open(&path).map_err(io)?;
            // SAFETY: read-only map of a file we do not modify.
            let map = unsafe { Mmap::map(&file) }.map_err(io)?;
            parse_header(&path, &map, shards.len(), &mut tensors)?;
            shards.push(Shard { path, map });
        }
        let prefix = TextPrefix::of(&tensors);
        let count = tensors.len();
        let mut hf = HfDir { dir: dir.to_path_buf(), config, shards, tensors, prefix, fused: Vec::new(), layers: 0 };
        // A layer holds at least one tensor, so a count past that is a corrupt config (which the
        // spec refuses): nothing is sized by it here.
        let layers =
            hf.text_config().get("num_hidden_layers").and_then(serde_json::Value::as_u64).unwrap_or(0) as usize;
        hf.fused = (0..layers.min(count)).map(|_| OnceLock::new()).collect();
        hf.layers = layers;
        Ok(hf)
    }

    /// How many tensors the shards hold.
    pub fn tensor_count(&self) -> usize {
        self.tensors.len()
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn config(&self) -> &serde_json::Value {
        &self.config
    }

    /// The text model's settings: `text_config` where the checkpoint nests them, else the whole.
    pub fn text_config(&self) -> &serde_json::Value {
        self.config.get("text_config").filter(|t| t.is_object()).unwrap_or(&self.config)
    }

    /// A text-model tensor's name as the file spells it.
    fn stored(&self, hf_name: &str) -> String {
        self.prefix.apply(hf_name)
    }

    /// The entry of a text-model tensor (under the prefix), or of a tensor by its full name.
    fn entry(&self, hf_name: &str) -> Option<(String, &Entry)> {
        let stored = self.stored(hf_name);
        match self.tensors.get(&stored) {
            Some(e) => Some((stored, e)),
            None => self.tensors.get(hf_name).map(|e| (hf_name.to_string(), e)),
        }
    }

    fn view(&self, hf_name: &str) -> Result<Option<TensorView<'_>>> {
        let Some((name, e)) = self.entry(hf_name) else { return Ok(None) };
        let dtype = weight_dtype(&e.dtype)
            .ok_or_else(|| TensorError::UnsupportedDType { name: name.clone(), dtype: e.dtype.clone() })?;
        Ok(Some(TensorView {
            name,
            dtype,
            shape: e.shape.clone(),
            bytes: &self.shards[e.shard].map[e.start..e.end],
            scale: None,
        }))
    }

    /// A float tensor by its transformers name.
    pub fn float_tensor(&self, hf_name: &str) -> Result<Option<TensorView<'_>>> {
        self.view(hf_name)
    }

    /// Raw bytes of a `U8` tensor and its shape (the halves of an MXFP4 pair).
    fn u8_tensor(&self, hf_name: &str) -> Result<Option<(&[u8], &[usize])>> {
        let Some((name, e)) = self.entry(hf_name) else { return Ok(None) };
        if e.dtype != "U8" {
            return Err(TensorError::UnsupportedDType { name, dtype: e.dtype.clone() }.into());
        }
        Ok(Some((&self.shards[e.shard].map[e.start..e.end], &e.shape)))
    }

    /// The MXFP4 matrix stored as `{name}_blocks` and `{name}_scales` (gpt-oss's experts:
    /// `model.layers.L.mlp.experts.gate_up_proj`, `...down_proj`), if the model has both.
    pub fn mxfp4_pair(&self, name: &str) -> Result<Option<Mxfp4Pair<'_>>> {
        let (blocks, scales) = (format!("{name}_blocks"), format!("{name}_scales"));
        let (Some((b, b_shape)), Some((s, s_shape))) = (self.u8_tensor(&blocks)?, self.u8_tensor(&scales)?) else {
            return Ok(None);
        };
        Mxfp4Pair::new(name, b, b_shape, s, s_shape).map(Some)
    }

    /// An integer table by its GGUF name (DeepSeek-V4's `tid2eid`, stored as I64 or I32), as
    /// u32 values and its shape.
    pub fn index_table(&self, gguf_name: &str) -> Result<Option<(Vec<u32>, Vec<usize>)>> {
        for candidate in hf_names(gguf_name) {
            let Some((name, e)) = self.entry(&candidate) else { continue };
            let bytes = &self.shards[e.shard].map[e.start..e.end];
            let values: Vec<i64> = match e.dtype.as_str() {
                "I64" => bytes.chunks_exact(8).map(|b| i64::from_le_bytes(b.try_into().unwrap())).collect(),
                "I32" => bytes.chunks_exact(4).map(|b| i64::from(i32::from_le_bytes(b.try_into().unwrap()))).collect(),
                _ => return Err(TensorError::UnsupportedDType { name, dtype: e.dtype.clone() }.into()),
            };
            if values.len() != e.shape.iter().product::<usize>()
                || values.iter().any(|v| *v < 0 || *v > u32::MAX as i64)
            {
                return Err(FormatError::BadSafetensors {
                    path: self.dir.clone(),
                    reason: format!("tensor {name} is not a table of {:?} expert ids", e.shape),
                });
            }
            return Ok(Some((values.into_iter().map(|v| v as u32).collect(), e.shape.clone())));
        }
        Ok(None)
    }

    /// A tensor by its GGUF name, translated to the transformers name.
    pub fn tensor(&self, gguf_name: &str) -> Result<Option<TensorView<'_>>> {
        for candidate in hf_names(gguf_name).into_iter().chain(self.mtp_names(gguf_name)) {
            if let Some(v) = self.view(&candidate)? {
                return Ok(Some(v));
            }
        }
        Ok(None)
    }

    /// Where Qwen3-Next's and Qwen3.5's checkpoints keep their multi-token-prediction layer, as
    /// `blk.{num_hidden_layers}.*` translates (vLLM's qwen3_next_mtp.py; llama.cpp's
    /// conversion/qwen.py maps them to the same NEXTN names): its own parts `mtp.fc`,
    /// `mtp.pre_fc_norm_embedding`, `mtp.pre_fc_norm_hidden`, `mtp.norm`, its block `mtp.layers.0.`.
    fn mtp_names(&self, gguf_name: &str) -> Vec<String> {
        let Some((layer, tail)) = gguf_name.strip_prefix("blk.").and_then(|r| r.split_once('.')) else {
            return vec![];
        };
        if layer.parse::<usize>().ok() != Some(self.layers) {
            return vec![];
        }
        let own = match tail {
            "nextn.eh_proj.weight" => Some("fc"),
            "nextn.enorm.weight" => Some("pre_fc_norm_embedding"),
            "nextn.hnorm.weight" => Some("pre_fc_norm_hidden"),
            "nextn.shared_head_norm.weight" => Some("norm"),
            _ => None,
        };
        if let Some(own) = own {
            return vec![format!("mtp.{own}.weight")];
        }
        let block = format!("model.layers.{layer}.");
        hf_names(gguf_name)
            .into_iter()
            .filter_map(|n| n.strip_prefix(&block).map(|r| format!("mtp.layers.0.{r}")))
            .collect()
    }

    /// The transformers name a GGUF tensor name translates to, for messages: the first whose
    /// module holds other tensors in this file (Qwen3-Next's `linear_attn.A_log`, Kimi's
    /// `self_attn.A_log`), else the first.
    pub fn transformers_name(&self, gguf_name: &str) -> Option<String> {
        let names: Vec<String> = hf_names(gguf_name).into_iter().map(|n| self.stored(&n)).collect();
        let module = |n: &str| n.rsplit_once('.').map_or(String::new(), |(m, _)| format!("{m}."));
        let used = |n: &&String| self.tensors.keys().any(|k| k.starts_with(&module(n)));
        names.iter().find(used).or(names.first()).cloned()
    }

    pub fn expert_matrix(&self, id: ExpertId, which: ExpertMatrix) -> Result<TensorView<'_>> {
        let (l, e) = (id.layer, id.expert);
        // qwen2_moe / qwen3_moe (`mlp.experts.E.gate_proj`) and mixtral (`block_sparse_moe.experts.E.w1`,
        // w1 = gate, w3 = up, w2 = down, as in the Mixtral reference code).
        let (qwen, mixtral) = match which {
            ExpertMatrix::Gate => ("gate_proj", "w1"),
            ExpertMatrix::Up => ("up_proj", "w3"),
            ExpertMatrix::Down => ("down_proj", "w2"),
        };
        // DeepSeek-V4's checkpoints: `ffn.experts.E.w1` as Mixtral's.
        let names = [
            format!("model.layers.{l}.mlp.experts.{e}.{qwen}.weight"),
            format!("model.layers.{l}.block_sparse_moe.experts.{e}.{mixtral}.weight"),
            format!("model.layers.{l}.ffn.experts.{e}.{mixtral}.weight"),
            // Qwen3-Next's MTP layer (`mtp_names`).
            if l == self.layers { format!("mtp.layers.0.mlp.experts.{e}.{qwen}.weight") } else { String::new() },
        ];
        for name in &names {
            if let Some(v) = self.view(name)? {
                return Ok(v);
            }
        }
        if let Some(expert) = self.fused_expert(id)? {
            return Ok(expert.matrix(which).view());
        }
        // Named as the model spells its other experts (Kimi's and Mixtral's `block_sparse_moe`).
        let kimi = self.prefix.apply(&format!("model.layers.{l}.block_sparse_moe."));
        let v4 = self.prefix.apply(&format!("model.layers.{l}.ffn."));
        let spelled = match () {
            _ if self.tensors.keys().any(|n| n.starts_with(&kimi)) => &names[1],
            _ if self.tensors.keys().any(|n| n.starts_with(&v4)) => &names[2],
            _ => &names[0],
        };
        Err(FormatError::MissingTensorIn { name: format!("`{}`", self.stored(spelled)), path: self.dir.clone() })
    }

    /// The bias of one routed expert's matrix: only gpt-oss's fused experts have them.
    pub fn expert_bias(&self, id: ExpertId, which: ExpertMatrix) -> Result<Option<TensorView<'_>>> {
        Ok(self.fused_expert(id)?.and_then(|e| e.bias(which)).map(|b| b.view()))
    }

    fn fused_expert(&self, id: ExpertId) -> Result<Option<&FusedExpert>> {
        let Some(cell) = self.fused.get(id.layer) else { return Ok(None) };
        if cell.get().is_none() {
            // Two threads may convert the same layer at once; the first result is kept.
            let _ = cell.set(convert_layer(self, id.layer)?);
        }
        let experts = cell.get().expect("set above").as_ref();
        match experts {
            Some(list) => list.get(id.expert).map(Some).ok_or_else(|| FormatError::MissingTensor {
                name: format!("expert {} of layer {}", id.expert, id.layer),
            }),
            None => Ok(None),
        }
    }

    /// The shard file and byte offset of bytes borrowed from one of the maps.
    pub fn locate(&self, bytes: &[u8]) -> Option<(PathBuf, u64)> {
        self.shards.iter().find_map(|s| super::gguf::offset_in(&s.map, bytes).map(|o| (s.path.clone(), o)))
    }

    pub fn release_pages(&self) {
        self.shards.iter().for_each(|s| super::gguf::release(&s.map))
    }

    /// Every tensor; an MXFP4 pair is one MXFP4 tensor (its blocks' bytes; its scales are
    /// counted by the type's size, 17 bytes per 32 weights).
    pub fn all_tensors(&self) -> Result<Vec<TensorView<'_>>> {
        let mut names: Vec<&String> = self.tensors.keys().collect();
        names.sort();
        let mut out = Vec::with_capacity(names.len());
        for n in names {
            if let Some(base) = n.strip_suffix("_blocks")
                && let Some(pair) = self.mxfp4_pair(base)?
            {
                let bytes = self.u8_tensor(n)?.expect("listed tensor").0;
                out.push(TensorView {
                    name: base.to_string(),
                    dtype: WeightDType::Mxfp4,
                    shape: pair.shape,
                    bytes,
                    scale: None,
                });
                continue;
            }
            if n.strip_suffix("_scales").is_some_and(|base| self.tensors.contains_key(&format!("{base}_blocks"))) {
                continue;
            }
            // DeepSeek-V4's `tid2eid`: a table of expert ids, not a weight (`index_table`).
            if matches!(self.tensors[n].dtype.as_str(), "I64" | "I32") {
                continue;
            }
            out.push(self.view(n)?.expect("listed tensor"));
        }
        Ok(out)
    }
}

/// Where a checkpoint keeps its text model's tensors, which the engine names `model.…` and
/// `lm_head.…` as a text-only checkpoint does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum TextPrefix {
    /// A text-only checkpoint: as named.
    None,
    /// Kimi K3's `KimiK3ForConditionalGeneration`: everything under `language_model.`.
    Outer,
    /// Qwen3.5's `Qwen3_5MoeForConditionalGeneration` (Qwen3-VL's layout): `model.` becomes
    /// `model.language_model.`; `lm_head.` stays.
    Inner,
}

impl TextPrefix {
    fn of(tensors: &HashMap<String, Entry>) -> Self {
        if tensors.keys().any(|n| n.starts_with("language_model.")) {
            TextPrefix::Outer
        } else if tensors.keys().any(|n| n.starts_with("model.language_model.")) {
            TextPrefix::Inner
        } else {
            TextPrefix::None
        }
    }

    fn apply(self, name: &str) -> String {
        match (self, name.strip_prefix("model.")) {
            (TextPrefix::None, _) => name.to_string(),
            (TextPrefix::Outer, _) => format!("language_model.{name}"),
            (TextPrefix::Inner, Some(rest)) => format!("model.language_model.{rest}"),
            (TextPrefix::Inner, None) => name.to_string(),
        }
    }
}

impl FusedSource for HfDir {
    fn float_tensor(&self, hf_name: &str) -> Result<Option<TensorView<'_>>> {
        HfDir::float_tensor(self, hf_name)
    }

    fn mxfp4_pair(&self, name: &str) -> Result<Option<Mxfp4Pair<'_>>> {
        HfDir::mxfp4_pair(self, name)
    }
}

/// A JSON file that may be absent or unreadable (optional extras such as generation_config.json).
pub fn read_json_opt(path: &Path) -> Option<serde_json::Value> {
    read_json(path).ok()
}

pub fn read_json(path: &Path) -> Result<serde_json::Value> {
    let text = std::fs::read_to_string(path).map_err(|source| FormatError::Io { path: path.to_path_buf(), source })?;
    serde_json::from_str(&text).map_err(|e| FormatError::BadConfig { path: path.to_path_buf(), reason: e.to_string() })
}

/// The shards named by `model.safetensors.index.json`, else every `*.safetensors` in the directory.
fn shard_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let index = dir.join("model.safetensors.index.json");
    if index.is_file() {
        let json = read_json(&index)?;
        let map = json
            .get("weight_map")
            .and_then(|m| m.as_object())
            .ok_or_else(|| FormatError::BadConfig { path: index.clone(), reason: "no `weight_map` object".into() })?;
        let files: std::collections::BTreeSet<&str> = map.values().filter_map(|v| v.as_str()).collect();
        return Ok(files.into_iter().map(|f| dir.join(f)).collect());
    }
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|source| FormatError::Io { path: dir.to_path_buf(), source })?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
        .collect();
    files.sort();
    if files.is_empty() {
        return Err(FormatError::BadConfig { path: dir.to_path_buf(), reason: "no *.safetensors files".into() });
    }
    Ok(files)
}

#[derive(serde::Deserialize)]
struct HeaderEntry {
    dtype: String,
    shape: Vec<usize>,
    data_offsets: [usize; 2],
}

fn parse_header(path: &Path, map: &[u8], shard: usize, out: &mut HashMap<String, Entry>) -> Result<()> {
    let bad = |reason: String| FormatError::BadSafetensors { path: path.to_path_buf(), reason };
    let n = u64::from_le_bytes(map.get(..8).ok_or_else(|| bad("shorter than 8 bytes".into()))?.try_into().unwrap())
        as usize;
    let header = map.get(8..8 + n).ok_or_else(|| bad(format!("header of {n} bytes runs past the end")))?;
    let mut entries: BTreeMap<String, serde_json::Value> =
        serde_json::from_slice(header).map_err(|e| bad(format!("header is not JSON: {e}")))?;
    entries.remove("__metadata__");
    let data = 8 + n;
    for (name, value) in entries {
        let h: HeaderEntry = serde_json::from_value(value).map_err(|e| bad(format!("tensor {name}: {e}")))?;
        let (start, end) = (data + h.data_offsets[0], data + h.data_offsets[1]);
        if end > map.len() || start > end {
            return Err(FormatError::Truncated { name, path: path.to_path_buf(), end, len: map.len() });
        }
        let elems: usize = h.shape.iter().product();
        let expect = match (weight_dtype(&h.dtype), h.dtype.as_str()) {
            (Some(d), _) => Some(d.byte_len(elems)),
            (None, "U8") => Some(elems),
            _ => None,
        };
        if expect.is_some_and(|n| n != end - start) {
            return Err(bad(format!("tensor {name} has {} bytes for shape {:?}", end - start, h.shape)));
        }
        out.insert(name, Entry { shard, dtype: h.dtype, shape: h.shape, start, end });
    }
    Ok(())
}

/// The float types a safetensors header names that the engine computes with.
fn weight_dtype(name: &str) -> Option<WeightDType> {
    match name {
        "F32" => Some(WeightDType::F32),
        "F16" => Some(WeightDType::F16),
        "BF16" => Some(WeightDType::BF16),
        _ => None,
    }
}

/// The transformers names a GGUF tensor name can have (llama.cpp `gguf-py/gguf/tensor_mapping.py`).
fn hf_names(gguf: &str) -> Vec<String> {
    match gguf {
        "token_embd.weight" => return vec!["model.embed_tokens.weight".into()],
        "output_norm.weight" => return vec!["model.norm.weight".into()],
        "output.weight" => return vec!["lm_head.weight".into(), "head.weight".into()],
        // Kimi K3's AttnRes mix before the final norm.
        "output_res_norm.weight" => return vec!["model.output_attn_res_norm.weight".into()],
        "output_res_proj.weight" => return vec!["model.output_attn_res_proj.weight".into()],
        // DeepSeek-V4's checkpoint names: its head and the hyper-connection collapse before the norm.
        "output_hc_fn.weight" => return vec!["model.hc_head.hc_fn".into()],
        "output_hc_base.weight" => return vec!["model.hc_head.hc_base".into()],
        "output_hc_scale.weight" => return vec!["model.hc_head.hc_scale".into()],
        _ => {}
    }
    let Some(rest) = gguf.strip_prefix("blk.") else { return vec![] };
    let Some((layer, tail)) = rest.split_once('.') else { return vec![] };
    let p = format!("model.layers.{layer}.");
    let names: &[&str] = match tail {
        "attn_norm.weight" => &["input_layernorm.weight", "attn_norm.weight"],
        "ffn_norm.weight" => &["post_attention_layernorm.weight", "ffn_norm.weight"],
        "attn_sinks.weight" => &["self_attn.sinks", "attn.attn_sink"],
        // DeepSeek-V4 as its checkpoints name it (transformers' conversion mapping reads them):
        // the low-rank query, the one key/value head, the grouped output, the compressors, the
        // Lightning Indexer, the hyper-connection mixes and the hash table.
        "attn_kv.weight" => &["attn.wkv.weight"],
        "attn_output_a.weight" => &["attn.wo_a.weight"],
        "attn_output_b.weight" => &["attn.wo_b.weight"],
        "attn_compressor_kv.weight" => &["attn.compressor.wkv.weight"],
        "attn_compressor_gate.weight" => &["attn.compressor.wgate.weight"],
        "attn_compressor_ape.weight" => &["attn.compressor.ape"],
        "attn_compressor_norm.weight" => &["attn.compressor.norm.weight"],
        "indexer_compressor_kv.weight" => &["attn.indexer.compressor.wkv.weight"],
        "indexer_compressor_gate.weight" => &["attn.indexer.compressor.wgate.weight"],
        "indexer_compressor_ape.weight" => &["attn.indexer.compressor.ape"],
        "indexer_compressor_norm.weight" => &["attn.indexer.compressor.norm.weight"],
        "indexer.proj.weight" => &["attn.indexer.weights_proj.weight", "self_attn.indexer.weights_proj.weight"],
        "indexer.attn_q_b.weight" => &["attn.indexer.wq_b.weight", "self_attn.indexer.wq_b.weight"],
        // DeepSeek Sparse Attention's indexer (transformers `DeepseekV32Indexer`).
        "indexer.attn_k.weight" => &["self_attn.indexer.wk.weight"],
        "indexer.k_norm.weight" => &["self_attn.indexer.k_norm.weight"],
        "indexer.k_norm.bias" => &["self_attn.indexer.k_norm.bias"],
        "hc_attn_fn.weight" => &["hc_attn_fn"],
        "hc_attn_base.weight" => &["hc_attn_base"],
        "hc_attn_scale.weight" => &["hc_attn_scale"],
        "hc_ffn_fn.weight" => &["hc_ffn_fn"],
        "hc_ffn_base.weight" => &["hc_ffn_base"],
        "hc_ffn_scale.weight" => &["hc_ffn_scale"],
        "ffn_gate_tid2eid.weight" => &["ffn.gate.tid2eid"],
        "attn_q.weight" => &["self_attn.q_proj.weight"],
        "attn_k.weight" => &["self_attn.k_proj.weight"],
        "attn_v.weight" => &["self_attn.v_proj.weight"],
        "attn_output.weight" => &["self_attn.o_proj.weight"],
        "attn_q.bias" => &["self_attn.q_proj.bias"],
        "attn_k.bias" => &["self_attn.k_proj.bias"],
        "attn_v.bias" => &["self_attn.v_proj.bias"],
        "attn_output.bias" => &["self_attn.o_proj.bias"],
        "attn_q_norm.weight" => &["self_attn.q_norm.weight"],
        "attn_k_norm.weight" => &["self_attn.k_norm.weight"],
        // Kimi Linear's checkpoints keep every feed-forward under `block_sparse_moe` as
        // transformers saves them (its dense first layer too).
        "ffn_gate.weight" => &["mlp.gate_proj.weight", "block_sparse_moe.gate_proj.weight"],
        "ffn_up.weight" => &["mlp.up_proj.weight", "block_sparse_moe.up_proj.weight"],
        "ffn_down.weight" => &["mlp.down_proj.weight", "block_sparse_moe.down_proj.weight"],
        "ffn_gate_inp.weight" => {
            &["mlp.gate.weight", "block_sparse_moe.gate.weight", "mlp.router.weight", "ffn.gate.weight"]
        }
        "ffn_gate_inp.bias" => &["mlp.router.bias"],
        "ffn_gate_inp_shexp.weight" => &["mlp.shared_expert_gate.weight"],
        // Qwen2-MoE's `shared_expert`, DeepSeek's `shared_experts`.
        "ffn_gate_shexp.weight" => &[
            "mlp.shared_expert.gate_proj.weight",
            "mlp.shared_experts.gate_proj.weight",
            "block_sparse_moe.shared_experts.gate_proj.weight",
            "ffn.shared_experts.w1.weight",
        ],
        "ffn_up_shexp.weight" => &[
            "mlp.shared_expert.up_proj.weight",
            "mlp.shared_experts.up_proj.weight",
            "block_sparse_moe.shared_experts.up_proj.weight",
            "ffn.shared_experts.w3.weight",
        ],
        "ffn_down_shexp.weight" => &[
            "mlp.shared_expert.down_proj.weight",
            "mlp.shared_experts.down_proj.weight",
            "block_sparse_moe.shared_experts.down_proj.weight",
            "ffn.shared_experts.w2.weight",
        ],
        // DeepSeek's latent attention and router bias.
        "attn_q_a.weight" => &["self_attn.q_a_proj.weight", "attn.wq_a.weight"],
        "attn_q_a_norm.weight" => &["self_attn.q_a_layernorm.weight", "attn.q_norm.weight"],
        "attn_q_b.weight" => &["self_attn.q_b_proj.weight", "attn.wq_b.weight"],
        "attn_kv_a_mqa.weight" => &["self_attn.kv_a_proj_with_mqa.weight"],
        // DeepSeek-V4's key/value norm too (`attn.kv_norm`, saved by transformers as `attn.norm`).
        "attn_kv_a_norm.weight" => &["self_attn.kv_a_layernorm.weight", "attn.kv_norm.weight", "attn.norm.weight"],
        "attn_kv_b.weight" => &["self_attn.kv_b_proj.weight"],
        // MiniMax-M2 keeps its router's bias on the MoE block (`block_sparse_moe`, transformers
        // 5's in-memory `mlp`).
        "exp_probs_b.bias" => &[
            "mlp.gate.e_score_correction_bias",
            "block_sparse_moe.gate.e_score_correction_bias",
            "block_sparse_moe.e_score_correction_bias",
            "mlp.e_score_correction_bias",
            "ffn.gate.bias",
        ],
        // Kimi Linear's KDA layers, under llama.cpp's `kimi-linear` names. `ssm_a` is the same
        // parameter as `A_log` but stored as -exp(A_log) by llama.cpp's converter: the loader
        // converts by the file's format (nightmail-model/src/parts/kda.rs).
        "ssm_conv1d_q.weight" => &["self_attn.q_conv1d.weight"],
        // Qwen3-Next's and Qwen3.5's Gated DeltaNet (nightmail-model/src/parts/gated_delta_net.rs), under
        // llama.cpp's `qwen3next` / `qwen35moe` names; `ssm_in` and `ssm_ba` are transformers'
        // fused, per-key-head interleaved projections.
        "ssm_in.weight" => &["linear_attn.in_proj_qkvz.weight"],
        "ssm_ba.weight" => &["linear_attn.in_proj_ba.weight"],
        "ssm_alpha.weight" => &["linear_attn.in_proj_a.weight"],
        "ssm_out.weight" => &["linear_attn.out_proj.weight"],
        "ssm_conv1d_k.weight" => &["self_attn.k_conv1d.weight"],
        "ssm_conv1d_v.weight" => &["self_attn.v_conv1d.weight"],
        "ssm_f_a.weight" => &["self_attn.f_a_proj.weight", "self_attn.forget_gate.f_a_proj.weight"],
        "ssm_f_b.weight" => &["self_attn.f_b_proj.weight", "self_attn.forget_gate.f_b_proj.weight"],
        "ssm_dt.bias" => &["self_attn.dt_bias", "self_attn.forget_gate.dt_bias", "linear_attn.dt_bias"],
        "ssm_a" => &["self_attn.A_log", "self_attn.forget_gate.A_log", "linear_attn.A_log"],
        "ssm_beta.weight" => &["self_attn.b_proj.weight", "linear_attn.in_proj_b.weight"],
        "ssm_g_a.weight" => &["self_attn.g_a_proj.weight"],
        "ssm_g_b.weight" => &["self_attn.g_b_proj.weight"],
        "ssm_norm.weight" => &["self_attn.o_norm.weight", "linear_attn.norm.weight"],
        // Kimi K3: KDA's fused projection and convolution where the checkpoint stores them fused,
        // its full-rank output gate and gated MLA's gate (both `g_proj`), the AttnRes scores (a
        // norm and a projection here; llama.cpp's GGUF holds their product, `*_res_score`) and
        // Stable LatentMoE's projections and norm (llama.cpp's `ffn_routed_*`).
        "attn_qkv.weight" => &["self_attn.qkv_proj.weight", "linear_attn.in_proj_qkv.weight"],
        "ssm_conv1d.weight" => &["self_attn.qkv_conv1d.weight", "linear_attn.conv1d.weight"],
        "ssm_g.weight" => &["self_attn.g_proj.weight"],
        "attn_gate.weight" => &["self_attn.g_proj.weight", "linear_attn.in_proj_z.weight"],
        "attn_res_norm.weight" => &["self_attention_res_norm.weight"],
        "attn_res_proj.weight" => &["self_attention_res_proj.weight"],
        "ffn_res_norm.weight" => &["mlp_res_norm.weight"],
        "ffn_res_proj.weight" => &["mlp_res_proj.weight"],
        "ffn_routed_down.weight" => &["block_sparse_moe.routed_expert_down_proj.weight"],
        "ffn_routed_up.weight" => &["block_sparse_moe.routed_expert_up_proj.weight"],
        "ffn_routed_norm.weight" => &["block_sparse_moe.routed_expert_norm.weight"],
        // A multi-token-prediction layer's own parts (DeepSeek-V3's and GLM-4.5's checkpoints
        // keep them beside its decoder block, `model.layers.N.`), under gguf-py's NEXTN_* names.
        "nextn.eh_proj.weight" => &["eh_proj.weight"],
        "nextn.enorm.weight" => &["enorm.weight"],
        "nextn.hnorm.weight" => &["hnorm.weight"],
        "nextn.shared_head_norm.weight" => &["shared_head.norm.weight"],
        "nextn.shared_head_head.weight" => &["shared_head.head.weight"],
        "nextn.embed_tokens.weight" => &["embed_tokens.weight"],
        _ => &[],
    };
    names.iter().map(|n| format!("{p}{n}")).collect()
}

/// `tensors` (all F32) as a safetensors file: an 8-byte header length, the JSON header, the data.
pub fn write_f32_safetensors(path: &Path, tensors: &[(String, Vec<usize>, Vec<u8>)]) -> std::io::Result<()> {
    let mut header = serde_json::Map::new();
    let mut at = 0;
    for (name, shape, bytes) in tensors {
        header.insert(
            name.clone(),
            serde_json::json!({"dtype": "F32", "shape": shape, "data_offsets": [at, at + bytes.len()]}),
        );
        at += bytes.len();
    }
    let header = serde_json::to_vec(&serde_json::Value::Object(header))?;
    let mut out = (header.len() as u64).to_le_bytes().to_vec();
    out.extend(header);
    tensors.iter().for_each(|(_, _, b)| out.extend(b));
    std::fs::write(path, out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_gpt_oss_block_scale_pair_dequantizes_bit_equal_to_transformers_and_splits_gate_from_up() {
        let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/mxfp4/pair");
        let hf = HfDir::open(&dir).unwrap();
        let pair = hf.mxfp4_pair("experts.gate_up_proj").unwrap().expect("the fixture has the pair");
        assert_eq!(pair.shape, vec![2, 4, 1024]);
        let want = hf.view("experts.gate_up_proj.dequantized").unwrap().unwrap().to_f32().unwrap();
        let want = want.flatten_all().unwrap().to_vec1::<f32>().unwrap();
        let got = pair.dequantize();
        assert_eq!(got.len(), want.len());
        for (i, (a, b)) in got.iter().zip(&want).enumerate() {
            assert_eq!(a.to_bits(), b.to_bits(), "element {i}: {a:e} vs transformers' {b:e}");
        }
        // Expert 1's gate is rows 0 and 2 of its [4, 1024], its up rows 1 and 3; through ggml's
        // layout they compute what transformers' rows hold (equal as numbers: ggml has no −0).
        for (first, name) in [(4, "gate"), (5, "up")] {
            let mut rows = vec![0f32; 2 * 1024];
            nightmail_tensor::kernel::mxfp4::dequantize(&pair.rows_to_ggml(first, 2, 2), &mut rows);
            for (k, r) in [first, first + 2].into_iter().enumerate() {
                let (ours, theirs) = (&rows[k * 1024..(k + 1) * 1024], &want[r * 1024..(r + 1) * 1024]);
                assert!(ours.iter().zip(theirs).all(|(a, b)| a == b || (a.is_nan() && b.is_nan())), "{name} row {r}");
            }
        }
        assert_eq!(pair.rows(), 8);
    }
}
