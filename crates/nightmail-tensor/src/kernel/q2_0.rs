//! Q2_0 (2.25 bits a weight): 64 two-bit values a block, −1, 0, +1, +2 times d
//! (ggml-common.h `block_q2_0`).

use super::lattice::half;

/// Elements per block.
pub(crate) const QK: usize = 64;
/// f16 d, then 16 bytes of four values each, lowest bits first.
pub(crate) const BLOCK_BYTES: usize = 18;

/// ggml-quants.c `dequantize_row_q2_0`, one block: q in 0..3 is (q − 1)·d.
pub(crate) fn dequantize_block(b: &[u8], y: &mut [f32]) {
    let d = half(b, 0);
    for (j, y) in y.iter_mut().enumerate().take(QK) {
        let q = (b[2 + j / 4] >> (2 * (j % 4))) & 3;
        *y = (i32::from(q) - 1) as f32 * d;
    }
}
