//! IQ4_XS (4.25 bits a weight): IQ4_NL's levels in super-blocks of 256 with a 6-bit scale per 32
//! weights (ggml-common.h `block_iq4_xs`).

use super::iq_grids::KVALUES_IQ4NL;
use super::lattice::{QK_K, half, u16_at};

/// f16 d, u16 of the scales' high bits, 4 bytes of their low nibbles, 128 bytes of nibbles.
pub(crate) const BLOCK_BYTES: usize = 136;

/// The 6-bit scale of 32-block `ib`, less 32.
pub(crate) fn scale(b: &[u8], ib: usize) -> i32 {
    let (h, l) = (u16_at(b, 2), b[4 + ib / 2]);
    (((l >> (4 * (ib % 2))) & 0xf) as i32 | ((((h >> (2 * ib)) & 3) as i32) << 4)) - 32
}

/// ggml-quants.c `dequantize_row_iq4_xs`, one block.
pub(crate) fn dequantize_block(b: &[u8], y: &mut [f32]) {
    let d = half(b, 0);
    for (ib, y) in y[..QK_K].chunks_exact_mut(32).enumerate() {
        let dl = d * scale(b, ib) as f32;
        for (j, q) in b[8 + 16 * ib..8 + 16 * (ib + 1)].iter().enumerate() {
            y[j] = dl * KVALUES_IQ4NL[(q & 0xf) as usize] as f32;
            y[j + 16] = dl * KVALUES_IQ4NL[(q >> 4) as usize] as f32;
        }
    }
}

/// The mat-vec in ggml's AVX2 `ggml_vec_dot_iq4_xs_q8_K` order, or for 8 tokens or more its tiled
/// mat-mul's (see `q8_k.rs`).
pub struct Iq4Xs;

impl super::q8_k::SuperBlock for Iq4Xs {
    const DTYPE: crate::dtype::LowBit = crate::dtype::LowBit::Iq4Xs;
    const BYTES: usize = BLOCK_BYTES;
    const FINAL: f32 = 1.0;

    fn decode(b: &[u8], out: &mut super::q8_k::Decoded) {
        for ib in 0..QK_K / 32 {
            let ls = scale(b, ib) as i16;
            out.scales[2 * ib..2 * ib + 2].fill(ls);
            for (j, q) in b[8 + 16 * ib..8 + 16 * (ib + 1)].iter().enumerate() {
                out.w[32 * ib + j] = KVALUES_IQ4NL[(q & 0xf) as usize];
                out.w[32 * ib + j + 16] = KVALUES_IQ4NL[(q >> 4) as usize];
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn iq4_xs_kernel_equals_its_scalar_path_and_the_dequantized_product() {
        let bytes = super::super::lattice::tests::random_blocks(BLOCK_BYTES, 5 * 3, 24);
        super::super::q8_k::tests::check_kernel::<Iq4Xs>(&bytes, 5, 3 * QK_K, dequantize_block);
    }
}
