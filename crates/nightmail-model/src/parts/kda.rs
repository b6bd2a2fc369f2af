//! Kimi Delta Attention (KDA; Kimi Linear, arXiv 2510.26692 §3), the linear-attention layer of
//! Kimi Linear. Each head keeps a `head_dim × head_dim` state S instead of a growing cache; per
//! token, with q and k L2-normalized (q also scaled by head_dim^-½) and a per-channel decay
//! g ≤ 0 (fla `naive_recurrent_kda`, transformers `recurrent_kimi_delta_attention`):
//!
//! ```text
//! S ← diag(exp(g)) · S
//! S ← S + (β·k) ⊗ (v − kᵀS)
//! o = qᵀS
//! ```
//!
//! q, k and v first pass a causal depthwise convolution (kernel 4) and SiLU, whose last
//! `kernel − 1` inputs are the rest of the state. The recurrence, its chunked prefill form and
//! the convolution are `delta_rule.rs`', shared with Qwen3-Next's Gated DeltaNet.
//!
//! The output is RMS-normed per head and gated. transformers' `KimiLinearRMSNormGated` sets
//! `activation = "sigmoid"`, as fla's `FusedRMSNormGated` and llama.cpp's `kimi-linear` graph
//! do: all three agree, and the engine follows them (σ, not SiLU, on `g_b(g_a(x))`).

use candle_core::{Device, Tensor};

use crate::error::Result;
use crate::parts::delta_rule::{
    DeltaState, Heads, StateShape, convolve, decay_rates, gated_norm, l2_normalize, sigmoid, softplus,
};
use crate::source::WeightSource;
use crate::spec::{KdaSpec, ModelSpec};
use nightmail_formats::Format;
use nightmail_tensor::Linear;

/// q, k and v's projections: three matrices (Kimi Linear's checkpoints), or one `[3 · width,
/// hidden]` where a checkpoint stores them fused (llama.cpp kimi-k3.cpp `build_kda_layer`).
enum QkvProjection {
    Split { q: Linear, k: Linear, v: Linear },
    Fused(Linear),
}

/// The output gate's logits per channel: Kimi Linear's low-rank `g_b(g_a(x))`, or Kimi K3's
/// full-rank `g_proj(x)` (kimi-k3.cpp `build_kda_layer`, `ssm_g`; tests/fixtures/kimi_k3.py
/// `attach_kda_extras`).
enum OutputGate {
    LowRank { a: Linear, b: Linear },
    FullRank(Linear),
}

pub struct Kda {
    qkv: QkvProjection,
    /// Depthwise taps `[3 · width][kernel]`, q's channels then k's then v's, oldest input first
    /// (PyTorch's `Conv1d` weight `[channels, 1, kernel]`).
    conv: Vec<f32>,
    /// The decay gate: `f_b(f_a(x)) + dt_bias` per channel, through softplus, times
    /// `-exp(A_log)` per head (transformers' `KimiLinearForgetGate`).
    f_a: Linear,
    f_b: Linear,
    dt_bias: Vec<f32>,
    /// exp(A_log) per head.
    decay_rate: Vec<f32>,
    /// K3's lower bound, which swaps softplus for a bounded sigmoid ([`decay`]).
    lower_bound: Option<f32>,
    /// β = σ(b_proj x), one per head.
    beta: Linear,
    gate: OutputGate,
    /// The per-head output RMSNorm's weight `[head_dim]` and eps.
    norm: Vec<f32>,
    eps: f32,
    o: Linear,
    heads: usize,
    head_dim: usize,
    kernel: usize,
}

impl Kda {
    /// Layer `l`'s KDA weights, under llama.cpp's `kimi-linear` names (a Hugging Face directory
    /// translates them), from the mapped file or a streamed layer's buffers (`format` is the
    /// file's: the two store A differently).
    pub fn load(ck: &dyn WeightSource, format: Format, spec: &ModelSpec, kda: &KdaSpec, l: usize) -> Result<Self> {
        let (hidden, h, d, kernel) = (spec.hidden_size, kda.heads, kda.head_dim, kda.conv_kernel);
        let w = h * d;
        let t = |name: &str| ck.require(&format!("blk.{l}.{name}"));
        let linear = |name: &str, rows: usize, cols: usize| -> Result<Linear> {
            let m = t(&format!("{name}.weight"))?;
            m.expect_shape(&[rows, cols])?;
            ck.linear(&m, None)
        };
        let vector = |name: &str, n: usize| ck.vector(&format!("blk.{l}.{name}"), n);
        // One `[3 · width, 1, kernel]` convolution where the checkpoint fuses it (K3's
        // `qkv_conv1d`), q's channels then k's then v's as the split ones concatenate.
        let conv = if ck.tensor(&format!("blk.{l}.ssm_conv1d.weight"))?.is_some() {
            vector("ssm_conv1d.weight", 3 * w * kernel)?
        } else {
            // Grown from what the file holds, not reserved from the metadata's sizes: a corrupt
            // head count (2^26) would otherwise reserve 48 GB here.
            let mut conv = Vec::new();
            for part in ["q", "k", "v"] {
                conv.extend(vector(&format!("ssm_conv1d_{part}.weight"), w * kernel)?);
            }
            conv
        };
        let qkv = if ck.tensor(&format!("blk.{l}.attn_qkv.weight"))?.is_some() {
            QkvProjection::Fused(linear("attn_qkv", 3 * w, hidden)?)
        } else {
            QkvProjection::Split {
                q: linear("attn_q", w, hidden)?,
                k: linear("attn_k", w, hidden)?,
                v: linear("attn_v", w, hidden)?,
            }
        };
        let gate = if kda.full_rank_output_gate {
            OutputGate::FullRank(linear("ssm_g", w, hidden)?)
        } else {
            OutputGate::LowRank { a: linear("ssm_g_a", d, hidden)?, b: linear("ssm_g_b", w, d)? }
        };
        let decay_rate = decay_rates(&per_head_a(ck, l, h)?, format);
        Ok(Kda {
            qkv,
            conv,
            f_a: linear("ssm_f_a", d, hidden)?,
            f_b: linear("ssm_f_b", w, d)?,
            dt_bias: vector("ssm_dt.bias", w)?,
            decay_rate,
            lower_bound: kda.gate_lower_bound,
            beta: linear("ssm_beta", h, hidden)?,
            gate,
            norm: vector("ssm_norm.weight", d)?,
            eps: spec.rms_norm_eps as f32,
            o: linear("attn_output", hidden, w)?,
            heads: h,
            head_dim: d,
            kernel,
        })
    }

    /// What a sequence's state for this layer holds: a `head_dim × head_dim` S per head and
    /// the last inputs of q, k and v's convolution.
    pub fn state_shape(&self) -> StateShape {
        let (h, d) = (self.heads, self.head_dim);
        StateShape { channels: 3 * h * d, heads: h, k_dim: d, v_dim: d, kernel: self.kernel }
    }

    /// The per-token projections of `x` (`[tokens, hidden]`): q|k|v before the convolution
    /// `[tokens, 3 · width]`, the decay gate's `f_b(f_a(x))` `[tokens, width]`, β's logits
    /// `[tokens, heads]` and the output gate `[tokens, width]`.
    pub fn project(&self, x: &Tensor) -> Result<Vec<Tensor>> {
        let qkv = match &self.qkv {
            QkvProjection::Split { q, k, v } => Tensor::cat(&[q.forward(x)?, k.forward(x)?, v.forward(x)?], 1)?,
            QkvProjection::Fused(qkv) => qkv.forward(x)?,
        };
        let forget = self.f_b.forward(&self.f_a.forward(x)?)?;
        let gate = match &self.gate {
            OutputGate::LowRank { a, b } => b.forward(&a.forward(x)?)?,
            OutputGate::FullRank(g) => g.forward(x)?,
        };
        Ok(vec![qkv, forget, self.beta.forward(x)?, gate])
    }

    pub fn output(&self, attended: &Tensor) -> Result<Tensor> {
        Ok(self.o.forward(attended)?)
    }

    /// Runs projected rows of one sequence through its state: `[tokens, width]`, normed and
    /// gated, before the output projection.
    pub fn attend(&self, rows: &[Tensor], state: &mut DeltaState) -> Result<Tensor> {
        let [qkv, forget, beta, gate] = rows else {
            unreachable!("rows come from Kda::project");
        };
        let flat = |t: &Tensor| -> Result<Vec<f32>> { Ok(t.flatten_all()?.to_vec1::<f32>()?) };
        let t = qkv.dim(0)?;
        let mixed = convolve(&self.conv, self.kernel, &flat(qkv)?, t, &mut state.conv);
        let (forget, beta, gate) = (flat(forget)?, flat(beta)?, flat(gate)?);
        let (h, d) = (self.heads, self.head_dim);
        let w = h * d;
        let scale = (d as f32).powf(-0.5);
        let mut x = Heads::zeros(h, t, d, d);
        for i in 0..t {
            let row = &mixed[i * 3 * w..(i + 1) * 3 * w];
            for head in 0..h {
                let (at, _) = x.at(head, i);
                let ch = head * d;
                l2_normalize(&row[ch..ch + d], scale, &mut x.q[at..at + d]);
                l2_normalize(&row[w + ch..w + ch + d], 1.0, &mut x.k[at..at + d]);
                x.v[at..at + d].copy_from_slice(&row[2 * w + ch..2 * w + ch + d]);
                for j in 0..d {
                    let f = forget[i * w + ch + j] + self.dt_bias[ch + j];
                    x.g[at + j] = decay(f, self.decay_rate[head], self.lower_bound);
                }
                x.beta[head * t + i] = sigmoid(beta[i * h + head]);
            }
        }
        let out = x.run(&mut state.recurrent);
        // transformers' KimiLinearRMSNormGated: σ on the gate.
        let y = gated_norm(&out, (h, t, d), &self.norm, self.eps, |i, c| sigmoid(gate[i * w + c]));
        Ok(Tensor::from_vec(y, (t, w), &Device::Cpu)?)
    }
}

/// A layer's `ssm_a`, one value per head. K3's checkpoints store A_log zero-padded past the
/// heads (128 values for 96); llama.cpp's converter keeps the first `heads` (`kimi_k3.py`), and
/// so does this once the rest are seen to be padding. Any other count is refused.
fn per_head_a(ck: &dyn WeightSource, l: usize, heads: usize) -> Result<Vec<f32>> {
    let name = format!("blk.{l}.ssm_a");
    let stored = ck.require(&name)?.elem_count();
    if stored <= heads {
        return ck.vector(&name, heads);
    }
    let all = ck.vector(&name, stored)?;
    if all[heads..].iter().any(|a| *a != 0.0) {
        return ck.vector(&name, heads);
    }
    Ok(all[..heads].to_vec())
}

/// The per-channel log decay from `x = f_b(f_a(x)) + dt_bias` and `rate = exp(A_log)`:
/// transformers' `KimiLinearForgetGate` (`−rate·softplus(x)`), or with K3's lower bound fla's
/// `naive_kda_lowerbound_gate` (`lb·σ(rate·x)`, in (lb, 0) whatever x is).
fn decay(x: f32, rate: f32, lower_bound: Option<f32>) -> f32 {
    match lower_bound {
        None => -rate * softplus(x),
        Some(lb) => lb * sigmoid(rate * x),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// By hand (as test_kimi_k3.py): rate exp(A_log) = 2 and x = ln(3)/2 give σ(ln 3) = 3/4, so
    /// −5·3/4 = −3.75; x = 0 gives σ(0) = 1/2, −2.5, whatever the rate. Without the bound,
    /// −2·softplus(0) = −2·ln 2.
    #[test]
    fn lower_bounded_decay_by_hand() {
        let close = |a: f32, b: f32| assert!((a - b).abs() < 1e-6, "{a} vs {b}");
        close(decay(3f32.ln() / 2.0, 2.0, Some(-5.0)), -3.75);
        close(decay(0.0, 148.4, Some(-5.0)), -2.5);
        close(decay(0.0, 2.0, None), -2.0 * std::f32::consts::LN_2);
    }

    /// K3's fixture with each A_log padded past its 4 heads by `pad`, its decay rates per layer.
    fn decay_rates_padded_with(pad: f32) -> crate::error::Result<Vec<Vec<f32>>> {
        use crate::spec::test_files::fixture;
        use nightmail_formats::ModelFile;
        let src = fixture("kimi_k3");
        let dir = tempfile::tempdir().unwrap();
        std::fs::copy(src.join("config.json"), dir.path().join("config.json")).unwrap();
        let mut tensors = candle_core::safetensors::load(src.join("model.safetensors"), &Device::Cpu).unwrap();
        for (_, t) in tensors.iter_mut().filter(|(n, _)| n.ends_with(".A_log")) {
            let tail = Tensor::full(pad, 4, &Device::Cpu).unwrap().to_dtype(t.dtype()).unwrap();
            *t = Tensor::cat(&[&t.flatten_all().unwrap(), &tail], 0).unwrap();
        }
        candle_core::safetensors::save(&tensors, dir.path().join("model.safetensors")).unwrap();
        let ck = ModelFile::open(dir.path())?;
        let spec = ModelSpec::read(&ck)?;
        let kda = spec.kda.clone().expect("K3 has KDA layers");
        kda.layers.iter().map(|&l| Ok(Kda::load(&ck, Format::Safetensors, &spec, &kda, l)?.decay_rate)).collect()
    }

    #[test]
    fn a_log_zero_padded_past_the_heads_reads_as_the_heads_alone() {
        use nightmail_formats::ModelFile;
        let ck = ModelFile::open(&crate::spec::test_files::fixture("kimi_k3")).unwrap();
        let spec = ModelSpec::read(&ck).unwrap();
        let kda = spec.kda.clone().unwrap();
        let plain: Vec<Vec<f32>> = kda
            .layers
            .iter()
            .map(|&l| Kda::load(&ck, Format::Safetensors, &spec, &kda, l).unwrap().decay_rate)
            .collect();
        assert_eq!(decay_rates_padded_with(0.0).unwrap(), plain);
        let e = decay_rates_padded_with(1.0).unwrap_err().to_string();
        assert!(e.contains("A_log"), "{e}");
    }
}
