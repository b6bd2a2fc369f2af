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
//! `kernel − 1` inputs are the rest of the state. A prompt runs in the chunked form (chunks of
//! 64, transformers' `chunk_kimi_delta_attention`, the WY form of fla's `chunk_kda`), a decode
//! step in the recurrent form; the unit tests check they agree.
//!
//! The output is RMS-normed per head and gated. transformers' `KimiLinearRMSNormGated` sets
//! `activation = "sigmoid"`, as fla's `FusedRMSNormGated` and llama.cpp's `kimi-linear` graph
//! do: all three agree, and the engine follows them (σ, not SiLU, on `g_b(g_a(x))`).

use candle_core::{Device, Tensor};
use rayon::prelude::*;

use super::layers::Linear;
use super::source::WeightSource;
use crate::error::{EngineError, Result};
use crate::format::Format;
use crate::spec::{KdaSpec, ModelSpec};

/// transformers' and fla's chunk length.
const CHUNK: usize = 64;
/// transformers' `l2norm`: x / sqrt(Σx² + 1e-6) (fla's kernel adds eps under the root).
const L2_EPS: f32 = 1e-6;
/// transformers' forget-gate softplus returns x itself above this.
const SOFTPLUS_LINEAR_ABOVE: f32 = 20.0;

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

/// One sequence's KDA state for one layer: the convolution's last inputs and the delta-rule
/// state, both f32.
#[derive(Clone)]
pub struct KdaState {
    /// `[kernel − 1][3 · width]`, oldest first (zeros before the first token).
    conv: Vec<f32>,
    /// Per head, S as `[head_dim (k)][head_dim (v)]`.
    recurrent: Vec<f32>,
    heads: usize,
    head_dim: usize,
    kernel: usize,
}

impl KdaState {
    /// Zeros: no input yet.
    pub(crate) fn new(heads: usize, head_dim: usize, kernel: usize) -> Self {
        let w = heads * head_dim;
        KdaState {
            conv: vec![0.0; (kernel - 1) * 3 * w],
            recurrent: vec![0.0; heads * head_dim * head_dim],
            heads,
            head_dim,
            kernel,
        }
    }

    fn channels(&self) -> usize {
        3 * self.heads * self.head_dim
    }

    /// The state as a checkpoint holds it: the convolution tail `[1, 1, kernel − 1, 3 · width]`
    /// and S `[1, heads, head_dim, head_dim]`.
    pub(crate) fn snapshot(&self) -> Result<(Tensor, Tensor)> {
        let (c, d) = (self.channels(), self.head_dim);
        Ok((
            Tensor::from_vec(self.conv.clone(), (1, 1, self.kernel - 1, c), &Device::Cpu)?,
            Tensor::from_vec(self.recurrent.clone(), (1, self.heads, d, d), &Device::Cpu)?,
        ))
    }

    /// Replaces the state with a snapshot of the same shape.
    pub(crate) fn restore(&mut self, conv: &Tensor, recurrent: &Tensor) -> Result<()> {
        let (c, d) = (self.channels(), self.head_dim);
        if conv.dims() != [1, 1, self.kernel - 1, c] || recurrent.dims() != [1, self.heads, d, d] {
            return Err(EngineError::Compute(candle_core::Error::Msg(format!(
                "a KDA state of shapes {:?} and {:?} does not fit this layer",
                conv.dims(),
                recurrent.dims()
            ))));
        }
        self.conv = conv.flatten_all()?.to_vec1()?;
        self.recurrent = recurrent.flatten_all()?.to_vec1()?;
        Ok(())
    }
}

/// One head's inputs over a run of tokens, each `[tokens][head_dim]` (β: `[tokens]`).
struct HeadRows<'a> {
    q: &'a [f32],
    k: &'a [f32],
    v: &'a [f32],
    g: &'a [f32],
    beta: &'a [f32],
}

impl Kda {
    /// Layer `l`'s KDA weights, under llama.cpp's `kimi-linear` names (a Hugging Face directory
    /// translates them), from the mapped file or a streamed layer's buffers (`format` is the
    /// file's: the two store A differently).
    pub(crate) fn load(
        ck: &dyn WeightSource,
        format: Format,
        spec: &ModelSpec,
        kda: &KdaSpec,
        l: usize,
    ) -> Result<Self> {
        let (hidden, h, d, kernel) = (spec.hidden_size, kda.heads, kda.head_dim, kda.conv_kernel);
        let w = h * d;
        let t = |name: &str| ck.require(&format!("blk.{l}.{name}"));
        let linear = |name: &str, rows: usize, cols: usize| -> Result<Linear> {
            let m = t(&format!("{name}.weight"))?;
            m.expect_shape(&[rows, cols])?;
            ck.linear(&m, None)
        };
        // A vector stored in any shape of `n` elements ([1, 1, heads, 1] for A_log, [w, 1, k] for
        // a convolution).
        let vector = |name: &str, n: usize| -> Result<Vec<f32>> {
            let v = t(name)?;
            if v.elem_count() != n {
                return Err(EngineError::Shape { name: v.name.clone(), found: v.shape.clone(), expected: vec![n] });
            }
            Ok(v.to_f32()?.flatten_all()?.to_vec1()?)
        };
        // One `[3 · width, 1, kernel]` convolution where the checkpoint fuses it (K3's
        // `qkv_conv1d`), q's channels then k's then v's as the split ones concatenate.
        let conv = if ck.tensor(&format!("blk.{l}.ssm_conv1d.weight"))?.is_some() {
            vector("ssm_conv1d.weight", 3 * w * kernel)?
        } else {
            // Grown from what the file holds, not reserved from the metadata's sizes: the gguf
            // fuzz target's third finding was a head count of 2^26 reserving 48 GB here.
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
        // llama.cpp's converter stores A = -exp(A_log); transformers keeps A_log.
        let a = vector("ssm_a", h)?;
        let decay_rate = match format {
            Format::Gguf => a.iter().map(|a| -a).collect(),
            Format::Safetensors => a.iter().map(|a| a.exp()).collect(),
        };
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

    /// (heads, head_dim, convolution kernel): what a sequence's state for this layer needs.
    pub(crate) fn dims(&self) -> (usize, usize, usize) {
        (self.heads, self.head_dim, self.kernel)
    }

    /// The per-token projections of `x` (`[tokens, hidden]`): q|k|v before the convolution
    /// `[tokens, 3 · width]`, the decay gate's `f_b(f_a(x))` `[tokens, width]`, β's logits
    /// `[tokens, heads]` and the output gate `[tokens, width]`.
    pub(crate) fn project(&self, x: &Tensor) -> Result<Vec<Tensor>> {
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

    pub(crate) fn output(&self, attended: &Tensor) -> Result<Tensor> {
        self.o.forward(attended)
    }

    /// Runs projected rows of one sequence through its state: `[tokens, width]`, normed and
    /// gated, before the output projection.
    pub(crate) fn attend(&self, rows: &[Tensor], state: &mut KdaState) -> Result<Tensor> {
        let [qkv, forget, beta, gate] = rows else {
            unreachable!("rows come from Kda::project");
        };
        let flat = |t: &Tensor| -> Result<Vec<f32>> { Ok(t.flatten_all()?.to_vec1::<f32>()?) };
        let t = qkv.dim(0)?;
        let mixed = self.convolve(&flat(qkv)?, t, &mut state.conv);
        let (forget, beta, gate) = (flat(forget)?, flat(beta)?, flat(gate)?);
        let (h, d) = (self.heads, self.head_dim);
        let w = h * d;
        let scale = (d as f32).powf(-0.5);
        // Per head, `[tokens][head_dim]` runs.
        let n = h * t * d;
        let (mut q, mut k, mut v, mut g) = (vec![0f32; n], vec![0f32; n], vec![0f32; n], vec![0f32; n]);
        let mut b = vec![0f32; h * t];
        for i in 0..t {
            let row = &mixed[i * 3 * w..(i + 1) * 3 * w];
            for head in 0..h {
                let at = (head * t + i) * d;
                let ch = head * d;
                l2_normalize(&row[ch..ch + d], scale, &mut q[at..at + d]);
                l2_normalize(&row[w + ch..w + ch + d], 1.0, &mut k[at..at + d]);
                v[at..at + d].copy_from_slice(&row[2 * w + ch..2 * w + ch + d]);
                for j in 0..d {
                    let x = forget[i * w + ch + j] + self.dt_bias[ch + j];
                    g[at + j] = decay(x, self.decay_rate[head], self.lower_bound);
                }
                b[head * t + i] = sigmoid(beta[i * h + head]);
            }
        }
        let mut out = vec![0f32; h * t * d];
        let run = |(head, (s, o)): (usize, (&mut [f32], &mut [f32]))| {
            let r = head * t * d..(head + 1) * t * d;
            let rows =
                HeadRows { q: &q[r.clone()], k: &k[r.clone()], v: &v[r.clone()], g: &g[r], beta: &b[head * t..] };
            if t == 1 { recurrent(&rows, 1, d, s, o) } else { chunked(&rows, t, d, s, o) }
        };
        state.recurrent.par_chunks_mut(d * d).zip(out.par_chunks_mut(t * d)).enumerate().for_each(run);
        // transformers' KimiLinearRMSNormGated: x · rsqrt(mean(x²) + eps) · w · σ(gate).
        let mut y = vec![0f32; t * w];
        for i in 0..t {
            for head in 0..h {
                let o = &out[(head * t + i) * d..(head * t + i + 1) * d];
                let r = 1.0 / (o.iter().map(|x| x * x).sum::<f32>() / d as f32 + self.eps).sqrt();
                let at = i * w + head * d;
                let (ys, gs) = (&mut y[at..at + d], &gate[at..at + d]);
                for (((y, x), n), g) in ys.iter_mut().zip(o).zip(&self.norm).zip(gs) {
                    *y = n * (x * r) * sigmoid(*g);
                }
            }
        }
        Ok(Tensor::from_vec(y, (t, w), &Device::Cpu)?)
    }

    /// The causal depthwise convolution of `x` (`[tokens][3 · width]`) after the inputs in
    /// `tail`, then SiLU (transformers' `causal_conv1d_fn` / `causal_conv1d_update`); `tail`
    /// becomes the last `kernel − 1` inputs.
    fn convolve(&self, x: &[f32], t: usize, tail: &mut [f32]) -> Vec<f32> {
        let (c, k) = (3 * self.heads * self.head_dim, self.kernel);
        let before = k - 1;
        // Position p of the tail-then-tokens timeline.
        let input = |p: usize, ch: usize| if p < before { tail[p * c + ch] } else { x[(p - before) * c + ch] };
        let mut out = vec![0f32; t * c];
        for i in 0..t {
            for ch in 0..c {
                let taps = &self.conv[ch * k..(ch + 1) * k];
                let s: f32 = taps.iter().enumerate().map(|(j, w)| w * input(i + j, ch)).sum();
                out[i * c + ch] = s * sigmoid(s);
            }
        }
        let kept: Vec<f32> =
            (t..t + before).flat_map(|p| (0..c).map(move |ch| (p, ch))).map(|(p, ch)| input(p, ch)).collect();
        tail.copy_from_slice(&kept);
        out
    }
}

/// The per-channel log decay from `x = f_b(f_a(x)) + dt_bias` and `rate = exp(A_log)`:
/// transformers' `KimiLinearForgetGate` (`−rate·softplus(x)`), or with K3's lower bound fla's
/// `naive_kda_lowerbound_gate` (`lb·σ(rate·x)`, in (lb, 0) whatever x is).
fn decay(x: f32, rate: f32, lower_bound: Option<f32>) -> f32 {
    match lower_bound {
        None => {
            let softplus = if x > SOFTPLUS_LINEAR_ABOVE { x } else { (1.0 + x.exp()).ln() };
            -rate * softplus
        }
        Some(lb) => lb * sigmoid(rate * x),
    }
}

fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

/// `out = scale · x / sqrt(Σx² + eps)`.
fn l2_normalize(x: &[f32], scale: f32, out: &mut [f32]) {
    let inv = 1.0 / (x.iter().map(|v| v * v).sum::<f32>() + L2_EPS).sqrt();
    for (o, v) in out.iter_mut().zip(x) {
        *o = v * inv * scale;
    }
}

/// The delta rule token by token (transformers' `recurrent_kimi_delta_attention`): `s` is one
/// head's S `[d][d]`, `out` its `[tokens][d]`.
fn recurrent(r: &HeadRows<'_>, t: usize, d: usize, s: &mut [f32], out: &mut [f32]) {
    let mut delta = vec![0f32; d];
    for i in 0..t {
        let row = i * d..(i + 1) * d;
        let (q, k, v, g) = (&r.q[row.clone()], &r.k[row.clone()], &r.v[row.clone()], &r.g[row]);
        for (a, ga) in g.iter().enumerate() {
            let e = ga.exp();
            s[a * d..(a + 1) * d].iter_mut().for_each(|x| *x *= e);
        }
        // delta = β · (v − kᵀS)
        for (j, dj) in delta.iter_mut().enumerate() {
            let mem: f32 = (0..d).map(|a| s[a * d + j] * k[a]).sum();
            *dj = (v[j] - mem) * r.beta[i];
        }
        for a in 0..d {
            for j in 0..d {
                s[a * d + j] += k[a] * delta[j];
            }
        }
        for j in 0..d {
            out[i * d + j] = (0..d).map(|a| s[a * d + j] * q[a]).sum();
        }
    }
}

/// The same recurrence in chunks of [`CHUNK`] tokens (transformers' `chunk_kimi_delta_attention`):
/// within a chunk, the delta rule's triangular system is solved once (the WY representation,
/// forward substitution) and the state is read and updated once per chunk. A last, shorter chunk
/// equals the reference's zero padding: padded tokens have k = v = β = 0 and g = 0.
fn chunked(r: &HeadRows<'_>, t: usize, d: usize, s: &mut [f32], out: &mut [f32]) {
    let mut start = 0;
    while start < t {
        let n = CHUNK.min(t - start);
        let at = |i: usize| (start + i) * d..(start + i + 1) * d;
        let q = |i: usize| &r.q[at(i)];
        let k = |i: usize| &r.k[at(i)];
        let v = |i: usize| &r.v[at(i)];
        let beta = |i: usize| r.beta[start + i];
        // G: the decay summed within the chunk, `[n][d]`.
        let mut cum = vec![0f32; n * d];
        for i in 0..n {
            for a in 0..d {
                let prev = if i == 0 { 0.0 } else { cum[(i - 1) * d + a] };
                cum[i * d + a] = prev + r.g[(start + i) * d + a];
            }
        }
        let gc = |i: usize| &cum[i * d..(i + 1) * d];
        // A[i][j] = −Σ_a β_i k_i[a] k_j[a] exp(G_i[a] − G_j[a]) below the diagonal.
        let mut m = vec![0f32; n * n];
        for i in 0..n {
            for j in 0..i {
                let (ki, kj, gi, gj) = (k(i), k(j), gc(i), gc(j));
                let dot: f32 = (0..d).map(|a| ki[a] * beta(i) * kj[a] * (gi[a] - gj[a]).exp()).sum();
                m[i * n + j] = -dot;
            }
        }
        // Forward substitution, row by row over the rows already solved; then T = A + I.
        for i in 1..n {
            let row: Vec<f32> = m[i * n..i * n + i].to_vec();
            for j in 0..i {
                let sum: f32 = (0..i).map(|x| row[x] * m[x * n + j]).sum();
                m[i * n + j] = row[j] + sum;
            }
        }
        for i in 0..n {
            m[i * n + i] = 1.0;
        }
        // U = T · (β v), W = T · (β k ⊙ exp(G)).
        let mut u = vec![0f32; n * d];
        let mut wk = vec![0f32; n * d];
        for i in 0..n {
            for x in 0..=i {
                let tix = m[i * n + x];
                let (vx, kx, gx) = (v(x), k(x), gc(x));
                for a in 0..d {
                    u[i * d + a] += tix * vx[a] * beta(x);
                    wk[i * d + a] += tix * (kx[a] * beta(x) * gx[a].exp());
                }
            }
        }
        // v_new = U − W · S.
        let mut v_new = u;
        for i in 0..n {
            for a in 0..d {
                let wa = wk[i * d + a];
                for j in 0..d {
                    v_new[i * d + j] -= wa * s[a * d + j];
                }
            }
        }
        for i in 0..n {
            let (qi, gi) = (q(i), gc(i));
            let o = &mut out[(start + i) * d..(start + i + 1) * d];
            // (q ⊙ exp(G)) · S
            for a in 0..d {
                let qa = qi[a] * gi[a].exp();
                for j in 0..d {
                    o[j] += qa * s[a * d + j];
                }
            }
            // + Σ_{j ≤ i} (Σ_a q_i[a] k_j[a] exp(G_i[a] − G_j[a])) v_new[j]
            for x in 0..=i {
                let (kx, gx) = (k(x), gc(x));
                let score: f32 = (0..d).map(|a| qi[a] * kx[a] * (gi[a] - gx[a]).exp()).sum();
                for j in 0..d {
                    o[j] += score * v_new[x * d + j];
                }
            }
        }
        // S = diag(exp(G_last)) · S + Σ_i (k_i ⊙ exp(G_last − G_i)) ⊗ v_new_i.
        let last = gc(n - 1).to_vec();
        for a in 0..d {
            let e = last[a].exp();
            s[a * d..(a + 1) * d].iter_mut().for_each(|x| *x *= e);
        }
        for i in 0..n {
            let (ki, gi) = (k(i), gc(i));
            for a in 0..d {
                let ka = ki[a] * (last[a] - gi[a]).exp();
                for j in 0..d {
                    s[a * d + j] += ka * v_new[i * d + j];
                }
            }
        }
        start += n;
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

    /// A fixed xorshift stream in [-0.5, 0.5).
    fn random(n: usize, seed: u64) -> Vec<f32> {
        let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        (0..n)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                (x >> 40) as f32 / (1u64 << 24) as f32 - 0.5
            })
            .collect()
    }

    fn normalized(x: Vec<f32>, d: usize, scale: f32) -> Vec<f32> {
        let mut out = vec![0f32; x.len()];
        for (x, o) in x.chunks(d).zip(out.chunks_mut(d)) {
            l2_normalize(x, scale, o);
        }
        out
    }

    #[test]
    fn the_chunked_form_equals_the_recurrent_one_over_more_than_two_chunks() {
        // 150 tokens: two whole chunks and a short third, after a non-zero starting state.
        let (t, d) = (150, 16);
        let q = normalized(random(t * d, 1), d, (d as f32).powf(-0.5));
        let k = normalized(random(t * d, 2), d, 1.0);
        let v: Vec<f32> = random(t * d, 3).iter().map(|x| 2.0 * x).collect();
        // Decays between exp(-0.5) and 1 per token, as a trained forget gate gives.
        let g: Vec<f32> = random(t * d, 4).iter().map(|x| -(x + 0.5) * 0.5).collect();
        let beta: Vec<f32> = random(t, 5).iter().map(|x| sigmoid(4.0 * x)).collect();
        let rows = HeadRows { q: &q, k: &k, v: &v, g: &g, beta: &beta };
        let start: Vec<f32> = random(d * d, 6);
        let (mut s1, mut s2) = (start.clone(), start);
        let (mut o1, mut o2) = (vec![0f32; t * d], vec![0f32; t * d]);
        recurrent(&rows, t, d, &mut s1, &mut o1);
        chunked(&rows, t, d, &mut s2, &mut o2);
        let worst = |a: &[f32], b: &[f32]| a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0f32, f32::max);
        eprintln!("chunked vs recurrent over {t} tokens: outputs {:e}, states {:e}", worst(&o1, &o2), worst(&s1, &s2));
        assert!(worst(&o1, &o2) < 1e-5, "outputs differ by {:e}", worst(&o1, &o2));
        assert!(worst(&s1, &s2) < 1e-5, "final states differ by {:e}", worst(&s1, &s2));
        assert!(o1.iter().any(|x| x.abs() > 0.1), "the check is not vacuous");
    }

    #[test]
    fn a_chunk_after_a_state_equals_the_whole_run_in_one() {
        // Prefilling in two calls (batched prompts run in chunks) ends where one call does.
        let (t, d) = (90, 8);
        let q = normalized(random(t * d, 11), d, (d as f32).powf(-0.5));
        let k = normalized(random(t * d, 12), d, 1.0);
        let v = random(t * d, 13);
        let g: Vec<f32> = random(t * d, 14).iter().map(|x| -(x + 0.5)).collect();
        let beta: Vec<f32> = random(t, 15).iter().map(|x| sigmoid(*x)).collect();
        let (mut whole, mut split) = (vec![0f32; d * d], vec![0f32; d * d]);
        let mut o = vec![0f32; t * d];
        chunked(&HeadRows { q: &q, k: &k, v: &v, g: &g, beta: &beta }, t, d, &mut whole, &mut o);
        let cut = 37;
        let mut o1 = vec![0f32; cut * d];
        let mut o2 = vec![0f32; (t - cut) * d];
        let (a, b) = (..cut * d, cut * d..);
        chunked(&HeadRows { q: &q[a], k: &k[a], v: &v[a], g: &g[a], beta: &beta[..cut] }, cut, d, &mut split, &mut o1);
        let rest = HeadRows { q: &q[b.clone()], k: &k[b.clone()], v: &v[b.clone()], g: &g[b], beta: &beta[cut..] };
        chunked(&rest, t - cut, d, &mut split, &mut o2);
        o1.extend(o2);
        let worst = o.iter().zip(&o1).map(|(x, y)| (x - y).abs()).fold(0f32, f32::max);
        assert!(worst < 1e-5, "{worst:e}");
    }

    #[test]
    fn a_missing_a_log_is_named_with_the_directory() {
        // The fixture with layer 1's A_log renamed in the safetensors header (same length, so
        // the offsets hold).
        let src = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/kimi_linear");
        let dir = tempfile::tempdir().unwrap();
        std::fs::copy(src.join("config.json"), dir.path().join("config.json")).unwrap();
        let mut bytes = std::fs::read(src.join("model.safetensors")).unwrap();
        let (from, to) = (b"model.layers.1.self_attn.A_log", b"model.layers.1.self_attn.X_log");
        let at = bytes.windows(from.len()).position(|w| w == from).expect("the fixture has it");
        bytes[at..at + to.len()].copy_from_slice(to);
        std::fs::write(dir.path().join("model.safetensors"), bytes).unwrap();
        let err = crate::Model::load(dir.path()).err().expect("A_log is missing").to_string();
        let want = format!(
            "tensor `model.layers.1.self_attn.A_log` (GGUF `blk.1.ssm_a`) is missing from {}",
            dir.path().display()
        );
        assert!(err.starts_with(&want), "{err}");
    }

    /// `tensors` (all F32) as a safetensors file: an 8-byte header length, the JSON header, the data.
    fn write_safetensors(path: &std::path::Path, tensors: &[(String, Vec<usize>, Vec<u8>)]) {
        let mut header = serde_json::Map::new();
        let mut at = 0;
        for (name, shape, bytes) in tensors {
            header.insert(
                name.clone(),
                serde_json::json!({"dtype": "F32", "shape": shape, "data_offsets": [at, at + bytes.len()]}),
            );
            at += bytes.len();
        }
        let header = serde_json::to_vec(&serde_json::Value::Object(header)).unwrap();
        let mut out = (header.len() as u64).to_le_bytes().to_vec();
        out.extend(header);
        tensors.iter().for_each(|(_, _, b)| out.extend(b));
        std::fs::write(path, out).unwrap();
    }

    #[test]
    fn a_checkpoint_with_fused_qkv_projection_and_convolution_runs_as_the_split_one() {
        // The K3 fixture rewritten with each KDA layer's q/k/v projections and convolutions
        // fused as `qkv_proj` `[3·width, hidden]` and `qkv_conv1d` `[3·width, 1, kernel]`.
        let src = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/kimi_k3");
        let hf = crate::format::HfDir::open(&src).unwrap();
        let mut tensors: Vec<(String, Vec<usize>, Vec<u8>)> = Vec::new();
        let mut fused = 0;
        for v in hf.all_tensors().unwrap() {
            let Some((layer, _)) = v.name.split_once(".self_attn.q_") else {
                if [".self_attn.k_proj.", ".self_attn.v_proj.", ".self_attn.k_conv1d.", ".self_attn.v_conv1d."]
                    .iter()
                    .all(|p| !v.name.contains(p))
                {
                    tensors.push((v.name.clone(), v.shape.clone(), v.bytes.to_vec()));
                }
                continue;
            };
            let kind = if v.name.ends_with("q_proj.weight") {
                "proj"
            } else if v.name.ends_with("q_conv1d.weight") {
                "conv1d"
            } else {
                tensors.push((v.name.clone(), v.shape.clone(), v.bytes.to_vec()));
                continue;
            };
            let mut bytes = Vec::new();
            for part in ["q", "k", "v"] {
                bytes.extend(
                    hf.float_tensor(&format!("{layer}.self_attn.{part}_{kind}.weight")).unwrap().unwrap().bytes,
                );
            }
            let mut shape = v.shape.clone();
            shape[0] *= 3;
            tensors.push((format!("{layer}.self_attn.qkv_{kind}.weight"), shape, bytes));
            fused += 1;
        }
        assert_eq!(fused, 8, "four KDA layers, a projection and a convolution each");
        let dir = tempfile::tempdir().unwrap();
        std::fs::copy(src.join("config.json"), dir.path().join("config.json")).unwrap();
        write_safetensors(&dir.path().join("model.safetensors"), &tensors);
        let (split, fused) = (crate::Model::load(&src).unwrap(), crate::Model::load(dir.path()).unwrap());
        let (mut a, mut b) = (split.new_cache(), fused.new_cache());
        for tokens in [&[5u32, 17, 99, 3, 200, 41][..], &[42], &[7]] {
            let (x, y) = (split.logits(tokens, &mut a).unwrap(), fused.logits(tokens, &mut b).unwrap());
            let worst = x.iter().zip(&y).map(|(p, q)| (p - q).abs()).fold(0f32, f32::max);
            // One matmul of three times the rows rounds differently from three, and this fixture
            // amplifies f32 rounding (its chunked and recurrent prefills differ by 5e-5 in the
            // logits): the bound is the reference's.
            assert!(worst < 1e-4, "fused and split KDA differ by {worst:e}");
        }
    }
}
