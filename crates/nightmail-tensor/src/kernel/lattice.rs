//! Reading an i-quant block: its f16 scale and little-endian words, the bytes of a grid point
//! and their signs, as ggml-quants.c reads `block_iq*` (ggml-common.h). Every i-quant file shares
//! these.

use half::f16;

/// Elements in a super-block (ggml `QK_K`).
pub(crate) const QK_K: usize = 256;

/// The f16 at `b[i..i + 2]`, widened.
pub(crate) fn half(b: &[u8], i: usize) -> f32 {
    f16::from_le_bytes([b[i], b[i + 1]]).to_f32()
}

/// The little-endian u16 at `b[i..i + 2]`.
pub(crate) fn u16_at(b: &[u8], i: usize) -> u16 {
    u16::from_le_bytes(b[i..i + 2].try_into().expect("2 bytes"))
}

/// The little-endian u32 at `b[i..i + 4]`.
pub(crate) fn u32_at(b: &[u8], i: usize) -> u32 {
    // One bounds check and one load, where four byte reads would check each.
    u32::from_le_bytes(b[i..i + 4].try_into().expect("4 bytes"))
}

/// Byte `j` of a grid point (ggml reads the table's words as bytes, little-endian).
pub(crate) fn grid_byte(point: u64, j: usize) -> u8 {
    (point >> (8 * j)) as u8
}

/// The 8 bytes of a grid point (two 4-byte IQ3 points side by side) with bit j of `signs`
/// negating byte j: the signed weights before the sub-block scale. On aarch64 in NEON, as ggml's
/// NEON i-quant dots sign a point (`vtst` against the bit masks, then negate where set).
pub(crate) fn signed_point(point: u64, signs: u8) -> [i8; 8] {
    #[cfg(target_arch = "aarch64")]
    return signed_point_neon(point, signs);
    #[cfg(not(target_arch = "aarch64"))]
    signed_point_scalar(point, signs)
}

/// [`signed_point`] in 8-byte vectors: the mask of set bits m (0 or −1 a byte), then (g ^ m) − m.
#[cfg(target_arch = "aarch64")]
fn signed_point_neon(point: u64, signs: u8) -> [i8; 8] {
    use std::arch::aarch64::*;
    const BITS: u64 = u64::from_le_bytes([1, 2, 4, 8, 16, 32, 64, 128]);
    // SAFETY: register-only base NEON (every aarch64 CPU).
    unsafe {
        let m = vreinterpret_s8_u8(vtst_u8(vdup_n_u8(signs), vcreate_u8(BITS)));
        let g = vcreate_s8(point);
        vget_lane_u64::<0>(vreinterpret_u64_s8(vsub_s8(veor_s8(g, m), m))).to_le_bytes().map(|b| b as i8)
    }
}

#[cfg_attr(target_arch = "aarch64", allow(dead_code))] // aarch64: the reference its test compares against
fn signed_point_scalar(point: u64, signs: u8) -> [i8; 8] {
    std::array::from_fn(|j| {
        let g = grid_byte(point, j) as i8;
        if signs & (1 << j) != 0 { -g } else { g }
    })
}

/// Per 7-bit sign group of IQ2_XXS, IQ2_XS and IQ3_XXS, its 8 signs as bytes, 1 or −1: the
/// vector `_mm256_sign_epi8` signs the activations by, and `vmulq_s8` the NEON weights (ggml's
/// AVX2 dots sign through such a table, `keven_signs_q2xs`). The eighth sign makes the count of
/// negatives even, as `KSIGNS_IQ2XS` does.
pub(crate) static SIGN_BYTES: [u64; 128] = {
    let mut table = [0u64; 128];
    let mut i = 0;
    while i < 128 {
        table[i] = sign_bytes(i as u32 | ((i as u32).count_ones() % 2) << 7);
        i += 1;
    }
    table
};

/// Per sign byte of IQ2_S and IQ3_S (all 8 signs explicit), the same bytes, 1 or −1.
pub(crate) static EXPLICIT_SIGN_BYTES: [u64; 256] = {
    let mut table = [0u64; 256];
    let mut i = 0;
    while i < 256 {
        table[i] = sign_bytes(i as u32);
        i += 1;
    }
    table
};

/// Byte j: −1 where bit j of `signs` is set, else 1.
const fn sign_bytes(signs: u32) -> u64 {
    let (mut word, mut j) = (0u64, 0);
    while j < 8 {
        let byte: u64 = if signs & (1 << j) != 0 { 0xff } else { 0x01 };
        word |= byte << (8 * j);
        j += 1;
    }
    word
}

/// Two 8-byte grid points (or four IQ3 points) as 16 weights, signed by two [`SIGN_BYTES`] words.
#[cfg(target_arch = "aarch64")]
#[inline(always)]
pub(crate) fn signed_pair(points: [u64; 2], signs: [u64; 2]) -> std::arch::aarch64::int8x16_t {
    use std::arch::aarch64::*;
    // SAFETY: register-only base NEON (every aarch64 CPU).
    unsafe {
        let g = vreinterpretq_s8_u64(vcombine_u64(vcreate_u64(points[0]), vcreate_u64(points[1])));
        let s = vreinterpretq_s8_u64(vcombine_u64(vcreate_u64(signs[0]), vcreate_u64(signs[1])));
        vmulq_s8(g, s)
    }
}

/// ±1 for bit `j` of `signs` (ggml `kmask_iq2xs[j]`).
pub(crate) fn sign(signs: u8, j: usize) -> f32 {
    if signs & (1 << j) != 0 { -1.0 } else { 1.0 }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// Every sign byte on every grid point of the three types that sign points.
    #[cfg(target_arch = "aarch64")]
    #[test]
    fn neon_signed_points_are_the_scalar_ones() {
        use super::super::iq_grids::{IQ2XS_GRID, IQ2XXS_GRID, IQ3XXS_GRID};
        let iq3 = IQ3XXS_GRID.iter().zip(IQ3XXS_GRID.iter().rev()).map(|(a, b)| *a as u64 | (*b as u64) << 32);
        let points: Vec<u64> = IQ2XXS_GRID.iter().chain(&IQ2XS_GRID).copied().chain(iq3).collect();
        for point in points {
            for signs in 0..=255u8 {
                assert_eq!(signed_point_neon(point, signs), signed_point_scalar(point, signs), "{point:#x} {signs:#x}");
            }
        }
    }

    #[test]
    fn sign_bytes_are_the_ksigns_groups_and_the_sign_bits() {
        use super::super::iq_grids::KSIGNS_IQ2XS;
        for (i, (&word, &signs)) in SIGN_BYTES.iter().zip(&KSIGNS_IQ2XS).enumerate() {
            let want: [i8; 8] = std::array::from_fn(|j| sign(signs, j) as i8);
            assert_eq!(word.to_le_bytes().map(|b| b as i8), want, "group {i}");
        }
        for (signs, &word) in (0..=255u8).zip(&EXPLICIT_SIGN_BYTES) {
            let want: [i8; 8] = std::array::from_fn(|j| sign(signs, j) as i8);
            assert_eq!(word.to_le_bytes().map(|b| b as i8), want, "signs {signs:#04x}");
        }
    }

    /// `n` blocks of random bytes with a small finite f16 scale first, reproducibly.
    pub(crate) fn random_blocks(block_bytes: usize, n: usize, seed: u64) -> Vec<u8> {
        let mut s = seed;
        let mut next = || {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            (s >> 33) as u8
        };
        let mut out = Vec::with_capacity(block_bytes * n);
        for _ in 0..n {
            let d = f16::from_f32(0.001 + next() as f32 / 255.0 * 0.01).to_le_bytes();
            out.extend_from_slice(&d);
            out.extend((2..block_bytes).map(|_| next()));
        }
        out
    }
}
