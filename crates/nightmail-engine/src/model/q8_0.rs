//! A Q8_0 mat-vec with AVX2, for the output head of models that keep it in Q8_0 (SmolLM2's tied
//! embeddings): ggml's `ggml_vec_dot_q8_0_q8_0` on activations quantized as ggml's x86
//! `quantize_row_q8_0` does (the same per-block rounding as Q8_1, without the sum).

use candle_core::Tensor;
use half::f16;

use super::q4_1::{Q8Block, has_avx2, q8_matmul};
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

    pub(super) fn cols(&self) -> usize {
        self.cols
    }

    /// Row `r`'s blocks as the file held them: each scale back in f16 (exactly: it was read
    /// from one), then its 32 bytes.
    pub(super) fn row_bytes(&self, r: usize) -> Vec<u8> {
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
        )
    }

    /// Row `r` against up to four tokens' blocks (`TOKENS`), into `out` (one per token).
    fn token_dots(&self, r: usize, xs: &[&[Q8Block]], out: &mut [f32]) {
        let nb = self.cols / QK;
        let range = r * nb..(r + 1) * nb;
        #[cfg(target_arch = "x86_64")]
        if has_avx2() {
            let (d, qs) = (&self.d[range.clone()], &self.qs[range.clone()]);
            // SAFETY: AVX2 and FMA were detected at run time.
            return unsafe { super::q4_1::by_tokens!(xs, out, token_dots_avx2(d, qs)) };
        }
        out.iter_mut().zip(xs).for_each(|(y, x)| *y = dot_scalar(&self.d[range.clone()], &self.qs[range.clone()], x));
    }

    /// Rows `r0..r0 + N` against one token's blocks, one row at a time: the one-row kernel
    /// streams a row's scales and bytes faster than interleaving four rows did (1.8 against
    /// 4.9 ms for SmolLM2's 49152 × 576 output head on one thread), and each row's sum is the same.
    fn dots<const N: usize>(&self, r0: usize, x: &[Q8Block]) -> [f32; N] {
        let mut out = [0f32; N];
        for (i, y) in out.iter_mut().enumerate() {
            self.token_dots(r0 + i, &[x], std::slice::from_mut(y));
        }
        out
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

/// One row (`d`, `qs`) against `N` tokens' blocks in `ggml_vec_dot_q8_0_q8_0`'s AVX2 order, each
/// weight block loaded and made unsigned once for all of them; each token's sum is what it
/// would be alone.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn token_dots_avx2<const N: usize>(d: &[f32], qs: &[[i8; QK]], xs: [&[Q8Block]; N]) -> [f32; N] {
    use std::arch::x86_64::*;
    let xs = xs.map(|x| &x[..qs.len()]);
    let mut acc = [_mm256_setzero_ps(); N];
    for (b, (q, &d)) in qs.iter().zip(d).enumerate() {
        // SAFETY: a 32-byte unaligned load within the block.
        let q = unsafe { _mm256_loadu_si256(q.as_ptr().cast()) };
        let abs_q = _mm256_sign_epi8(q, q);
        for (acc, x) in acc.iter_mut().zip(&xs) {
            let xb = &x[b];
            // SAFETY: as above, within the token's block.
            let a = unsafe { _mm256_loadu_si256(xb.qs.as_ptr().cast()) };
            // ggml's mul_sum_i8_pairs_float: |w| · (a with w's sign), as unsigned × signed bytes.
            let pairs = _mm256_madd_epi16(_mm256_maddubs_epi16(abs_q, _mm256_sign_epi8(a, q)), _mm256_set1_epi16(1));
            *acc = _mm256_fmadd_ps(_mm256_set1_ps(d * xb.d), _mm256_cvtepi32_ps(pairs), *acc);
        }
    }
    acc.map(|a| super::matvec::hsum_avx2(a))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::q4_1::quantize_q8_1;
    use candle_core::quantized::{GgmlDType, QMatMul, QTensor};
    use candle_core::{Device, Module};

    #[test]
    fn each_token_of_a_multi_token_call_equals_that_token_alone_bit_for_bit() {
        // 11 tokens: whole groups of four and a shorter last one; 7 rows: a whole group of rows
        // and a shorter last one in the one-token path.
        let (rows, cols, tokens) = (7, 256, 11);
        let w = Tensor::randn(0f32, 1.0, (rows, cols), &Device::Cpu).unwrap();
        let x = Tensor::randn(0f32, 1.0, (tokens, cols), &Device::Cpu).unwrap();
        let q = QTensor::quantize(&w, GgmlDType::Q8_0).unwrap();
        let m = Q8_0Matrix::from_ggml(&q.data().unwrap(), rows, cols);
        let all = m.forward(&x).unwrap().to_vec2::<f32>().unwrap();
        for n in 2..=4 {
            let some = m.forward(&x.narrow(0, 0, n).unwrap()).unwrap().to_vec2::<f32>().unwrap();
            assert_eq!(some[..], all[..n], "the first {n} tokens");
        }
        for (t, row) in all.iter().enumerate() {
            let alone = m.forward(&x.narrow(0, t, 1).unwrap()).unwrap().to_vec2::<f32>().unwrap();
            assert_eq!(row, &alone[0], "token {t}");
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
