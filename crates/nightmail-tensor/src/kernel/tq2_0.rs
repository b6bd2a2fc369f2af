//! TQ2_0 (2.06 bits a weight, ternary): four 2-bit values (0, 1, 2 for -1, 0, 1) a byte
//! (ggml-common.h `block_tq2_0`).

use super::lattice::half;

/// 64 bytes of four values, f16 d.
pub(crate) const BLOCK_BYTES: usize = 66;

/// ggml-quants.c `dequantize_row_tq2_0`, one block.
pub(crate) fn dequantize_block(b: &[u8], y: &mut [f32]) {
    let d = half(b, 64);
    let mut out = y.iter_mut();
    for j in (0..64).step_by(32) {
        for l in 0..4 {
            for q in &b[j..j + 32] {
                *out.next().unwrap() = (((q >> (2 * l)) & 3) as i8 - 1) as f32 * d;
            }
        }
    }
}
