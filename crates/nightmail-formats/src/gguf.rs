//! GGUF v1-v3 (llama.cpp `docs/gguf.md`), read in place. The header is parsed here, not by candle:
//! candle's reader rejects tensor types it has no kernel for (MXFP4, type 39), and its
//! `Content::tensor` copies with `read_exact`. Tensor data is only ever viewed in the map.

use nightmail_tensor::TensorError;
use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};

use candle_core::quantized::gguf_file::{Content, Value, VersionedMagic};
use memmap2::Mmap;

use crate::error::{FormatError, Result};
use crate::names::ExpertId;
use nightmail_tensor::TensorView;
use nightmail_tensor::WeightDType;

pub struct GgufFile {
    path: PathBuf,
    map: Mmap,
    /// The metadata, in candle's type (its tokenizer reads it); its `tensor_infos` stay empty.
    meta: Content,
    tensors: HashMap<String, TensorInfo>,
    /// I32 tensors (`GGML_TYPE_I32`, llama.cpp's deepseek4 `tid2eid`): integer tables read by
    /// `index_table`, kept apart from the weights so no kernel is ever handed one.
    tables: HashMap<String, TableInfo>,
    /// A model packed with `--stripe`: the files on other disks that hold its experts
    /// (`nightmail.stripe.parts` in this, the main file). A tensor is looked up here, then in them.
    parts: Vec<GgufFile>,
}

/// The metadata key listing a striped model's part files, in the main file.
pub const STRIPE_PARTS: &str = "nightmail.stripe.parts";

/// `GGML_TYPE_I32` in `ggml.h` `enum ggml_type`.
const I32_TYPE_ID: u32 = 26;

/// An I32 tensor's entry in the header: shape (outermost first) and offset into the data.
struct TableInfo {
    shape: Vec<usize>,
    offset: usize,
}

/// One tensor's entry in the header: type, shape (outermost first) and offset into the data.
struct TensorInfo {
    dtype: WeightDType,
    shape: Vec<usize>,
    offset: usize,
}

impl GgufFile {
    pub fn open(path: &Path) -> Result<Self> {
        let io = |source| FormatError::Io { path: path.to_path_buf(), source };
        let file = File::open(path).map_err(io)?;
        // SAFETY: the map is read-only; a model file changed underneath a running daemon is
        // outside what we can defend against (llama.cpp maps the same way).
        let map = unsafe { Mmap::map(&file) }.map_err(io)?;
        if map.get(..4) != Some(b"GGUF") {
            return Err(FormatError::UnknownFormat { path: path.to_path_buf() });
        }
        let (meta, tensors, tables) =
            read_header(&map).map_err(|reason| FormatError::BadGguf { path: path.to_path_buf(), reason })?;
        let mut g = GgufFile { path: path.to_path_buf(), map, meta, tensors, tables, parts: Vec::new() };
        let parts: Vec<PathBuf> = match g.value(STRIPE_PARTS) {
            Some(Value::Array(list)) => list.iter().filter_map(|v| v.to_string().ok()).map(PathBuf::from).collect(),
            _ => Vec::new(),
        };
        for part in parts {
            if let Err(source) = std::fs::metadata(&part) {
                return Err(FormatError::MissingStripe { model: path.to_path_buf(), part, source });
            }
            g.parts.push(GgufFile::open(&part)?);
        }
        Ok(g)
    }

    /// This file and its stripe parts.
    fn files(&self) -> impl Iterator<Item = &GgufFile> {
        std::iter::once(self).chain(&self.parts)
    }

    /// The file whose header lists `name`.
    fn holder(&self, name: &str) -> Option<&GgufFile> {
        self.files().find(|f| f.tensors.contains_key(name))
    }

    /// The metadata as candle's `Content` (for candle's GGUF tokenizer), without tensor infos.
    pub fn content(&self) -> &Content {
        &self.meta
    }

    pub fn metadata(&self) -> &HashMap<String, Value> {
        &self.meta.metadata
    }

    /// A tensor's shape, outermost dimension first, without checking its bytes.
    pub fn tensor_shape(&self, name: &str) -> Option<&[usize]> {
        self.holder(name)?.tensors.get(name).map(|t| t.shape.as_slice())
    }

    pub fn value(&self, key: &str) -> Option<&Value> {
        self.meta.metadata.get(key)
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
        match self.holder(name) {
            Some(f) => f.own_tensor(name),
            None => Ok(None),
        }
    }

    fn own_tensor(&self, name: &str) -> Result<Option<TensorView<'_>>> {
        let Some(info) = self.tensors.get(name) else { return Ok(None) };
        let shape = info.shape.clone();
        let len = info.dtype.byte_len(shape.iter().product());
        let start = self.meta.tensor_data_offset as usize + info.offset;
        let end = start.saturating_add(len);
        if end > self.map.len() {
            return Err(FormatError::Truncated {
                name: name.to_string(),
                path: self.path.clone(),
                end,
                len: self.map.len(),
            });
        }
        let scale = self.second_scale(name, None)?;
        Ok(Some(TensorView { name: name.to_string(), dtype: info.dtype, shape, bytes: &self.map[start..end], scale }))
    }

    /// The second scale of the matrix `weight` (`<base>.weight`): the tensor `<base>.scale`
    /// where the file has one (llama.cpp conversion/base.py `_repack_nvfp4`: a converted
    /// ModelOpt NVFP4 checkpoint's `weight_scale_2`), one f32 for a matrix or one per expert for
    /// a stacked bank (`_flush_nvfp4_experts`), as llama-model.cpp loads them. `expert` picks an
    /// expert's (the bank's own view has none: its slices carry theirs); a scale of another
    /// shape is refused, not guessed at.
    fn second_scale(&self, weight: &str, expert: Option<(usize, usize)>) -> Result<Option<f32>> {
        let Some(base) = weight.strip_suffix(".weight") else { return Ok(None) };
        let name = format!("{base}.scale");
        let Some(v) = self.tensor(&name)? else { return Ok(None) };
        // Only the value asked for is decoded: a bank's slices each ask for one.
        let count = if v.dtype == WeightDType::F32 { v.bytes.len() / 4 } else { 0 };
        let value = |i: usize| f32::from_le_bytes(v.bytes[4 * i..4 * i + 4].try_into().unwrap());
        let want = expert.map_or(1, |(_, experts)| experts);
        // A stacked bank's own view: its experts' scales come with their slices.
        let bank = self.tensors.get(weight).filter(|t| t.shape.len() == 3).map(|t| t.shape[0]);
        match (count, expert) {
            (1, _) => Ok(Some(value(0))),
            (n, Some((e, _))) if n == want => Ok(Some(value(e))),
            (n, None) if Some(n) == bank => Ok(None),
            _ => Err(FormatError::BadGguf {
                path: self.path.clone(),
                reason: format!(
                    "`{name}` ({:?}, shape {:?}) is no second scale of `{weight}`: expected {want} f32 value(s)",
                    v.dtype, v.shape
                ),
            }),
        }
    }

    /// The names of the I32 tables, the stripe parts' too.
    pub fn table_names(&self) -> Vec<String> {
        let mut names: Vec<String> = self.files().flat_map(|f| f.tables.keys().cloned()).collect();
        names.sort();
        names
    }

    /// An I32 table by name (DeepSeek-V4's `tid2eid`), from this file or a stripe part: its
    /// values, which must be non-negative, and its shape.
    pub fn index_table(&self, name: &str) -> Result<Option<(Vec<u32>, Vec<usize>)>> {
        let Some((f, info)) = self.files().find_map(|f| f.tables.get(name).map(|i| (f, i))) else { return Ok(None) };
        let start = f.meta.tensor_data_offset as usize + info.offset;
        let end = start.saturating_add(4 * info.shape.iter().product::<usize>());
        if end > f.map.len() {
            return Err(FormatError::Truncated { name: name.to_string(), path: f.path.clone(), end, len: f.map.len() });
        }
        let values = f.map[start..end].chunks_exact(4).map(|b| i32::from_le_bytes(b.try_into().unwrap()));
        let values = values
            .map(|v| u32::try_from(v).ok())
            .collect::<Option<Vec<u32>>>()
            .ok_or_else(|| FormatError::BadMetadata { key: name.to_string(), reason: "holds a negative id".into() })?;
        Ok(Some((values, info.shape.clone())))
    }

    /// Expert `id.expert`'s slice of the stacked `[experts, rows, cols]` tensor `name`. Only
    /// the slice must lie inside the file, and a truncated one is reported by its expert.
    pub fn expert_slice(&self, name: &str, id: ExpertId) -> Result<Option<TensorView<'_>>> {
        let Some(info) = self.tensors.get(name) else { return Ok(None) };
        let shape = info.shape.clone();
        // `[experts, rows, cols]` matrices, or `[experts, len]` biases.
        let Some((&experts, inner)) = shape.split_first().filter(|(_, rest)| !rest.is_empty()) else {
            return Err(TensorError::Shape { name: name.to_string(), found: shape, expected: vec![0, 0, 0] }.into());
        };
        if id.expert >= experts {
            return Err(FormatError::MissingTensor { name: format!("{name}[expert {}]", id.expert) });
        }
        let per = info.dtype.byte_len(inner.iter().product());
        let start = (self.meta.tensor_data_offset as usize + info.offset).saturating_add(id.expert * per);
        let end = start.saturating_add(per);
        if end > self.map.len() {
            return Err(FormatError::ExpertRead {
                path: self.path.clone(),
                layer: id.layer,
                expert: id.expert,
                reason: format!("{name} ends at byte {end} but the file has {} bytes (truncated?)", self.map.len()),
            });
        }
        Ok(Some(TensorView {
            name: format!("{name}[{}]", id.expert),
            dtype: info.dtype,
            shape: inner.to_vec(),
            bytes: &self.map[start..end],
            scale: self.second_scale(name, Some((id.expert, experts)))?,
        }))
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The file (this one or a stripe part) and byte offset of bytes borrowed from its map.
    pub fn locate(&self, bytes: &[u8]) -> Option<(PathBuf, u64)> {
        self.files().find_map(|f| offset_in(&f.map, bytes).map(|o| (f.path.clone(), o)))
    }

    /// Let the kernel drop the maps' pages from this process (they were copied out).
    pub fn release_pages(&self) {
        self.files().for_each(|f| release(&f.map))
    }

    /// How many tensors the model has, the stripe parts' too.
    pub fn tensor_count(&self) -> usize {
        self.files().map(|f| f.tensors.len()).sum()
    }

    /// Every tensor of the model, the stripe parts' too, by name.
    pub fn all_tensors(&self) -> Result<Vec<TensorView<'_>>> {
        let mut names: Vec<&String> = self.files().flat_map(|f| f.tensors.keys()).collect();
        names.sort();
        names.into_iter().map(|n| self.tensor(n).map(|t| t.expect("listed tensor"))).collect()
    }
}

/// Bounds on what a header may declare (llama.cpp `gguf.cpp` GGUF_MAX_* and GGML_MAX_DIMS): a
/// corrupt count fails the load instead of allocating or recursing without end.
const MAX_DIMS: u32 = 4;
const MAX_DEPTH: usize = 64;
const DEFAULT_ALIGNMENT: usize = 32;

/// A bounds-checked little-endian reader over the header bytes.
struct Reader<'a> {
    bytes: &'a [u8],
    pos: usize,
    /// GGUF v1 writes lengths and dimensions as u32, v2 and v3 as u64.
    wide: bool,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        let end = self.pos.checked_add(n).filter(|e| *e <= self.bytes.len());
        let end = end.ok_or_else(|| format!("header runs past the end of the file at byte {}", self.pos))?;
        let out = &self.bytes[self.pos..end];
        self.pos = end;
        Ok(out)
    }
    fn array<const N: usize>(&mut self) -> Result<[u8; N], String> {
        Ok(self.take(N)?.try_into().expect("took N bytes"))
    }
    fn u32(&mut self) -> Result<u32, String> {
        Ok(u32::from_le_bytes(self.array()?))
    }
    fn u64(&mut self) -> Result<u64, String> {
        Ok(u64::from_le_bytes(self.array()?))
    }
    /// A length or dimension, which must fit what is left of the file when it counts bytes.
    fn len(&mut self) -> Result<usize, String> {
        let n = if self.wide { self.u64()? } else { self.u32()? as u64 };
        usize::try_from(n).map_err(|_| format!("length {n} is too large"))
    }
    fn string(&mut self) -> Result<String, String> {
        let n = self.len()?;
        let mut bytes = self.take(n)?;
        // Strings should not be NUL-terminated, but some writers do it.
        while let [rest @ .., 0] = bytes {
            bytes = rest;
        }
        Ok(String::from_utf8_lossy(bytes).into_owned())
    }
    fn value(&mut self, kind: u32, depth: usize) -> Result<Value, String> {
        if depth > MAX_DEPTH {
            return Err(format!("metadata arrays nested deeper than {MAX_DEPTH}"));
        }
        Ok(match kind {
            0 => Value::U8(self.array::<1>()?[0]),
            1 => Value::I8(self.array::<1>()?[0] as i8),
            2 => Value::U16(u16::from_le_bytes(self.array()?)),
            3 => Value::I16(i16::from_le_bytes(self.array()?)),
            4 => Value::U32(self.u32()?),
            5 => Value::I32(i32::from_le_bytes(self.array()?)),
            6 => Value::F32(f32::from_le_bytes(self.array()?)),
            7 => match self.array::<1>()?[0] {
                0 => Value::Bool(false),
                1 => Value::Bool(true),
                b => return Err(format!("boolean value {b}")),
            },
            8 => Value::String(self.string()?),
            9 => {
                let elem = self.u32()?;
                let n = self.len()?;
                // Every element takes at least a byte: a count beyond the file is corrupt.
                if n > self.bytes.len() - self.pos {
                    return Err(format!("an array of {n} elements is longer than the file"));
                }
                Value::Array((0..n).map(|_| self.value(elem, depth + 1)).collect::<Result<_, _>>()?)
            }
            10 => Value::U64(self.u64()?),
            11 => Value::I64(i64::from_le_bytes(self.array()?)),
            12 => Value::F64(f64::from_le_bytes(self.array()?)),
            other => return Err(format!("unknown metadata value type {other}")),
        })
    }
}

/// The metadata and tensor infos (`docs/gguf.md` "File Structure"), and where the data begins.
type Header = (Content, HashMap<String, TensorInfo>, HashMap<String, TableInfo>);

fn read_header(map: &[u8]) -> Result<Header, String> {
    let mut r = Reader { bytes: map, pos: 4, wide: true };
    let (magic, wide) = match r.u32()? {
        1 => (VersionedMagic::GgufV1, false),
        2 => (VersionedMagic::GgufV2, true),
        3 => (VersionedMagic::GgufV3, true),
        v => return Err(format!("GGUF version {v} (nightmail reads 1 to 3)")),
    };
    r.wide = wide;
    let (tensor_count, kv_count) = (r.len()?, r.len()?);
    if tensor_count.saturating_add(kv_count) > map.len() {
        return Err(format!("the header declares {tensor_count} tensors and {kv_count} keys, more than fit"));
    }
    let mut metadata = HashMap::with_capacity(kv_count);
    for _ in 0..kv_count {
        let key = r.string()?;
        let kind = r.u32()?;
        let value = r.value(kind, 0).map_err(|e| format!("metadata `{key}`: {e}"))?;
        metadata.insert(key, value);
    }
    let mut tensors = HashMap::with_capacity(tensor_count);
    let mut tables = HashMap::new();
    for _ in 0..tensor_count {
        let name = r.string()?;
        let dims = r.u32()?;
        if dims > MAX_DIMS {
            return Err(format!("tensor `{name}` has {dims} dimensions (at most {MAX_DIMS})"));
        }
        let mut shape = (0..dims).map(|_| r.len()).collect::<Result<Vec<_>, _>>()?;
        shape.reverse();
        let id = r.u32()?;
        let offset = usize::try_from(r.u64()?).map_err(|_| format!("tensor `{name}`: offset too large"))?;
        if id == I32_TYPE_ID {
            tables.insert(name, TableInfo { shape, offset });
            continue;
        }
        let dtype = WeightDType::from_gguf_type_id(id)
            .ok_or_else(|| format!("tensor `{name}` has ggml type {id}, which nightmail cannot read"))?;
        if shape.last().is_some_and(|c| c % dtype.block_size() != 0) {
            return Err(format!("tensor `{name}` of type {dtype:?} has rows of {shape:?}, not whole blocks"));
        }
        tensors.insert(name, TensorInfo { dtype, shape, offset });
    }
    let alignment = metadata.get("general.alignment").and_then(value_as_u64).map_or(DEFAULT_ALIGNMENT, |a| a as usize);
    if alignment == 0 {
        return Err("general.alignment is 0".into());
    }
    let tensor_data_offset = r.pos.next_multiple_of(alignment) as u64;
    Ok((Content { magic, metadata, tensor_infos: HashMap::new(), tensor_data_offset }, tensors, tables))
}

pub fn value_as_u64(v: &Value) -> Option<u64> {
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
pub fn offset_in(map: &Mmap, bytes: &[u8]) -> Option<u64> {
    let (base, p) = (map.as_ptr() as usize, bytes.as_ptr() as usize);
    (p >= base && p + bytes.len() <= base + map.len()).then(|| (p - base) as u64)
}

/// `MADV_DONTNEED` over a read-only file map: the process's pages go (counted in its RSS), the
/// file is untouched, and a later access faults the page back in.
pub fn release(map: &Mmap) {
    // SAFETY: the map is a read-only view of a file; dropping its pages loses nothing.
    let _ = unsafe { map.unchecked_advise(memmap2::UncheckedAdvice::DontNeed) };
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture(name: &str) -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/mxfp4").join(name)
    }

    #[test]
    fn an_mxfp4_tensor_written_by_the_gguf_package_dequantizes_bit_equal_to_its_dequantizer() {
        let g = GgufFile::open(&fixture("blocks.gguf")).unwrap();
        let blocks = g.tensor("blocks").unwrap().unwrap();
        assert_eq!(blocks.dtype, WeightDType::Mxfp4);
        assert_eq!(blocks.shape, vec![8, 1024]);
        assert_eq!(blocks.bytes.len(), 256 * 17);
        let want = g.tensor("dequantized").unwrap().unwrap().to_f32().unwrap().flatten_all().unwrap();
        let got = blocks.to_f32().unwrap().flatten_all().unwrap();
        let (want, got) = (want.to_vec1::<f32>().unwrap(), got.to_vec1::<f32>().unwrap());
        assert_eq!(want.len(), got.len());
        for (i, (a, b)) in got.iter().zip(&want).enumerate() {
            assert_eq!(a.to_bits(), b.to_bits(), "element {i} (block {}): {a:e} vs gguf's {b:e}", i / 32);
        }
        // Every scale byte is there: subnormal scales, infinite products at 255.
        assert!(want.iter().any(|v| v.is_infinite()) && want.iter().any(|v| v.is_subnormal()));
    }

    /// A matrix's second scale (`<base>.scale`: one value) and a stacked bank's (one per
    /// expert) come with their views; a view without one has none, and a scale of another
    /// length is refused naming both tensors.
    #[test]
    fn second_scales_come_with_their_matrices_and_experts() {
        use crate::gguf_write::{TensorHeader, write_gguf};
        let dir = tempfile::tempdir().unwrap();
        let nvfp4 = WeightDType::LowBit(nightmail_tensor::LowBit::Nvfp4);
        let write = |name: &str, bank_scales: &[f32]| {
            let path = dir.path().join(name);
            let tensors = vec![
                TensorHeader::new("blk.0.attn_q.weight", nvfp4, &[2, 64]),
                TensorHeader::new("blk.0.attn_q.scale", WeightDType::F32, &[1]),
                TensorHeader::new("blk.0.attn_k.weight", nvfp4, &[2, 64]),
                TensorHeader::new("blk.0.ffn_up_exps.weight", nvfp4, &[3, 2, 64]),
                TensorHeader::new("blk.0.ffn_up_exps.scale", WeightDType::F32, &[bank_scales.len()]),
            ];
            let data = |i: usize| -> Vec<u8> {
                match i {
                    1 => 0.75f32.to_le_bytes().to_vec(),
                    4 => bank_scales.iter().flat_map(|s| s.to_le_bytes()).collect(),
                    _ => vec![0x11; tensors[i].byte_len()],
                }
            };
            write_gguf(&path, &[], &tensors, 32, |i, w| w.write_all(&data(i))).unwrap();
            GgufFile::open(&path).unwrap()
        };
        let g = write("scaled.gguf", &[0.5, 2.0, 4.0]);
        assert_eq!(g.tensor("blk.0.attn_q.weight").unwrap().unwrap().scale, Some(0.75));
        assert_eq!(g.tensor("blk.0.attn_k.weight").unwrap().unwrap().scale, None);
        for (expert, want) in [0.5, 2.0, 4.0].into_iter().enumerate() {
            let id = ExpertId { layer: 0, expert };
            let slice = g.expert_slice("blk.0.ffn_up_exps.weight", id).unwrap().unwrap();
            assert_eq!(slice.scale, Some(want), "expert {expert}");
        }
        // The scaled values are the blocks' times the scale.
        let q = g.tensor("blk.0.attn_q.weight").unwrap().unwrap();
        let (scaled, plain) = (q.to_f32().unwrap(), q.unscaled().to_f32().unwrap());
        let (scaled, plain) = (
            scaled.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
            plain.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
        );
        assert!(plain.iter().any(|v| *v != 0.0));
        assert!(scaled.iter().zip(&plain).all(|(s, p)| *s == p * 0.75));

        let bad = write("two.gguf", &[0.5, 2.0]);
        let err =
            bad.expert_slice("blk.0.ffn_up_exps.weight", ExpertId { layer: 0, expert: 0 }).err().unwrap().to_string();
        assert!(err.contains("blk.0.ffn_up_exps.scale") && err.contains("blk.0.ffn_up_exps.weight"), "{err}");
    }
}
