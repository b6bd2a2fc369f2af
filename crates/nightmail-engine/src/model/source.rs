//! Where a layer's dense weights come from when it is built: the mapped model file (resident
//! layers, copied out once at load), or the buffers a streamed layer was read into. The parts
//! ask for tensors by their GGUF name and never learn which.

use std::cell::RefCell;

use super::layers::Linear;
use crate::error::Result;
use crate::format::{Checkpoint, TensorView};

/// Tensors by GGUF name (`blk.3.attn_q.weight`), and the matrices built over them.
pub(crate) trait WeightSource {
    fn tensor(&self, name: &str) -> Result<Option<TensorView<'_>>>;

    fn require(&self, name: &str) -> Result<TensorView<'_>> {
        self.tensor(name)?.ok_or_else(|| crate::EngineError::MissingTensor { name: name.to_string() })
    }

    /// A vector of `n` elements stored in any shape (`[1, 1, heads, 1]` for KDA's A_log, `[w, 1,
    /// k]` for a convolution), as f32; another element count is refused naming the tensor.
    fn vector(&self, name: &str, n: usize) -> Result<Vec<f32>> {
        let v = self.require(name)?;
        if v.elem_count() != n {
            return Err(crate::EngineError::Shape { name: v.name.clone(), found: v.shape.clone(), expected: vec![n] });
        }
        Ok(v.to_f32()?.flatten_all()?.to_vec1()?)
    }

    /// A matrix over `weight`: copied out of a map, or (streamed) over the read buffer itself
    /// where the kernel computes from the file's blocks as they are.
    fn linear(&self, weight: &TensorView<'_>, bias: Option<&TensorView<'_>>) -> Result<Linear> {
        Linear::new(weight, bias)
    }
}

impl WeightSource for Checkpoint {
    fn tensor(&self, name: &str) -> Result<Option<TensorView<'_>>> {
        Checkpoint::tensor(self, name)
    }

    /// The error names the file, and a Hugging Face tensor by its transformers name.
    fn require(&self, name: &str) -> Result<TensorView<'_>> {
        Checkpoint::require(self, name)
    }
}

/// One tensor a layer's build asked for: its GGUF name, and the view it got.
pub(crate) struct Recorded {
    pub name: String,
    pub dtype: crate::format::WeightDType,
    pub shape: Vec<usize>,
    /// Where its bytes lie: `None` when they are not a range of a file (rebuilt at load).
    pub location: Option<(std::path::PathBuf, u64)>,
    pub len: usize,
}

/// A checkpoint that notes every tensor a build asks for, so a layer built once at load can be
/// read again later from exactly those extents.
pub(crate) struct Recording<'a> {
    ck: &'a Checkpoint,
    seen: RefCell<Vec<Recorded>>,
}

impl<'a> Recording<'a> {
    pub fn new(ck: &'a Checkpoint) -> Self {
        Recording { ck, seen: RefCell::new(Vec::new()) }
    }

    pub fn take(&self) -> Vec<Recorded> {
        std::mem::take(&mut self.seen.borrow_mut())
    }
}

impl WeightSource for Recording<'_> {
    fn tensor(&self, name: &str) -> Result<Option<TensorView<'_>>> {
        let view = self.ck.tensor(name)?;
        if let Some(v) = &view {
            let mut seen = self.seen.borrow_mut();
            if !seen.iter().any(|r| r.name == name) {
                seen.push(Recorded {
                    name: name.to_string(),
                    dtype: v.dtype,
                    shape: v.shape.clone(),
                    location: self.ck.locate(v),
                    len: v.bytes.len(),
                });
            }
        }
        Ok(view)
    }

    fn require(&self, name: &str) -> Result<TensorView<'_>> {
        match self.tensor(name)? {
            Some(view) => Ok(view),
            None => self.ck.require(name),
        }
    }
}
