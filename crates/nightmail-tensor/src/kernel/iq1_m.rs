//! IQ1_M (1.75 bits a weight): IQ1_S's grid with a shift sign per 8 weights and 3-bit scales per
//! 16, the block's f16 scale spread over the top nibbles of its four scale words
//! (ggml-common.h `block_iq1_m`).

use super::iq_grids::IQ1S_GRID;
use super::iq1_s::DELTA;
use super::lattice::{QK_K, grid_byte, u16_at};

/// 32 low index bytes, 16 `qh` bytes (3 index bits and a shift sign per 8 weights), 4 u16 scales.
pub(crate) const BLOCK_BYTES: usize = 56;

/// ggml-quants.c `dequantize_row_iq1_m`, one block.
pub(crate) fn dequantize_block(b: &[u8], y: &mut [f32]) {
    let (qs, qh) = (&b[0..32], &b[32..48]);
    let sc: [u16; 4] = std::array::from_fn(|i| u16_at(b, 48 + 2 * i));
    let bits = (sc[0] >> 12) | ((sc[1] >> 8) & 0x00f0) | ((sc[2] >> 4) & 0x0f00) | (sc[3] & 0xf000);
    let d = half::f16::from_bits(bits).to_f32();
    for (ib, y) in y[..QK_K].chunks_exact_mut(32).enumerate() {
        let s = sc[ib / 2] >> (6 * (ib % 2));
        let dl = [d * (2 * (s & 7) + 1) as f32, d * (2 * ((s >> 3) & 7) + 1) as f32];
        let (h0, h1) = (qh[2 * ib] as usize, qh[2 * ib + 1] as usize);
        let idx = [
            qs[4 * ib] as usize | ((h0 << 8) & 0x700),
            qs[4 * ib + 1] as usize | ((h0 << 4) & 0x700),
            qs[4 * ib + 2] as usize | ((h1 << 8) & 0x700),
            qs[4 * ib + 3] as usize | ((h1 << 4) & 0x700),
        ];
        let shift = |h: usize, bit: usize| if h & bit != 0 { -DELTA } else { DELTA };
        let delta = [shift(h0, 0x08), shift(h0, 0x80), shift(h1, 0x08), shift(h1, 0x80)];
        for (l, y) in y.chunks_exact_mut(8).enumerate() {
            let point = IQ1S_GRID[idx[l]];
            for (j, y) in y.iter_mut().enumerate() {
                *y = dl[l / 2] * (grid_byte(point, j) as i8 as f32 + delta[l]);
            }
        }
    }
}
