//! Qwen3-Next's and Qwen3.5-MoE's Gated DeltaNet layer (Yang et al., arXiv 2412.06464;
//! transformers `Qwen3NextGatedDeltaNet`, llama.cpp src/models/qwen3next.cpp
//! `build_layer_attn_linear`). Per token: q, k and v through a causal depthwise convolution
//! (with SiLU), q and k L2-normalized (q also scaled by k_dim^-½), β = σ(b), one decay per value
//! head g = −exp(A_log)·softplus(a + dt_bias); then the gated delta rule (`delta_rule.rs`, shared
//! with KDA), each key head serving `v_heads / k_heads` value heads; the output RMS-normed per
//! head (weight w, not 1 + w), times SiLU(z), then out_proj.
//!
//! The checkpoints store the projections three ways: transformers' Qwen3-Next fuses q, k, v, z
//! into `in_proj_qkvz` and b, a into `in_proj_ba`, both interleaved per key head (llama.cpp's
//! legacy `ssm_in` and its `ssm_ba`); llama.cpp's converter splits the first into `attn_qkv`
//! and `attn_gate`; Qwen3.5 stores `in_proj_qkv`, `in_proj_z`, `in_proj_b`, `in_proj_a`. All
//! are read as they are and their outputs gathered into one order, so a quantized matrix needs
//! no row shuffle.

use candle_core::{Device, Tensor};

use crate::error::Result;
use crate::parts::delta_rule::{
    DeltaState, Heads, StateShape, convolve, decay_rates, gated_norm, l2_normalize, sigmoid, softplus,
};
use crate::source::WeightSource;
use crate::spec::{DeltaNetSpec, ModelSpec};
use nightmail_formats::Format;
use nightmail_tensor::Linear;

pub struct GatedDeltaNet {
    /// The input projections, whose outputs are concatenated into one raw row per token.
    projections: Vec<Linear>,
    /// Where, in the raw row, each of q|k|v's convolution channels, z's channels, β's and α's
    /// logits are.
    conv_in: Vec<usize>,
    z: Vec<usize>,
    b: Vec<usize>,
    a: Vec<usize>,
    /// Depthwise taps `[channels][kernel]`, oldest input first.
    conv: Vec<f32>,
    dt_bias: Vec<f32>,
    /// exp(A_log) per value head.
    decay_rate: Vec<f32>,
    /// The gated RMSNorm's weight `[v_dim]` and eps.
    norm: Vec<f32>,
    eps: f32,
    out: Linear,
    spec: DeltaNetSpec,
}

impl GatedDeltaNet {
    /// Layer `l`'s weights under llama.cpp's `qwen3next` / `qwen35moe` names (a Hugging Face
    /// directory translates them); `format` says how A is stored.
    pub fn load(ck: &dyn WeightSource, format: Format, spec: &ModelSpec, d: &DeltaNetSpec, l: usize) -> Result<Self> {
        let hidden = spec.hidden_size;
        let (kd, vd, r) = (d.k_heads * d.k_head_dim, d.v_heads * d.v_head_dim, d.v_heads / d.k_heads);
        let channels = d.conv_channels();
        let name = |n: &str| format!("blk.{l}.{n}");
        let has = |n: &str| -> Result<bool> { Ok(ck.tensor(&name(n))?.is_some()) };
        let linear = |n: &str, rows: usize, cols: usize| -> Result<Linear> {
            let m = ck.require(&name(&format!("{n}.weight")))?;
            m.expect_shape(&[rows, cols])?;
            ck.linear(&m, None)
        };
        let vector = |n: &str, len: usize| ck.vector(&name(n), len);
        let mut projections = Vec::new();
        let (mut conv_in, mut z) = (Vec::with_capacity(channels), Vec::with_capacity(vd));
        if has("ssm_in.weight")? {
            // Per key head: q (k_dim), k (k_dim), its value heads' v, then their z.
            projections.push(linear("ssm_in", 2 * kd + 2 * vd, hidden)?);
            let group = 2 * d.k_head_dim + 2 * r * d.v_head_dim;
            let part = |offset: usize, width: usize| -> Vec<usize> {
                (0..d.k_heads).flat_map(|g| (0..width).map(move |i| g * group + offset + i)).collect()
            };
            conv_in.extend(part(0, d.k_head_dim));
            conv_in.extend(part(d.k_head_dim, d.k_head_dim));
            conv_in.extend(part(2 * d.k_head_dim, r * d.v_head_dim));
            z.extend(part(2 * d.k_head_dim + r * d.v_head_dim, r * d.v_head_dim));
        } else {
            projections.push(linear("attn_qkv", channels, hidden)?);
            projections.push(linear("attn_gate", vd, hidden)?);
            conv_in.extend(0..channels);
            z.extend(channels..channels + vd);
        }
        let at = 2 * kd + 2 * vd;
        let (b, a) = if has("ssm_ba.weight")? {
            // Per key head: its value heads' β logits, then their α.
            projections.push(linear("ssm_ba", 2 * d.v_heads, hidden)?);
            let part = |offset: usize| -> Vec<usize> {
                (0..d.k_heads).flat_map(|g| (0..r).map(move |i| at + g * 2 * r + offset + i)).collect()
            };
            (part(0), part(r))
        } else {
            projections.push(linear("ssm_beta", d.v_heads, hidden)?);
            projections.push(linear("ssm_alpha", d.v_heads, hidden)?);
            ((at..at + d.v_heads).collect(), (at + d.v_heads..at + 2 * d.v_heads).collect())
        };
        let decay_rate = decay_rates(&vector("ssm_a", d.v_heads)?, format);
        Ok(GatedDeltaNet {
            projections,
            conv_in,
            z,
            b,
            a,
            conv: vector("ssm_conv1d.weight", channels * d.conv_kernel)?,
            dt_bias: vector("ssm_dt.bias", d.v_heads)?,
            decay_rate,
            norm: vector("ssm_norm.weight", d.v_head_dim)?,
            eps: spec.rms_norm_eps as f32,
            out: linear("ssm_out", hidden, vd)?,
            spec: d.clone(),
        })
    }

    pub fn state_shape(&self) -> StateShape {
        let d = &self.spec;
        StateShape {
            channels: d.conv_channels(),
            heads: d.v_heads,
            k_dim: d.k_head_dim,
            v_dim: d.v_head_dim,
            kernel: d.conv_kernel,
        }
    }

    /// The raw projections of `x` (`[tokens, hidden]`), one row per token.
    pub fn project(&self, x: &Tensor) -> Result<Vec<Tensor>> {
        let parts = self.projections.iter().map(|p| Ok(p.forward(x)?)).collect::<Result<Vec<_>>>()?;
        Ok(vec![Tensor::cat(&parts, 1)?])
    }

    pub fn output(&self, attended: &Tensor) -> Result<Tensor> {
        Ok(self.out.forward(attended)?)
    }

    /// Runs projected rows of one sequence through its state: `[tokens, v_heads · v_dim]`,
    /// normed and gated, before out_proj.
    pub fn attend(&self, rows: &[Tensor], state: &mut DeltaState) -> Result<Tensor> {
        let [raw] = rows else { unreachable!("rows come from GatedDeltaNet::project") };
        let t = raw.dim(0)?;
        let width = raw.dim(1)?;
        let raw: Vec<f32> = raw.flatten_all()?.to_vec1()?;
        let d = &self.spec;
        let (dk, dv, c) = (d.k_head_dim, d.v_head_dim, d.conv_channels());
        let (kd, vd) = (d.k_heads * dk, d.v_heads * dv);
        let row = |i: usize| &raw[i * width..(i + 1) * width];
        let gathered: Vec<f32> = (0..t).flat_map(|i| self.conv_in.iter().map(move |&j| row(i)[j])).collect();
        let mixed = convolve(&self.conv, d.conv_kernel, &gathered, t, &mut state.conv);
        let scale = (dk as f32).powf(-0.5);
        let mut x = Heads::zeros(d.v_heads, t, dk, dv);
        for i in 0..t {
            let m = &mixed[i * c..(i + 1) * c];
            for h in 0..d.v_heads {
                let (kat, vat) = x.at(h, i);
                let kh = d.key_head(h) * dk;
                l2_normalize(&m[kh..kh + dk], scale, &mut x.q[kat..kat + dk]);
                l2_normalize(&m[kd + kh..kd + kh + dk], 1.0, &mut x.k[kat..kat + dk]);
                x.v[vat..vat + dv].copy_from_slice(&m[2 * kd + h * dv..2 * kd + (h + 1) * dv]);
                // transformers: g = −exp(A_log) · softplus(a + dt_bias), one per value head.
                let g = -self.decay_rate[h] * softplus(row(i)[self.a[h]] + self.dt_bias[h]);
                x.g[kat..kat + dk].fill(g);
                x.beta[h * t + i] = sigmoid(row(i)[self.b[h]]);
            }
        }
        let out = x.run(&mut state.recurrent);
        // transformers' Qwen3NextRMSNormGated: SiLU on z.
        let silu = |i: usize, c: usize| {
            let z = row(i)[self.z[c]];
            z * sigmoid(z)
        };
        let y = gated_norm(&out, (d.v_heads, t, dv), &self.norm, self.eps, silu);
        Ok(Tensor::from_vec(y, (t, vd), &Device::Cpu)?)
    }
}
