//! Q4_K (4.5 bits a weight; most matrices of a Q4_K_M file) in llama.cpp's orders
//! (`k_quant.rs`): 8 sub-blocks of 32 with a 6-bit scale and a 6-bit minimum each. The minimums
//! meet the activations' sums of 32 (x86 quants.c AVX2 `ggml_vec_dot_q4_K_q8_K`: `_mm_hadd_epi16`
//! of the bsums, `_mm_madd_epi16` with the mins into 4 lanes), apart from the weight lanes.

use super::k_quant::{KQuant, Sums};
use super::lattice::{QK_K, half};
use super::q8_k::Q8K;

/// ggml-common.h `block_q4_K`: f16 d, f16 dmin, 12 bytes of packed 6-bit scales and mins,
/// 128 bytes of nibbles.
pub(crate) const BLOCK_BYTES: usize = 144;
const SCALES: usize = 4;
const QS: usize = 16;

/// The Q4_K type of [`super::k_quant::KQuantMatrix`].
#[derive(Default, Clone, Copy)]
pub struct Q4K;

/// Sub-block j's scale and minimum (ggml-quants.c `get_scale_min_k4`): j < 4 in the low 6 bits
/// of bytes j and j + 4; the others' low 4 bits in byte j + 4's nibbles, their high 2 bits in the
/// top bits of bytes j − 4 and j.
pub(crate) fn scale_min(b: &[u8], j: usize) -> (i32, i32) {
    let q = &b[SCALES..SCALES + 12];
    let (sc, m) = if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        ((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4), (q[j + 4] >> 4) | ((q[j] >> 6) << 4))
    };
    (sc as i32, m as i32)
}

/// Element e's nibble: each 64 shares 32 bytes, low nibbles its first 32, high its second.
fn code(b: &[u8], e: usize) -> i32 {
    ((b[QS + 32 * (e / 64) + e % 32] >> (4 * ((e % 64) / 32))) & 0xF) as i32
}

/// Lane i: the minimums of sub-blocks 2i and 2i+1 times their activations' sums of 32.
fn min_lanes(b: &[u8], bs: &[i32; 16]) -> [i32; 4] {
    let m = |j: usize| scale_min(b, j).1 * (bs[2 * j] + bs[2 * j + 1]);
    std::array::from_fn(|i| m(2 * i) + m(2 * i + 1))
}

impl KQuant for Q4K {
    const DTYPE: candle_core::quantized::GgmlDType = candle_core::quantized::GgmlDType::Q4K;
    const BYTES: usize = BLOCK_BYTES;
    const REPACKED_ON_AVX2: bool = true;
    const HAS_MIN: bool = true;

    fn d(block: &[u8]) -> (f32, f32) {
        (half(block, 0), half(block, 2))
    }

    fn dequantize(b: &[u8], out: &mut [f32]) {
        // d·scale and dmin·min first, then d1·q − m1 unfused (ggml-quants.c `dequantize_row_q4_K`).
        let (d, dmin) = Self::d(b);
        for (e, y) in out[..QK_K].iter_mut().enumerate() {
            let (sc, m) = scale_min(b, e / 32);
            let (d1, m1) = (d * sc as f32, dmin * m as f32);
            *y = d1 * code(b, e) as f32 - m1;
        }
    }

    fn sums_scalar(b: &[u8], x: &Q8K, bs: &[i32; 16]) -> Sums {
        let (mut lanes, mut quarters) = ([0i32; 8], [0i32; 4]);
        for e in 0..QK_K {
            let p = scale_min(b, e / 32).0 * code(b, e) * x.qs[e] as i32;
            lanes[(e % 32) / 4] += p;
            quarters[e / 64] += p;
        }
        Sums { lanes, mins: min_lanes(b, bs), quarters }
    }

    /// `maddubs` of the nibbles and the activations (no i16 saturation: 2·15·127 < 2^15), `madd`
    /// with the sub-block's scale.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    unsafe fn sums_avx2(b: &[u8], x: &Q8K, bs: &[i32; 16]) -> Sums {
        use std::arch::x86_64::*;
        assert!(b.len() >= BLOCK_BYTES);
        let m4 = _mm256_set1_epi8(0xF);
        let mut sum = _mm256_setzero_si256();
        let mut quarters = [0i32; 4];
        for (j, quarter) in quarters.iter_mut().enumerate() {
            // SAFETY: 32 of the 128 nibble bytes at 16 (asserted) and 64 of the 256 activations.
            let (bits, xl, xh) = unsafe {
                (
                    _mm256_loadu_si256(b.as_ptr().add(QS + 32 * j).cast()),
                    _mm256_loadu_si256(x.qs.as_ptr().add(64 * j).cast()),
                    _mm256_loadu_si256(x.qs.as_ptr().add(64 * j + 32).cast()),
                )
            };
            let lo = _mm256_and_si256(bits, m4);
            let hi = _mm256_and_si256(_mm256_srli_epi16::<4>(bits), m4);
            let sl = _mm256_set1_epi16(scale_min(b, 2 * j).0 as i16);
            let sh = _mm256_set1_epi16(scale_min(b, 2 * j + 1).0 as i16);
            let p = _mm256_add_epi32(
                _mm256_madd_epi16(_mm256_maddubs_epi16(lo, xl), sl),
                _mm256_madd_epi16(_mm256_maddubs_epi16(hi, xh), sh),
            );
            sum = _mm256_add_epi32(sum, p);
            *quarter = super::q8_k::hsum_epi32(p);
        }
        let mut lanes = [0i32; 8];
        // SAFETY: 32 bytes into an [i32; 8].
        unsafe { _mm256_storeu_si256(lanes.as_mut_ptr().cast(), sum) };
        Sums { lanes, mins: min_lanes(b, bs), quarters }
    }

    /// Each 16's nibbles against its activations (`sdot`, or `smull` and pairwise adds), times
    /// its sub-block's scale, in 4 i32 lanes.
    #[cfg(target_arch = "aarch64")]
    #[inline(always)]
    unsafe fn totals_neon<const SDOT: bool>(b: &[u8], x: &Q8K, bs: &[i32; 16]) -> (i32, i32) {
        use std::arch::aarch64::*;
        assert!(b.len() >= BLOCK_BYTES);
        // SAFETY: 16-byte loads within the block (asserted) and the 256 activations; base NEON;
        // `quad_sums` gets the caller's promise about dotprod.
        unsafe {
            let m4 = vdupq_n_u8(0xF);
            let mut acc = vdupq_n_s32(0);
            for j in 0..4 {
                for h in 0..2 {
                    let bits = vld1q_u8(b.as_ptr().add(QS + 32 * j + 16 * h));
                    let lo = vreinterpretq_s8_u8(vandq_u8(bits, m4));
                    let hi = vreinterpretq_s8_u8(vshrq_n_u8::<4>(bits));
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
    fn q4_k_simd_equals_scalar_and_both_orders_the_dequantized_product() {
        super::super::k_quant::tests::check_kernel::<Q4K>(fix);
    }

    #[test]
    fn q4_k_takes_the_repacked_order_where_llama_cpp_repacks() {
        use super::super::k_quant::Order;
        // A batch's whole fours take the gemm, the 1 to 3 tokens left the gemv.
        let q4 = |tokens: usize| (0..tokens).map(|t| Order::of::<Q4K>(576, tokens, t)).collect::<Vec<_>>();
        assert_eq!(q4(1), [Order::RepackedGemv]);
        assert_eq!(q4(6), [[Order::RepackedGemm; 4].as_slice(), &[Order::RepackedGemv; 2]].concat());
        assert_eq!(q4(8), [Order::RepackedGemm; 8]);
        assert_eq!([1, 9].map(|t| Order::of::<Q4K>(5, t, 0)), [Order::Vec, Order::Tiled]);
        assert_eq!([1, 9].map(|t| Order::of::<super::super::q6_k::Q6K>(576, t, 0)), [Order::Vec, Order::Tiled]);
    }

    #[test]
    fn q4_k_dequantizes_as_gguf_py_does() {
        super::super::k_quant::tests::dequantizes_as_gguf_py::<Q4K>("Q4_K");
    }

    #[test]
    fn q4_k_dequantizes_as_candle_does() {
        super::super::k_quant::tests::dequantizes_as_candle::<Q4K>(fix);
    }
}
