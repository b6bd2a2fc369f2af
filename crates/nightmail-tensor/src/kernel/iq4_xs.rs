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
            let packed = &b[8 + 16 * ib..8 + 16 * (ib + 1)];
            // ggml's NEON `ggml_vec_dot_iq4_xs_q8_K`'s `tbl` lookup of the 16 levels.
            #[cfg(target_arch = "aarch64")]
            // SAFETY: the 16 packed bytes; two 16-byte stores within the 256 weights.
            unsafe {
                let [lo, hi] = super::arm::nibble_levels(packed, &KVALUES_IQ4NL);
                std::arch::aarch64::vst1q_s8(out.w.as_mut_ptr().add(32 * ib), lo);
                std::arch::aarch64::vst1q_s8(out.w.as_mut_ptr().add(32 * ib + 16), hi);
            }
            #[cfg(not(target_arch = "aarch64"))]
            weights_scalar(packed, &mut out.w[32 * ib..32 * (ib + 1)]);
        }
    }

    /// ggml's AVX2 `ggml_vec_dot_iq4_xs_q8_K`'s lookup of the 16 levels by `_mm256_shuffle_epi8`
    /// (low nibbles in the low half, high in the high); the levels carry their own signs.
    #[cfg(target_arch = "x86_64")]
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn part_avx2(b: &[u8], s: usize) -> super::q8_k::Part256 {
        use std::arch::x86_64::*;
        let packed = &b[8 + 16 * s..8 + 16 * (s + 1)];
        // SAFETY: 16-byte loads within the part's packed bytes and the table.
        let (p, levels) =
            unsafe { (_mm_loadu_si128(packed.as_ptr().cast()), _mm_loadu_si128(KVALUES_IQ4NL.as_ptr().cast())) };
        let nibbles = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16::<4>(p), p), _mm256_set1_epi8(0x0f));
        let w = _mm256_shuffle_epi8(_mm256_broadcastsi128_si256(levels), nibbles);
        super::q8_k::Part256 { abs: _mm256_sign_epi8(w, w), sign: w, scales: _mm256_set1_epi16(scale(b, s) as i16) }
    }

    /// ggml's NEON `ggml_vec_dot_iq4_xs_q8_K`'s `tbl` lookup of the 16 levels.
    #[cfg(target_arch = "aarch64")]
    #[inline(always)]
    fn part_neon(b: &[u8], s: usize) -> super::q8_k::PartNeon {
        let packed = &b[8 + 16 * s..8 + 16 * (s + 1)];
        // SAFETY: the part's 16 packed bytes.
        let w = unsafe { super::arm::nibble_levels(packed, &KVALUES_IQ4NL) };
        super::q8_k::PartNeon { w, scales: [scale(b, s); 2] }
    }
}

/// A 32-block's 16 packed bytes as its weights, element j low nibble and j+16 high.
#[cfg_attr(target_arch = "aarch64", allow(dead_code))] // aarch64: the reference its test compares against
fn weights_scalar(packed: &[u8], w: &mut [i8]) {
    for (j, q) in packed.iter().enumerate() {
        w[j] = KVALUES_IQ4NL[(q & 0xf) as usize];
        w[j + 16] = KVALUES_IQ4NL[(q >> 4) as usize];
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

    #[test]
    fn iq4_xs_simd_parts_are_its_scalar_decoding() {
        let bytes = super::super::lattice::tests::random_blocks(BLOCK_BYTES, 64, 34);
        super::super::q8_k::tests::check_parts::<Iq4Xs>(&bytes);
    }

    #[cfg(target_arch = "aarch64")]
    #[test]
    fn iq4_xs_decoding_gives_the_scalar_lookups_weights() {
        use super::super::q8_k::{Decoded, SuperBlock};
        let bytes = super::super::lattice::tests::random_blocks(BLOCK_BYTES, 7, 25);
        for b in bytes.chunks_exact(BLOCK_BYTES) {
            let mut got = Decoded { w: [0; QK_K], scales: [0; QK_K / 16] };
            Iq4Xs::decode(b, &mut got);
            let mut want = [0i8; QK_K];
            for (ib, w) in want.chunks_exact_mut(32).enumerate() {
                weights_scalar(&b[8 + 16 * ib..8 + 16 * (ib + 1)], w);
            }
            assert_eq!(got.w, want);
        }
    }
}
