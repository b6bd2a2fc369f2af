//! DeepSeek Sparse Attention (DeepSeek-V3.2-Exp report §2.1; transformers 5.24
//! `models/deepseek_v32/modeling_deepseek_v32.py` `DeepseekV32Indexer`, and GLM-5's
//! `models/glm_moe_dsa/modeling_glm_moe_dsa.py` `GlmMoeDsaIndexer`): a lightning indexer scores
//! each query against every visible key, Σ_h w_h · ReLU(q_h · k), and latent attention attends
//! only the `top_k` best. One key of `head_dim` per token is cached beside MLA's latent.
//!
//! The reference's Hadamard rotation and FP8 scoring are left out as transformers leaves them:
//! the rotation is orthogonal (q·k is unchanged) and FP8 is a precision choice.

use candle_core::{D, Device, Tensor};

use crate::error::Result;
use crate::parts::rope::Rope;
use crate::source::LayerTensors;
use crate::spec::{DsaSpec, ModelSpec};
use nightmail_tensor::Linear;

/// transformers' `nn.LayerNorm(head_dim, eps=1e-6)` on the indexer's key.
const KEY_NORM_EPS: f32 = 1e-6;

pub struct Indexer {
    /// `wq_b`: the query latent (`q_a_layernorm(q_a_proj(x))`) to `heads · head_dim`.
    q_b: Linear,
    /// `wk`: the layer input to the one key of `head_dim`.
    k: Linear,
    /// `k_norm`: a LayerNorm with weight and bias.
    k_norm_weight: Tensor,
    k_norm_bias: Tensor,
    /// `weights_proj`: one weight per head from the layer input.
    weights: Linear,
    /// Rotates the first `qk_rope_head_dim` channels of each head; the rest pass.
    rope: Rope,
    heads: usize,
    head_dim: usize,
    top_k: usize,
}

/// One pass's indexer rows, before rotation: queries `[tokens, heads · head_dim]`, keys
/// `[tokens, head_dim]` (normed) and head weights `[tokens, heads]`.
pub struct IndexRows<'a> {
    pub q: &'a Tensor,
    pub k: &'a Tensor,
    pub w: &'a Tensor,
}

impl Indexer {
    /// Layer `w`'s indexer under llama.cpp's names (gguf-py `tensor_mapping.py`: `indexer.attn_q_b`,
    /// `indexer.attn_k`, `indexer.k_norm`, `indexer.proj`), rotated with MLA's frequencies.
    pub fn load(
        w: &LayerTensors<'_>,
        spec: &ModelSpec,
        dsa: &DsaSpec,
        q_lora_rank: usize,
        rope_dim: usize,
    ) -> Result<Self> {
        let (hidden, a) = (spec.hidden_size, &spec.attention);
        let norm = |name: &str| -> Result<Tensor> {
            let t = w.require(name)?;
            t.expect_shape(&[dsa.head_dim])?;
            Ok(t.to_f32()?)
        };
        Ok(Indexer {
            q_b: w.weight("indexer.attn_q_b", dsa.heads * dsa.head_dim, q_lora_rank)?,
            k: w.weight("indexer.attn_k", dsa.head_dim, hidden)?,
            k_norm_weight: norm("indexer.k_norm.weight")?,
            k_norm_bias: norm("indexer.k_norm.bias")?,
            weights: w.weight("indexer.proj", dsa.heads, hidden)?,
            rope: Rope::new(rope_dim, a.rope_theta, dsa.rope_style, a.rope_scaling.as_ref()),
            heads: dsa.heads,
            head_dim: dsa.head_dim,
            top_k: dsa.top_k,
        })
    }

    pub fn head_dim(&self) -> usize {
        self.head_dim
    }

    /// The rows of `x` (the layer input) and `q_latent` (the normed query latent), in
    /// [`IndexRows`]' order: queries, keys, head weights.
    pub fn project(&self, x: &Tensor, q_latent: &Tensor) -> Result<[Tensor; 3]> {
        let k = candle_nn::ops::layer_norm(&self.k.forward(x)?, &self.k_norm_weight, &self.k_norm_bias, KEY_NORM_EPS)?;
        Ok([self.q_b.forward(q_latent)?, k, self.weights.forward(x)?])
    }

    /// This pass's keys rotated to positions `start..`, `[tokens, head_dim]`: what the cache keeps.
    pub fn keys(&self, rows: &IndexRows<'_>, start: usize) -> Result<Tensor> {
        let t = rows.k.dim(0)?;
        let k = self.rope.apply(&rows.k.reshape((1, 1, t, self.head_dim))?, start)?;
        Ok(k.reshape((t, self.head_dim))?)
    }

    /// Per query at positions `start..`, the keys it attends among `keys` (`[positions, head_dim]`,
    /// every cached and new one): None where it sees no more than `top_k` (all of them, causally).
    pub fn choose(&self, rows: &IndexRows<'_>, keys: &Tensor, start: usize) -> Result<Vec<Option<Vec<usize>>>> {
        let t = rows.q.dim(0)?;
        let q = rows.q.reshape((t, self.heads, self.head_dim))?.transpose(0, 1)?.unsqueeze(0)?;
        let q = self.rope.apply(&q, start)?.squeeze(0)?.transpose(0, 1)?.contiguous()?;
        let scores = index_scores(&q, rows.w, keys)?.to_vec2::<f32>()?;
        let visible = |i: usize| start + i + 1;
        Ok(scores
            .iter()
            .enumerate()
            .map(|(i, row)| (visible(i) > self.top_k).then(|| top_keys(&row[..visible(i)], self.top_k)))
            .collect())
    }
}

/// One sequence's indexer choices in the pass under way, by position: kept by a layer that runs
/// its indexer, read by the "shared" layers after it (transformers `GlmMoeDsaAttention`'s
/// `prev_topk_indices`). A verify pass attends one position at a time, so a layer's choices
/// extend the run it continues and start a new one otherwise.
#[derive(Debug, Default)]
pub struct Choices {
    first: usize,
    rows: Vec<Option<Vec<usize>>>,
}

impl Choices {
    /// Drops the choices of positions before `position`, where the pass under way starts.
    pub(crate) fn forget_before(&mut self, position: usize) {
        let gone = position.saturating_sub(self.first).min(self.rows.len());
        self.rows.drain(..gone);
        self.first += gone;
    }

    pub(crate) fn keep(&mut self, start: usize, chosen: &[Option<Vec<usize>>]) {
        if start != self.first + self.rows.len() {
            self.rows.clear();
            self.first = start;
        }
        self.rows.extend_from_slice(chosen);
    }

    /// The choices for positions `start..start + tokens`.
    pub(crate) fn at(&self, start: usize, tokens: usize) -> Result<Vec<Option<Vec<usize>>>> {
        start
            .checked_sub(self.first)
            .and_then(|from| self.rows.get(from..from + tokens))
            .map(<[_]>::to_vec)
            .ok_or_else(|| candle_core::Error::Msg("a shared DSA layer before any full one".into()).into())
    }
}

/// The lightning indexer's score of each query against each key, Σ_h w_h·h^-½ · ReLU(q_h · k)·d^-½
/// (`DeepseekV32Indexer`, `DeepseekV4IndexerScorer`): queries `[tokens, heads, d]`, head weights
/// `[tokens, heads]`, keys `[keys, d]` → `[tokens, keys]`, as two matmuls.
pub(crate) fn index_scores(q: &Tensor, w: &Tensor, keys: &Tensor) -> Result<Tensor> {
    let (t, h, d) = q.dims3()?;
    let s = keys.dim(0)?;
    let scores = q.reshape((t * h, d))?.matmul(&keys.t()?)?.relu()?;
    let scores = (scores * (d as f64).powf(-0.5))?.reshape((t, h, s))?;
    let w = (w * (h as f64).powf(-0.5))?.unsqueeze(1)?;
    Ok(w.matmul(&scores)?.squeeze(1)?)
}

/// The `top_k` best of `scores`, in key order; ties to the earlier key.
pub(crate) fn top_keys(scores: &[f32], top_k: usize) -> Vec<usize> {
    if top_k == 0 {
        return Vec::new();
    }
    let mut order: Vec<usize> = (0..scores.len()).collect();
    if order.len() > top_k {
        order.select_nth_unstable_by(top_k - 1, |a, b| scores[*b].total_cmp(&scores[*a]).then(a.cmp(b)));
        order.truncate(top_k);
    }
    order.sort_unstable();
    order
}

/// The additive mask `[tokens, keys]` of queries at positions `start..` over `keys` positions:
/// causal, and where a query has a choice, only the keys chosen.
pub(crate) fn mask(tokens: usize, keys: usize, start: usize, chosen: Option<&[Option<Vec<usize>>]>) -> Result<Tensor> {
    let mut mask = vec![f32::NEG_INFINITY; tokens * keys];
    for (i, row) in mask.chunks_exact_mut(keys).enumerate() {
        match chosen.and_then(|c| c[i].as_ref()) {
            Some(keep) => keep.iter().for_each(|&j| row[j] = 0.0),
            None => row[..=start + i].iter_mut().for_each(|v| *v = 0.0),
        }
    }
    Ok(Tensor::from_vec(mask, (tokens, keys), &Device::Cpu)?)
}

/// Joins the rotated shared key `[1, 1, t, rope]` and the indexer's keys `[t, d]` into the row the
/// latent cache keeps beside each latent, and splits a cache's rows back: (`k_pe`, keys).
pub(crate) fn join_keys(k_pe: &Tensor, keys: &Tensor) -> Result<Tensor> {
    let t = keys.dim(0)?;
    Ok(Tensor::cat(&[k_pe, &keys.reshape((1, 1, t, keys.dim(1)?))?], D::Minus1)?)
}

pub(crate) fn split_keys(rows: &Tensor, rope: usize) -> Result<(Tensor, Tensor)> {
    let width = rows.dim(D::Minus1)?;
    let keys = rows.narrow(D::Minus1, rope, width - rope)?;
    let s = keys.dim(2)?;
    Ok((rows.narrow(D::Minus1, 0, rope)?, keys.reshape((s, width - rope))?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_best_keys_are_kept_in_key_order_and_ties_go_to_the_earlier() {
        // Two heads of 2: head 0 weighs 1, head 1 weighs −1, so a key scoring on head 1 loses.
        let cpu = &Device::Cpu;
        let q = Tensor::from_vec(vec![1f32, 0.0, 0.0, 1.0], (1, 2, 2), cpu).unwrap();
        let w = Tensor::from_vec(vec![1f32, -1.0], (1, 2), cpu).unwrap();
        let keys = vec![0.5f32, 0.0, 2.0, 0.0, 1.0, 3.0, -1.0, 0.0, 2.0, 0.0];
        let keys = Tensor::from_vec(keys, (5, 2), cpu).unwrap();
        let scores = index_scores(&q, &w, &keys).unwrap().to_vec2::<f32>().unwrap().remove(0);
        // ∝ 0.5, 2, 1 − 3, 0 (ReLU), 2, times 2^-½ · 2^-½.
        let want = [0.25f32, 1.0, -1.0, 0.0, 1.0];
        assert!(scores.iter().zip(want).all(|(a, b)| (a - b).abs() < 1e-6), "{scores:?}");
        // The two 1s, then 0.25.
        assert_eq!(top_keys(&scores, 3), vec![0, 1, 4]);
        assert_eq!(top_keys(&scores, 1), vec![1]);
        assert_eq!(top_keys(&scores, 9), vec![0, 1, 2, 3, 4]);
    }

    #[test]
    fn a_shared_layer_reads_the_choices_of_its_pass_one_position_at_a_time_or_all_at_once() {
        let mut c = Choices::default();
        // A prefill of 3 positions, then a verify pass at 3.. kept one position at a time.
        c.keep(0, &[None, None, Some(vec![0])]);
        assert_eq!(c.at(1, 2).unwrap(), vec![None, Some(vec![0])]);
        c.forget_before(3);
        c.keep(3, &[Some(vec![1])]);
        c.keep(4, &[Some(vec![2])]);
        assert_eq!(c.at(3, 2).unwrap(), vec![Some(vec![1]), Some(vec![2])]);
        assert_eq!(c.at(4, 1).unwrap(), vec![Some(vec![2])]);
        assert!(c.at(2, 1).is_err() && c.at(4, 2).is_err(), "only the pass's own positions");
        // The next full layer starts the run again.
        c.keep(3, &[Some(vec![0])]);
        assert_eq!(c.at(3, 1).unwrap(), vec![Some(vec![0])]);
        assert!(c.at(4, 1).is_err());
    }

    #[test]
    fn the_mask_is_causal_and_keeps_only_the_chosen_keys_where_there_is_a_choice() {
        let chosen = [None, Some(vec![0, 2])];
        let m = mask(2, 4, 1, Some(&chosen)).unwrap().to_vec2::<f32>().unwrap();
        let inf = f32::NEG_INFINITY;
        assert_eq!(m, vec![vec![0.0, 0.0, inf, inf], vec![0.0, inf, 0.0, inf]]);
    }
}
