//! Causal attention over f32 rows where they lie: for each key/value head and each part of the
//! query rows, the scores of the keys that part may see (one product over strided views of the
//! cache, nothing copied), a softmax over each row's visible keys, and the weighted values.
//! Causal, optionally windowed (Mistral, arXiv 2310.06825), optionally with a sink logit per head
//! (gpt-oss). It computes transformers' eager attention (`eager_attention_forward`): scores
//! scaled, masked keys weighing exactly 0, one softmax per row, the products summed by `gemm`.

use std::cell::RefCell;

use candle_core::{CpuStorage, Storage, Tensor};
use gemm::{Parallelism, gemm};
use rayon::prelude::*;

use crate::error::{Result, TensorError};

/// Rows of every key/value head of one sequence: head g's position p is
/// `data[g * head_stride + p * row_stride..][..width]`.
#[derive(Clone, Copy, Debug)]
pub struct HeadRows<'a> {
    pub data: &'a [f32],
    pub heads: usize,
    pub head_stride: usize,
    pub row_stride: usize,
    pub width: usize,
    /// Positions held: keys `0..len`.
    pub len: usize,
}

impl HeadRows<'_> {
    fn fits(&self) -> bool {
        self.len == 0
            || self.heads == 0
            || (self.heads - 1) * self.head_stride + (self.len - 1) * self.row_stride + self.width <= self.data.len()
    }

    fn at(&self, head: usize, position: usize) -> *const f32 {
        self.data[head * self.head_stride + position * self.row_stride..].as_ptr()
    }
}

/// `f` of a CPU f32 tensor `[1, heads, positions, width]` (each row contiguous, heads and rows at
/// any stride: a cache buffer narrowed to its rows) read where it lies.
pub fn with_head_rows<R>(t: &Tensor, f: impl FnOnce(HeadRows<'_>) -> R) -> Result<R> {
    let refused = |why: &str| TensorError::Compute(candle_core::Error::Msg(format!("attention rows {why}")));
    let (storage, layout) = t.storage_and_layout();
    let Storage::Cpu(CpuStorage::F32(data)) = &*storage else { return Err(refused("are not f32 on the CPU")) };
    let (&[1, heads, len, width], &[_, head_stride, row_stride, 1]) = (t.dims(), layout.stride()) else {
        return Err(refused("are not [1, heads, positions, width] with contiguous rows"));
    };
    let rows = HeadRows { data: &data[layout.start_offset()..], heads, head_stride, row_stride, width, len };
    if !rows.fits() {
        return Err(refused("lie outside their storage"));
    }
    Ok(f(rows))
}

/// What one layer's attention is, apart from its rows.
#[derive(Clone, Copy, Debug)]
pub struct CausalAttention<'a> {
    pub heads: usize,
    pub kv_heads: usize,
    /// Position of the first query row.
    pub start: usize,
    /// Keys a row sees at most, itself included.
    pub window: Option<usize>,
    /// gpt-oss: one logit per query head that each row's softmax includes and then drops.
    pub sinks: Option<&'a [f32]>,
    pub scale: f32,
    /// Query rows a part takes: each part's scores are `heads / kv_heads × part × keys`.
    pub part: usize,
}

thread_local! {
    /// One part's scores, kept between parts: a fresh buffer of a few MiB per part is a page
    /// fault every 4 KiB.
    static SCORES: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

impl CausalAttention<'_> {
    /// Attended rows `[tokens, heads, values.width]` of `queries` (`[heads, tokens, keys.width]`,
    /// contiguous) at positions `start..start + tokens`, over the keys and values at positions
    /// `0..start + tokens`. Query head h reads key/value head `h / (heads / kv_heads)`.
    pub fn run(&self, queries: &[f32], tokens: usize, keys: HeadRows<'_>, values: HeadRows<'_>) -> Vec<f32> {
        let (d, vw, rep) = (keys.width, values.width, self.heads / self.kv_heads.max(1));
        let seen = self.start + tokens;
        assert!(self.kv_heads > 0 && self.heads == rep * self.kv_heads, "query heads in whole groups");
        assert_eq!(queries.len(), self.heads * tokens * d, "queries are [heads, tokens, width]");
        assert!(keys.heads == self.kv_heads && values.heads == self.kv_heads, "one key and value head per group");
        assert!(keys.len >= seen && values.len >= seen && keys.fits() && values.fits(), "rows out of their slice");
        assert!(self.sinks.is_none_or(|s| s.len() == self.heads), "one sink per head");
        assert!(self.part > 0);
        let mut out = vec![0f32; tokens * self.heads * vw];
        if tokens == 0 {
            return out;
        }
        // Parts as [kv head][part][rep][row][width]: each job writes one contiguous run.
        let parts: Vec<(usize, usize)> =
            (0..self.kv_heads).flat_map(|g| (0..tokens).step_by(self.part).map(move |from| (g, from))).collect();
        let mut staged = vec![0f32; tokens * self.heads * vw];
        let mut runs = Vec::with_capacity(parts.len());
        let mut rest = staged.as_mut_slice();
        for &(_, from) in &parts {
            let (run, tail) = rest.split_at_mut(rep * self.part.min(tokens - from) * vw);
            runs.push(run);
            rest = tail;
        }
        let job = |(&(g, from), run): (&(usize, usize), &mut &mut [f32])| {
            self.part_rows(queries, tokens, keys, values, g, from, run);
        };
        // Below ~2^16 multiply-adds a hand-off to another thread costs more than it saves.
        if self.heads * tokens * seen * (d + vw) < 1 << 16 {
            parts.iter().zip(runs.iter_mut()).for_each(job);
        } else {
            parts.par_iter().zip(runs.par_iter_mut()).for_each(job);
        }
        for (&(g, from), run) in parts.iter().zip(&runs) {
            let b = self.part.min(tokens - from);
            for (r, head) in run.chunks_exact(b * vw).enumerate() {
                let h = g * rep + r;
                for (i, row) in head.chunks_exact(vw).enumerate() {
                    let at = ((from + i) * self.heads + h) * vw;
                    out[at..at + vw].copy_from_slice(row);
                }
            }
        }
        out
    }

    /// Rows `from..from + b` of every query head of group `g`, into `out` `[rep][b][width]`.
    #[allow(clippy::too_many_arguments)]
    fn part_rows(
        &self,
        queries: &[f32],
        tokens: usize,
        keys: HeadRows<'_>,
        values: HeadRows<'_>,
        g: usize,
        from: usize,
        out: &mut [f32],
    ) {
        let (d, vw, rep) = (keys.width, values.width, self.heads / self.kv_heads);
        let b = self.part.min(tokens - from);
        // Keys lo..end: the part's last row sees none after end, a window's first row none before lo.
        let end = self.start + from + b;
        let lo = self.window.map_or(0, |w| (self.start + from + 1).saturating_sub(w)).min(end);
        let n = end - lo;
        // One product over the group's rep·b rows where they are evenly spaced (the part is
        // every query row), else one per head: (first head, rows).
        let spans: Vec<(usize, usize)> =
            if b == tokens { vec![(0, rep * b)] } else { (0..rep).map(|r| (r, b)).collect() };
        SCORES.with_borrow_mut(|scores| {
            for (r, m) in spans {
                scores.clear();
                scores.resize(m * n, 0.0);
                // Scores key by key (row i of key j at j·m + i): the keys are read in place as
                // the product's columns, and the softmax runs across the rows, a lane each.
                let s = scores.as_mut_ptr();
                let q = queries[((g * rep + r) * tokens + from) * d..].as_ptr();
                // SAFETY: `run` checked that every key row lo..end of head g lies in its slice;
                // q's m rows of d and the m × n scores lie in theirs by construction.
                unsafe {
                    gemm(
                        m,
                        n,
                        d,
                        s,
                        m as isize,
                        1,
                        false,
                        q,
                        1,
                        d as isize,
                        keys.at(g, lo),
                        keys.row_stride as isize,
                        1,
                        0.0,
                        1.0,
                        false,
                        false,
                        false,
                        Parallelism::None,
                    )
                };
                // Span row i is head r + i / b's query row from + i % b.
                let visible = |i: usize| {
                    let pos = self.start + from + i % b;
                    let first = self.window.map_or(0, |w| (pos + 1).saturating_sub(w)).max(lo) - lo;
                    first..pos + 1 - lo
                };
                let sinks: Vec<f32> = match self.sinks {
                    Some(sinks) => (0..m).map(|i| sinks[g * rep + r + i / b]).collect(),
                    None => Vec::new(),
                };
                softmax_by_key(scores, m, visible, self.scale, &sinks);
                let o = out[r * b * vw..].as_mut_ptr();
                // SAFETY: as above, for the value rows lo..end and the m × width outputs.
                unsafe {
                    gemm(
                        m,
                        vw,
                        n,
                        o,
                        1,
                        vw as isize,
                        false,
                        scores.as_ptr(),
                        m as isize,
                        1,
                        values.at(g, lo),
                        1,
                        values.row_stride as isize,
                        0.0,
                        1.0,
                        false,
                        false,
                        false,
                        Parallelism::None,
                    )
                };
            }
        });
    }
}

/// Softmax in place of each row i of `scores` (`m` rows stored key by key: row i of key j at
/// `j·m + i`) over its `visible(i)` keys, scaled, with the sink logit `sinks[i]` where there are
/// sinks (it joins the sum and is dropped after); every other key's weight is 0, exactly, as
/// `exp(-inf)` gives it. As candle's `softmax_last_dim`: max, exp of the differences, each
/// divided by their sum.
fn softmax_by_key(
    scores: &mut [f32],
    m: usize,
    visible: impl Fn(usize) -> std::ops::Range<usize>,
    scale: f32,
    sinks: &[f32],
) {
    let n = scores.len() / m;
    for i in 0..m {
        let seen = visible(i);
        for j in (0..seen.start).chain(seen.end..n) {
            scores[j * m + i] = f32::NEG_INFINITY;
        }
    }
    let mut max = if sinks.is_empty() { vec![f32::NEG_INFINITY; m] } else { sinks.to_vec() };
    for key in scores.chunks_exact_mut(m) {
        for (x, top) in key.iter_mut().zip(max.iter_mut()) {
            *x *= scale;
            *top = top.max(*x);
        }
    }
    let mut sum: Vec<f32> =
        if sinks.is_empty() { vec![0.0; m] } else { sinks.iter().zip(&max).map(|(s, top)| (s - top).exp()).collect() };
    for key in scores.chunks_exact_mut(m) {
        for ((x, top), total) in key.iter_mut().zip(&max).zip(sum.iter_mut()) {
            *x = (*x - top).exp();
            *total += *x;
        }
    }
    for key in scores.chunks_exact_mut(m) {
        for (x, total) in key.iter_mut().zip(&sum) {
            *x /= total;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each query row's attention written out as the definition: scores of every key, masked
    /// ones at -inf, one softmax with the sink, the weighted sum of the values.
    fn by_definition(
        a: &CausalAttention<'_>,
        q: &[f32],
        tokens: usize,
        k: &[f32],
        v: &[f32],
        d: usize,
        vw: usize,
    ) -> Vec<f32> {
        let seen = a.start + tokens;
        let rep = a.heads / a.kv_heads;
        let mut out = vec![0f32; tokens * a.heads * vw];
        for h in 0..a.heads {
            let g = h / rep;
            for i in 0..tokens {
                let pos = a.start + i;
                let qi = &q[(h * tokens + i) * d..][..d];
                let mut s: Vec<f64> = (0..seen)
                    .map(|j| {
                        let visible = j <= pos && a.window.is_none_or(|w| pos - j < w);
                        let kj = &k[(g * seen + j) * d..][..d];
                        let dot: f64 = qi.iter().zip(kj).map(|(x, y)| *x as f64 * *y as f64).sum();
                        if visible { dot * a.scale as f64 } else { f64::NEG_INFINITY }
                    })
                    .collect();
                let sink = a.sinks.map(|s| s[h] as f64);
                let max = s.iter().copied().chain(sink).fold(f64::NEG_INFINITY, f64::max);
                s.iter_mut().for_each(|x| *x = (*x - max).exp());
                let sum: f64 = s.iter().sum::<f64>() + sink.map_or(0.0, |x| (x - max).exp());
                for e in 0..vw {
                    let y: f64 = (0..seen).map(|j| s[j] / sum * v[(g * seen + j) * vw + e] as f64).sum();
                    out[(i * a.heads + h) * vw + e] = y as f32;
                }
            }
        }
        out
    }

    fn values(n: usize, seed: u32) -> Vec<f32> {
        let mut x = seed.wrapping_mul(2654435761).wrapping_add(1);
        (0..n)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 17;
                x ^= x << 5;
                (x % 2000) as f32 / 1000.0 - 1.0
            })
            .collect()
    }

    /// Every shape a layer meets (one row and many, rows in one part and several, a ragged last
    /// part, grouped heads, a window, sinks, a cache that holds earlier positions) against the
    /// definition in f64.
    #[test]
    fn attention_in_parts_matches_the_definition() {
        let sinks = values(8, 99);
        for (heads, kv_heads, start, tokens, window, with_sinks, part) in [
            (2, 1, 0, 1, None, false, 16),
            (4, 2, 0, 37, None, false, 16),
            (4, 2, 5, 37, None, false, 8),
            (8, 2, 3, 20, Some(6), false, 16),
            (8, 2, 3, 33, Some(6), true, 4),
            (4, 4, 11, 1, Some(4), true, 16),
            (4, 1, 0, 16, None, true, 16),
        ] {
            let (d, vw) = (8, 12);
            let seen = start + tokens;
            let q = values(heads * tokens * d, 1);
            let k = values(kv_heads * seen * d, 2);
            let v = values(kv_heads * seen * vw, 3);
            let a = CausalAttention {
                heads,
                kv_heads,
                start,
                window,
                sinks: with_sinks.then(|| &sinks[..heads]),
                scale: 1.0 / (d as f32).sqrt(),
                part,
            };
            let keys =
                HeadRows { data: &k, heads: kv_heads, head_stride: seen * d, row_stride: d, width: d, len: seen };
            let vals =
                HeadRows { data: &v, heads: kv_heads, head_stride: seen * vw, row_stride: vw, width: vw, len: seen };
            let got = a.run(&q, tokens, keys, vals);
            let want = by_definition(&a, &q, tokens, &k, &v, d, vw);
            for (x, y) in got.iter().zip(&want) {
                assert!((x - y).abs() < 1e-5, "{heads}/{kv_heads} heads, {tokens} rows at {start}: {x} against {y}");
            }
        }
    }

    /// Keys read in place from a larger buffer (a cache's capacity beyond its rows, heads apart)
    /// give what the same rows packed give.
    #[test]
    fn strided_cache_rows_read_as_packed_ones() {
        let (heads, kv_heads, tokens, d, cap) = (4, 2, 10, 8, 32);
        let q = values(heads * tokens * d, 4);
        let packed_k = values(kv_heads * tokens * d, 5);
        let packed_v = values(kv_heads * tokens * d, 6);
        let mut wide_k = vec![f32::NAN; kv_heads * cap * d];
        let mut wide_v = vec![f32::NAN; kv_heads * cap * d];
        for g in 0..kv_heads {
            wide_k[g * cap * d..][..tokens * d].copy_from_slice(&packed_k[g * tokens * d..][..tokens * d]);
            wide_v[g * cap * d..][..tokens * d].copy_from_slice(&packed_v[g * tokens * d..][..tokens * d]);
        }
        let a = CausalAttention { heads, kv_heads, start: 0, window: None, sinks: None, scale: 0.3, part: 4 };
        fn rows(data: &[f32], stride: usize, kv_heads: usize, d: usize, tokens: usize) -> HeadRows<'_> {
            HeadRows { data, heads: kv_heads, head_stride: stride * d, row_stride: d, width: d, len: tokens }
        }
        let packed = a.run(
            &q,
            tokens,
            rows(&packed_k, tokens, kv_heads, d, tokens),
            rows(&packed_v, tokens, kv_heads, d, tokens),
        );
        let wide = a.run(&q, tokens, rows(&wide_k, cap, kv_heads, d, tokens), rows(&wide_v, cap, kv_heads, d, tokens));
        assert_eq!(packed, wide);
    }
}
