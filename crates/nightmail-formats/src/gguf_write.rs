//! Writing GGUF v3 (llama.cpp `docs/gguf.md`) tensor by tensor, so a file of tens of GB is never
//! held in memory: the header (metadata, tensor infos with their offsets) is computed up front,
//! then each tensor's bytes are streamed by the caller and padded to the file's alignment.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::Path;

use candle_core::quantized::gguf_file::Value;

use nightmail_tensor::WeightDType;

/// A tensor to write: its name, element type and shape (outermost dimension first).
#[derive(Debug, Clone)]
pub struct TensorHeader {
    pub name: String,
    pub dtype: WeightDType,
    pub shape: Vec<usize>,
}

impl TensorHeader {
    pub fn new(name: impl Into<String>, dtype: impl Into<WeightDType>, shape: &[usize]) -> Self {
        TensorHeader { name: name.into(), dtype: dtype.into(), shape: shape.to_vec() }
    }

    pub fn byte_len(&self) -> usize {
        self.dtype.byte_len(self.shape.iter().product())
    }
}

fn value_type_id(v: &Value) -> u32 {
    match v {
        Value::U8(_) => 0,
        Value::I8(_) => 1,
        Value::U16(_) => 2,
        Value::I16(_) => 3,
        Value::U32(_) => 4,
        Value::I32(_) => 5,
        Value::F32(_) => 6,
        Value::Bool(_) => 7,
        Value::String(_) => 8,
        Value::Array(_) => 9,
        Value::U64(_) => 10,
        Value::I64(_) => 11,
        Value::F64(_) => 12,
    }
}

fn write_str(w: &mut impl Write, s: &str) -> std::io::Result<()> {
    w.write_all(&(s.len() as u64).to_le_bytes())?;
    w.write_all(s.as_bytes())
}

fn write_value(w: &mut impl Write, v: &Value) -> std::io::Result<()> {
    match v {
        Value::U8(x) => w.write_all(&[*x]),
        Value::I8(x) => w.write_all(&x.to_le_bytes()),
        Value::U16(x) => w.write_all(&x.to_le_bytes()),
        Value::I16(x) => w.write_all(&x.to_le_bytes()),
        Value::U32(x) => w.write_all(&x.to_le_bytes()),
        Value::I32(x) => w.write_all(&x.to_le_bytes()),
        Value::U64(x) => w.write_all(&x.to_le_bytes()),
        Value::I64(x) => w.write_all(&x.to_le_bytes()),
        Value::F32(x) => w.write_all(&x.to_le_bytes()),
        Value::F64(x) => w.write_all(&x.to_le_bytes()),
        Value::Bool(x) => w.write_all(&[*x as u8]),
        Value::String(s) => write_str(w, s),
        Value::Array(items) => {
            let elem = items.first().map(value_type_id).unwrap_or(4);
            if items.iter().any(|i| value_type_id(i) != elem) {
                return Err(std::io::Error::other("a GGUF array holds values of one type"));
            }
            w.write_all(&elem.to_le_bytes())?;
            w.write_all(&(items.len() as u64).to_le_bytes())?;
            items.iter().try_for_each(|i| write_value(w, i))
        }
    }
}

/// Counts the bytes written: the file position, without seeking (which would flush the buffer).
struct Counted<W: Write> {
    inner: W,
    n: usize,
}

impl<W: Write> Write for Counted<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.n += n;
        Ok(n)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

/// Write a GGUF file: `metadata` (`general.alignment` is added), the tensors in order, each
/// tensor's bytes produced by `fill(i, writer)`. Tensor data starts at multiples of `alignment`.
pub fn write_gguf(
    path: &Path,
    metadata: &[(String, Value)],
    tensors: &[TensorHeader],
    alignment: usize,
    mut fill: impl FnMut(usize, &mut dyn Write) -> std::io::Result<()>,
) -> std::io::Result<()> {
    let file = File::create(path)?;
    let mut w = Counted { inner: BufWriter::with_capacity(8 << 20, file), n: 0 };
    write_header(&mut w, metadata, tensors, alignment)?;
    for (i, t) in tensors.iter().enumerate() {
        let before = w.n;
        fill(i, &mut w)?;
        if w.n - before != t.byte_len() {
            let got = w.n - before;
            return Err(std::io::Error::other(format!("tensor {} got {got} bytes, needs {}", t.name, t.byte_len())));
        }
        pad(&mut w, alignment)?;
    }
    let file = w.inner.into_inner().map_err(|e| e.into_error())?;
    file.sync_all()?;
    Ok(())
}

/// A GGUF of the full size whose tensor data is a hole (a sparse file reading as zeros): what
/// needs only the headers (`model plan`, `model inspect`) can size a model larger than the disk.
pub fn write_gguf_sparse(
    path: &Path,
    metadata: &[(String, Value)],
    tensors: &[TensorHeader],
    alignment: usize,
) -> std::io::Result<()> {
    let file = File::create(path)?;
    let mut w = Counted { inner: BufWriter::new(file), n: 0 };
    let data = write_header(&mut w, metadata, tensors, alignment)?;
    let header = w.n;
    let file = w.inner.into_inner().map_err(|e| e.into_error())?;
    file.set_len((header + data) as u64)?;
    file.sync_all()
}

/// The header (metadata, tensor infos, padding to the data); returns the data's length.
fn write_header<W: Write>(
    w: &mut Counted<W>,
    metadata: &[(String, Value)],
    tensors: &[TensorHeader],
    alignment: usize,
) -> std::io::Result<usize> {
    w.write_all(b"GGUF")?;
    w.write_all(&3u32.to_le_bytes())?;
    w.write_all(&(tensors.len() as u64).to_le_bytes())?;
    w.write_all(&(metadata.len() as u64 + 1).to_le_bytes())?;
    let mut kv: Vec<(String, Value)> = vec![("general.alignment".into(), Value::U32(alignment as u32))];
    kv.extend(metadata.iter().filter(|(k, _)| k != "general.alignment").cloned());
    for (key, value) in &kv {
        write_str(w, key)?;
        w.write_all(&value_type_id(value).to_le_bytes())?;
        write_value(w, value)?;
    }
    let mut offset = 0usize;
    for t in tensors {
        write_str(w, &t.name)?;
        w.write_all(&(t.shape.len() as u32).to_le_bytes())?;
        for d in t.shape.iter().rev() {
            w.write_all(&(*d as u64).to_le_bytes())?;
        }
        w.write_all(&t.dtype.gguf_type_id().to_le_bytes())?;
        w.write_all(&(offset as u64).to_le_bytes())?;
        offset = (offset + t.byte_len()).next_multiple_of(alignment);
    }
    pad(w, alignment)?;
    Ok(offset)
}

fn pad<W: Write>(w: &mut Counted<W>, alignment: usize) -> std::io::Result<()> {
    let pos = w.n;
    w.write_all(&vec![0u8; pos.next_multiple_of(alignment) - pos])
}
