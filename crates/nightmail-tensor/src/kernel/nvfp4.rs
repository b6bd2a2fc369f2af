//! NVFP4 in ggml's layout (ggml-common.h `block_nvfp4`): 64 E2M1 values a block in four groups of
//! 16, each group with its own unsigned E4M3 scale. A checkpoint's per-tensor second scale is a
//! tensor of its own (`<name>.scale`), which `Linear` multiplies the product by.
//!
//! The product is llama.cpp's `ggml_vec_dot_nvfp4_q8_0`: activations as Q8_0 blocks (two to an
//! NVFP4 block), each group's integer sum exact, then the float operations of the build's own
//! vector path, which differ by architecture: on x86 (arch/x86/quants.c, AVX2) eight f32 lanes,
//! lane k taking elements 4k..4k+3 of groups 0 and 2 (k < 4) or 1 and 3, `hsum_float_8` at the
//! end; on aarch64 (arch/arm/quants.c, NEON) four lanes, one per group, `vaddvq_f32` at the end.
//! Integer sums are exact, so each order below gives llama.cpp's bits for the same activations.

use candle_core::Tensor;

use super::matvec::{activations, rows_by_tokens};
use super::mxfp4::KVALUES;
use super::q8::{Q8Block, quantize_q8_1};
use crate::bytes::WeightBytes;
use crate::error::Result;

/// Elements per block.
pub(crate) const QK: usize = 64;
/// Elements that share a scale.
const GROUP: usize = 16;
/// Four scale bytes, then 32 bytes of two values each.
pub(crate) const BLOCK_BYTES: usize = 36;

/// ggml-impl.h `ggml_ue4m3_to_fp32`: E4M3 without its sign (bias 7, subnormals below exponent
/// 1), halved as the doubled E2M1 values ask; 0 and 0x7F (E4M3's NaN) read as 0.
fn ue4m3(x: u8) -> f32 {
    if x == 0 || x == 0x7F {
        return 0.0;
    }
    let (exp, man) = (i32::from((x >> 3) & 0xF), f32::from(x & 0x7));
    let raw = if exp == 0 { man * 2f32.powi(-9) } else { (1.0 + man / 8.0) * 2f32.powi(exp - 7) };
    raw * 0.5
}

/// ggml-quants.c `dequantize_row_nvfp4`, one block: in each group of 16, byte j holds element j
/// in its low nibble and element j + 8 in its high one.
pub(crate) fn dequantize_block(b: &[u8], y: &mut [f32]) {
    let (scales, qs) = b.split_at(QK / GROUP);
    for (s, (group, y)) in qs.chunks_exact(GROUP / 2).zip(y.chunks_exact_mut(GROUP)).enumerate() {
        let d = ue4m3(scales[s]);
        for (j, q) in group.iter().enumerate() {
            y[j] = f32::from(KVALUES[usize::from(q & 0x0F)]) * d;
            y[j + GROUP / 2] = f32::from(KVALUES[usize::from(q >> 4)]) * d;
        }
    }
}

/// Group `g`'s 16 values as signed doubled E2M1 integers, in element order.
fn group_values(b: &[u8], g: usize) -> [i8; GROUP] {
    let qs = &b[QK / GROUP + g * GROUP / 2..][..GROUP / 2];
    std::array::from_fn(|j| {
        if j < GROUP / 2 { KVALUES[usize::from(qs[j] & 0x0F)] } else { KVALUES[usize::from(qs[j - GROUP / 2] >> 4)] }
    })
}

/// The activations' Q8_0 block and offset that group `g` of NVFP4 block `b` meets.
fn group_x(x: &[Q8Block], b: usize, g: usize) -> (&Q8Block, &[i8]) {
    let y = &x[2 * b + g / 2];
    (y, &y.qs[(g % 2) * GROUP..][..GROUP])
}

/// `row` · one token in the x86 AVX2 order (see the module's comment).
#[cfg_attr(target_arch = "aarch64", allow(dead_code))] // aarch64: the reference its tests compare against
fn dot_x86(row: &[u8], x: &[Q8Block]) -> f32 {
    let mut acc = [0f32; 8];
    for (b, block) in row.chunks_exact(BLOCK_BYTES).enumerate() {
        // Groups 0 and 1 (the first Q8_0 block) fill lanes 0-3 and 4-7, then groups 2 and 3.
        for pair in [[0, 1], [2, 3]] {
            for (half, g) in pair.into_iter().enumerate() {
                let (y, xs) = group_x(x, b, g);
                let s = ue4m3(block[g]) * y.d;
                let w = group_values(block, g);
                for k in 0..4 {
                    let lane: i32 = (4 * k..4 * k + 4).map(|e| i32::from(w[e]) * i32::from(xs[e])).sum();
                    acc[4 * half + k] = s.mul_add(lane as f32, acc[4 * half + k]);
                }
            }
        }
    }
    super::q8_k::hsum8(acc)
}

/// `row` · one token in the aarch64 NEON order (see the module's comment): the reference
/// `dot_neon`'s tests compare against, on every architecture.
#[cfg(test)]
fn dot_arm(row: &[u8], x: &[Q8Block]) -> f32 {
    let mut acc = [0f32; 4];
    for (b, block) in row.chunks_exact(BLOCK_BYTES).enumerate() {
        for (g, acc) in acc.iter_mut().enumerate() {
            let (y, xs) = group_x(x, b, g);
            let w = group_values(block, g);
            let sum: i32 = w.iter().zip(xs).map(|(w, x)| i32::from(*w) * i32::from(*x)).sum();
            // `vfmaq_f32(acc, vcvtq_f32_s32(sumi), ue4m3 · d_y)`.
            *acc = (sum as f32).mul_add(ue4m3(block[g]) * y.d, *acc);
        }
    }
    (acc[0] + acc[1]) + (acc[2] + acc[3])
}

/// `row` against `N` tokens in the x86 order, each block decoded once: ggml's AVX2 steps (the
/// table lookup, the groups put in element order, `maddubs` with the sign trick, `madd` by ones,
/// one fused multiply-add per group pair).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn dots_avx2<const N: usize>(row: &[u8], xs: [&[Q8Block]; N]) -> [f32; N] {
    use std::arch::x86_64::*;
    // SAFETY: a 16-byte load of the 16 values.
    let table = unsafe { _mm_loadu_si128(KVALUES.as_ptr().cast()) };
    let m4 = _mm_set1_epi8(0x0F);
    let ones = _mm256_set1_epi16(1);
    let mut acc = [_mm256_setzero_ps(); N];
    for (b, block) in row.chunks_exact(BLOCK_BYTES).enumerate() {
        let decode = |at: usize| {
            // SAFETY: 16 bytes of two groups' nibbles within the 36-byte block.
            let bits = unsafe { _mm_loadu_si128(block.as_ptr().add(at).cast()) };
            let lo = _mm_shuffle_epi8(table, _mm_and_si128(bits, m4));
            let hi = _mm_shuffle_epi8(table, _mm_and_si128(_mm_srli_epi16(bits, 4), m4));
            // Group 0's 8 low then 8 high nibbles, then group 1's: element order.
            _mm256_set_m128i(_mm_unpackhi_epi64(lo, hi), _mm_unpacklo_epi64(lo, hi))
        };
        let w = [decode(4), decode(20)];
        let abs = w.map(|w| _mm256_sign_epi8(w, w));
        let d = [0, 1, 2, 3].map(|g| ue4m3(block[g]));
        for (acc, x) in acc.iter_mut().zip(&xs) {
            for (p, (y, (w, abs))) in x[2 * b..2 * b + 2].iter().zip(w.iter().zip(&abs)).enumerate() {
                // SAFETY: a 32-byte load of the block's activations.
                let q8 = unsafe { _mm256_loadu_si256(y.qs.as_ptr().cast()) };
                let sums = _mm256_madd_epi16(_mm256_maddubs_epi16(*abs, _mm256_sign_epi8(q8, *w)), ones);
                let s = _mm256_set_m128(_mm_set1_ps(d[2 * p + 1] * y.d), _mm_set1_ps(d[2 * p] * y.d));
                *acc = _mm256_fmadd_ps(s, _mm256_cvtepi32_ps(sums), *acc);
            }
        }
    }
    acc.map(|a| super::matvec::hsum_avx2(a))
}

/// `row` · one token in the aarch64 order, each group's integer sum by widening NEON products
/// (base NEON: every aarch64 CPU); the float steps are `dot_arm`'s.
#[cfg(target_arch = "aarch64")]
fn dot_neon(row: &[u8], x: &[Q8Block]) -> f32 {
    use std::arch::aarch64::*;
    let mut acc = [0f32; 4];
    for (b, block) in row.chunks_exact(BLOCK_BYTES).enumerate() {
        for (g, acc) in acc.iter_mut().enumerate() {
            let (y, xs) = group_x(x, b, g);
            let w = group_values(block, g);
            // SAFETY: base NEON; 16-byte loads of the 16 values and the 16 activations.
            let sum = unsafe {
                let (w, x) = (vld1q_s8(w.as_ptr()), vld1q_s8(xs.as_ptr()));
                let lo = vmull_s8(vget_low_s8(w), vget_low_s8(x));
                let hi = vmull_high_s8(w, x);
                vaddvq_s32(vaddq_s32(vpaddlq_s16(lo), vpaddlq_s16(hi)))
            };
            *acc = (sum as f32).mul_add(ue4m3(block[g]) * y.d, *acc);
        }
    }
    (acc[0] + acc[1]) + (acc[2] + acc[3])
}

/// Tokens one decoding of a row's blocks serves.
#[cfg(target_arch = "x86_64")]
const TOKENS: usize = 4;

/// `x`: `[tokens, cols]` → `[tokens, rows]` over `rows` rows of `cols / 64` blocks.
pub(crate) fn matmul(bytes: &[u8], rows: usize, cols: usize, x: &Tensor) -> Result<Tensor> {
    let q8: Vec<Vec<Q8Block>> = activations(x)?.chunks_exact(cols).map(quantize_q8_1).collect();
    let tokens = q8.len();
    let row_bytes = cols / QK * BLOCK_BYTES;
    #[cfg(target_arch = "x86_64")]
    let avx2 = super::cpu::has_avx2();
    rows_by_tokens(rows, tokens, rows * cols * tokens, |r, out| {
        let row = &bytes[r * row_bytes..(r + 1) * row_bytes];
        #[cfg(target_arch = "aarch64")]
        out.iter_mut().zip(&q8).for_each(|(y, x)| *y = dot_neon(row, x));
        #[cfg(target_arch = "x86_64")]
        {
            if !avx2 {
                out.iter_mut().zip(&q8).for_each(|(y, x)| *y = dot_x86(row, x));
                return;
            }
            for (c, out) in out.chunks_mut(TOKENS).enumerate() {
                let x = |i: usize| &q8[c * TOKENS + i][..];
                // SAFETY: AVX2 and FMA were detected at run time.
                match out.len() {
                    1 => out[0] = unsafe { dots_avx2::<1>(row, [x(0)]) }[0],
                    2 => out.copy_from_slice(&unsafe { dots_avx2::<2>(row, [x(0), x(1)]) }),
                    3 => out.copy_from_slice(&unsafe { dots_avx2::<3>(row, [x(0), x(1), x(2)]) }),
                    _ => out.copy_from_slice(&unsafe { dots_avx2::<4>(row, [x(0), x(1), x(2), x(3)]) }),
                }
            }
        }
        #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
        out.iter_mut().zip(&q8).for_each(|(y, x)| *y = dot_x86(row, x));
    })
}

/// An NVFP4 matrix over its blocks as they lie: 4.5 bits a weight, not an f32 copy's 32.
pub(crate) struct Nvfp4Matrix {
    rows: usize,
    cols: usize,
    bytes: WeightBytes,
}

impl Nvfp4Matrix {
    /// `bytes` must hold `rows · cols / 64` blocks (the caller checked the shape).
    pub(crate) fn new(bytes: WeightBytes, rows: usize, cols: usize) -> Self {
        debug_assert!(bytes.as_slice().len() >= rows * cols / QK * BLOCK_BYTES);
        Nvfp4Matrix { rows, cols, bytes }
    }
}

impl super::q8_k::LowBitMatrix for Nvfp4Matrix {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        matmul(self.bytes.as_slice(), self.rows, self.cols, x)
    }

    fn dtype(&self) -> crate::dtype::WeightDType {
        crate::dtype::WeightDType::LowBit(crate::dtype::LowBit::Nvfp4)
    }

    fn cols(&self) -> usize {
        self.cols
    }

    fn row_bytes(&self, r: usize) -> &[u8] {
        let len = self.cols / QK * BLOCK_BYTES;
        &self.bytes.as_slice()[r * len..(r + 1) * len]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Random blocks whose scale bytes stay below E4M3's largest exponents (values of a few
    /// units), reproducibly.
    fn blocks(n: usize, seed: u64) -> Vec<u8> {
        let mut b = super::super::lattice::tests::random_blocks(BLOCK_BYTES, n, seed);
        for block in b.chunks_exact_mut(BLOCK_BYTES) {
            for s in &mut block[..4] {
                *s = 0x20 + *s % 0x30;
            }
        }
        b
    }

    /// The kernel's bits are this CPU's llama.cpp order for one token and several (each token
    /// its lone result), and both orders are the dequantized product up to f32 rounding.
    #[test]
    fn nvfp4_kernel_gives_llama_cpps_order_and_the_dequantized_product() {
        let (rows, cols, tokens) = (5, 3 * QK, 6);
        let bytes = blocks(rows * cols / QK, 7);
        let xs = super::super::q8::tests::random(tokens * cols, 9);
        let x = Tensor::from_vec(xs.clone(), (tokens, cols), &candle_core::Device::Cpu).unwrap();
        let got = matmul(&bytes, rows, cols, &x).unwrap().to_vec2::<f32>().unwrap();
        let row_bytes = cols / QK * BLOCK_BYTES;
        let mut w = vec![0f32; rows * cols];
        super::super::lowbit::dequantize(crate::dtype::LowBit::Nvfp4, &bytes, &mut w);
        for t in 0..tokens {
            let q8 = quantize_q8_1(&xs[t * cols..(t + 1) * cols]);
            let xq: Vec<f32> = q8.iter().flat_map(|b| b.qs.map(|q| q as f32 * b.d)).collect();
            let alone = matmul(&bytes, rows, cols, &x.narrow(0, t, 1).unwrap()).unwrap().to_vec2::<f32>().unwrap();
            for r in 0..rows {
                let row = &bytes[r * row_bytes..(r + 1) * row_bytes];
                let (x86, arm) = (dot_x86(row, &q8), dot_arm(row, &q8));
                let want = if cfg!(target_arch = "aarch64") { arm } else { x86 };
                assert_eq!(got[t][r].to_bits(), want.to_bits(), "token {t} row {r}: {} vs {want}", got[t][r]);
                assert_eq!(alone[0][r].to_bits(), want.to_bits(), "token {t} row {r} alone");
                let exact: f64 = w[r * cols..(r + 1) * cols].iter().zip(&xq).map(|(a, b)| *a as f64 * *b as f64).sum();
                let scale: f64 =
                    w[r * cols..(r + 1) * cols].iter().zip(&xq).map(|(a, b)| (*a as f64 * *b as f64).abs()).sum();
                for y in [x86, arm] {
                    assert!((y as f64 - exact).abs() <= 1e-5 * scale + 1e-6, "token {t} row {r}: {y} vs {exact}");
                }
            }
        }
    }
}
