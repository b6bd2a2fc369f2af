//! Activations as ggml's Q8_K super-blocks, the input of the i-quant kernels, and the dot product
//! those kernels share: each type decodes a super-block of weights into signed integers with a
//! scale per 16, and ggml's x86 AVX2 `ggml_vec_dot_iq*_q8_K` order does the rest. There, every
//! integer product lands in one of 8 i32 lanes (lane k: elements 4k..4k+3 of each 32), a
//! super-block's lanes go into 8 f32 accumulators by one fused multiply-add with d_w · d_x, and
//! `hsum_float_8` adds the accumulators at the end; integer sums are exact, so the result depends
//! only on that float order, which the scalar path below keeps lane for lane. That is llama.cpp's
//! order for fewer than 8 tokens (a decode step); from 8 (a prompt) its tiled mat-mul
//! (ggml-cpu/tiled, AVX code: x86 only) takes over, one chain per row and token over the
//! super-blocks' integer sums ([`dot_tiled`]), and so do we on x86: a prompt's logits would
//! otherwise differ from llama.cpp's in the last bits, and a low-bit file's close greedy choices
//! with them. On aarch64 llama.cpp keeps the vec_dot order for every batch, and so do our NEON
//! paths (`q8_k_arm.rs`).

use candle_core::Tensor;

use super::matvec::activations;
#[cfg(not(target_arch = "aarch64"))]
use super::matvec::{has_avx2_f16c, rows_by_tokens};
use crate::error::Result;

use super::lattice::QK_K;

/// ggml `block_q8_K`: an f32 scale and 256 signed bytes (the 16-sums ggml keeps beside them
/// serve only the K types' minimums, which these kernels do not have).
pub(crate) struct Q8K {
    pub(crate) d: f32,
    pub(crate) qs: [i8; QK_K],
}

/// ggml-quants.c `nearest_int`: round half to even through the float's mantissa (|x| < 2^22).
#[cfg_attr(target_arch = "aarch64", allow(dead_code))] // aarch64: the reference its tests compare against
fn nearest_int(x: f32) -> i32 {
    let v = x + 12582912.0;
    (v.to_bits() & 0x007f_ffff) as i32 - 0x0040_0000
}

/// The activations' Q8_K blocks: [`quantize_q8_k_ref`]'s, in NEON on aarch64 (`q8_k_arm.rs`).
pub(crate) fn quantize_q8_k(x: &[f32]) -> Vec<Q8K> {
    #[cfg(target_arch = "aarch64")]
    return super::q8_k_arm::quantize_q8_k(x);
    #[cfg(not(target_arch = "aarch64"))]
    quantize_q8_k_ref(x)
}

/// ggml-quants.c `quantize_row_q8_K_ref`, which ggml's x86 `quantize_row_q8_K` calls: the scale
/// from the element of largest magnitude, with its sign (iscale = -127 / max).
#[cfg_attr(target_arch = "aarch64", allow(dead_code))] // aarch64: the reference its tests compare against
pub(crate) fn quantize_q8_k_ref(x: &[f32]) -> Vec<Q8K> {
    x.chunks_exact(QK_K)
        .map(|x| {
            let (mut max, mut amax) = (0f32, 0f32);
            for &v in x {
                if v.abs() > amax {
                    (amax, max) = (v.abs(), v);
                }
            }
            let mut qs = [0i8; QK_K];
            if amax == 0.0 {
                return Q8K { d: 0.0, qs };
            }
            let iscale = -127.0 / max;
            for (q, &v) in qs.iter_mut().zip(x) {
                *q = nearest_int(iscale * v).min(127) as i8;
            }
            Q8K { d: 1.0 / iscale, qs }
        })
        .collect()
}

/// A super-block of weights decoded by the scalar path, the SIMD paths' reference: 256 signed
/// weights and the multiplier of each 16 (the type's odd or signed sub-block scale). The SIMD
/// paths decode 32 weights at a time into registers instead (`Part256`, `PartNeon`).
pub(crate) struct Decoded {
    pub(crate) w: [i8; QK_K],
    pub(crate) scales: [i16; QK_K / 16],
}

/// A weight type computed by [`matmul`]: how it decodes a super-block, its scale, and the
/// constant ggml multiplies the row's sum by at the end.
pub(crate) trait SuperBlock: Sync + Send + 'static {
    const DTYPE: crate::dtype::LowBit;
    const BYTES: usize;
    /// ggml's final factor (`0.125f * hsum_float_8(...)` for IQ2_XXS).
    const FINAL: f32;
    /// The block's f16 scale, widened.
    fn d(block: &[u8]) -> f32 {
        super::lattice::half(block, 0)
    }
    /// [`Self::d`] by F16C's widening, which is exact as the scalar one is (a type whose scale
    /// lies elsewhere overrides `d`, `d_f16c` and `d_neon` together): inline, where the `half` crate's would be a call per block.
    ///
    /// # Safety
    /// The CPU has F16C.
    #[cfg(target_arch = "x86_64")]
    #[inline]
    #[target_feature(enable = "f16c")]
    unsafe fn d_f16c(block: &[u8]) -> f32 {
        use std::arch::x86_64::*;
        _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(super::lattice::u16_at(block, 0) as i32)))
    }
    /// [`Self::d`] by `fcvt` (half to single precision is base Armv8 floating point: no FEAT_FP16),
    /// exact as the scalar widening is: inline, where the `half` crate asks the CPU for FEAT_FP16
    /// first.
    #[cfg(target_arch = "aarch64")]
    #[inline(always)]
    fn d_neon(block: &[u8]) -> f32 {
        let bits = super::lattice::u16_at(block, 0);
        let d: f32;
        // SAFETY: a register-only instruction of every aarch64 CPU.
        unsafe {
            std::arch::asm!(
                "fcvt {d:s}, {h:h}",
                d = lateout(vreg) d,
                h = in(vreg) bits as i16,
                options(pure, nomem, nostack, preserves_flags)
            );
        }
        d
    }
    /// The scalar decoding: the reference the SIMD parts below are tested against.
    fn decode(block: &[u8], out: &mut Decoded);
    /// 32-weight part `s` of the block (`0..8`) straight into AVX2 registers.
    ///
    /// # Safety
    /// The CPU has AVX2; `block` holds [`Self::BYTES`] bytes.
    #[cfg(target_arch = "x86_64")]
    unsafe fn part_avx2(block: &[u8], s: usize) -> Part256;
    /// 32-weight part `s` of the block (`0..8`) straight into NEON registers.
    #[cfg(target_arch = "aarch64")]
    fn part_neon(block: &[u8], s: usize) -> PartNeon;
}

/// 32 weights of a super-block in AVX2 registers, as ggml's AVX2 i-quant dots hold them: their
/// magnitudes (for `_mm256_maddubs_epi16`), a vector with their signs (for `_mm256_sign_epi8` on
/// the activations) and each 16's scale in i16 lanes (for `_mm256_madd_epi16`).
#[cfg(target_arch = "x86_64")]
pub(crate) struct Part256 {
    pub(crate) abs: std::arch::x86_64::__m256i,
    pub(crate) sign: std::arch::x86_64::__m256i,
    pub(crate) scales: std::arch::x86_64::__m256i,
}

/// 32 signed weights of a super-block in two NEON registers (elements 0..15, 16..31) and the
/// scale of each.
#[cfg(target_arch = "aarch64")]
pub(crate) struct PartNeon {
    pub(crate) w: [std::arch::aarch64::int8x16_t; 2],
    pub(crate) scales: [i32; 2],
}

/// The 8 integer lanes of one super-block against one token's Q8_K block.
#[cfg_attr(target_arch = "aarch64", allow(dead_code))] // aarch64: the reference its tests compare against
fn lanes_scalar(w: &Decoded, x: &Q8K) -> [i32; 8] {
    let mut lanes = [0i32; 8];
    for (e, (&w8, &x8)) in w.w.iter().zip(&x.qs).enumerate() {
        lanes[(e % 32) / 4] += w.scales[e / 16] as i32 * (w8 as i32 * x8 as i32);
    }
    lanes
}

/// ggml's `hsum_float_8`: ((a0+a4) + (a2+a6)) + ((a1+a5) + (a3+a7)).
pub(crate) fn hsum8(a: [f32; 8]) -> f32 {
    let s4: [f32; 4] = std::array::from_fn(|i| a[i + 4] + a[i]);
    (s4[0] + s4[2]) + (s4[1] + s4[3])
}

/// `row` · one token, in ggml's AVX2 order, without SIMD.
#[cfg_attr(target_arch = "aarch64", allow(dead_code))] // aarch64: the reference its tests compare against
pub(crate) fn dot_scalar<T: SuperBlock>(row: &[u8], x: &[Q8K]) -> f32 {
    let mut acc = [0f32; 8];
    let mut w = Decoded { w: [0; QK_K], scales: [0; QK_K / 16] };
    for (block, xb) in row.chunks_exact(T::BYTES).zip(x) {
        T::decode(block, &mut w);
        let d = T::d(block) * xb.d;
        for (a, l) in acc.iter_mut().zip(lanes_scalar(&w, xb)) {
            *a = d.mul_add(l as f32, *a);
        }
    }
    T::FINAL * hsum8(acc)
}

/// `row` · one token in the order of ggml's tiled mat-mul (ggml-cpu/tiled/tiled-kernel.cpp
/// `tiled_run_micro_vnni_8x16`, which llama.cpp takes for batches of 8 tokens or more,
/// tiled.cpp `ggml_tiled_min_batch`): a super-block's exact integer sum times d_w (the type's
/// final factor folded in, tiled.cpp `tiled_unpack_src0`), times d_x, added to one chain.
// On aarch64 only the tests read it: llama.cpp's aarch64 build has no tiled mat-mul.
#[cfg_attr(target_arch = "aarch64", allow(dead_code))]
pub(crate) fn dot_tiled<T: SuperBlock>(row: &[u8], x: &[Q8K]) -> f32 {
    let mut acc = 0f32;
    let mut w = Decoded { w: [0; QK_K], scales: [0; QK_K / 16] };
    for (block, xb) in row.chunks_exact(T::BYTES).zip(x) {
        T::decode(block, &mut w);
        let isum: i32 = lanes_scalar(&w, xb).iter().sum();
        acc = (isum as f32 * (T::d(block) * T::FINAL)).mul_add(xb.d, acc);
    }
    acc
}

/// The sum of an AVX2 vector's 8 i32 lanes (exact: any order).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
pub(crate) fn hsum_epi32(v: std::arch::x86_64::__m256i) -> i32 {
    use std::arch::x86_64::*;
    let s4 = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256::<1>(v));
    let s2 = _mm_add_epi32(s4, _mm_unpackhi_epi64(s4, s4));
    _mm_cvtsi128_si32(_mm_add_epi32(s2, _mm_shuffle_epi32::<1>(s2)))
}

/// `row` against `N` tokens, each block decoded once, part by part into registers
/// ([`SuperBlock::part_avx2`]) that every token's activations meet: each token's sum is the one
/// [`dot_scalar`] computes, in AVX2 lanes (or [`dot_tiled`]'s chain).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dots_avx2<T: SuperBlock, const N: usize, const TILED: bool>(row: &[u8], xs: [&[Q8K]; N]) -> [f32; N] {
    use std::arch::x86_64::*;
    assert!(xs.iter().all(|x| x.len() * T::BYTES >= row.len()));
    let mut acc = [_mm256_setzero_ps(); N];
    let mut chain = [0f32; N];
    for (b, block) in row.chunks_exact(T::BYTES).enumerate() {
        let xb: [&Q8K; N] = std::array::from_fn(|t| &xs[t][b]);
        let mut sums = [_mm256_setzero_si256(); N];
        for s in 0..QK_K / 32 {
            // SAFETY: AVX2 is this function's; `block` is one whole block.
            let part = unsafe { T::part_avx2(block, s) };
            for (sum, xb) in sums.iter_mut().zip(&xb) {
                // SAFETY: a 32-byte load within the 256 activations.
                let q8 = unsafe { _mm256_loadu_si256(xb.qs.as_ptr().add(32 * s).cast()) };
                // |w| · (x with w's sign) pairs to i16 (no saturation: |w| ≤ 127, |x| ≤ 127), then × scale to i32.
                let p = _mm256_maddubs_epi16(part.abs, _mm256_sign_epi8(q8, part.sign));
                *sum = _mm256_add_epi32(*sum, _mm256_madd_epi16(p, part.scales));
            }
        }
        // SAFETY: F16C is this function's.
        let dw = unsafe { T::d_f16c(block) };
        for (((acc, chain), sum), xb) in acc.iter_mut().zip(&mut chain).zip(sums).zip(xb) {
            if TILED {
                // The lanes' sum is exact in any order: the super-block's integer sum.
                let s4 = _mm_add_epi32(_mm256_castsi256_si128(sum), _mm256_extracti128_si256::<1>(sum));
                let s2 = _mm_add_epi32(s4, _mm_unpackhi_epi64(s4, s4));
                let isum = _mm_cvtsi128_si32(_mm_add_epi32(s2, _mm_shuffle_epi32::<1>(s2)));
                *chain = (isum as f32 * (dw * T::FINAL)).mul_add(xb.d, *chain);
            } else {
                *acc = _mm256_fmadd_ps(_mm256_set1_ps(dw * xb.d), _mm256_cvtepi32_ps(sum), *acc);
            }
        }
    }
    if TILED { chain } else { acc.map(|a| T::FINAL * super::matvec::hsum_avx2(a)) }
}

#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
unsafe fn dots_avx2<T: SuperBlock, const N: usize, const TILED: bool>(row: &[u8], xs: [&[Q8K]; N]) -> [f32; N] {
    xs.map(|x| if TILED { dot_tiled::<T>(row, x) } else { dot_scalar::<T>(row, x) })
}

/// The fewest tokens for which llama.cpp takes its tiled mat-mul over `ggml_vec_dot_*_q8_K`
/// (tiled.cpp `ggml_tiled_min_batch`): a prompt's pass, not a decode step's.
pub(crate) const TILED_MIN_TOKENS: usize = 8;

/// Tokens one decoding of a row's blocks serves.
#[cfg(not(target_arch = "aarch64"))]
const TOKENS: usize = 4;

/// `x`: `[tokens, cols]` → `[tokens, rows]` over `bytes`, `rows` rows of `cols / 256` blocks of `T`.
pub(crate) fn matmul<T: SuperBlock>(bytes: &[u8], rows: usize, cols: usize, x: &Tensor) -> Result<Tensor> {
    let q8: Vec<Vec<Q8K>> = activations(x)?.chunks_exact(cols).map(quantize_q8_k).collect();
    #[cfg(target_arch = "aarch64")]
    return super::q8_k_arm::matmul::<T>(bytes, rows, cols, &q8, super::arm::ArmKernel::detect());
    #[cfg(not(target_arch = "aarch64"))]
    {
        let tokens = x.dim(0)?;
        let row_bytes = cols / QK_K * T::BYTES;
        let avx2 = has_avx2_f16c();
        let tiled = tokens >= TILED_MIN_TOKENS;
        rows_by_tokens(rows, tokens, rows * cols * tokens, |r, out| {
            let row = &bytes[r * row_bytes..(r + 1) * row_bytes];
            if !avx2 {
                let dot = if tiled { dot_tiled::<T> } else { dot_scalar::<T> };
                out.iter_mut().enumerate().for_each(|(t, y)| *y = dot(row, &q8[t]));
                return;
            }
            for (c, out) in out.chunks_mut(TOKENS).enumerate() {
                let x = |i: usize| &q8[c * TOKENS + i][..];
                if tiled {
                    // SAFETY: AVX2, FMA and F16C were detected at run time.
                    match out.len() {
                        1 => out[0] = unsafe { dots_avx2::<T, 1, true>(row, [x(0)]) }[0],
                        2 => out.copy_from_slice(&unsafe { dots_avx2::<T, 2, true>(row, [x(0), x(1)]) }),
                        3 => out.copy_from_slice(&unsafe { dots_avx2::<T, 3, true>(row, [x(0), x(1), x(2)]) }),
                        _ => out.copy_from_slice(&unsafe { dots_avx2::<T, 4, true>(row, [x(0), x(1), x(2), x(3)]) }),
                    }
                    continue;
                }
                // SAFETY: AVX2, FMA and F16C were detected at run time.
                match out.len() {
                    1 => out[0] = unsafe { dots_avx2::<T, 1, false>(row, [x(0)]) }[0],
                    2 => out.copy_from_slice(&unsafe { dots_avx2::<T, 2, false>(row, [x(0), x(1)]) }),
                    3 => out.copy_from_slice(&unsafe { dots_avx2::<T, 3, false>(row, [x(0), x(1), x(2)]) }),
                    _ => out.copy_from_slice(&unsafe { dots_avx2::<T, 4, false>(row, [x(0), x(1), x(2), x(3)]) }),
                }
            }
        })
    }
}

/// A matrix whose type [`Linear`](crate::Linear) knows only through this: its product, and its
/// rows' bytes for a tied head's lookups.
pub trait LowBitMatrix: Send + Sync {
    fn forward(&self, x: &Tensor) -> Result<Tensor>;
    fn dtype(&self) -> crate::dtype::WeightDType;
    fn cols(&self) -> usize;
    fn row_bytes(&self, r: usize) -> &[u8];
}

impl<T: SuperBlock> LowBitMatrix for SuperBlockMatrix<T> {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        matmul::<T>(self.bytes.as_slice(), self.rows, self.cols, x)
    }

    fn dtype(&self) -> crate::dtype::WeightDType {
        crate::dtype::WeightDType::LowBit(T::DTYPE)
    }

    fn cols(&self) -> usize {
        self.cols
    }

    fn row_bytes(&self, r: usize) -> &[u8] {
        let len = self.cols / QK_K * T::BYTES;
        &self.bytes.as_slice()[r * len..(r + 1) * len]
    }
}

/// The matrix of a [`SuperBlock`] type over its file's bytes.
pub(crate) struct SuperBlockMatrix<T> {
    rows: usize,
    cols: usize,
    bytes: crate::bytes::WeightBytes,
    kind: std::marker::PhantomData<T>,
}

impl<T: SuperBlock> SuperBlockMatrix<T> {
    /// `bytes` must hold `rows · cols / 256` blocks (the caller checked the shape).
    pub(crate) fn new(bytes: crate::bytes::WeightBytes, rows: usize, cols: usize) -> Self {
        debug_assert!(bytes.as_slice().len() >= rows * cols / QK_K * T::BYTES);
        SuperBlockMatrix { rows, cols, bytes, kind: std::marker::PhantomData }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    #[test]
    fn nearest_int_rounds_half_to_even_as_ggml_does() {
        assert_eq!([0.5, 1.5, 2.5, -0.5, -1.5, 126.5, 3.4999].map(nearest_int), [0, 2, 2, 0, -2, 126, 3]);
    }

    /// Every f16 scale widens in the SIMD paths' instruction to the scalar widening's bits (NaN
    /// to NaN).
    #[test]
    fn simd_scale_widening_is_the_scalar_one() {
        type T = super::super::iq2_xxs::Iq2Xxs;
        #[cfg(target_arch = "x86_64")]
        assert!(super::super::matvec::has_avx2_f16c(), "testing the F16C widening needs an F16C CPU");
        for bits in 0..=u16::MAX {
            let block = bits.to_le_bytes();
            #[cfg(target_arch = "x86_64")]
            // SAFETY: F16C asserted above.
            let got = unsafe { T::d_f16c(&block) };
            #[cfg(target_arch = "aarch64")]
            let got = T::d_neon(&block);
            #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
            let got = T::d(&block);
            let want = T::d(&block);
            assert!(got.to_bits() == want.to_bits() || got.is_nan() && want.is_nan(), "{bits:#06x}: {got} vs {want}");
        }
    }

    /// For a type: each 32 weights its SIMD decoding puts in registers (`SuperBlock::part_avx2`,
    /// `SuperBlock::part_neon`) are the scalar decoding's signed weights and 16-weight scales,
    /// on every part of `bytes`' blocks.
    pub(crate) fn check_parts<T: SuperBlock>(bytes: &[u8]) {
        for (n, block) in bytes.chunks_exact(T::BYTES).enumerate() {
            let mut want = Decoded { w: [0; QK_K], scales: [0; QK_K / 16] };
            T::decode(block, &mut want);
            for s in 0..QK_K / 32 {
                let (w, scales) = part_weights::<T>(block, s);
                assert_eq!(w[..], want.w[32 * s..32 * (s + 1)], "block {n} part {s}");
                assert_eq!(scales, [want.scales[2 * s], want.scales[2 * s + 1]].map(i32::from), "block {n} part {s}");
            }
        }
    }

    /// Part `s` of `block` from the AVX2 registers: magnitude times sign, and each half's scale
    /// (which all 8 of its i16 lanes must carry).
    #[cfg(target_arch = "x86_64")]
    fn part_weights<T: SuperBlock>(block: &[u8], s: usize) -> ([i8; 32], [i32; 2]) {
        use std::arch::x86_64::*;
        assert!(super::super::cpu::has_avx2(), "testing the AVX2 decoding needs an AVX2 CPU");
        let (mut abs, mut sign, mut scales) = ([0i8; 32], [0i8; 32], [0i16; 16]);
        // SAFETY: AVX2 asserted just above; 32-byte stores into 32-byte arrays.
        unsafe {
            let part = T::part_avx2(block, s);
            _mm256_storeu_si256(abs.as_mut_ptr().cast(), part.abs);
            _mm256_storeu_si256(sign.as_mut_ptr().cast(), part.sign);
            _mm256_storeu_si256(scales.as_mut_ptr().cast(), part.scales);
        }
        assert!(scales[..8].iter().all(|&x| x == scales[0]) && scales[8..].iter().all(|&x| x == scales[8]));
        // `_mm256_maddubs_epi16` reads the magnitudes unsigned: they must be below 128.
        assert!(abs.iter().all(|&a| a >= 0), "{abs:?}");
        (std::array::from_fn(|i| abs[i] * sign[i].signum()), [scales[0], scales[8]].map(i32::from))
    }

    /// Part `s` of `block` from the NEON registers.
    #[cfg(target_arch = "aarch64")]
    fn part_weights<T: SuperBlock>(block: &[u8], s: usize) -> ([i8; 32], [i32; 2]) {
        let part = T::part_neon(block, s);
        let mut w = [0i8; 32];
        // SAFETY: 16-byte stores within the 32 bytes; base NEON.
        unsafe {
            std::arch::aarch64::vst1q_s8(w.as_mut_ptr(), part.w[0]);
            std::arch::aarch64::vst1q_s8(w.as_mut_ptr().add(16), part.w[1]);
        }
        (w, part.scales)
    }

    /// For a type: the SIMD path equals the scalar path bit for bit, for one token and several
    /// together (below [`TILED_MIN_TOKENS`] in the vec_dot order, from it in the tiled order);
    /// and both orders are the dequantized weights times the dequantized activations, up to f32
    /// rounding.
    pub(crate) fn check_kernel<T: SuperBlock>(
        bytes: &[u8],
        rows: usize,
        cols: usize,
        dequantize_block: fn(&[u8], &mut [f32]),
    ) {
        let tokens = TILED_MIN_TOKENS + 1;
        let xs = super::super::q8::tests::random(tokens * cols, 5);
        let x = Tensor::from_vec(xs.clone(), (tokens, cols), &candle_core::Device::Cpu).unwrap();
        let got = matmul::<T>(bytes, rows, cols, &x).unwrap().to_vec2::<f32>().unwrap();
        let few = matmul::<T>(bytes, rows, cols, &x.narrow(0, 0, 6).unwrap()).unwrap().to_vec2::<f32>().unwrap();
        let row_bytes = cols / QK_K * T::BYTES;
        for t in 0..tokens {
            let q8 = quantize_q8_k(&xs[t * cols..(t + 1) * cols]);
            let alone = matmul::<T>(bytes, rows, cols, &x.narrow(0, t, 1).unwrap()).unwrap().to_vec2::<f32>().unwrap();
            let xq: Vec<f32> = q8.iter().flat_map(|b| b.qs.map(|q| q as f32 * b.d)).collect();
            for r in 0..rows {
                let row = &bytes[r * row_bytes..(r + 1) * row_bytes];
                let (scalar, tiled) = (dot_scalar::<T>(row, &q8), dot_tiled::<T>(row, &q8));
                // A prompt's order: the tiled one on x86, vec_dot's on aarch64 (as llama.cpp's builds).
                let prompt = if cfg!(target_arch = "aarch64") { scalar } else { tiled };
                assert_eq!(got[t][r].to_bits(), prompt.to_bits(), "token {t} row {r}: {} vs {prompt}", got[t][r]);
                if t < 6 {
                    assert_eq!(few[t][r].to_bits(), scalar.to_bits(), "token {t} row {r}: {} vs {scalar}", few[t][r]);
                }
                assert_eq!(alone[0][r].to_bits(), scalar.to_bits(), "token {t} row {r} alone");
                let mut w = vec![0f32; cols];
                row.chunks_exact(T::BYTES).zip(w.chunks_exact_mut(QK_K)).for_each(|(b, y)| dequantize_block(b, y));
                let want: f64 = w.iter().zip(&xq).map(|(a, b)| *a as f64 * *b as f64).sum();
                let scale: f64 = w.iter().zip(&xq).map(|(a, b)| (*a as f64 * *b as f64).abs()).sum();
                for y in [scalar, tiled] {
                    assert!((y as f64 - want).abs() <= 1e-5 * scale + 1e-6, "token {t} row {r}: {y} vs {want}");
                }
            }
        }
    }
}
