//! Activations as ggml's Q8_1 blocks, the input of every integer kernel (Q4_0, Q4_1, Q8_0):
//! `quantize_row_q8_1`'s rounding, the layout a chunk of tokens takes so each weight block is
//! decoded once for all of them, and the byte-pair products the x86 kernels share.

use candle_core::Tensor;
use half::f16;

#[cfg(target_arch = "x86_64")]
use super::cpu::{has_avx2, has_avx512_vnni};
use super::matvec::{activations, fill_group, row_groups_by_tokens};
use crate::error::Result;

/// Elements in a block.
pub(crate) const QK: usize = 32;

/// One 32-block of activations in ggml `block_q8_1`, scales widened to f32.
pub(crate) struct Q8Block {
    pub(crate) d: f32,
    pub(crate) s: f32,
    pub(crate) qs: [i8; QK],
}

/// Up to [`TOKENS`] tokens' Q8 blocks laid out for a kernel that decodes each weight block once
/// for all of them: block b's bytes of token t at `qs[b · n + t]`, and the tokens' scales and
/// sums of block b side by side in `d[b]` and `s[b]` (lane t; lanes from n on zero), so that
/// d_w·d_x and the m_w·s_x terms of every token take one vector operation a block, each lane
/// the same IEEE operation a lone token's scalar one is.
pub(crate) struct TokenBlocks<'a> {
    pub(crate) tokens: Vec<&'a [Q8Block]>,
    pub(crate) qs: Vec<[i8; QK]>,
    pub(crate) d: Vec<[f32; LANES]>,
    pub(crate) s: Vec<[f32; LANES]>,
    /// The kernel this CPU runs, detected once for the whole matrix.
    pub(crate) kernel: ChunkKernel,
}

/// Lanes of a block's scales and sums: a 512-bit vector.
pub(crate) const LANES: usize = 16;

/// The chunk kernels, best first.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(target_arch = "aarch64", allow(dead_code))]
pub(crate) enum ChunkKernel {
    /// AVX-512 F, BW, VL and VNNI (with AVX2, FMA and F16C): two tokens to a 512-bit vector.
    Avx512,
    /// AVX2, FMA and F16C: a token to a 256-bit vector.
    Avx2,
    Scalar,
    /// An aarch64 path: a token at a time, each block's weights loaded once for all of them (two
    /// rows against two tokens at a time on i8mm).
    #[cfg(target_arch = "aarch64")]
    Arm(super::arm::ArmKernel),
}

impl ChunkKernel {
    #[cfg(target_arch = "aarch64")]
    pub(crate) fn detect() -> Self {
        ChunkKernel::Arm(super::arm::ArmKernel::detect())
    }

    #[cfg(not(target_arch = "aarch64"))]
    pub(crate) fn detect() -> Self {
        if !super::matvec::has_avx2_f16c() {
            ChunkKernel::Scalar
        } else if has_avx512_vnni() {
            ChunkKernel::Avx512
        } else {
            ChunkKernel::Avx2
        }
    }

    /// Tokens a chunk holds: the accumulators the kernel keeps in registers (AVX-512's 32
    /// vectors hold five pairs, so a verify pass of up to 10 rows decodes each block once).
    fn tokens(self) -> usize {
        match self {
            ChunkKernel::Avx512 => TOKENS,
            ChunkKernel::Avx2 | ChunkKernel::Scalar => AVX2_TOKENS,
            #[cfg(target_arch = "aarch64")]
            ChunkKernel::Arm(_) => TOKENS,
        }
    }

    /// Whether the kernel computes rows two at a time (i8mm's `smmla`: two rows by two tokens).
    fn pairs_rows(self) -> bool {
        #[cfg(target_arch = "aarch64")]
        if self == ChunkKernel::Arm(super::arm::ArmKernel::I8mm) {
            return true;
        }
        false
    }
}

impl<'a> TokenBlocks<'a> {
    pub(crate) fn new(tokens: Vec<&'a [Q8Block]>, nb: usize, kernel: ChunkKernel) -> Self {
        let n = tokens.len();
        assert!(
            (1..=kernel.tokens()).contains(&n) && tokens.iter().all(|x| x.len() >= nb),
            "{n} tokens of {nb} blocks"
        );
        let (mut qs, mut d, mut s) = (Vec::with_capacity(nb * n), vec![[0f32; LANES]; nb], vec![[0f32; LANES]; nb]);
        for b in 0..nb {
            for (t, x) in tokens.iter().enumerate() {
                qs.push(x[b].qs);
                (d[b][t], s[b][t]) = (x[b].d, x[b].s);
            }
        }
        TokenBlocks { tokens, qs, d, s, kernel }
    }

    pub(crate) fn len(&self) -> usize {
        self.tokens.len()
    }
}

/// Most tokens whose dot products with a row share one decoding of each weight block (one
/// accumulator each: the tokens are the independent chains), the AVX-512 kernels' chunk.
pub(crate) const TOKENS: usize = 10;

/// The AVX2 kernels' chunk: eight accumulators, and the tokens' scales fill one 8-lane vector.
pub(crate) const AVX2_TOKENS: usize = 8;

/// `out.copy_from_slice(&kernel::<N>(args.., xs))` for the N = `xs.len()` (1 to [`TOKENS`]) of
/// a chunk of tokens: a kernel that keeps one accumulator per token.
#[cfg(target_arch = "x86_64")]
macro_rules! by_tokens {
    ($xs:ident, $out:ident, $kernel:ident($($arg:expr),*)) => {
        match $xs.len() {
            1 => $out.copy_from_slice(&$kernel::<1>($($arg,)* $xs)),
            2 => $out.copy_from_slice(&$kernel::<2>($($arg,)* $xs)),
            3 => $out.copy_from_slice(&$kernel::<3>($($arg,)* $xs)),
            4 => $out.copy_from_slice(&$kernel::<4>($($arg,)* $xs)),
            5 => $out.copy_from_slice(&$kernel::<5>($($arg,)* $xs)),
            6 => $out.copy_from_slice(&$kernel::<6>($($arg,)* $xs)),
            7 => $out.copy_from_slice(&$kernel::<7>($($arg,)* $xs)),
            8 => $out.copy_from_slice(&$kernel::<8>($($arg,)* $xs)),
            9 => $out.copy_from_slice(&$kernel::<9>($($arg,)* $xs)),
            _ => $out.copy_from_slice(&$kernel::<10>($($arg,)* $xs)),
        }
    };
}
#[cfg(target_arch = "x86_64")]
pub(crate) use by_tokens;

/// `x`: `[tokens, cols]` → `[tokens, rows]` for a matrix whose kernels take activations as Q8
/// blocks. One token: `dots(r, x)` computes rows `r..r + N` (a whole group), `one(r, x)` row r
/// alone. Several (a verify pass's or a batch's rows): `row_tokens(r, xs, out)` row r against
/// a chunk of up to [`TOKENS`] tokens, each weight block decoded once for all of them, and
/// `pair_tokens(r, xs, [out_r, out_r1])` rows r and r + 1 together where the kernel pairs rows
/// ([`chunks_matmul`]). Each (row, token) sum is computed in the same order either way, so a
/// token's result does not depend on the tokens or rows beside it.
pub(crate) fn q8_matmul<const N: usize>(
    rows: usize,
    cols: usize,
    x: &Tensor,
    dots: impl Fn(usize, &[Q8Block]) -> [f32; N] + Sync,
    one: impl Fn(usize, &[Q8Block]) -> f32 + Sync,
    row_tokens: impl Fn(usize, &TokenBlocks, &mut [f32]) + Sync,
    pair_tokens: impl Fn(usize, &TokenBlocks, [&mut [f32]; 2]) + Sync,
) -> Result<Tensor> {
    let tokens = x.dim(0)?;
    let q8: Vec<Vec<Q8Block>> = activations(x)?.chunks_exact(cols).map(quantize_q8_1).collect();
    if tokens == 1 {
        return row_groups_by_tokens(rows, tokens, rows * cols, N, |r0, out| {
            fill_group(out, tokens, |t| dots(r0, &q8[t]), |i, t| one(r0 + i, &q8[t]))
        });
    }
    chunks_matmul(rows, cols, &q8, ChunkKernel::detect(), row_tokens, pair_tokens)
}

/// [`q8_matmul`]'s several tokens (`q8`, one vector of blocks each) on chunk kernel `kernel`: the
/// tokens in chunks of up to its [`ChunkKernel::tokens`], the rows one at a time, or in pairs by
/// `pair_tokens` where the kernel pairs them (the odd last row alone by `row_tokens`).
pub(crate) fn chunks_matmul(
    rows: usize,
    cols: usize,
    q8: &[Vec<Q8Block>],
    kernel: ChunkKernel,
    row_tokens: impl Fn(usize, &TokenBlocks, &mut [f32]) + Sync,
    pair_tokens: impl Fn(usize, &TokenBlocks, [&mut [f32]; 2]) + Sync,
) -> Result<Tensor> {
    let tokens = q8.len();
    let chunk = kernel.tokens();
    let chunks: Vec<TokenBlocks> =
        q8.chunks(chunk).map(|c| TokenBlocks::new(c.iter().map(|x| &x[..]).collect(), cols / QK, kernel)).collect();
    let group = if kernel.pairs_rows() { 2 } else { 1 };
    row_groups_by_tokens(rows, tokens, rows * cols * tokens, group, |r, out| {
        if out.len() == 2 * tokens {
            let (first, second) = out.split_at_mut(tokens);
            for (xs, (a, b)) in chunks.iter().zip(first.chunks_mut(chunk).zip(second.chunks_mut(chunk))) {
                pair_tokens(r, xs, [a, b]);
            }
        } else {
            for (xs, out) in chunks.iter().zip(out.chunks_mut(chunk)) {
                row_tokens(r, xs, out);
            }
        }
    })
}

/// ggml's x86 `quantize_row_q8_1` (the SIMD path llama.cpp runs on AVX2 machines, which differs
/// from the C reference in rounding): id = 127 / max|x|, round half to even, s = f16(d · Σq).
pub(crate) fn quantize_q8_1(x: &[f32]) -> Vec<Q8Block> {
    #[cfg(target_arch = "x86_64")]
    if has_avx2() {
        // SAFETY: AVX2 (and with it SSE4.1's rounding) was detected at run time.
        return unsafe { quantize_avx2(x) };
    }
    #[cfg(target_arch = "aarch64")]
    return quantize_neon(x);
    #[cfg(not(target_arch = "aarch64"))]
    quantize_blocks(x)
}

/// [`quantize_blocks`] in 4-lane vectors: the same maximum (`fmaxnmv` ignores NaN as `f32::max`
/// does), the same IEEE multiply by 127/max, `fcvtns` rounding half to even, and the same integer
/// sum, so the blocks x86 makes. ggml's NEON `quantize_row_q8_1` multiplies by 1/d instead, which
/// can round a value differently; an aarch64 machine here computes what an x86 one does.
#[cfg(target_arch = "aarch64")]
fn quantize_neon(x: &[f32]) -> Vec<Q8Block> {
    use std::arch::aarch64::*;
    let mut out = Vec::with_capacity(x.len() / QK);
    for x in x.chunks_exact(QK) {
        // SAFETY: base NEON (every aarch64 CPU); eight 4-lane loads within the 32 elements and
        // four 8-byte stores within the 32 bytes.
        let (d, sum, qs) = unsafe {
            let v: [float32x4_t; 8] = std::array::from_fn(|i| vld1q_f32(x.as_ptr().add(4 * i)));
            let amax = vmaxnmvq_f32(v.iter().fold(vdupq_n_f32(0.0), |m, v| vmaxnmq_f32(m, vabsq_f32(*v))));
            let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
            let q = v.map(|v| vcvtnq_s32_f32(vmulq_n_f32(v, id)));
            let sum = vaddvq_s32(q.iter().fold(vdupq_n_s32(0), |s, q| vaddq_s32(s, *q)));
            let mut qs = [0i8; QK];
            for (i, pair) in q.chunks_exact(2).enumerate() {
                let halves = vcombine_s16(vqmovn_s32(pair[0]), vqmovn_s32(pair[1]));
                vst1_s8(qs.as_mut_ptr().add(8 * i), vqmovn_s16(halves));
            }
            (amax / 127.0, sum, qs)
        };
        out.push(Q8Block { d: f16::from_f32(d).to_f32(), s: f16::from_f32(d * sum as f32).to_f32(), qs });
    }
    out
}

/// [`quantize_blocks`] in 8-lane vectors, as ggml's AVX2 `quantize_row_q8_1` is written: the same
/// maximum, the same IEEE multiply and round-half-to-even per element, and the same integer sum,
/// so the same blocks (tested against the scalar loop); the scalar loop took ~0.45 ms of a
/// SmolLM2 row's ~15 ms, one element at a time.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn quantize_avx2(x: &[f32]) -> Vec<Q8Block> {
    use std::arch::x86_64::*;
    let abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFF_FFFF));
    let mut out = Vec::with_capacity(x.len() / QK);
    for x in x.chunks_exact(QK) {
        // SAFETY: four 8-lane loads within the 32 elements.
        let v: [__m256; 4] = std::array::from_fn(|i| unsafe { _mm256_loadu_ps(x.as_ptr().add(8 * i)) });
        let m = v.iter().fold(_mm256_setzero_ps(), |m, v| _mm256_max_ps(m, _mm256_and_ps(*v, abs_mask)));
        let m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
        let m2 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        let amax = _mm_cvtss_f32(_mm_max_ss(m2, _mm_movehdup_ps(m2)));
        let d = amax / 127.0;
        let id = _mm256_set1_ps(if amax != 0.0 { 127.0 / amax } else { 0.0 });
        let q = v.map(|v| {
            _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v, id), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC))
        });
        let total = _mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3]));
        let t4 = _mm_add_epi32(_mm256_castsi256_si128(total), _mm256_extracti128_si256(total, 1));
        let t2 = _mm_add_epi32(t4, _mm_unpackhi_epi64(t4, t4));
        let sum = _mm_cvtsi128_si32(_mm_add_epi32(t2, _mm_shuffle_epi32(t2, 1)));
        // packs interleave the 128-bit lanes; the permutation puts the 32 bytes back in order.
        let bytes = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
        let bytes = _mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
        let mut qs = [0i8; QK];
        // SAFETY: a 32-byte store into 32 bytes.
        unsafe { _mm256_storeu_si256(qs.as_mut_ptr().cast(), bytes) };
        out.push(Q8Block { d: f16::from_f32(d).to_f32(), s: f16::from_f32(d * sum as f32).to_f32(), qs });
    }
    out
}

// The reference the vector code is tested against, and the path without AVX2 or NEON.
#[cfg_attr(target_arch = "aarch64", allow(dead_code))]
fn quantize_blocks(x: &[f32]) -> Vec<Q8Block> {
    let mut out = Vec::with_capacity(x.len() / QK);
    for x in x.chunks_exact(QK) {
        let mut amax = 0f32;
        for v in x {
            amax = amax.max(v.abs());
        }
        let d = amax / 127.0;
        let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
        let mut qs = [0i8; QK];
        let mut sum = 0i32;
        for i in 0..QK {
            qs[i] = (x[i] * id).round_ties_even() as i8;
            sum += qs[i] as i32;
        }
        out.push(Q8Block { d: f16::from_f32(d).to_f32(), s: f16::from_f32(d * sum as f32).to_f32(), qs });
    }
    out
}

/// Token t's 8-lane accumulator of [`token_dots_avx512`]'s pairs (and odd `last` of `n`).
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx512f")]
pub(crate) fn half_of(
    pairs: &[std::arch::x86_64::__m512; PAIRS],
    last: std::arch::x86_64::__m256,
    n: usize,
    t: usize,
) -> std::arch::x86_64::__m256 {
    use std::arch::x86_64::*;
    if t == n - 1 && !n.is_multiple_of(2) {
        return last;
    }
    let pair = _mm512_castps_pd(pairs[t / 2]);
    _mm256_castpd_ps(if t.is_multiple_of(2) { _mm512_castpd512_pd256(pair) } else { _mm512_extractf64x4_pd(pair, 1) })
}

/// Token pairs of a chunk in [`token_dots_avx512`].
#[cfg(target_arch = "x86_64")]
pub(crate) const PAIRS: usize = TOKENS / 2;

/// Unsigned × signed bytes, each 4 neighbours' products summed into 8 i32 lanes, as ggml's
/// `mul_sum_us8_pairs_float` does: `maddubs` to i16 pairs, then `madd` by ones. The i16 pairs
/// never saturate here: a Q4_1 weight is at most 15 (2 · 15 · 128 < 2^15), Q8_0's |w| at most
/// 128 against |x| ≤ 127 (2 · 128 · 127 < 2^15).
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx2")]
pub(crate) fn pairs_avx2(w: std::arch::x86_64::__m256i, x: std::arch::x86_64::__m256i) -> std::arch::x86_64::__m256i {
    use std::arch::x86_64::*;
    _mm256_madd_epi16(_mm256_maddubs_epi16(w, x), _mm256_set1_epi16(1))
}

/// [`pairs_avx2`]'s lanes in one VNNI instruction.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx2,avx512vnni,avx512vl")]
pub(crate) fn pairs_vnni(w: std::arch::x86_64::__m256i, x: std::arch::x86_64::__m256i) -> std::arch::x86_64::__m256i {
    use std::arch::x86_64::*;
    _mm256_dpbusd_epi32(_mm256_setzero_si256(), w, x)
}

/// For each chunk kernel this CPU runs and each chunk of 1 to [`TOKENS`] of `q8`'s first tokens
/// it holds: `chunk(r, xs, out)` equals `alone(r, x)` for each token x, bit for bit, in rows
/// `0..rows`.
#[cfg(test)]
pub(crate) fn each_chunk_equals_each_token_alone(
    q8: &[Vec<Q8Block>],
    rows: usize,
    alone: impl Fn(usize, &[Q8Block]) -> f32,
    chunk: impl Fn(usize, &TokenBlocks, &mut [f32]),
) {
    let nb = q8[0].len();
    // The one-token path sums in the scalar order only where the chunks do too; an AVX-512 CPU
    // runs the AVX2 kernel as well.
    #[cfg(not(target_arch = "aarch64"))]
    let kernels = match ChunkKernel::detect() {
        ChunkKernel::Avx512 => vec![ChunkKernel::Avx512, ChunkKernel::Avx2],
        kernel => vec![kernel],
    };
    // Every aarch64 path sums in the scalar order, the one-token path's included.
    #[cfg(target_arch = "aarch64")]
    let kernels: Vec<ChunkKernel> = super::arm::ArmKernel::available().into_iter().map(ChunkKernel::Arm).collect();
    for kernel in kernels {
        for n in 1..=kernel.tokens().min(q8.len()) {
            let xs = TokenBlocks::new(q8[..n].iter().map(|x| &x[..]).collect(), nb, kernel);
            for r in 0..rows {
                let want: Vec<f32> = q8[..n].iter().map(|x| alone(r, x)).collect();
                let mut out = vec![0f32; n];
                chunk(r, &xs, &mut out);
                assert_eq!(out, want, "{kernel:?}, {n} tokens, row {r}");
            }
        }
    }
}

/// Shapes for the aarch64 paths' tests: (rows, blocks a row, tokens), odd counts and chunk tails
/// among them (one block; 7, 33 blocks; odd and even rows, so i8mm's row pairs with and without
/// a last row alone; 11 and 12 tokens: a whole chunk and an odd or even rest; odd chunks).
#[cfg(all(test, target_arch = "aarch64"))]
const ARM_SHAPES: [(usize, usize, usize); 7] =
    [(1, 1, 1), (3, 7, 11), (5, 33, 4), (9, 2, TOKENS), (2, 9, 3), (4, 3, TOKENS + 2), (6, 5, 7)];

/// One test case of the aarch64 paths: rows, blocks a row, a matrix's ggml blocks, tokens.
#[cfg(all(test, target_arch = "aarch64"))]
pub(crate) type ArmCase = (usize, usize, Vec<u8>, Vec<Vec<Q8Block>>);

/// For each of [`ARM_SHAPES`]: rows, blocks a row, a random matrix quantized to `dtype` (ggml's
/// blocks) and random tokens' Q8 blocks.
#[cfg(all(test, target_arch = "aarch64"))]
pub(crate) fn arm_cases(dtype: candle_core::quantized::GgmlDType) -> Vec<ArmCase> {
    use candle_core::quantized::QTensor;
    (1u64..)
        .zip(ARM_SHAPES)
        .map(|(seed, (rows, blocks, tokens))| {
            let cols = blocks * QK;
            let w =
                Tensor::from_vec(tests::random(rows * cols, seed), (rows, cols), &candle_core::Device::Cpu).unwrap();
            let bytes = QTensor::quantize(&w, dtype).unwrap().data().unwrap().to_vec();
            let q8 = (0..tokens as u64).map(|t| quantize_q8_1(&tests::random(cols, 100 * seed + t))).collect();
            (rows, blocks, bytes, q8)
        })
        .collect()
}

/// For each aarch64 path this CPU runs: `one(kernel, r, x)` (the one-token path) and `chunk(r,
/// xs, out)` over chunks of up to [`TOKENS`] of `q8` laid out for that path give `scalar(r, x)`'s
/// bits for each row in `0..rows` and each token x.
#[cfg(all(test, target_arch = "aarch64"))]
pub(crate) fn each_arm_path_gives_the_scalar_bits(
    q8: &[Vec<Q8Block>],
    rows: usize,
    scalar: impl Fn(usize, &[Q8Block]) -> f32,
    one: impl Fn(super::arm::ArmKernel, usize, &[Q8Block]) -> f32,
    chunk: impl Fn(usize, &TokenBlocks, &mut [f32]),
) {
    let nb = q8[0].len();
    let paths = super::arm::ArmKernel::available();
    assert!(!paths.is_empty());
    for kernel in paths {
        for r in 0..rows {
            let want: Vec<u32> = q8.iter().map(|x| scalar(r, x).to_bits()).collect();
            let alone: Vec<u32> = q8.iter().map(|x| one(kernel, r, x).to_bits()).collect();
            assert_eq!(alone, want, "{kernel:?} one-token path, row {r} of {nb} blocks");
            let mut chunked = Vec::new();
            for c in q8.chunks(TOKENS) {
                let xs = TokenBlocks::new(c.iter().map(|x| &x[..]).collect(), nb, ChunkKernel::Arm(kernel));
                let mut out = vec![0f32; c.len()];
                chunk(r, &xs, &mut out);
                chunked.extend(out.iter().map(|y| y.to_bits()));
            }
            assert_eq!(chunked, want, "{kernel:?} chunks, row {r} of {nb} blocks");
        }
    }
}

/// For each aarch64 path this CPU runs: `matmul(kernel)` (`[tokens, rows]` of every token of
/// `q8` against rows `0..rows`, i8mm's row pairs and odd last row included) gives `scalar(r, x)`'s
/// bits for each row and token.
#[cfg(all(test, target_arch = "aarch64"))]
pub(crate) fn each_arm_matmul_gives_the_scalar_bits(
    q8: &[Vec<Q8Block>],
    rows: usize,
    scalar: impl Fn(usize, &[Q8Block]) -> f32,
    matmul: impl Fn(super::arm::ArmKernel) -> Tensor,
) {
    let want: Vec<u32> =
        q8.iter().flat_map(|x| (0..rows).map(|r| scalar(r, x).to_bits()).collect::<Vec<_>>()).collect();
    for kernel in super::arm::ArmKernel::available() {
        let got = matmul(kernel).flatten_all().unwrap().to_vec1::<f32>().unwrap();
        let got: Vec<u32> = got.iter().map(|y| y.to_bits()).collect();
        assert_eq!(got, want, "{kernel:?}, {rows} rows, {} tokens", q8.len());
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// Reproducible values in [-1, 1), for the kernels' tests.
    pub(crate) fn random(n: usize, seed: u64) -> Vec<f32> {
        let mut s = seed;
        (0..n)
            .map(|_| {
                s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                ((s >> 33) as f32 / (1u64 << 31) as f32) * 2.0 - 1.0
            })
            .collect()
    }

    #[test]
    fn vector_quantization_gives_the_scalar_loops_blocks() {
        // Random values, a block of zeros, exact halves (ties) and a block's maximum at either sign.
        let mut x = random(32 * 40, 9);
        x[32..64].fill(0.0);
        for (i, v) in x[64..96].iter_mut().enumerate() {
            *v = (i as f32 - 16.0) * 0.5;
        }
        x[100] = -3.0;
        x[140] = 3.0;
        let (got, want) = (quantize_q8_1(&x), quantize_blocks(&x));
        for (b, (g, w)) in got.iter().zip(&want).enumerate() {
            assert_eq!((g.d.to_bits(), g.s.to_bits(), g.qs), (w.d.to_bits(), w.s.to_bits(), w.qs), "block {b}");
        }
    }
}
