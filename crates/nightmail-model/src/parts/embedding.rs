//! Token embeddings, read a row at a time where they lie and never held whole in memory. A step
//! reads one row per token (4 KiB at hidden 2048 in F16) of a table of `vocab` rows (125 MiB at
//! 32000 × 2048; Kimi K3's 163840 × 7168 BF16, 2.3 GB): of all the tensors a token reads, the
//! table gives the least per byte kept resident (the budget keeps resident first what every
//! token reads, largest benefit per byte first), so the engine's memory plan does not count it.
//!
//! - **Untied** (`output.weight` apart): each row is a `pread` of its bytes from the model file,
//!   on a descriptor of its own whose readahead is off (`POSIX_FADV_RANDOM`: a row reads its own
//!   page or two, not the kernel's initial readahead window around it). The read goes through
//!   the page cache: those pages are charged to the process's memory cgroup like any file page,
//!   but they are clean, reclaimed under pressure before anything is killed, and not in the
//!   process's RSS (nothing is mapped). A decode step reads one row per sequence, a prefill one
//!   per prompt token; rows of frequent tokens stay cached as long as the kernel likes.
//! - **Tied** (SmolLM2, the llama fixture): the output head keeps the table resident anyway, so
//!   its bytes serve the rows ([`Linear::row`]); there is no second copy.
//!
//! Either way a row is dequantized from the same bytes by the same code as a row of the mapped
//! tensor (`format::row_values`), so the values are the ones a resident table gave.

use crate::error::ModelError;
use nightmail_formats::FormatError;
use nightmail_tensor::TensorError;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::Arc;

use candle_core::{Device, Tensor};

use crate::error::Result;
use nightmail_formats::ModelFile;
use nightmail_tensor::Linear;
use nightmail_tensor::{TensorView, WeightDType, row_values};

pub struct Embedding {
    rows: usize,
    cols: usize,
    table: Table,
}

enum Table {
    /// Rows read from the model file when a step needs them.
    File(FileRows),
    /// The tied output head, which holds the same rows resident.
    Head(Arc<Linear>),
}

struct FileRows {
    name: String,
    dtype: WeightDType,
    file: File,
    path: PathBuf,
    /// Where row 0 starts in the file, and each row's bytes.
    offset: u64,
    row_bytes: usize,
}

/// Each row is read when a token asks for it, at no predictable place: readahead would only read
/// rows no token asked for. Linux: `POSIX_FADV_RANDOM` on this descriptor; macOS, which has no
/// `posix_fadvise`: `F_RDAHEAD` off.
fn no_readahead(file: &File) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    let fd = file.as_raw_fd();
    #[cfg(target_os = "linux")]
    {
        // SAFETY: a plain call on an open descriptor.
        let advice = unsafe { libc::posix_fadvise(fd, 0, 0, libc::POSIX_FADV_RANDOM) };
        if advice != 0 {
            return Err(std::io::Error::from_raw_os_error(advice));
        }
    }
    #[cfg(target_os = "macos")]
    // SAFETY: a plain call on an open descriptor.
    if unsafe { libc::fcntl(fd, libc::F_RDAHEAD, 0) } == -1 {
        return Err(std::io::Error::last_os_error());
    }
    let _ = fd;
    Ok(())
}

impl Embedding {
    /// The table `view` (`[rows, cols]`, checked by the caller), read from its file row by row.
    pub fn in_file(ck: &ModelFile, view: &TensorView<'_>, rows: usize, cols: usize) -> Result<Self> {
        let (path, offset) = ck.locate(view).ok_or_else(|| FormatError::Unsupported {
            what: format!("an embedding `{}` that lies in no model file", view.name),
            hint: "convert the model to GGUF".into(),
        })?;
        let io = |source| FormatError::Io { path: path.clone(), source };
        let file = File::open(&path).map_err(io)?;
        no_readahead(&file).map_err(io)?;
        let table = Table::File(FileRows {
            name: view.name.clone(),
            dtype: view.dtype,
            file,
            path,
            offset,
            row_bytes: view.bytes.len() / rows.max(1),
        });
        Ok(Embedding { rows, cols, table })
    }

    /// A table tied to the output head `head` (`[rows, cols]`): its rows come from the head.
    pub fn tied(head: Arc<Linear>, rows: usize, cols: usize) -> Self {
        Embedding { rows, cols, table: Table::Head(head) }
    }

    /// The rows of `tokens`, `[tokens, cols]` in f32; an id past the table is refused.
    pub fn rows(&self, tokens: &[u32]) -> Result<Tensor> {
        let mut data = Vec::with_capacity(tokens.len() * self.cols);
        let mut buf = Vec::new();
        for &t in tokens {
            let i = t as usize;
            if i >= self.rows {
                return Err(TensorError::TokenOutOfRange { id: t, vocab: self.rows }.into());
            }
            match &self.table {
                Table::Head(head) => data.extend(head.row(i)?),
                Table::File(f) => {
                    buf.resize(f.row_bytes, 0);
                    f.file.read_exact_at(&mut buf, f.offset + (i * f.row_bytes) as u64).map_err(|e| {
                        ModelError::EmbeddingRead { path: f.path.clone(), token: t, reason: e.to_string() }
                    })?;
                    data.extend(row_values(&f.name, f.dtype, self.cols, &buf)?);
                }
            }
        }
        Ok(Tensor::from_vec(data, (tokens.len(), self.cols), &Device::Cpu)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::quantized::{GgmlDType, QTensor};

    fn fixtures() -> Vec<PathBuf> {
        let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures");
        let mut dirs: Vec<PathBuf> = std::fs::read_dir(&root)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|d| d.join("config.json").is_file() && d.join("model.gguf").is_file())
            .collect();
        dirs.sort();
        dirs.into_iter().flat_map(|d| [d.join("model.gguf"), d]).collect()
    }

    fn bits(values: &[f32]) -> Vec<u32> {
        values.iter().map(|v| v.to_bits()).collect()
    }

    /// Every fixture, GGUF and safetensors: the rows read from the file (or from the head, where
    /// the two are tied) are the mapped table's rows bit for bit, and an id past the table is
    /// refused.
    #[test]
    fn rows_read_from_the_file_or_the_tied_head_are_the_mapped_tables() {
        let (mut tied, mut untied) = (0, 0);
        for path in fixtures() {
            let ck = ModelFile::open(&path).unwrap();
            let spec = crate::spec::ModelSpec::read(&ck).unwrap();
            let (vocab, hidden) = (spec.vocab_size, spec.hidden_size);
            let embd = ck.require("token_embd.weight").unwrap();
            let table = match ck.tensor("output.weight").unwrap() {
                Some(_) => {
                    untied += 1;
                    Embedding::in_file(&ck, &embd, vocab, hidden).unwrap()
                }
                None => {
                    tied += 1;
                    Embedding::tied(Arc::new(Linear::new(&embd, None).unwrap()), vocab, hidden)
                }
            };
            let tokens = [0, vocab as u32 - 1, vocab as u32 / 2, 0, 1];
            let got = table.rows(&tokens).unwrap().to_vec2::<f32>().unwrap();
            for (t, row) in tokens.iter().zip(&got) {
                assert_eq!(bits(row), bits(&embd.row(*t as usize).unwrap()), "{}: token {t}", path.display());
            }
            match table.rows(&[1, vocab as u32]) {
                Err(ModelError::Tensor(TensorError::TokenOutOfRange { id, vocab: v })) => {
                    assert_eq!((id as usize, v), (vocab, vocab))
                }
                other => panic!("{}: {:?}", path.display(), other.map(|t| t.dims().to_vec())),
            }
        }
        assert!(tied > 0 && untied > 0, "{tied} tied, {untied} untied fixtures");
    }

    /// A tied head's rows, whichever kernel holds it (its file blocks, the blocks repacked,
    /// candle's tensor, f32): the values its file row dequantizes to.
    #[test]
    fn a_tied_heads_rows_are_its_file_rows_in_every_type() {
        let (rows, cols) = (6, 256);
        let values: Vec<f32> = (0..rows * cols).map(|i| ((i * 7919 % 1009) as f32 - 504.0) / 97.0).collect();
        let x = Tensor::from_vec(values.clone(), (rows, cols), &Device::Cpu).unwrap();
        let mut cases: Vec<(WeightDType, Vec<u8>)> = [
            GgmlDType::F32,
            GgmlDType::F16,
            GgmlDType::BF16,
            GgmlDType::Q4_0,
            GgmlDType::Q4_1,
            GgmlDType::Q8_0,
            GgmlDType::Q6K,
        ]
        .into_iter()
        .map(|d| (d.into(), QTensor::quantize(&x, d).unwrap().data().unwrap().into_owned()))
        .collect();
        cases.push((WeightDType::Mxfp4, nightmail_tensor::kernel::mxfp4::quantize(&values)));
        for (dtype, bytes) in cases {
            let view = TensorView {
                name: "token_embd.weight".into(),
                dtype,
                shape: vec![rows, cols],
                bytes: &bytes,
                scale: None,
            };
            let table = Embedding::tied(Arc::new(Linear::new(&view, None).unwrap()), rows, cols);
            let got = table.rows(&[5, 0, 3]).unwrap().to_vec2::<f32>().unwrap();
            for (t, row) in [5, 0, 3].into_iter().zip(&got) {
                assert_eq!(bits(row), bits(&view.row(t).unwrap()), "{dtype:?}: row {t}");
            }
            assert!(
                matches!(table.rows(&[6]), Err(ModelError::Tensor(TensorError::TokenOutOfRange { id: 6, vocab: 6 }))),
                "{dtype:?}"
            );
        }
    }
}
