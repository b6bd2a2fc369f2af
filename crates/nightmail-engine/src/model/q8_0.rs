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

    /// `x`: `[tokens, cols]` → `[tokens, rows]`.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        q8_matmul(self.rows, self.cols, x, |r0, x| self.dots::<ROWS>(r0, x), |r, x| self.dots::<1>(r, x)[0])
    }

    /// Rows `r0..r0 + N` against one token's blocks.
    fn dots<const N: usize>(&self, r0: usize, x: &[Q8Block]) -> [f32; N] {
        #[cfg(target_arch = "x86_64")]
        if has_avx2() {
            // SAFETY: AVX2 and FMA were detected at run time.
            return unsafe { dots_avx2::<N>(self, r0, x) };
        }
        let nb = self.cols / QK;
        std::array::from_fn(|i| {
            let range = (r0 + i) * nb..(r0 + i + 1) * nb;
            dot_scalar(&self.d[range.clone()], &self.qs[range], x)
        })
    }
}

/// Rows the AVX2 kernel computes together (independent accumulator chains, as in Q4_1).
const ROWS: usize = 4;

fn dot_scalar(d: &[f32], qs: &[[i8; QK]], x: &[Q8Block]) -> f32 {
    let mut sum = 0f32;
    for b in 0..d.len() {
        let acc: i32 = qs[b].iter().zip(&x[b].qs).map(|(w, a)| *w as i32 * *a as i32).sum();
        sum += d[b] * x[b].d * acc as f32;
    }
    sum
}

/// Rows `r0..r0 + N` against one token's blocks, each in `ggml_vec_dot_q8_0_q8_0`'s AVX2 order.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn dots_avx2<const N: usize>(w: &Q8_0Matrix, r0: usize, x: &[Q8Block]) -> [f32; N] {
    use std::arch::x86_64::*;
    let nb = w.cols / QK;
    let row = |i: usize| (r0 + i) * nb;
    let x = &x[..nb];
    let step = |at: usize, a: __m256i, xb: &Q8Block, acc: __m256| {
        // SAFETY: a 32-byte unaligned load within the block; AVX2 as the caller.
        let q = unsafe { _mm256_loadu_si256(w.qs[at].as_ptr().cast()) };
        // ggml's mul_sum_i8_pairs_float: |w| · (a with w's sign), as unsigned × signed bytes.
        let pairs = _mm256_madd_epi16(
            _mm256_maddubs_epi16(_mm256_sign_epi8(q, q), _mm256_sign_epi8(a, q)),
            _mm256_set1_epi16(1),
        );
        _mm256_fmadd_ps(_mm256_set1_ps(w.d[at] * xb.d), _mm256_cvtepi32_ps(pairs), acc)
    };
    if N == ROWS {
        // Four named accumulators stay in registers (see Q4_1's kernel).
        let (w0, w1, w2, w3) = (row(0), row(1), row(2), row(3));
        let zero = _mm256_setzero_ps();
        let (mut a0, mut a1, mut a2, mut a3) = (zero, zero, zero, zero);
        for (b, xb) in x.iter().enumerate() {
            // SAFETY: 32-byte unaligned loads within the blocks.
            let a = unsafe { _mm256_loadu_si256(xb.qs.as_ptr().cast()) };
            a0 = step(w0 + b, a, xb, a0);
            a1 = step(w1 + b, a, xb, a1);
            a2 = step(w2 + b, a, xb, a2);
            a3 = step(w3 + b, a, xb, a3);
        }
        let sums = [a0, a1, a2, a3].map(|acc| super::matvec::hsum_avx2(acc));
        return std::array::from_fn(|i| sums[i]);
    }
    std::array::from_fn(|i| {
        let mut acc = _mm256_setzero_ps();
        for (b, xb) in x.iter().enumerate() {
            // SAFETY: as above.
            let a = unsafe { _mm256_loadu_si256(xb.qs.as_ptr().cast()) };
            acc = step(row(i) + b, a, xb, acc);
        }
        super::matvec::hsum_avx2(acc)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::q4_1::quantize_q8_1;
    use candle_core::quantized::{GgmlDType, QMatMul, QTensor};
    use candle_core::{Device, Module};

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
