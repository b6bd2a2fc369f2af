//! Q3_K (3.44 bits a weight; the `ffn_down`s of a Q2_K file, most matrices of Q3_K_S/M/L) in
//! llama.cpp's orders (`k_quant.rs`): 2 low bits and a high bit per weight (the weight is
//! `low − 4` where the high bit is clear), a signed 6-bit scale per 16. No minimums: x86 quants.c
//! AVX2 `ggml_vec_dot_q3_K_q8_K` sums each 16's products into the usual 8 lanes.

use super::k_quant::{KQuant, Sums};
use super::lattice::{QK_K, half};
use super::q8_k::Q8K;

/// ggml-common.h `block_q3_K`: 32 bytes of high bits, 64 of 2-bit weights, 12 of packed 6-bit
/// scales, f16 d.
pub(crate) const BLOCK_BYTES: usize = 110;
const QS: usize = 32;
const SCALES: usize = 96;

/// The Q3_K type of [`super::k_quant::KQuantMatrix`].
#[derive(Default, Clone, Copy)]
pub struct Q3K;

/// Element e's weight: of each 128, 32-group j takes bits 2j, 2j+1 of qs bytes 0..31 and bit
/// 4·(e / 128) + j of hmask byte e % 32; −4 where that bit is clear.
fn weight(b: &[u8], e: usize) -> i32 {
    let (n, j, l) = (e / 128, (e % 128) / 32, e % 32);
    let low = ((b[QS + 32 * n + l] >> (2 * j)) & 3) as i32;
    let high = (b[l] >> (4 * n + j)) & 1;
    if high == 1 { low } else { low - 4 }
}

/// Scale s (ggml-quants.c `dequantize_row_q3_K`'s kmask unpacking): the low 4 bits from byte
/// s % 8's low (s < 8) or high nibble, the high 2 from bits 2·(s / 4) of byte 8 + s % 4; minus 32.
fn scale(b: &[u8], s: usize) -> i32 {
    let sc = &b[SCALES..SCALES + 12];
    let low = (sc[s % 8] >> (4 * (s / 8))) & 0xF;
    let high = (sc[8 + s % 4] >> (2 * (s / 4))) & 3;
    (low | high << 4) as i32 - 32
}

impl KQuant for Q3K {
    const DTYPE: candle_core::quantized::GgmlDType = candle_core::quantized::GgmlDType::Q3K;
    const BYTES: usize = BLOCK_BYTES;
    const REPACKED_ON_AVX2: bool = false;
    const HAS_MIN: bool = false;

    fn d(block: &[u8]) -> (f32, f32) {
        (half(block, 108), 0.0)
    }

    fn dequantize(b: &[u8], out: &mut [f32]) {
        // `d * (scale − 32)` first, then times the weight.
        let d = half(b, 108);
        for (e, y) in out[..QK_K].iter_mut().enumerate() {
            *y = d * scale(b, e / 16) as f32 * weight(b, e) as f32;
        }
    }

    fn sums_scalar(b: &[u8], x: &Q8K, _bs: &[i32; 16]) -> Sums {
        let mut lanes = [0i32; 8];
        for e in 0..QK_K {
            lanes[(e % 32) / 4] += scale(b, e / 16) * weight(b, e) * x.qs[e] as i32;
        }
        Sums { lanes, mins: [0; 4], quarters: [0; 4] }
    }

    /// `maddubs` of the low bits and of 4 where the high bit is clear, subtracted, then `madd`
    /// with each 16's scale (as ggml: every step exact).
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    unsafe fn sums_avx2(b: &[u8], x: &Q8K, _bs: &[i32; 16]) -> Sums {
        use std::arch::x86_64::*;
        assert!(b.len() >= BLOCK_BYTES);
        let (m3, one) = (_mm256_set1_epi8(3), _mm256_set1_epi8(1));
        // SAFETY: the 32 hmask bytes at 0 (asserted).
        let hbits = unsafe { _mm256_loadu_si256(b.as_ptr().cast()) };
        let mut sum = _mm256_setzero_si256();
        for n in 0..2 {
            // SAFETY: 32 of the 64 weight bytes at 32 (asserted).
            let bits = unsafe { _mm256_loadu_si256(b.as_ptr().add(QS + 32 * n).cast()) };
            for j in 0..4 {
                let low = _mm256_and_si256(_mm256_srl_epi16(bits, _mm_cvtsi32_si128(2 * j as i32)), m3);
                let set = _mm256_and_si256(_mm256_srl_epi16(hbits, _mm_cvtsi32_si128((4 * n + j) as i32)), one);
                let four = _mm256_slli_epi16::<2>(_mm256_xor_si256(set, one));
                // SAFETY: 32 activations within the block's 256.
                let x8 = unsafe { _mm256_loadu_si256(x.qs.as_ptr().add(128 * n + 32 * j).cast()) };
                let p16 = _mm256_sub_epi16(_mm256_maddubs_epi16(low, x8), _mm256_maddubs_epi16(four, x8));
                let s = 8 * n + 2 * j;
                let sc = _mm256_set_m128i(_mm_set1_epi16(scale(b, s + 1) as i16), _mm_set1_epi16(scale(b, s) as i16));
                sum = _mm256_add_epi32(sum, _mm256_madd_epi16(p16, sc));
            }
        }
        let mut lanes = [0i32; 8];
        // SAFETY: 32 bytes into an [i32; 8].
        unsafe { _mm256_storeu_si256(lanes.as_mut_ptr().cast(), sum) };
        Sums { lanes, mins: [0; 4], quarters: [0; 4] }
    }

    /// Each 16's weights against its activations (`sdot`, or `smull` and pairwise adds), times
    /// its scale, in 4 i32 lanes.
    #[cfg(target_arch = "aarch64")]
    #[inline(always)]
    unsafe fn totals_neon<const SDOT: bool>(b: &[u8], x: &Q8K, _bs: &[i32; 16]) -> (i32, i32) {
        use std::arch::aarch64::*;
        assert!(b.len() >= BLOCK_BYTES);
        // SAFETY: 16-byte loads within the block (asserted) and the 256 activations; base NEON;
        // `quad_sums` gets the caller's promise about dotprod.
        unsafe {
            let (m3, one, four) = (vdupq_n_u8(3), vdupq_n_u8(1), vdupq_n_s8(4));
            let mut acc = vdupq_n_s32(0);
            for g in 0..16 {
                // 16s g: 128-group n, 32-group j, half h of the 32.
                let (n, j, h) = (g / 8, (g % 8) / 2, g % 2);
                let bits = vld1q_u8(b.as_ptr().add(QS + 32 * n + 16 * h));
                let hm = vld1q_u8(b.as_ptr().add(16 * h));
                let low = vandq_u8(vshlq_u8(bits, vdupq_n_s8(-2 * j as i8)), m3);
                let set = vandq_u8(vshlq_u8(hm, vdupq_n_s8(-((4 * n + j) as i8))), one);
                // low − 4·(1 − set)
                let w = vsubq_s8(vreinterpretq_s8_u8(low), vmulq_s8(four, vreinterpretq_s8_u8(veorq_u8(set, one))));
                let p = super::arm::quad_sums::<SDOT>(w, vld1q_s8(x.qs.as_ptr().add(16 * g)));
                acc = vmlaq_n_s32(acc, p, scale(b, g));
            }
            (vaddvq_s32(acc), 0)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fix(b: &mut [u8]) {
        super::super::k_quant::tests::finite_half(b, 108, 0.002);
    }

    #[test]
    fn q3_k_simd_equals_scalar_and_both_orders_the_dequantized_product() {
        super::super::k_quant::tests::check_kernel::<Q3K>(fix);
    }

    #[test]
    fn q3_k_dequantizes_as_gguf_py_does() {
        super::super::k_quant::tests::dequantizes_as_gguf_py::<Q3K>("Q3_K");
    }

    #[test]
    fn q3_k_dequantizes_as_candle_does() {
        super::super::k_quant::tests::dequantizes_as_candle::<Q3K>(fix);
    }
}
