//! gpt-oss's experts as its Hugging Face checkpoints store them: one fused tensor per layer and
//! projection, `mlp.experts.gate_up_proj` `[E, hidden, 2·ffn]` and `down_proj` `[E, ffn, hidden]`
//! (laid out for `x · W`, transformers `GptOssExperts`), or the same as MXFP4 `_blocks`/`_scales`
//! pairs laid out `[E, rows, cols]` for `x · Wᵀ` (gpt-oss's own format); biases
//! `gate_up_proj_bias` `[E, 2·ffn]` and `down_proj_bias` `[E, hidden]`. The gate and up halves
//! interleave: `gate_up[..., ::2]` is the gate, `gate_up[..., 1::2]` the up projection.
//!
//! Neither is a per-expert `[out, in]` matrix the engine can borrow, so a layer's experts are
//! rebuilt once, on first use, in the engine's layout: float weights transposed to f32, MXFP4
//! rows repacked into ggml blocks (as llama.cpp's converter does for GGUF), biases as f32.

use super::mxfp4_pair::Mxfp4Pair;
use crate::error::Result;
use crate::names::ExpertMatrix;
use nightmail_tensor::TensorError;
use nightmail_tensor::TensorView;
use nightmail_tensor::WeightDType;

/// One matrix or bias in the engine's layout, owned.
pub struct OwnedTensor {
    pub name: String,
    pub dtype: WeightDType,
    pub shape: Vec<usize>,
    pub bytes: Vec<u8>,
}

impl OwnedTensor {
    fn f32(name: String, shape: Vec<usize>, values: impl Iterator<Item = f32>) -> Self {
        OwnedTensor { name, dtype: WeightDType::F32, shape, bytes: values.flat_map(f32::to_le_bytes).collect() }
    }

    pub fn view(&self) -> TensorView<'_> {
        TensorView {
            name: self.name.clone(),
            dtype: self.dtype,
            shape: self.shape.clone(),
            bytes: &self.bytes,
            scale: None,
        }
    }
}

/// One expert: gate, up and down matrices, and their biases.
pub struct FusedExpert {
    pub matrices: [OwnedTensor; 3],
    pub biases: [Option<OwnedTensor>; 3],
}

impl FusedExpert {
    pub fn matrix(&self, which: ExpertMatrix) -> &OwnedTensor {
        &self.matrices[slot(which)]
    }

    pub fn bias(&self, which: ExpertMatrix) -> Option<&OwnedTensor> {
        self.biases[slot(which)].as_ref()
    }
}

fn slot(which: ExpertMatrix) -> usize {
    match which {
        ExpertMatrix::Gate => 0,
        ExpertMatrix::Up => 1,
        ExpertMatrix::Down => 2,
    }
}

/// Where fused expert tensors are read from by their transformers names (a Hugging Face
/// directory).
pub trait FusedSource {
    fn float_tensor(&self, hf_name: &str) -> Result<Option<TensorView<'_>>>;
    fn mxfp4_pair(&self, name: &str) -> Result<Option<Mxfp4Pair<'_>>>;
}

/// Layer `layer`'s experts, if the directory stores them fused.
pub fn convert_layer(hf: &impl FusedSource, layer: usize) -> Result<Option<Vec<FusedExpert>>> {
    let p = format!("model.layers.{layer}.mlp.experts.");
    let (gate_up, down) = (format!("{p}gate_up_proj"), format!("{p}down_proj"));
    let mut experts = match (hf.mxfp4_pair(&gate_up)?, hf.mxfp4_pair(&down)?) {
        (Some(gu), Some(d)) => from_mxfp4(&gu, &d)?,
        _ => match (hf.float_tensor(&gate_up)?, hf.float_tensor(&down)?) {
            (Some(gu), Some(d)) => from_float(&gu, &d)?,
            _ => return Ok(None),
        },
    };
    if let Some(b) = hf.float_tensor(&format!("{gate_up}_bias"))? {
        let (values, [e, two_f]) = matrix_values(&b)?;
        check_experts(&b, e, experts.len())?;
        let f = two_f / 2;
        for (i, expert) in experts.iter_mut().enumerate() {
            let row = &values[i * two_f..(i + 1) * two_f];
            for (k, name) in [(0, "gate"), (1, "up")] {
                let values = (0..f).map(|j| row[2 * j + k]);
                expert.biases[k] = Some(OwnedTensor::f32(format!("{gate_up}_bias[{i}].{name}"), vec![f], values));
            }
        }
    }
    if let Some(b) = hf.float_tensor(&format!("{down}_bias"))? {
        let (values, [e, h]) = matrix_values(&b)?;
        check_experts(&b, e, experts.len())?;
        for (i, expert) in experts.iter_mut().enumerate() {
            let values = values[i * h..(i + 1) * h].iter().copied();
            expert.biases[2] = Some(OwnedTensor::f32(format!("{down}_bias[{i}]"), vec![h], values));
        }
    }
    Ok(Some(experts))
}

/// `[E, hidden, 2·ffn]` and `[E, ffn, hidden]` for `x · W`: each expert's halves transposed.
fn from_float(gate_up: &TensorView<'_>, down: &TensorView<'_>) -> Result<Vec<FusedExpert>> {
    let (gu, [e, h, two_f]) = stack_values(gate_up)?;
    let (d, [de, df, dh]) = stack_values(down)?;
    let f = two_f / 2;
    if (de, df, dh) != (e, f, h) {
        return Err(
            TensorError::Shape { name: down.name.clone(), found: down.shape.clone(), expected: vec![e, f, h] }.into()
        );
    }
    Ok((0..e)
        .map(|i| {
            let gu = &gu[i * h * two_f..(i + 1) * h * two_f];
            let d = &d[i * f * h..(i + 1) * f * h];
            // Output row r of the gate is column 2r of `gate_up` (of the up, 2r + 1).
            let half = |k: usize, name: &str| {
                let values = (0..f).flat_map(move |r| (0..h).map(move |c| gu[c * two_f + 2 * r + k]));
                OwnedTensor::f32(format!("{}[{i}].{name}", gate_up.name), vec![f, h], values)
            };
            let down_t = (0..h).flat_map(|r| (0..f).map(move |c| d[c * h + r]));
            FusedExpert {
                matrices: [
                    half(0, "gate"),
                    half(1, "up"),
                    OwnedTensor::f32(format!("{}[{i}]", down.name), vec![h, f], down_t),
                ],
                biases: [None, None, None],
            }
        })
        .collect())
}

/// MXFP4 `[E, 2·ffn, hidden]` and `[E, hidden, ffn]`, rows already outputs: even rows of the
/// first are the gate, odd rows the up projection.
fn from_mxfp4(gate_up: &Mxfp4Pair<'_>, down: &Mxfp4Pair<'_>) -> Result<Vec<FusedExpert>> {
    let shape_err = |p: &Mxfp4Pair<'_>, expected: Vec<usize>| TensorError::Shape {
        name: p.name.clone(),
        found: p.shape.clone(),
        expected,
    };
    let [e, two_f, h] = gate_up.shape[..] else { return Err(shape_err(gate_up, vec![0, 0, 0]).into()) };
    let f = two_f / 2;
    if down.shape != [e, h, f] {
        return Err(shape_err(down, vec![e, h, f]).into());
    }
    let mxfp4 =
        |name: String, shape: Vec<usize>, bytes: Vec<u8>| OwnedTensor { name, dtype: WeightDType::Mxfp4, shape, bytes };
    Ok((0..e)
        .map(|i| FusedExpert {
            matrices: [
                mxfp4(format!("{}[{i}].gate", gate_up.name), vec![f, h], gate_up.rows_to_ggml(i * two_f, 2, f)),
                mxfp4(format!("{}[{i}].up", gate_up.name), vec![f, h], gate_up.rows_to_ggml(i * two_f + 1, 2, f)),
                mxfp4(format!("{}[{i}]", down.name), vec![h, f], down.rows_to_ggml(i * h, 1, h)),
            ],
            biases: [None, None, None],
        })
        .collect())
}

fn stack_values(t: &TensorView<'_>) -> Result<(Vec<f32>, [usize; 3])> {
    let [e, r, c] = t.shape[..] else {
        return Err(TensorError::Shape { name: t.name.clone(), found: t.shape.clone(), expected: vec![0, 0, 0] }.into());
    };
    Ok((t.to_f32()?.flatten_all()?.to_vec1::<f32>()?, [e, r, c]))
}

fn matrix_values(t: &TensorView<'_>) -> Result<(Vec<f32>, [usize; 2])> {
    let [e, n] = t.shape[..] else {
        return Err(TensorError::Shape { name: t.name.clone(), found: t.shape.clone(), expected: vec![0, 0] }.into());
    };
    Ok((t.to_f32()?.flatten_all()?.to_vec1::<f32>()?, [e, n]))
}

fn check_experts(t: &TensorView<'_>, found: usize, experts: usize) -> Result<()> {
    if found != experts {
        let mut expected = t.shape.clone();
        expected[0] = experts;
        return Err(TensorError::Shape { name: t.name.clone(), found: t.shape.clone(), expected }.into());
    }
    Ok(())
}
