//! A Q4_1 mat-vec with AVX2 (candle 0.11's Q4_1 dot product is scalar only, and it was 72% of
//! SmolLM2's decode time). The arithmetic is ggml's `ggml_vec_dot_q4_1_q8_1`: activations are
//! quantized per 32-block to Q8_1 (`quantize_row_q8_1`), the integer dot product is scaled by
//! d_w·d_x, and the weights' offset m_w multiplies the activations' block sum s_x.

use candle_core::Tensor;
use half::f16;

#[cfg(target_arch = "x86_64")]
use super::q8::{AVX2_TOKENS, LANES, PAIRS, by_tokens, half_of, pairs_avx2, pairs_vnni};
use super::q8::{ChunkKernel, Q8Block, QK, TokenBlocks, q8_matmul};

use crate::error::Result;

/// ggml `block_q4_1`: f16 d, f16 m, 16 bytes holding element j in the low nibble and j+16 in the high.
const BLOCK_BYTES: usize = 20;

/// Q4_1 weights `[rows, cols]` in their file blocks: decode is bound by reading them, and 20
/// bytes a block read faster than the 24 of scales widened to f32 at load.
pub struct Q4_1Matrix {
    rows: usize,
    cols: usize,
    blocks: Vec<[u8; BLOCK_BYTES]>,
}

/// A block's scale d and offset m.
fn scales(b: &[u8; BLOCK_BYTES]) -> (f32, f32) {
    (f16::from_le_bytes([b[0], b[1]]).to_f32(), f16::from_le_bytes([b[2], b[3]]).to_f32())
}

impl Q4_1Matrix {
    pub fn from_ggml(bytes: &[u8], rows: usize, cols: usize) -> Self {
        let n = rows * cols / QK;
        let blocks = bytes.chunks_exact(BLOCK_BYTES).take(n).map(|b| b.try_into().expect("20 bytes")).collect();
        Q4_1Matrix { rows, cols, blocks }
    }

    pub(crate) fn cols(&self) -> usize {
        self.cols
    }

    /// Row `r`'s blocks as the file holds them.
    pub(crate) fn row_bytes(&self, r: usize) -> &[u8] {
        let nb = self.cols / QK;
        self.blocks[r * nb..(r + 1) * nb].as_flattened()
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
            let rows = self.blocks[r * nb..(r + 2) * nb].split_at(nb);
            return super::arm::dispatch!(
                kernel,
                pair_token_dots_arm(rows, xs, out),
                i8mm: pair_token_dots_i8mm(rows, xs, out)
            );
        }
        let [first, second] = out;
        self.token_dots(r, xs, first);
        self.token_dots(r + 1, xs, second);
    }

    /// Row `r` against a chunk of up to [`TOKENS`] tokens, into `out` (one per token).
    fn token_dots(&self, r: usize, xs: &TokenBlocks, out: &mut [f32]) {
        let nb = self.cols / QK;
        let row = &self.blocks[r * nb..(r + 1) * nb];
        #[cfg(target_arch = "x86_64")]
        match xs.kernel {
            // SAFETY: AVX2, FMA, F16C and AVX-512 F, BW, VL and VNNI were detected at run time.
            ChunkKernel::Avx512 => return unsafe { by_tokens!(xs, out, token_dots_avx512(row)) },
            // SAFETY: AVX2, FMA and F16C were detected at run time.
            ChunkKernel::Avx2 => return unsafe { by_tokens!(xs, out, token_dots_avx2(row)) },
            ChunkKernel::Scalar => {}
        }
        #[cfg(target_arch = "aarch64")]
        if let ChunkKernel::Arm(kernel) = xs.kernel {
            return super::arm::dispatch!(kernel, token_dots_arm(row, xs, out));
        }
        out.iter_mut().zip(&xs.tokens).for_each(|(y, x)| *y = dot_scalar(row, x));
    }

    /// Rows `r0..r0 + N` against one token's blocks.
    fn dots<const N: usize>(&self, r0: usize, x: &[Q8Block]) -> [f32; N] {
        #[cfg(target_arch = "x86_64")]
        if super::matvec::has_avx2_f16c() {
            // SAFETY: AVX2, FMA and F16C were detected at run time.
            return unsafe { dots_avx2::<N>(self, r0, x) };
        }
        let nb = self.cols / QK;
        let row = |i: usize| &self.blocks[(r0 + i) * nb..(r0 + i + 1) * nb];
        #[cfg(target_arch = "aarch64")]
        {
            let kernel = super::arm::ArmKernel::detect();
            std::array::from_fn(|i| super::arm::dispatch!(kernel, dot_arm(row(i), x)))
        }
        #[cfg(not(target_arch = "aarch64"))]
        std::array::from_fn(|i| dot_scalar(row(i), x))
    }
}

/// Rows computed together by the AVX2 kernel: four independent accumulator chains hide the
/// fused multiply-add latency that one row's chain waits on.
const ROWS: usize = 4;

fn dot_scalar(blocks: &[[u8; BLOCK_BYTES]], x: &[Q8Block]) -> f32 {
    let mut sum = 0f32;
    for (w, x) in blocks.iter().zip(x) {
        let (d, m) = scales(w);
        let (lo, hi) = x.qs.split_at(16);
        let mut acc = 0i32;
        for ((w, l), h) in w[4..].iter().zip(lo).zip(hi) {
            acc += (w & 0x0F) as i32 * *l as i32 + (w >> 4) as i32 * *h as i32;
        }
        sum += d * x.d * acc as f32 + m * x.s;
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
unsafe fn dot_arm<const SDOT: bool>(blocks: &[[u8; BLOCK_BYTES]], x: &[Q8Block]) -> f32 {
    let mut sum = 0f32;
    for (w, x) in blocks.iter().zip(x) {
        let (d, m) = scales(w);
        // SAFETY: a block's 16 packed bytes; the caller's proof of dotprod is passed on.
        let acc = unsafe { super::arm::block_dot::<SDOT>(super::arm::nibbles(&w[4..], 0), &x.qs) };
        sum += d * x.d * acc as f32 + m * x.s;
    }
    sum
}

/// [`dot_arm`] for each token of a chunk, each block unpacked once for all of them.
///
/// # Safety
/// `SDOT` only where the CPU has FEAT_DotProd.
#[cfg(target_arch = "aarch64")]
#[inline(always)]
unsafe fn token_dots_arm<const SDOT: bool>(row: &[[u8; BLOCK_BYTES]], xs: &TokenBlocks, out: &mut [f32]) {
    let n = xs.len();
    assert!(out.len() == n && xs.qs.len() >= row.len() * n && xs.d.len() >= row.len() && xs.s.len() >= row.len());
    out.fill(0.0);
    for (b, w) in row.iter().enumerate() {
        let (d, m) = scales(w);
        // SAFETY: a block's 16 packed bytes.
        let wq = unsafe { super::arm::nibbles(&w[4..], 0) };
        for (t, y) in out.iter_mut().enumerate() {
            // SAFETY: the caller's proof of dotprod is passed on.
            let acc = unsafe { super::arm::block_dot::<SDOT>(wq, &xs.qs[b * n + t]) };
            *y += d * xs.d[b][t] * acc as f32 + m * xs.s[b][t];
        }
    }
}

/// [`token_dots_arm`] for two rows, one after the other.
///
/// # Safety
/// `SDOT` only where the CPU has FEAT_DotProd.
#[cfg(target_arch = "aarch64")]
#[inline(always)]
unsafe fn pair_token_dots_arm<const SDOT: bool>(
    rows: (&[[u8; BLOCK_BYTES]], &[[u8; BLOCK_BYTES]]),
    xs: &TokenBlocks,
    [first, second]: [&mut [f32]; 2],
) {
    // SAFETY: the caller's proof of dotprod is passed on.
    unsafe {
        token_dots_arm::<SDOT>(rows.0, xs, first);
        token_dots_arm::<SDOT>(rows.1, xs, second);
    }
}

/// [`token_dots_arm`] for two rows at once: each block of both rows unpacked once, each token
/// pair's four block sums in four `smmla`s ([`super::arm::pair_dots`]' lanes), then lane by lane
/// [`dot_scalar`]'s `sum + (d_w·d_x·acc + m_w·s_x)`, so each (row, token) gets the scalar bits;
/// an odd last token against each row by `sdot`.
///
/// # Safety
/// The CPU has FEAT_I8MM and FEAT_DotProd.
#[cfg(target_arch = "aarch64")]
#[inline(always)]
unsafe fn pair_token_dots_i8mm(
    rows: (&[[u8; BLOCK_BYTES]], &[[u8; BLOCK_BYTES]]),
    xs: &TokenBlocks,
    mut out: [&mut [f32]; 2],
) {
    use super::arm::{block_dot, bytes, interleave, nibbles, pair_dots, row_lanes, store_pairs, token_lanes};
    use std::arch::aarch64::*;
    let (n, nb) = (xs.len(), rows.0.len());
    assert!(n <= super::q8::TOKENS && out.iter().all(|o| o.len() == n));
    assert!(rows.1.len() == nb && xs.qs.len() >= nb * n && xs.d.len() >= nb && xs.s.len() >= nb);
    // SAFETY: register-only base NEON.
    let mut pairs = [unsafe { vdupq_n_f32(0.0) }; super::q8::TOKENS / 2];
    let mut last = [0f32; 2];
    for (b, blocks) in rows.0.iter().zip(rows.1).enumerate() {
        let ((d0, m0), (d1, m1)) = (scales(blocks.0), scales(blocks.1));
        // SAFETY: each block's 16 packed bytes.
        let w = unsafe { [nibbles(&blocks.0[4..], 0), nibbles(&blocks.1[4..], 0)] };
        let (wi, dw, mw) = (interleave(w[0], w[1]), row_lanes(d0, d1), row_lanes(m0, m1));
        for (p, sum) in pairs.iter_mut().enumerate().take(n / 2) {
            let t = b * n + 2 * p;
            // SAFETY: the caller's proof of i8mm; base NEON.
            unsafe {
                let acc = pair_dots(&wi, &interleave(bytes(&xs.qs[t]), bytes(&xs.qs[t + 1])));
                let scale = vmulq_f32(dw, token_lanes(&xs.d[b][2 * p..]));
                let offset = vmulq_f32(mw, token_lanes(&xs.s[b][2 * p..]));
                *sum = vaddq_f32(*sum, vaddq_f32(vmulq_f32(scale, vcvtq_f32_s32(acc)), offset));
            }
        }
        if n % 2 == 1 {
            let (x, xd, xsum) = (&xs.qs[b * n + n - 1], xs.d[b][n - 1], xs.s[b][n - 1]);
            for (y, (w, d, m)) in last.iter_mut().zip([(w[0], d0, m0), (w[1], d1, m1)]) {
                // SAFETY: the caller's proof of dotprod.
                let acc = unsafe { block_dot::<true>(w, x) };
                *y += d * xd * acc as f32 + m * xsum;
            }
        }
    }
    store_pairs(&mut out, &pairs, last, n);
}

/// Rows `r0..r0 + N` against one token's blocks, each row in `ggml_vec_dot_q4_1_q8_1`'s AVX2
/// order: per block acc = fma(d_w·d_x, Σ q_w·q_x, acc) in 8 lanes, the m_w·s_x terms summed
/// beside it, then `hsum_float_8(acc) + summs`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dots_avx2<const N: usize>(w: &Q4_1Matrix, r0: usize, x: &[Q8Block]) -> [f32; N] {
    use std::arch::x86_64::*;
    let nb = w.cols / QK;
    assert!((r0 + N) * nb <= w.blocks.len() && x.len() >= nb, "rows {r0}..{} of {}", r0 + N, w.rows);
    let row = |i: usize| &w.blocks[(r0 + i) * nb..(r0 + i + 1) * nb];
    let x = &x[..nb];
    let zero = (_mm256_setzero_ps(), 0f32);
    if N == ROWS {
        // Four named accumulators, and pointers instead of indexing (whose checks, in the dev
        // profile's debug-assertion build, kept the loop from holding them in registers).
        let (w0, xp) = (w.blocks[r0 * nb..].as_ptr(), x.as_ptr());
        let (mut a0, mut a1, mut a2, mut a3) = (zero, zero, zero, zero);
        for b in 0..nb {
            // SAFETY: block b of rows r0..r0+4 and of x are in bounds (asserted above).
            unsafe {
                let xb = &*xp.add(b);
                let xq = _mm256_loadu_si256(xb.qs.as_ptr().cast());
                a0 = block_step(&*w0.add(b), xq, xb, a0);
                a1 = block_step(&*w0.add(nb + b), xq, xb, a1);
                a2 = block_step(&*w0.add(2 * nb + b), xq, xb, a2);
                a3 = block_step(&*w0.add(3 * nb + b), xq, xb, a3);
            }
        }
        let sums = [a0, a1, a2, a3].map(|(acc, offsets)| super::matvec::hsum_avx2(acc) + offsets);
        return std::array::from_fn(|i| sums[i]);
    }
    std::array::from_fn(|i| {
        let (w, mut a) = (row(i), zero);
        for b in 0..nb {
            // SAFETY: as above.
            let xq = unsafe { _mm256_loadu_si256(x[b].qs.as_ptr().cast()) };
            a = block_step(&w[b], xq, &x[b], a);
        }
        super::matvec::hsum_avx2(a.0) + a.1
    })
}

/// One block of one row: acc = fma(d_w·d_x, Σ q_w·q_x, acc) in 8 lanes, offsets += m_w·s_x.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn block_step(
    block: &[u8; BLOCK_BYTES],
    xq: std::arch::x86_64::__m256i,
    xb: &Q8Block,
    acc: (std::arch::x86_64::__m256, f32),
) -> (std::arch::x86_64::__m256, f32) {
    token_step(unpack(block), xq, xb, acc)
}

/// A block's scale d, offset m and 32 weights as unsigned bytes (elements 0..15, then 16..31).
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn unpack(block: &[u8; BLOCK_BYTES]) -> (f32, f32, std::arch::x86_64::__m256i) {
    use std::arch::x86_64::*;
    // SAFETY: 4- and 16-byte unaligned loads within the block.
    let (dm, packed) =
        unsafe { (_mm_cvtph_ps(_mm_loadu_si32(block.as_ptr().cast())), _mm_loadu_si128(block.as_ptr().add(4).cast())) };
    let low = _mm_set1_epi8(0x0F);
    let lo = _mm_and_si128(packed, low);
    let hi = _mm_and_si128(_mm_srli_epi16(packed, 4), low);
    (_mm_cvtss_f32(dm), _mm_cvtss_f32(_mm_movehdup_ps(dm)), _mm256_set_m128i(hi, lo))
}

/// An unpacked block against one token's block.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn token_step(
    (d, m, wq): (f32, f32, std::arch::x86_64::__m256i),
    xq: std::arch::x86_64::__m256i,
    xb: &Q8Block,
    (acc, offsets): (std::arch::x86_64::__m256, f32),
) -> (std::arch::x86_64::__m256, f32) {
    use std::arch::x86_64::*;
    let pairs = pairs_avx2(wq, xq);
    // ggml's `summs += m * s`, which GCC contracts to one fused multiply-add.
    (_mm256_fmadd_ps(_mm256_set1_ps(d * xb.d), _mm256_cvtepi32_ps(pairs), acc), m.mul_add(xb.s, offsets))
}

/// One row against a chunk of `N` tokens, each block unpacked once; each token's sum in exactly
/// the order [`dots_avx2`] gives a lone token: lane t of the block's d_w·d_x vector and of the
/// m_w·s_x accumulator is the scalar multiply and fused multiply-add token t would take alone.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn token_dots_avx2<const N: usize>(row: &[[u8; BLOCK_BYTES]], xs: &TokenBlocks) -> [f32; N] {
    use std::arch::x86_64::*;
    let nb = row.len();
    assert!(xs.len() == N && N <= AVX2_TOKENS && xs.qs.len() >= nb * N && xs.d.len() >= nb && xs.s.len() >= nb);
    let mut acc = [_mm256_setzero_ps(); N];
    let mut offsets = _mm256_setzero_ps();
    let lane: [__m256i; N] = std::array::from_fn(|t| _mm256_set1_epi32(t as i32));
    for (b, block) in row.iter().enumerate() {
        let (d, m, wq) = unpack(block);
        // SAFETY: 8-lane loads of block b's scales and sums (asserted above).
        let (xd, xsum) = unsafe { (_mm256_loadu_ps(xs.d[b].as_ptr()), _mm256_loadu_ps(xs.s[b].as_ptr())) };
        let scales = _mm256_mul_ps(_mm256_set1_ps(d), xd);
        offsets = _mm256_fmadd_ps(_mm256_set1_ps(m), xsum, offsets);
        for t in 0..N {
            // SAFETY: a 32-byte unaligned load of token t's block b (asserted above).
            let xq = unsafe { _mm256_loadu_si256(xs.qs.get_unchecked(b * N + t).as_ptr().cast()) };
            let scale = _mm256_permutevar8x32_ps(scales, lane[t]);
            acc[t] = _mm256_fmadd_ps(scale, _mm256_cvtepi32_ps(pairs_avx2(wq, xq)), acc[t]);
        }
    }
    let mut offs = [0f32; AVX2_TOKENS];
    // SAFETY: an 8-lane store into 8 floats.
    unsafe { _mm256_storeu_ps(offs.as_mut_ptr(), offsets) };
    std::array::from_fn(|t| super::matvec::hsum_avx2(acc[t]) + offs[t])
}

/// [`token_dots_avx2`] two tokens to a 512-bit vector: the weight block's bytes in both halves,
/// tokens 2p and 2p+1's bytes side by side (as [`TokenBlocks`] lays them), each half scaled by
/// its token's d_w·d_x, and VNNI's `vpdpbusd` for ggml's `maddubs` + `madd` (the same 8 lanes
/// of 4-product integer sums, which cannot overflow). Each half takes the operations a lone
/// token's 8 lanes do and is summed as they are, so each token's sum is unchanged; an odd last
/// token runs in 8 lanes. Against the same kernel in 8 lanes with VNNI (chunks of 8), 60 verify
/// passes of 9 rows on SmolLM2 took 2.74 s of CPU instead of 3.09 (a Xeon with AVX-512, one
/// thread, `model bench --verify 9`, same run).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512vnni")]
unsafe fn token_dots_avx512<const N: usize>(row: &[[u8; BLOCK_BYTES]], xs: &TokenBlocks) -> [f32; N] {
    use std::arch::x86_64::*;
    let nb = row.len();
    assert!(xs.len() == N && N <= 2 * PAIRS && xs.qs.len() >= nb * N && xs.d.len() >= nb && xs.s.len() >= nb);
    let mut pairs = [_mm512_setzero_ps(); PAIRS];
    let mut last = _mm256_setzero_ps();
    let mut offsets = _mm512_setzero_ps();
    let halves: [__m512i; PAIRS] = std::array::from_fn(|p| {
        _mm512_inserti64x4(_mm512_set1_epi32(2 * p as i32), _mm256_set1_epi32(2 * p as i32 + 1), 1)
    });
    let odd = _mm512_set1_epi32(N as i32 - 1);
    for (b, block) in row.iter().enumerate() {
        let (d, m, wq) = unpack(block);
        let wq2 = _mm512_broadcast_i64x4(wq);
        // SAFETY: 16-lane loads of block b's scales and sums (asserted above).
        let (xd, xsum) = unsafe { (_mm512_loadu_ps(xs.d[b].as_ptr()), _mm512_loadu_ps(xs.s[b].as_ptr())) };
        let scales = _mm512_mul_ps(_mm512_set1_ps(d), xd);
        offsets = _mm512_fmadd_ps(_mm512_set1_ps(m), xsum, offsets);
        for p in 0..N / 2 {
            // SAFETY: tokens 2p and 2p+1's block b, 64 contiguous bytes (asserted above).
            let xq = unsafe { _mm512_loadu_si512(xs.qs.get_unchecked(b * N + 2 * p).as_ptr().cast()) };
            let dot = _mm512_dpbusd_epi32(_mm512_setzero_si512(), wq2, xq);
            let scale = _mm512_permutexvar_ps(halves[p], scales);
            pairs[p] = _mm512_fmadd_ps(scale, _mm512_cvtepi32_ps(dot), pairs[p]);
        }
        if !N.is_multiple_of(2) {
            // SAFETY: the last token's block b (asserted above).
            let xq = unsafe { _mm256_loadu_si256(xs.qs.get_unchecked(b * N + N - 1).as_ptr().cast()) };
            let scale = _mm512_castps512_ps256(_mm512_permutexvar_ps(odd, scales));
            last = _mm256_fmadd_ps(scale, _mm256_cvtepi32_ps(pairs_vnni(wq, xq)), last);
        }
    }
    let mut offs = [0f32; LANES];
    // SAFETY: a 16-lane store into 16 floats.
    unsafe { _mm512_storeu_ps(offs.as_mut_ptr(), offsets) };
    std::array::from_fn(|t| super::matvec::hsum_avx2(half_of(&pairs, last, N, t)) + offs[t])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernel::q8::tests::random;
    use crate::kernel::q8::{TOKENS, each_chunk_equals_each_token_alone, quantize_q8_1};
    use candle_core::quantized::{GgmlDType, QMatMul, QTensor};
    use candle_core::{Device, Module, Tensor};

    #[test]
    fn each_token_of_a_multi_token_call_equals_that_token_alone_bit_for_bit() {
        // 11 tokens: whole groups of TOKENS and a shorter last one; 7 rows: a group of ROWS
        // and a shorter last one in the one-token path.
        let (rows, cols, tokens) = (7, 256, 11);
        let w = Tensor::from_vec(random(rows * cols, 3), (rows, cols), &Device::Cpu).unwrap();
        let x = Tensor::from_vec(random(tokens * cols, 4), (tokens, cols), &Device::Cpu).unwrap();
        let q = QTensor::quantize(&w, GgmlDType::Q4_1).unwrap();
        let m = Q4_1Matrix::from_ggml(&q.data().unwrap(), rows, cols);
        let all = m.forward(&x).unwrap().to_vec2::<f32>().unwrap();
        for n in 2..=TOKENS {
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
        let (rows, cols) = (3, 320);
        let w = Tensor::from_vec(random(rows * cols, 5), (rows, cols), &Device::Cpu).unwrap();
        let q = QTensor::quantize(&w, GgmlDType::Q4_1).unwrap();
        let m = Q4_1Matrix::from_ggml(&q.data().unwrap(), rows, cols);
        let q8: Vec<Vec<Q8Block>> = (0..TOKENS as u64).map(|t| quantize_q8_1(&random(cols, 50 + t))).collect();
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
        for (rows, blocks, bytes, q8) in arm_cases(GgmlDType::Q4_1) {
            let m = Q4_1Matrix::from_ggml(&bytes, rows, blocks * QK);
            let row = |r: usize| &m.blocks[r * blocks..(r + 1) * blocks];
            each_arm_path_gives_the_scalar_bits(
                &q8,
                rows,
                |r, x| dot_scalar(row(r), x),
                |k, r, x| crate::kernel::arm::dispatch!(k, dot_arm(row(r), x)),
                |r, xs, out| m.token_dots(r, xs, out),
            );
            each_arm_matmul_gives_the_scalar_bits(
                &q8,
                rows,
                |r, x| dot_scalar(row(r), x),
                |k| {
                    let (cols, kernel) = (blocks * QK, ChunkKernel::Arm(k));
                    let pair = |r, xs: &TokenBlocks, o: [&mut [f32]; 2]| m.pair_token_dots(r, xs, o);
                    chunks_matmul(rows, cols, &q8, kernel, |r, xs, o| m.token_dots(r, xs, o), pair).unwrap()
                },
            );
        }
    }

    #[test]
    fn q4_1_matmul_equals_the_scalar_path_and_candles_kernel_up_to_activation_rounding() {
        let (rows, cols, tokens) = (48, 256, 3);
        let w = Tensor::from_vec(random(rows * cols, 1), (rows, cols), &Device::Cpu).unwrap();
        let x = Tensor::from_vec(random(tokens * cols, 2), (tokens, cols), &Device::Cpu).unwrap();
        let q = QTensor::quantize(&w, GgmlDType::Q4_1).unwrap();
        let ours = Q4_1Matrix::from_ggml(&q.data().unwrap(), rows, cols);
        let got = ours.forward(&x).unwrap().to_vec2::<f32>().unwrap();
        let want = QMatMul::QTensor(std::sync::Arc::new(q)).forward(&x).unwrap().to_vec2::<f32>().unwrap();
        let q8: Vec<Vec<Q8Block>> = x.to_vec2::<f32>().unwrap().iter().map(|r| quantize_q8_1(r)).collect();
        for t in 0..tokens {
            for r in 0..rows {
                let nb = cols / QK;
                let range = r * nb..(r + 1) * nb;
                let scalar = dot_scalar(&ours.blocks[range], &q8[t]);
                // candle quantizes activations with ggml's C reference (1/d, half away from zero),
                // we with ggml's x86 code (127/max, half to even): results differ by that rounding.
                assert!(
                    (got[t][r] - want[t][r]).abs() < 1e-2,
                    "token {t} row {r}: {} vs candle {}",
                    got[t][r],
                    want[t][r]
                );
                assert!((got[t][r] - scalar).abs() < 1e-4, "token {t} row {r}: {} vs scalar {scalar}", got[t][r]);
            }
        }
    }
}
