//! IQ3_S (3.44 bits a weight): per 4 weights a 9-bit index into the 512-point grid `iq3s_grid`
//! (8 bits in `qs`, one in `qh`), explicit sign bits, and a 4-bit odd scale per 32 weights
//! (ggml-common.h `block_iq3_s`).

use super::iq_grids::IQ3S_GRID;
use super::lattice::{QK_K, grid_byte, half, sign};

/// f16 d, 64 index bytes, 8 `qh` bytes, 32 sign bytes, 4 scale bytes.
pub(crate) const BLOCK_BYTES: usize = 110;

/// ggml-quants.c `dequantize_row_iq3_s`, one block.
pub(crate) fn dequantize_block(b: &[u8], y: &mut [f32]) {
    let d = half(b, 0);
    let (qs, qh, signs, scales) = (&b[2..66], &b[66..74], &b[74..106], &b[106..110]);
    for (ib, y) in y[..QK_K].chunks_exact_mut(32).enumerate() {
        let s = if ib % 2 == 0 { scales[ib / 2] & 0xf } else { scales[ib / 2] >> 4 };
        let db = d * (1 + 2 * s as i32) as f32;
        let h = qh[ib] as usize;
        for (l, y) in y.chunks_exact_mut(8).enumerate() {
            let g1 = IQ3S_GRID[qs[8 * ib + 2 * l] as usize | ((h << (8 - 2 * l)) & 256)] as u64;
            let g2 = IQ3S_GRID[qs[8 * ib + 2 * l + 1] as usize | ((h << (7 - 2 * l)) & 256)] as u64;
            let sg = signs[4 * ib + l];
            for j in 0..4 {
                y[j] = db * grid_byte(g1, j) as f32 * sign(sg, j);
                y[j + 4] = db * grid_byte(g2, j) as f32 * sign(sg, j + 4);
            }
        }
    }
}
