//! IQ2_XS (2.31 bits a weight): per 8 weights a u16 of a 9-bit index into the 512-point grid
//! `iq2xs_grid` and 7 sign bits; a 4-bit scale per 16 weights (ggml-common.h `block_iq2_xs`).

use super::iq_grids::{IQ2XS_GRID, KSIGNS_IQ2XS};
#[cfg(target_arch = "aarch64")]
use super::lattice::signed_pair;
use super::lattice::{QK_K, SIGN_BYTES, grid_byte, half, sign, signed_point, u16_at};

/// f16 d, 32 u16 (index | signs << 9), 8 bytes of two 4-bit scales.
pub(crate) const BLOCK_BYTES: usize = 74;

/// ggml-quants.c `dequantize_row_iq2_xs`, one block.
pub(crate) fn dequantize_block(b: &[u8], y: &mut [f32]) {
    let d = half(b, 0);
    for (ib, y) in y[..QK_K].chunks_exact_mut(32).enumerate() {
        let s = b[66 + ib];
        let db = [d * (0.5 + (s & 0xf) as f32) * 0.25, d * (0.5 + (s >> 4) as f32) * 0.25];
        for (l, y) in y.chunks_exact_mut(8).enumerate() {
            let q = u16_at(b, 2 + 2 * (4 * ib + l));
            let point = IQ2XS_GRID[(q & 511) as usize];
            let signs = KSIGNS_IQ2XS[(q >> 9) as usize];
            for (j, y) in y.iter_mut().enumerate() {
                *y = db[l / 2] * grid_byte(point, j) as f32 * sign(signs, j);
            }
        }
    }
}

/// The mat-vec in ggml's AVX2 `ggml_vec_dot_iq2_xs_q8_K` order, or for 8 tokens or more its tiled
/// mat-mul's (see `q8_k.rs`).
pub struct Iq2Xs;

impl super::q8_k::SuperBlock for Iq2Xs {
    const DTYPE: crate::dtype::LowBit = crate::dtype::LowBit::Iq2Xs;
    const BYTES: usize = BLOCK_BYTES;
    const FINAL: f32 = 0.125;

    fn decode(b: &[u8], out: &mut super::q8_k::Decoded) {
        for ib in 0..QK_K / 32 {
            let s = b[66 + ib];
            out.scales[2 * ib] = 2 * (s & 0xf) as i16 + 1;
            out.scales[2 * ib + 1] = 2 * (s >> 4) as i16 + 1;
            for l in 0..4 {
                let q = u16_at(b, 2 + 2 * (4 * ib + l));
                let point = IQ2XS_GRID[(q & 511) as usize];
                let signs = KSIGNS_IQ2XS[(q >> 9) as usize];
                out.w[32 * ib + 8 * l..][..8].copy_from_slice(&signed_point(point, signs));
            }
        }
    }

    /// ggml's AVX2 `ggml_vec_dot_iq2_xs_q8_K`: four points by their 9-bit indices as u64 lanes,
    /// their sign groups as a [`SIGN_BYTES`] vector, a scale for each 16-byte half.
    #[cfg(target_arch = "x86_64")]
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn part_avx2(b: &[u8], s: usize) -> super::q8_k::Part256 {
        use std::arch::x86_64::*;
        let q = |l: usize| u16_at(b, 2 + 2 * (4 * s + l));
        let g = |l: usize| IQ2XS_GRID[(q(l) & 511) as usize] as i64;
        let sg = |l: usize| SIGN_BYTES[(q(l) >> 9) as usize] as i64;
        let sc = b[66 + s];
        super::q8_k::Part256 {
            abs: _mm256_set_epi64x(g(3), g(2), g(1), g(0)),
            sign: _mm256_set_epi64x(sg(3), sg(2), sg(1), sg(0)),
            scales: _mm256_set_m128i(
                _mm_set1_epi16(2 * (sc >> 4) as i16 + 1),
                _mm_set1_epi16(2 * (sc & 0xf) as i16 + 1),
            ),
        }
    }

    /// ggml's NEON `ggml_vec_dot_iq2_xs_q8_K`'s points, signed on the weights' side.
    #[cfg(target_arch = "aarch64")]
    #[inline(always)]
    fn part_neon(b: &[u8], s: usize) -> super::q8_k::PartNeon {
        let q = |l: usize| u16_at(b, 2 + 2 * (4 * s + l));
        let g = |l: usize| IQ2XS_GRID[(q(l) & 511) as usize];
        let sg = |l: usize| SIGN_BYTES[(q(l) >> 9) as usize];
        let sc = b[66 + s];
        super::q8_k::PartNeon {
            w: [signed_pair([g(0), g(1)], [sg(0), sg(1)]), signed_pair([g(2), g(3)], [sg(2), sg(3)])],
            scales: [2 * (sc & 0xf) as i32 + 1, 2 * (sc >> 4) as i32 + 1],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn iq2_xs_kernel_equals_its_scalar_path_and_the_dequantized_product() {
        let bytes = super::super::lattice::tests::random_blocks(BLOCK_BYTES, 5 * 3, 22);
        super::super::q8_k::tests::check_kernel::<Iq2Xs>(&bytes, 5, 3 * QK_K, dequantize_block);
    }

    #[test]
    fn iq2_xs_simd_parts_are_its_scalar_decoding() {
        let bytes = super::super::lattice::tests::random_blocks(BLOCK_BYTES, 64, 32);
        super::super::q8_k::tests::check_parts::<Iq2Xs>(&bytes);
    }
}
