//! IQ4_NL (4.5 bits a weight): 32 weights, each a 4-bit index into the 16 non-linear levels
//! `kvalues_iq4nl`, times an f16 scale (ggml-common.h `block_iq4_nl`): Q4_0's layout.

use super::iq_grids::KVALUES_IQ4NL;
use super::lattice::half;

/// Elements in a block (ggml `QK4_NL`).
pub(crate) const QK: usize = 32;
/// f16 d, then 16 bytes holding element j in the low nibble and j+16 in the high.
pub(crate) const BLOCK_BYTES: usize = 18;

/// ggml-quants.c `dequantize_row_iq4_nl`, one block.
pub(crate) fn dequantize_block(b: &[u8], y: &mut [f32]) {
    let d = half(b, 0);
    for (j, q) in b[2..BLOCK_BYTES].iter().enumerate() {
        y[j] = d * KVALUES_IQ4NL[(q & 0xf) as usize] as f32;
        y[j + QK / 2] = d * KVALUES_IQ4NL[(q >> 4) as usize] as f32;
    }
}

/// The mat-vec, for a height llama.cpp does not repack, in ggml's AVX2 `ggml_vec_dot_iq4_nl_q8_0` order, on activations quantized as
/// ggml's x86 `quantize_row_q8_0` does: blocks in pairs, the even ones into one 8-lane
/// accumulator and the odd ones into another (lane k: elements 4k..4k+3), both added before
/// `hsum_float_8`; an odd last block after, in scalar.
pub struct Iq4NlMatrix {
    rows: usize,
    cols: usize,
    bytes: crate::bytes::WeightBytes,
}

impl Iq4NlMatrix {
    /// `bytes` must hold `rows · cols / 32` blocks (the caller checked the shape).
    pub fn new(bytes: crate::bytes::WeightBytes, rows: usize, cols: usize) -> Self {
        debug_assert!(bytes.as_slice().len() >= rows * cols / QK * BLOCK_BYTES);
        Iq4NlMatrix { rows, cols, bytes }
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
    pub fn forward(&self, x: &candle_core::Tensor) -> crate::error::Result<candle_core::Tensor> {
        use super::q8::{Q8Block, quantize_q8_1};
        // A height llama.cpp repacks takes its repacked order (nibble_x8.rs).
        if self.rows.is_multiple_of(super::nibble_x8::TILE_ROWS) {
            return super::nibble_x8::matmul(&KVALUES_IQ4NL, self.bytes.as_slice(), self.rows, self.cols, x);
        }
        let tokens = x.dim(0)?;
        let q8: Vec<Vec<Q8Block>> = super::matvec::activations(x)?.chunks_exact(self.cols).map(quantize_q8_1).collect();
        #[cfg(not(target_arch = "aarch64"))]
        let avx2 = super::matvec::has_avx2_f16c();
        #[cfg(target_arch = "aarch64")]
        let kernel = super::arm::ArmKernel::detect();
        super::matvec::rows_by_tokens(self.rows, tokens, self.rows * self.cols * tokens, |r, out| {
            let row = self.row_bytes(r);
            for (y, x) in out.iter_mut().zip(&q8) {
                #[cfg(target_arch = "aarch64")]
                {
                    *y = super::arm::dispatch!(kernel, dot_arm(row, x));
                }
                #[cfg(not(target_arch = "aarch64"))]
                {
                    // SAFETY: AVX2, FMA and F16C were detected at run time.
                    *y = if avx2 { unsafe { dot_avx2(row, x) } } else { dot_scalar(row, x) };
                }
            }
        })
    }
}

/// A block's integer products in ggml's 8 lanes.
fn lanes(block: &[u8], x: &super::q8::Q8Block) -> [i32; 8] {
    let mut lanes = [0i32; 8];
    for (j, q) in block[2..BLOCK_BYTES].iter().enumerate() {
        lanes[j / 4] += KVALUES_IQ4NL[(q & 0xf) as usize] as i32 * x.qs[j] as i32;
        lanes[4 + j / 4] += KVALUES_IQ4NL[(q >> 4) as usize] as i32 * x.qs[j + 16] as i32;
    }
    lanes
}

#[cfg_attr(target_arch = "aarch64", allow(dead_code))] // aarch64: the reference its tests compare against
fn dot_scalar(row: &[u8], x: &[super::q8::Q8Block]) -> f32 {
    let mut acc = [[0f32; 8]; 2];
    let pairs = row.len() / BLOCK_BYTES / 2;
    for (b, (block, xb)) in row.chunks_exact(BLOCK_BYTES).zip(x).enumerate().take(2 * pairs) {
        let d = xb.d * half(block, 0);
        for (a, l) in acc[b % 2].iter_mut().zip(lanes(block, xb)) {
            *a = d.mul_add(l as f32, *a);
        }
    }
    let sum: [f32; 8] = std::array::from_fn(|k| acc[0][k] + acc[1][k]);
    let s4: [f32; 4] = std::array::from_fn(|i| sum[i + 4] + sum[i]);
    let mut total = (s4[0] + s4[2]) + (s4[1] + s4[3]);
    if let (Some(block), Some(xb)) = (row.chunks_exact(BLOCK_BYTES).nth(2 * pairs), x.get(2 * pairs)) {
        // ggml's scalar tail: `sumf += d_x * d_w * (sumi1 + sumi2)`.
        let l = lanes(block, xb);
        total += xb.d * half(block, 0) * ((l[0] + l[1] + l[2] + l[3]) + (l[4] + l[5] + l[6] + l[7])) as f32;
    }
    total
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_avx2(row: &[u8], x: &[super::q8::Q8Block]) -> f32 {
    use std::arch::x86_64::*;
    // SAFETY: a 16-byte load of the 16 levels.
    let values = unsafe { _mm_loadu_si128(KVALUES_IQ4NL.as_ptr().cast()) };
    let m4 = _mm_set1_epi8(0x0f);
    let mut acc = [_mm256_setzero_ps(); 2];
    let pairs = row.len() / BLOCK_BYTES / 2;
    for (b, (block, xb)) in row.chunks_exact(BLOCK_BYTES).zip(x).enumerate().take(2 * pairs) {
        // SAFETY: a 16-byte load inside the 18-byte block, a 32-byte one inside `qs`.
        let bits = unsafe { _mm_loadu_si128(block.as_ptr().add(2).cast()) };
        let q8 = unsafe { _mm256_loadu_si256(xb.qs.as_ptr().cast()) };
        let w = _mm256_set_m128i(
            _mm_shuffle_epi8(values, _mm_and_si128(_mm_srli_epi16(bits, 4), m4)),
            _mm_shuffle_epi8(values, _mm_and_si128(bits, m4)),
        );
        // ggml's mul_add_epi8: |w| · (x with w's sign), then pairs of i16 to i32.
        let p = _mm256_madd_epi16(
            _mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(q8, w)),
            _mm256_set1_epi16(1),
        );
        acc[b % 2] = _mm256_fmadd_ps(_mm256_set1_ps(xb.d * half(block, 0)), _mm256_cvtepi32_ps(p), acc[b % 2]);
    }
    let mut total = super::matvec::hsum_avx2(_mm256_add_ps(acc[0], acc[1]));
    if let (Some(block), Some(xb)) = (row.chunks_exact(BLOCK_BYTES).nth(2 * pairs), x.get(2 * pairs)) {
        let l = lanes(block, xb);
        total += xb.d * half(block, 0) * ((l[0] + l[1] + l[2] + l[3]) + (l[4] + l[5] + l[6] + l[7])) as f32;
    }
    total
}

/// [`dot_scalar`] in NEON or with `sdot`: ggml's NEON `ggml_vec_dot_iq4_nl_q8_0` looks the
/// levels up with `tbl` as here, but sums each block pair to one float; this keeps the AVX2
/// order's 8 lanes (a 16-byte half's `sdot` is lanes 0..3 or 4..7 exactly), so x86's bits.
///
/// # Safety
/// `SDOT` only where the CPU has FEAT_DotProd.
#[cfg(target_arch = "aarch64")]
#[inline(always)]
unsafe fn dot_arm<const SDOT: bool>(row: &[u8], x: &[super::q8::Q8Block]) -> f32 {
    use std::arch::aarch64::*;
    let pairs = row.len() / BLOCK_BYTES / 2;
    // SAFETY: base NEON; 16-byte loads within each block's 16 packed bytes and its token's 32
    // bytes; `quad_sums` gets the caller's proof of dotprod.
    unsafe {
        let mut acc = [[vdupq_n_f32(0.0); 2]; 2];
        for (b, (block, xb)) in row.chunks_exact(BLOCK_BYTES).zip(x).enumerate().take(2 * pairs) {
            let w = super::arm::nibble_levels(&block[2..], &KVALUES_IQ4NL);
            let lo = super::arm::quad_sums::<SDOT>(w[0], vld1q_s8(xb.qs.as_ptr()));
            let hi = super::arm::quad_sums::<SDOT>(w[1], vld1q_s8(xb.qs.as_ptr().add(16)));
            let d = vdupq_n_f32(xb.d * half(block, 0));
            let a = &mut acc[b % 2];
            a[0] = vfmaq_f32(a[0], vcvtq_f32_s32(lo), d);
            a[1] = vfmaq_f32(a[1], vcvtq_f32_s32(hi), d);
        }
        // ((a0+a4) + (a2+a6)) + ((a1+a5) + (a3+a7)) of the two accumulators' sum, as `dot_scalar`.
        let s4 = vaddq_f32(vaddq_f32(acc[0][1], acc[1][1]), vaddq_f32(acc[0][0], acc[1][0]));
        let mut s = [0f32; 4];
        vst1q_f32(s.as_mut_ptr(), s4);
        let mut total = (s[0] + s[2]) + (s[1] + s[3]);
        if let (Some(block), Some(xb)) = (row.chunks_exact(BLOCK_BYTES).nth(2 * pairs), x.get(2 * pairs)) {
            let l = lanes(block, xb);
            total += xb.d * half(block, 0) * ((l[0] + l[1] + l[2] + l[3]) + (l[4] + l[5] + l[6] + l[7])) as f32;
        }
        total
    }
}

#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
unsafe fn dot_avx2(row: &[u8], x: &[super::q8::Q8Block]) -> f32 {
    dot_scalar(row, x)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bytes::WeightBytes;
    use candle_core::{Device, Tensor};

    #[test]
    fn iq4_nl_kernel_equals_its_scalar_path_and_the_dequantized_product() {
        // 9 blocks a row: four pairs and ggml's scalar tail; 5 rows, a height llama.cpp does not repack.
        let (rows, cols, tokens) = (5, 9 * QK, 3);
        let bytes = super::super::lattice::tests::random_blocks(BLOCK_BYTES, rows * 9, 20);
        let m = Iq4NlMatrix::new(WeightBytes::from(&bytes[..]), rows, cols);
        let xs = super::super::q8::tests::random(tokens * cols, 3);
        let x = Tensor::from_vec(xs.clone(), (tokens, cols), &Device::Cpu).unwrap();
        let got = m.forward(&x).unwrap().to_vec2::<f32>().unwrap();
        for (t, got) in got.iter().enumerate() {
            let q8 = super::super::q8::quantize_q8_1(&xs[t * cols..(t + 1) * cols]);
            let xq: Vec<f32> = q8.iter().flat_map(|b| b.qs.map(|q| q as f32 * b.d)).collect();
            for (r, got) in got.iter().enumerate() {
                let scalar = dot_scalar(m.row_bytes(r), &q8);
                assert_eq!(got.to_bits(), scalar.to_bits(), "token {t} row {r}");
                let mut w = vec![0f32; cols];
                m.row_bytes(r)
                    .chunks_exact(BLOCK_BYTES)
                    .zip(w.chunks_exact_mut(QK))
                    .for_each(|(b, y)| dequantize_block(b, y));
                let want: f64 = w.iter().zip(&xq).map(|(a, b)| *a as f64 * *b as f64).sum();
                let scale: f64 = w.iter().zip(&xq).map(|(a, b)| (*a as f64 * *b as f64).abs()).sum();
                assert!((scalar as f64 - want).abs() <= 1e-5 * scale + 1e-6, "token {t} row {r}: {scalar} vs {want}");
            }
        }
    }

    /// Each aarch64 path (NEON, dotprod) against the scalar order on the same random blocks:
    /// one block a row, a pair, odd counts with ggml's scalar tail, rows llama.cpp does not repack.
    #[cfg(target_arch = "aarch64")]
    #[test]
    fn every_arm_path_gives_the_scalar_bits() {
        use crate::kernel::arm::{ArmKernel, dispatch};
        for (seed, (rows, blocks, tokens)) in (1u64..).zip([(1, 1, 1), (3, 2, 2), (5, 9, 3), (7, 33, 5)]) {
            let bytes = super::super::lattice::tests::random_blocks(BLOCK_BYTES, rows * blocks, seed);
            let m = Iq4NlMatrix::new(WeightBytes::from(&bytes[..]), rows, blocks * QK);
            for t in 0..tokens as u64 {
                let q8 = super::super::q8::quantize_q8_1(&super::super::q8::tests::random(blocks * QK, 100 * seed + t));
                for r in 0..rows {
                    let want = dot_scalar(m.row_bytes(r), &q8);
                    for kernel in ArmKernel::available() {
                        let got = dispatch!(kernel, dot_arm(m.row_bytes(r), &q8));
                        assert_eq!(got.to_bits(), want.to_bits(), "{kernel:?}: row {r} of {blocks} blocks, token {t}");
                    }
                }
            }
        }
    }
}
