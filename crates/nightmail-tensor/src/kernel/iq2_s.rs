//! IQ2_S (2.56 bits a weight): per 8 weights a 10-bit index into the 1024-point grid `iq2s_grid`
//! (8 low bits in `qs`, 2 in `qh`) and 8 explicit sign bits; a 4-bit scale per 16 weights
//! (ggml-common.h `block_iq2_s`).

use super::iq_grids::IQ2S_GRID;
#[cfg(target_arch = "aarch64")]
use super::lattice::signed_pair;
use super::lattice::{EXPLICIT_SIGN_BYTES, QK_K, grid_byte, half, sign, signed_point};

/// f16 d, 32 index bytes, 32 sign bytes, 8 `qh` bytes, 8 scale bytes.
pub(crate) const BLOCK_BYTES: usize = 82;

/// ggml-quants.c `dequantize_row_iq2_s`, one block.
pub(crate) fn dequantize_block(b: &[u8], y: &mut [f32]) {
    let d = half(b, 0);
    let (qs, signs, qh, scales) = (&b[2..34], &b[34..66], &b[66..74], &b[74..82]);
    for (ib, y) in y[..QK_K].chunks_exact_mut(32).enumerate() {
        let db = [d * (0.5 + (scales[ib] & 0xf) as f32) * 0.25, d * (0.5 + (scales[ib] >> 4) as f32) * 0.25];
        for (l, y) in y.chunks_exact_mut(8).enumerate() {
            let index = qs[4 * ib + l] as usize | ((qh[ib] as usize) << (8 - 2 * l) & 0x300);
            let point = IQ2S_GRID[index];
            for (j, y) in y.iter_mut().enumerate() {
                *y = db[l / 2] * grid_byte(point, j) as f32 * sign(signs[4 * ib + l], j);
            }
        }
    }
}

/// Part `s`'s four grid points and their sign bytes.
fn part_points(b: &[u8], s: usize) -> ([u64; 4], [u8; 4]) {
    let (qs, signs, qh) = (&b[2 + 4 * s..6 + 4 * s], &b[34 + 4 * s..38 + 4 * s], b[66 + s] as usize);
    let points = std::array::from_fn(|l| IQ2S_GRID[qs[l] as usize | ((qh << (8 - 2 * l)) & 0x300)]);
    (points, signs.try_into().expect("4 sign bytes"))
}

/// Part `s`'s scales of its two 16s, odd (ggml's `2·ls + 1`).
fn part_scales(b: &[u8], s: usize) -> [i16; 2] {
    let sc = b[74 + s];
    [2 * (sc & 0xf) as i16 + 1, 2 * (sc >> 4) as i16 + 1]
}

/// The mat-vec in ggml's AVX2 `ggml_vec_dot_iq2_s_q8_K` order, or for 8 tokens or more its tiled
/// mat-mul's (see `q8_k.rs`).
pub struct Iq2S;

impl super::q8_k::SuperBlock for Iq2S {
    const DTYPE: crate::dtype::LowBit = crate::dtype::LowBit::Iq2S;
    const BYTES: usize = BLOCK_BYTES;
    const FINAL: f32 = 0.125;

    fn decode(b: &[u8], out: &mut super::q8_k::Decoded) {
        for s in 0..QK_K / 32 {
            out.scales[2 * s..2 * s + 2].copy_from_slice(&part_scales(b, s));
            let (points, signs) = part_points(b, s);
            for (l, (point, signs)) in points.into_iter().zip(signs).enumerate() {
                out.w[32 * s + 8 * l..][..8].copy_from_slice(&signed_point(point, signs));
            }
        }
    }

    /// The points as u64 lanes, their explicit sign bytes as an [`EXPLICIT_SIGN_BYTES`] vector.
    #[cfg(target_arch = "x86_64")]
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn part_avx2(b: &[u8], s: usize) -> super::q8_k::Part256 {
        use std::arch::x86_64::*;
        let (g, sg) = part_points(b, s);
        let sg = sg.map(|x| EXPLICIT_SIGN_BYTES[x as usize] as i64);
        let [lo, hi] = part_scales(b, s);
        super::q8_k::Part256 {
            abs: _mm256_set_epi64x(g[3] as i64, g[2] as i64, g[1] as i64, g[0] as i64),
            sign: _mm256_set_epi64x(sg[3], sg[2], sg[1], sg[0]),
            scales: _mm256_set_m128i(_mm_set1_epi16(hi), _mm_set1_epi16(lo)),
        }
    }

    #[cfg(target_arch = "aarch64")]
    #[inline(always)]
    fn part_neon(b: &[u8], s: usize) -> super::q8_k::PartNeon {
        let (g, sg) = part_points(b, s);
        let sg = sg.map(|x| EXPLICIT_SIGN_BYTES[x as usize]);
        super::q8_k::PartNeon {
            w: [signed_pair([g[0], g[1]], [sg[0], sg[1]]), signed_pair([g[2], g[3]], [sg[2], sg[3]])],
            scales: part_scales(b, s).map(i32::from),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn iq2_s_kernel_equals_its_scalar_path_and_the_dequantized_product() {
        let bytes = super::super::lattice::tests::random_blocks(BLOCK_BYTES, 5 * 3, 26);
        super::super::q8_k::tests::check_kernel::<Iq2S>(&bytes, 5, 3 * QK_K, dequantize_block);
    }

    #[test]
    fn iq2_s_simd_parts_are_its_scalar_decoding() {
        let bytes = super::super::lattice::tests::random_blocks(BLOCK_BYTES, 64, 35);
        super::super::q8_k::tests::check_parts::<Iq2S>(&bytes);
    }
}
