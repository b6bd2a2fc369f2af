//! Q1_0 (1.125 bits a weight, binary): 128 signs a block, each ±d (ggml-common.h `block_q1_0`).

use super::lattice::half;

/// Elements per block.
pub(crate) const QK: usize = 128;
/// f16 d, then 16 bytes of one bit each, lowest bit first.
pub(crate) const BLOCK_BYTES: usize = 18;

/// ggml-quants.c `dequantize_row_q1_0`, one block: a set bit is d, a clear one −d.
pub(crate) fn dequantize_block(b: &[u8], y: &mut [f32]) {
    let d = half(b, 0);
    for (j, y) in y.iter_mut().enumerate().take(QK) {
        *y = if (b[2 + j / 8] >> (j % 8)) & 1 == 1 { d } else { -d };
    }
}
