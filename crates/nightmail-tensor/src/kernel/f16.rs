//! An F16 mat-vec: weights stay in half precision (half the bytes of widening them to f32 at
//! load, which matters for a dense trunk that must fit beside the expert cache), widened eight at
//! a time with F16C and accumulated in f32.

use candle_core::Tensor;
use half::f16;

use super::matvec::{activations, has_avx2_f16c, rows_by_tokens};
use crate::bytes::WeightBytes;
use crate::error::Result;

pub struct F16Matrix {
    rows: usize,
    cols: usize,
    w: Halves,
}

/// The halves: the file's own bytes where they can be read as `f16` in place (a little-endian
/// machine, 2-byte aligned: a streamed layer's read buffer, no copy), else decoded once.
enum Halves {
    InPlace(WeightBytes),
    Decoded(Vec<f16>),
}

impl F16Matrix {
    /// `bytes`: `rows · cols` little-endian halves.
    pub fn from_bytes(bytes: &[u8], rows: usize, cols: usize) -> Self {
        Self::new(WeightBytes::from(bytes), rows, cols)
    }

    /// Over bytes already in memory (computed from in place where the machine allows).
    pub fn new(bytes: WeightBytes, rows: usize, cols: usize) -> Self {
        let b = bytes.as_slice();
        let in_place = cfg!(target_endian = "little")
            && (b.as_ptr() as usize).is_multiple_of(std::mem::align_of::<f16>())
            && b.len() >= 2 * rows * cols;
        let w = if in_place {
            Halves::InPlace(bytes)
        } else {
            Halves::Decoded(b.chunks_exact(2).take(rows * cols).map(|b| f16::from_le_bytes([b[0], b[1]])).collect())
        };
        F16Matrix { rows, cols, w }
    }

    fn halves(&self) -> &[f16] {
        match &self.w {
            Halves::InPlace(bytes) => {
                let b = bytes.as_slice();
                // SAFETY: `new` checked the alignment, the length and that the machine is
                // little-endian, so these bytes are `rows · cols` valid f16 (any bit pattern is).
                unsafe { std::slice::from_raw_parts(b.as_ptr().cast::<f16>(), self.rows * self.cols) }
            }
            Halves::Decoded(w) => w,
        }
    }

    /// Row `r` widened to f32 (exactly: every half is an f32).
    pub(crate) fn row(&self, r: usize) -> Vec<f32> {
        self.halves()[r * self.cols..(r + 1) * self.cols].iter().map(|h| h.to_f32()).collect()
    }

    /// `x`: `[tokens, cols]` → `[tokens, rows]`.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let tokens = x.dim(0)?;
        let xs = activations(x)?;
        let fast = has_avx2_f16c();
        let w = self.halves();
        rows_by_tokens(self.rows, tokens, self.rows * self.cols * tokens, |r, out| {
            let row = &w[r * self.cols..(r + 1) * self.cols];
            let x = |t: usize| &xs[t * self.cols..(t + 1) * self.cols];
            if !fast {
                out.iter_mut().enumerate().for_each(|(t, y)| *y = dot_scalar(row, x(t)));
                return;
            }
            // The row is widened once for up to TOKENS tokens (a verify pass's or a batch's rows).
            let mut t = 0;
            while t < out.len() {
                let n = (out.len() - t).min(TOKENS);
                // SAFETY: AVX2, FMA and F16C were detected at run time.
                match n {
                    1 => out[t] = unsafe { dots_f16c::<1>(row, [x(t)]) }[0],
                    2 => out[t..t + 2].copy_from_slice(&unsafe { dots_f16c::<2>(row, [x(t), x(t + 1)]) }),
                    _ => out[t..t + 3].copy_from_slice(&unsafe { dots_f16c::<3>(row, [x(t), x(t + 1), x(t + 2)]) }),
                }
                t += n;
            }
        })
    }
}

/// Tokens one widening of a row serves: four accumulators each, twelve of the sixteen registers
/// (four tokens spill, and measured no faster).
const TOKENS: usize = 3;

fn dot_scalar(w: &[f16], x: &[f32]) -> f32 {
    w.iter().zip(x).map(|(w, x)| w.to_f32() * x).sum()
}

/// `w` against `N` tokens' activations, each token's sum in exactly the order of a lone one's
/// (four accumulators of eight lanes, then the tail), so a batch or a verify pass computes what
/// decoding alone does; the halves are widened once for all `N`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dots_f16c<const N: usize>(w: &[f16], xs: [&[f32]; N]) -> [f32; N] {
    use std::arch::x86_64::*;
    let n = w.len() / 32 * 32;
    let mut acc = [[_mm256_setzero_ps(); 4]; N];
    for i in (0..n).step_by(32) {
        for j in 0..4 {
            let k = i + 8 * j;
            // SAFETY: 16-byte and 32-byte unaligned loads of elements k..k+8 < n.
            let wv = _mm256_cvtph_ps(unsafe { _mm_loadu_si128(w.as_ptr().add(k).cast()) });
            for (a, x) in acc.iter_mut().zip(&xs) {
                a[j] = _mm256_fmadd_ps(wv, unsafe { _mm256_loadu_ps(x.as_ptr().add(k)) }, a[j]);
            }
        }
    }
    std::array::from_fn(|t| {
        let a = &acc[t];
        let sum = _mm256_add_ps(_mm256_add_ps(a[0], a[1]), _mm256_add_ps(a[2], a[3]));
        super::matvec::hsum_avx2(sum) + dot_scalar(&w[n..], &xs[t][n..])
    })
}

#[cfg(not(target_arch = "x86_64"))]
unsafe fn dots_f16c<const N: usize>(w: &[f16], xs: [&[f32]; N]) -> [f32; N] {
    std::array::from_fn(|t| dot_scalar(w, xs[t]))
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{DType, Device};

    #[test]
    fn f16_matmul_equals_widening_to_f32() {
        let (rows, cols, tokens) = (33, 200, 2);
        let w = Tensor::randn(0f32, 1.0, (rows, cols), &Device::Cpu).unwrap().to_dtype(DType::F16).unwrap();
        let x = Tensor::randn(0f32, 1.0, (tokens, cols), &Device::Cpu).unwrap();
        let bytes: Vec<u8> =
            w.flatten_all().unwrap().to_vec1::<f16>().unwrap().iter().flat_map(|h| h.to_le_bytes()).collect();
        let got = F16Matrix::from_bytes(&bytes, rows, cols).forward(&x).unwrap().to_vec2::<f32>().unwrap();
        let want = x.matmul(&w.to_dtype(DType::F32).unwrap().t().unwrap()).unwrap().to_vec2::<f32>().unwrap();
        for t in 0..tokens {
            for r in 0..rows {
                assert!((got[t][r] - want[t][r]).abs() < 1e-3, "token {t} row {r}: {} vs {}", got[t][r], want[t][r]);
            }
        }
    }

    #[test]
    fn each_token_of_a_multi_token_call_equals_that_token_alone_bit_for_bit() {
        // 9 tokens: whole groups of tokens and a shorter last one; cols with a tail past 32.
        let (rows, cols, tokens) = (7, 200, 9);
        let w = Tensor::randn(0f32, 1.0, (rows, cols), &Device::Cpu).unwrap().to_dtype(DType::F16).unwrap();
        let bytes: Vec<u8> =
            w.flatten_all().unwrap().to_vec1::<f16>().unwrap().iter().flat_map(|h| h.to_le_bytes()).collect();
        let m = F16Matrix::from_bytes(&bytes, rows, cols);
        let x = Tensor::randn(0f32, 1.0, (tokens, cols), &Device::Cpu).unwrap();
        let all = m.forward(&x).unwrap().to_vec2::<f32>().unwrap();
        for (t, row) in all.iter().enumerate() {
            let alone = m.forward(&x.narrow(0, t, 1).unwrap()).unwrap().to_vec2::<f32>().unwrap();
            assert_eq!(row, &alone[0], "token {t}");
        }
    }
}
