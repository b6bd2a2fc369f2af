//! A Q4_0 mat-vec that computes straight from the ggml blocks where they lie (a streamed
//! expert's read buffer, no copy or widening): ggml's `ggml_vec_dot_q4_0_q8_0`, activations
//! quantized per 32-block as ggml's x86 `quantize_row_q8_0` does, weights (nibble − 8) · d.

use candle_core::Tensor;
use half::f16;

use super::matvec::activations;
#[cfg(not(target_arch = "aarch64"))]
use super::matvec::has_avx2_f16c;
#[cfg(not(target_arch = "aarch64"))]
use super::matvec::rows_by_tokens;
use super::q8::{Q8Block, quantize_q8_1};
use crate::bytes::WeightBytes;
use crate::error::Result;

const QK: usize = 32;
/// ggml `block_q4_0`: f16 d, then 16 bytes holding element j in the low nibble and j+16 in the high.
pub(crate) const BLOCK_BYTES: usize = 18;

pub struct Q4_0Matrix {
    rows: usize,
    cols: usize,
    bytes: WeightBytes,
}

impl Q4_0Matrix {
    /// `bytes` must hold `rows · cols / 32` blocks (the caller checked the shape).
    pub fn new(bytes: WeightBytes, rows: usize, cols: usize) -> Self {
        debug_assert!(bytes.as_slice().len() >= rows * cols / QK * BLOCK_BYTES);
        Q4_0Matrix { rows, cols, bytes }
    }

    pub(crate) fn cols(&self) -> usize {
        self.cols
    }

    /// Row `r`'s blocks as the file holds them.
    pub(crate) fn row_bytes(&self, r: usize) -> &[u8] {
        let len = self.cols / QK * BLOCK_BYTES;
        &self.bytes.as_slice()[r * len..(r + 1) * len]
    }

    /// `x`: `[tokens, cols]` → `[tokens, rows]`.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        // A height llama.cpp repacks takes its repacked order on x86 (nibble_x8.rs).
        #[cfg(not(target_arch = "aarch64"))]
        if self.rows.is_multiple_of(super::nibble_x8::TILE_ROWS) {
            let levels = &super::nibble_x8::Q4_0_LEVELS;
            return super::nibble_x8::matmul(levels, self.bytes.as_slice(), self.rows, self.cols, x);
        }
        let xs = activations(x)?;
        let q8: Vec<Vec<Q8Block>> = xs.chunks_exact(self.cols).map(quantize_q8_1).collect();
        #[cfg(target_arch = "aarch64")]
        return self.forward_arm(&q8, super::arm::ArmKernel::detect());
        #[cfg(not(target_arch = "aarch64"))]
        {
            let tokens = x.dim(0)?;
            let row_bytes = self.cols / QK * BLOCK_BYTES;
            let blocks = self.bytes.as_slice();
            let avx2 = has_avx2_f16c();
            rows_by_tokens(self.rows, tokens, self.rows * self.cols * tokens, |r, out| {
                let row = &blocks[r * row_bytes..(r + 1) * row_bytes];
                if !avx2 {
                    out.iter_mut().enumerate().for_each(|(t, y)| *y = dot_scalar(row, &q8[t]));
                    return;
                }
                // Each block is unpacked once for up to TOKENS tokens (a verify pass's or a batch's).
                for (c, out) in out.chunks_mut(TOKENS).enumerate() {
                    let x = |i: usize| &q8[c * TOKENS + i][..];
                    // SAFETY: AVX2, FMA and F16C were detected at run time.
                    match out.len() {
                        1 => out[0] = unsafe { dots_avx2::<1>(row, [x(0)]) }[0],
                        2 => out.copy_from_slice(&unsafe { dots_avx2::<2>(row, [x(0), x(1)]) }),
                        3 => out.copy_from_slice(&unsafe { dots_avx2::<3>(row, [x(0), x(1), x(2)]) }),
                        _ => out.copy_from_slice(&unsafe { dots_avx2::<4>(row, [x(0), x(1), x(2), x(3)]) }),
                    }
                }
            })
        }
    }

    /// The activations' Q8 blocks `q8` (one vector per token) → `[tokens, rows]` on aarch64 path
    /// `kernel`; each row's blocks are unpacked once for all tokens, and on i8mm two rows go
    /// together (the odd last row alone).
    #[cfg(target_arch = "aarch64")]
    fn forward_arm(&self, q8: &[Vec<Q8Block>], kernel: super::arm::ArmKernel) -> Result<Tensor> {
        let row_bytes = self.cols / QK * BLOCK_BYTES;
        let blocks = self.bytes.as_slice();
        let xs: Vec<&[Q8Block]> = q8.iter().map(|x| &x[..]).collect();
        let n = xs.len();
        let group = if kernel == super::arm::ArmKernel::I8mm { 2 } else { 1 };
        super::matvec::row_groups_by_tokens(self.rows, n, self.rows * self.cols * n, group, |r, out| {
            if out.len() == 2 * n {
                let rows = blocks[r * row_bytes..(r + 2) * row_bytes].split_at(row_bytes);
                let (first, second) = out.split_at_mut(n);
                let out = [first, second];
                return super::arm::dispatch!(
                    kernel,
                    pair_dots_arm(rows, &xs, out),
                    i8mm: pair_dots_i8mm(rows, &xs, out)
                );
            }
            let row = &blocks[r * row_bytes..(r + 1) * row_bytes];
            super::arm::dispatch!(kernel, dots_arm(row, &xs, out))
        })
    }
}

/// Tokens one unpacking of a block serves (one accumulator each).
#[cfg(not(target_arch = "aarch64"))]
const TOKENS: usize = 4;

fn scale(block: &[u8]) -> f32 {
    f16::from_le_bytes([block[0], block[1]]).to_f32()
}

fn dot_scalar(row: &[u8], x: &[Q8Block]) -> f32 {
    let mut sum = 0f32;
    for (block, xb) in row.chunks_exact(BLOCK_BYTES).zip(x) {
        let (lo, hi) = xb.qs.split_at(16);
        let mut acc = 0i32;
        for ((w, l), h) in block[2..].iter().zip(lo).zip(hi) {
            acc += ((w & 0x0F) as i32 - 8) * *l as i32 + ((w >> 4) as i32 - 8) * *h as i32;
        }
        sum += scale(block) * xb.d * acc as f32;
    }
    sum
}

/// `row` against `N` tokens' blocks, each token's sum in exactly the order of a lone one's, so a
/// batch or a verify pass computes what decoding alone does; the nibbles are unpacked once.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dots_avx2<const N: usize>(row: &[u8], xs: [&[Q8Block]; N]) -> [f32; N] {
    use std::arch::x86_64::*;
    let mut acc = [_mm256_setzero_ps(); N];
    let low = _mm_set1_epi8(0x0F);
    let eight = _mm256_set1_epi8(8);
    let ones = _mm256_set1_epi16(1);
    for (b, block) in row.chunks_exact(BLOCK_BYTES).enumerate() {
        // SAFETY: a 16-byte unaligned load inside the 18-byte block, a 32-byte one inside `qs`.
        let packed = unsafe { _mm_loadu_si128(block.as_ptr().add(2).cast()) };
        let lo = _mm_and_si128(packed, low);
        let hi = _mm_and_si128(_mm_srli_epi16(packed, 4), low);
        let w = _mm256_sub_epi8(_mm256_set_m128i(hi, lo), eight); // elements 0..15, then 16..31
        let abs_w = _mm256_sign_epi8(w, w);
        let d = _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(u16::from_le_bytes([block[0], block[1]]) as i32)));
        for (acc, x) in acc.iter_mut().zip(&xs) {
            let xb = &x[b];
            let a = unsafe { _mm256_loadu_si256(xb.qs.as_ptr().cast()) };
            // ggml's mul_sum_i8_pairs_float: |w| · (a with w's sign), as unsigned × signed bytes.
            let pairs = _mm256_madd_epi16(_mm256_maddubs_epi16(abs_w, _mm256_sign_epi8(a, w)), ones);
            *acc = _mm256_fmadd_ps(_mm256_set1_ps(d * xb.d), _mm256_cvtepi32_ps(pairs), *acc);
        }
    }
    acc.map(|a| super::matvec::hsum_avx2(a))
}

/// [`dot_scalar`] for each token, each block's integer sum taken in NEON
/// ([`super::arm::block_dot`]) and its nibbles unpacked once for all tokens: the same float
/// operations in the same order, so the same bits.
///
/// # Safety
/// `SDOT` only where the CPU has FEAT_DotProd.
#[cfg(target_arch = "aarch64")]
#[inline(always)]
unsafe fn dots_arm<const SDOT: bool>(row: &[u8], xs: &[&[Q8Block]], out: &mut [f32]) {
    assert!(out.len() == xs.len() && xs.iter().all(|x| x.len() * BLOCK_BYTES >= row.len()));
    out.fill(0.0);
    for (b, block) in row.chunks_exact(BLOCK_BYTES).enumerate() {
        // SAFETY: the block's 16 packed bytes.
        let w = unsafe { super::arm::nibbles(&block[2..], 8) };
        let d = scale(block);
        for (y, x) in out.iter_mut().zip(xs) {
            // SAFETY: the caller's proof of dotprod is passed on.
            let acc = unsafe { super::arm::block_dot::<SDOT>(w, &x[b].qs) };
            *y += d * x[b].d * acc as f32;
        }
    }
}

/// [`dots_arm`] for two rows, one after the other.
///
/// # Safety
/// `SDOT` only where the CPU has FEAT_DotProd.
#[cfg(target_arch = "aarch64")]
#[inline(always)]
unsafe fn pair_dots_arm<const SDOT: bool>(rows: (&[u8], &[u8]), xs: &[&[Q8Block]], [first, second]: [&mut [f32]; 2]) {
    // SAFETY: the caller's proof of dotprod is passed on.
    unsafe {
        dots_arm::<SDOT>(rows.0, xs, first);
        dots_arm::<SDOT>(rows.1, xs, second);
    }
}

/// [`dots_arm`] for two rows at once: each block of both rows unpacked once, each token pair's
/// four block sums in four `smmla`s ([`super::arm::pair_dots`]' lanes), then lane by lane
/// [`dot_scalar`]'s `sum + d_w·d_x·acc`, so each (row, token) gets the scalar bits; an odd last
/// token against each row by `sdot`.
///
/// # Safety
/// The CPU has FEAT_I8MM and FEAT_DotProd.
#[cfg(target_arch = "aarch64")]
#[inline(always)]
unsafe fn pair_dots_i8mm(rows: (&[u8], &[u8]), xs: &[&[Q8Block]], mut out: [&mut [f32]; 2]) {
    use super::arm::{block_dot, bytes, interleave, load_pair, nibbles, pair_dots, row_lanes, store_pair};
    use std::arch::aarch64::*;
    let n = xs.len();
    assert!(out.iter().all(|o| o.len() == n) && rows.0.len() == rows.1.len());
    assert!(xs.iter().all(|x| x.len() * BLOCK_BYTES >= rows.0.len()));
    out.iter_mut().for_each(|o| o.fill(0.0));
    for (b, blocks) in rows.0.chunks_exact(BLOCK_BYTES).zip(rows.1.chunks_exact(BLOCK_BYTES)).enumerate() {
        let (d0, d1) = (scale(blocks.0), scale(blocks.1));
        // SAFETY: each block's 16 packed bytes.
        let w = unsafe { [nibbles(&blocks.0[2..], 8), nibbles(&blocks.1[2..], 8)] };
        let (wi, dw) = (interleave(w[0], w[1]), row_lanes(d0, d1));
        for t in (0..n - n % 2).step_by(2) {
            let (x0, x1) = (&xs[t][b], &xs[t + 1][b]);
            // SAFETY: the caller's proof of i8mm; base NEON.
            unsafe {
                let acc = pair_dots(&wi, &interleave(bytes(&x0.qs), bytes(&x1.qs)));
                let scale = vmulq_f32(dw, super::arm::token_lanes(&[x0.d, x1.d]));
                let sum = vaddq_f32(load_pair(&out, t), vmulq_f32(scale, vcvtq_f32_s32(acc)));
                store_pair(&mut out, t, sum);
            }
        }
        if n % 2 == 1 {
            let x = &xs[n - 1][b];
            for (o, (w, d)) in out.iter_mut().zip([(w[0], d0), (w[1], d1)]) {
                // SAFETY: the caller's proof of dotprod.
                let acc = unsafe { block_dot::<true>(w, &x.qs) };
                o[n - 1] += d * x.d * acc as f32;
            }
        }
    }
}

#[cfg(not(target_arch = "x86_64"))]
#[allow(dead_code)]
unsafe fn dots_avx2<const N: usize>(row: &[u8], xs: [&[Q8Block]; N]) -> [f32; N] {
    xs.map(|x| dot_scalar(row, x))
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::quantized::{GgmlDType, QMatMul, QTensor};
    use candle_core::{Device, Module};

    #[test]
    fn q4_0_matmul_equals_the_scalar_path_and_candles_kernel_up_to_activation_rounding() {
        let (rows, cols, tokens) = (40, 256, 3);
        let w = Tensor::randn(0f32, 1.0, (rows, cols), &Device::Cpu).unwrap();
        let x = Tensor::randn(0f32, 1.0, (tokens, cols), &Device::Cpu).unwrap();
        let q = QTensor::quantize(&w, GgmlDType::Q4_0).unwrap();
        let ours = Q4_0Matrix::new(WeightBytes::from(&q.data().unwrap()[..]), rows, cols);
        let got = ours.forward(&x).unwrap().to_vec2::<f32>().unwrap();
        let want = QMatMul::QTensor(std::sync::Arc::new(q)).forward(&x).unwrap().to_vec2::<f32>().unwrap();
        let q8: Vec<Vec<Q8Block>> = x.to_vec2::<f32>().unwrap().iter().map(|r| quantize_q8_1(r)).collect();
        let row_bytes = cols / QK * BLOCK_BYTES;
        let blocks = ours.bytes.as_slice();
        for t in 0..tokens {
            for r in 0..rows {
                let scalar = dot_scalar(&blocks[r * row_bytes..(r + 1) * row_bytes], &q8[t]);
                assert!((got[t][r] - scalar).abs() < 1e-3, "token {t} row {r}: {} vs scalar {scalar}", got[t][r]);
                // candle rounds activations with ggml's C reference; we with its x86 code.
                assert!(
                    (got[t][r] - want[t][r]).abs() < 0.1,
                    "token {t} row {r}: {} vs candle {}",
                    got[t][r],
                    want[t][r]
                );
            }
        }
    }

    /// Each aarch64 path (NEON, dotprod, i8mm with its row pairs) against the scalar reference,
    /// every token of a call.
    #[cfg(target_arch = "aarch64")]
    #[test]
    fn every_arm_path_gives_the_scalar_references_bits() {
        use crate::kernel::q8::{arm_cases, each_arm_matmul_gives_the_scalar_bits};
        for (rows, blocks, bytes, q8) in arm_cases(GgmlDType::Q4_0) {
            let m = Q4_0Matrix::new(WeightBytes::from(&bytes[..]), rows, blocks * QK);
            each_arm_matmul_gives_the_scalar_bits(
                &q8,
                rows,
                |r, x| dot_scalar(m.row_bytes(r), x),
                |k| m.forward_arm(&q8, k).unwrap(),
            );
        }
    }

    #[test]
    fn each_token_of_a_multi_token_call_equals_that_token_alone_bit_for_bit() {
        // 9 tokens: whole groups of tokens and a shorter last one; cols with a tail past 32.
        let (rows, cols, tokens) = (7, 256, 9);
        let w = Tensor::randn(0f32, 1.0, (rows, cols), &Device::Cpu).unwrap();
        let bytes = QTensor::quantize(&w, GgmlDType::Q4_0).unwrap().data().unwrap().to_vec();
        let m = Q4_0Matrix::new(WeightBytes::from(&bytes[..]), rows, cols);
        let x = Tensor::randn(0f32, 1.0, (tokens, cols), &Device::Cpu).unwrap();
        let all = m.forward(&x).unwrap().to_vec2::<f32>().unwrap();
        for (t, row) in all.iter().enumerate() {
            let alone = m.forward(&x.narrow(0, t, 1).unwrap()).unwrap().to_vec2::<f32>().unwrap();
            assert_eq!(row, &alone[0], "token {t}");
        }
    }
}
