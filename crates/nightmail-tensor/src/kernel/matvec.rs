//! The scaffold every hand-written mat-vec kernel shares: rows split in one contiguous range per
//! rayon thread, each row read once for all tokens, the result laid out `[tokens, rows]`.

use candle_core::{Device, Tensor};
use rayon::prelude::*;

use crate::error::Result;

/// `row_dots(r, out)` writes row `r`'s dot product with each token into `out[t]`. Small
/// problems (`work` multiply-adds), or a one-thread pool, run on the caller: a rayon hand-off
/// costs two context switches, which at ~200 mat-vecs per token was a third of decode time.
pub(crate) fn rows_by_tokens(
    rows: usize,
    tokens: usize,
    work: usize,
    row_dots: impl Fn(usize, &mut [f32]) + Sync,
) -> Result<Tensor> {
    row_groups_by_tokens(rows, tokens, work, 1, row_dots)
}

/// As [`rows_by_tokens`], `group` rows at a time (fewer at the end): `group_dots(r, out)` writes
/// rows `r..r + out.len() / tokens`, `out` laid out `[row][token]`. A kernel that computes several
/// independent rows together keeps more multiply-adds in flight; each row's arithmetic, and so
/// its result, is its own.
pub(crate) fn row_groups_by_tokens(
    rows: usize,
    tokens: usize,
    work: usize,
    group: usize,
    group_dots: impl Fn(usize, &mut [f32]) + Sync,
) -> Result<Tensor> {
    let mut out_t = vec![0f32; rows * tokens];
    let threads = rayon::current_num_threads();
    let per_thread = if threads == 1 || work < 1 << 16 { rows } else { rows.div_ceil(threads).div_ceil(group) * group };
    let per_thread = per_thread.max(1);
    let run = |c: usize, chunk: &mut [f32]| {
        chunk.chunks_mut(group * tokens).enumerate().for_each(|(g, out)| group_dots(c * per_thread + g * group, out));
    };
    if per_thread >= rows {
        run(0, &mut out_t);
    } else {
        out_t.par_chunks_mut(per_thread * tokens).enumerate().for_each(|(c, chunk)| run(c, chunk));
    }
    // `[row][token]` to `[token][row]` by hand: candle's strided copy took ~0.4 ms of each extra
    // verify row on SmolLM2 (the head's 49152 rows), a plain loop a fraction of that.
    if tokens == 1 {
        return Ok(Tensor::from_vec(out_t, (1, rows), &Device::Cpu)?);
    }
    // In 16 x 16 tiles: a wide prefill pass's column writes, one per row, missed the cache.
    const TILE: usize = 16;
    let mut out = vec![0f32; rows * tokens];
    for r0 in (0..rows).step_by(TILE) {
        for t0 in (0..tokens).step_by(TILE) {
            for r in r0..(r0 + TILE).min(rows) {
                for t in t0..(t0 + TILE).min(tokens) {
                    out[t * rows + r] = out_t[r * tokens + t];
                }
            }
        }
    }
    Ok(Tensor::from_vec(out, (tokens, rows), &Device::Cpu)?)
}

/// Writes one group's `out` (`[row][token]`, as [`row_groups_by_tokens`] hands it): `whole(t)`
/// for a whole group of `N` rows, `one(i, t)` row by row for the last, shorter one.
pub(crate) fn fill_group<const N: usize>(
    out: &mut [f32],
    tokens: usize,
    whole: impl Fn(usize) -> [f32; N],
    one: impl Fn(usize, usize) -> f32,
) {
    let n = out.len() / tokens;
    for t in 0..tokens {
        if n == N {
            for (i, y) in whole(t).into_iter().enumerate() {
                out[i * tokens + t] = y;
            }
        } else {
            for i in 0..n {
                out[i * tokens + t] = one(i, t);
            }
        }
    }
}

/// AVX2, FMA and F16C (half-precision conversion), detected at run time.
pub fn has_avx2_f16c() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        super::cpu::has_avx2() && is_x86_feature_detected!("f16c")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// The activations `[tokens, cols]` as one f32 vector.
pub(crate) fn activations(x: &Tensor) -> Result<Vec<f32>> {
    Ok(x.contiguous()?.flatten_all()?.to_vec1::<f32>()?)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
/// The sum of a vector's eight lanes.
pub(crate) fn hsum_avx2(acc: std::arch::x86_64::__m256) -> f32 {
    use std::arch::x86_64::*;
    let s4 = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
    let s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
    let s1 = _mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1));
    _mm_cvtss_f32(s1)
}
