//! The aarch64 paths of the i-quants' Q8_K code (`q8_k.rs`): the activations' quantization and
//! the super-block dot, in base NEON or with `sdot` where the CPU has FEAT_DotProd.
//!
//! Both keep the scalar path's bits, which are x86's: ggml's NEON `ggml_vec_dot_iq*_q8_K`
//! (ggml-cpu/arch/arm/quants.c) reduce each super-block to one integer and one float multiply,
//! which rounds differently from the AVX2 order `q8_k.rs` follows; here a 16-byte half's `sdot`
//! (or `smull` and two pairwise adds) gives exactly the AVX2 lanes 0..3 or 4..7, each times its
//! sub-block's scale, and the 8 float accumulators take the same fused multiply-adds.

use std::arch::aarch64::*;

use candle_core::Tensor;

use super::arm::{ArmKernel, quad_sums, with_dotprod};
use super::lattice::QK_K;
use super::q8_k::{Q8K, SuperBlock, hsum8};
use crate::error::Result;

/// ggml-quants.c `quantize_row_q8_K_ref` (which ggml's NEON `quantize_row_q8_K` calls too) in
/// 4-lane vectors: the largest magnitude by `fmaxnm` (NaN ignored, as the scalar `>` does), its
/// first element for the sign, then per element the same IEEE multiply and add of `nearest_int`'s
/// magic number and the same truncation to a byte, so the scalar blocks bit for bit.
pub(crate) fn quantize_q8_k(x: &[f32]) -> Vec<Q8K> {
    x.chunks_exact(QK_K)
        .map(|x| {
            // SAFETY: base NEON (every aarch64 CPU); 4-lane loads within the 256 elements and
            // 16-byte stores within the 256 bytes.
            unsafe {
                let v = |i: usize| vld1q_f32(x.as_ptr().add(4 * i));
                let mut m = vdupq_n_f32(0.0);
                for i in 0..QK_K / 4 {
                    m = vmaxnmq_f32(m, vabsq_f32(v(i)));
                }
                let amax = vmaxnmvq_f32(m);
                let mut qs = [0i8; QK_K];
                if amax == 0.0 {
                    return Q8K { d: 0.0, qs };
                }
                // The scalar loop keeps the first element that reaches the largest magnitude.
                let quad = (0..QK_K / 4)
                    .find(|&i| vmaxvq_u32(vceqq_f32(vabsq_f32(v(i)), vdupq_n_f32(amax))) != 0)
                    .expect("the largest magnitude is some element's");
                let max = *x[4 * quad..4 * quad + 4].iter().find(|v| v.abs() == amax).expect("in this quad");
                let iscale = -127.0 / max;
                let (mask, off, top) = (vdupq_n_s32(0x007f_ffff), vdupq_n_s32(0x0040_0000), vdupq_n_s32(127));
                let q = |i: usize| {
                    let f = vaddq_f32(vmulq_n_f32(v(i), iscale), vdupq_n_f32(12582912.0));
                    vminq_s32(vsubq_s32(vandq_s32(vreinterpretq_s32_f32(f), mask), off), top)
                };
                for c in 0..QK_K / 16 {
                    let lo = vcombine_s16(vmovn_s32(q(4 * c)), vmovn_s32(q(4 * c + 1)));
                    let hi = vcombine_s16(vmovn_s32(q(4 * c + 2)), vmovn_s32(q(4 * c + 3)));
                    vst1q_s8(qs.as_mut_ptr().add(16 * c), vcombine_s8(vmovn_s16(lo), vmovn_s16(hi)));
                }
                Q8K { d: 1.0 / iscale, qs }
            }
        })
        .collect()
}

/// `row` against `N` tokens, each super-block decoded once, part by part into registers
/// ([`SuperBlock::part_neon`]) that every token's activations meet: each token's result is
/// [`super::q8_k::dot_scalar`]'s bits (integer lanes exact, the same float operations in order).
///
/// # Safety
/// `SDOT` only where the CPU has FEAT_DotProd.
#[inline(always)]
unsafe fn dots<T: SuperBlock, const SDOT: bool, const N: usize>(row: &[u8], xs: [&[Q8K]; N]) -> [f32; N] {
    assert!(xs.iter().all(|x| x.len() * T::BYTES >= row.len()));
    // SAFETY: base NEON; 16-byte loads within the 256 activations; `quad_sums` gets the caller's
    // proof of dotprod.
    unsafe {
        let mut acc = [[vdupq_n_f32(0.0); 2]; N];
        for (b, block) in row.chunks_exact(T::BYTES).enumerate() {
            let xb: [&Q8K; N] = std::array::from_fn(|t| &xs[t][b]);
            // Half h of each 32 holds the AVX2 lanes 4h..4h+3: its 16 weights' scale on its sums.
            let mut lanes = [[vdupq_n_s32(0); 2]; N];
            for s in 0..QK_K / 32 {
                let part = T::part_neon(block, s);
                for (lanes, xb) in lanes.iter_mut().zip(&xb) {
                    for (h, (lanes, (&w, &scale))) in lanes.iter_mut().zip(part.w.iter().zip(&part.scales)).enumerate()
                    {
                        let q = quad_sums::<SDOT>(w, vld1q_s8(xb.qs.as_ptr().add(32 * s + 16 * h)));
                        *lanes = vmlaq_n_s32(*lanes, q, scale);
                    }
                }
            }
            let dw = T::d_neon(block);
            for ((acc, lanes), xb) in acc.iter_mut().zip(&lanes).zip(&xb) {
                let d = vdupq_n_f32(dw * xb.d);
                acc[0] = vfmaq_f32(acc[0], vcvtq_f32_s32(lanes[0]), d);
                acc[1] = vfmaq_f32(acc[1], vcvtq_f32_s32(lanes[1]), d);
            }
        }
        acc.map(|[lo, hi]| {
            let mut a = [0f32; 8];
            vst1q_f32(a.as_mut_ptr(), lo);
            vst1q_f32(a.as_mut_ptr().add(4), hi);
            T::FINAL * hsum8(a)
        })
    }
}

/// Tokens one decoding of a row's super-blocks serves.
const TOKENS: usize = 4;

/// [`dots`] on path `kernel`.
fn dots_on<T: SuperBlock, const N: usize>(kernel: ArmKernel, row: &[u8], xs: [&[Q8K]; N]) -> [f32; N] {
    match kernel {
        // SAFETY: the NEON instance uses base NEON only, which every aarch64 CPU has.
        ArmKernel::Neon => unsafe { dots::<T, false, N>(row, xs) },
        // The K-quants have no i8mm path: I8mm runs the dotprod one.
        ArmKernel::Dotprod | ArmKernel::I8mm => {
            kernel.require();
            // SAFETY: dotprod was required just above (I8mm requires it too).
            unsafe { with_dotprod(|| dots::<T, true, N>(row, xs)) }
        }
    }
}

/// `q8` (one token's Q8_K blocks each) against `rows` rows of `T` over `bytes` → `[tokens, rows]`
/// on path `kernel`.
pub(crate) fn matmul<T: SuperBlock>(
    bytes: &[u8],
    rows: usize,
    cols: usize,
    q8: &[Vec<Q8K>],
    kernel: ArmKernel,
) -> Result<Tensor> {
    let row_bytes = cols / QK_K * T::BYTES;
    super::matvec::rows_by_tokens(rows, q8.len(), rows * cols * q8.len(), |r, out| {
        let row = &bytes[r * row_bytes..(r + 1) * row_bytes];
        for (xs, out) in q8.chunks(TOKENS).zip(out.chunks_mut(TOKENS)) {
            let x = |i: usize| &xs[i][..];
            match out.len() {
                1 => out[0] = dots_on::<T, 1>(kernel, row, [x(0)])[0],
                2 => out.copy_from_slice(&dots_on::<T, 2>(kernel, row, [x(0), x(1)])),
                3 => out.copy_from_slice(&dots_on::<T, 3>(kernel, row, [x(0), x(1), x(2)])),
                _ => out.copy_from_slice(&dots_on::<T, 4>(kernel, row, [x(0), x(1), x(2), x(3)])),
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernel::q8::tests::random;
    use crate::kernel::q8_k::{dot_scalar, quantize_q8_k_ref};

    #[test]
    fn neon_q8_k_quantization_gives_the_scalar_blocks() {
        let mut x = random(9 * QK_K, 41);
        // A block of zeros; one whose largest magnitude comes at both signs (the first wins);
        // one whose maximum is negative and has NaNs beside it; one of exact halves scaled by
        // exactly 1 (its maximum is −127), so that every other value is a tie to round to even.
        x[..QK_K].fill(0.0);
        x[QK_K + 7] = -3.0;
        x[QK_K + 200] = 3.0;
        x[2 * QK_K + 255] = -5.0;
        x[2 * QK_K + 3] = f32::NAN;
        x[2 * QK_K + 100] = -f32::NAN;
        for (i, v) in x[3 * QK_K..4 * QK_K].iter_mut().enumerate() {
            *v = (i as f32 - 128.0) * 0.5;
        }
        x[4 * QK_K - 1] = -127.0;
        // A lone nonzero value in the last element, where the search for its sign ends.
        x[4 * QK_K..5 * QK_K].fill(0.0);
        x[5 * QK_K - 1] = 1e-30;
        let (got, want) = (quantize_q8_k(&x), quantize_q8_k_ref(&x));
        assert_eq!(got.len(), want.len());
        for (b, (g, w)) in got.iter().zip(&want).enumerate() {
            assert_eq!(g.d.to_bits(), w.d.to_bits(), "block {b}: d {} vs {}", g.d, w.d);
            assert_eq!(g.qs, w.qs, "block {b}");
        }
    }

    /// Shapes: (rows, super-blocks a row, tokens): one of each; odd counts; chunks of
    /// [`TOKENS`] with a shorter last one.
    const SHAPES: [(usize, usize, usize); 4] = [(1, 1, 1), (3, 2, 5), (7, 5, 4), (5, 3, 9)];

    /// On each path this CPU runs, every token's result for every row is [`dot_scalar`]'s bits.
    fn every_arm_path_gives_the_scalar_bits<T: SuperBlock>() {
        for (seed, (rows, blocks, tokens)) in (1u64..).zip(SHAPES) {
            let bytes = crate::kernel::lattice::tests::random_blocks(T::BYTES, rows * blocks, seed);
            let cols = blocks * QK_K;
            let q8: Vec<Vec<Q8K>> =
                (0..tokens as u64).map(|t| quantize_q8_k_ref(&random(cols, 100 * seed + t))).collect();
            let row_bytes = blocks * T::BYTES;
            let want: Vec<u32> = q8
                .iter()
                .flat_map(|x| {
                    (0..rows).map(|r| dot_scalar::<T>(&bytes[r * row_bytes..(r + 1) * row_bytes], x).to_bits())
                })
                .collect();
            for kernel in ArmKernel::available() {
                let got = matmul::<T>(&bytes, rows, cols, &q8, kernel).unwrap().flatten_all().unwrap();
                let got: Vec<u32> = got.to_vec1::<f32>().unwrap().iter().map(|y| y.to_bits()).collect();
                assert_eq!(got, want, "{kernel:?}: {rows} rows of {blocks} super-blocks, {tokens} tokens");
            }
        }
    }

    #[test]
    fn iq4_xs_arm_paths_give_the_scalar_bits() {
        every_arm_path_gives_the_scalar_bits::<crate::kernel::iq4_xs::Iq4Xs>();
    }

    #[test]
    fn iq2_xxs_arm_paths_give_the_scalar_bits() {
        every_arm_path_gives_the_scalar_bits::<crate::kernel::iq2_xxs::Iq2Xxs>();
    }

    #[test]
    fn iq3_xxs_arm_paths_give_the_scalar_bits() {
        every_arm_path_gives_the_scalar_bits::<crate::kernel::iq3_xxs::Iq3Xxs>();
    }

    #[test]
    fn iq2_s_arm_paths_give_the_scalar_bits() {
        every_arm_path_gives_the_scalar_bits::<crate::kernel::iq2_s::Iq2S>();
    }

    #[test]
    fn iq3_s_arm_paths_give_the_scalar_bits() {
        every_arm_path_gives_the_scalar_bits::<crate::kernel::iq3_s::Iq3S>();
    }

    #[test]
    fn iq2_xs_arm_paths_give_the_scalar_bits() {
        every_arm_path_gives_the_scalar_bits::<crate::kernel::iq2_xs::Iq2Xs>();
    }
}
