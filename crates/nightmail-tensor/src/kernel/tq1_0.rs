//! TQ1_0 (1.69 bits a weight, ternary): five trits a byte in base 3, read as a fixed-point
//! fraction (`q · 3^n` wraps, `· 3 >> 8` takes the top trit), for BitNet b1.58's weights
//! (ggml-common.h `block_tq1_0`; Ma et al. 2024, arXiv 2402.17764).

use super::lattice::half;

/// 48 bytes of five trits, 4 bytes of four, f16 d.
pub(crate) const BLOCK_BYTES: usize = 54;

const POW3: [u8; 5] = [1, 3, 9, 27, 81];

fn trit(q: u8, n: usize) -> f32 {
    let q = q.wrapping_mul(POW3[n]);
    ((q as u16 * 3) >> 8) as f32 - 1.0
}

/// ggml-quants.c `dequantize_row_tq1_0`, one block.
pub(crate) fn dequantize_block(b: &[u8], y: &mut [f32]) {
    let d = half(b, 52);
    let mut out = y.iter_mut();
    for (start, width) in [(0, 32), (32, 16)] {
        for n in 0..5 {
            for q in &b[start..start + width] {
                *out.next().unwrap() = trit(*q, n) * d;
            }
        }
    }
    for n in 0..4 {
        for q in &b[48..52] {
            *out.next().unwrap() = trit(*q, n) * d;
        }
    }
}
