//! A Q4_1 mat-vec with AVX2 (candle 0.11's Q4_1 dot product is scalar only, and it was 72% of
//! SmolLM2's decode time). The arithmetic is ggml's `ggml_vec_dot_q4_1_q8_1`: activations are
//! quantized per 32-block to Q8_1 (`quantize_row_q8_1`), the integer dot product is scaled by
//! d_w·d_x, and the weights' offset m_w multiplies the activations' block sum s_x.

use candle_core::Tensor;
use half::f16;

use super::matvec::{activations, fill_group, row_groups_by_tokens, rows_by_tokens};

use crate::error::Result;

const QK: usize = 32;
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

/// One 32-block of activations in ggml `block_q8_1`, scales widened to f32.
pub(super) struct Q8Block {
    pub(super) d: f32,
    s: f32,
    pub(super) qs: [i8; QK],
}

impl Q4_1Matrix {
    pub fn from_ggml(bytes: &[u8], rows: usize, cols: usize) -> Self {
        let n = rows * cols / QK;
        let blocks = bytes.chunks_exact(BLOCK_BYTES).take(n).map(|b| b.try_into().expect("20 bytes")).collect();
        Q4_1Matrix { rows, cols, blocks }
    }

    pub(super) fn cols(&self) -> usize {
        self.cols
    }

    /// Row `r`'s blocks as the file holds them.
    pub(super) fn row_bytes(&self, r: usize) -> &[u8] {
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
        )
    }

    /// Row `r` against up to [`TOKENS`] tokens' blocks, into `out` (one per token).
    fn token_dots(&self, r: usize, xs: &[&[Q8Block]], out: &mut [f32]) {
        let nb = self.cols / QK;
        let row = &self.blocks[r * nb..(r + 1) * nb];
        #[cfg(target_arch = "x86_64")]
        if super::matvec::has_avx2_f16c() {
            // SAFETY: AVX2, FMA and F16C were detected at run time.
            return unsafe { by_tokens!(xs, out, token_dots_avx2(row)) };
        }
        out.iter_mut().zip(xs).for_each(|(y, x)| *y = dot_scalar(row, x));
    }

    /// Rows `r0..r0 + N` against one token's blocks.
    fn dots<const N: usize>(&self, r0: usize, x: &[Q8Block]) -> [f32; N] {
        #[cfg(target_arch = "x86_64")]
        if super::matvec::has_avx2_f16c() {
            // SAFETY: AVX2, FMA and F16C were detected at run time.
            return unsafe { dots_avx2::<N>(self, r0, x) };
        }
        let nb = self.cols / QK;
        std::array::from_fn(|i| dot_scalar(&self.blocks[(r0 + i) * nb..(r0 + i + 1) * nb], x))
    }
}

/// Rows computed together by the AVX2 kernel: four independent accumulator chains hide the
/// fused multiply-add latency that one row's chain waits on.
const ROWS: usize = 4;

pub(super) fn has_avx2() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Tokens whose dot products with a row share one decoding of each weight block (one
/// accumulator each: the tokens are the independent chains).
pub(super) const TOKENS: usize = 4;

/// `out.copy_from_slice(&kernel::<N>(args.., [xs[0], .., xs[N - 1]]))` for the N = `xs.len()`
/// (1 to [`TOKENS`]) of a chunk of tokens: a kernel that keeps one accumulator per token.
macro_rules! by_tokens {
    ($xs:ident, $out:ident, $kernel:ident($($arg:expr),*)) => {
        match $xs.len() {
            1 => $out.copy_from_slice(&$kernel::<1>($($arg,)* [$xs[0]])),
            2 => $out.copy_from_slice(&$kernel::<2>($($arg,)* [$xs[0], $xs[1]])),
            3 => $out.copy_from_slice(&$kernel::<3>($($arg,)* [$xs[0], $xs[1], $xs[2]])),
            _ => $out.copy_from_slice(&$kernel::<4>($($arg,)* [$xs[0], $xs[1], $xs[2], $xs[3]])),
        }
    };
}
pub(super) use by_tokens;

/// `x`: `[tokens, cols]` → `[tokens, rows]` for a matrix whose kernels take activations as Q8
/// blocks. One token: `dots(r, x)` computes rows `r..r + N` (a whole group), `one(r, x)` row r
/// alone. Several (a verify pass's or a batch's rows): `row_tokens(r, xs, out)` row r against
/// up to [`TOKENS`] tokens, each weight block decoded once for all of them. Each (row, token)
/// sum is computed in the same order either way, so a token's result does not depend on the
/// tokens beside it.
pub(super) fn q8_matmul<const N: usize>(
    rows: usize,
    cols: usize,
    x: &Tensor,
    dots: impl Fn(usize, &[Q8Block]) -> [f32; N] + Sync,
    one: impl Fn(usize, &[Q8Block]) -> f32 + Sync,
    row_tokens: impl Fn(usize, &[&[Q8Block]], &mut [f32]) + Sync,
) -> Result<Tensor> {
    let tokens = x.dim(0)?;
    let q8: Vec<Vec<Q8Block>> = activations(x)?.chunks_exact(cols).map(quantize_q8_1).collect();
    if tokens == 1 {
        return row_groups_by_tokens(rows, tokens, rows * cols, N, |r0, out| {
            fill_group(out, tokens, |t| dots(r0, &q8[t]), |i, t| one(r0 + i, &q8[t]))
        });
    }
    let xs: Vec<&[Q8Block]> = q8.iter().map(|x| &x[..]).collect();
    rows_by_tokens(rows, tokens, rows * cols * tokens, |r, out| {
        for (xs, out) in xs.chunks(TOKENS).zip(out.chunks_mut(TOKENS)) {
            row_tokens(r, xs, out);
        }
    })
}

/// ggml's x86 `quantize_row_q8_1` (the SIMD path llama.cpp runs on AVX2 machines, which differs
/// from the C reference in rounding): id = 127 / max|x|, round half to even, s = f16(d · Σq).
pub(super) fn quantize_q8_1(x: &[f32]) -> Vec<Q8Block> {
    #[cfg(target_arch = "x86_64")]
    if has_avx2() {
        // SAFETY: AVX2 (and with it SSE4.1's rounding) was detected at run time.
        return unsafe { quantize_avx2(x) };
    }
    quantize_blocks(x)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn quantize_avx2(x: &[f32]) -> Vec<Q8Block> {
    quantize_blocks(x)
}

// A plain loop: inside the AVX2 function `round_ties_even` is one instruction, not a libm call.
#[inline(always)]
fn quantize_blocks(x: &[f32]) -> Vec<Q8Block> {
    let mut out = Vec::with_capacity(x.len() / QK);
    for x in x.chunks_exact(QK) {
        let mut amax = 0f32;
        for v in x {
            amax = amax.max(v.abs());
        }
        let d = amax / 127.0;
        let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
        let mut qs = [0i8; QK];
        let mut sum = 0i32;
        for i in 0..QK {
            qs[i] = (x[i] * id).round_ties_even() as i8;
            sum += qs[i] as i32;
        }
        out.push(Q8Block { d: f16::from_f32(d).to_f32(), s: f16::from_f32(d * sum as f32).to_f32(), qs });
    }
    out
}

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
    // u8 (≤ 15) × i8 pairs summed to i16 cannot overflow: 2 · 15 · 128 < 2^15.
    let pairs = _mm256_madd_epi16(_mm256_maddubs_epi16(wq, xq), _mm256_set1_epi16(1));
    // ggml's `summs += m * s`, which GCC contracts to one fused multiply-add.
    (_mm256_fmadd_ps(_mm256_set1_ps(d * xb.d), _mm256_cvtepi32_ps(pairs), acc), m.mul_add(xb.s, offsets))
}

/// One row against `N` tokens' blocks, each block unpacked once; each token's sum in exactly
/// the order [`dots_avx2`] gives a lone token.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn token_dots_avx2<const N: usize>(row: &[[u8; BLOCK_BYTES]], xs: [&[Q8Block]; N]) -> [f32; N] {
    use std::arch::x86_64::*;
    let xs = xs.map(|x| &x[..row.len()]);
    let mut acc = [(_mm256_setzero_ps(), 0f32); N];
    for (b, block) in row.iter().enumerate() {
        let w = unpack(block);
        for (a, x) in acc.iter_mut().zip(&xs) {
            let xb = &x[b];
            // SAFETY: a 32-byte unaligned load within the token's block.
            let xq = unsafe { _mm256_loadu_si256(xb.qs.as_ptr().cast()) };
            *a = token_step(w, xq, xb, *a);
        }
    }
    acc.map(|(acc, offsets)| super::matvec::hsum_avx2(acc) + offsets)
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::quantized::{GgmlDType, QMatMul, QTensor};
    use candle_core::{Device, Module, Tensor};

    fn random(n: usize, seed: u64) -> Vec<f32> {
        let mut s = seed;
        (0..n)
            .map(|_| {
                s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                ((s >> 33) as f32 / (1u64 << 31) as f32) * 2.0 - 1.0
            })
            .collect()
    }

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
