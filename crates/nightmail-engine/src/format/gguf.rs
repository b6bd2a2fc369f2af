//! GGUF v2/v3 (llama.cpp `docs/gguf.md`): the header is parsed by candle's reader from a cursor
//! over the memory map; tensor data is never read through it (candle's `Content::tensor` copies
//! with `read_exact`), only viewed in place.

use std::fs::File;
use std::io::Cursor;
use std::path::{Path, PathBuf};

use candle_core::quantized::gguf_file::{Content, Value};
use memmap2::Mmap;

use super::view::TensorView;
use crate::error::{EngineError, Result};
use crate::model::ExpertId;

pub(crate) struct GgufFile {
    path: PathBuf,
    map: Mmap,
    content: Content,
}

impl GgufFile {
    pub fn open(path: &Path) -> Result<Self> {
        let io = |source| EngineError::Io { path: path.to_path_buf(), source };
        let file = File::open(path).map_err(io)?;
        // SAFETY: the map is read-only; a model file changed underneath a running daemon is
        // outside what we can defend against (llama.cpp maps the same way).
        let map = unsafe { Mmap::map(&file) }.map_err(io)?;
        if map.get(..4) != Some(b"GGUF") {
            return Err(EngineError::UnknownFormat { path: path.to_path_buf() });
        }
        let content = Content::read(&mut Cursor::new(&map[..]))
            .map_err(|e| EngineError::BadGguf { path: path.to_path_buf(), reason: e.to_string() })?;
        Ok(GgufFile { path: path.to_path_buf(), map, content })
    }

    pub fn content(&self) -> &Content {
        &self.content
    }

    pub fn value(&self, key: &str) -> Option<&Value> {
        self.content.metadata.get(key)
    }

    pub fn string(&self, key: &str) -> Option<&str> {
        self.value(key).and_then(|v| v.to_string().ok()).map(String::as_str)
    }

    pub fn uint(&self, key: &str) -> Option<u64> {
        self.value(key).and_then(value_as_u64)
    }

    pub fn float(&self, key: &str) -> Option<f64> {
        match self.value(key)? {
            Value::F32(v) => Some(*v as f64),
            Value::F64(v) => Some(*v),
            other => value_as_u64(other).map(|v| v as f64),
        }
    }

    pub fn boolean(&self, key: &str) -> Option<bool> {
        self.value(key).and_then(|v| v.to_bool().ok())
    }

    pub fn tensor(&self, name: &str) -> Result<Option<TensorView<'_>>> {
        let Some(info) = self.content.tensor_infos.get(name) else { return Ok(None) };
        let shape = info.shape.dims().to_vec();
        let len = TensorView::byte_len(info.ggml_dtype, shape.iter().product());
        let start = self.content.tensor_data_offset as usize + info.offset as usize;
        let end = start + len;
        if end > self.map.len() {
            return Err(EngineError::Truncated {
                name: name.to_string(),
                path: self.path.clone(),
                end,
                len: self.map.len(),
            });
        }
        Ok(Some(TensorView { name: name.to_string(), dtype: info.ggml_dtype, shape, bytes: &self.map[start..end] }))
    }

    /// Expert `id.expert`'s slice of the stacked `[experts, rows, cols]` tensor `name`. Only
    /// the slice must lie inside the file, and a truncated one is reported by its expert.
    pub fn expert_slice(&self, name: &str, id: ExpertId) -> Result<Option<TensorView<'_>>> {
        let Some(info) = self.content.tensor_infos.get(name) else { return Ok(None) };
        let shape = info.shape.dims().to_vec();
        let [experts, rows, cols] = shape[..] else {
            return Err(EngineError::Shape { name: name.to_string(), found: shape, expected: vec![0, 0, 0] });
        };
        if id.expert >= experts {
            return Err(EngineError::MissingTensor { name: format!("{name}[expert {}]", id.expert) });
        }
        let per = TensorView::byte_len(info.ggml_dtype, rows * cols);
        let start = self.content.tensor_data_offset as usize + info.offset as usize + id.expert * per;
        let end = start + per;
        if end > self.map.len() {
            return Err(EngineError::ExpertRead {
                path: self.path.clone(),
                layer: id.layer,
                expert: id.expert,
                reason: format!("{name} ends at byte {end} but the file has {} bytes (truncated?)", self.map.len()),
            });
        }
        Ok(Some(TensorView {
            name: format!("{name}[{}]", id.expert),
            dtype: info.ggml_dtype,
            shape: vec![rows, cols],
            bytes: &self.map[start..end],
        }))
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The byte offset in the file of bytes borrowed from this map.
    pub fn offset_of(&self, bytes: &[u8]) -> Option<u64> {
        offset_in(&self.map, bytes)
    }

    /// Let the kernel drop the map's pages from this process (they were copied out).
    pub fn release_pages(&self) {
        release(&self.map)
    }

    pub fn all_tensors(&self) -> Result<Vec<TensorView<'_>>> {
        let mut names: Vec<&String> = self.content.tensor_infos.keys().collect();
        names.sort();
        names.into_iter().map(|n| self.tensor(n).map(|t| t.expect("listed tensor"))).collect()
    }
}

pub(crate) fn value_as_u64(v: &Value) -> Option<u64> {
    match v {
        Value::U8(v) => Some(*v as u64),
        Value::U16(v) => Some(*v as u64),
        Value::U32(v) => Some(*v as u64),
        Value::U64(v) => Some(*v),
        Value::I8(v) => u64::try_from(*v).ok(),
        Value::I16(v) => u64::try_from(*v).ok(),
        Value::I32(v) => u64::try_from(*v).ok(),
        Value::I64(v) => u64::try_from(*v).ok(),
        Value::Bool(b) => Some(*b as u64),
        _ => None,
    }
}

/// Where `bytes` starts inside `map`, if it lies inside it.
pub(crate) fn offset_in(map: &Mmap, bytes: &[u8]) -> Option<u64> {
    let (base, p) = (map.as_ptr() as usize, bytes.as_ptr() as usize);
    (p >= base && p + bytes.len() <= base + map.len()).then(|| (p - base) as u64)
}

/// `MADV_DONTNEED` over a read-only file map: the process's pages go (counted in its RSS), the
/// file is untouched, and a later access faults the page back in.
pub(crate) fn release(map: &Mmap) {
    // SAFETY: the map is a read-only view of a file; dropping its pages loses nothing.
    let _ = unsafe { map.unchecked_advise(memmap2::UncheckedAdvice::DontNeed) };
}
