//! ggml's CPU arithmetic for the ops around the mat-vecs, in ggml's order, so that a quantized
//! GGUF model picks the tokens llama.cpp picks: near-tied logits are common enough (SmolLM2 has a
//! few per 20 prompts) that rounding differences alone flip greedy choices. Each function names
//! the ggml code it follows (llama.cpp `ggml/src/ggml-cpu`, the x86 AVX2/FMA/F16C build: `ops.cpp`,
//! `vec.h`, `vec.cpp`, `simd-mappings.h`, `llamafile/sgemm.cpp`).
//!
//! GCC builds ggml with `-ffp-contract=fast`, so a C `a * b + c` there is one fused multiply-add:
//! the scalar code below writes those as `mul_add`.

use candle_core::quantized::GgmlDType;
use half::f16;

use crate::dtype::WeightDType;

/// How a model computes the parts around its weights' mat-vecs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Numerics {
    /// f32 math that matches transformers within 1e-4 (safetensors, float GGUF files).
    #[default]
    Reference,
    /// ggml's CPU ops: RMS sums in f64, keys, values, queries and probabilities in f16 (llama.cpp's
    /// default KV cache type), `ggml_v_expf` for softmax and SiLU, rope angles by repeated products.
    Ggml,
}

impl Numerics {
    /// `Ggml` for a model whose dense weights are ggml blocks (a file made for llama.cpp, which
    /// users compare against), `Reference` for float weights.
    pub fn for_weights(dtype: WeightDType) -> Self {
        match dtype {
            WeightDType::Ggml(GgmlDType::F32 | GgmlDType::F16 | GgmlDType::BF16) | WeightDType::Mxfp4 => {
                Numerics::Reference
            }
            WeightDType::Ggml(_) | WeightDType::LowBit(_) => Numerics::Ggml,
        }
    }
}

/// `ggml_compute_forward_rms_norm_f32` then the weight's `ggml_mul` (fused or not, the same
/// products): Σx² in double of f32 squares, scale = 1/sqrtf(mean + eps) in f32, y = x·scale·w.
pub fn rms_norm(x: &[f32], w: &[f32], eps: f32, y: &mut [f32]) {
    let sum: f64 = x.iter().map(|v| (v * v) as f64).sum();
    let mean = (sum / x.len() as f64) as f32;
    let scale = 1.0 / (mean + eps).sqrt();
    for ((y, x), w) in y.iter_mut().zip(x).zip(w) {
        *y = x * scale * w;
    }
}

/// One lane of `ggml_v_expf` (AVX2 + FMA; after ARM's optimized-routines expf, max error 1.45
/// ulp): the same operations and roundings, so results are bit-identical to the vector code.
#[inline(always)]
pub(crate) fn expf(x: f32) -> f32 {
    let r = f32::from_bits(0x4b40_0000); // 0x1.8p23
    let z = x.mul_add(f32::from_bits(0x3fb8_aa3b), r); // log2(e)
    let n = z - r;
    // _mm256_fnmadd_ps(a, b, c) = c - a·b, rounded once.
    let b = (-n).mul_add(f32::from_bits(0x35bf_be8e), (-n).mul_add(f32::from_bits(0x3f31_7200), x));
    let e = z.to_bits() << 23;
    let k = f32::from_bits(e.wrapping_add(1f32.to_bits()));
    let u = b * b;
    let j = f32::from_bits(0x3c07_2010)
        .mul_add(b, f32::from_bits(0x3d2b_9f17))
        .mul_add(u, f32::from_bits(0x3e2a_af33).mul_add(b, f32::from_bits(0x3eff_fedb)))
        .mul_add(u, f32::from_bits(0x3f7f_fff6) * b);
    if n.abs() <= 126.0 || n.is_nan() {
        return j.mul_add(k, k);
    }
    let g: u32 = if n <= 0.0 { 0x8200_0000 } else { 0 };
    let s1 = f32::from_bits(g.wrapping_add(0x7f00_0000));
    let s2 = f32::from_bits(e.wrapping_sub(g));
    if n.abs() > 192.0 { s1 * s1 } else { s2.mul_add(j, s2) * s1 }
}

/// `ggml_vec_swiglu_f32`: `ggml_v_silu(g) · u`, with `ggml_v_silu(x) = x / (1 + ggml_v_expf(-x))`;
/// the tail past a multiple of 8 with libm's expf, as ggml's scalar loop does.
pub fn swiglu(g: &[f32], u: &[f32]) -> Vec<f32> {
    #[cfg(target_arch = "x86_64")]
    if crate::kernel::cpu::has_avx2() {
        // SAFETY: AVX2 and FMA were detected at run time.
        return unsafe { swiglu_fma(g, u) };
    }
    swiglu_lanes(g, u)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn swiglu_fma(g: &[f32], u: &[f32]) -> Vec<f32> {
    swiglu_lanes(g, u)
}

// Plain loops here and below, not iterator closures: a closure compiled inside a std generic
// (`Vec::from_iter`) loses the caller's FMA feature, and each `mul_add` becomes a libm call.
#[inline(always)]
fn swiglu_lanes(g: &[f32], u: &[f32]) -> Vec<f32> {
    let vector = g.len() / 8 * 8;
    let mut y = vec![0f32; g.len()];
    for i in 0..g.len() {
        let x = g[i];
        let e = if i < vector { expf(-x) } else { (-x).exp() };
        y[i] = x / (1.0 + e) * u[i];
    }
    y
}

/// `ggml_compute_forward_soft_max_f32` over one row of scores, in place: w = s·scale (keys outside
/// `visible` masked to -inf, as llama.cpp's KQ mask does), m = max w, e = ggml_v_expf(w - m) eight
/// at a time with each eight summed in f32 (`hsum_float_8`'s order) into a double, then
/// p = e · (float)(1/Σ).
pub fn soft_max(row: &mut [f32], visible: std::ops::Range<usize>, scale: f32) {
    #[cfg(target_arch = "x86_64")]
    if crate::kernel::cpu::has_avx2() {
        // SAFETY: AVX2 and FMA were detected at run time.
        return unsafe { soft_max_fma(row, visible, scale) };
    }
    soft_max_lanes(row, visible, scale)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn soft_max_fma(row: &mut [f32], visible: std::ops::Range<usize>, scale: f32) {
    soft_max_lanes(row, visible, scale)
}

#[inline(always)]
fn soft_max_lanes(row: &mut [f32], visible: std::ops::Range<usize>, scale: f32) {
    let mut max = f32::NEG_INFINITY;
    for (j, w) in row.iter_mut().enumerate() {
        *w = if visible.contains(&j) { *w * scale } else { f32::NEG_INFINITY };
        max = max.max(*w);
    }
    let mut sum = 0f64;
    // llama.cpp pads the cache's key count to 256, so every eight is whole: masked keys are 0.
    for chunk in row.chunks_mut(8) {
        let mut lanes = [0f32; 8];
        for l in 0..chunk.len() {
            chunk[l] = expf(chunk[l] - max);
            lanes[l] = chunk[l];
        }
        sum += hsum8(lanes) as f64;
    }
    let inv = (1.0 / sum) as f32;
    for w in row.iter_mut() {
        *w *= inv;
    }
}

/// `hsum_float_8` (and tinyBLAS's `hsum`): (high + low) halves, then pairs two apart, then the two.
#[inline(always)]
fn hsum8(v: [f32; 8]) -> f32 {
    let h = [v[4] + v[0], v[5] + v[1], v[6] + v[2], v[7] + v[3]];
    (h[0] + h[2]) + (h[1] + h[3])
}

/// Which of ggml's two f16 dot-product orders a KQ or KQV product uses: a batch of several
/// tokens goes through llamafile's tinyBLAS (`llamafile_sgemm`, n ≥ 2), one token through
/// `ggml_vec_dot_f16`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DotOrder {
    /// `ggml_vec_dot_f16`: four 8-lane accumulators over steps of 32, reduced as
    /// `GGML_F32x8_REDUCE` does ((0+2) + (1+3), halves added, then two horizontal adds).
    VecDot,
    /// `tinyBLAS<8, __m256, __m256, ggml_fp16_t, ggml_fp16_t, float>::gemm_bloc`: one 8-lane
    /// accumulator, then `hsum`.
    Gemm,
}

/// x·y in f32 from f16 inputs, as ggml does it in `order`, over `padded` elements (x and y are
/// zero past their length: llama.cpp's key count is padded to 256 with masked, zero-weight keys).
pub fn dot_f16(order: DotOrder, x: &[f16], y: &[f16], padded: usize) -> f32 {
    // A real assert, not a debug one (the engine builds without debug assertions): the AVX2 paths
    // read both slices up to the longer length.
    assert!(x.len() == y.len() && padded >= x.len(), "dot_f16 of {} and {} elements over {padded}", x.len(), y.len());
    #[cfg(target_arch = "x86_64")]
    if crate::kernel::matvec::has_avx2_f16c() {
        // SAFETY: AVX2, FMA and F16C were detected at run time.
        return unsafe {
            match order {
                DotOrder::VecDot => dot_vec_avx2(x, y, padded),
                DotOrder::Gemm => dot_gemm_avx2(x, y),
            }
        };
    }
    match order {
        DotOrder::VecDot => dot_vec_scalar(x, y, padded),
        DotOrder::Gemm => dot_gemm_scalar(x, y),
    }
}

/// Elements `i..i + 8` of `x`, widened, zero past its end.
#[inline(always)]
fn eight(x: &[f16], i: usize) -> [f32; 8] {
    std::array::from_fn(|l| x.get(i + l).map_or(0.0, |v| v.to_f32()))
}

fn dot_vec_scalar(x: &[f16], y: &[f16], padded: usize) -> f32 {
    let steps = padded / 32 * 32;
    let mut acc = [[0f32; 8]; 4];
    for i in (0..steps).step_by(32) {
        for (j, a) in acc.iter_mut().enumerate() {
            let (xv, yv) = (eight(x, i + 8 * j), eight(y, i + 8 * j));
            for l in 0..8 {
                a[l] = xv[l].mul_add(yv[l], a[l]);
            }
        }
    }
    let s: [f32; 8] = std::array::from_fn(|l| (acc[0][l] + acc[2][l]) + (acc[1][l] + acc[3][l]));
    let t = [s[0] + s[4], s[1] + s[5], s[2] + s[6], s[3] + s[7]];
    let mut sum = ((t[0] + t[1]) + (t[2] + t[3])) as f64;
    // ggml's leftovers: products in f32, summed in double.
    for i in steps..x.len() {
        sum += (x[i].to_f32() * y[i].to_f32()) as f64;
    }
    sum as f32
}

fn dot_gemm_scalar(x: &[f16], y: &[f16]) -> f32 {
    let mut acc = [0f32; 8];
    for i in (0..x.len()).step_by(8) {
        let (xv, yv) = (eight(x, i), eight(y, i));
        for l in 0..8 {
            acc[l] = xv[l].mul_add(yv[l], acc[l]);
        }
    }
    hsum8(acc)
}

/// Elements `i..i + 8` widened: straight from memory when all are there, else zero-padded.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn load8(x: &[f16], i: usize) -> std::arch::x86_64::__m256 {
    use std::arch::x86_64::*;
    if i + 8 <= x.len() {
        // SAFETY: elements i..i+8 are in x.
        _mm256_cvtph_ps(unsafe { _mm_loadu_si128(x.as_ptr().add(i).cast()) })
    } else {
        let v = eight(x, i);
        // SAFETY: an 8-float array.
        unsafe { _mm256_loadu_ps(v.as_ptr()) }
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_vec_avx2(x: &[f16], y: &[f16], padded: usize) -> f32 {
    use std::arch::x86_64::*;
    let steps = padded / 32 * 32;
    let mut acc = [_mm256_setzero_ps(); 4];
    // Past the data, every step adds only zeros.
    let data_steps = steps.min(x.len().div_ceil(32) * 32);
    let whole = steps.min(x.len() / 32 * 32);
    let (px, py) = (x.as_ptr(), y.as_ptr());
    for i in (0..whole).step_by(32) {
        for (j, a) in acc.iter_mut().enumerate() {
            // SAFETY: i + 8j + 8 <= whole <= len.
            let (xv, yv) = unsafe {
                (
                    _mm256_cvtph_ps(_mm_loadu_si128(px.add(i + 8 * j).cast())),
                    _mm256_cvtph_ps(_mm_loadu_si128(py.add(i + 8 * j).cast())),
                )
            };
            *a = _mm256_fmadd_ps(xv, yv, *a);
        }
    }
    if whole < data_steps {
        // The last, partial step: its elements copied once into zero-padded blocks.
        let (mut tx, mut ty) = ([f16::ZERO; 32], [f16::ZERO; 32]);
        tx[..x.len() - whole].copy_from_slice(&x[whole..]);
        ty[..y.len() - whole].copy_from_slice(&y[whole..]);
        for (j, a) in acc.iter_mut().enumerate() {
            // SAFETY: 8 elements within the 32-element blocks.
            let (xv, yv) = unsafe {
                (
                    _mm256_cvtph_ps(_mm_loadu_si128(tx.as_ptr().add(8 * j).cast())),
                    _mm256_cvtph_ps(_mm_loadu_si128(ty.as_ptr().add(8 * j).cast())),
                )
            };
            *a = _mm256_fmadd_ps(xv, yv, *a);
        }
    }
    let s = _mm256_add_ps(_mm256_add_ps(acc[0], acc[2]), _mm256_add_ps(acc[1], acc[3]));
    let t0 = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
    let t1 = _mm_hadd_ps(t0, t0);
    let mut sum = _mm_cvtss_f32(_mm_hadd_ps(t1, t1)) as f64;
    for i in steps..x.len() {
        sum += (x[i].to_f32() * y[i].to_f32()) as f64;
    }
    sum as f32
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_gemm_avx2(x: &[f16], y: &[f16]) -> f32 {
    use std::arch::x86_64::*;
    let mut acc = _mm256_setzero_ps();
    let whole = x.len() / 8 * 8;
    let (px, py) = (x.as_ptr(), y.as_ptr());
    for i in (0..whole).step_by(8) {
        // SAFETY: i + 8 <= whole <= len.
        let (xv, yv) = unsafe {
            (_mm256_cvtph_ps(_mm_loadu_si128(px.add(i).cast())), _mm256_cvtph_ps(_mm_loadu_si128(py.add(i).cast())))
        };
        acc = _mm256_fmadd_ps(xv, yv, acc);
    }
    if whole < x.len() {
        acc = _mm256_fmadd_ps(load8(x, whole), load8(y, whole), acc);
    }
    crate::kernel::matvec::hsum_avx2(acc)
}

/// ggml's rope cache (`ggml_rope_cache_init` with no YaRN, freq_scale 1): θ starts at the
/// position and is multiplied by θ_scale = base^(-2/n_dims) once per pair; cosf and sinf in f32.
pub fn rope_angles(position: usize, pairs: usize, base: f32) -> Vec<(f32, f32)> {
    let theta_scale = base.powf(-2.0 / (2 * pairs) as f32);
    let mut theta = position as f32;
    (0..pairs)
        .map(|_| {
            let cs = (theta.cos(), theta.sin());
            theta *= theta_scale;
            cs
        })
        .collect()
}

/// `rotate_pairs` over one head's row: pair k is (2k, 2k + 1) in ggml's NORMAL mode
/// (`interleaved`) or (k, k + n/2) in NEOX; x0·cos − x1·sin and x0·sin + x1·cos, each with its
/// first product fused (GCC contracts `a*b - c*d` to fma(a, b, -(c*d))).
pub fn rotate(row: &mut [f32], angles: &[(f32, f32)], interleaved: bool) {
    #[cfg(target_arch = "x86_64")]
    if crate::kernel::cpu::has_avx2() {
        // SAFETY: AVX2 and FMA were detected at run time.
        return unsafe { rotate_fma(row, angles, interleaved) };
    }
    rotate_pairs(row, angles, interleaved)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn rotate_fma(row: &mut [f32], angles: &[(f32, f32)], interleaved: bool) {
    rotate_pairs(row, angles, interleaved)
}

#[inline(always)]
fn rotate_pairs(row: &mut [f32], angles: &[(f32, f32)], interleaved: bool) {
    let half = angles.len();
    for (k, &(cos, sin)) in angles.iter().enumerate() {
        let (i0, i1) = if interleaved { (2 * k, 2 * k + 1) } else { (k, k + half) };
        let (x0, x1) = (row[i0], row[i1]);
        row[i0] = x0.mul_add(cos, -(x1 * sin));
        row[i1] = x0.mul_add(sin, x1 * cos);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A safe function may not read past a slice: unequal lengths are refused in release builds too.
    #[test]
    #[should_panic(expected = "dot_f16 of 40 and 32 elements")]
    fn dot_f16_refuses_slices_of_unequal_length() {
        let (x, y) = (vec![f16::ONE; 40], vec![f16::ONE; 32]);
        dot_f16(DotOrder::VecDot, &x, &y, 64);
    }

    #[test]
    fn expf_follows_libm_within_two_ulp_and_flushes_like_ggml() {
        // Normal results only: in the subnormal range (x < -87.3) the error is relative to 2^-126.
        for i in -1740..1760 {
            let x = i as f32 * 0.05;
            let (got, want) = (expf(x), x.exp());
            assert!((got - want).abs() <= 2.0 * f32::EPSILON * want, "{x}: {got} vs {want}");
        }
        assert_eq!(expf(f32::NEG_INFINITY), 0.0);
        assert_eq!(expf(-200.0), 0.0);
        assert_eq!(expf(100.0), f32::INFINITY);
    }

    #[test]
    fn both_dot_orders_agree_with_their_scalar_emulation_and_with_f64() {
        let x: Vec<f16> = (0..200).map(|i| f16::from_f32(((i * 37 % 101) as f32 - 50.0) / 13.0)).collect();
        let y: Vec<f16> = (0..200).map(|i| f16::from_f32(((i * 53 % 89) as f32 - 44.0) / 7.0)).collect();
        let exact: f64 = x.iter().zip(&y).map(|(a, b)| a.to_f64() * b.to_f64()).sum();
        for n in [8, 64, 200] {
            let (x, y) = (&x[..n], &y[..n]);
            let vec = dot_f16(DotOrder::VecDot, x, y, n.div_ceil(32) * 32);
            assert_eq!(vec, dot_vec_scalar(x, y, n.div_ceil(32) * 32));
            assert_eq!(dot_f16(DotOrder::Gemm, x, y, n), dot_gemm_scalar(x, y));
        }
        let v = dot_f16(DotOrder::VecDot, &x, &y, 256);
        assert!((v as f64 - exact).abs() < 1e-3 * exact.abs().max(1.0), "{v} vs {exact}");
    }

    #[test]
    fn soft_max_sums_to_one_and_masks() {
        let mut row = vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0];
        soft_max(&mut row, 0..9, 0.5);
        assert_eq!(row[9], 0.0);
        assert!((row.iter().sum::<f32>() - 1.0).abs() < 1e-6);
        assert!(row[8] > row[7]);
    }
}
