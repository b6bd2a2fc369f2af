//! IQ2_XXS (2.06 bits a weight): per 32 weights, four 8-wide points of the E8-lattice grid
//! `iq2xxs_grid` (one byte each), four 7-bit sign groups and a 4-bit scale packed in a second
//! u32 (ggml-common.h `block_iq2_xxs`; Tseng et al. 2024, QuIP#, arXiv 2402.04396).

use super::iq_grids::{IQ2XXS_GRID, KSIGNS_IQ2XS};
#[cfg(target_arch = "aarch64")]
use super::lattice::signed_pair;
use super::lattice::{QK_K, SIGN_BYTES, grid_byte, half, sign, signed_point, u32_at};

/// f16 d, then 32 u16 words: per 32 weights, grid indices in the first u32, signs and scale in the second.
pub(crate) const BLOCK_BYTES: usize = 66;

/// ggml-quants.c `dequantize_row_iq2_xxs`, one block.
pub(crate) fn dequantize_block(b: &[u8], y: &mut [f32]) {
    let d = half(b, 0);
    for (ib, y) in y[..QK_K].chunks_exact_mut(32).enumerate() {
        let (idx, aux) = (u32_at(b, 2 + 8 * ib), u32_at(b, 6 + 8 * ib));
        let db = d * (0.5 + (aux >> 28) as f32) * 0.25;
        for (l, y) in y.chunks_exact_mut(8).enumerate() {
            let point = IQ2XXS_GRID[(idx >> (8 * l)) as u8 as usize];
            let signs = KSIGNS_IQ2XS[((aux >> (7 * l)) & 127) as usize];
            for (j, y) in y.iter_mut().enumerate() {
                *y = db * grid_byte(point, j) as f32 * sign(signs, j);
            }
        }
    }
}

/// The mat-vec in ggml's AVX2 `ggml_vec_dot_iq2_xxs_q8_K` order, or for 8 tokens or more its tiled
/// mat-mul's (see `q8_k.rs`).
pub struct Iq2Xxs;

impl super::q8_k::SuperBlock for Iq2Xxs {
    const DTYPE: crate::dtype::LowBit = crate::dtype::LowBit::Iq2Xxs;
    const BYTES: usize = BLOCK_BYTES;
    const FINAL: f32 = 0.125;

    fn decode(b: &[u8], out: &mut super::q8_k::Decoded) {
        for ib in 0..QK_K / 32 {
            let (idx, aux) = (u32_at(b, 2 + 8 * ib), u32_at(b, 6 + 8 * ib));
            let ls = (2 * (aux >> 28) + 1) as i16;
            out.scales[2 * ib..2 * ib + 2].fill(ls);
            for l in 0..4 {
                let point = IQ2XXS_GRID[(idx >> (8 * l)) as u8 as usize];
                let signs = KSIGNS_IQ2XS[((aux >> (7 * l)) & 127) as usize];
                out.w[32 * ib + 8 * l..][..8].copy_from_slice(&signed_point(point, signs));
            }
        }
    }

    /// ggml's AVX2 `ggml_vec_dot_iq2_xxs_q8_K`: the four points of the part as u64 lanes, their
    /// sign groups as a [`SIGN_BYTES`] vector.
    #[cfg(target_arch = "x86_64")]
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn part_avx2(b: &[u8], s: usize) -> super::q8_k::Part256 {
        use std::arch::x86_64::*;
        let (idx, aux) = (u32_at(b, 2 + 8 * s), u32_at(b, 6 + 8 * s));
        let g = |l: u32| IQ2XXS_GRID[(idx >> (8 * l)) as u8 as usize] as i64;
        let sg = |l: u32| SIGN_BYTES[((aux >> (7 * l)) & 127) as usize] as i64;
        super::q8_k::Part256 {
            abs: _mm256_set_epi64x(g(3), g(2), g(1), g(0)),
            sign: _mm256_set_epi64x(sg(3), sg(2), sg(1), sg(0)),
            scales: _mm256_set1_epi16((2 * (aux >> 28) + 1) as i16),
        }
    }

    /// ggml's NEON `ggml_vec_dot_iq2_xxs_q8_K`'s points, signed on the weights' side.
    #[cfg(target_arch = "aarch64")]
    #[inline(always)]
    fn part_neon(b: &[u8], s: usize) -> super::q8_k::PartNeon {
        let (idx, aux) = (u32_at(b, 2 + 8 * s), u32_at(b, 6 + 8 * s));
        let g = |l: u32| IQ2XXS_GRID[(idx >> (8 * l)) as u8 as usize];
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
    fn iq2_xxs_kernel_equals_its_scalar_path_and_the_dequantized_product() {
        let bytes = super::super::lattice::tests::random_blocks(BLOCK_BYTES, 5 * 3, 21);
        super::super::q8_k::tests::check_kernel::<Iq2Xxs>(&bytes, 5, 3 * QK_K, dequantize_block);
    }

    #[test]
    fn iq2_xxs_simd_parts_are_its_scalar_decoding() {
        let bytes = super::super::lattice::tests::random_blocks(BLOCK_BYTES, 64, 31);
        super::super::q8_k::tests::check_parts::<Iq2Xxs>(&bytes);
    }
}
