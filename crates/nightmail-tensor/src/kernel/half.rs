//! Half-precision mat-vecs, F16 and BF16: weights stay in two bytes (half the bytes of widening
//! them to f32 at load, which matters for a dense trunk that must fit beside the expert cache),
//! widened eight at a time (F16C's `vcvtph2ps` or a 16-bit shift for BF16; NEON's `fcvtl` or
//! `shll`) and accumulated in f32.

use candle_core::Tensor;
use half::{bf16, f16};

use super::matvec::{activations, has_avx2_f16c, row_groups_by_tokens};
use crate::bytes::WeightBytes;
use crate::error::Result;

/// A two-byte float the kernels widen: IEEE half or bfloat16 (the top half of an f32).
pub trait HalfFloat: Copy + Send + Sync + 'static {
    /// bfloat16: widened by a shift, not a conversion.
    const BRAIN: bool;
    fn widen(self) -> f32;
    fn from_le(b: [u8; 2]) -> Self;
}

impl HalfFloat for f16 {
    const BRAIN: bool = false;
    fn widen(self) -> f32 {
        self.to_f32()
    }
    fn from_le(b: [u8; 2]) -> Self {
        f16::from_le_bytes(b)
    }
}

impl HalfFloat for bf16 {
    const BRAIN: bool = true;
    fn widen(self) -> f32 {
        self.to_f32()
    }
    fn from_le(b: [u8; 2]) -> Self {
        bf16::from_le_bytes(b)
    }
}

pub type F16Matrix = HalfMatrix<f16>;
pub type Bf16Matrix = HalfMatrix<bf16>;

pub struct HalfMatrix<H: HalfFloat> {
    rows: usize,
    cols: usize,
    w: Halves<H>,
}

/// The halves: the file's own bytes where they can be read as `H` in place (a little-endian
/// machine, 2-byte aligned: a streamed layer's read buffer, no copy), else decoded once.
enum Halves<H> {
    InPlace(WeightBytes),
    Decoded(Vec<H>),
}

impl<H: HalfFloat> HalfMatrix<H> {
    /// `bytes`: `rows · cols` little-endian halves.
    pub fn from_bytes(bytes: &[u8], rows: usize, cols: usize) -> Self {
        Self::new(WeightBytes::from(bytes), rows, cols)
    }

    /// Over bytes already in memory (computed from in place where the machine allows).
    pub fn new(bytes: WeightBytes, rows: usize, cols: usize) -> Self {
        let b = bytes.as_slice();
        let in_place = cfg!(target_endian = "little")
            && (b.as_ptr() as usize).is_multiple_of(std::mem::align_of::<H>())
            && b.len() >= 2 * rows * cols;
        let w = if in_place {
            Halves::InPlace(bytes)
        } else {
            Halves::Decoded(b.chunks_exact(2).take(rows * cols).map(|b| H::from_le([b[0], b[1]])).collect())
        };
        HalfMatrix { rows, cols, w }
    }

    fn halves(&self) -> &[H] {
        match &self.w {
            Halves::InPlace(bytes) => {
                let b = bytes.as_slice();
                // SAFETY: `new` checked the alignment, the length and that the machine is
                // little-endian, so these bytes are `rows · cols` valid `H` (any bit pattern is).
                unsafe { std::slice::from_raw_parts(b.as_ptr().cast::<H>(), self.rows * self.cols) }
            }
            Halves::Decoded(w) => w,
        }
    }

    /// Row `r` widened to f32 (exactly: every half and every bfloat16 is an f32).
    pub(crate) fn row(&self, r: usize) -> Vec<f32> {
        self.halves()[r * self.cols..(r + 1) * self.cols].iter().map(|h| h.widen()).collect()
    }

    /// `x`: `[tokens, cols]` → `[tokens, rows]`.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let tokens = x.dim(0)?;
        let xs = activations(x)?;
        // aarch64's widenings (`fcvtl`, `shll`) are base ARMv8: every aarch64 CPU takes the vector path.
        let fast = has_avx2_f16c() || cfg!(target_arch = "aarch64");
        let w = self.halves();
        // A panel of rows at a time, each few tokens against the whole panel: the panel stays
        // in the core's cache while the tokens' activations stream past it once, where a row at
        // a time against every token of a wide pass read all the activations again per row.
        let panel = (PANEL_BYTES / (2 * self.cols).max(1)).clamp(1, 64);
        row_groups_by_tokens(self.rows, tokens, self.rows * self.cols * tokens, panel, |r0, out| {
            let rows = out.len() / tokens;
            let row = |i: usize| &w[(r0 + i) * self.cols..(r0 + i + 1) * self.cols];
            let x = |t: usize| &xs[t * self.cols..(t + 1) * self.cols];
            if !fast {
                for (i, ys) in out.chunks_exact_mut(tokens).enumerate() {
                    ys.iter_mut().enumerate().for_each(|(t, y)| *y = dot_scalar(row(i), x(t)));
                }
                return;
            }
            // Each row is widened once for up to TOKENS tokens.
            let mut t = 0;
            while t < tokens {
                let n = (tokens - t).min(TOKENS);
                for i in 0..rows {
                    let ys = &mut out[i * tokens + t..i * tokens + t + n];
                    // SAFETY: AVX2, FMA and F16C were detected at run time.
                    match n {
                        1 => ys[0] = unsafe { dots::<H, 1>(row(i), [x(t)]) }[0],
                        2 => ys.copy_from_slice(&unsafe { dots::<H, 2>(row(i), [x(t), x(t + 1)]) }),
                        _ => ys.copy_from_slice(&unsafe { dots::<H, 3>(row(i), [x(t), x(t + 1), x(t + 2)]) }),
                    }
                }
                t += n;
            }
        })
    }
}

/// Bytes of weights in one panel of rows: well inside a core's L2 (1 MiB on Zen 4, 4 MiB or more
/// per cluster on Apple's cores) beside the few tokens' activations.
const PANEL_BYTES: usize = 128 << 10;

/// Tokens one widening of a row serves: four accumulators each, twelve of the sixteen registers
/// (four tokens spill, and measured no faster).
const TOKENS: usize = 3;

fn dot_scalar<H: HalfFloat>(w: &[H], x: &[f32]) -> f32 {
    w.iter().zip(x).map(|(w, x)| w.widen() * x).sum()
}

/// `w` against `N` tokens' activations, each token's sum in exactly the order of a lone one's
/// (four accumulators of eight lanes, then the tail), so a batch or a verify pass computes what
/// decoding alone does; the halves are widened once for all `N`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dots<H: HalfFloat, const N: usize>(w: &[H], xs: [&[f32]; N]) -> [f32; N] {
    use std::arch::x86_64::*;
    let n = w.len() / 32 * 32;
    let mut acc = [[_mm256_setzero_ps(); 4]; N];
    for i in (0..n).step_by(32) {
        for j in 0..4 {
            let k = i + 8 * j;
            // SAFETY: 16-byte and 32-byte unaligned loads of elements k..k+8 < n.
            let h = unsafe { _mm_loadu_si128(w.as_ptr().add(k).cast()) };
            let wv = match H::BRAIN {
                // A bfloat16 is the top half of its f32.
                true => _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(h))),
                false => _mm256_cvtph_ps(h),
            };
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

/// The x86 [`dots`] in NEON: each 8-lane vector as two 4-lane halves taking the same fused
/// multiply-adds, summed as `hsum_avx2` sums, so a Mac computes the bits an AVX2 machine does.
#[cfg(target_arch = "aarch64")]
unsafe fn dots<H: HalfFloat, const N: usize>(w: &[H], xs: [&[f32]; N]) -> [f32; N] {
    use std::arch::aarch64::*;
    // SAFETY: base NEON (every aarch64 CPU); loads of halves k..k+8 < n and of the activations'
    // elements k..k+8 < n ≤ x.len() (asserted).
    unsafe {
        let n = w.len() / 32 * 32;
        assert!(xs.iter().all(|x| x.len() >= w.len()));
        let mut acc = [[[vdupq_n_f32(0.0); 2]; 4]; N];
        for i in (0..n).step_by(32) {
            for j in 0..4 {
                let k = i + 8 * j;
                let h = vld1q_u16(w.as_ptr().add(k).cast());
                let (lo, hi): (float32x4_t, float32x4_t) = if H::BRAIN {
                    // `shll` by 16: a bfloat16 is the top half of its f32.
                    (
                        vreinterpretq_f32_u32(vshll_n_u16::<16>(vget_low_u16(h))),
                        vreinterpretq_f32_u32(vshll_high_n_u16::<16>(h)),
                    )
                } else {
                    let (lo, hi);
                    // `fcvtl` (base ARMv8 FP) widens exactly; `vcvt_f32_f16` needs the unstable f16 type.
                    std::arch::asm!(
                        "fcvtl {lo:v}.4s, {h:v}.4h",
                        "fcvtl2 {hi:v}.4s, {h:v}.8h",
                        h = in(vreg) h,
                        lo = out(vreg) lo,
                        hi = out(vreg) hi,
                        options(pure, nomem, nostack, preserves_flags)
                    );
                    (lo, hi)
                };
                for (a, x) in acc.iter_mut().zip(&xs) {
                    let (x0, x1) = (vld1q_f32(x.as_ptr().add(k)), vld1q_f32(x.as_ptr().add(k + 4)));
                    a[j] = [vfmaq_f32(a[j][0], lo, x0), vfmaq_f32(a[j][1], hi, x1)];
                }
            }
        }
        std::array::from_fn(|t| {
            let a = &acc[t];
            let half = |h: usize| vaddq_f32(vaddq_f32(a[0][h], a[1][h]), vaddq_f32(a[2][h], a[3][h]));
            let s4 = vaddq_f32(half(0), half(1));
            let s2 = vadd_f32(vget_low_f32(s4), vget_high_f32(s4));
            vget_lane_f32::<0>(s2) + vget_lane_f32::<1>(s2) + dot_scalar(&w[n..], &xs[t][n..])
        })
    }
}

#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
unsafe fn dots<H: HalfFloat, const N: usize>(w: &[H], xs: [&[f32]; N]) -> [f32; N] {
    std::array::from_fn(|t| dot_scalar(w, xs[t]))
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{DType, Device};

    /// Random weights of type `dtype` (F16 or BF16), as the tensor and as little-endian bytes.
    fn weights(rows: usize, cols: usize, dtype: DType) -> (Tensor, Vec<u8>) {
        let w = Tensor::randn(0f32, 1.0, (rows, cols), &Device::Cpu).unwrap().to_dtype(dtype).unwrap();
        let flat = w.flatten_all().unwrap();
        let bytes = match dtype {
            DType::F16 => flat.to_vec1::<f16>().unwrap().iter().flat_map(|h| h.to_le_bytes()).collect(),
            _ => flat.to_vec1::<bf16>().unwrap().iter().flat_map(|h| h.to_le_bytes()).collect(),
        };
        (w, bytes)
    }

    fn matmul_equals_widening_to_f32<H: HalfFloat>(dtype: DType) {
        let (rows, cols, tokens) = (33, 200, 2);
        let (w, bytes) = weights(rows, cols, dtype);
        let x = Tensor::randn(0f32, 1.0, (tokens, cols), &Device::Cpu).unwrap();
        let got = HalfMatrix::<H>::from_bytes(&bytes, rows, cols).forward(&x).unwrap().to_vec2::<f32>().unwrap();
        let want = x.matmul(&w.to_dtype(DType::F32).unwrap().t().unwrap()).unwrap().to_vec2::<f32>().unwrap();
        for t in 0..tokens {
            for r in 0..rows {
                assert!((got[t][r] - want[t][r]).abs() < 1e-3, "token {t} row {r}: {} vs {}", got[t][r], want[t][r]);
            }
        }
    }

    #[test]
    fn f16_matmul_equals_widening_to_f32() {
        matmul_equals_widening_to_f32::<f16>(DType::F16);
    }

    #[test]
    fn bf16_matmul_equals_widening_to_f32() {
        matmul_equals_widening_to_f32::<bf16>(DType::BF16);
    }

    /// Each row against the 8-lane order computed here in plain Rust (fused multiply-adds per
    /// lane, `hsum_avx2`'s pairing, the tail scalar): what the AVX2 path sums, and what the NEON
    /// path must give bit for bit.
    fn gives_the_eight_lane_orders_bits<H: HalfFloat>(to_half: fn(f32) -> H) {
        use crate::kernel::q8::tests::random;
        for (rows, cols, tokens) in [(3, 32, 1), (5, 200, 3), (2, 31, 2), (7, 97, 4)] {
            let w: Vec<H> = random(rows * cols, cols as u64).iter().map(|v| to_half(*v)).collect();
            let x = random(tokens * cols, 7 + cols as u64);
            let bytes: Vec<u8> = w
                .iter()
                .flat_map(|h| {
                    // SAFETY: `H` is two bytes (f16 or bf16).
                    unsafe { std::mem::transmute_copy::<H, [u8; 2]>(h) }
                })
                .collect();
            let xt = Tensor::from_vec(x.clone(), (tokens, cols), &candle_core::Device::Cpu).unwrap();
            let got = HalfMatrix::<H>::from_bytes(&bytes, rows, cols).forward(&xt).unwrap().to_vec2::<f32>().unwrap();
            for t in 0..tokens {
                for r in 0..rows {
                    let (w, x) = (&w[r * cols..(r + 1) * cols], &x[t * cols..(t + 1) * cols]);
                    let n = cols / 32 * 32;
                    let mut lanes = [[0f32; 8]; 4];
                    for i in (0..n).step_by(32) {
                        for (j, lane) in lanes.iter_mut().enumerate() {
                            for (l, a) in lane.iter_mut().enumerate() {
                                *a = w[i + 8 * j + l].widen().mul_add(x[i + 8 * j + l], *a);
                            }
                        }
                    }
                    let v: [f32; 8] =
                        std::array::from_fn(|l| (lanes[0][l] + lanes[1][l]) + (lanes[2][l] + lanes[3][l]));
                    let s4: [f32; 4] = std::array::from_fn(|l| v[l] + v[l + 4]);
                    let want = ((s4[0] + s4[2]) + (s4[1] + s4[3])) + dot_scalar(&w[n..], &x[n..]);
                    assert_eq!(got[t][r].to_bits(), want.to_bits(), "{rows}x{cols} token {t} row {r}");
                }
            }
        }
    }

    #[cfg(any(target_arch = "aarch64", target_arch = "x86_64"))]
    #[test]
    fn f16_gives_the_eight_lane_orders_bits() {
        if cfg!(target_arch = "aarch64") || has_avx2_f16c() {
            gives_the_eight_lane_orders_bits::<f16>(f16::from_f32);
        }
    }

    #[cfg(any(target_arch = "aarch64", target_arch = "x86_64"))]
    #[test]
    fn bf16_gives_the_eight_lane_orders_bits() {
        if cfg!(target_arch = "aarch64") || has_avx2_f16c() {
            gives_the_eight_lane_orders_bits::<bf16>(bf16::from_f32);
        }
    }

    fn each_token_of_a_multi_token_call_equals_that_token_alone<H: HalfFloat>(dtype: DType) {
        // 9 tokens: whole groups of tokens and a shorter last one; cols with a tail past 32.
        let (rows, cols, tokens) = (7, 200, 9);
        let (_, bytes) = weights(rows, cols, dtype);
        let m = HalfMatrix::<H>::from_bytes(&bytes, rows, cols);
        let x = Tensor::randn(0f32, 1.0, (tokens, cols), &Device::Cpu).unwrap();
        let all = m.forward(&x).unwrap().to_vec2::<f32>().unwrap();
        for (t, row) in all.iter().enumerate() {
            let alone = m.forward(&x.narrow(0, t, 1).unwrap()).unwrap().to_vec2::<f32>().unwrap();
            assert_eq!(row, &alone[0], "token {t}");
        }
    }

    #[test]
    fn each_token_of_a_multi_token_call_equals_that_token_alone_bit_for_bit() {
        each_token_of_a_multi_token_call_equals_that_token_alone::<f16>(DType::F16);
        each_token_of_a_multi_token_call_equals_that_token_alone::<bf16>(DType::BF16);
    }
}
