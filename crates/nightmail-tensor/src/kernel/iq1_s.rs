//! IQ1_S (1.56 bits a weight): per 8 weights an 11-bit index into the 2048-point ternary grid
//! `iq1s_grid`, shifted by ±1/8; per 32 weights a 3-bit odd scale and the shift's sign
//! (ggml-common.h `block_iq1_s`).

use super::iq_grids::IQ1S_GRID;
use super::lattice::{QK_K, grid_byte, half, u16_at};

/// f16 d, 32 low index bytes, 8 u16 of high index bits, scale and shift sign.
pub(crate) const BLOCK_BYTES: usize = 50;

/// ggml-common.h `IQ1S_DELTA`.
pub(crate) const DELTA: f32 = 0.125;

/// ggml-quants.c `dequantize_row_iq1_s`, one block.
pub(crate) fn dequantize_block(b: &[u8], y: &mut [f32]) {
    let d = half(b, 0);
    let qs = &b[2..34];
    for (ib, y) in y[..QK_K].chunks_exact_mut(32).enumerate() {
        let qh = u16_at(b, 34 + 2 * ib);
        let dl = d * (2 * ((qh >> 12) & 7) + 1) as f32;
        let delta = if qh & 0x8000 != 0 { -DELTA } else { DELTA };
        for (l, y) in y.chunks_exact_mut(8).enumerate() {
            let point = IQ1S_GRID[qs[4 * ib + l] as usize | ((((qh >> (3 * l)) & 7) as usize) << 8)];
            for (j, y) in y.iter_mut().enumerate() {
                *y = dl * (grid_byte(point, j) as i8 as f32 + delta);
            }
        }
    }
}
