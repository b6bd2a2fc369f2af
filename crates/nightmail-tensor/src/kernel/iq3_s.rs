//! IQ3_S (3.44 bits a weight): per 4 weights a 9-bit index into the 512-point grid `iq3s_grid`
//! (8 bits in `qs`, one in `qh`), explicit sign bits, and a 4-bit odd scale per 32 weights
//! (ggml-common.h `block_iq3_s`).

use super::iq_grids::IQ3S_GRID;
#[cfg(target_arch = "aarch64")]
use super::lattice::signed_pair;
use super::lattice::{EXPLICIT_SIGN_BYTES, QK_K, grid_byte, half, sign, signed_point};

/// f16 d, 64 index bytes, 8 `qh` bytes, 32 sign bytes, 4 scale bytes.
pub(crate) const BLOCK_BYTES: usize = 110;

/// ggml-quants.c `dequantize_row_iq3_s`, one block.
pub(crate) fn dequantize_block(b: &[u8], y: &mut [f32]) {
    let d = half(b, 0);
    let (qs, qh, signs, scales) = (&b[2..66], &b[66..74], &b[74..106], &b[106..110]);
    for (ib, y) in y[..QK_K].chunks_exact_mut(32).enumerate() {
        let s = if ib % 2 == 0 { scales[ib / 2] & 0xf } else { scales[ib / 2] >> 4 };
        let db = d * (1 + 2 * s as i32) as f32;
        let h = qh[ib] as usize;
        for (l, y) in y.chunks_exact_mut(8).enumerate() {
            let g1 = IQ3S_GRID[qs[8 * ib + 2 * l] as usize | ((h << (8 - 2 * l)) & 256)] as u64;
            let g2 = IQ3S_GRID[qs[8 * ib + 2 * l + 1] as usize | ((h << (7 - 2 * l)) & 256)] as u64;
            let sg = signs[4 * ib + l];
            for j in 0..4 {
                y[j] = db * grid_byte(g1, j) as f32 * sign(sg, j);
                y[j + 4] = db * grid_byte(g2, j) as f32 * sign(sg, j + 4);
            }
        }
    }
}

/// Part `s`'s four pairs of 4-byte grid points, each pair as one 8-byte point, and their sign
/// bytes.
fn part_points(b: &[u8], s: usize) -> ([u64; 4], [u8; 4]) {
    let (qs, signs, h) = (&b[2 + 8 * s..10 + 8 * s], &b[74 + 4 * s..78 + 4 * s], b[66 + s] as usize);
    let points = std::array::from_fn(|l| {
        let g1 = IQ3S_GRID[qs[2 * l] as usize | ((h << (8 - 2 * l)) & 256)] as u64;
        let g2 = IQ3S_GRID[qs[2 * l + 1] as usize | ((h << (7 - 2 * l)) & 256)] as u64;
        g1 | g2 << 32
    });
    (points, signs.try_into().expect("4 sign bytes"))
}

/// Part `s`'s odd scale (ggml's `2·ls + 1`), one for its 32.
fn part_scale(b: &[u8], s: usize) -> i16 {
    let sc = b[106 + s / 2] >> (4 * (s % 2));
    2 * (sc & 0xf) as i16 + 1
}

/// The mat-vec in ggml's AVX2 `ggml_vec_dot_iq3_s_q8_K` order, or for 8 tokens or more its tiled
/// mat-mul's (see `q8_k.rs`).
pub struct Iq3S;

impl super::q8_k::SuperBlock for Iq3S {
    const DTYPE: crate::dtype::LowBit = crate::dtype::LowBit::Iq3S;
    const BYTES: usize = BLOCK_BYTES;
    const FINAL: f32 = 1.0;

    fn decode(b: &[u8], out: &mut super::q8_k::Decoded) {
        for s in 0..QK_K / 32 {
            out.scales[2 * s..2 * s + 2].fill(part_scale(b, s));
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
        super::q8_k::Part256 {
            abs: _mm256_set_epi64x(g[3] as i64, g[2] as i64, g[1] as i64, g[0] as i64),
            sign: _mm256_set_epi64x(sg[3], sg[2], sg[1], sg[0]),
            scales: _mm256_set1_epi16(part_scale(b, s)),
        }
    }

    #[cfg(target_arch = "aarch64")]
    #[inline(always)]
    fn part_neon(b: &[u8], s: usize) -> super::q8_k::PartNeon {
        let (g, sg) = part_points(b, s);
        let sg = sg.map(|x| EXPLICIT_SIGN_BYTES[x as usize]);
        super::q8_k::PartNeon {
            w: [signed_pair([g[0], g[1]], [sg[0], sg[1]]), signed_pair([g[2], g[3]], [sg[2], sg[3]])],
            scales: [part_scale(b, s) as i32; 2],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn iq3_s_kernel_equals_its_scalar_path_and_the_dequantized_product() {
        let bytes = super::super::lattice::tests::random_blocks(BLOCK_BYTES, 5 * 3, 27);
        super::super::q8_k::tests::check_kernel::<Iq3S>(&bytes, 5, 3 * QK_K, dequantize_block);
    }

    #[test]
    fn iq3_s_simd_parts_are_its_scalar_decoding() {
        let bytes = super::super::lattice::tests::random_blocks(BLOCK_BYTES, 64, 36);
        super::super::q8_k::tests::check_parts::<Iq3S>(&bytes);
    }
}
