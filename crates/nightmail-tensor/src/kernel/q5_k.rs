//! Q5_K (5.5 bits a weight; the `ffn_down` and `attn_v` of a Q4_K_M or Q5_K_M file) in
//! llama.cpp's orders (`k_quant.rs`): Q4_K's sub-blocks, scales and minimums with a fifth bit per
//! weight. Its x86 AVX2 `ggml_vec_dot_q5_K_q8_K` keeps the minimums in one scalar chain
//! (`summs += dmin · imin`) where Q4_K's keeps 4 lanes, and its NEON one adds `d·isum − dmin·imin`
//! per super-block.

use super::k_quant::{KQuant, Sums};
use super::lattice::{QK_K, half};
use super::q4_k::scale_min;
use super::q8_k::Q8K;

/// ggml-common.h `block_q5_K`: f16 d, f16 dmin, 12 bytes of packed 6-bit scales and mins
/// (Q4_K's), 32 bytes of high bits, 128 bytes of nibbles.
pub(crate) const BLOCK_BYTES: usize = 176;
const QH: usize = 16;
const QS: usize = 48;

/// The Q5_K type of [`super::k_quant::KQuantMatrix`].
#[derive(Default, Clone, Copy)]
pub struct Q5K;

/// Element e's code: Q4_K's nibble, plus 16 where bit 2·(e / 64) + (e % 64) / 32 of qh byte
/// e % 32 is set.
fn code(b: &[u8], e: usize) -> i32 {
    let (j, h, l) = (e / 64, (e % 64) / 32, e % 32);
    let low = (b[QS + 32 * j + l] >> (4 * h)) & 0xF;
    let high = (b[QH + l] >> (2 * j + h)) & 1;
    (low | high << 4) as i32
}

/// Lane i: the minimums of sub-blocks 2i and 2i+1 times their activations' sums of 32.
fn min_lanes(b: &[u8], bs: &[i32; 16]) -> [i32; 4] {
    let m = |j: usize| scale_min(b, j).1 * (bs[2 * j] + bs[2 * j + 1]);
    std::array::from_fn(|i| m(2 * i) + m(2 * i + 1))
}

impl KQuant for Q5K {
    const DTYPE: candle_core::quantized::GgmlDType = candle_core::quantized::GgmlDType::Q5K;
    const BYTES: usize = BLOCK_BYTES;
    const REPACKED_ON_AVX2: bool = false;
    const HAS_MIN: bool = true;
    const MINS_APART: bool = true;

    fn d(block: &[u8]) -> (f32, f32) {
        (half(block, 0), half(block, 2))
    }

    fn dequantize(b: &[u8], out: &mut [f32]) {
        // d·scale and dmin·min first, then d1·q − m1 unfused (ggml-quants.c `dequantize_row_q5_K`).
        let (d, dmin) = Self::d(b);
        for (e, y) in out[..QK_K].iter_mut().enumerate() {
            let (sc, m) = scale_min(b, e / 32);
            let (d1, m1) = (d * sc as f32, dmin * m as f32);
            *y = d1 * code(b, e) as f32 - m1;
        }
    }

    fn sums_scalar(b: &[u8], x: &Q8K, bs: &[i32; 16]) -> Sums {
        let mut lanes = [0i32; 8];
        for e in 0..QK_K {
            lanes[(e % 32) / 4] += scale_min(b, e / 32).0 * code(b, e) * x.qs[e] as i32;
        }
        Sums { lanes, mins: min_lanes(b, bs), quarters: [0; 4] }
    }

    /// `maddubs` of the 5-bit codes and the activations (2·31·127 < 2^15: no saturation), `madd`
    /// with the sub-block's scale.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    unsafe fn sums_avx2(b: &[u8], x: &Q8K, bs: &[i32; 16]) -> Sums {
        use std::arch::x86_64::*;
        assert!(b.len() >= BLOCK_BYTES);
        let (m4, one) = (_mm256_set1_epi8(0xF), _mm256_set1_epi8(1));
        // SAFETY: the 32 high-bit bytes at 16 (asserted).
        let hbits = unsafe { _mm256_loadu_si256(b.as_ptr().add(QH).cast()) };
        let mut sum = _mm256_setzero_si256();
        for j in 0..4 {
            // SAFETY: 32 of the 128 nibble bytes at 48 (asserted) and 64 of the 256 activations.
            let (bits, xl, xh) = unsafe {
                (
                    _mm256_loadu_si256(b.as_ptr().add(QS + 32 * j).cast()),
                    _mm256_loadu_si256(x.qs.as_ptr().add(64 * j).cast()),
                    _mm256_loadu_si256(x.qs.as_ptr().add(64 * j + 32).cast()),
                )
            };
            let high = |bit: usize| {
                let h = _mm256_and_si256(_mm256_srl_epi16(hbits, _mm_cvtsi32_si128(bit as i32)), one);
                _mm256_slli_epi16::<4>(h)
            };
            let lo = _mm256_or_si256(_mm256_and_si256(bits, m4), high(2 * j));
            let hi = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16::<4>(bits), m4), high(2 * j + 1));
            let sl = _mm256_set1_epi16(scale_min(b, 2 * j).0 as i16);
            let sh = _mm256_set1_epi16(scale_min(b, 2 * j + 1).0 as i16);
            let p = _mm256_add_epi32(
                _mm256_madd_epi16(_mm256_maddubs_epi16(lo, xl), sl),
                _mm256_madd_epi16(_mm256_maddubs_epi16(hi, xh), sh),
            );
            sum = _mm256_add_epi32(sum, p);
        }
        let mut lanes = [0i32; 8];
        // SAFETY: 32 bytes into an [i32; 8].
        unsafe { _mm256_storeu_si256(lanes.as_mut_ptr().cast(), sum) };
        Sums { lanes, mins: min_lanes(b, bs), quarters: [0; 4] }
    }

    /// Each 16's codes against its activations (`sdot`, or `smull` and pairwise adds), times its
    /// sub-block's scale, in 4 i32 lanes.
    #[cfg(target_arch = "aarch64")]
    #[inline(always)]
    unsafe fn totals_neon<const SDOT: bool>(b: &[u8], x: &Q8K, bs: &[i32; 16]) -> (i32, i32) {
        use std::arch::aarch64::*;
        assert!(b.len() >= BLOCK_BYTES);
        // SAFETY: 16-byte loads within the block (asserted) and the 256 activations; base NEON;
        // `quad_sums` gets the caller's promise about dotprod.
        unsafe {
            let (m4, one) = (vdupq_n_u8(0xF), vdupq_n_u8(1));
            let qh = [vld1q_u8(b.as_ptr().add(QH)), vld1q_u8(b.as_ptr().add(QH + 16))];
            let mut acc = vdupq_n_s32(0);
            for j in 0..4 {
                for (h, &qh) in qh.iter().enumerate() {
                    let bits = vld1q_u8(b.as_ptr().add(QS + 32 * j + 16 * h));
                    // Bit 2j (low nibbles) and 2j + 1 (high) of the qh bytes, moved to bit 4.
                    let high = |bit: i8| vshlq_n_u8::<4>(vandq_u8(vshlq_u8(qh, vdupq_n_s8(-bit)), one));
                    let lo = vreinterpretq_s8_u8(vorrq_u8(vandq_u8(bits, m4), high(2 * j as i8)));
                    let hi = vreinterpretq_s8_u8(vorrq_u8(vshrq_n_u8::<4>(bits), high(2 * j as i8 + 1)));
                    let xl = vld1q_s8(x.qs.as_ptr().add(64 * j + 16 * h));
                    let xh = vld1q_s8(x.qs.as_ptr().add(64 * j + 32 + 16 * h));
                    acc = vmlaq_n_s32(acc, super::arm::quad_sums::<SDOT>(lo, xl), scale_min(b, 2 * j).0);
                    acc = vmlaq_n_s32(acc, super::arm::quad_sums::<SDOT>(hi, xh), scale_min(b, 2 * j + 1).0);
                }
            }
            (vaddvq_s32(acc), min_lanes(b, bs).iter().sum())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fix(b: &mut [u8]) {
        super::super::k_quant::tests::finite_half(b, 0, 0.002);
        super::super::k_quant::tests::finite_half(b, 2, 0.001);
    }

    #[test]
    fn q5_k_simd_equals_scalar_and_both_orders_the_dequantized_product() {
        super::super::k_quant::tests::check_kernel::<Q5K>(fix);
    }

    #[test]
    fn q5_k_dequantizes_as_gguf_py_does() {
        super::super::k_quant::tests::dequantizes_as_gguf_py::<Q5K>("Q5_K");
    }

    #[test]
    fn q5_k_dequantizes_as_candle_does() {
        super::super::k_quant::tests::dequantizes_as_candle::<Q5K>(fix);
    }
}
