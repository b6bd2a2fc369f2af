//! IQ3_XXS (3.06 bits a weight): per 4 weights a byte index into the 256-point grid
//! `iq3xxs_grid`; per 32 weights a u32 of four 7-bit sign groups and a 4-bit scale
//! (ggml-common.h `block_iq3_xxs`).

use super::iq_grids::{IQ3XXS_GRID, KSIGNS_IQ2XS};
#[cfg(target_arch = "aarch64")]
use super::lattice::signed_pair;
use super::lattice::{QK_K, SIGN_BYTES, grid_byte, half, sign, signed_point, u32_at};

/// f16 d, 64 grid indices, 8 u32 of signs and scale.
pub(crate) const BLOCK_BYTES: usize = 98;

/// ggml-quants.c `dequantize_row_iq3_xxs`, one block.
pub(crate) fn dequantize_block(b: &[u8], y: &mut [f32]) {
    let d = half(b, 0);
    let qs = &b[2..66];
    for (ib, y) in y[..QK_K].chunks_exact_mut(32).enumerate() {
        let aux = u32_at(b, 66 + 4 * ib);
        let db = d * (0.5 + (aux >> 28) as f32) * 0.5;
        for (l, y) in y.chunks_exact_mut(8).enumerate() {
            let signs = KSIGNS_IQ2XS[((aux >> (7 * l)) & 127) as usize];
            let g1 = IQ3XXS_GRID[qs[8 * ib + 2 * l] as usize] as u64;
            let g2 = IQ3XXS_GRID[qs[8 * ib + 2 * l + 1] as usize] as u64;
            for j in 0..4 {
                y[j] = db * grid_byte(g1, j) as f32 * sign(signs, j);
                y[j + 4] = db * grid_byte(g2, j) as f32 * sign(signs, j + 4);
            }
        }
    }
}

/// The mat-vec in ggml's AVX2 `ggml_vec_dot_iq3_xxs_q8_K` order, or for 8 tokens or more its tiled
/// mat-mul's (see `q8_k.rs`).
pub struct Iq3Xxs;

impl super::q8_k::SuperBlock for Iq3Xxs {
    const DTYPE: crate::dtype::LowBit = crate::dtype::LowBit::Iq3Xxs;
    const BYTES: usize = BLOCK_BYTES;
    const FINAL: f32 = 0.25;

    fn decode(b: &[u8], out: &mut super::q8_k::Decoded) {
        let qs = &b[2..66];
        for ib in 0..QK_K / 32 {
            let aux = u32_at(b, 66 + 4 * ib);
            let ls = (2 * (aux >> 28) + 1) as i16;
            out.scales[2 * ib..2 * ib + 2].fill(ls);
            for l in 0..4 {
                let signs = KSIGNS_IQ2XS[((aux >> (7 * l)) & 127) as usize];
                let point = IQ3XXS_GRID[qs[8 * ib + 2 * l] as usize] as u64
                    | (IQ3XXS_GRID[qs[8 * ib + 2 * l + 1] as usize] as u64) << 32;
                out.w[32 * ib + 8 * l..][..8].copy_from_slice(&signed_point(point, signs));
            }
        }
    }

    /// ggml's AVX2 `ggml_vec_dot_iq3_xxs_q8_K`: eight 4-byte points as i32 lanes, their sign
    /// groups as a [`SIGN_BYTES`] vector.
    #[cfg(target_arch = "x86_64")]
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn part_avx2(b: &[u8], s: usize) -> super::q8_k::Part256 {
        use std::arch::x86_64::*;
        let qs = &b[2 + 8 * s..2 + 8 * s + 8];
        let aux = u32_at(b, 66 + 4 * s);
        let g = |i: usize| IQ3XXS_GRID[qs[i] as usize] as i32;
        let sg = |l: u32| SIGN_BYTES[((aux >> (7 * l)) & 127) as usize] as i64;
        super::q8_k::Part256 {
            abs: _mm256_set_epi32(g(7), g(6), g(5), g(4), g(3), g(2), g(1), g(0)),
            sign: _mm256_set_epi64x(sg(3), sg(2), sg(1), sg(0)),
            scales: _mm256_set1_epi16((2 * (aux >> 28) + 1) as i16),
        }
    }

    /// ggml's NEON `ggml_vec_dot_iq3_xxs_q8_K`'s points, signed on the weights' side.
    #[cfg(target_arch = "aarch64")]
    #[inline(always)]
    fn part_neon(b: &[u8], s: usize) -> super::q8_k::PartNeon {
        let qs = &b[2 + 8 * s..2 + 8 * s + 8];
        let aux = u32_at(b, 66 + 4 * s);
        let g = |l: usize| IQ3XXS_GRID[qs[2 * l] as usize] as u64 | (IQ3XXS_GRID[qs[2 * l + 1] as usize] as u64) << 32;
        let sg = |l: u32| SIGN_BYTES[((aux >> (7 * l)) & 127) as usize];
        let ls = (2 * (aux >> 28) + 1) as i32;
        super::q8_k::PartNeon {
            w: [signed_pair([g(0), g(1)], [sg(0), sg(1)]), signed_pair([g(2), g(3)], [sg(2), sg(3)])],
            scales: [ls; 2],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn iq3_xxs_kernel_equals_its_scalar_path_and_the_dequantized_product() {
        let bytes = super::super::lattice::tests::random_blocks(BLOCK_BYTES, 5 * 3, 23);
        super::super::q8_k::tests::check_kernel::<Iq3Xxs>(&bytes, 5, 3 * QK_K, dequantize_block);
    }

    #[test]
    fn iq3_xxs_simd_parts_are_its_scalar_decoding() {
        let bytes = super::super::lattice::tests::random_blocks(BLOCK_BYTES, 64, 33);
        super::super::q8_k::tests::check_parts::<Iq3Xxs>(&bytes);
    }
}
