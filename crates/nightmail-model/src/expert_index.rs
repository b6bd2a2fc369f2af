//! Where every routed expert's three matrices (and their biases, gpt-oss) lie on disk: file,
//! byte offset, length, element type and shape, from a GGUF file (slices of the stacked `*_exps`
//! tensors), a Hugging Face directory (one tensor per matrix) or a packed file (one contiguous
//! extent per expert).

use nightmail_formats::FormatError;
use std::collections::HashMap;
use std::path::PathBuf;

use crate::error::Result;
use crate::spec::{Activation, ModelSpec};
use nightmail_formats::ExpertId;
use nightmail_formats::{ExpertMatrix, ModelFile};
use nightmail_tensor::ALIGN;
use nightmail_tensor::{TensorView, WeightDType};

/// One matrix of one expert on disk.
#[derive(Debug, Clone)]
pub struct MatrixExtent {
    pub name: String,
    pub file: usize,
    pub offset: u64,
    pub len: usize,
    /// MXFP4 experts are 17 bytes per 32 weights, like any block type sized by [`WeightDType`].
    pub dtype: WeightDType,
    pub shape: Vec<usize>,
    /// Its second scale ([`TensorView::scale`]): a value of another tensor, kept here.
    pub scale: Option<f32>,
}

/// A run of bytes read with one `pread`, covering one or more matrices of an expert.
#[derive(Debug, Clone)]
pub struct Run {
    pub file: usize,
    pub offset: u64,
    pub len: usize,
    /// The parts the run covers (an expert's [`ExpertExtent::part`]: 0-2 the gate, up and down
    /// matrices, 3-5 their biases; a streamed layer's tensors in the order its build asked).
    pub matrices: Vec<usize>,
}

#[derive(Debug, Clone)]
pub struct ExpertExtent {
    /// Gate, up, down.
    pub matrices: [MatrixExtent; 3],
    /// Their biases, where the model has them: read with the expert, so that a streamed expert
    /// computes what the resident one does.
    pub biases: [Option<MatrixExtent>; 3],
    /// The reads that fetch it: matrices that are adjacent on disk (within one aligned block)
    /// share a read, so a packed expert is one read.
    pub runs: Vec<Run>,
}

impl ExpertExtent {
    /// Part `i`: a matrix (0-2) or a bias (3-5).
    pub fn part(&self, i: usize) -> Option<&MatrixExtent> {
        match i {
            0..3 => Some(&self.matrices[i]),
            _ => self.biases.get(i - 3)?.as_ref(),
        }
    }

    /// Every part the expert has, with its index.
    pub fn parts(&self) -> impl Iterator<Item = (usize, &MatrixExtent)> {
        (0..6).filter_map(|i| self.part(i).map(|p| (i, p)))
    }

    /// Bytes the expert occupies in memory once read (the runs, widened to aligned blocks).
    pub fn buffer_bytes(&self) -> usize {
        self.runs.iter().map(|r| aligned_span(r.offset, r.len)).sum()
    }
}

/// The bytes an aligned read of `[offset, offset + len)` covers.
pub fn aligned_span(offset: u64, len: usize) -> usize {
    let a = ALIGN as u64;
    let start = offset / a * a;
    ((offset + len as u64).div_ceil(a) * a - start) as usize
}

pub struct ExpertIndex {
    pub files: Vec<PathBuf>,
    experts: HashMap<ExpertId, ExpertExtent>,
    /// The experts' activation, which the store builds them with.
    pub activation: Activation,
}

/// The three matrices of one expert, with their shapes checked against the model's metadata.
pub fn expert_views<'a>(ck: &'a ModelFile, spec: &ModelSpec, id: ExpertId) -> Result<[TensorView<'a>; 3]> {
    let moe = spec.moe.as_ref().ok_or_else(|| FormatError::MissingMetadata { key: "expert_count".into() })?;
    let [gate, up, down] = ExpertMatrix::ALL.map(|m| ck.expert_matrix(id, m));
    let (gate, up, down) = (gate?, up?, down?);
    // A Stable LatentMoE expert (Kimi K3) reads and writes the latent width.
    let width = moe.expert_width(spec.hidden_size);
    gate.expect_shape(&[moe.expert_ffn, width])?;
    up.expect_shape(&[moe.expert_ffn, width])?;
    down.expect_shape(&[width, moe.expert_ffn])?;
    Ok([gate, up, down])
}

/// The biases of one expert's gate, up and down matrices, where the model has them, with their
/// lengths checked against the model's metadata.
pub fn expert_biases<'a>(ck: &'a ModelFile, spec: &ModelSpec, id: ExpertId) -> Result<[Option<TensorView<'a>>; 3]> {
    let moe = spec.moe.as_ref().ok_or_else(|| FormatError::MissingMetadata { key: "expert_count".into() })?;
    let lens = [moe.expert_ffn, moe.expert_ffn, moe.expert_width(spec.hidden_size)];
    let [gate, up, down] = ExpertMatrix::ALL.map(|m| ck.expert_bias(id, m));
    let biases = [gate?, up?, down?];
    for (b, len) in biases.iter().zip(lens) {
        if let Some(b) = b {
            b.expect_shape(&[len])?;
        }
    }
    Ok(biases)
}

/// The layers whose routed experts lie on disk for the model to read: its MoE layers, and the
/// MTP layer where the checkpoint ships one with experts (`mtp.rs`), which draws on the
/// same store and cache when it drafts.
pub fn expert_layers(ck: &ModelFile, spec: &ModelSpec) -> Result<Vec<usize>> {
    let mut layers: Vec<usize> = (0..spec.layers).filter(|l| spec.moe_layers[*l]).collect();
    layers.extend(crate::nextn::moe_layer(ck, spec)?);
    Ok(layers)
}

impl ExpertIndex {
    pub fn build(ck: &ModelFile, spec: &ModelSpec) -> Result<Self> {
        let mut files: Vec<PathBuf> = Vec::new();
        let mut experts = HashMap::new();
        let Some(moe) = &spec.moe else {
            return Ok(ExpertIndex { files, experts, activation: Activation::SwiGlu });
        };
        let mut extent = |v: &TensorView<'_>| -> Result<MatrixExtent> {
            // gpt-oss's fused Hugging Face experts are rebuilt in memory: there is no extent of
            // the file to read them from.
            let (path, offset) = ck.locate(v).ok_or_else(|| FormatError::Unsupported {
                what: format!("streaming gpt-oss's fused Hugging Face experts ({})", v.name),
                hint: "they are rebuilt in memory at load, so no part of the file holds them as the engine \
                       reads them: load the model without a cache budget (expert_cache_mb, --cache-mb), or \
                       convert it to GGUF (llama.cpp convert_hf_to_gguf.py) and stream that"
                    .into(),
            })?;
            let file = match files.iter().position(|f| *f == path) {
                Some(i) => i,
                None => {
                    files.push(path);
                    files.len() - 1
                }
            };
            Ok(MatrixExtent {
                name: v.name.clone(),
                file,
                offset,
                len: v.bytes.len(),
                dtype: v.dtype,
                shape: v.shape.clone(),
                scale: v.scale,
            })
        };
        for layer in expert_layers(ck, spec)? {
            for expert in 0..moe.experts {
                let id = ExpertId { layer, expert };
                let [g, u, d] = expert_views(ck, spec, id)?;
                let matrices = [extent(&g)?, extent(&u)?, extent(&d)?];
                let mut biases = [None, None, None];
                for (slot, b) in biases.iter_mut().zip(expert_biases(ck, spec, id)?) {
                    *slot = b.map(|b| extent(&b)).transpose()?;
                }
                let mut e = ExpertExtent { matrices, biases, runs: Vec::new() };
                e.runs = runs(e.parts());
                experts.insert(id, e);
            }
        }
        Ok(ExpertIndex { files, experts, activation: moe.activation })
    }

    pub fn get(&self, id: ExpertId) -> Option<&ExpertExtent> {
        self.experts.get(&id)
    }

    pub fn iter(&self) -> impl Iterator<Item = (&ExpertId, &ExpertExtent)> {
        self.experts.iter()
    }
}

/// Group parts (an expert's matrices, a layer's tensors: index and extent) that lie in one file
/// within one aligned block of each other into one read.
pub fn runs<'a>(parts: impl Iterator<Item = (usize, &'a MatrixExtent)>) -> Vec<Run> {
    let mut order: Vec<(usize, &MatrixExtent)> = parts.collect();
    order.sort_by_key(|(_, m)| (m.file, m.offset));
    let mut runs: Vec<Run> = Vec::new();
    for (i, m) in order {
        if let Some(run) = runs.last_mut() {
            let end = run.offset + run.len as u64;
            if run.file == m.file && m.offset >= end && m.offset - end <= ALIGN as u64 {
                run.len = (m.offset + m.len as u64 - run.offset) as usize;
                run.matrices.push(i);
                continue;
            }
        }
        runs.push(Run { file: m.file, offset: m.offset, len: m.len, matrices: vec![i] });
    }
    runs
}

#[cfg(test)]
mod tests {
    use nightmail_formats::gguf_write::{TensorHeader, write_gguf};
    use nightmail_formats::{ExpertId, ExpertMatrix, GgufFile, ModelFile};

    use crate::spec::ModelSpec;
    use crate::spec::test_files::{fixture, load_error};

    /// The Qwen3-MoE fixture as llama.cpp's `--fuse-gate-up-exps` writes it: each layer's
    /// `ffn_gate_exps` and `ffn_up_exps` as one `ffn_gate_up_exps`, every expert's gate rows
    /// then its up rows.
    fn fused_gate_up(out: &std::path::Path) -> std::path::PathBuf {
        let g = GgufFile::open(&fixture("qwen3_moe").join("model.gguf")).unwrap();
        let tensors = g.all_tensors().unwrap();
        let find = |name: &str| tensors.iter().find(|t| t.name == name).unwrap();
        let mut headers = Vec::new();
        let mut data: Vec<Vec<u8>> = Vec::new();
        for t in tensors.iter().filter(|t| !t.name.contains("ffn_up_exps")) {
            match t.name.strip_suffix(".ffn_gate_exps.weight") {
                Some(block) => {
                    let up = find(&format!("{block}.ffn_up_exps.weight"));
                    let [e, f, h] = t.shape[..] else { panic!("{:?}", t.shape) };
                    let per = t.bytes.len() / e;
                    let bytes =
                        (0..e).flat_map(|i| [&t.bytes[i * per..(i + 1) * per], &up.bytes[i * per..(i + 1) * per]]);
                    headers.push(TensorHeader::new(
                        format!("{block}.ffn_gate_up_exps.weight"),
                        t.dtype,
                        &[e, 2 * f, h],
                    ));
                    data.push(bytes.flatten().copied().collect());
                }
                None => {
                    headers.push(TensorHeader::new(&t.name, t.dtype, &t.shape));
                    data.push(t.bytes.to_vec());
                }
            }
        }
        let metadata: Vec<_> = g
            .metadata()
            .iter()
            .filter(|(k, _)| k.as_str() != "general.alignment")
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let path = out.join("fused.gguf");
        write_gguf(&path, &metadata, &headers, 32, |i, w| w.write_all(&data[i])).unwrap();
        path
    }

    #[test]
    fn fused_gate_up_experts_read_as_the_separate_ones() {
        let dir = tempfile::tempdir().unwrap();
        let fused = fused_gate_up(dir.path());
        let (plain, both) =
            (ModelFile::open(&fixture("qwen3_moe").join("model.gguf")).unwrap(), ModelFile::open(&fused).unwrap());
        let spec = ModelSpec::read(&plain).unwrap();
        assert_eq!(ModelSpec::read(&both).unwrap(), spec);
        let experts = spec.moe.as_ref().expect("experts").experts;
        for layer in (0..spec.layers).filter(|&l| spec.moe_layers[l]) {
            for expert in 0..experts {
                for m in ExpertMatrix::ALL {
                    let id = ExpertId { layer, expert };
                    let (a, b) = (plain.expert_matrix(id, m).unwrap(), both.expert_matrix(id, m).unwrap());
                    assert_eq!((a.dtype, &a.shape, a.bytes), (b.dtype, &b.shape, b.bytes), "{id:?} {m:?}");
                }
            }
        }
        assert_eq!(load_error(&fused), None, "the fused file loads whole");
    }
}
