//! Causal multi-head attention with grouped key/value heads (GQA, Ainslie et al., arXiv
//! 2305.13245), rotary positions, optional per-head q/k RMSNorm (Qwen3), an optional sliding
//! window (Mistral, arXiv 2310.06825) and optional attention sinks (gpt-oss). Follows
//! transformers' `LlamaAttention` / `Qwen3MoeAttention` / `GptOssAttention`.

use candle_core::{Device, Tensor};

use super::layers::{Linear, RmsNorm};
use super::rope::Rope;
use crate::error::Result;

pub struct Attention {
    pub(crate) q: Linear,
    pub(crate) k: Linear,
    pub(crate) v: Linear,
    pub(crate) o: Linear,
    /// Qwen3's per-head RMSNorm of queries and keys, before rotation.
    pub(crate) qk_norm: Option<(RmsNorm, RmsNorm)>,
    pub(crate) rope: Rope,
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
    pub(crate) fn output(&self, attended: &Tensor) -> Result<Tensor> {
        self.o.forward(attended)
    }

    /// Queries, keys and values `[tokens, heads · head_dim]` of `x`.
    pub(crate) fn project(&self, x: &Tensor) -> Result<(Tensor, Tensor, Tensor)> {
        Ok((self.q.forward(x)?, self.k.forward(x)?, self.v.forward(x)?))
    }

    /// Attention of projected rows at positions `start..` over `cache` (to which their keys and
    /// values are appended): `[tokens, heads · head_dim]`, before the output projection.
    pub(crate) fn attend(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        start: usize,
        cache: &mut candle_nn::kv_cache::KvCache,
    ) -> Result<Tensor> {
        let (t, d) = (q.dim(0)?, self.head_dim);
        let mut q = q.reshape((t, self.heads, d))?;
        let mut k = k.reshape((t, self.kv_heads, d))?;
        let v = v.reshape((t, self.kv_heads, d))?;
        if let Some((qn, kn)) = &self.qk_norm {
            q = qn.forward(&q)?;
            k = kn.forward(&k)?;
        }
        // [1, heads, tokens, head_dim]
        let q = self.rope.apply(&q.transpose(0, 1)?.unsqueeze(0)?, start)?;
        let k = self.rope.apply(&k.transpose(0, 1)?.unsqueeze(0)?, start)?;
        let v = v.transpose(0, 1)?.unsqueeze(0)?.contiguous()?;
        let (k, v) = cache.append(&k, &v)?;
        let s = k.dim(2)?;
        // Each group of `rep` query heads shares one key/value head: fold the group into the
        // query axis instead of copying keys and values `rep` times.
        let rep = self.heads / self.kv_heads;
        let q = q.squeeze(0)?.reshape((self.kv_heads, rep * t, d))?;
        let (k, v) = (k.squeeze(0)?, v.squeeze(0)?);
        let mut scores = (q.matmul(&k.t()?)? * (1.0 / (d as f64).sqrt()))?;
        if let Some(mask) = self.mask(start, t, s)? {
            scores = scores.reshape((self.kv_heads, rep, t, s))?.broadcast_add(&mask)?.reshape((
                self.kv_heads,
                rep * t,
                s,
            ))?;
        }
        let p = match &self.sinks {
            None => candle_nn::ops::softmax_last_dim(&scores)?,
            // transformers `eager_attention_forward` (gpt_oss): cat the sink, softmax, drop it.
            // Row (g, r·t + i) of the folded scores is head g·rep + r.
            Some(sinks) => {
                let col = sinks.reshape((self.kv_heads, rep, 1, 1))?.broadcast_as((self.kv_heads, rep, t, 1))?;
                let col = col.contiguous()?.reshape((self.kv_heads, rep * t, 1))?;
                let p = candle_nn::ops::softmax_last_dim(&Tensor::cat(&[&scores, &col], 2)?)?;
                p.narrow(2, 0, s)?.contiguous()?
            }
        };
        Ok(p.matmul(&v.contiguous()?)?.reshape((self.heads, t, d))?.transpose(0, 1)?.reshape((t, self.heads * d))?)
    }

    /// Additive mask `[tokens, keys]`: query i (at position start+i) sees key j when j ≤ start+i
    /// and, with a window w, start+i − j < w. None when every key is visible.
    fn mask(&self, start: usize, t: usize, s: usize) -> Result<Option<Tensor>> {
        let windowed = self.window.is_some_and(|w| s > w);
        if t == 1 && !windowed {
            return Ok(None);
        }
        let mut m = Vec::with_capacity(t * s);
        for i in 0..t {
            let pos = start + i;
            for j in 0..s {
                let visible = j <= pos && self.window.is_none_or(|w| pos - j < w);
                m.push(if visible { 0.0 } else { f32::NEG_INFINITY });
            }
        }
        Ok(Some(Tensor::from_vec(m, (t, s), &Device::Cpu)?))
    }
}
