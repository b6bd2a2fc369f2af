//! A Q8_0 mat-vec with AVX2, for the output head of models that keep it in Q8_0 (SmolLM2's tied
//! embeddings): ggml's `ggml_vec_dot_q8_0_q8_0` on activations quantized as ggml's x86
//! `quantize_row_q8_0` does (the same per-block rounding as Q8_1, without the sum).

use candle_core::Tensor;
use half::f16;

#[cfg(target_arch = "x86_64")]
use super::cpu::has_avx2;
#[cfg(target_arch = "x86_64")]
use super::q8::PAIRS;
use super::q8::{ChunkKernel, Q8Block, TokenBlocks, q8_matmul};
use crate::error::Result;

const QK: usize = 32;
/// ggml `block_q8_0`: f16 d, then 32 signed bytes.
const BLOCK_BYTES: usize = 34;

pub struct Q8_0Matrix {
    rows: usize,
    cols: usize,
    d: Vec<f32>,
    qs: Vec<[i8; QK]>,
}

impl Q8_0Matrix {
    pub fn from_ggml(bytes: &[u8], rows: usize, cols: usize) -> Self {
        let n = rows * cols / QK;
        let (mut d, mut qs) = (Vec::with_capacity(n), Vec::with_capacity(n));
        for b in bytes.chunks_exact(BLOCK_BYTES).take(n) {
            d.push(f16::from_le_bytes([b[0], b[1]]).to_f32());
            qs.push(std::array::from_fn(|i| b[2 + i] as i8));
        }
        Q8_0Matrix { rows, cols, d, qs }
    }

    pub(crate) fn cols(&self) -> usize {
        self.cols
    }

    /// Row `r`'s blocks as the file held them: each scale back in f16 (exactly: it was read
    /// from one), then its 32 bytes.
    pub(crate) fn row_bytes(&self, r: usize) -> Vec<u8> {
        let nb = self.cols / QK;
        let mut out = Vec::with_capacity(nb * BLOCK_BYTES);
        for b in r * nb..(r + 1) * nb {
            out.extend(f16::from_f32(self.d[b]).to_le_bytes());
            out.extend(self.qs[b].iter().map(|q| *q as u8));
        }
        out
    }

    /// `x`: `[tokens, cols]` → `[tokens, rows]`.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        q8_matmul(
            self.rows,
            self.cols,
            x,
            |r0, x| self.dots::<ROWS>(r0, x),
            |r, x| self.dots::<1>(r, x)[0],
            |r, xs, out| self.token_dots(r, xs, out),
            |r, xs, out| self.pair_token_dots(r, xs, out),
        )
    }

    /// Rows `r` and `r + 1` against a chunk of tokens, into `out[0]` and `out[1]`: on i8mm two
    /// rows by two tokens a `smmla`, elsewhere one row at a time.
    fn pair_token_dots(&self, r: usize, xs: &TokenBlocks, out: [&mut [f32]; 2]) {
        #[cfg(target_arch = "aarch64")]
        if let ChunkKernel::Arm(kernel) = xs.kernel {
            let nb = self.cols / QK;
            let (d, qs) = (&self.d[r * nb..(r + 2) * nb], &self.qs[r * nb..(r + 2) * nb]);
            let (d, qs) = (d.split_at(nb), qs.split_at(nb));
            return super::arm::dispatch!(
                kernel,
                pair_token_dots_arm(d, qs, xs, out),
                i8mm: pair_token_dots_i8mm(d, qs, xs, out)
            );
        }
        let [first, second] = out;
        self.token_dots(r, xs, first);
        self.token_dots(r + 1, xs, second);
    }

    /// Row `r` against a chunk of up to [`super::q8::TOKENS`] tokens, into `out` (one per token).
    fn token_dots(&self, r: usize, xs: &TokenBlocks, out: &mut [f32]) {
        let nb = self.cols / QK;
        let (d, qs) = (&self.d[r * nb..(r + 1) * nb], &self.qs[r * nb..(r + 1) * nb]);
        #[cfg(target_arch = "x86_64")]
        match xs.kernel {
            // SAFETY: AVX2, FMA and AVX-512 F, BW, VL and VNNI were detected at run time.
            ChunkKernel::Avx512 => return unsafe { super::q8::by_tokens!(xs, out, token_dots_avx512(d, qs)) },
            // A CPU with AVX2 but not F16C (which Q4_1's kernels need) gets Scalar chunks; the
            // one-token path runs AVX2 there, and the chunks must sum as it does.
            ChunkKernel::Avx2 | ChunkKernel::Scalar if has_avx2() => {
                // SAFETY: AVX2 and FMA were detected at run time.
                return unsafe { super::q8::by_tokens!(xs, out, token_dots_avx2(d, qs)) };
            }
            ChunkKernel::Avx2 | ChunkKernel::Scalar => {}
        }
        #[cfg(target_arch = "aarch64")]
        if let ChunkKernel::Arm(kernel) = xs.kernel {
            return super::arm::dispatch!(kernel, token_dots_arm(d, qs, xs, out));
        }
        out.iter_mut().zip(&xs.tokens).for_each(|(y, x)| *y = dot_scalar(d, qs, x));
    }

    /// Rows `r0..r0 + N` against one token's blocks, one row at a time: the one-row kernel
    /// streams a row's scales and bytes faster than interleaving four rows did (1.8 against
    /// 4.9 ms for SmolLM2's 49152 × 576 output head on one thread), and each row's sum is the same.
    fn dots<const N: usize>(&self, r0: usize, x: &[Q8Block]) -> [f32; N] {
        let nb = self.cols / QK;
        std::array::from_fn(|i| {
            let range = (r0 + i) * nb..(r0 + i + 1) * nb;
            let (d, qs) = (&self.d[range.clone()], &self.qs[range]);
            #[cfg(target_arch = "x86_64")]
            if has_avx2() {
                // SAFETY: AVX2 and FMA were detected at run time.
                return unsafe { dot_avx2(d, qs, x) };
            }
            #[cfg(target_arch = "aarch64")]
            {
                let kernel = super::arm::ArmKernel::detect();
                super::arm::dispatch!(kernel, dot_arm(d, qs, x))
            }
            #[cfg(not(target_arch = "aarch64"))]
            dot_scalar(d, qs, x)
        })
    }
}

/// Rows per group of the one-token path.
const ROWS: usize = 4;

fn dot_scalar(d: &[f32], qs: &[[i8; QK]], x: &[Q8Block]) -> f32 {
    let mut sum = 0f32;
    for b in 0..d.len() {
        let acc: i32 = qs[b].iter().zip(&x[b].qs).map(|(w, a)| *w as i32 * *a as i32).sum();
        sum += d[b] * x[b].d * acc as f32;
    }
    sum
}

/// [`dot_scalar`] with each block's integer sum taken in NEON ([`super::arm::block_dot`]): the
/// same float operations in the same order, so the same bits.
///
/// # Safety
/// `SDOT` only where the CPU has FEAT_DotProd.
#[cfg(target_arch = "aarch64")]
#[inline(always)]
unsafe fn dot_arm<const SDOT: bool>(d: &[f32], qs: &[[i8; QK]], x: &[Q8Block]) -> f32 {
    let mut sum = 0f32;
    for ((d, q), xb) in d.iter().zip(qs).zip(x) {
        // SAFETY: the caller's proof of dotprod is passed on.
        let acc = unsafe { super::arm::block_dot::<SDOT>(super::arm::bytes(q), &xb.qs) };
        sum += d * xb.d * acc as f32;
    }
    sum
}

/// [`dot_arm`] for each token of a chunk, each weight block loaded once for all of them.
///
/// # Safety
/// `SDOT` only where the CPU has FEAT_DotProd.
#[cfg(target_arch = "aarch64")]
#[inline(always)]
unsafe fn token_dots_arm<const SDOT: bool>(d: &[f32], qs: &[[i8; QK]], xs: &TokenBlocks, out: &mut [f32]) {
    let n = xs.len();
    assert!(out.len() == n && xs.qs.len() >= qs.len() * n && xs.d.len() >= qs.len());
    out.fill(0.0);
    for (b, (d, q)) in d.iter().zip(qs).enumerate() {
        let w = super::arm::bytes(q);
        for (t, y) in out.iter_mut().enumerate() {
            // SAFETY: the caller's proof of dotprod is passed on.
            let acc = unsafe { super::arm::block_dot::<SDOT>(w, &xs.qs[b * n + t]) };
            *y += d * xs.d[b][t] * acc as f32;
        }
    }
}

/// [`token_dots_arm`] for two rows (`d.0`, `qs.0` and `d.1`, `qs.1`), one after the other.
///
/// # Safety
/// `SDOT` only where the CPU has FEAT_DotProd.
#[cfg(target_arch = "aarch64")]
#[inline(always)]
unsafe fn pair_token_dots_arm<const SDOT: bool>(
    d: (&[f32], &[f32]),
    qs: (&[[i8; QK]], &[[i8; QK]]),
    xs: &TokenBlocks,
    [first, second]: [&mut [f32]; 2],
) {
    // SAFETY: the caller's proof of dotprod is passed on.
    unsafe {
        token_dots_arm::<SDOT>(d.0, qs.0, xs, first);
        token_dots_arm::<SDOT>(d.1, qs.1, xs, second);
    }
}

/// [`token_dots_arm`] for two rows at once: each token pair's four block sums in four `smmla`s
/// ([`super::arm::pair_dots`]' lanes), then lane by lane [`dot_scalar`]'s `sum + d_w·d_x·acc`,
/// so each (row, token) gets the scalar bits; an odd last token against each row by `sdot`.
///
/// # Safety
/// The CPU has FEAT_I8MM and FEAT_DotProd.
#[cfg(target_arch = "aarch64")]
#[inline(always)]
unsafe fn pair_token_dots_i8mm(
    d: (&[f32], &[f32]),
    qs: (&[[i8; QK]], &[[i8; QK]]),
    xs: &TokenBlocks,
    mut out: [&mut [f32]; 2],
) {
    use super::arm::{block_dot, bytes, interleave, pair_dots, row_lanes, store_pairs, token_lanes};
    use std::arch::aarch64::*;
    let (n, nb) = (xs.len(), qs.0.len());
    assert!(n <= super::q8::TOKENS && out.iter().all(|o| o.len() == n));
    assert!(d.0.len() == nb && d.1.len() == nb && qs.1.len() == nb && xs.qs.len() >= nb * n && xs.d.len() >= nb);
    // SAFETY: register-only base NEON.
    let mut pairs = [unsafe { vdupq_n_f32(0.0) }; super::q8::TOKENS / 2];
    let mut last = [0f32; 2];
    for b in 0..nb {
        let w = [bytes(&qs.0[b]), bytes(&qs.1[b])];
        let (wi, dw) = (interleave(w[0], w[1]), row_lanes(d.0[b], d.1[b]));
        for (p, sum) in pairs.iter_mut().enumerate().take(n / 2) {
            let t = b * n + 2 * p;
            // SAFETY: the caller's proof of i8mm; base NEON.
            unsafe {
                let acc = pair_dots(&wi, &interleave(bytes(&xs.qs[t]), bytes(&xs.qs[t + 1])));
                let scale = vmulq_f32(dw, token_lanes(&xs.d[b][2 * p..]));
                *sum = vaddq_f32(*sum, vmulq_f32(scale, vcvtq_f32_s32(acc)));
            }
        }
        if n % 2 == 1 {
            let (x, xd) = (&xs.qs[b * n + n - 1], xs.d[b][n - 1]);
            for (y, (w, d)) in last.iter_mut().zip([(w[0], d.0[b]), (w[1], d.1[b])]) {
                // SAFETY: the caller's proof of dotprod.
                let acc = unsafe { block_dot::<true>(w, x) };
                *y += d * xd * acc as f32;
            }
        }
    }
    store_pairs(&mut out, &pairs, last, n);
}

/// One row (`d`, `qs`) against one token's blocks in `ggml_vec_dot_q8_0_q8_0`'s AVX2 order.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn dot_avx2(d: &[f32], qs: &[[i8; QK]], x: &[Q8Block]) -> f32 {
    use std::arch::x86_64::*;
    let x = &x[..qs.len()];
    let mut acc = _mm256_setzero_ps();
    for ((q, &d), xb) in qs.iter().zip(d).zip(x) {
        // SAFETY: 32-byte unaligned loads within the weight's and the token's blocks.
        let (q, a) = unsafe { (_mm256_loadu_si256(q.as_ptr().cast()), _mm256_loadu_si256(xb.qs.as_ptr().cast())) };
        // ggml's mul_sum_i8_pairs_float: |w| · (a with w's sign), as unsigned × signed bytes.
        let pairs = super::q8::pairs_avx2(_mm256_sign_epi8(q, q), _mm256_sign_epi8(a, q));
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d * xb.d), _mm256_cvtepi32_ps(pairs), acc);
    }
    super::matvec::hsum_avx2(acc)
}

/// One row (`d`, `qs`) against a chunk of `N` tokens in [`dot_avx2`]'s order, each weight block
/// loaded and made unsigned once for all of them: lane t of the block's d_w·d_x vector is the
/// scalar multiply token t would take alone, so each token's sum is what it would be alone.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn token_dots_avx2<const N: usize>(d: &[f32], qs: &[[i8; QK]], xs: &TokenBlocks) -> [f32; N] {
    use std::arch::x86_64::*;
    let nb = qs.len();
    assert!(xs.len() == N && N <= 8 && d.len() == nb && xs.qs.len() >= nb * N && xs.d.len() >= nb);
    let mut acc = [_mm256_setzero_ps(); N];
    let lane: [__m256i; N] = std::array::from_fn(|t| _mm256_set1_epi32(t as i32));
    for (b, (q, &d)) in qs.iter().zip(d).enumerate() {
        // SAFETY: a 32-byte load of the weight block, 8 lanes of the tokens' scales.
        let (q, xd) = unsafe { (_mm256_loadu_si256(q.as_ptr().cast()), _mm256_loadu_ps(xs.d[b].as_ptr())) };
        let abs_q = _mm256_sign_epi8(q, q);
        let scales = _mm256_mul_ps(_mm256_set1_ps(d), xd);
        for t in 0..N {
            // SAFETY: a 32-byte unaligned load of token t's block b (asserted above).
            let a = unsafe { _mm256_loadu_si256(xs.qs.get_unchecked(b * N + t).as_ptr().cast()) };
            let pairs = super::q8::pairs_avx2(abs_q, _mm256_sign_epi8(a, q));
            let scale = _mm256_permutevar8x32_ps(scales, lane[t]);
            acc[t] = _mm256_fmadd_ps(scale, _mm256_cvtepi32_ps(pairs), acc[t]);
        }
    }
    std::array::from_fn(|t| super::matvec::hsum_avx2(acc[t]))
}

/// [`token_dots_avx2`] two tokens to a 512-bit vector (as `q4_1`'s `token_dots_avx512`): |w| in
/// both halves, each token's bytes negated where w is negative (AVX-512 has no `vpsignb`; where
/// w is zero |w| zeroes the product either way, so the integer sums are `vpsignb`'s), the half
/// of token t scaled by its d_w·d_x; an odd last token in 8 lanes with VNNI.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn token_dots_avx512<const N: usize>(d: &[f32], qs: &[[i8; QK]], xs: &TokenBlocks) -> [f32; N] {
    use std::arch::x86_64::*;
    let nb = qs.len();
    assert!(xs.len() == N && N <= 2 * PAIRS + 1 && d.len() == nb && xs.qs.len() >= nb * N && xs.d.len() >= nb);
    let mut pairs = [_mm512_setzero_ps(); PAIRS];
    let mut last = _mm256_setzero_ps();
    let halves: [__m512i; PAIRS] = std::array::from_fn(|p| {
        _mm512_inserti64x4(_mm512_set1_epi32(2 * p as i32), _mm256_set1_epi32(2 * p as i32 + 1), 1)
    });
    let odd = _mm512_set1_epi32(N as i32 - 1);
    for (b, (q, &d)) in qs.iter().zip(d).enumerate() {
        // SAFETY: a 32-byte load of the weight block, 16 lanes of the tokens' scales.
        let (q, xd) = unsafe { (_mm256_loadu_si256(q.as_ptr().cast()), _mm512_loadu_ps(xs.d[b].as_ptr())) };
        let abs_q = _mm256_sign_epi8(q, q);
        let (abs_q2, negative) = (_mm512_broadcast_i64x4(abs_q), _mm512_movepi8_mask(_mm512_broadcast_i64x4(q)));
        let scales = _mm512_mul_ps(_mm512_set1_ps(d), xd);
        for p in 0..N / 2 {
            // SAFETY: tokens 2p and 2p+1's block b, 64 contiguous bytes (asserted above).
            let a = unsafe { _mm512_loadu_si512(xs.qs.get_unchecked(b * N + 2 * p).as_ptr().cast()) };
            let signed = _mm512_mask_sub_epi8(a, negative, _mm512_setzero_si512(), a);
            let dot = _mm512_dpbusd_epi32(_mm512_setzero_si512(), abs_q2, signed);
            let scale = _mm512_permutexvar_ps(halves[p], scales);
            pairs[p] = _mm512_fmadd_ps(scale, _mm512_cvtepi32_ps(dot), pairs[p]);
        }
        if !N.is_multiple_of(2) {
            // SAFETY: the last token's block b (asserted above).
            let a = unsafe { _mm256_loadu_si256(xs.qs.get_unchecked(b * N + N - 1).as_ptr().cast()) };
            let pairs = super::q8::pairs_vnni(abs_q, _mm256_sign_epi8(a, q));
            let scale = _mm512_castps512_ps256(_mm512_permutexvar_ps(odd, scales));
            last = _mm256_fmadd_ps(scale, _mm256_cvtepi32_ps(pairs), last);
        }
    }
    std::array::from_fn(|t| super::matvec::hsum_avx2(super::q8::half_of(&pairs, last, N, t)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernel::q8::quantize_q8_1;
    use candle_core::quantized::{GgmlDType, QMatMul, QTensor};
    use candle_core::{Device, Module};

    #[test]
    fn each_token_of_a_multi_token_call_equals_that_token_alone_bit_for_bit() {
        // 11 tokens: a whole chunk of TOKENS and a shorter last one; 7 rows: a whole group of
        // rows and a shorter last one in the one-token path.
        let (rows, cols, tokens) = (7, 256, 11);
        let w = Tensor::randn(0f32, 1.0, (rows, cols), &Device::Cpu).unwrap();
        let x = Tensor::randn(0f32, 1.0, (tokens, cols), &Device::Cpu).unwrap();
        let q = QTensor::quantize(&w, GgmlDType::Q8_0).unwrap();
        let m = Q8_0Matrix::from_ggml(&q.data().unwrap(), rows, cols);
        let all = m.forward(&x).unwrap().to_vec2::<f32>().unwrap();
        for n in 2..=crate::kernel::q8::TOKENS {
            let some = m.forward(&x.narrow(0, 0, n).unwrap()).unwrap().to_vec2::<f32>().unwrap();
            assert_eq!(some[..], all[..n], "the first {n} tokens");
        }
        for (t, row) in all.iter().enumerate() {
            let alone = m.forward(&x.narrow(0, t, 1).unwrap()).unwrap().to_vec2::<f32>().unwrap();
            assert_eq!(row, &alone[0], "token {t}");
        }
    }

    /// Every chunk kernel this CPU runs, each chunk size, against the one-token kernel.
    #[test]
    fn each_chunk_kernel_gives_each_token_its_lone_sum_bit_for_bit() {
        use crate::kernel::q8::{TOKENS, each_chunk_equals_each_token_alone};
        let (rows, cols) = (3, 320);
        let w = Tensor::randn(0f32, 1.0, (rows, cols), &Device::Cpu).unwrap();
        let q = QTensor::quantize(&w, GgmlDType::Q8_0).unwrap();
        let m = Q8_0Matrix::from_ggml(&q.data().unwrap(), rows, cols);
        let x = Tensor::randn(0f32, 1.0, (TOKENS, cols), &Device::Cpu).unwrap().to_vec2::<f32>().unwrap();
        let q8: Vec<Vec<Q8Block>> = x.iter().map(|x| quantize_q8_1(x)).collect();
        each_chunk_equals_each_token_alone(&q8, rows, |r, x| m.dots::<1>(r, x)[0], |r, xs, o| m.token_dots(r, xs, o));
    }

    /// Each aarch64 path (NEON, dotprod, i8mm), one token, one row's chunks and the whole
    /// multi-token product (i8mm's row pairs), against the scalar reference.
    #[cfg(target_arch = "aarch64")]
    #[test]
    fn every_arm_path_gives_the_scalar_references_bits() {
        use crate::kernel::q8::{
            arm_cases, chunks_matmul, each_arm_matmul_gives_the_scalar_bits, each_arm_path_gives_the_scalar_bits,
        };
        for (rows, blocks, bytes, q8) in arm_cases(GgmlDType::Q8_0) {
            let m = Q8_0Matrix::from_ggml(&bytes, rows, blocks * QK);
            let row = |r: usize| (&m.d[r * blocks..(r + 1) * blocks], &m.qs[r * blocks..(r + 1) * blocks]);
            each_arm_path_gives_the_scalar_bits(
                &q8,
                rows,
                |r, x| dot_scalar(row(r).0, row(r).1, x),
                |k, r, x| crate::kernel::arm::dispatch!(k, dot_arm(row(r).0, row(r).1, x)),
                |r, xs, out| m.token_dots(r, xs, out),
            );
            each_arm_matmul_gives_the_scalar_bits(
                &q8,
                rows,
                |r, x| dot_scalar(row(r).0, row(r).1, x),
                |k| {
                    let (cols, kernel) = (blocks * QK, ChunkKernel::Arm(k));
                    let pair = |r, xs: &TokenBlocks, o: [&mut [f32]; 2]| m.pair_token_dots(r, xs, o);
                    chunks_matmul(rows, cols, &q8, kernel, |r, xs, o| m.token_dots(r, xs, o), pair).unwrap()
                },
            );
        }
    }

    #[test]
    fn q8_0_matmul_equals_the_scalar_path_and_candles_kernel_up_to_activation_rounding() {
        let (rows, cols, tokens) = (40, 128, 2);
        let w = Tensor::randn(0f32, 1.0, (rows, cols), &Device::Cpu).unwrap();
        let x = Tensor::randn(0f32, 1.0, (tokens, cols), &Device::Cpu).unwrap();
        let q = QTensor::quantize(&w, GgmlDType::Q8_0).unwrap();
        let ours = Q8_0Matrix::from_ggml(&q.data().unwrap(), rows, cols);
        let got = ours.forward(&x).unwrap().to_vec2::<f32>().unwrap();
        let want = QMatMul::QTensor(std::sync::Arc::new(q)).forward(&x).unwrap().to_vec2::<f32>().unwrap();
        let q8: Vec<Vec<Q8Block>> = x.to_vec2::<f32>().unwrap().iter().map(|r| quantize_q8_1(r)).collect();
        let nb = cols / QK;
        for t in 0..tokens {
            for r in 0..rows {
                let range = r * nb..(r + 1) * nb;
                let scalar = dot_scalar(&ours.d[range.clone()], &ours.qs[range], &q8[t]);
                assert!((got[t][r] - scalar).abs() < 1e-4, "token {t} row {r}: {} vs scalar {scalar}", got[t][r]);
                assert!(
                    (got[t][r] - want[t][r]).abs() < 5e-2,
                    "token {t} row {r}: {} vs candle {}",
                    got[t][r],
                    want[t][r]
                );
            }
        }
    }
}
