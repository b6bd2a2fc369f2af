//! The K-quants' kernels (`q3_k.rs` .. `q6_k.rs`; Q2_K's NEON path, `q2_k.rs`): one super-block
//! of 256 weights against one token's Q8_K block reduces to exact integer sums, so a product's bits
//! depend only on the float operations that combine them, and those are llama.cpp's, per build:
//! - x86, fewer than 8 tokens: quants.c's AVX2 `ggml_vec_dot_q*_K_q8_K`: 8 f32 lanes, each
//!   super-block's i32 lane k (elements 4k..4k+3 of every 32) fma'd by d_x·d_w, a minimum's 4
//!   lanes fma'd by −d_x·dmin_w beside them (Q5_K: one scalar chain); `hsum_float_8`, plus the
//!   minimums' sum.
//! - x86, from 8 tokens: ggml-cpu/tiled's mat-mul (`tiled_run_micro_vnni_8x16`, and the AVX2
//!   micro-tile in the same order): per super-block `fma(−dmin_w, imin, isum·d_w)`, times d_x
//!   fma'd into one chain.
//! - x86, Q4_K of a height that is a multiple of 8, any batch: repack.cpp repacks the matrix at
//!   load into `block_q4_Kx8` tiles (`ggml_repack_get_optimal_repack_type`, wherever AVX2 is)
//!   and arch/x86/repack.cpp's `ggml_gemv_q4_K_8x8_q8_K` / `ggml_gemm_q4_K_8x8_q8_K` take
//!   every batch (the tiled mat-mul leaves repacked weights alone): two chains per row and token,
//!   `fma(isum, d_w·d_x, ·)` and `fma(imin, dmin_w·d_x, ·)`, subtracted at the end; the gemm
//!   (each whole 4 tokens of a batch) adds to them per 64 elements, the gemv (the 1 to 3 tokens
//!   left) per super-block (repack.cpp `forward_mul_mat_one_chunk`).
//!   (`ggml_quantize_mat_q8_K_4x8`, which quantizes 4 tokens at a time for the gemm, gives
//!   `quantize_row_q8_K`'s blocks but for the sign of a block whose largest magnitude comes at
//!   both signs: it takes the positive one, ggml's reference the first.)
//! - aarch64, any batch: arch/arm/quants.c's NEON `ggml_vec_dot_q*_K_q8_K`: per super-block
//!   `sum −= d_x·dmin_w · imin`, `sum += d_x·d_w · isum`, each one fused multiply-add (Q5_K:
//!   `sum += fma(d, isum, −dmin·imin)`). On a dotprod or i8mm CPU llama.cpp repacks Q4_K, Q5_K
//!   and Q6_K matrices whose height is a multiple of 8 (`q4_K_8x4_q8_K`, ...): that order is
//!   not followed here.

use candle_core::Tensor;
use candle_core::quantized::GgmlDType;

use super::lattice::QK_K;
use super::matvec::{activations, rows_by_tokens};
use super::q8_k::{Q8K, TILED_MIN_TOKENS, hsum8, quantize_q8_k};
use crate::error::Result;

/// One super-block's integer sums in ggml's AVX2 lanes: `lanes[k]` the weight products of
/// elements 4k..4k+3 of each 32 (a bias already taken off, Q6_K's 32), `mins[i]` the minimums
/// of sub-blocks 2i and 2i+1 times their activations' sums (zero for a type without them), and
/// `quarters[i]` the weight products of elements 64i..64i+63 (the repacked gemm's steps; zero
/// for a type llama.cpp does not repack on x86, `KQuant::REPACKED_ON_AVX2`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Sums {
    pub(crate) lanes: [i32; 8],
    pub(crate) mins: [i32; 4],
    pub(crate) quarters: [i32; 4],
}

/// A K-quant: its block, how it decodes, and its integer sums on each instruction set.
pub(crate) trait KQuant: Sync + Send + Default + 'static {
    const DTYPE: GgmlDType;
    const BYTES: usize;
    /// Whether blocks carry a minimum per sub-block (`dmin`): Q4_K and Q5_K.
    const HAS_MIN: bool;
    /// Whether ggml's AVX2 vec_dot keeps the minimums in one scalar chain rather than 4 lanes,
    /// and its NEON one subtracts them from the block's term before adding it (Q5_K).
    const MINS_APART: bool = false;
    /// Whether llama.cpp repacks a matrix of this type whose height is a multiple of 8 on an
    /// AVX2 CPU (repack.cpp `ggml_repack_get_optimal_repack_type`): Q4_K.
    const REPACKED_ON_AVX2: bool;
    /// The block's f16 d and dmin (0 without minimums), widened.
    fn d(block: &[u8]) -> (f32, f32);
    /// ggml-quants.c `dequantize_row_*` (gguf-py quants.py): 256 values. The tests' reference:
    /// `view.rs` reads a row through candle's decoder, which gives the same bits.
    #[cfg_attr(not(test), allow(dead_code))]
    fn dequantize(block: &[u8], out: &mut [f32]);
    /// The sums, element by element.
    fn sums_scalar(block: &[u8], x: &Q8K, bsums: &[i32; 16]) -> Sums;
    /// The same sums in AVX2.
    ///
    /// # Safety
    /// The CPU has AVX2.
    #[cfg(target_arch = "x86_64")]
    unsafe fn sums_avx2(block: &[u8], x: &Q8K, bsums: &[i32; 16]) -> Sums;
    /// `(isum, imin)`: the lanes' and the minimums' totals, in NEON (`sdot` when `SDOT`).
    ///
    /// # Safety
    /// `SDOT` only where the CPU has FEAT_DotProd.
    #[cfg(target_arch = "aarch64")]
    unsafe fn totals_neon<const SDOT: bool>(block: &[u8], x: &Q8K, bsums: &[i32; 16]) -> (i32, i32);
}

/// A Q8_K block's sums of 16 (ggml `block_q8_K.bsums`), which meet the weights' minimums and biases.
pub(crate) fn bsums(x: &Q8K) -> [i32; 16] {
    std::array::from_fn(|j| x.qs[16 * j..16 * j + 16].iter().map(|&q| q as i32).sum())
}

impl Sums {
    pub(crate) fn totals(&self) -> (i32, i32) {
        (self.lanes.iter().sum(), self.mins.iter().sum())
    }
}

/// `row` · one token in the AVX2 `ggml_vec_dot_q*_K_q8_K` order, from `sums`' lanes.
#[cfg_attr(target_arch = "aarch64", allow(dead_code))] // aarch64: llama.cpp's aarch64 build never takes it
pub(crate) fn dot_vec<T: KQuant>(
    row: &[u8],
    x: &[Q8K],
    bs: &[[i32; 16]],
    sums: impl Fn(&[u8], &Q8K, &[i32; 16]) -> Sums,
) -> f32 {
    let (mut acc, mut acc_m, mut summs) = ([0f32; 8], [0f32; 4], 0f32);
    for ((b, xb), bs) in row.chunks_exact(T::BYTES).zip(x).zip(bs) {
        let s = sums(b, xb, bs);
        let (dw, dmin) = T::d(b);
        let d = xb.d * dw;
        if T::HAS_MIN && T::MINS_APART {
            // Q5_K: `summs += dmin * imin`, before the weight lanes.
            summs = (-xb.d * dmin).mul_add(s.mins.iter().sum::<i32>() as f32, summs);
        }
        for (a, l) in acc.iter_mut().zip(s.lanes) {
            *a = d.mul_add(l as f32, *a);
        }
        if T::HAS_MIN && !T::MINS_APART {
            let m = -xb.d * dmin;
            for (a, l) in acc_m.iter_mut().zip(s.mins) {
                *a = m.mul_add(l as f32, *a);
            }
        }
    }
    if T::HAS_MIN && T::MINS_APART {
        hsum8(acc) + summs
    } else if T::HAS_MIN {
        // `_mm_movehl_ps` then `_mm_movehdup_ps`: (m0 + m2) + (m1 + m3).
        hsum8(acc) + ((acc_m[0] + acc_m[2]) + (acc_m[1] + acc_m[3]))
    } else {
        hsum8(acc)
    }
}

/// `row` · one token in the tiled mat-mul's order (the module's comment).
#[cfg_attr(target_arch = "aarch64", allow(dead_code))] // aarch64: llama.cpp's aarch64 build has no tiled mat-mul
pub(crate) fn dot_tiled<T: KQuant>(
    row: &[u8],
    x: &[Q8K],
    bs: &[[i32; 16]],
    sums: impl Fn(&[u8], &Q8K, &[i32; 16]) -> Sums,
) -> f32 {
    let mut acc = 0f32;
    for ((b, xb), bs) in row.chunks_exact(T::BYTES).zip(x).zip(bs) {
        let (isum, imin) = sums(b, xb, bs).totals();
        let (dw, dmin) = T::d(b);
        let r = if T::HAS_MIN { (-dmin).mul_add(imin as f32, isum as f32 * dw) } else { isum as f32 * dw };
        acc = r.mul_add(xb.d, acc);
    }
    acc
}

/// `row` · one token in the order of the repacked gemv (`GEMM`: the gemm; the module's comment).
#[cfg_attr(target_arch = "aarch64", allow(dead_code))] // aarch64: not the order of its repacked tiles
pub(crate) fn dot_repacked<T: KQuant, const GEMM: bool>(
    row: &[u8],
    x: &[Q8K],
    bs: &[[i32; 16]],
    sums: impl Fn(&[u8], &Q8K, &[i32; 16]) -> Sums,
) -> f32 {
    let (mut acc, mut acc_m) = (0f32, 0f32);
    for ((b, xb), bs) in row.chunks_exact(T::BYTES).zip(x).zip(bs) {
        let s = sums(b, xb, bs);
        let (dw, dmin) = T::d(b);
        let (d, m) = (dw * xb.d, dmin * xb.d);
        if GEMM {
            for (q, mins) in s.quarters.into_iter().zip(s.mins) {
                acc = (q as f32).mul_add(d, acc);
                acc_m = (mins as f32).mul_add(m, acc_m);
            }
        } else {
            let (isum, imin) = s.totals();
            acc = (isum as f32).mul_add(d, acc);
            acc_m = (imin as f32).mul_add(m, acc_m);
        }
    }
    acc - acc_m
}

/// `row` · one token in the NEON `ggml_vec_dot_q*_K_q8_K` order, from each block's totals.
#[cfg_attr(not(target_arch = "aarch64"), allow(dead_code))] // x86: llama.cpp's x86 build never takes it
pub(crate) fn dot_arm<T: KQuant>(
    row: &[u8],
    x: &[Q8K],
    bs: &[[i32; 16]],
    totals: impl Fn(&[u8], &Q8K, &[i32; 16]) -> (i32, i32),
) -> f32 {
    let mut sum = 0f32;
    for ((b, xb), bs) in row.chunks_exact(T::BYTES).zip(x).zip(bs) {
        let (isum, imin) = totals(b, xb, bs);
        let (dw, dmin) = T::d(b);
        if T::HAS_MIN && T::MINS_APART {
            // Q5_K's `sumf += d * sumi - dmin * sumi_mins`: the first product fused with the
            // difference (GCC's and clang's contraction of the expression), then added.
            sum += (xb.d * dw).mul_add(isum as f32, -(xb.d * dmin * imin as f32));
            continue;
        }
        if T::HAS_MIN {
            sum = (-(xb.d * dmin)).mul_add(imin as f32, sum);
        }
        sum = (xb.d * dw).mul_add(isum as f32, sum);
    }
    sum
}

/// The scalar sums as totals, the reference of the NEON order.
#[cfg_attr(not(target_arch = "aarch64"), allow(dead_code))]
pub(crate) fn totals_scalar<T: KQuant>(b: &[u8], x: &Q8K, bs: &[i32; 16]) -> (i32, i32) {
    T::sums_scalar(b, x, bs).totals()
}

/// Whether rows of `cols` elements of a K-quant have our kernel on this CPU: AVX2 on x86 (else
/// candle's), every aarch64 CPU (base NEON, `sdot` where FEAT_DotProd is).
pub fn has_kernel(cols: usize) -> bool {
    cols.is_multiple_of(QK_K) && (cfg!(target_arch = "aarch64") || super::cpu::has_avx2())
}

/// How a matrix computes: the SIMD paths this CPU has, or (tests) the scalar ones in the same orders.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Path {
    #[cfg_attr(not(test), allow(dead_code))] // the tests' reference
    Scalar,
    Simd,
}

/// A K-quant matrix over its file's bytes.
pub(crate) struct KQuantMatrix<T> {
    rows: usize,
    cols: usize,
    bytes: crate::bytes::WeightBytes,
    kind: std::marker::PhantomData<T>,
}

impl<T: KQuant> KQuantMatrix<T> {
    /// `bytes` must hold `rows · cols / 256` blocks (the caller checked the shape).
    pub(crate) fn new(bytes: crate::bytes::WeightBytes, rows: usize, cols: usize) -> Self {
        debug_assert!(bytes.as_slice().len() >= rows * cols / QK_K * T::BYTES);
        KQuantMatrix { rows, cols, bytes, kind: std::marker::PhantomData }
    }

    pub(crate) fn matmul(&self, x: &Tensor, path: Path) -> Result<Tensor> {
        let tokens = x.dim(0)?;
        let q8: Vec<Vec<Q8K>> = activations(x)?.chunks_exact(self.cols).map(quantize_q8_k).collect();
        let bs: Vec<Vec<[i32; 16]>> = q8.iter().map(|x| x.iter().map(bsums).collect()).collect();
        let row_bytes = self.cols / QK_K * T::BYTES;
        let bytes = self.bytes.as_slice();
        #[cfg(target_arch = "aarch64")]
        let kernel = super::arm::ArmKernel::detect();
        rows_by_tokens(self.rows, tokens, self.rows * self.cols * tokens, |r, out| {
            let row = &bytes[r * row_bytes..(r + 1) * row_bytes];
            for (t, y) in out.iter_mut().enumerate() {
                let order = Order::of::<T>(self.rows, tokens, t);
                *y = dot::<T>(
                    row,
                    &q8[t],
                    &bs[t],
                    order,
                    path,
                    #[cfg(target_arch = "aarch64")]
                    kernel,
                );
            }
        })
    }
}

/// The order llama.cpp's x86 build takes for a matrix of `T` and `rows` rows against `tokens` tokens.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Order {
    Vec,
    Tiled,
    RepackedGemv,
    RepackedGemm,
}

impl Order {
    /// The order of token `t` of `tokens`.
    pub(crate) fn of<T: KQuant>(rows: usize, tokens: usize, t: usize) -> Self {
        if T::REPACKED_ON_AVX2 && rows.is_multiple_of(8) {
            if t < tokens - tokens % 4 { Order::RepackedGemm } else { Order::RepackedGemv }
        } else if tokens >= TILED_MIN_TOKENS {
            Order::Tiled
        } else {
            Order::Vec
        }
    }
}

/// One row · one token in `order`, from `sums`.
#[cfg_attr(target_arch = "aarch64", allow(dead_code))]
pub(crate) fn dot_in<T: KQuant>(
    order: Order,
    row: &[u8],
    x: &[Q8K],
    bs: &[[i32; 16]],
    sums: impl Fn(&[u8], &Q8K, &[i32; 16]) -> Sums,
) -> f32 {
    match order {
        Order::Vec => dot_vec::<T>(row, x, bs, sums),
        Order::Tiled => dot_tiled::<T>(row, x, bs, sums),
        Order::RepackedGemv => dot_repacked::<T, false>(row, x, bs, sums),
        Order::RepackedGemm => dot_repacked::<T, true>(row, x, bs, sums),
    }
}

/// One row · one token of a product, in the order this build of llama.cpp takes.
#[cfg(not(target_arch = "aarch64"))]
fn dot<T: KQuant>(row: &[u8], x: &[Q8K], bs: &[[i32; 16]], order: Order, path: Path) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if path == Path::Simd {
        // SAFETY: a Simd path exists only where `has_kernel` found AVX2.
        return dot_in::<T>(order, row, x, bs, |b: &[u8], x: &Q8K, bs: &[i32; 16]| unsafe { T::sums_avx2(b, x, bs) });
    }
    let _ = path;
    dot_in::<T>(order, row, x, bs, T::sums_scalar)
}

/// One row · one token in ggml's NEON order (llama.cpp's aarch64 build has no tiled mat-mul).
#[cfg(target_arch = "aarch64")]
fn dot<T: KQuant>(
    row: &[u8],
    x: &[Q8K],
    bs: &[[i32; 16]],
    _order: Order,
    path: Path,
    kernel: super::arm::ArmKernel,
) -> f32 {
    match path {
        Path::Scalar => dot_arm::<T>(row, x, bs, totals_scalar::<T>),
        Path::Simd => dot_neon_on::<T>(kernel, row, x, bs),
    }
}

/// [`dot_arm`] from NEON totals, `sdot` when `SDOT`; the type comes as a value, so that
/// `arm.rs`'s `dispatch!` names only the const parameter.
///
/// # Safety
/// `SDOT` only where the CPU has FEAT_DotProd.
#[cfg(target_arch = "aarch64")]
#[inline(always)]
unsafe fn dot_neon<const SDOT: bool>(t: impl KQuant, row: &[u8], x: &[Q8K], bs: &[[i32; 16]]) -> f32 {
    #[inline(always)]
    unsafe fn typed<T: KQuant, const SDOT: bool>(_: T, row: &[u8], x: &[Q8K], bs: &[[i32; 16]]) -> f32 {
        // SAFETY: the caller's promise about dotprod.
        dot_arm::<T>(row, x, bs, |b, x, bs| unsafe { T::totals_neon::<SDOT>(b, x, bs) })
    }
    // SAFETY: the caller's promise about dotprod.
    unsafe { typed::<_, SDOT>(t, row, x, bs) }
}

/// [`dot_neon`] on path `kernel`.
#[cfg(target_arch = "aarch64")]
pub(crate) fn dot_neon_on<T: KQuant>(kernel: super::arm::ArmKernel, row: &[u8], x: &[Q8K], bs: &[[i32; 16]]) -> f32 {
    super::arm::dispatch!(kernel, dot_neon(T::default(), row, x, bs))
}

/// The matrix of a K-quant that has a kernel here, over its file's bytes.
pub fn k_quant_matrix(
    dtype: GgmlDType,
    bytes: crate::bytes::WeightBytes,
    rows: usize,
    cols: usize,
) -> Option<Box<dyn super::q8_k::LowBitMatrix>> {
    Some(match dtype {
        GgmlDType::Q3K => Box::new(KQuantMatrix::<super::q3_k::Q3K>::new(bytes, rows, cols)),
        GgmlDType::Q4K => Box::new(KQuantMatrix::<super::q4_k::Q4K>::new(bytes, rows, cols)),
        GgmlDType::Q5K => Box::new(KQuantMatrix::<super::q5_k::Q5K>::new(bytes, rows, cols)),
        GgmlDType::Q6K => Box::new(KQuantMatrix::<super::q6_k::Q6K>::new(bytes, rows, cols)),
        _ => return None,
    })
}

impl<T: KQuant> super::q8_k::LowBitMatrix for KQuantMatrix<T> {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.matmul(x, Path::Simd)
    }

    fn dtype(&self) -> crate::dtype::WeightDType {
        crate::dtype::WeightDType::Ggml(T::DTYPE)
    }

    fn cols(&self) -> usize {
        self.cols
    }

    fn row_bytes(&self, r: usize) -> &[u8] {
        let len = self.cols / QK_K * T::BYTES;
        &self.bytes.as_slice()[r * len..(r + 1) * len]
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A small finite f16 at `b[at..at + 2]`, from the random byte there.
    pub(crate) fn finite_half(b: &mut [u8], at: usize, base: f32) {
        let v = half::f16::from_f32(base * (1.0 + b[at] as f32 / 64.0));
        b[at..at + 2].copy_from_slice(&v.to_le_bytes());
    }

    /// Random blocks of `T` with `fix` making their f16 scales finite.
    pub(crate) fn blocks<T: KQuant>(n: usize, seed: u64, fix: fn(&mut [u8])) -> Vec<u8> {
        let mut bytes = super::super::lattice::tests::random_blocks(T::BYTES, n, seed);
        bytes.chunks_exact_mut(T::BYTES).for_each(fix);
        bytes
    }

    /// For 1, 5 and 9 tokens (the last in the prompt order), 8 rows and 5: the SIMD path equals the scalar
    /// path bit for bit, a token's result within a batch below [`TILED_MIN_TOKENS`] equals its
    /// lone result, and every result is the dequantized weights times the dequantized
    /// activations up to f32 rounding.
    pub(crate) fn check_kernel<T: KQuant>(fix: fn(&mut [u8])) {
        // 8 rows: a height llama.cpp repacks (Q4_K); 5: one it does not.
        for rows in [8, 5] {
            check_rows::<T>(rows, fix);
        }
    }

    fn check_rows<T: KQuant>(rows: usize, fix: fn(&mut [u8])) {
        let cols = 3 * QK_K;
        let bytes = blocks::<T>(rows * cols / QK_K, 31, fix);
        let m = KQuantMatrix::<T>::new(crate::bytes::WeightBytes::from(&bytes[..]), rows, cols);
        let row_bytes = cols / QK_K * T::BYTES;
        for tokens in [1, 5, TILED_MIN_TOKENS + 1] {
            let xs = super::super::q8::tests::random(tokens * cols, 9 + tokens as u64);
            let x = Tensor::from_vec(xs.clone(), (tokens, cols), &candle_core::Device::Cpu).unwrap();
            let scalar = m.matmul(&x, Path::Scalar).unwrap().to_vec2::<f32>().unwrap();
            let simd = m.matmul(&x, Path::Simd).unwrap().to_vec2::<f32>().unwrap();
            for t in 0..tokens {
                let alone = m.matmul(&x.narrow(0, t, 1).unwrap(), Path::Simd).unwrap().to_vec2::<f32>().unwrap();
                let q8 = quantize_q8_k(&xs[t * cols..(t + 1) * cols]);
                let xq: Vec<f32> = q8.iter().flat_map(|b| b.qs.map(|q| q as f32 * b.d)).collect();
                for r in 0..rows {
                    let (s, y) = (scalar[t][r], simd[t][r]);
                    assert_eq!(y.to_bits(), s.to_bits(), "{tokens} tokens: token {t} row {r}: {y} vs {s}");
                    #[cfg(target_arch = "aarch64")]
                    for kernel in super::super::arm::ArmKernel::available() {
                        let row = &bytes[r * row_bytes..(r + 1) * row_bytes];
                        let bs: Vec<[i32; 16]> = q8.iter().map(bsums).collect();
                        let got = dot_neon_on::<T>(kernel, row, &q8, &bs);
                        assert_eq!(got.to_bits(), s.to_bits(), "{kernel:?}: token {t} row {r}: {got} vs {s}");
                    }
                    if Order::of::<T>(rows, tokens, t) == Order::of::<T>(rows, 1, 0) || cfg!(target_arch = "aarch64") {
                        assert_eq!(alone[0][r].to_bits(), y.to_bits(), "{tokens} tokens: token {t} row {r} alone");
                    }
                    let mut w = vec![0f32; cols];
                    let row = &bytes[r * row_bytes..(r + 1) * row_bytes];
                    row.chunks_exact(T::BYTES).zip(w.chunks_exact_mut(QK_K)).for_each(|(b, y)| T::dequantize(b, y));
                    let want: f64 = w.iter().zip(&xq).map(|(a, b)| *a as f64 * *b as f64).sum();
                    let scale: f64 = w.iter().zip(&xq).map(|(a, b)| (*a as f64 * *b as f64).abs()).sum();
                    assert!(
                        (y as f64 - want).abs() <= 1e-5 * scale + 1e-6,
                        "{tokens} tokens: token {t} row {r}: {y} vs {want}"
                    );
                }
            }
        }
    }

    /// [`KQuant::dequantize`] gives gguf-py's values (quants.py, which ggml-quants.c's
    /// `dequantize_row_*` follows) bit for bit on tests/fixtures/lowbit/generate.py's random blocks.
    pub(crate) fn dequantizes_as_gguf_py<T: KQuant>(name: &str) {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/lowbit");
        let file = std::fs::read(dir.join(format!("{name}.bin"))).unwrap();
        let blocks = file.len() / (T::BYTES + 4 * QK_K);
        assert!(blocks > 0 && file.len() == blocks * (T::BYTES + 4 * QK_K), "{name}: {} bytes", file.len());
        let (bytes, values) = file.split_at(blocks * T::BYTES);
        let mut got = vec![0f32; blocks * QK_K];
        bytes.chunks_exact(T::BYTES).zip(got.chunks_exact_mut(QK_K)).for_each(|(b, y)| T::dequantize(b, y));
        for (i, (g, w)) in got.iter().zip(values.chunks_exact(4)).enumerate() {
            let w = u32::from_le_bytes(w.try_into().unwrap());
            assert_eq!(g.to_bits(), w, "{name} element {i}: {g} vs gguf-py's {}", f32::from_bits(w));
        }
    }

    /// [`KQuant::dequantize`] gives candle's values (the ones `view.rs` reads a row with) bit for bit.
    pub(crate) fn dequantizes_as_candle<T: KQuant>(fix: fn(&mut [u8])) {
        let n = 64;
        let bytes = blocks::<T>(n, 77, fix);
        let want = crate::view::row_values("w", crate::dtype::WeightDType::Ggml(T::DTYPE), n * QK_K, &bytes).unwrap();
        let mut got = vec![0f32; n * QK_K];
        bytes.chunks_exact(T::BYTES).zip(got.chunks_exact_mut(QK_K)).for_each(|(b, y)| T::dequantize(b, y));
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert_eq!(g.to_bits(), w.to_bits(), "element {i}: {g} vs {w}");
        }
    }
}
