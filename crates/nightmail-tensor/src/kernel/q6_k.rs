//! Q6_K (6.56 bits a weight; the output and some FFN matrices of a Q4_K_M file) in llama.cpp's
//! orders (`k_quant.rs`). ggml's kernels multiply the unsigned 6-bit codes and take the bias of
//! 32 off with the activations' sums of 16 (x86 quants.c AVX2 `ggml_vec_dot_q6_K_q8_K`: lane k
//! loses 32·(bsum[2k]·sc[2k] + bsum[2k+1]·sc[2k+1]); the NEON one and the tiled mat-mul the same
//! in total), which is exact, so our integer sums equal theirs lane for lane.

use super::k_quant::{KQuant, Sums};
use super::lattice::{QK_K, half};
use super::q8_k::Q8K;

/// ggml-common.h `block_q6_K`: 128 bytes of low nibbles, 64 of high bit pairs, 16 signed
/// scales (one per 16 weights), f16 d.
pub(crate) const BLOCK_BYTES: usize = 210;
const QH: usize = 128;
const SCALES: usize = 192;

/// The Q6_K type of [`super::k_quant::KQuantMatrix`].
#[derive(Default, Clone, Copy)]
pub struct Q6K;

/// Element e's unsigned code: of each 128, 32-element group j takes the low (j = 0, 1) or high
/// (j = 2, 3) nibbles of ql bytes 0..31 (even j) or 32..63 (odd j), and bits 2j, 2j+1 of qh.
fn code(b: &[u8], e: usize) -> i32 {
    let (n, j, l) = (e / 128, (e % 128) / 32, e % 32);
    let low = (b[64 * n + 32 * (j % 2) + l] >> (4 * (j / 2))) & 0xF;
    let high = (b[QH + 32 * n + l] >> (2 * j)) & 3;
    (low | high << 4) as i32
}

fn scale(b: &[u8], s: usize) -> i32 {
    b[SCALES + s] as i8 as i32
}

/// Lane k's bias: 32 times the scaled sums of the 16s 2k and 2k+1 (`_mm256_madd_epi16` of the
/// bsums and the scales, shifted left by 5).
fn bias_lanes(b: &[u8], bs: &[i32; 16]) -> [i32; 8] {
    std::array::from_fn(|k| 32 * (bs[2 * k] * scale(b, 2 * k) + bs[2 * k + 1] * scale(b, 2 * k + 1)))
}

impl KQuant for Q6K {
    const DTYPE: candle_core::quantized::GgmlDType = candle_core::quantized::GgmlDType::Q6K;
    const BYTES: usize = BLOCK_BYTES;
    const REPACKED_ON_AVX2: bool = false;
    const HAS_MIN: bool = false;

    fn d(block: &[u8]) -> (f32, f32) {
        (half(block, 208), 0.0)
    }

    fn dequantize(b: &[u8], out: &mut [f32]) {
        // `d * sc` first, then times the centred code (ggml-quants.c `dequantize_row_q6_K`).
        let d = half(b, 208);
        for (e, y) in out[..QK_K].iter_mut().enumerate() {
            *y = d * scale(b, e / 16) as f32 * (code(b, e) - 32) as f32;
        }
    }

    fn sums_scalar(b: &[u8], x: &Q8K, bs: &[i32; 16]) -> Sums {
        let mut lanes = bias_lanes(b, bs).map(|v| -v);
        for e in 0..QK_K {
            lanes[(e % 32) / 4] += scale(b, e / 16) * code(b, e) * x.qs[e] as i32;
        }
        Sums { lanes, mins: [0; 4], quarters: [0; 4] }
    }

    /// `maddubs` of the codes (≤ 63) and the activations (|x| ≤ 127: no i16 saturation), `madd`
    /// with each 16's scale.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    unsafe fn sums_avx2(b: &[u8], x: &Q8K, bs: &[i32; 16]) -> Sums {
        use std::arch::x86_64::*;
        assert!(b.len() >= BLOCK_BYTES);
        let (m3, m15) = (_mm256_set1_epi8(3), _mm256_set1_epi8(15));
        let mut sum = _mm256_setzero_si256();
        for n in 0..2 {
            // SAFETY: 32-byte loads within the block's ql (0..128) and qh (128..192), asserted above.
            let (l0, l1, h) = unsafe {
                (
                    _mm256_loadu_si256(b.as_ptr().add(64 * n).cast()),
                    _mm256_loadu_si256(b.as_ptr().add(64 * n + 32).cast()),
                    _mm256_loadu_si256(b.as_ptr().add(QH + 32 * n).cast()),
                )
            };
            for j in 0..4 {
                let ql = if j % 2 == 0 { l0 } else { l1 };
                let low = _mm256_and_si256(_mm256_srl_epi16(ql, _mm_cvtsi32_si128(4 * (j / 2) as i32)), m15);
                let high = _mm256_and_si256(_mm256_srl_epi16(h, _mm_cvtsi32_si128(2 * j as i32)), m3);
                let q = _mm256_or_si256(low, _mm256_slli_epi16::<4>(high));
                // SAFETY: 32 activations within the block's 256.
                let x8 = unsafe { _mm256_loadu_si256(x.qs.as_ptr().add(128 * n + 32 * j).cast()) };
                let s = 8 * n + 2 * j;
                let sc = _mm256_set_m128i(_mm_set1_epi16(scale(b, s + 1) as i16), _mm_set1_epi16(scale(b, s) as i16));
                sum = _mm256_add_epi32(sum, _mm256_madd_epi16(_mm256_maddubs_epi16(q, x8), sc));
            }
        }
        let mut lanes = [0i32; 8];
        // SAFETY: 32 bytes into an [i32; 8].
        unsafe { _mm256_storeu_si256(lanes.as_mut_ptr().cast(), sum) };
        for (l, bias) in lanes.iter_mut().zip(bias_lanes(b, bs)) {
            *l -= bias;
        }
        Sums { lanes, mins: [0; 4], quarters: [0; 4] }
    }

    /// Each 16's codes against its activations (`sdot`, or `smull` and pairwise adds), times its
    /// scale, in 4 i32 lanes; then the bias.
    #[cfg(target_arch = "aarch64")]
    #[inline(always)]
    unsafe fn totals_neon<const SDOT: bool>(b: &[u8], x: &Q8K, bs: &[i32; 16]) -> (i32, i32) {
        use std::arch::aarch64::*;
        assert!(b.len() >= BLOCK_BYTES);
        // SAFETY: 16-byte loads within the block (asserted) and the 256 activations; base NEON;
        // `quad_sums` gets the caller's promise about dotprod.
        unsafe {
            let (m3, m15) = (vdupq_n_u8(3), vdupq_n_u8(15));
            let mut acc = vdupq_n_s32(0);
            for g in 0..16 {
                // 16s g: 128-group n, 32-group j, half h of the 32.
                let (n, j, h) = (g / 8, (g % 8) / 2, g % 2);
                let ql = vld1q_u8(b.as_ptr().add(64 * n + 32 * (j % 2) + 16 * h));
                let low = if j / 2 == 0 { vandq_u8(ql, m15) } else { vshrq_n_u8::<4>(ql) };
                let qh = vld1q_u8(b.as_ptr().add(QH + 32 * n + 16 * h));
                let high = match j {
                    0 => vandq_u8(qh, m3),
                    1 => vandq_u8(vshrq_n_u8::<2>(qh), m3),
                    2 => vandq_u8(vshrq_n_u8::<4>(qh), m3),
                    _ => vshrq_n_u8::<6>(qh),
                };
                let q = vreinterpretq_s8_u8(vorrq_u8(low, vshlq_n_u8::<4>(high)));
                let p = super::arm::quad_sums::<SDOT>(q, vld1q_s8(x.qs.as_ptr().add(16 * g)));
                acc = vmlaq_n_s32(acc, p, scale(b, g));
            }
            let bias: i32 = (0..16).map(|g| scale(b, g) * bs[g]).sum();
            (vaddvq_s32(acc) - 32 * bias, 0)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn q6_k_simd_equals_scalar_and_both_orders_the_dequantized_product() {
        super::super::k_quant::tests::check_kernel::<Q6K>(fix);
    }

    #[test]
    fn q6_k_dequantizes_as_gguf_py_does() {
        super::super::k_quant::tests::dequantizes_as_gguf_py::<Q6K>("Q6_K");
    }

    #[test]
    fn q6_k_dequantizes_as_candle_does() {
        super::super::k_quant::tests::dequantizes_as_candle::<Q6K>(fix);
    }

    fn fix(b: &mut [u8]) {
        super::super::k_quant::tests::finite_half(b, 208, 0.002);
    }
}
