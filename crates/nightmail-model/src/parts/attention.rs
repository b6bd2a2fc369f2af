//! Causal multi-head attention with grouped key/value heads (GQA, Ainslie et al., arXiv
//! 2305.13245), rotary positions (on part of each head for Qwen3-Next, GLM-4.5 and MiniMax-M2),
//! optional q/k RMSNorm per head (Qwen3, GLM-4.5) or across all heads (MiniMax-M2), an optional
//! sliding window (Mistral, arXiv 2310.06825), optional attention sinks (gpt-oss) and Qwen3-Next's
//! output gate. Follows transformers' `LlamaAttention` / `Qwen3MoeAttention` / `GptOssAttention` /
//! `Qwen3NextAttention` / `Glm4MoeAttention` / `MiniMaxM2Attention`.

use candle_core::{Device, Tensor};
use half::f16;
use nightmail_tensor::TensorError;
use rayon::prelude::*;

use crate::error::Result;
use crate::parts::norm::norm;
use crate::parts::rope::Rope;
use crate::source::LayerTensors;
use crate::spec::{Architecture, ModelSpec};
use nightmail_tensor::ggml::{DotOrder, dot_f16, soft_max};
use nightmail_tensor::kernel::attention::{CausalAttention, with_head_rows};
use nightmail_tensor::{Linear, RmsNorm};
use nightmail_tensor::{Numerics, TensorView};

/// Query rows whose scores over every key latent attention holds at once (grouped attention's
/// are one block of keys' at a time, `nightmail_tensor::kernel::attention`).
pub const QUERY_BLOCK: usize = 64;

pub struct Attention {
    pub(crate) q: Linear,
    pub(crate) k: Linear,
    pub(crate) v: Linear,
    pub(crate) o: Linear,
    /// RMSNorm of queries and keys before rotation: per head where the weight is one head wide
    /// (Qwen3, GLM-4.5), across all heads where it is as wide as them (MiniMax-M2, whose
    /// `q_norm` normalizes the whole q_proj output before the split into heads).
    pub(crate) qk_norm: Option<(RmsNorm, RmsNorm)>,
    pub(crate) rope: Rope,
    /// Qwen3-Next: q_proj gives per head `[query, gate]`, and the attended rows are multiplied by
    /// σ(gate) before o_proj.
    pub(crate) output_gate: bool,
    pub(crate) heads: usize,
    pub(crate) kv_heads: usize,
    pub(crate) head_dim: usize,
    pub(crate) window: Option<usize>,
    /// gpt-oss: one learned logit per head `[heads]`, a column that every query's softmax
    /// includes and that is dropped after it, so a head can put weight on no key at all.
    pub(crate) sinks: Option<Tensor>,
}

impl Attention {
    /// The output projection of attended rows.
    pub fn output(&self, attended: &Tensor) -> Result<Tensor> {
        Ok(self.o.forward(attended)?)
    }

    /// Queries, keys and values `[tokens, heads · head_dim]` of `x`, and the output gate's
    /// logits (same shape) where the layer has one.
    pub fn project(&self, x: &Tensor) -> Result<(Tensor, Tensor, Tensor, Option<Tensor>)> {
        let (k, v) = (self.k.forward(x)?, self.v.forward(x)?);
        let q = self.q.forward(x)?;
        if !self.output_gate {
            return Ok((q, k, v, None));
        }
        // transformers `Qwen3NextAttention`: view(..., heads, 2 · head_dim), chunk in two.
        let (t, width) = (q.dim(0)?, self.heads * self.head_dim);
        let q = q.reshape((t, self.heads, 2, self.head_dim))?;
        let half = |i: usize| -> Result<Tensor> { Ok(q.narrow(2, i, 1)?.contiguous()?.reshape((t, width))?) };
        Ok((half(0)?, k, v, Some(half(1)?)))
    }

    /// Attended rows times σ(gate), for a layer with an output gate.
    pub fn gated(&self, attended: Tensor, gate: Option<&Tensor>) -> Result<Tensor> {
        match gate {
            Some(g) => Ok((attended * candle_nn::ops::sigmoid(g)?)?),
            None => Ok(attended),
        }
    }

    /// Attention of projected rows at positions `start..` over `cache` (to which their keys and
    /// values are appended): `[tokens, heads · head_dim]`, before the output projection.
    pub fn attend(&self, q: &Tensor, k: &Tensor, v: &Tensor, start: usize, cache: &mut LayerCache) -> Result<Tensor> {
        match cache {
            LayerCache::F32(cache) => self.attend_f32(q, k, v, start, cache),
            LayerCache::F16(cache) => self.attend_ggml(q, k, v, start, cache),
        }
    }

    /// transformers' eager attention in f32.
    fn attend_f32(&self, q: &Tensor, k: &Tensor, v: &Tensor, start: usize, cache: &mut F32Cache) -> Result<Tensor> {
        let (t, d) = (q.dim(0)?, self.head_dim);
        let (q, k) = self.normed(q, k)?;
        let q = q.reshape((t, self.heads, d))?;
        let k = k.reshape((t, self.kv_heads, d))?;
        let v = v.reshape((t, self.kv_heads, d))?;
        // [1, heads, tokens, head_dim]
        let q = self.rope.apply(&q.transpose(0, 1)?.unsqueeze(0)?, start)?;
        let k = self.rope.apply(&k.transpose(0, 1)?.unsqueeze(0)?, start)?;
        let v = v.transpose(0, 1)?.unsqueeze(0)?.contiguous()?;
        let (k, v) = cache.append(&k, &v)?;
        let queries = q.contiguous()?.flatten_all()?.to_vec1::<f32>()?;
        let sinks = self.sinks.as_ref().map(|s| s.to_vec1::<f32>()).transpose()?;
        // Parts of a few rows computed side by side (the same parts whatever the thread count);
        // a part scores only the keys its rows may see, read in place from the cache.
        let attention = CausalAttention {
            heads: self.heads,
            kv_heads: self.kv_heads,
            start,
            window: self.window,
            sinks: sinks.as_deref(),
            scale: (1.0 / (d as f64).sqrt()) as f32,
        };
        let out = with_head_rows(&k, |keys| with_head_rows(&v, |values| attention.run(&queries, t, keys, values)))??;
        Ok(Tensor::from_vec(out, (t, self.heads * d), &Device::Cpu)?)
    }

    /// llama.cpp's attention without flash attention (llama-cpp-python's default), as
    /// `llm_graph_context::build_attn_mha` builds it: rotated keys and values stored in f16, KQ =
    /// mul_mat(k, q) with q converted to f16, `soft_max_ext` with the 1/√d scale and the causal
    /// mask, probabilities converted to f16 for KQV = mul_mat(vᵀ, kq). A batch of tokens takes
    /// tinyBLAS's dot order, a single token `ggml_vec_dot_f16`'s (see [`DotOrder`]).
    fn attend_ggml(&self, q: &Tensor, k: &Tensor, v: &Tensor, start: usize, cache: &mut F16Cache) -> Result<Tensor> {
        let (t, d, heads, kv_heads) = (q.dim(0)?, self.head_dim, self.heads, self.kv_heads);
        let (q, k) = self.normed(q, k)?;
        let mut q = q.contiguous()?.flatten_all()?.to_vec1::<f32>()?;
        let mut k = k.contiguous()?.flatten_all()?.to_vec1::<f32>()?;
        let v = v.contiguous()?.flatten_all()?.to_vec1::<f32>()?;
        for i in 0..t {
            let angles = self.rope.ggml_angles(start + i);
            for row in q[i * heads * d..(i + 1) * heads * d].chunks_exact_mut(d) {
                self.rope.ggml_rotate(row, &angles);
            }
            for row in k[i * kv_heads * d..(i + 1) * kv_heads * d].chunks_exact_mut(d) {
                self.rope.ggml_rotate(row, &angles);
            }
            cache.push(&k[i * kv_heads * d..(i + 1) * kv_heads * d], &v[i * kv_heads * d..(i + 1) * kv_heads * d]);
        }
        let q: Vec<f16> = q.iter().map(|&x| f16::from_f32(x)).collect();
        // tinyBLAS takes a product when its inner size is a multiple of 8 and its rows of 4.
        let batch = t > 1;
        let kq_order = if batch && d % 8 == 0 { DotOrder::Gemm } else { DotOrder::VecDot };
        let kqv_order = if batch && d % 4 == 0 { DotOrder::Gemm } else { DotOrder::VecDot };
        // llama.cpp pads the cache's key count to a multiple of 256 (`llama_kv_cache::get_n_kv`).
        let padded = cache.len().div_ceil(256) * 256;
        let scale = 1.0 / (d as f32).sqrt();
        let rep = heads / kv_heads;
        let mut out = vec![0f32; t * heads * d];
        let head_row = |(row, out): (usize, &mut [f32])| {
            let (i, h) = (row / heads, row % heads);
            let pos = start + i;
            let first = self.window.map_or(0, |w| (pos + 1).saturating_sub(w));
            let qh = &q[row * d..(row + 1) * d];
            let mut p: Vec<f32> = (0..=pos)
                .map(|j| if j < first { 0.0 } else { dot_f16(kq_order, qh, cache.key(j, h / rep), d) })
                .collect();
            soft_max(&mut p, first..pos + 1, scale);
            let p: Vec<f16> = p.iter().map(|&x| f16::from_f32(x)).collect();
            for (e, y) in out.iter_mut().enumerate() {
                *y = dot_f16(kqv_order, &cache.values(h / rep, e)[..=pos], &p, padded);
            }
        };
        // Each (token, head) row is computed alone, so splitting them across threads changes
        // nothing but time: below ~2^16 multiply-adds a rayon hand-off costs more than it saves.
        if t * heads * 2 * d * cache.len() < 1 << 16 {
            out.chunks_mut(d).enumerate().for_each(head_row);
        } else {
            out.par_chunks_mut(d).enumerate().for_each(head_row);
        }
        Ok(Tensor::from_vec(out, (t, heads * d), &Device::Cpu)?)
    }

    /// Queries and keys `[tokens, heads · head_dim]` after the q/k norms, each over rows as wide
    /// as its weight (one head, or all of them).
    fn normed(&self, q: &Tensor, k: &Tensor) -> Result<(Tensor, Tensor)> {
        let Some((qn, kn)) = &self.qk_norm else { return Ok((q.clone(), k.clone())) };
        let rows = |norm: &RmsNorm, x: &Tensor| -> Result<Tensor> {
            let (t, width) = x.dims2()?;
            Ok(norm.forward(&x.reshape((t * width / norm.width(), norm.width()))?)?.reshape((t, width))?)
        };
        Ok((rows(qn, q)?, rows(kn, k)?))
    }
}

/// One layer's cached keys and values, in the form its attention computes with.
pub enum LayerCache {
    /// f32 rows (the reference path).
    F32(F32Cache),
    /// f16 rows laid out as llama.cpp's cache ([`F16Cache`]).
    F16(F16Cache),
}

impl LayerCache {
    /// Keys and values at positions `from..to`, each `[1, kv_heads, to - from, head_dim]` in f32.
    pub fn rows(&self, from: usize, to: usize) -> Result<(Tensor, Tensor)> {
        match self {
            LayerCache::F32(cache) => match (cache.k()?, cache.v()?) {
                (Some(k), Some(v)) => Ok((k.narrow(2, from, to - from)?, v.narrow(2, from, to - from)?)),
                _ => Err(TensorError::Compute(candle_core::Error::Msg("the layer has no cached keys".into())).into()),
            },
            LayerCache::F16(cache) => cache.rows(from, to),
        }
    }

    /// Keeps the first `len` positions (a verify pass's rejected drafts go), in place.
    pub fn truncate(&mut self, len: usize) -> Result<()> {
        match self {
            LayerCache::F32(cache) => cache.truncate(len),
            LayerCache::F16(cache) => cache.truncate(len),
        }
        Ok(())
    }

    /// Appends rows as [`LayerCache::rows`] gives them.
    pub fn append(&mut self, k: &Tensor, v: &Tensor) -> Result<()> {
        match self {
            LayerCache::F32(cache) => {
                cache.append(k, v)?;
            }
            LayerCache::F16(cache) => {
                let (kv_heads, n, d) = (k.dim(1)?, k.dim(2)?, k.dim(3)?);
                let k = k.squeeze(0)?.transpose(0, 1)?.contiguous()?.flatten_all()?.to_vec1::<f32>()?;
                let v = v.squeeze(0)?.transpose(0, 1)?.contiguous()?.flatten_all()?.to_vec1::<f32>()?;
                let row = kv_heads * d;
                for p in 0..n {
                    cache.push(&k[p * row..(p + 1) * row], &v[p * row..(p + 1) * row]);
                }
            }
        }
        Ok(())
    }
}

/// f32 keys and values (or latent attention's rows), each `[1, heads, positions, width]` in the
/// first `len` positions along dim 2 of a buffer grown 256 positions at a time, as candle's
/// `KvCache` grows. Unlike it, it can be cut back in place: a verify pass's roll-back through
/// `KvCache` reset it and copied the kept rows into a fresh buffer of its whole capacity,
/// zeroed, per layer, 10-640 ms a pass on the medium bench model (`docs/ENGINE.md`).
pub struct F32Cache {
    k: Option<Tensor>,
    v: Option<Tensor>,
    len: usize,
}

impl Default for F32Cache {
    fn default() -> Self {
        Self::new()
    }
}

impl F32Cache {
    const GROW: usize = 256;

    pub fn new() -> Self {
        F32Cache { k: None, v: None, len: 0 }
    }

    /// Appends rows `[1, heads, n, width]` (contiguous); returns all the cached ones.
    pub fn append(&mut self, k: &Tensor, v: &Tensor) -> candle_core::Result<(Tensor, Tensor)> {
        let need = self.len + k.dim(2)?;
        let cap = self.k.as_ref().map_or(Ok(0), |t| t.dim(2))?;
        if need > cap {
            let cap = need.next_multiple_of(Self::GROW);
            self.k = Some(Self::grown(self.k.take(), k, cap, self.len)?);
            self.v = Some(Self::grown(self.v.take(), v, cap, self.len)?);
        }
        let (kb, vb) = (self.k.as_ref().expect("grown above"), self.v.as_ref().expect("grown above"));
        kb.slice_set(k, 2, self.len)?;
        vb.slice_set(v, 2, self.len)?;
        self.len = need;
        Ok((kb.narrow(2, 0, need)?, vb.narrow(2, 0, need)?))
    }

    /// A zeroed buffer of `cap` positions shaped like `like`, holding `old`'s first `len`.
    fn grown(old: Option<Tensor>, like: &Tensor, cap: usize, len: usize) -> candle_core::Result<Tensor> {
        let mut shape = like.dims().to_vec();
        shape[2] = cap;
        let buf = Tensor::zeros(shape, like.dtype(), like.device())?;
        if let Some(old) = old
            && len > 0
        {
            buf.slice_set(&old.narrow(2, 0, len)?.contiguous()?, 2, 0)?;
        }
        Ok(buf)
    }

    /// The cached keys, `None` when there are none.
    pub fn k(&self) -> candle_core::Result<Option<Tensor>> {
        self.rows(&self.k)
    }

    pub fn v(&self) -> candle_core::Result<Option<Tensor>> {
        self.rows(&self.v)
    }

    fn rows(&self, buf: &Option<Tensor>) -> candle_core::Result<Option<Tensor>> {
        match buf {
            Some(t) if self.len > 0 => Ok(Some(t.narrow(2, 0, self.len)?)),
            _ => Ok(None),
        }
    }

    fn truncate(&mut self, len: usize) {
        self.len = self.len.min(len);
    }
}

/// Keys by position (`[position][kv_head][head_dim]`) and values transposed (one row of
/// positions per kv head and dimension), both f16, as llama.cpp stores them without flash
/// attention: each KQ and KQV dot product reads one contiguous row.
pub struct F16Cache {
    kv_heads: usize,
    head_dim: usize,
    len: usize,
    k: Vec<f16>,
    v: Vec<Vec<f16>>,
}

impl F16Cache {
    pub fn new(kv_heads: usize, head_dim: usize) -> Self {
        F16Cache { kv_heads, head_dim, len: 0, k: Vec::new(), v: vec![Vec::new(); kv_heads * head_dim] }
    }

    fn len(&self) -> usize {
        self.len
    }

    /// One position's keys and values, `[kv_heads · head_dim]` each, rounded to f16 (`ggml_set_rows`).
    fn push(&mut self, k: &[f32], v: &[f32]) {
        self.k.extend(k.iter().map(|&x| f16::from_f32(x)));
        for (row, &x) in self.v.iter_mut().zip(v) {
            row.push(f16::from_f32(x));
        }
        self.len += 1;
    }

    fn truncate(&mut self, len: usize) {
        let len = len.min(self.len);
        self.k.truncate(len * self.kv_heads * self.head_dim);
        self.v.iter_mut().for_each(|row| row.truncate(len));
        self.len = len;
    }

    fn key(&self, position: usize, head: usize) -> &[f16] {
        let at = (position * self.kv_heads + head) * self.head_dim;
        &self.k[at..at + self.head_dim]
    }

    fn values(&self, head: usize, dim: usize) -> &[f16] {
        &self.v[head * self.head_dim + dim]
    }

    fn rows(&self, from: usize, to: usize) -> Result<(Tensor, Tensor)> {
        let (h, d, n) = (self.kv_heads, self.head_dim, to - from);
        let mut k = Vec::with_capacity(h * n * d);
        let mut v = Vec::with_capacity(h * n * d);
        for head in 0..h {
            for p in from..to {
                k.extend(self.key(p, head).iter().map(|x| x.to_f32()));
                v.extend((0..d).map(|e| self.values(head, e)[p].to_f32()));
            }
        }
        Ok((Tensor::from_vec(k, (1, h, n, d), &Device::Cpu)?, Tensor::from_vec(v, (1, h, n, d), &Device::Cpu)?))
    }
}

impl Attention {
    /// A layer's grouped-query attention: q, k, v and output projections (with biases where the
    /// file has them), the optional per-head q/k norms, gpt-oss's sinks, Qwen3-Next's gate.
    pub fn load(w: &LayerTensors<'_>, spec: &ModelSpec, numerics: Numerics) -> Result<Attention> {
        let (hidden, a) = (spec.hidden_size, &spec.attention);
        let (q_dim, kv_dim) = (a.heads * a.head_dim, a.kv_heads * a.head_dim);
        // A pair or neither (MiniMax-M2 always has them); half a pair is a broken file.
        let required = spec.architecture == Architecture::MinimaxM2;
        let qk_norm = match (w.opt("attn_q_norm.weight")?, w.opt("attn_k_norm.weight")?) {
            (None, None) if !required => None,
            (q, k) => {
                let q = q.map_or_else(|| w.require("attn_q_norm.weight"), Ok)?;
                let k = k.map_or_else(|| w.require("attn_k_norm.weight"), Ok)?;
                // One head wide, or (MiniMax-M2) as wide as all of them.
                if q.shape != [q_dim] {
                    q.expect_shape(&[a.head_dim])?;
                }
                if k.shape != [kv_dim] {
                    k.expect_shape(&[a.head_dim])?;
                }
                Some((norm(&q, spec, numerics)?, norm(&k, spec, numerics)?))
            }
        };
        // Qwen3-Next's q_proj gives each head's query and then its gate.
        let q_rows = if a.output_gate { 2 * q_dim } else { q_dim };
        Ok(Attention {
            q: w.linear("attn_q", q_rows, hidden)?,
            k: w.linear("attn_k", kv_dim, hidden)?,
            v: w.linear("attn_v", kv_dim, hidden)?,
            o: w.linear("attn_output", hidden, q_dim)?,
            qk_norm,
            rope: Rope::new(a.rope_dim, a.rope_theta, a.rope_style, a.rope_scaling.as_ref()),
            output_gate: a.output_gate,
            heads: a.heads,
            kv_heads: a.kv_heads,
            head_dim: a.head_dim,
            window: a.sliding_window[w.layer],
            sinks: if a.sinks { Some(sinks(&w.require("attn_sinks.weight")?, a.heads)?) } else { None },
        })
    }
}

/// gpt-oss's attention sinks `[heads]`, as f32.
pub fn sinks(view: &TensorView<'_>, heads: usize) -> Result<Tensor> {
    view.expect_shape(&[heads])?;
    Ok(view.to_f32()?)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rows(n: usize, seed: f32) -> Tensor {
        let data: Vec<f32> = (0..2 * n * 3).map(|i| seed + i as f32).collect();
        Tensor::from_vec(data, (1, 2, n, 3), &Device::Cpu).unwrap()
    }

    /// A roll-back cuts the f32 cache in place: rows appended after it land in the same buffer
    /// and read back as a cache that never held the rejected rows.
    #[test]
    fn an_f32_cache_cut_back_keeps_its_buffer_and_reads_as_if_never_longer() {
        let mut cut = F32Cache::new();
        cut.append(&rows(5, 0.0), &rows(5, 100.0)).unwrap();
        let before = cut.k.clone().unwrap();
        cut.append(&rows(3, 50.0), &rows(3, 150.0)).unwrap();
        cut.truncate(6);
        let (k, v) = cut.append(&rows(2, 70.0), &rows(2, 170.0)).unwrap();
        assert_eq!(cut.k.as_ref().unwrap().id(), before.id(), "the cut reallocated the buffer");
        let mut fresh = F32Cache::new();
        fresh.append(&rows(5, 0.0), &rows(5, 100.0)).unwrap();
        let first = |t: Tensor| t.narrow(2, 0, 1).unwrap().contiguous().unwrap();
        fresh.append(&first(rows(3, 50.0)), &first(rows(3, 150.0))).unwrap();
        let (fk, fv) = fresh.append(&rows(2, 70.0), &rows(2, 170.0)).unwrap();
        assert_eq!(k.squeeze(0).unwrap().to_vec3::<f32>().unwrap(), fk.squeeze(0).unwrap().to_vec3::<f32>().unwrap());
        assert_eq!(v.squeeze(0).unwrap().to_vec3::<f32>().unwrap(), fv.squeeze(0).unwrap().to_vec3::<f32>().unwrap());
        assert_eq!(cut.k().unwrap().unwrap().dim(2).unwrap(), 8);
        // Past its 256 positions it grows, keeping what it held.
        let (k, _) = cut.append(&rows(300, 0.0), &rows(300, 0.0)).unwrap();
        assert_eq!(k.dim(2).unwrap(), 308);
        assert_eq!(
            k.narrow(2, 0, 8).unwrap().squeeze(0).unwrap().to_vec3::<f32>().unwrap(),
            fk.squeeze(0).unwrap().to_vec3::<f32>().unwrap()
        );
    }
}
