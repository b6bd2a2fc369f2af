//! MXFP4 (OCP Microscaling Formats v1.0, §5.3.3 and §6.3): blocks of 32 E2M1 elements sharing one
//! E8M0 scale, in ggml's layout (`ggml-common.h` `block_mxfp4`, GGUF type 39): the scale byte,
//! then 16 bytes whose byte j holds element j in the low nibble and element j+16 in the high.
//!
//! The mat-vec dequantizes inside the dot product and keeps the activations in f32 (ggml's
//! `ggml_vec_dot_mxfp4_q8_0` rounds them to Q8_0 first): the doubled E2M1 values are small
//! integers, so each block's sum Σ kvalue·x is taken in f32 and scaled once, and the result is
//! the dequantized matrix times x up to the order of the f32 additions.

use candle_core::Tensor;

use super::matvec::{activations, rows_by_tokens};
use crate::bytes::WeightBytes;
use crate::error::Result;

/// Elements per block (`QK_MXFP4`).
pub const QK: usize = 32;
/// Bytes per block: the E8M0 scale, then 16 bytes of nibbles.
pub const BLOCK_BYTES: usize = 17;

/// The E2M1 values doubled (`ggml-common.h` `kvalues_mxfp4`): 0, 0.5, 1, 1.5, 2, 3, 4, 6 and
/// their negatives, times two. Nibble 8 (E2M1 −0) is +0 here, as in ggml and the `gguf` package.
pub const KVALUES: [i8; 16] = [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12];

/// Token rows computed per pass over a weight row (each pass keeps one accumulator per token).
const TOKENS_PER_PASS: usize = 4;

/// Half the E8M0 scale, 2^(e−128), the factor of the doubled values (`ggml-impl.h`
/// `ggml_e8m0_to_fp32_half`: e < 2 gives the subnormals 2^−128 and 2^−127; 255, NaN in the
/// spec, is not special-cased).
#[inline]
pub fn e8m0_to_f32_half(e: u8) -> f32 {
    let bits = if e < 2 { 0x0020_0000u32 << e } else { ((e - 1) as u32) << 23 };
    f32::from_bits(bits)
}

/// ggml's `dequantize_row_mxfp4`: `out.len()` elements from as many blocks.
pub fn dequantize(blocks: &[u8], out: &mut [f32]) {
    for (block, y) in blocks.chunks_exact(BLOCK_BYTES).zip(out.chunks_exact_mut(QK)) {
        let d = e8m0_to_f32_half(block[0]);
        for (j, &q) in block[1..].iter().enumerate() {
            y[j] = KVALUES[(q & 0x0F) as usize] as f32 * d;
            y[j + QK / 2] = KVALUES[(q >> 4) as usize] as f32 * d;
        }
    }
}

/// ggml's `quantize_row_mxfp4_ref`: the scale puts the block's largest magnitude in the top
/// binade of E2M1 (floor(log2 amax) − 2, biased by 127), each element the nearest value
/// (the first of equals). `x.len()` must be a multiple of 32.
pub fn quantize(x: &[f32]) -> Vec<u8> {
    let mut out = Vec::with_capacity(x.len() / QK * BLOCK_BYTES);
    for block in x.chunks_exact(QK) {
        let amax = block.iter().fold(0f32, |m, v| m.max(v.abs()));
        // ggml casts the float to uint8; clamp so that tiny or huge blocks stay in range.
        let e = if amax > 0.0 { (amax.log2().floor() - 2.0 + 127.0).clamp(0.0, 254.0) as u8 } else { 0 };
        let d = e8m0_to_f32_half(e);
        let best = |v: f32| -> u8 {
            let mut best = (0u8, (KVALUES[0] as f32 * d - v).abs());
            for (i, k) in KVALUES.iter().enumerate().skip(1) {
                let err = (*k as f32 * d - v).abs();
                if err < best.1 {
                    best = (i as u8, err);
                }
            }
            best.0
        };
        out.push(e);
        for j in 0..QK / 2 {
            out.push(best(block[j]) | (best(block[j + QK / 2]) << 4));
        }
    }
    out
}

/// A matrix `[rows, cols]` of MXFP4 blocks, computed from where the blocks lie (a streamed
/// expert's read buffer: no copy).
pub struct Mxfp4Matrix {
    rows: usize,
    cols: usize,
    bytes: WeightBytes,
}

/// Which kernel the CPU runs, detected once per call.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Kernel {
    Scalar,
    Avx2,
    Avx512,
    /// aarch64's base NEON (every aarch64 CPU): the activations are f32, so no integer dot
    /// product instruction applies.
    Neon,
}

impl Kernel {
    pub fn detect() -> Self {
        #[cfg(target_arch = "x86_64")]
        {
            // Every feature the kernel's `target_feature` enables, not only the one it is named after.
            if is_x86_feature_detected!("avx512f")
                && is_x86_feature_detected!("avx2")
                && is_x86_feature_detected!("fma")
            {
                return Kernel::Avx512;
            }
            if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
                return Kernel::Avx2;
            }
        }
        if cfg!(target_arch = "aarch64") {
            return Kernel::Neon;
        }
        Kernel::Scalar
    }

    /// Whether this CPU has the kernel's instructions.
    pub fn runs_here(self) -> bool {
        #[cfg(target_arch = "x86_64")]
        {
            match self {
                Kernel::Scalar => true,
                Kernel::Avx2 => is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma"),
                Kernel::Avx512 => Self::detect() == Kernel::Avx512,
                Kernel::Neon => false,
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            self == Kernel::Scalar || (self == Kernel::Neon && cfg!(target_arch = "aarch64"))
        }
    }

    /// The kernels this CPU can run, the portable one first.
    #[cfg(test)]
    pub fn available() -> Vec<Self> {
        [Kernel::Scalar, Kernel::Avx2, Kernel::Avx512, Kernel::Neon].into_iter().filter(|k| k.runs_here()).collect()
    }
}

impl Mxfp4Matrix {
    /// `bytes` must hold `rows · cols / 32` blocks (the caller checked the shape).
    pub fn new(bytes: WeightBytes, rows: usize, cols: usize) -> Self {
        assert!(cols.is_multiple_of(QK), "MXFP4 rows are whole blocks");
        assert!(bytes.as_slice().len() >= rows * cols / QK * BLOCK_BYTES, "MXFP4 matrix shorter than its shape");
        Mxfp4Matrix { rows, cols, bytes }
    }

    pub fn cols(&self) -> usize {
        self.cols
    }

    /// Row `r`'s blocks as the file holds them.
    pub fn row_bytes(&self, r: usize) -> &[u8] {
        let len = self.cols / QK * BLOCK_BYTES;
        &self.bytes.as_slice()[r * len..(r + 1) * len]
    }

    /// `x`: `[tokens, cols]` → `[tokens, rows]`.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.forward_with(x, Kernel::detect())
    }

    /// Panics if this CPU lacks `kernel`'s instructions (a test or the kernel bench asked for it).
    pub fn forward_with(&self, x: &Tensor, kernel: Kernel) -> Result<Tensor> {
        assert!(kernel.runs_here(), "the {kernel:?} MXFP4 kernel needs instructions this CPU lacks");
        let tokens = x.dim(0)?;
        let xs = activations(x)?;
        let token_rows: Vec<&[f32]> = xs.chunks_exact(self.cols).collect();
        let row_bytes = self.cols / QK * BLOCK_BYTES;
        let blocks = self.bytes.as_slice();
        rows_by_tokens(self.rows, tokens, self.rows * self.cols * tokens, |r, out| {
            let row = &blocks[r * row_bytes..(r + 1) * row_bytes];
            for (xs, ys) in token_rows.chunks(TOKENS_PER_PASS).zip(out.chunks_mut(TOKENS_PER_PASS)) {
                // SAFETY: `kernel.runs_here()` was asserted above.
                unsafe { dots(kernel, row, xs, ys) };
            }
        })
    }
}

/// `ys[t] = row · xs[t]` for up to [`TOKENS_PER_PASS`] token rows, reading the row once.
///
/// # Safety
/// `kernel.runs_here()`: this CPU has every instruction the kernel uses.
unsafe fn dots(kernel: Kernel, row: &[u8], xs: &[&[f32]], ys: &mut [f32]) {
    // SAFETY: the caller's proof is passed on.
    unsafe {
        match (kernel, xs.len()) {
            (Kernel::Scalar, _) => dots_scalar(row, xs, ys),
            (Kernel::Avx2, 1) => dots_simd::<1>(kernel, row, xs, ys),
            (Kernel::Avx2, 2) => dots_simd::<2>(kernel, row, xs, ys),
            (Kernel::Avx2, 3) => dots_simd::<3>(kernel, row, xs, ys),
            (Kernel::Avx512, 1) => dots_simd::<1>(kernel, row, xs, ys),
            (Kernel::Avx512, 2) => dots_simd::<2>(kernel, row, xs, ys),
            (Kernel::Avx512, 3) => dots_simd::<3>(kernel, row, xs, ys),
            (Kernel::Neon, 1) => dots_simd::<1>(kernel, row, xs, ys),
            (Kernel::Neon, 2) => dots_simd::<2>(kernel, row, xs, ys),
            (Kernel::Neon, 3) => dots_simd::<3>(kernel, row, xs, ys),
            (_, _) => dots_simd::<TOKENS_PER_PASS>(kernel, row, xs, ys),
        }
    }
}

fn dots_scalar(row: &[u8], xs: &[&[f32]], ys: &mut [f32]) {
    for (x, y) in xs.iter().zip(ys.iter_mut()) {
        let mut sum = 0f32;
        for (block, xb) in row.chunks_exact(BLOCK_BYTES).zip(x.chunks_exact(QK)) {
            let (lo, hi) = xb.split_at(QK / 2);
            let mut acc = 0f32;
            for ((q, l), h) in block[1..].iter().zip(lo).zip(hi) {
                acc += KVALUES[(q & 0x0F) as usize] as f32 * l + KVALUES[(q >> 4) as usize] as f32 * h;
            }
            sum += e8m0_to_f32_half(block[0]) * acc;
        }
        *y = sum;
    }
}

/// # Safety
/// As [`dots`]: `kernel.runs_here()`.
unsafe fn dots_simd<const N: usize>(kernel: Kernel, row: &[u8], xs: &[&[f32]], ys: &mut [f32]) {
    let xs: [&[f32]; N] = std::array::from_fn(|t| xs[t]);
    for x in &xs {
        assert!(x.len() * BLOCK_BYTES >= row.len() * QK, "activations shorter than the row");
    }
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: the caller proved the kernel's features are present (`runs_here`), and every load
        // stays inside `row` (whole blocks) or an activation row (checked above).
        let out = unsafe {
            match kernel {
                Kernel::Avx512 => dots_avx512::<N>(row, &xs),
                _ => dots_avx2::<N>(row, &xs),
            }
        };
        ys[..N].copy_from_slice(&out);
    }
    #[cfg(target_arch = "aarch64")]
    {
        let _ = kernel;
        // SAFETY: every load stays inside `row` (whole blocks) or an activation row (checked above).
        ys[..N].copy_from_slice(&unsafe { dots_neon::<N>(row, &xs) });
    }
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    {
        let _ = kernel;
        dots_scalar(row, &xs, ys);
    }
}

/// NEON: a block's 16 bytes become 32 signed doubled values with one table lookup per nibble
/// half (as ggml's NEON `ggml_vec_dot_mxfp4_q8_0` does), widened to eight vectors of 4 f32. Each
/// pair of 4-lane vectors takes the operations one 8-lane vector of [`dots_avx2`] takes, and the
/// lanes are summed as `hsum_avx2` sums them, so a Mac computes the bits an AVX2 machine does.
///
/// # Safety
/// Each `xs[t]` holds the row's `cols` activations.
#[cfg(target_arch = "aarch64")]
unsafe fn dots_neon<const N: usize>(row: &[u8], xs: &[&[f32]; N]) -> [f32; N] {
    use std::arch::aarch64::*;
    // SAFETY: base NEON (every aarch64 CPU); loads of the 16-entry table, of 16 bytes inside
    // each 17-byte block, and of block b's 32 activations (the caller's promise).
    unsafe {
        let table = vld1q_s8(KVALUES.as_ptr());
        let widen = |v: int8x8_t| {
            let v = vmovl_s8(v);
            [vcvtq_f32_s32(vmovl_s16(vget_low_s16(v))), vcvtq_f32_s32(vmovl_high_s16(v))]
        };
        // Two accumulators per token (even and odd blocks), each 8 lanes as two vectors.
        let mut acc = [[[vdupq_n_f32(0.0); 2]; 2]; N];
        for (b, block) in row.chunks_exact(BLOCK_BYTES).enumerate() {
            let packed = vld1q_u8(block.as_ptr().add(1));
            let lo = vqtbl1q_s8(table, vandq_u8(packed, vdupq_n_u8(0x0F))); // elements 0..15
            let hi = vqtbl1q_s8(table, vshrq_n_u8::<4>(packed)); // 16..31
            let w = [widen(vget_low_s8(lo)), widen(vget_high_s8(lo)), widen(vget_low_s8(hi)), widen(vget_high_s8(hi))];
            let d = vdupq_n_f32(e8m0_to_f32_half(block[0]));
            for t in 0..N {
                let x: [float32x4_t; 8] = std::array::from_fn(|i| vld1q_f32(xs[t].as_ptr().add(b * QK + 4 * i)));
                let s: [float32x4_t; 2] = std::array::from_fn(|h| {
                    let mut s = vmulq_f32(w[0][h], x[h]);
                    for j in 1..4 {
                        s = vfmaq_f32(s, w[j][h], x[2 * j + h]);
                    }
                    s
                });
                let a = &mut acc[t][b & 1];
                a[0] = vfmaq_f32(a[0], d, s[0]);
                a[1] = vfmaq_f32(a[1], d, s[1]);
            }
        }
        std::array::from_fn(|t| {
            let [even, odd] = acc[t];
            // hsum_avx2 of even + odd: the halves added, then lanes 0+2 and 1+3, then those two.
            let s4 = vaddq_f32(vaddq_f32(even[0], odd[0]), vaddq_f32(even[1], odd[1]));
            let s2 = vadd_f32(vget_low_f32(s4), vget_high_f32(s4));
            vget_lane_f32::<0>(s2) + vget_lane_f32::<1>(s2)
        })
    }
}

/// AVX2: a block's 16 bytes become 32 signed doubled values with one table shuffle per nibble
/// half (as ggml's x86 `ggml_vec_dot_mxfp4_q8_0` does), widened to four vectors of 8 f32.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn dots_avx2<const N: usize>(row: &[u8], xs: &[&[f32]; N]) -> [f32; N] {
    use std::arch::x86_64::*;
    let table = unsafe { _mm_loadu_si128(KVALUES.as_ptr().cast()) };
    let low = _mm_set1_epi8(0x0F);
    // Two accumulators per token (even and odd blocks) hide the FMA latency of one chain.
    let mut acc = [[_mm256_setzero_ps(); 2]; N];
    for (b, block) in row.chunks_exact(BLOCK_BYTES).enumerate() {
        let packed = unsafe { _mm_loadu_si128(block.as_ptr().add(1).cast()) };
        let lo = _mm_shuffle_epi8(table, _mm_and_si128(packed, low)); // elements 0..15
        let hi = _mm_shuffle_epi8(table, _mm_and_si128(_mm_srli_epi16(packed, 4), low)); // 16..31
        let w = [
            _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(lo)),
            _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(lo, 8))),
            _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(hi)),
            _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(hi, 8))),
        ];
        let d = _mm256_set1_ps(e8m0_to_f32_half(block[0]));
        for t in 0..N {
            let p = unsafe { xs[t].as_ptr().add(b * QK) };
            let mut s = _mm256_mul_ps(w[0], unsafe { _mm256_loadu_ps(p) });
            s = _mm256_fmadd_ps(w[1], unsafe { _mm256_loadu_ps(p.add(8)) }, s);
            s = _mm256_fmadd_ps(w[2], unsafe { _mm256_loadu_ps(p.add(16)) }, s);
            s = _mm256_fmadd_ps(w[3], unsafe { _mm256_loadu_ps(p.add(24)) }, s);
            acc[t][b & 1] = _mm256_fmadd_ps(d, s, acc[t][b & 1]);
        }
    }
    std::array::from_fn(|t| super::matvec::hsum_avx2(_mm256_add_ps(acc[t][0], acc[t][1])))
}

/// AVX-512: the same shuffles, each nibble half widened to one vector of 16 f32.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma")]
unsafe fn dots_avx512<const N: usize>(row: &[u8], xs: &[&[f32]; N]) -> [f32; N] {
    use std::arch::x86_64::*;
    let table = unsafe { _mm_loadu_si128(KVALUES.as_ptr().cast()) };
    let low = _mm_set1_epi8(0x0F);
    let mut acc = [[_mm512_setzero_ps(); 2]; N];
    for (b, block) in row.chunks_exact(BLOCK_BYTES).enumerate() {
        let packed = unsafe { _mm_loadu_si128(block.as_ptr().add(1).cast()) };
        let lo = _mm_shuffle_epi8(table, _mm_and_si128(packed, low));
        let hi = _mm_shuffle_epi8(table, _mm_and_si128(_mm_srli_epi16(packed, 4), low));
        let w_lo = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(lo));
        let w_hi = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(hi));
        let d = _mm512_set1_ps(e8m0_to_f32_half(block[0]));
        for t in 0..N {
            let p = unsafe { xs[t].as_ptr().add(b * QK) };
            let s = _mm512_mul_ps(w_lo, unsafe { _mm512_loadu_ps(p) });
            let s = _mm512_fmadd_ps(w_hi, unsafe { _mm512_loadu_ps(p.add(16)) }, s);
            acc[t][b & 1] = _mm512_fmadd_ps(d, s, acc[t][b & 1]);
        }
    }
    std::array::from_fn(|t| _mm512_reduce_add_ps(_mm512_add_ps(acc[t][0], acc[t][1])))
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;
    use rand::{Rng, SeedableRng};

    /// Random blocks: any nibbles, scales over the range that keeps products finite.
    fn random_blocks(rng: &mut impl Rng, n: usize) -> Vec<u8> {
        let mut out = Vec::with_capacity(n * BLOCK_BYTES);
        for _ in 0..n {
            out.push(rng.gen_range(100..=140u8));
            out.extend((0..16).map(|_| rng.r#gen::<u8>()));
        }
        out
    }

    #[test]
    fn every_kernel_is_within_1e_5_of_dequantize_then_multiply() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(6);
        for (rows, cols, tokens) in [(37, 64, 1), (16, 2048, 2), (9, 736, 3), (5, 288, 4), (7, 160, 9)] {
            let blocks = random_blocks(&mut rng, rows * cols / QK);
            let x: Vec<f32> = (0..tokens * cols).map(|_| rng.gen_range(-1.0..1.0f32)).collect();
            let mut w = vec![0f32; rows * cols];
            dequantize(&blocks, &mut w);
            let m = Mxfp4Matrix::new(WeightBytes::from(&blocks[..]), rows, cols);
            let xt = Tensor::from_vec(x.clone(), (tokens, cols), &Device::Cpu).unwrap();
            for kernel in Kernel::available() {
                let got = m.forward_with(&xt, kernel).unwrap().to_vec2::<f32>().unwrap();
                for t in 0..tokens {
                    for r in 0..rows {
                        let (wr, xr) = (&w[r * cols..(r + 1) * cols], &x[t * cols..(t + 1) * cols]);
                        let want: f64 = wr.iter().zip(xr).map(|(a, b)| *a as f64 * *b as f64).sum();
                        // Relative to the terms' magnitude, which bounds the rounding of any order of sums.
                        let scale: f64 = wr.iter().zip(xr).map(|(a, b)| (*a as f64 * *b as f64).abs()).sum();
                        let err = (got[t][r] as f64 - want).abs() / scale;
                        assert!(err < 1e-5, "{kernel:?} {rows}x{cols} token {t} row {r}: {} vs {want}", got[t][r]);
                    }
                }
            }
        }
    }

    #[test]
    fn quantize_then_dequantize_is_exact_on_representable_values_and_close_elsewhere() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let blocks = random_blocks(&mut rng, 64);
        let mut w = vec![0f32; 64 * QK];
        dequantize(&blocks, &mut w);
        let mut again = vec![0f32; w.len()];
        dequantize(&quantize(&w), &mut again);
        // A block on one scale's grid comes back equal in value, even where its largest element
        // sits in a lower binade and the quantizer picks a finer scale.
        for (a, b) in w.chunks(QK).zip(again.chunks(QK)) {
            assert_eq!(a, b);
        }
        let x: Vec<f32> = (0..64 * QK).map(|_| rng.gen_range(-3.0..3.0f32)).collect();
        let mut y = vec![0f32; x.len()];
        dequantize(&quantize(&x), &mut y);
        for (xb, yb) in x.chunks(QK).zip(y.chunks(QK)) {
            let amax = xb.iter().fold(0f32, |m, v| m.max(v.abs()));
            for (a, b) in xb.iter().zip(yb) {
                // E2M1's widest gap is 2 (between 4 and 6) at a scale where amax ≥ 4: error ≤ amax/4.
                assert!((a - b).abs() <= amax / 4.0 + 1e-6, "{a} came back as {b} (block max {amax})");
            }
        }
    }
}
