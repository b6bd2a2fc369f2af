//! A model file, read in place: a GGUF file or a Hugging Face directory behind one type, with
//! llama.cpp's tensor names (`blk.3.attn_q.weight`); a Hugging Face directory translates them.

use std::path::{Path, PathBuf};

use crate::error::{FormatError, Result};
use crate::gguf::GgufFile;
use crate::hf::HfDir;
use crate::names::{ExpertId, ExpertMatrix, packed_expert_bias_name, packed_expert_name};
use nightmail_tensor::{TensorError, TensorView};

/// The file format a model came in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Format {
    Gguf,
    Safetensors,
}

/// A model's weights and metadata, memory-mapped.
pub enum ModelFile {
    Gguf(GgufFile),
    Hf(HfDir),
}

impl ModelFile {
    /// A `.gguf` file, or a directory holding `config.json` (or a single `.gguf`).
    pub fn open(path: &Path) -> Result<Self> {
        let io = |source| FormatError::Io { path: path.to_path_buf(), source };
        let meta = std::fs::metadata(path).map_err(io)?;
        if meta.is_dir() {
            if path.join("config.json").is_file() {
                return Ok(ModelFile::Hf(HfDir::open(path)?));
            }
            let ggufs: Vec<PathBuf> = std::fs::read_dir(path)
                .map_err(io)?
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.extension().is_some_and(|x| x == "gguf"))
                .collect();
            if let [one] = ggufs.as_slice() {
                return Ok(ModelFile::Gguf(GgufFile::open(one)?));
            }
            return Err(FormatError::UnknownFormat { path: path.to_path_buf() });
        }
        Ok(ModelFile::Gguf(GgufFile::open(path)?))
    }

    pub fn format(&self) -> Format {
        match self {
            ModelFile::Gguf(_) => Format::Gguf,
            ModelFile::Hf(_) => Format::Safetensors,
        }
    }

    /// A tensor by its GGUF name, if the model has it.
    pub fn tensor(&self, name: &str) -> Result<Option<TensorView<'_>>> {
        match self {
            ModelFile::Gguf(g) => g.tensor(name),
            ModelFile::Hf(h) => h.tensor(name),
        }
    }

    /// An integer table by its GGUF name (DeepSeek-V4's `tid2eid`): its values and shape. A
    /// GGUF holds it as I32, as llama.cpp's converter writes it, or as F32 weights.
    pub fn index_table(&self, name: &str) -> Result<Option<(Vec<u32>, Vec<usize>)>> {
        match self {
            ModelFile::Hf(h) => h.index_table(name),
            ModelFile::Gguf(g) => match g.index_table(name)? {
                Some(t) => Ok(Some(t)),
                None => g
                    .tensor(name)?
                    .map(|t| {
                        let values: Vec<f32> = t.to_f32()?.flatten_all()?.to_vec1()?;
                        Ok((values.into_iter().map(|v| v as u32).collect(), t.shape.clone()))
                    })
                    .transpose(),
            },
        }
    }

    /// A tensor the model must have; the error names it as the file would (a Hugging Face
    /// directory's transformers name beside the GGUF one) and the file or directory.
    pub fn require(&self, name: &str) -> Result<TensorView<'_>> {
        self.tensor(name)?.ok_or_else(|| match self {
            ModelFile::Gguf(g) => {
                FormatError::MissingTensorIn { name: format!("`{name}`"), path: g.path().to_path_buf() }
            }
            ModelFile::Hf(h) => FormatError::MissingTensorIn {
                name: match h.transformers_name(name) {
                    Some(hf) => format!("`{hf}` (GGUF `{name}`)"),
                    None => format!("`{name}`"),
                },
                path: h.dir().to_path_buf(),
            },
        })
    }

    /// One matrix of one routed expert: a slice of the stacked GGUF tensor, or the Hugging Face
    /// per-expert tensor.
    pub fn expert_matrix(&self, id: ExpertId, which: ExpertMatrix) -> Result<TensorView<'_>> {
        match self {
            ModelFile::Gguf(g) => {
                let name = format!("blk.{}.ffn_{}_exps.weight", id.layer, which.gguf_part());
                if let Some(slice) = g.expert_slice(&name, id)? {
                    return Ok(slice);
                }
                // llama.cpp's `--fuse-gate-up-exps`: each expert's gate rows, then its up rows
                // (`[experts, 2·ffn, hidden]`, `conversion/base.py`).
                let half = match which {
                    ExpertMatrix::Gate => Some(0),
                    ExpertMatrix::Up => Some(1),
                    ExpertMatrix::Down => None,
                };
                let fused = format!("blk.{}.ffn_gate_up_exps.weight", id.layer);
                if let Some(half) = half
                    && let Some(both) = g.expert_slice(&fused, id)?
                {
                    return half_rows(both, half);
                }
                // An expert-major file from `model pack`.
                let packed = packed_expert_name(id, which);
                g.tensor(&packed)?.ok_or(FormatError::MissingTensor { name })
            }
            ModelFile::Hf(h) => h.expert_matrix(id, which),
        }
    }

    /// The bias of one routed expert's matrix, where the model has them (gpt-oss): a row of
    /// the stacked GGUF `*_exps.bias`, or of the Hugging Face fused bias.
    pub fn expert_bias(&self, id: ExpertId, which: ExpertMatrix) -> Result<Option<TensorView<'_>>> {
        match self {
            ModelFile::Gguf(g) => {
                let name = format!("blk.{}.ffn_{}_exps.bias", id.layer, which.gguf_part());
                match g.expert_slice(&name, id)? {
                    Some(slice) => Ok(Some(slice)),
                    None => g.tensor(&packed_expert_bias_name(id, which)),
                }
            }
            ModelFile::Hf(h) => h.expert_bias(id, which),
        }
    }

    /// The file a view's bytes come from, and their offset in it.
    pub fn locate(&self, view: &TensorView<'_>) -> Option<(PathBuf, u64)> {
        match self {
            ModelFile::Gguf(g) => g.locate(view.bytes),
            ModelFile::Hf(h) => h.locate(view.bytes),
        }
    }

    /// Drop the mapped pages from this process once their contents were copied out, so that
    /// loading does not count the file twice in RSS (the file's pages stay in the page cache
    /// only as long as the kernel likes).
    pub fn release_pages(&self) {
        match self {
            ModelFile::Gguf(g) => g.release_pages(),
            ModelFile::Hf(h) => h.release_pages(),
        }
    }

    /// Every tensor, for accounting (`model inspect`).
    pub fn all_tensors(&self) -> Result<Vec<TensorView<'_>>> {
        match self {
            ModelFile::Gguf(g) => g.all_tensors(),
            ModelFile::Hf(h) => h.all_tensors(),
        }
    }
}

/// Half `half` (0 the first) of a matrix's rows: a view of the same bytes, as rows are whole
/// blocks in every GGUF type.
fn half_rows(v: TensorView<'_>, half: usize) -> Result<TensorView<'_>> {
    let (rows, cols) = match v.shape[..] {
        [rows, cols] if rows % 2 == 0 && rows > 0 => (rows, cols),
        _ => {
            let found = v.shape.clone();
            return Err(TensorError::Shape { name: v.name, found, expected: vec![0, 0] }.into());
        }
    };
    let per_half = v.bytes.len() / 2;
    Ok(TensorView {
        name: format!("{}.{}", v.name, ["gate", "up"][half]),
        dtype: v.dtype,
        shape: vec![rows / 2, cols],
        bytes: &v.bytes[half * per_half..(half + 1) * per_half],
        scale: v.scale,
    })
}
