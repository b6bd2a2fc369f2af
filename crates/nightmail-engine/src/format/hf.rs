//! Hugging Face model directories: `config.json`, `*.safetensors` (sharded with
//! `model.safetensors.index.json`, or single), read in place. The safetensors header is parsed here
//! (format: an 8-byte little-endian header length, a JSON header, then the data), so tensors stay
//! views into the map.

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::path::{Path, PathBuf};

use candle_core::quantized::GgmlDType;
use memmap2::Mmap;

use super::ExpertMatrix;
use super::view::TensorView;
use crate::error::{EngineError, Result};
use crate::model::ExpertId;

struct Shard {
    path: PathBuf,
    map: Mmap,
}

struct Entry {
    shard: usize,
    dtype: Result<GgmlDType, String>,
    shape: Vec<usize>,
    start: usize,
    end: usize,
}

pub(crate) struct HfDir {
    dir: PathBuf,
    config: serde_json::Value,
    shards: Vec<Shard>,
    tensors: HashMap<String, Entry>,
}

impl HfDir {
    pub fn open(dir: &Path) -> Result<Self> {
        let config = read_json(&dir.join("config.json"))?;
        let files = shard_files(dir)?;
        let mut shards = Vec::new();
        let mut tensors = HashMap::new();
        for path in files {
            let io = |source| EngineError::Io { path: path.clone(), source };
            let file = File::open(&path).map_err(io)?;
            // SAFETY: read-only map of a file we do not modify.
            let map = unsafe { Mmap::map(&file) }.map_err(io)?;
            parse_header(&path, &map, shards.len(), &mut tensors)?;
            shards.push(Shard { path, map });
        }
        Ok(HfDir { dir: dir.to_path_buf(), config, shards, tensors })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn config(&self) -> &serde_json::Value {
        &self.config
    }

    fn view(&self, hf_name: &str) -> Result<Option<TensorView<'_>>> {
        let Some(e) = self.tensors.get(hf_name) else { return Ok(None) };
        let dtype =
            e.dtype.clone().map_err(|dtype| EngineError::UnsupportedDType { name: hf_name.to_string(), dtype })?;
        Ok(Some(TensorView {
            name: hf_name.to_string(),
            dtype,
            shape: e.shape.clone(),
            bytes: &self.shards[e.shard].map[e.start..e.end],
        }))
    }

    /// A tensor by its GGUF name, translated to the transformers name.
    pub fn tensor(&self, gguf_name: &str) -> Result<Option<TensorView<'_>>> {
        for candidate in hf_names(gguf_name) {
            if let Some(v) = self.view(&candidate)? {
                return Ok(Some(v));
            }
        }
        Ok(None)
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
        let names = [
            format!("model.layers.{l}.mlp.experts.{e}.{qwen}.weight"),
            format!("model.layers.{l}.block_sparse_moe.experts.{e}.{mixtral}.weight"),
        ];
        for name in &names {
            if let Some(v) = self.view(name)? {
                return Ok(v);
            }
        }
        Err(EngineError::MissingTensor { name: names[0].clone() })
    }

    /// The shard file and byte offset of bytes borrowed from one of the maps.
    pub fn locate(&self, bytes: &[u8]) -> Option<(PathBuf, u64)> {
        self.shards.iter().find_map(|s| super::gguf::offset_in(&s.map, bytes).map(|o| (s.path.clone(), o)))
    }

    pub fn release_pages(&self) {
        self.shards.iter().for_each(|s| super::gguf::release(&s.map))
    }

    pub fn all_tensors(&self) -> Result<Vec<TensorView<'_>>> {
        let mut names: Vec<&String> = self.tensors.keys().collect();
        names.sort();
        names.into_iter().map(|n| self.view(n).map(|t| t.expect("listed tensor"))).collect()
    }
}

pub(crate) fn read_json(path: &Path) -> Result<serde_json::Value> {
    let text = std::fs::read_to_string(path).map_err(|source| EngineError::Io { path: path.to_path_buf(), source })?;
    serde_json::from_str(&text).map_err(|e| EngineError::BadConfig { path: path.to_path_buf(), reason: e.to_string() })
}

/// The shards named by `model.safetensors.index.json`, else every `*.safetensors` in the directory.
fn shard_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let index = dir.join("model.safetensors.index.json");
    if index.is_file() {
        let json = read_json(&index)?;
        let map = json
            .get("weight_map")
            .and_then(|m| m.as_object())
            .ok_or_else(|| EngineError::BadConfig { path: index.clone(), reason: "no `weight_map` object".into() })?;
        let files: std::collections::BTreeSet<&str> = map.values().filter_map(|v| v.as_str()).collect();
        return Ok(files.into_iter().map(|f| dir.join(f)).collect());
    }
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|source| EngineError::Io { path: dir.to_path_buf(), source })?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
        .collect();
    files.sort();
    if files.is_empty() {
        return Err(EngineError::BadConfig { path: dir.to_path_buf(), reason: "no *.safetensors files".into() });
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
    let bad = |reason: String| EngineError::BadSafetensors { path: path.to_path_buf(), reason };
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
            return Err(EngineError::Truncated { name, path: path.to_path_buf(), end, len: map.len() });
        }
        let dtype = match h.dtype.as_str() {
            "F32" => Ok(GgmlDType::F32),
            "F16" => Ok(GgmlDType::F16),
            "BF16" => Ok(GgmlDType::BF16),
            other => Err(other.to_string()),
        };
        if let Ok(d) = &dtype {
            let expect = TensorView::byte_len(*d, h.shape.iter().product());
            if expect != end - start {
                return Err(bad(format!("tensor {name} has {} bytes for shape {:?}", end - start, h.shape)));
            }
        }
        out.insert(name, Entry { shard, dtype, shape: h.shape, start, end });
    }
    Ok(())
}

/// The transformers names a GGUF tensor name can have (llama.cpp `gguf-py/gguf/tensor_mapping.py`).
fn hf_names(gguf: &str) -> Vec<String> {
    match gguf {
        "token_embd.weight" => return vec!["model.embed_tokens.weight".into()],
        "output_norm.weight" => return vec!["model.norm.weight".into()],
        "output.weight" => return vec!["lm_head.weight".into()],
        _ => {}
    }
    let Some(rest) = gguf.strip_prefix("blk.") else { return vec![] };
    let Some((layer, tail)) = rest.split_once('.') else { return vec![] };
    let p = format!("model.layers.{layer}.");
    let names: &[&str] = match tail {
        "attn_norm.weight" => &["input_layernorm.weight"],
        "ffn_norm.weight" => &["post_attention_layernorm.weight"],
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
        "ffn_gate.weight" => &["mlp.gate_proj.weight"],
        "ffn_up.weight" => &["mlp.up_proj.weight"],
        "ffn_down.weight" => &["mlp.down_proj.weight"],
        "ffn_gate_inp.weight" => &["mlp.gate.weight", "block_sparse_moe.gate.weight"],
        "ffn_gate_inp_shexp.weight" => &["mlp.shared_expert_gate.weight"],
        "ffn_gate_shexp.weight" => &["mlp.shared_expert.gate_proj.weight"],
        "ffn_up_shexp.weight" => &["mlp.shared_expert.up_proj.weight"],
        "ffn_down_shexp.weight" => &["mlp.shared_expert.down_proj.weight"],
        _ => &[],
    };
    names.iter().map(|n| format!("{p}{n}")).collect()
}
