//! Where every routed expert's three matrices lie on disk: file, byte offset, length, element
//! type and shape, from a GGUF file (slices of the stacked `*_exps` tensors), a Hugging Face
//! directory (one tensor per matrix) or a packed file (one contiguous extent per expert).

use std::collections::HashMap;
use std::path::PathBuf;

use super::buf::ALIGN;
use crate::error::{EngineError, Result};
use crate::format::{Checkpoint, ExpertMatrix, TensorView, WeightDType};
use crate::model::ExpertId;
use crate::spec::ModelSpec;

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
}

/// A run of bytes read with one `pread`, covering one or more matrices of an expert.
#[derive(Debug, Clone)]
pub struct Run {
    pub file: usize,
    pub offset: u64,
    pub len: usize,
    /// Indices into the expert's matrices (gate, up, down) that the run covers.
    pub matrices: Vec<usize>,
}

#[derive(Debug, Clone)]
pub struct ExpertExtent {
    /// Gate, up, down.
    pub matrices: [MatrixExtent; 3],
    /// The reads that fetch it: matrices that are adjacent on disk (within one aligned block)
    /// share a read, so a packed expert is one read.
    pub runs: Vec<Run>,
}

impl ExpertExtent {
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
}

/// The three matrices of one expert, with their shapes checked against the model's metadata.
pub(crate) fn expert_views<'a>(ck: &'a Checkpoint, spec: &ModelSpec, id: ExpertId) -> Result<[TensorView<'a>; 3]> {
    let moe = spec.moe.as_ref().ok_or_else(|| EngineError::MissingMetadata { key: "expert_count".into() })?;
    let [gate, up, down] = ExpertMatrix::ALL.map(|m| ck.expert_matrix(id, m));
    let (gate, up, down) = (gate?, up?, down?);
    gate.expect_shape(&[moe.expert_ffn, spec.hidden_size])?;
    up.expect_shape(&[moe.expert_ffn, spec.hidden_size])?;
    down.expect_shape(&[spec.hidden_size, moe.expert_ffn])?;
    Ok([gate, up, down])
}

impl ExpertIndex {
    pub(crate) fn build(ck: &Checkpoint, spec: &ModelSpec) -> Result<Self> {
        let mut files: Vec<PathBuf> = Vec::new();
        let mut experts = HashMap::new();
        let Some(moe) = &spec.moe else { return Ok(ExpertIndex { files, experts }) };
        for layer in (0..spec.layers).filter(|l| spec.moe_layers[*l]) {
            for expert in 0..moe.experts {
                let id = ExpertId { layer, expert };
                let views = expert_views(ck, spec, id)?;
                let matrices = views.map(|v| {
                    let (path, offset) = ck.locate(&v).expect("a view borrows from one of the checkpoint's maps");
                    let file = match files.iter().position(|f| *f == path) {
                        Some(i) => i,
                        None => {
                            files.push(path);
                            files.len() - 1
                        }
                    };
                    MatrixExtent {
                        name: v.name.clone(),
                        file,
                        offset,
                        len: v.bytes.len(),
                        dtype: v.dtype,
                        shape: v.shape.clone(),
                    }
                });
                let runs = runs(&matrices);
                experts.insert(id, ExpertExtent { matrices, runs });
            }
        }
        Ok(ExpertIndex { files, experts })
    }

    pub fn get(&self, id: ExpertId) -> Option<&ExpertExtent> {
        self.experts.get(&id)
    }

    pub fn iter(&self) -> impl Iterator<Item = (&ExpertId, &ExpertExtent)> {
        self.experts.iter()
    }
}

/// Group matrices that lie in one file within one aligned block of each other into one read.
fn runs(matrices: &[MatrixExtent; 3]) -> Vec<Run> {
    let mut order: Vec<usize> = (0..3).collect();
    order.sort_by_key(|&i| (matrices[i].file, matrices[i].offset));
    let mut runs: Vec<Run> = Vec::new();
    for i in order {
        let m = &matrices[i];
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
