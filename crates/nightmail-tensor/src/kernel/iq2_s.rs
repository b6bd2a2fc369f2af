//! IQ2_S (2.56 bits a weight): per 8 weights a 10-bit index into the 1024-point grid `iq2s_grid`
//! (8 low bits in `qs`, 2 in `qh`) and 8 explicit sign bits; a 4-bit scale per 16 weights
//! (ggml-common.h `block_iq2_s`).

use super::iq_grids::IQ2S_GRID;
use super::lattice::{QK_K, grid_byte, half, sign};

/// f16 d, 32 index bytes, 32 sign bytes, 8 `qh` bytes, 8 scale bytes.
pub(crate) const BLOCK_BYTES: usize = 82;

/// ggml-quants.c `dequantize_row_iq2_s`, one block.
pub(crate) fn dequantize_block(b: &[u8], y: &mut [f32]) {
    let d = half(b, 0);
    let (qs, signs, qh, scales) = (&b[2..34], &b[34..66], &b[66..74], &b[74..82]);
    for (ib, y) in y[..QK_K].chunks_exact_mut(32).enumerate() {
        let db = [d * (0.5 + (scales[ib] & 0xf) as f32) * 0.25, d * (0.5 + (scales[ib] >> 4) as f32) * 0.25];
        for (l, y) in y.chunks_exact_mut(8).enumerate() {
            let index = qs[4 * ib + l] as usize | ((qh[ib] as usize) << (8 - 2 * l) & 0x300);
            let point = IQ2S_GRID[index];
            for (j, y) in y.iter_mut().enumerate() {
                *y = db[l / 2] * grid_byte(point, j) as f32 * sign(signs[4 * ib + l], j);
            }
        }
    }
}
