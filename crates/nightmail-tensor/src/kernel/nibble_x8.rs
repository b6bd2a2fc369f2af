//! Q4_0 and IQ4_NL in the order llama.cpp computes them on x86: a matrix whose row count is a
//! multiple of 8 is repacked at load into 8-row tiles (ggml-cpu `repack.cpp`
//! `ggml_repack_get_optimal_repack_type`: `q4_0_8x8_q8_0`, `iq4_nl_8x8_q8_0` wherever AVX2 is),
//! and `gemv_q4_b32_8x8_q8_0_lut_avx` / `gemm_q4_b32_8x8_q8_0_lut_avx` (arch/x86/repack.cpp) sum
//! each row alone: per 32-block, the whole block's integer dot, then
//! `acc = fma(float(dot), d_w · d_x, acc)`, one chain per row. `ggml_vec_dot_q4_0_q8_0`'s 8
//! lanes, which a matrix of other heights gets, round differently: enough to change greedy
//! tokens of a requantized SmolLM2 at the second step.
//!
//! Both types are 18-byte blocks of an f16 scale and 16 bytes of nibbles (element j low, j+16
//! high); they differ only in what a nibble means, a 16-entry table here.

use candle_core::Tensor;

use super::matvec::activations;
#[cfg(not(target_arch = "aarch64"))]
use super::matvec::{has_avx2_f16c, row_groups_by_tokens};
use super::q8::{Q8Block, quantize_q8_1};
use crate::error::Result;

const QK: usize = 32;
const BLOCK_BYTES: usize = 18;

/// Rows per tile of llama.cpp's repacked layout: a matrix whose height is a multiple of it takes
/// this order.
pub(crate) const TILE_ROWS: usize = 8;

/// Q4_0's nibbles are `q - 8`. (aarch64's Q4_0 takes the NEON kernels, not this order.)
#[cfg(any(test, not(target_arch = "aarch64")))]
pub(crate) const Q4_0_LEVELS: [i8; 16] = [-8, -7, -6, -5, -4, -3, -2, -1, 0, 1, 2, 3, 4, 5, 6, 7];

fn scale(block: &[u8]) -> f32 {
    half::f16::from_le_bytes([block[0], block[1]]).to_f32()
}

/// One block's integer dot with one token's block.
#[cfg_attr(target_arch = "aarch64", allow(dead_code))] // aarch64: the reference its tests compare against
fn block_dot(levels: &[i8; 16], block: &[u8], x: &Q8Block) -> i32 {
    let mut sum = 0i32;
    for (j, q) in block[2..BLOCK_BYTES].iter().enumerate() {
        sum +=
            levels[(q & 0xf) as usize] as i32 * x.qs[j] as i32 + levels[(q >> 4) as usize] as i32 * x.qs[j + 16] as i32;
    }
    sum
}

/// One row against one token, without SIMD.
#[cfg_attr(target_arch = "aarch64", allow(dead_code))] // aarch64: the reference its tests compare against
pub(crate) fn dot_scalar(levels: &[i8; 16], row: &[u8], x: &[Q8Block]) -> f32 {
    let mut acc = 0f32;
    for (block, xb) in row.chunks_exact(BLOCK_BYTES).zip(x) {
        acc = (block_dot(levels, block, xb) as f32).mul_add(scale(block) * xb.d, acc);
    }
    acc
}

/// One tile (`TILE_ROWS` rows of `row_bytes` each, consecutive in `tile`) against `N` tokens:
/// `[token][row]`. Each row keeps its own chain of `fma(dot, d_w · d_x, acc)` in its own lane, as
/// llama.cpp's 8-row gemv does, so a lane's result is the scalar chain's bits.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn tile_dots_avx2<const N: usize>(
    levels: &[i8; 16],
    tile: &[u8],
    row_bytes: usize,
    xs: [&[Q8Block]; N],
) -> [[f32; TILE_ROWS]; N] {
    use std::arch::x86_64::*;
    // SAFETY: a 16-byte load of the 16 levels.
    let lut = unsafe { _mm_loadu_si128(levels.as_ptr().cast()) };
    let m4 = _mm_set1_epi8(0x0f);
    let ones = _mm256_set1_epi16(1);
    let mut acc = [_mm256_setzero_ps(); N];
    for b in 0..row_bytes / BLOCK_BYTES {
        let block = |i: usize| &tile[i * row_bytes + b * BLOCK_BYTES..i * row_bytes + (b + 1) * BLOCK_BYTES];
        // The tile's 8 weights as signed bytes and their magnitudes, one pair per row.
        let w: [(__m256i, __m256i); TILE_ROWS] = std::array::from_fn(|i| {
            // SAFETY: a 16-byte load inside the 18-byte block.
            let bits = unsafe { _mm_loadu_si128(block(i).as_ptr().add(2).cast()) };
            let w = _mm256_set_m128i(
                _mm_shuffle_epi8(lut, _mm_and_si128(_mm_srli_epi16(bits, 4), m4)),
                _mm_shuffle_epi8(lut, _mm_and_si128(bits, m4)),
            );
            (w, _mm256_sign_epi8(w, w))
        });
        let h = |i: usize| u16::from_le_bytes([block(i)[0], block(i)[1]]) as i16;
        // f16 to f32 is exact, as `scale` is.
        let dw = _mm256_cvtph_ps(_mm_setr_epi16(h(0), h(1), h(2), h(3), h(4), h(5), h(6), h(7)));
        for (acc, x) in acc.iter_mut().zip(&xs) {
            let xb = &x[b];
            // SAFETY: a 32-byte load inside `qs`.
            let q8 = unsafe { _mm256_loadu_si256(xb.qs.as_ptr().cast()) };
            // |w| · (x with w's sign): exact integer products in 8 partial sums per row.
            let p = w.map(|(w, abs_w)| _mm256_madd_epi16(_mm256_maddubs_epi16(abs_w, _mm256_sign_epi8(q8, w)), ones));
            // Each row's 8 partial sums to one lane (integer sums: exact in any order).
            let s0123 = _mm256_hadd_epi32(_mm256_hadd_epi32(p[0], p[1]), _mm256_hadd_epi32(p[2], p[3]));
            let s4567 = _mm256_hadd_epi32(_mm256_hadd_epi32(p[4], p[5]), _mm256_hadd_epi32(p[6], p[7]));
            let dots = _mm256_add_epi32(
                _mm256_permute2x128_si256(s0123, s4567, 0x20),
                _mm256_permute2x128_si256(s0123, s4567, 0x31),
            );
            let d = _mm256_mul_ps(dw, _mm256_set1_ps(xb.d));
            *acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dots), d, *acc);
        }
    }
    acc.map(|a| {
        let mut out = [0f32; TILE_ROWS];
        // SAFETY: an 8-float store into an 8-float array.
        unsafe { _mm256_storeu_ps(out.as_mut_ptr(), a) };
        out
    })
}

#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
unsafe fn tile_dots_avx2<const N: usize>(
    levels: &[i8; 16],
    tile: &[u8],
    row_bytes: usize,
    xs: [&[Q8Block]; N],
) -> [[f32; TILE_ROWS]; N] {
    xs.map(|x| std::array::from_fn(|i| dot_scalar(levels, &tile[i * row_bytes..(i + 1) * row_bytes], x)))
}

/// One tile against `N` tokens as [`tile_dots_avx2`], each block's integer dots by VNNI's
/// `vpdpbusd` on a transposed tile: lane i of a vector holds 4 packed bytes of row i, so each
/// token's 4 bytes are broadcast and the 8 rows' dots build up in their own lanes, with no
/// reduction across lanes (the layout of llama.cpp's `block_q4_0x8`, `repack.cpp`). `vpdpbusd`
/// multiplies unsigned by signed bytes: the weights are the levels lifted by `lift` (`lut`, all
/// in 0..=255), and each token's block `b` starts from `corr[t][b]` = −lift · Σx. Integer sums:
/// exact in any order (at most 32 · 255 · 127 a block), so the same dots and the same chains.
///
/// # Safety
/// AVX2, FMA, F16C and AVX-512 F, VL and VNNI; `corr[t]` as long as `xs[t]`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512vnni")]
unsafe fn tile_dots_vnni<const N: usize>(
    lut: &[u8; 16],
    tile: &[u8],
    row_bytes: usize,
    xs: [&[Q8Block]; N],
    corr: [&[i32]; N],
) -> [[f32; TILE_ROWS]; N] {
    use std::arch::x86_64::*;
    let blocks = row_bytes / BLOCK_BYTES;
    assert!(tile.len() >= TILE_ROWS * row_bytes && (0..N).all(|t| xs[t].len() >= blocks && corr[t].len() >= blocks));
    // SAFETY: a 16-byte load of the 16 lifted levels.
    let lut = _mm256_broadcastsi128_si256(unsafe { _mm_loadu_si128(lut.as_ptr().cast()) });
    let m4 = _mm256_set1_epi8(0x0f);
    let mut acc = [_mm256_setzero_ps(); N];
    for b in 0..blocks {
        // SAFETY: block b of the tile's rows (asserted above).
        let (lo, hi, dw) = unsafe { transposed_block(lut, m4, tile, row_bytes, b) };
        for t in 0..N {
            // SAFETY: block b of token t (asserted above).
            let (xb, c) = unsafe { (xs[t].get_unchecked(b), *corr[t].get_unchecked(b)) };
            let q = xb.qs.as_ptr().cast::<i32>();
            // SAFETY: 4-byte groups inside the block's 32 bytes.
            let x = |g: usize| _mm256_set1_epi32(unsafe { q.add(g).read_unaligned() });
            let (mut s_lo, mut s_hi) = (_mm256_set1_epi32(c), _mm256_setzero_si256());
            for g in 0..4 {
                s_lo = _mm256_dpbusd_epi32(s_lo, lo[g], x(g));
                s_hi = _mm256_dpbusd_epi32(s_hi, hi[g], x(4 + g));
            }
            let d = _mm256_mul_ps(dw, _mm256_set1_ps(xb.d));
            acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_add_epi32(s_lo, s_hi)), d, acc[t]);
        }
    }
    acc.map(|a| {
        let mut out = [0f32; TILE_ROWS];
        // SAFETY: an 8-float store into an 8-float array.
        unsafe { _mm256_storeu_ps(out.as_mut_ptr(), a) };
        out
    })
}

/// Block `b` of a tile's 8 rows, transposed: `lo[g]`/`hi[g]` lane i = row i's bytes 4g..4g+4
/// looked up in `lut` (elements 4g.. from the low nibbles, 16 + 4g.. from the high; a 4 x 4
/// transpose of 32-bit groups in each half), and the rows' scales in f32 (exact from f16).
///
/// # Safety
/// AVX2 and F16C; the tile holds `TILE_ROWS` rows of `row_bytes`, block `b` among them.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn transposed_block(
    lut: std::arch::x86_64::__m256i,
    m4: std::arch::x86_64::__m256i,
    tile: &[u8],
    row_bytes: usize,
    b: usize,
) -> ([std::arch::x86_64::__m256i; 4], [std::arch::x86_64::__m256i; 4], std::arch::x86_64::__m256) {
    use std::arch::x86_64::*;
    let at = |i: usize| i * row_bytes + b * BLOCK_BYTES;
    // SAFETY: rows i and i + 4's 16 packed bytes, inside the tile (the caller's promise).
    let y: [__m256i; 4] = std::array::from_fn(|i| unsafe {
        _mm256_loadu2_m128i(tile.as_ptr().add(at(i + 4) + 2).cast(), tile.as_ptr().add(at(i) + 2).cast())
    });
    let (t0, t1) = (_mm256_unpacklo_epi32(y[0], y[1]), _mm256_unpacklo_epi32(y[2], y[3]));
    let (t2, t3) = (_mm256_unpackhi_epi32(y[0], y[1]), _mm256_unpackhi_epi32(y[2], y[3]));
    let v = [
        _mm256_unpacklo_epi64(t0, t1),
        _mm256_unpackhi_epi64(t0, t1),
        _mm256_unpacklo_epi64(t2, t3),
        _mm256_unpackhi_epi64(t2, t3),
    ];
    let lo = v.map(|v| _mm256_shuffle_epi8(lut, _mm256_and_si256(v, m4)));
    let hi = v.map(|v| _mm256_shuffle_epi8(lut, _mm256_and_si256(_mm256_srli_epi16(v, 4), m4)));
    // SAFETY: each row's 2-byte scale, inside the tile.
    let h: [u16; TILE_ROWS] =
        std::array::from_fn(|i| unsafe { tile.as_ptr().add(at(i)).cast::<u16>().read_unaligned() });
    // SAFETY: a 16-byte load of 8 f16 scales.
    (lo, hi, _mm256_cvtph_ps(unsafe { _mm_loadu_si128(h.as_ptr().cast()) }))
}

/// [`tile_dots_vnni`] in AVX2, for levels lifted to at most 15 (Q4_0's nibbles themselves):
/// `maddubs` of the transposed tile and each token's broadcast bytes, the 8 groups' i16 pairs
/// summed before one `madd` to i32. Exact: a lane holds at most 8 · 2 · 15 · 128 < 2^15.
///
/// # Safety
/// AVX2, FMA and F16C; `lut` at most 15; `corr[t]` as long as `xs[t]`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn tile_dots_avx2_small<const N: usize>(
    lut: &[u8; 16],
    tile: &[u8],
    row_bytes: usize,
    xs: [&[Q8Block]; N],
    corr: [&[i32]; N],
) -> [[f32; TILE_ROWS]; N] {
    use std::arch::x86_64::*;
    let blocks = row_bytes / BLOCK_BYTES;
    assert!(lut.iter().all(|&u| u <= 15));
    assert!(tile.len() >= TILE_ROWS * row_bytes && (0..N).all(|t| xs[t].len() >= blocks && corr[t].len() >= blocks));
    // SAFETY: a 16-byte load of the 16 lifted levels.
    let lut = _mm256_broadcastsi128_si256(unsafe { _mm_loadu_si128(lut.as_ptr().cast()) });
    let m4 = _mm256_set1_epi8(0x0f);
    let ones = _mm256_set1_epi16(1);
    let mut acc = [_mm256_setzero_ps(); N];
    for b in 0..blocks {
        // SAFETY: block b of the tile's rows (asserted above).
        let (lo, hi, dw) = unsafe { transposed_block(lut, m4, tile, row_bytes, b) };
        for t in 0..N {
            // SAFETY: block b of token t (asserted above).
            let (xb, c) = unsafe { (xs[t].get_unchecked(b), *corr[t].get_unchecked(b)) };
            let q = xb.qs.as_ptr().cast::<i32>();
            // SAFETY: 4-byte groups inside the block's 32 bytes.
            let x = |g: usize| _mm256_set1_epi32(unsafe { q.add(g).read_unaligned() });
            let mut s = _mm256_setzero_si256();
            for g in 0..4 {
                s = _mm256_add_epi16(s, _mm256_maddubs_epi16(lo[g], x(g)));
                s = _mm256_add_epi16(s, _mm256_maddubs_epi16(hi[g], x(4 + g)));
            }
            let s = _mm256_add_epi32(_mm256_madd_epi16(s, ones), _mm256_set1_epi32(c));
            let d = _mm256_mul_ps(dw, _mm256_set1_ps(xb.d));
            acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), d, acc[t]);
        }
    }
    acc.map(|a| {
        let mut out = [0f32; TILE_ROWS];
        // SAFETY: an 8-float store into an 8-float array.
        unsafe { _mm256_storeu_ps(out.as_mut_ptr(), a) };
        out
    })
}

/// [`tile_dots_vnni`] on two tiles at once (16 rows, `tiles` holding them consecutively), in
/// 512-bit vectors: each token's broadcast bytes serve 16 rows' lanes.
///
/// # Safety
/// As [`tile_dots_vnni`], and AVX-512 BW.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn tile_pair_dots_vnni<const N: usize>(
    lut: &[u8; 16],
    tiles: &[u8],
    row_bytes: usize,
    xs: [&[Q8Block]; N],
    corr: [&[i32]; N],
) -> [[f32; 2 * TILE_ROWS]; N] {
    use std::arch::x86_64::*;
    let blocks = row_bytes / BLOCK_BYTES;
    assert!(
        tiles.len() >= 2 * TILE_ROWS * row_bytes && (0..N).all(|t| xs[t].len() >= blocks && corr[t].len() >= blocks)
    );
    // SAFETY: a 16-byte load of the 16 lifted levels.
    let lut = _mm512_broadcast_i32x4(unsafe { _mm_loadu_si128(lut.as_ptr().cast()) });
    let m4 = _mm512_set1_epi8(0x0f);
    let mut acc = [_mm512_setzero_ps(); N];
    let p = tiles.as_ptr();
    for b in 0..blocks {
        let at = |i: usize| i * row_bytes + b * BLOCK_BYTES;
        // SAFETY: rows i, i + 4, i + 8 and i + 12's 16 packed bytes, inside the tiles (asserted).
        let y: [__m512i; 4] = std::array::from_fn(|i| unsafe {
            let lo = _mm256_loadu2_m128i(p.add(at(i + 4) + 2).cast(), p.add(at(i) + 2).cast());
            let hi = _mm256_loadu2_m128i(p.add(at(i + 12) + 2).cast(), p.add(at(i + 8) + 2).cast());
            _mm512_inserti64x4::<1>(_mm512_castsi256_si512(lo), hi)
        });
        let (t0, t1) = (_mm512_unpacklo_epi32(y[0], y[1]), _mm512_unpacklo_epi32(y[2], y[3]));
        let (t2, t3) = (_mm512_unpackhi_epi32(y[0], y[1]), _mm512_unpackhi_epi32(y[2], y[3]));
        let v = [
            _mm512_unpacklo_epi64(t0, t1),
            _mm512_unpackhi_epi64(t0, t1),
            _mm512_unpacklo_epi64(t2, t3),
            _mm512_unpackhi_epi64(t2, t3),
        ];
        let lo = v.map(|v| _mm512_shuffle_epi8(lut, _mm512_and_si512(v, m4)));
        let hi = v.map(|v| _mm512_shuffle_epi8(lut, _mm512_and_si512(_mm512_srli_epi16::<4>(v), m4)));
        // SAFETY: each row's 2-byte scale, inside the tiles (asserted).
        let h: [u16; 16] = std::array::from_fn(|i| unsafe { p.add(at(i)).cast::<u16>().read_unaligned() });
        // SAFETY: a 32-byte load of 16 f16 scales (exact in f32).
        let dw = _mm512_cvtph_ps(unsafe { _mm256_loadu_si256(h.as_ptr().cast()) });
        for t in 0..N {
            // SAFETY: block b of token t (asserted above).
            let (xb, c) = unsafe { (xs[t].get_unchecked(b), *corr[t].get_unchecked(b)) };
            let q = xb.qs.as_ptr().cast::<i32>();
            // SAFETY: 4-byte groups inside the block's 32 bytes.
            let x = |g: usize| _mm512_set1_epi32(unsafe { q.add(g).read_unaligned() });
            let (mut s_lo, mut s_hi) = (_mm512_set1_epi32(c), _mm512_setzero_si512());
            for g in 0..4 {
                s_lo = _mm512_dpbusd_epi32(s_lo, lo[g], x(g));
                s_hi = _mm512_dpbusd_epi32(s_hi, hi[g], x(4 + g));
            }
            let d = _mm512_mul_ps(dw, _mm512_set1_ps(xb.d));
            acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(s_lo, s_hi)), d, acc[t]);
        }
    }
    acc.map(|a| {
        let mut out = [0f32; 2 * TILE_ROWS];
        // SAFETY: a 16-float store into a 16-float array.
        unsafe { _mm512_storeu_ps(out.as_mut_ptr(), a) };
        out
    })
}

/// The kernels that compute a tile on x86 (and elsewhere, without SIMD).
#[cfg(not(target_arch = "aarch64"))]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TileKernel {
    Scalar,
    /// `maddubs` + `madd` per row, as llama.cpp's AVX2 gemm; [`tile_dots_avx2_small`] for
    /// Q4_0.
    Avx2,
    /// [`tile_pair_dots_vnni`] on pairs of tiles, [`tile_dots_vnni`] on a last odd one.
    Vnni,
}

#[cfg(not(target_arch = "aarch64"))]
impl TileKernel {
    pub fn detect() -> Self {
        match (has_avx2_f16c(), super::cpu::has_avx512_vnni()) {
            (false, _) => TileKernel::Scalar,
            (true, false) => TileKernel::Avx2,
            (true, true) => TileKernel::Vnni,
        }
    }

    /// Tokens one unpacking of a tile's nibbles serves: AVX-512's 32 vector registers hold 16
    /// tokens' sums beside the tiles' 8 unpacked vectors.
    fn tokens(self) -> usize {
        match self {
            TileKernel::Vnni => 16,
            _ => 4,
        }
    }

    /// Rows one call computes: VNNI takes two tiles where it can ([`tile_pair_dots_vnni`]).
    fn rows(self) -> usize {
        match self {
            TileKernel::Vnni => 2 * TILE_ROWS,
            _ => TILE_ROWS,
        }
    }

    /// Every kernel this CPU runs.
    pub fn available() -> Vec<Self> {
        [TileKernel::Scalar, TileKernel::Avx2, TileKernel::Vnni]
            .into_iter()
            .filter(|&k| k == TileKernel::Scalar || k == TileKernel::Avx2 && has_avx2_f16c() || k == Self::detect())
            .collect()
    }
}

/// `x`: `[tokens, cols]` → `[tokens, rows]` over `bytes` (`rows` rows of `cols / 32` blocks,
/// `rows` a multiple of [`TILE_ROWS`]), activations quantized as ggml's x86 `quantize_row_q8_0`
/// does.
pub(crate) fn matmul(levels: &[i8; 16], bytes: &[u8], rows: usize, cols: usize, x: &Tensor) -> Result<Tensor> {
    assert!(rows.is_multiple_of(TILE_ROWS), "{rows} rows: not whole tiles of {TILE_ROWS}");
    let q8: Vec<Vec<Q8Block>> = activations(x)?.chunks_exact(cols).map(quantize_q8_1).collect();
    let row_bytes = cols / QK * BLOCK_BYTES;
    #[cfg(target_arch = "aarch64")]
    return matmul_arm(levels, bytes, rows, row_bytes, &q8, super::arm::ArmKernel::detect());
    #[cfg(not(target_arch = "aarch64"))]
    matmul_x86(levels, bytes, rows, row_bytes, &q8, TileKernel::detect())
}

/// Q4_0's `[tokens, cols]` → `[tokens, rows]` by `kernel` (one of [`TileKernel::available`]),
/// for `model kernel-bench` to time each against the others.
#[cfg(not(target_arch = "aarch64"))]
pub fn q4_0_matmul_with(kernel: TileKernel, bytes: &[u8], rows: usize, cols: usize, x: &Tensor) -> Result<Tensor> {
    assert!(rows.is_multiple_of(TILE_ROWS) && cols.is_multiple_of(QK) && bytes.len() >= rows * cols / QK * BLOCK_BYTES);
    assert!(TileKernel::available().contains(&kernel), "{kernel:?} does not run on this CPU");
    let q8: Vec<Vec<Q8Block>> = activations(x)?.chunks_exact(cols).map(quantize_q8_1).collect();
    matmul_x86(&Q4_0_LEVELS, bytes, rows, cols / QK * BLOCK_BYTES, &q8, kernel)
}

#[cfg(not(target_arch = "aarch64"))]
fn matmul_x86(
    levels: &[i8; 16],
    bytes: &[u8],
    rows: usize,
    row_bytes: usize,
    q8: &[Vec<Q8Block>],
    kernel: TileKernel,
) -> Result<Tensor> {
    let tokens = q8.len();
    let chunk = kernel.tokens();
    // VNNI's lifted levels and each token's blocks' −lift · Σx.
    let lift = -(*levels.iter().min().unwrap() as i32);
    let lut: [u8; 16] = levels.map(|l| (l as i32 + lift) as u8);
    // AVX2 sums lifted levels of at most 15 in i16 (`tile_dots_avx2_small`).
    let small = cfg!(target_arch = "x86_64") && kernel == TileKernel::Avx2 && lut.iter().all(|&u| u <= 15);
    let corr: Vec<Vec<i32>> = match kernel {
        _ if small => {
            q8.iter().map(|x| x.iter().map(|b| -lift * b.qs.iter().map(|&q| q as i32).sum::<i32>()).collect()).collect()
        }
        TileKernel::Vnni => {
            q8.iter().map(|x| x.iter().map(|b| -lift * b.qs.iter().map(|&q| q as i32).sum::<i32>()).collect()).collect()
        }
        _ => Vec::new(),
    };
    let work = rows * row_bytes / BLOCK_BYTES * QK * tokens;
    row_groups_by_tokens(rows, tokens, work, kernel.rows(), |r, out| {
        // `out` is `[row][token]` for the group's rows: one tile, or two for VNNI where the
        // height allows.
        let group = out.len() / tokens;
        let tile = &bytes[r * row_bytes..(r + group) * row_bytes];
        if kernel == TileKernel::Scalar {
            for (i, ys) in out.chunks_exact_mut(tokens).enumerate() {
                let row = &tile[i * row_bytes..(i + 1) * row_bytes];
                ys.iter_mut().enumerate().for_each(|(t, y)| *y = dot_scalar(levels, row, &q8[t]));
            }
            return;
        }
        for c in (0..tokens).step_by(chunk) {
            let x = |i: usize| &q8[c + i][..];
            #[cfg(target_arch = "x86_64")]
            let cr = |i: usize| &corr[c + i][..];
            macro_rules! avx2 {
                ($n:literal) => {
                    // SAFETY: AVX2, FMA and F16C were detected at run time.
                    put(out, tokens, c, &unsafe {
                        tile_dots_avx2::<$n>(levels, tile, row_bytes, std::array::from_fn(x))
                    })
                };
            }
            #[cfg(target_arch = "x86_64")]
            macro_rules! avx2_small {
                ($n:literal) => {
                    // SAFETY: AVX2, FMA and F16C were detected at run time; `lut` is at most 15
                    // (`small`) and `corr` holds each token's blocks.
                    put(out, tokens, c, &unsafe {
                        tile_dots_avx2_small::<$n>(
                            &lut,
                            tile,
                            row_bytes,
                            std::array::from_fn(x),
                            std::array::from_fn(cr),
                        )
                    })
                };
            }
            #[cfg(target_arch = "x86_64")]
            macro_rules! vnni {
                ($n:literal) => {
                    // SAFETY: AVX-512 F, BW, VL and VNNI, AVX2, FMA and F16C were detected at run
                    // time; `corr` holds each token's blocks.
                    put(out, tokens, c, &unsafe {
                        tile_dots_vnni::<$n>(&lut, tile, row_bytes, std::array::from_fn(x), std::array::from_fn(cr))
                    })
                };
            }
            #[cfg(target_arch = "x86_64")]
            macro_rules! vnni_pair {
                ($n:literal) => {
                    // SAFETY: as `vnni!`'s; `tile` holds two tiles.
                    put(out, tokens, c, &unsafe {
                        tile_pair_dots_vnni::<$n>(
                            &lut,
                            tile,
                            row_bytes,
                            std::array::from_fn(x),
                            std::array::from_fn(cr),
                        )
                    })
                };
            }
            macro_rules! by_tokens {
                ($k:ident, $n:expr) => {
                    match $n {
                        1 => $k!(1),
                        2 => $k!(2),
                        3 => $k!(3),
                        4 => $k!(4),
                        5 => $k!(5),
                        6 => $k!(6),
                        7 => $k!(7),
                        8 => $k!(8),
                        9 => $k!(9),
                        10 => $k!(10),
                        11 => $k!(11),
                        12 => $k!(12),
                        13 => $k!(13),
                        14 => $k!(14),
                        15 => $k!(15),
                        _ => $k!(16),
                    }
                };
            }
            let n = (tokens - c).min(chunk);
            match kernel {
                #[cfg(target_arch = "x86_64")]
                TileKernel::Vnni if group == 2 * TILE_ROWS => by_tokens!(vnni_pair, n),
                #[cfg(target_arch = "x86_64")]
                TileKernel::Vnni => by_tokens!(vnni, n),
                #[cfg(target_arch = "x86_64")]
                _ if small => match n {
                    1 => avx2_small!(1),
                    2 => avx2_small!(2),
                    3 => avx2_small!(3),
                    _ => avx2_small!(4),
                },
                _ => match n {
                    1 => avx2!(1),
                    2 => avx2!(2),
                    3 => avx2!(3),
                    _ => avx2!(4),
                },
            }
        }
    })
}

/// The aarch64 path (IQ4_NL only: aarch64's Q4_0 takes `q4_0.rs`' NEON kernels): each row's
/// [`dot_scalar`] chain per token, each block's integer dot in NEON or `sdot`
/// ([`super::arm::block_dot`]) and its nibbles looked up once for all tokens, so the same bits.
#[cfg(target_arch = "aarch64")]
fn matmul_arm(
    levels: &[i8; 16],
    bytes: &[u8],
    rows: usize,
    row_bytes: usize,
    q8: &[Vec<Q8Block>],
    kernel: super::arm::ArmKernel,
) -> Result<Tensor> {
    let xs: Vec<&[Q8Block]> = q8.iter().map(|x| &x[..]).collect();
    let work = rows * row_bytes / BLOCK_BYTES * QK * xs.len();
    super::matvec::rows_by_tokens(rows, xs.len(), work, |r, out| {
        let row = &bytes[r * row_bytes..(r + 1) * row_bytes];
        super::arm::dispatch!(kernel, dots_arm(levels, row, &xs, out))
    })
}

/// [`dot_scalar`] for each token of `xs` into `out`.
///
/// # Safety
/// `SDOT` only where the CPU has FEAT_DotProd.
#[cfg(target_arch = "aarch64")]
#[inline(always)]
unsafe fn dots_arm<const SDOT: bool>(levels: &[i8; 16], row: &[u8], xs: &[&[Q8Block]], out: &mut [f32]) {
    assert!(out.len() == xs.len() && xs.iter().all(|x| x.len() * BLOCK_BYTES >= row.len()));
    out.fill(0.0);
    for (b, block) in row.chunks_exact(BLOCK_BYTES).enumerate() {
        // SAFETY: the block's 16 packed bytes.
        let w = unsafe { super::arm::nibble_levels(&block[2..], levels) };
        let d = scale(block);
        for (y, x) in out.iter_mut().zip(xs) {
            // SAFETY: the caller's proof of dotprod is passed on.
            let dot = unsafe { super::arm::block_dot::<SDOT>(w, &x[b].qs) };
            *y = (dot as f32).mul_add(d * x[b].d, *y);
        }
    }
}

/// Tokens `c..` of a group's results (`[token][row]`) into `out` (`[row][token]`).
#[cfg(not(target_arch = "aarch64"))]
fn put<const R: usize>(out: &mut [f32], tokens: usize, c: usize, got: &[[f32; R]]) {
    for (t, ys) in got.iter().enumerate() {
        for (i, &y) in ys.iter().enumerate() {
            out[i * tokens + c + t] = y;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    #[test]
    fn every_token_of_a_multi_token_call_equals_the_scalar_chain_bit_for_bit() {
        let (rows, cols) = (16, 7 * QK);
        let bytes = super::super::lattice::tests::random_blocks(BLOCK_BYTES, rows * 7, 8);
        // One token, a part chunk, and a whole chunk with a part one.
        for tokens in [1, 3, 6] {
            let xs = super::super::q8::tests::random(tokens * cols, 4);
            let x = Tensor::from_vec(xs.clone(), (tokens, cols), &Device::Cpu).unwrap();
            for levels in [&Q4_0_LEVELS, &super::super::iq_grids::KVALUES_IQ4NL] {
                let got = matmul(levels, &bytes, rows, cols, &x).unwrap().to_vec2::<f32>().unwrap();
                for t in 0..tokens {
                    let q8 = quantize_q8_1(&xs[t * cols..(t + 1) * cols]);
                    for r in 0..rows {
                        let want = dot_scalar(levels, &bytes[r * 7 * BLOCK_BYTES..(r + 1) * 7 * BLOCK_BYTES], &q8);
                        assert_eq!(got[t][r].to_bits(), want.to_bits(), "token {t} row {r}");
                    }
                }
            }
        }
    }

    /// Each x86 kernel this CPU runs, on both tables, gives every token the scalar chain's bits:
    /// one block a row or many; one tile, pairs of tiles, and pairs with a lone tile (VNNI's two
    /// paths), across threads' shares too; token counts that fill a chunk of either kernel, leave
    /// a part one, or both. (AVX2 takes `tile_dots_avx2_small` on Q4_0, `tile_dots_avx2` on
    /// IQ4_NL.)
    #[cfg(not(target_arch = "aarch64"))]
    #[test]
    fn every_x86_kernel_gives_the_scalar_chains_bits() {
        let shapes = [(8, 1, 1), (16, 9, 5), (24, 2, 8), (8, 33, 17), (16, 64, 12), (32, 5, 16), (40, 3, 33)];
        for (seed, (rows, blocks, tokens)) in (1u64..).zip(shapes) {
            let row_bytes = blocks * BLOCK_BYTES;
            let bytes = super::super::lattice::tests::random_blocks(BLOCK_BYTES, rows * blocks, seed);
            let q8: Vec<Vec<Q8Block>> = (0..tokens as u64)
                .map(|t| quantize_q8_1(&super::super::q8::tests::random(blocks * QK, 100 * seed + t)))
                .collect();
            for levels in [&Q4_0_LEVELS, &super::super::iq_grids::KVALUES_IQ4NL] {
                let want: Vec<u32> = q8
                    .iter()
                    .flat_map(|x| {
                        (0..rows).map(|r| dot_scalar(levels, &bytes[r * row_bytes..(r + 1) * row_bytes], x).to_bits())
                    })
                    .collect();
                for kernel in TileKernel::available() {
                    let got = matmul_x86(levels, &bytes, rows, row_bytes, &q8, kernel).unwrap().flatten_all().unwrap();
                    let got: Vec<u32> = got.to_vec1::<f32>().unwrap().iter().map(|y| y.to_bits()).collect();
                    assert_eq!(got, want, "{kernel:?}: {rows} rows of {blocks} blocks, {tokens} tokens");
                }
            }
        }
    }

    /// The kernels the test above runs are those this CPU has: AVX2 (with FMA and F16C) where
    /// detected, VNNI where AVX-512 VNNI is too, and `matmul` takes the best of them.
    #[cfg(not(target_arch = "aarch64"))]
    #[test]
    fn the_x86_kernels_tested_are_those_the_cpu_has() {
        let avx2 = has_avx2_f16c();
        let vnni = avx2 && super::super::cpu::has_avx512_vnni();
        let mut want = vec![TileKernel::Scalar];
        want.extend(avx2.then_some(TileKernel::Avx2));
        want.extend(vnni.then_some(TileKernel::Vnni));
        assert_eq!(TileKernel::available(), want);
        assert_eq!(TileKernel::detect(), *want.last().unwrap());
    }

    /// Each aarch64 path (NEON, dotprod) on IQ4_NL's levels, the heights llama.cpp repacks:
    /// every token of a call, one block a row or an odd count, gives the scalar chain's bits.
    #[cfg(target_arch = "aarch64")]
    #[test]
    fn every_arm_path_gives_the_scalar_chains_bits() {
        let levels = &super::super::iq_grids::KVALUES_IQ4NL;
        for (seed, (rows, blocks, tokens)) in (1u64..).zip([(8, 1, 1), (16, 9, 5), (24, 2, 4), (8, 33, 9)]) {
            let row_bytes = blocks * BLOCK_BYTES;
            let bytes = super::super::lattice::tests::random_blocks(BLOCK_BYTES, rows * blocks, seed);
            let q8: Vec<Vec<Q8Block>> = (0..tokens as u64)
                .map(|t| quantize_q8_1(&super::super::q8::tests::random(blocks * QK, 100 * seed + t)))
                .collect();
            let want: Vec<u32> = q8
                .iter()
                .flat_map(|x| {
                    (0..rows).map(|r| dot_scalar(levels, &bytes[r * row_bytes..(r + 1) * row_bytes], x).to_bits())
                })
                .collect();
            for kernel in super::super::arm::ArmKernel::available() {
                let got = matmul_arm(levels, &bytes, rows, row_bytes, &q8, kernel).unwrap().flatten_all().unwrap();
                let got: Vec<u32> = got.to_vec1::<f32>().unwrap().iter().map(|y| y.to_bits()).collect();
                assert_eq!(got, want, "{kernel:?}: {rows} rows of {blocks} blocks, {tokens} tokens");
            }
        }
    }
}
