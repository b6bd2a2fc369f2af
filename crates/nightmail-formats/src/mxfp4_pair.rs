//! MXFP4 as Hugging Face safetensors store it (gpt-oss): the nibbles in `{name}_blocks`
//! `[..., rows, cols/32, 16]` and the E8M0 scales in `{name}_scales` `[..., rows, cols/32]`, both
//! `U8`. The element order differs from ggml's: in transformers' `convert_moe_packed_tensors`
//! (`integrations/mxfp4.py`) byte j of a block holds element 2j in its low nibble and 2j+1 in
//! its high nibble (`sub[:, 0::2] = lut[idx_lo]`, `sub[:, 1::2] = lut[idx_hi]`), each value
//! `FP4_VALUES[nibble] · 2^(scale − 127)`; ggml's `block_mxfp4` puts j and j+16 in byte j
//! (llama.cpp's `conversion/gpt_oss.py` `transform_nibble_layout` converts one into the other).
//!
//! gpt-oss's fused `gate_up_proj` interleaves its halves along the rows: `GptOssExperts` takes
//! `gate_up[..., ::2]` as the gate and `gate_up[..., 1::2]` as the up projection
//! ([`Mxfp4Pair::rows_to_ggml`] with a stride of 2 splits them).

use crate::error::Result;
use nightmail_tensor::TensorError;
use nightmail_tensor::kernel::mxfp4::{BLOCK_BYTES, QK, e8m0_to_f32_half};

/// Bytes of nibbles per block.
const NIBBLE_BYTES: usize = QK / 2;

/// transformers' `FP4_VALUES` doubled, −0 kept (ggml's integer table has +0 there): the
/// factor 2^(scale − 128) of the doubled values is an f32 for every scale byte, where
/// 2^(scale − 127) is not for 255, and every product is exact.
const FP4_VALUES_DOUBLED: [f32; 16] =
    [0.0, 1.0, 2.0, 3.0, 4.0, 6.0, 8.0, 12.0, -0.0, -1.0, -2.0, -3.0, -4.0, -6.0, -8.0, -12.0];

/// One `_blocks`/`_scales` pair, borrowed from the maps.
pub struct Mxfp4Pair<'a> {
    pub name: String,
    /// `[..., rows, cols]`: the scales' shape with the last dimension counted in elements.
    pub shape: Vec<usize>,
    blocks: &'a [u8],
    scales: &'a [u8],
}

impl<'a> Mxfp4Pair<'a> {
    pub fn new(
        name: &str,
        blocks: &'a [u8],
        blocks_shape: &[usize],
        scales: &'a [u8],
        scales_shape: &[usize],
    ) -> Result<Self> {
        let shape_err = || TensorError::Shape {
            name: format!("{name}_blocks"),
            found: blocks_shape.to_vec(),
            expected: scales_shape.iter().copied().chain([NIBBLE_BYTES]).collect(),
        };
        let Some((&last, outer)) = blocks_shape.split_last() else { return Err(shape_err().into()) };
        if last != NIBBLE_BYTES || outer != scales_shape || scales_shape.is_empty() {
            return Err(shape_err().into());
        }
        let n: usize = scales_shape.iter().product();
        if blocks.len() != n * NIBBLE_BYTES || scales.len() != n {
            return Err(shape_err().into());
        }
        let mut shape = scales_shape.to_vec();
        *shape.last_mut().expect("non-empty") *= QK;
        Ok(Mxfp4Pair { name: name.to_string(), shape, blocks, scales })
    }

    fn cols(&self) -> usize {
        *self.shape.last().expect("non-empty")
    }

    /// Every element in row-major order, as transformers' `convert_moe_packed_tensors` computes
    /// them in float32 (before its final transpose, which only swaps the matrix to `x · W`).
    pub fn dequantize(&self) -> Vec<f32> {
        let mut out = Vec::with_capacity(self.scales.len() * QK);
        for (nibbles, &scale) in self.blocks.chunks_exact(NIBBLE_BYTES).zip(self.scales) {
            let d = e8m0_to_f32_half(scale);
            for &b in nibbles {
                out.push(FP4_VALUES_DOUBLED[(b & 0x0F) as usize] * d);
                out.push(FP4_VALUES_DOUBLED[(b >> 4) as usize] * d);
            }
        }
        out
    }

    /// Rows `first, first + step, ...` (`count` of them) of the flattened `[rows, cols]` matrix,
    /// as ggml `block_mxfp4` bytes: what the engine's MXFP4 kernel computes from.
    pub fn rows_to_ggml(&self, first: usize, step: usize, count: usize) -> Vec<u8> {
        let per_row = self.cols() / QK;
        let mut out = Vec::with_capacity(count * per_row * BLOCK_BYTES);
        for r in (0..count).map(|i| first + i * step) {
            for g in r * per_row..(r + 1) * per_row {
                out.push(self.scales[g]);
                let nibbles = &self.blocks[g * NIBBLE_BYTES..(g + 1) * NIBBLE_BYTES];
                // Element k of the block is nibble k % 2 of byte k / 2.
                let element = |k: usize| (nibbles[k / 2] >> (4 * (k % 2))) & 0x0F;
                out.extend((0..NIBBLE_BYTES).map(|j| element(j) | (element(j + NIBBLE_BYTES) << 4)));
            }
        }
        out
    }

    /// Rows in the flattened `[rows, cols]` matrix (all leading dimensions).
    pub fn rows(&self) -> usize {
        self.scales.len() * QK / self.cols()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hand_made_block_reads_in_transformers_order_and_repacks_to_ggml_order() {
        // Byte j = (low 2j, high 2j+1) with nibble values j and 15 - j.
        let nibbles: Vec<u8> = (0..16u8).map(|j| j | ((15 - j) << 4)).collect();
        let pair = Mxfp4Pair::new("w", &nibbles, &[1, 1, 16], &[128], &[1, 1]).unwrap();
        assert_eq!(pair.shape, vec![1, 32]);
        let values = pair.dequantize();
        // Scale 128 is 2^1: element 2j is FP4[j]·2, element 2j+1 is FP4[15-j]·2.
        const FP4: [f32; 16] = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0];
        for j in 0..16 {
            assert_eq!(values[2 * j].to_bits(), (FP4[j] * 2.0).to_bits(), "element {}", 2 * j);
            assert_eq!(values[2 * j + 1].to_bits(), (FP4[15 - j] * 2.0).to_bits(), "element {}", 2 * j + 1);
        }
        let ggml = pair.rows_to_ggml(0, 1, 1);
        let mut again = vec![0f32; 32];
        nightmail_tensor::kernel::mxfp4::dequantize(&ggml, &mut again);
        // Equal as numbers (ggml's table has +0 where transformers' has −0).
        assert_eq!(values, again);
    }

    #[test]
    fn mismatched_blocks_and_scales_are_refused() {
        let b = [0u8; 32];
        assert!(Mxfp4Pair::new("w", &b, &[2, 16], &[0, 0, 0], &[3]).is_err());
        assert!(Mxfp4Pair::new("w", &b, &[2, 8, 2], &[0, 0], &[2]).is_err());
        assert!(Mxfp4Pair::new("w", &b, &[2, 16], &[0, 0], &[2]).is_ok());
    }
}
