//! Q2_K (2.63 bits a weight) in llama.cpp's orders, which candle's port of an older
//! `ggml_vec_dot_q2_K_q8_K` does not keep with our Q8_K activations: for fewer than 8 tokens
//! x86 quants.c's AVX2 `ggml_vec_dot_q2_K_q8_K` (8 f32 lanes, each super-block adding
//! `−d_x·dmin_w ·` its min lanes, then `d_x·d_w ·` its weight lanes, by fma; `hsum_float_8`);
//! from 8 tokens ggml-cpu/tiled's mat-mul (`tiled_run_micro_vnni_8x16`: per super-block
//! `fma(−dmin_w, imin, isum·d_w)`, times d_x, fma'd into one chain). The integer sums are
//! exact, so only these float orders matter. On aarch64 [`Q2K`] takes ggml's NEON order through
//! `k_quant.rs`, as the other K-quants do.

use candle_core::Tensor;

use super::lattice::{QK_K, half};
use super::matvec::{activations, rows_by_tokens};
use super::q8_k::{Q8K, TILED_MIN_TOKENS, quantize_q8_k};
use crate::error::Result;

/// ggml-common.h `block_q2_K`: 16 bytes of 4-bit scale and min per 16 weights, 64 bytes of
/// 2-bit weights, f16 d, f16 dmin.
pub(crate) const BLOCK_BYTES: usize = 84;

/// Whether Q2_K has our kernel here: [`Q2KMatrix`] in llama.cpp's AVX2 orders on x86 (on an
/// AVX-512 CPU repack.cpp may repack a Q2_K matrix into `block_q2_Kx8` tiles; the
/// llama-cpp-python build the tests use did not: its decode equals the vec_dot bit for bit), and
/// on every aarch64 CPU [`Q2K`] in ggml's NEON `ggml_vec_dot_q2_K_q8_K` order (`k_quant.rs`).
pub fn has_kernel(cols: usize) -> bool {
    cols.is_multiple_of(QK_K) && (cfg!(target_arch = "aarch64") || super::cpu::has_avx2())
}

/// The Q2_K matrix of this CPU's kernel (the caller checked [`has_kernel`]).
pub fn q2_k_matrix(bytes: crate::bytes::WeightBytes, rows: usize, cols: usize) -> Box<dyn super::q8_k::LowBitMatrix> {
    #[cfg(target_arch = "aarch64")]
    return Box::new(super::k_quant::KQuantMatrix::<Q2K>::new(bytes, rows, cols));
    #[cfg(not(target_arch = "aarch64"))]
    Box::new(Q2KMatrix::new(bytes, rows, cols))
}

/// Q2_K as a [`super::k_quant::KQuant`], for the NEON order only: its x86 orders keep the
/// minimums in the weights' lanes, which [`Q2KMatrix`] computes, so the type exists on aarch64 alone.
#[cfg(target_arch = "aarch64")]
#[derive(Default, Clone, Copy)]
pub struct Q2K;

#[cfg(target_arch = "aarch64")]
impl super::k_quant::KQuant for Q2K {
    const DTYPE: candle_core::quantized::GgmlDType = candle_core::quantized::GgmlDType::Q2K;
    const BYTES: usize = BLOCK_BYTES;
    const REPACKED_ON_AVX2: bool = false;
    const HAS_MIN: bool = true;

    fn d(block: &[u8]) -> (f32, f32) {
        (half(block, 80), half(block, 82))
    }

    fn dequantize(b: &[u8], out: &mut [f32]) {
        // d·scale and dmin·min first, then dl·q − ml unfused (ggml-quants.c `dequantize_row_q2_K`).
        let (d, dmin) = Self::d(b);
        for (e, y) in out[..QK_K].iter_mut().enumerate() {
            let (n, j, l) = (e / 128, (e % 128) / 32, e % 32);
            let q = (b[16 + 32 * n + l] >> (2 * j)) & 3;
            let s = b[e / 16];
            let (dl, ml) = (d * (s & 0xF) as f32, dmin * (s >> 4) as f32);
            *y = dl * q as f32 - ml;
        }
    }

    /// The weight lanes; the 8 min lanes folded in pairs (only their total serves NEON's order).
    fn sums_scalar(b: &[u8], x: &Q8K, bs: &[i32; 16]) -> super::k_quant::Sums {
        let (lanes, mins) = block_lanes_scalar(b, x, bs);
        super::k_quant::Sums { lanes, mins: std::array::from_fn(|i| mins[2 * i] + mins[2 * i + 1]), quarters: [0; 4] }
    }

    /// Each 16's 2-bit weights against its activations (`sdot`, or `smull` and pairwise adds),
    /// times its scale, in 4 i32 lanes; the minimums against the bsums.
    #[inline(always)]
    unsafe fn totals_neon<const SDOT: bool>(b: &[u8], x: &Q8K, bs: &[i32; 16]) -> (i32, i32) {
        use std::arch::aarch64::*;
        assert!(b.len() >= BLOCK_BYTES);
        // SAFETY: 16-byte loads within the block (asserted) and the 256 activations; base NEON;
        // `quad_sums` gets the caller's promise about dotprod.
        unsafe {
            let m3 = vdupq_n_u8(3);
            let mut acc = vdupq_n_s32(0);
            for g in 0..16 {
                // 16s g: 128-group n, 32-group j (the bit pair), half h of the 32.
                let (n, j, h) = (g / 8, (g % 8) / 2, g % 2);
                let bits = vld1q_u8(b.as_ptr().add(16 + 32 * n + 16 * h));
                let w = vreinterpretq_s8_u8(vandq_u8(vshlq_u8(bits, vdupq_n_s8(-2 * j as i8)), m3));
                let p = super::arm::quad_sums::<SDOT>(w, vld1q_s8(x.qs.as_ptr().add(16 * g)));
                acc = vmlaq_n_s32(acc, p, (b[g] & 0xF) as i32);
            }
            let imin: i32 = (0..16).map(|g| (b[g] >> 4) as i32 * bs[g]).sum();
            (vaddvq_s32(acc), imin)
        }
    }
}

/// A Q8_K block's sums of 16 (ggml `block_q8_K.bsums`), which meet the weights' minimums.
fn bsums(x: &Q8K) -> [i32; 16] {
    std::array::from_fn(|j| x.qs[16 * j..16 * j + 16].iter().map(|&q| q as i32).sum())
}

/// One super-block's weight products in ggml's 8 i32 lanes (lane k: elements 4k..4k+3 of each
/// 32, times their 16's scale), and its min lanes (lane k: min·bsum of the 16s 2k and 2k+1,
/// `_mm256_madd_epi16` of the mins and `bsums`).
type Lanes = ([i32; 8], [i32; 8]);

fn min_lanes(b: &[u8], bs: &[i32; 16]) -> [i32; 8] {
    std::array::from_fn(|k| (b[2 * k] >> 4) as i32 * bs[2 * k] + (b[2 * k + 1] >> 4) as i32 * bs[2 * k + 1])
}

fn block_lanes_scalar(b: &[u8], x: &Q8K, bs: &[i32; 16]) -> Lanes {
    let mut lanes = [0i32; 8];
    for e in 0..QK_K {
        let (n, j, l) = (e / 128, (e % 128) / 32, e % 32);
        let q = ((b[16 + 32 * n + l] >> (2 * j)) & 3) as i32;
        lanes[l / 4] += (b[e / 16] & 0xf) as i32 * q * x.qs[e] as i32;
    }
    (lanes, min_lanes(b, bs))
}

/// The same lanes, the products in AVX2 (`maddubs` of the 2-bit weights and the activations,
/// `madd` with each 16's scale; no i16 saturation: 2·3·127 < 2^15).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn block_lanes_avx2(b: &[u8], x: &Q8K, bs: &[i32; 16]) -> Lanes {
    use std::arch::x86_64::*;
    let m3 = _mm256_set1_epi8(3);
    let mut sum = _mm256_setzero_si256();
    for n in 0..2 {
        // SAFETY: 32 bytes of the 64 weight bytes at 16 + 32n of an 84-byte block.
        let bits = unsafe { _mm256_loadu_si256(b.as_ptr().add(16 + 32 * n).cast()) };
        for j in 0..4 {
            let q = _mm256_and_si256(_mm256_srl_epi16(bits, _mm_cvtsi32_si128(2 * j as i32)), m3);
            // SAFETY: 32 activations within the block's 256.
            let x8 = unsafe { _mm256_loadu_si256(x.qs.as_ptr().add(128 * n + 32 * j).cast()) };
            let s = 8 * n + 2 * j;
            let sc = _mm256_set_m128i(_mm_set1_epi16((b[s + 1] & 0xf) as i16), _mm_set1_epi16((b[s] & 0xf) as i16));
            sum = _mm256_add_epi32(sum, _mm256_madd_epi16(_mm256_maddubs_epi16(q, x8), sc));
        }
    }
    let mut lanes = [0i32; 8];
    // SAFETY: 32 bytes into an [i32; 8].
    unsafe { _mm256_storeu_si256(lanes.as_mut_ptr().cast(), sum) };
    (lanes, min_lanes(b, bs))
}

fn block_lanes(b: &[u8], x: &Q8K, bs: &[i32; 16], avx2: bool) -> Lanes {
    #[cfg(target_arch = "x86_64")]
    if avx2 {
        // SAFETY: AVX2 was detected at run time when `avx2` is set.
        return unsafe { block_lanes_avx2(b, x, bs) };
    }
    let _ = avx2;
    block_lanes_scalar(b, x, bs)
}

/// `row` · one token in `ggml_vec_dot_q2_K_q8_K`'s AVX2 order.
fn dot_vec(row: &[u8], x: &[Q8K], bs: &[[i32; 16]], avx2: bool) -> f32 {
    let mut acc = [0f32; 8];
    for ((b, xb), bs) in row.chunks_exact(BLOCK_BYTES).zip(x).zip(bs) {
        let (lanes, mins) = block_lanes(b, xb, bs, avx2);
        let (d, dmin) = (xb.d * half(b, 80), -xb.d * half(b, 82));
        for k in 0..8 {
            acc[k] = dmin.mul_add(mins[k] as f32, acc[k]);
        }
        for k in 0..8 {
            acc[k] = d.mul_add(lanes[k] as f32, acc[k]);
        }
    }
    // `hsum_float_8`: ((a0+a4) + (a2+a6)) + ((a1+a5) + (a3+a7)).
    let s4: [f32; 4] = std::array::from_fn(|i| acc[i + 4] + acc[i]);
    (s4[0] + s4[2]) + (s4[1] + s4[3])
}

/// `row` · one token in the tiled mat-mul's order (see the module's comment).
fn dot_tiled(row: &[u8], x: &[Q8K], bs: &[[i32; 16]], avx2: bool) -> f32 {
    let mut acc = 0f32;
    for ((b, xb), bs) in row.chunks_exact(BLOCK_BYTES).zip(x).zip(bs) {
        let (lanes, mins) = block_lanes(b, xb, bs, avx2);
        let (isum, imin): (i32, i32) = (lanes.iter().sum(), mins.iter().sum());
        let r = (-half(b, 82)).mul_add(imin as f32, isum as f32 * half(b, 80));
        acc = r.mul_add(xb.d, acc);
    }
    acc
}

/// A Q2_K matrix over its file's bytes, in the x86 orders.
#[cfg_attr(target_arch = "aarch64", allow(dead_code))] // aarch64: its tests' reference
pub struct Q2KMatrix {
    rows: usize,
    cols: usize,
    bytes: crate::bytes::WeightBytes,
}

impl Q2KMatrix {
    /// `bytes` must hold `rows · cols / 256` blocks (the caller checked the shape).
    pub fn new(bytes: crate::bytes::WeightBytes, rows: usize, cols: usize) -> Self {
        debug_assert!(bytes.as_slice().len() >= rows * cols / QK_K * BLOCK_BYTES);
        Q2KMatrix { rows, cols, bytes }
    }

    fn matmul(&self, x: &Tensor, avx2: bool) -> Result<Tensor> {
        let tokens = x.dim(0)?;
        let q8: Vec<Vec<Q8K>> = activations(x)?.chunks_exact(self.cols).map(quantize_q8_k).collect();
        let bs: Vec<Vec<[i32; 16]>> = q8.iter().map(|x| x.iter().map(bsums).collect()).collect();
        let row_bytes = self.cols / QK_K * BLOCK_BYTES;
        let bytes = self.bytes.as_slice();
        rows_by_tokens(self.rows, tokens, self.rows * self.cols * tokens, |r, out| {
            let row = &bytes[r * row_bytes..(r + 1) * row_bytes];
            let dot = if tokens >= TILED_MIN_TOKENS { dot_tiled } else { dot_vec };
            for (t, y) in out.iter_mut().enumerate() {
                *y = dot(row, &q8[t], &bs[t], avx2);
            }
        })
    }
}

impl super::q8_k::LowBitMatrix for Q2KMatrix {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.matmul(x, super::cpu::has_avx2())
    }

    fn dtype(&self) -> crate::dtype::WeightDType {
        crate::dtype::WeightDType::Ggml(candle_core::quantized::GgmlDType::Q2K)
    }

    fn cols(&self) -> usize {
        self.cols
    }

    fn row_bytes(&self, r: usize) -> &[u8] {
        let len = self.cols / QK_K * BLOCK_BYTES;
        &self.bytes.as_slice()[r * len..(r + 1) * len]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernel::q8_k::LowBitMatrix;

    #[cfg(target_arch = "aarch64")]
    fn fix(b: &mut [u8]) {
        super::super::k_quant::tests::finite_half(b, 80, 0.002);
        super::super::k_quant::tests::finite_half(b, 82, 0.001);
    }

    #[cfg(target_arch = "aarch64")]
    #[test]
    fn q2_k_neon_paths_equal_scalar_and_the_dequantized_product() {
        super::super::k_quant::tests::check_kernel::<Q2K>(fix);
    }

    #[cfg(target_arch = "aarch64")]
    #[test]
    fn q2_k_dequantizes_as_gguf_py_does() {
        super::super::k_quant::tests::dequantizes_as_gguf_py::<Q2K>("Q2_K");
    }

    #[cfg(target_arch = "aarch64")]
    #[test]
    fn q2_k_dequantizes_as_candle_does() {
        super::super::k_quant::tests::dequantizes_as_candle::<Q2K>(fix);
    }

    #[test]
    fn q2_k_avx2_equals_scalar_and_both_orders_the_dequantized_product() {
        // 5 tokens take the vec_dot order, 9 the tiled one.
        for tokens in [5, TILED_MIN_TOKENS + 1] {
            check(tokens);
        }
    }

    fn check(tokens: usize) {
        let (rows, cols) = (8, 3 * QK_K);
        let bytes = super::super::lattice::tests::random_blocks(BLOCK_BYTES, rows * cols / QK_K, 31);
        // The block's f16 d and dmin sit at its end: put small finite ones there.
        let mut bytes = bytes;
        for b in bytes.chunks_exact_mut(BLOCK_BYTES) {
            let (d, m) =
                (half::f16::from_f32(0.01 + b[0] as f32 * 1e-4), half::f16::from_f32(0.002 + b[1] as f32 * 1e-5));
            b[80..82].copy_from_slice(&d.to_le_bytes());
            b[82..84].copy_from_slice(&m.to_le_bytes());
        }
        let xs = super::super::q8::tests::random(tokens * cols, 9);
        let x = Tensor::from_vec(xs.clone(), (tokens, cols), &candle_core::Device::Cpu).unwrap();
        let m = Q2KMatrix::new(crate::bytes::WeightBytes::from(&bytes[..]), rows, cols);
        let scalar = m.matmul(&x, false).unwrap().to_vec2::<f32>().unwrap();
        let got = m.forward(&x).unwrap().to_vec2::<f32>().unwrap();
        let row_bytes = cols / QK_K * BLOCK_BYTES;
        for t in 0..tokens {
            let q8 = quantize_q8_k(&xs[t * cols..(t + 1) * cols]);
            for r in 0..rows {
                assert_eq!(got[t][r].to_bits(), scalar[t][r].to_bits(), "token {t} row {r}");
                // The dequantized block times the activations: d·scale·q − dmin·min, element by element.
                let row = &bytes[r * row_bytes..(r + 1) * row_bytes];
                let (mut acc, mut min) = (0f64, 0f64);
                for (b, xb) in row.chunks_exact(BLOCK_BYTES).zip(&q8) {
                    for e in 0..QK_K {
                        let (n, j, l) = (e / 128, (e % 128) / 32, e % 32);
                        let q = (b[16 + 32 * n + l] >> (2 * j)) & 3;
                        let s = b[e / 16];
                        let x = xb.qs[e] as f64 * xb.d as f64;
                        acc += half(b, 80) as f64 * (s & 0xf) as f64 * q as f64 * x;
                        min += half(b, 82) as f64 * (s >> 4) as f64 * x;
                    }
                }
                let want = acc - min;
                assert!((scalar[t][r] as f64 - want).abs() <= 1e-4 * (acc.abs() + min.abs()) + 1e-6, "{t} {r}");
            }
        }
    }
}
