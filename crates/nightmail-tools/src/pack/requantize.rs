//! `model pack --dense q8_0|q4_0`: the non-expert weights (the "spine" read for every token)
//! requantized while packing, as deltafin's int8 spine shrinks them; routed experts are copied
//! as they are. Which tensors follow llama.cpp's `llama_model_quantize_impl`
//! (src/llama-quant.cpp): only 2-D weights whose rows are whole blocks, never norms and never
//! the router (`ffn_gate_inp`, kept in f32 there too); the output head keeps 8 bits when the
//! rest goes to 4 (llama.cpp gives it more bits than the body as well). The blocks are
//! candle's `from_float`, which follows ggml's `quantize_row_q8_0_ref` / `quantize_row_q4_0_ref`.

use candle_core::quantized::{GgmlDType, QTensor};
use nightmail_tensor::TensorError;

use nightmail_engine::Result;
use nightmail_tensor::{TensorView, WeightDType};

/// The type the spine is requantized to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DenseQuant {
    Q8_0,
    Q4_0,
}

impl DenseQuant {
    fn ggml(self) -> GgmlDType {
        match self {
            DenseQuant::Q8_0 => GgmlDType::Q8_0,
            DenseQuant::Q4_0 => GgmlDType::Q4_0,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            DenseQuant::Q8_0 => "q8_0",
            DenseQuant::Q4_0 => "q4_0",
        }
    }
}

impl std::str::FromStr for DenseQuant {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s.to_ascii_lowercase().as_str() {
            "q8_0" => Ok(DenseQuant::Q8_0),
            "q4_0" => Ok(DenseQuant::Q4_0),
            other => Err(format!("`{other}` is not a dense type: use q8_0 or q4_0")),
        }
    }
}

/// Whether tensor `name` is an output head: `output.weight`, the token embedding where the model
/// has no `output.weight` (`tied`), or the MTP layer's own head where it has one.
pub(crate) fn is_head(name: &str, tied: bool) -> bool {
    name == "output.weight" || (tied && name == "token_embd.weight") || name.ends_with(".nextn.shared_head_head.weight")
}

/// The type a non-expert tensor gets, or `None` where it is copied as it is. `head` says the
/// tensor is an output head ([`is_head`]).
pub(crate) fn target(view: &TensorView<'_>, to: DenseQuant, head: bool) -> Option<GgmlDType> {
    target_of(&view.name, view.dtype, &view.shape, to, head)
}

/// [`target`] from a tensor's header alone (`model synth --dense` writes the spine in the type
/// that packing would give it).
pub(crate) fn target_of(
    name: &str,
    dtype: WeightDType,
    shape: &[usize],
    to: DenseQuant,
    head: bool,
) -> Option<GgmlDType> {
    let float = matches!(dtype, WeightDType::F32 | WeightDType::F16 | WeightDType::BF16);
    let [_, cols] = shape[..] else { return None };
    if !float || !name.ends_with(".weight") || name.contains("norm") || name.contains("ffn_gate_inp") {
        return None;
    }
    let ggml = if head { GgmlDType::Q8_0 } else { to.ggml() };
    cols.is_multiple_of(ggml.block_size()).then_some(ggml)
}

/// `view`'s values in `dtype`'s blocks.
pub(crate) fn requantize(view: &TensorView<'_>, dtype: GgmlDType) -> Result<Vec<u8>> {
    let values = view.to_f32()?;
    let q = QTensor::quantize(&values, dtype)
        .map_err(|e| TensorError::Compute(candle_core::Error::Msg(format!("requantizing {}: {e}", view.name))))?;
    Ok(q.data()?.into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view<'a>(name: &str, dtype: WeightDType, shape: &[usize], bytes: &'a [u8]) -> TensorView<'a> {
        TensorView { name: name.into(), dtype, shape: shape.to_vec(), bytes, scale: None }
    }

    #[test]
    fn only_float_matrices_of_whole_blocks_outside_norms_and_routers_are_requantized() {
        let b = [0u8; 0];
        let q8 = DenseQuant::Q8_0;
        assert_eq!(
            target(&view("blk.0.attn_q.weight", WeightDType::F16, &[64, 32], &b), q8, false),
            Some(GgmlDType::Q8_0)
        );
        assert_eq!(
            target(&view("blk.0.attn_q.weight", WeightDType::F16, &[64, 32], &b), DenseQuant::Q4_0, false),
            Some(GgmlDType::Q4_0)
        );
        // The head keeps 8 bits.
        assert_eq!(
            target(&view("output.weight", WeightDType::F32, &[100, 64], &b), DenseQuant::Q4_0, true),
            Some(GgmlDType::Q8_0)
        );
        for skipped in [
            view("blk.0.ffn_gate_inp.weight", WeightDType::F32, &[8, 32], &b),
            view("blk.0.attn_norm.weight", WeightDType::F32, &[32], &b),
            view("blk.0.attn_q_a_norm.weight", WeightDType::F32, &[1, 32], &b),
            view("blk.0.ssm_f_b.weight", WeightDType::F32, &[32, 8], &b),
            view("blk.0.attn_k_b.weight", WeightDType::F32, &[4, 16, 32], &b),
            view("blk.0.attn_q.bias", WeightDType::F32, &[1, 64], &b),
            view("blk.0.attn_q.weight", WeightDType::Ggml(GgmlDType::Q4_1), &[64, 32], &b),
        ] {
            assert_eq!(target(&skipped, q8, false), None, "{}", skipped.name);
        }
    }

    #[test]
    fn q8_0_blocks_hold_the_values_to_within_half_a_step_and_the_f16_scales_rounding() {
        let values: Vec<f32> = (0..64).map(|i| ((i * 37 % 64) as f32 - 31.5) / 10.0).collect();
        let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        let v = view("blk.0.attn_q.weight", WeightDType::F32, &[2, 32], &bytes);
        let q = requantize(&v, GgmlDType::Q8_0).unwrap();
        assert_eq!(q.len(), 2 * 34);
        let back = view("q", WeightDType::Ggml(GgmlDType::Q8_0), &[2, 32], &q).to_f32().unwrap();
        let back: Vec<f32> = back.flatten_all().unwrap().to_vec1().unwrap();
        for (row, (a, b)) in values.chunks(32).zip(back.chunks(32)).enumerate() {
            let step = a.iter().fold(0f32, |m, x| m.max(x.abs())) / 127.0;
            let worst = a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0f32, f32::max);
            // The scale is stored as f16 (11 bits): up to 127 of its rounding error on top.
            let bound = step / 2.0 + 127.0 * step / 2048.0;
            assert!(worst <= bound, "row {row}: {worst} > {bound}");
        }
    }
}
