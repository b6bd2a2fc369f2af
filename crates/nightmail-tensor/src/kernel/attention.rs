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
}

/// Query rows of one product at most (a group's heads × a part's rows): up to twice gemm's f32
/// register tile (MR, 16 on AVX2) it reads the keys in place, where more rows pack them into a
/// fresh buffer on every call.
const GROUP_ROWS: usize = 32;

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
        let part = (GROUP_ROWS / rep).max(1);
        let mut out = vec![0f32; tokens * self.heads * vw];
        if tokens == 0 {
            return out;
        }
        // Parts as [kv head][part][rep][row][width]: each job writes one contiguous run.
        let parts: Vec<(usize, usize)> =
            (0..self.kv_heads).flat_map(|g| (0..tokens).step_by(part).map(move |from| (g, from))).collect();
        let mut staged = vec![0f32; tokens * self.heads * vw];
        let mut runs = Vec::with_capacity(parts.len());
        let mut rest = staged.as_mut_slice();
        for &(_, from) in &parts {
            let (run, tail) = rest.split_at_mut(rep * part.min(tokens - from) * vw);
            runs.push(run);
            rest = tail;
        }
        let job = |(&(g, from), run): (&(usize, usize), &mut &mut [f32])| {
            self.part_rows(queries, tokens, keys, values, (g, from..from + part.min(tokens - from)), run);
        };
        // Below ~2^16 multiply-adds a hand-off to another thread costs more than it saves.
        if self.heads * tokens * seen * (d + vw) < 1 << 16 {
            parts.iter().zip(runs.iter_mut()).for_each(job);
        } else {
            parts.par_iter().zip(runs.par_iter_mut()).for_each(job);
        }
        for (&(g, from), run) in parts.iter().zip(&runs) {
            let b = part.min(tokens - from);
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

    /// Query rows `rows` of every head of group `g`, into `out` `[rep][rows][width]`.
    ///
    /// The group's rep·b query rows meet the keys KEY_BLOCK at a time, the softmax kept online
    /// (Milakov & Gimelshein, arXiv 1805.02867; FlashAttention, arXiv 2205.14135): per row the
    /// running max, the running sum and the weighted values, rescaled when the max grows. A
    /// block of keys and values is read once for all the rows and stays in cache while they use
    /// it, and the scores alive are one block's whatever the context.
    fn part_rows(
        &self,
        queries: &[f32],
        tokens: usize,
        keys: HeadRows<'_>,
        values: HeadRows<'_>,
        (g, rows): (usize, std::ops::Range<usize>),
        out: &mut [f32],
    ) {
        let (d, vw, rep) = (keys.width, values.width, self.heads / self.kv_heads);
        let (from, b) = (rows.start, rows.len());
        let m = rep * b;
        // Keys lo..end: the part's last row sees none after end, a window's first row none before lo.
        let end = self.start + from + b;
        let lo = self.window.map_or(0, |w| (self.start + from + 1).saturating_sub(w)).min(end);
        // Row k = r·b + i is head g·rep + r's query row from + i; it sees keys visible(k).
        let visible = |k: usize| {
            let pos = self.start + from + k % b;
            self.window.map_or(0, |w| (pos + 1).saturating_sub(w))..pos + 1
        };
        SCRATCH.with_borrow_mut(|Scratch { q, scores, probs, max, sum }| {
            // The rows column by column (element e of row k at e·m + k) and the weights row by
            // row: each product then reads its operands in place, none gathered element by
            // element into a packed copy.
            q.clear();
            q.resize(m * d, 0.0);
            for k in 0..m {
                let row = &queries[((g * rep + k / b) * tokens + from + k % b) * d..][..d];
                for (e, &x) in row.iter().enumerate() {
                    q[e * m + k] = x;
                }
            }
            // A sink is a key every row sees whose value is zero: it starts the max and the sum.
            max.clear();
            sum.clear();
            match self.sinks {
                Some(sinks) => {
                    max.extend((0..m).map(|k| sinks[g * rep + k / b]));
                    sum.resize(m, 1.0);
                }
                None => {
                    max.resize(m, f32::NEG_INFINITY);
                    sum.resize(m, 0.0);
                }
            }
            out.fill(0.0);
            // Blocks start at multiples of KEY_BLOCK whatever the part: a row meets the same
            // blocks beside any rows (keys before its window add exact zeros).
            for aligned in (lo / KEY_BLOCK * KEY_BLOCK..end).step_by(KEY_BLOCK) {
                let kb = aligned.max(lo);
                let nb = (aligned + KEY_BLOCK).min(end) - kb;
                scores.clear();
                scores.resize(m * nb, 0.0);
                // Scores key by key (row k of key j at j·m + k): the keys are read in place as
                // the product's columns, and the softmax runs across the rows, a lane each.
                // SAFETY: `run` checked that every key row lo..end of head g lies in its slice;
                // the m rows of d and the m × nb scores lie in theirs by construction.
                unsafe {
                    gemm(
                        m,
                        nb,
                        d,
                        scores.as_mut_ptr(),
                        m as isize,
                        1,
                        false,
                        q.as_ptr(),
                        m as isize,
                        1,
                        keys.at(g, kb),
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
                probs.clear();
                probs.resize(m * nb, 0.0);
                mask_block(scores, m, kb, visible);
                if let Some(rescale) = block_weights(Weights { scores, probs, m, scale: self.scale, max, sum }) {
                    for (row, c) in out.chunks_exact_mut(vw).zip(&rescale) {
                        row.iter_mut().for_each(|y| *y *= c);
                    }
                }
                // SAFETY: as above, for the value rows kb..kb + nb and the m × width outputs.
                unsafe {
                    gemm(
                        m,
                        vw,
                        nb,
                        out.as_mut_ptr(),
                        1,
                        vw as isize,
                        true,
                        probs.as_ptr(),
                        1,
                        nb as isize,
                        values.at(g, kb),
                        1,
                        values.row_stride as isize,
                        1.0,
                        1.0,
                        false,
                        false,
                        false,
                        Parallelism::None,
                    )
                };
            }
            for (row, total) in out.chunks_exact_mut(vw).zip(sum.iter()) {
                row.iter_mut().for_each(|y| *y /= total);
            }
        });
    }
}

/// Keys one step of the online softmax takes.
const KEY_BLOCK: usize = 256;

/// One job's buffers, kept between jobs: fresh ones of a few hundred KiB per job are a page
/// fault every 4 KiB.
#[derive(Default)]
struct Scratch {
    q: Vec<f32>,
    scores: Vec<f32>,
    probs: Vec<f32>,
    max: Vec<f32>,
    sum: Vec<f32>,
}

thread_local! {
    static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch::default());
}

/// Sets to -inf each score of a block of keys `kb..` (`m` rows stored key by key, row k of key j
/// at `j·m + k`) that row k may not see: outside `visible(k)`.
fn mask_block(scores: &mut [f32], m: usize, kb: usize, visible: impl Fn(usize) -> std::ops::Range<usize>) {
    let nb = scores.len() / m;
    for k in 0..m {
        let seen = visible(k);
        let (a, e) = (seen.start.clamp(kb, kb + nb) - kb, seen.end.clamp(kb, kb + nb) - kb);
        for j in (0..a).chain(e..nb) {
            scores[j * m + k] = f32::NEG_INFINITY;
        }
    }
}

/// One block's softmax step: its `m` rows' masked scores, their weights' buffer, and the running
/// max and sum.
struct Weights<'a> {
    scores: &'a mut [f32],
    probs: &'a mut [f32],
    m: usize,
    scale: f32,
    max: &'a mut [f32],
    sum: &'a mut [f32],
}

/// One block of the online softmax: from masked `scores` (`m` rows stored key by key, row k of
/// key j at `j·m + k`), `probs` (row by row, `k·nb + j`) gets each row's weights
/// `exp(scale · s − max)` (a masked key's 0, exactly, as `exp(-inf)` gives it), with `max` and
/// `sum` carried to the new running max. Returns each row's factor for what it summed before,
/// unless all are 1.
fn block_weights(w: Weights<'_>) -> Option<Vec<f32>> {
    #[cfg(target_arch = "x86_64")]
    if super::cpu::has_avx2() {
        // SAFETY: the CPU has AVX2 and FMA.
        return unsafe { weights_avx2(w) };
    }
    weights(w)
}

/// [`weights`] compiled for AVX2 and FMA: eight rows a lane each where baseline x86-64 takes four.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn weights_avx2(w: Weights<'_>) -> Option<Vec<f32>> {
    weights(w)
}

/// The masked scores' weights and the running max and sum (see [`block_weights`]), across the
/// rows so that each loop runs a row per lane.
#[inline(always)]
fn weights(Weights { scores, probs, m, scale, max, sum }: Weights<'_>) -> Option<Vec<f32>> {
    let nb = scores.len() / m;
    let mut top = max.to_vec();
    for key in scores.chunks_exact_mut(m) {
        for (x, t) in key.iter_mut().zip(top.iter_mut()) {
            *x *= scale;
            *t = t.max(*x);
        }
    }
    // A row that has seen no key yet keeps max -inf: its weights are 0 and nothing rescales.
    let rescale: Vec<f32> =
        max.iter().zip(&top).map(|(&old, &new)| if old == new { 1.0 } else { (old - new).exp() }).collect();
    for ((s, c), (old, new)) in sum.iter_mut().zip(&rescale).zip(max.iter_mut().zip(&top)) {
        *s *= c;
        *old = *new;
    }
    // A row whose max is -inf has seen no key: its weights are 0 (and x − max would be NaN).
    let shift: Vec<f32> = top.iter().map(|&t| if t == f32::NEG_INFINITY { f32::INFINITY } else { t }).collect();
    for (j, key) in scores.chunks_exact_mut(m).enumerate() {
        for ((x, t), s) in key.iter_mut().zip(&shift).zip(sum.iter_mut()) {
            *x = crate::ggml::expf(*x - t);
            *s += *x;
        }
        for (k, &x) in key.iter().enumerate() {
            probs[k * nb + j] = x;
        }
    }
    rescale.iter().any(|&c| c != 1.0).then_some(rescale)
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
        for (heads, kv_heads, start, tokens, window, with_sinks) in [
            (2, 1, 0, 1, None, false),
            (4, 2, 0, 37, None, false),
            (4, 2, 5, 37, None, false),
            (8, 2, 3, 20, Some(6), false),
            (8, 2, 3, 33, Some(6), true),
            (4, 4, 11, 1, Some(4), true),
            (4, 1, 0, 16, None, true),
            // Several blocks of keys: the running max and sum carried across them.
            (2, 1, 500, 20, None, true),
            (4, 2, 0, 300, Some(270), false),
            (4, 2, 700, 1, None, false),
            (8, 2, 0, 600, Some(40), true),
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

    /// A row attended within a prompt's parts is the row attended alone, as a decode step takes
    /// it, to rounding (gemm's order of summation follows the product's shape), with and without
    /// a window, sinks and grouped heads, across several blocks of keys.
    #[test]
    fn a_row_beside_others_is_the_row_alone_to_rounding() {
        let sinks = values(8, 7);
        for (heads, kv_heads, window, with_sinks) in
            [(8, 2, None, false), (4, 1, Some(300), true), (4, 4, Some(37), false)]
        {
            let (d, tokens) = (16, 700);
            let q = values(heads * tokens * d, 8);
            let k = values(kv_heads * tokens * d, 9);
            let v = values(kv_heads * tokens * d, 10);
            let at = |start: usize| CausalAttention {
                heads,
                kv_heads,
                start,
                window,
                sinks: with_sinks.then(|| &sinks[..heads]),
                scale: 0.25,
            };
            let all =
                HeadRows { data: &k, heads: kv_heads, head_stride: tokens * d, row_stride: d, width: d, len: tokens };
            let vals = HeadRows { data: &v, ..all };
            let together = at(0).run(&q, tokens, all, vals);
            for pos in [0, 1, 255, 256, 299, 300, 301, 513, 699] {
                let alone_q: Vec<f32> = (0..heads).flat_map(|h| q[(h * tokens + pos) * d..][..d].to_vec()).collect();
                let alone = at(pos).run(&alone_q, 1, all, vals);
                for (x, y) in alone.iter().zip(&together[pos * heads * d..][..heads * d]) {
                    assert!((x - y).abs() <= 1e-6 * y.abs().max(1.0), "row {pos}, window {window:?}: {x} against {y}");
                }
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
        let a = CausalAttention { heads, kv_heads, start: 0, window: None, sinks: None, scale: 0.3 };
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
