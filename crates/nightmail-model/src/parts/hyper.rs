//! Manifold-constrained hyper-connections (mHC; Xie et al. 2026, DeepSeek-V4 paper §2.2;
//! transformers 5.24 `DeepseekV4HyperConnection`, `DeepseekV4HyperHead`): the residual is
//! `hc_mult` streams per token. Before a block, a projection of all streams (unweighted-RMS-normed
//! and flattened) gives pre weights that collapse the streams into the block's input, post
//! weights that spread its output back over them, and a mixing matrix made doubly stochastic by
//! Sinkhorn-Knopp steps that mixes the old streams into the new ones. The head collapses them
//! once more before the final norm. All of it in f32, in the reference's order.

use candle_core::{Device, Tensor};

use nightmail_tensor::unweighted_rms;

use crate::error::Result;
use crate::source::WeightSource;
use crate::spec::{DeepseekV4Spec, ModelSpec};

/// One mixing point's weights (`hc_attn_*` or `hc_ffn_*`).
pub struct HyperMix {
    /// `fn`: `[(2 + n) · n, n · hidden]`.
    pub(crate) proj: Tensor,
    pub(crate) base: Vec<f32>,
    /// The pre, post and mix scales.
    pub(crate) scale: [f32; 3],
    pub(crate) streams: usize,
    pub(crate) sinkhorn_iters: usize,
    pub(crate) hc_eps: f32,
    pub(crate) norm_eps: f32,
}

/// What a mixing point hands on past its block: per token, the post weights `[n]` and the
/// mixing matrix `[n, n]`.
pub struct Spread {
    post: Tensor,
    mix: Tensor,
}

fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

/// `streams` `[tokens, n, hidden]` weighted by `pre` `[tokens, n]` and summed over n.
fn collapse(streams: &Tensor, pre: Vec<f32>, n: usize) -> Result<Tensor> {
    let tokens = streams.dim(0)?;
    let pre = Tensor::from_vec(pre, (tokens, n, 1), &Device::Cpu)?;
    Ok(streams.broadcast_mul(&pre)?.sum(1)?)
}

impl HyperMix {
    /// The block input `[tokens, hidden]` collapsed from `streams` `[tokens, n, hidden]`, and
    /// what [`HyperMix::spread`] needs after the block.
    pub fn collapse(&self, streams: &Tensor) -> Result<(Tensor, Spread)> {
        let (tokens, n, hidden) = streams.dims3()?;
        let flat = unweighted_rms(&streams.reshape((tokens, n * hidden))?, self.norm_eps)?;
        let mixes = flat.matmul(&self.proj.t()?)?.to_vec2::<f32>()?;
        let (eps, [s_pre, s_post, _]) = (self.hc_eps, self.scale);
        let (mut pre, mut post, mut mix) = (Vec::new(), Vec::new(), Vec::new());
        for m in &mixes {
            pre.extend((0..n).map(|i| sigmoid(m[i] * s_pre + self.base[i]) + eps));
            post.extend((0..n).map(|i| 2.0 * sigmoid(m[n + i] * s_post + self.base[n + i])));
            mix.extend(self.sinkhorn(&m[2 * n..], &self.base[2 * n..]));
        }
        let spread = Spread {
            post: Tensor::from_vec(post, (tokens, n, 1), &Device::Cpu)?,
            mix: Tensor::from_vec(mix, (tokens, n, n), &Device::Cpu)?,
        };
        Ok((collapse(streams, pre, n)?, spread))
    }

    /// The row-softmaxed mix (plus eps), then alternately its columns and rows normalized: one
    /// column step, then `sinkhorn_iters − 1` row-and-column steps.
    fn sinkhorn(&self, logits: &[f32], base: &[f32]) -> Vec<f32> {
        let (n, eps, scale) = (self.streams, self.hc_eps, self.scale[2]);
        let mut c: Vec<f32> = Vec::with_capacity(n * n);
        for r in 0..n {
            let row: Vec<f32> = (0..n).map(|j| logits[r * n + j] * scale + base[r * n + j]).collect();
            let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let e: Vec<f32> = row.iter().map(|v| (v - max).exp()).collect();
            let sum: f32 = e.iter().sum();
            c.extend(e.iter().map(|v| v / sum + eps));
        }
        let columns = |c: &mut Vec<f32>| {
            for j in 0..n {
                let sum: f32 = (0..n).map(|r| c[r * n + j]).sum::<f32>() + eps;
                (0..n).for_each(|r| c[r * n + j] /= sum);
            }
        };
        columns(&mut c);
        for _ in 1..self.sinkhorn_iters {
            for r in 0..n {
                let sum: f32 = c[r * n..(r + 1) * n].iter().sum::<f32>() + eps;
                c[r * n..(r + 1) * n].iter_mut().for_each(|v| *v /= sum);
            }
            columns(&mut c);
        }
        c
    }

    /// The new streams: `post · block + mixᵀ · streams`.
    pub fn spread(spread: &Spread, block: &Tensor, streams: &Tensor) -> Result<Tensor> {
        let out = spread.post.broadcast_mul(&block.unsqueeze(1)?)?;
        Ok((out + spread.mix.transpose(1, 2)?.contiguous()?.matmul(&streams.contiguous()?)?)?)
    }
}

/// The final collapse (`hc_head`): sigmoid pre weights only.
pub struct HyperHead {
    pub(crate) proj: Tensor,
    pub(crate) base: Vec<f32>,
    pub(crate) scale: f32,
    pub(crate) hc_eps: f32,
    pub(crate) norm_eps: f32,
}

impl HyperHead {
    pub fn collapse(&self, streams: &Tensor) -> Result<Tensor> {
        let (tokens, n, hidden) = streams.dims3()?;
        let flat = unweighted_rms(&streams.reshape((tokens, n * hidden))?, self.norm_eps)?;
        let mixes = flat.matmul(&self.proj.t()?)?.to_vec2::<f32>()?;
        let pre = mixes.iter().flat_map(|m| (0..n).map(|i| sigmoid(m[i] * self.scale + self.base[i]) + self.hc_eps));
        collapse(streams, pre.collect(), n)
    }
}

impl HyperMix {
    /// One hyper-connection mixing point (`{prefix}_fn`, `_base`, `_scale`).
    pub fn load(ck: &dyn WeightSource, spec: &ModelSpec, v4: &DeepseekV4Spec, prefix: &str) -> Result<HyperMix> {
        let (n, mix) = (v4.hc_mult, v4.hc_mix());
        let proj = ck.require(&format!("{prefix}_fn.weight"))?;
        proj.expect_shape(&[mix, n * spec.hidden_size])?;
        let base = ck.require(&format!("{prefix}_base.weight"))?;
        base.expect_shape(&[mix])?;
        let scale = ck.require(&format!("{prefix}_scale.weight"))?;
        scale.expect_shape(&[3])?;
        let scale: Vec<f32> = scale.to_f32()?.to_vec1()?;
        Ok(HyperMix {
            proj: proj.to_f32()?,
            base: base.to_f32()?.to_vec1()?,
            scale: [scale[0], scale[1], scale[2]],
            streams: n,
            sinkhorn_iters: v4.hc_sinkhorn_iters,
            hc_eps: v4.hc_eps,
            norm_eps: spec.rms_norm_eps as f32,
        })
    }
}

impl HyperHead {
    /// The hyper-connection head (`output_hc_fn`, `_base`, `_scale`).
    pub fn load(ck: &dyn WeightSource, spec: &ModelSpec, v4: &DeepseekV4Spec) -> Result<HyperHead> {
        let n = v4.hc_mult;
        let proj = ck.require("output_hc_fn.weight")?;
        proj.expect_shape(&[n, n * spec.hidden_size])?;
        let base = ck.require("output_hc_base.weight")?;
        base.expect_shape(&[n])?;
        let scale = ck.require("output_hc_scale.weight")?;
        scale.expect_shape(&[1])?;
        Ok(HyperHead {
            proj: proj.to_f32()?,
            base: base.to_f32()?.to_vec1()?,
            scale: scale.to_f32()?.to_vec1::<f32>()?[0],
            hc_eps: v4.hc_eps,
            norm_eps: spec.rms_norm_eps as f32,
        })
    }
}
