//! Where a layer's dense weights come from when it is built: the mapped model file (resident
//! layers, copied out once at load), or the buffers a streamed layer was read into. The parts
//! ask for tensors by their GGUF name and never learn which.

use std::cell::RefCell;
use std::sync::Arc;

use crate::error::{ModelError, Result};
use nightmail_formats::{ModelFile, is_expert_tensor};
use nightmail_tensor::Linear;
use nightmail_tensor::TensorView;
use nightmail_tensor::{AlignedBuf, WeightBytes};

/// Tensors by GGUF name (`blk.3.attn_q.weight`), and the matrices built over them.
pub trait WeightSource {
    fn tensor(&self, name: &str) -> Result<Option<TensorView<'_>>>;

    fn require(&self, name: &str) -> Result<TensorView<'_>> {
        Ok(self
            .tensor(name)?
            .ok_or_else(|| nightmail_formats::FormatError::MissingTensor { name: name.to_string() })?)
    }

    /// A vector of `n` elements stored in any shape (`[1, 1, heads, 1]` for KDA's A_log, `[w, 1,
    /// k]` for a convolution), as f32; another element count is refused naming the tensor.
    fn vector(&self, name: &str, n: usize) -> Result<Vec<f32>> {
        let v = self.require(name)?;
        if v.elem_count() != n {
            return Err(ModelError::from(nightmail_tensor::TensorError::Shape {
                name: v.name.clone(),
                found: v.shape.clone(),
                expected: vec![n],
            }));
        }
        Ok(v.to_f32()?.flatten_all()?.to_vec1()?)
    }

    /// A matrix over `weight`: copied out of a map, or (streamed) over the read buffer itself
    /// where the kernel computes from the file's blocks as they are.
    fn linear(&self, weight: &TensorView<'_>, bias: Option<&TensorView<'_>>) -> Result<Linear> {
        Ok(Linear::new(weight, bias)?)
    }
}

impl WeightSource for ModelFile {
    fn tensor(&self, name: &str) -> Result<Option<TensorView<'_>>> {
        Ok(ModelFile::tensor(self, name)?)
    }

    /// The error names the file, and a Hugging Face tensor by its transformers name.
    fn require(&self, name: &str) -> Result<TensorView<'_>> {
        Ok(ModelFile::require(self, name)?)
    }
}

/// One tensor a layer's build asked for: its GGUF name, and the view it got.
pub struct Recorded {
    pub name: String,
    pub dtype: nightmail_tensor::WeightDType,
    pub shape: Vec<usize>,
    /// Where its bytes lie: `None` when they are not a range of a file (rebuilt at load).
    pub location: Option<(std::path::PathBuf, u64)>,
    pub len: usize,
    /// Its second scale ([`TensorView::scale`]), which the file's other tensor holds.
    pub scale: Option<f32>,
}

/// A checkpoint that notes every tensor a build asks for, so a layer built once at load can be
/// read again later from exactly those extents. The build sees each tensor's name, type and
/// shape as the file's header gives them (a missing, misshapen or truncated tensor fails as it
/// would resident), but zeros in place of its bytes: checking a streamed layer reads none of
/// its weights (for Kimi K3's spine, ~100 GB at start-up that would also fill the page cache).
pub struct Recording<'a> {
    ck: &'a ModelFile,
    seen: RefCell<Vec<Recorded>>,
    /// Zeros, at least as long as any tensor the build asks for (see [`Recording::blank`]).
    blank: Arc<AlignedBuf>,
}

impl<'a> Recording<'a> {
    pub fn new(ck: &'a ModelFile, blank: Arc<AlignedBuf>) -> Self {
        Recording { ck, seen: RefCell::new(Vec::new()), blank }
    }

    /// The zeros every layer's build reads: as long as the checkpoint's largest tensor that is
    /// not a routed expert's (reading them maps the kernel's zero page, no memory).
    pub fn blank(ck: &ModelFile) -> Result<Arc<AlignedBuf>> {
        let all = ck.all_tensors()?;
        let longest = all.iter().filter(|t| !is_expert_tensor(&t.name)).map(|t| t.bytes.len()).max();
        Ok(Arc::new(AlignedBuf::zeroed(longest.unwrap_or(0))))
    }

    pub fn take(&self) -> Vec<Recorded> {
        std::mem::take(&mut self.seen.borrow_mut())
    }
}

impl WeightSource for Recording<'_> {
    fn tensor(&self, name: &str) -> Result<Option<TensorView<'_>>> {
        // The header's view: its extent was checked against the file; its bytes are not read.
        let Some(v) = self.ck.tensor(name)? else { return Ok(None) };
        let mut seen = self.seen.borrow_mut();
        if !seen.iter().any(|r| r.name == name) {
            seen.push(Recorded {
                name: name.to_string(),
                dtype: v.dtype,
                shape: v.shape.clone(),
                location: self.ck.locate(&v),
                len: v.bytes.len(),
                scale: v.scale,
            });
        }
        // Only a routed expert's stacked tensor is longer, and no layer build asks for one; if
        // one did, it would read the map as a resident build does.
        let Some(bytes) = self.blank.as_slice().get(..v.bytes.len()) else { return Ok(Some(v)) };
        Ok(Some(TensorView { bytes, ..v }))
    }

    fn require(&self, name: &str) -> Result<TensorView<'_>> {
        match self.tensor(name)? {
            Some(view) => Ok(view),
            None => Ok(self.ck.require(name)?),
        }
    }

    /// Over the zeros themselves, as a streamed layer's matrices are over its read buffers: the
    /// kernels that compute from the file's blocks copy nothing here either.
    fn linear(&self, weight: &TensorView<'_>, bias: Option<&TensorView<'_>>) -> Result<Linear> {
        if std::ptr::eq(weight.bytes.as_ptr(), self.blank.as_slice().as_ptr()) {
            Ok(Linear::from_bytes(weight, WeightBytes::Shared(self.blank.clone(), 0..weight.bytes.len()), bias)?)
        } else {
            Ok(Linear::new(weight, bias)?)
        }
    }
}

/// Layer `l`'s tensors, named as after `blk.{l}.`: what every part's `load` reads its weights
/// through, from a mapped file or a streamed layer's buffers alike.
pub struct LayerTensors<'a> {
    pub source: &'a dyn WeightSource,
    pub layer: usize,
}

impl<'a> LayerTensors<'a> {
    pub fn new(source: &'a dyn WeightSource, layer: usize) -> Self {
        LayerTensors { source, layer }
    }

    pub fn require(&self, name: &str) -> Result<TensorView<'a>> {
        self.source.require(&format!("blk.{}.{name}", self.layer))
    }

    pub fn opt(&self, name: &str) -> Result<Option<TensorView<'a>>> {
        self.source.tensor(&format!("blk.{}.{name}", self.layer))
    }

    /// `{name}.weight` `[rows, cols]`, with `{name}.bias` where the file has one.
    pub fn linear(&self, name: &str, rows: usize, cols: usize) -> Result<Linear> {
        let w = self.require(&format!("{name}.weight"))?;
        w.expect_shape(&[rows, cols])?;
        self.source.linear(&w, self.opt(&format!("{name}.bias"))?.as_ref())
    }

    /// `{name}.weight` `[rows, cols]`, a projection that has no bias.
    pub fn weight(&self, name: &str, rows: usize, cols: usize) -> Result<Linear> {
        let w = self.require(&format!("{name}.weight"))?;
        w.expect_shape(&[rows, cols])?;
        self.source.linear(&w, None)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::spec::ModelSpec;
    use crate::{ExpertStore, ResidentExperts, Transformer};

    const PAGE: usize = 4096;

    /// Pages of a mapped file made unreadable while the guard lives (mprotect(2) `PROT_NONE`):
    /// touching one of them kills the test with SIGSEGV, so a load that returns read none.
    struct Unreadable(Vec<(usize, usize)>);

    impl Unreadable {
        fn new(pages: Vec<(usize, usize)>) -> Self {
            for &(start, len) in &pages {
                // SAFETY: `start..start + len` is whole pages of a live read-only file map.
                let rc = unsafe { libc::mprotect(start as *mut libc::c_void, len, libc::PROT_NONE) };
                assert_eq!(rc, 0, "mprotect: {}", std::io::Error::last_os_error());
            }
            Unreadable(pages)
        }
    }

    impl Drop for Unreadable {
        fn drop(&mut self) {
            for &(start, len) in &self.0 {
                // SAFETY: as in `new`; the map was read-only to begin with.
                unsafe { libc::mprotect(start as *mut libc::c_void, len, libc::PROT_READ) };
            }
        }
    }

    /// The whole pages inside the layers' tensors (`blk.*`, dense and expert) that no other
    /// tensor shares, and how many of those bytes hold dense layer weights.
    fn layer_pages(ck: &ModelFile) -> (Vec<(usize, usize)>, usize) {
        let all = ck.all_tensors().unwrap();
        let span = |v: &TensorView<'_>| (v.bytes.as_ptr() as usize, v.bytes.as_ptr() as usize + v.bytes.len());
        let others: Vec<(usize, usize)> = all.iter().filter(|v| !v.name.starts_with("blk.")).map(span).collect();
        let (mut pages, mut dense) = (Vec::new(), 0);
        for v in all.iter().filter(|v| v.name.starts_with("blk.")) {
            let (a, b) = span(v);
            let (start, end) = (a.next_multiple_of(PAGE), b / PAGE * PAGE);
            for p in (start..end).step_by(PAGE) {
                if others.iter().all(|&(x, y)| y <= p || x >= p + PAGE) {
                    pages.push((p, PAGE));
                    dense += if is_expert_tensor(&v.name) { 0 } else { PAGE };
                }
            }
        }
        (pages, dense)
    }

    /// A memory budget's load builds each streamed layer once to check it and to note its
    /// extents, from the tensor headers: with every layer's pages unreadable it still loads and
    /// notes, for each layer, every dense tensor the file has for it where the file holds it.
    #[test]
    fn load_notes_streamed_layers_extents_without_reading_their_bytes() {
        let mut guarded = (0, 0);
        for arch in ["qwen3_moe", "deepseek_v3", "gpt_oss", "kimi_linear", "qwen3_next", "llama"] {
            let path = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
                .join("../../tests/fixtures")
                .join(arch)
                .join("model.gguf");
            let ck = ModelFile::open(&path).unwrap();
            let spec = ModelSpec::read(&ck).unwrap();
            // The experts stay resident here (copied out before the guard): only the dense
            // layers stream.
            let experts: Arc<dyn ExpertStore> = Arc::new(ResidentExperts::load(&ck, &spec).unwrap());
            let (pages, dense) = layer_pages(&ck);
            let dense_bytes: usize = ck
                .all_tensors()
                .unwrap()
                .iter()
                .filter(|v| v.name.starts_with("blk.") && !is_expert_tensor(&v.name))
                .map(|v| v.bytes.len())
                .sum();
            // The tiny fixtures' tensors share pages; each still has whole pages of dense weights.
            assert!(dense > 0 && dense_bytes > 0, "{arch}: no dense page guarded of {dense_bytes} bytes");
            guarded = (guarded.0 + dense, guarded.1 + dense_bytes);
            let guard = Unreadable::new(pages);
            let streamed = vec![true; spec.layers];
            let (_net, recorded) = Transformer::load(&ck, &spec, experts, 0, &streamed).unwrap();
            drop(guard);
            let mut want: BTreeMap<String, (u64, usize)> = BTreeMap::new();
            for v in ck.all_tensors().unwrap() {
                if v.name.starts_with("blk.") && !is_expert_tensor(&v.name) {
                    want.insert(v.name.clone(), (ck.locate(&v).unwrap().1, v.bytes.len()));
                }
            }
            let got: BTreeMap<String, (u64, usize)> = recorded
                .into_iter()
                .flat_map(|r| r.expect("every layer streams"))
                .map(|r| (r.name, (r.location.expect("a range of the file").1, r.len)))
                .collect();
            assert_eq!(got, want, "{arch}");
        }
        assert!(2 * guarded.0 >= guarded.1, "only {guarded:?} dense bytes guarded");
    }
}
