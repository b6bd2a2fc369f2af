//! The gated delta rule (Yang et al., Gated Delta Networks, arXiv 2412.06464; fla
//! `naive_recurrent_gated_delta_rule`), the recurrence both linear-attention layers here run:
//! Kimi's KDA (`kda.rs`, a decay per channel) and Qwen3-Next's Gated DeltaNet
//! (`gated_delta_net.rs`, a decay per head, given here as the same value on every channel).
//! Each head keeps a state S `[k_dim][v_dim]`; per token, with q and k L2-normalized:
//!
//! ```text
//! S ← diag(exp(g)) · S
//! S ← S + (β·k) ⊗ (v − kᵀS)
//! o = qᵀS
//! ```
//!
//! A prompt runs in the chunked form (chunks of 64, transformers' `torch_chunk_gated_delta_rule`
//! and `chunk_kimi_delta_attention`, the WY form of fla's `chunk_*`), a decode step in the
//! recurrent one; the unit tests check they agree. The causal depthwise convolution (with SiLU)
//! in front of q, k and v, whose last `kernel − 1` inputs are the rest of a layer's state, is
//! here too.

use candle_core::{Device, Tensor};
use nightmail_tensor::TensorError;
use rayon::prelude::*;

use crate::error::Result;
use nightmail_formats::Format;

/// transformers' and fla's chunk length.
const CHUNK: usize = 64;
/// transformers' `l2norm`: x / sqrt(Σx² + 1e-6) (fla's kernel adds eps under the root).
const L2_EPS: f32 = 1e-6;
/// transformers' softplus (torch's default threshold) returns x itself above this.
const SOFTPLUS_LINEAR_ABOVE: f32 = 20.0;

/// The sizes of one layer's recurrent state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StateShape {
    /// The convolution's channels (q, k and v together).
    pub channels: usize,
    /// Heads of S (value heads where they outnumber the key heads).
    pub heads: usize,
    pub k_dim: usize,
    pub v_dim: usize,
    /// The convolution's kernel.
    pub kernel: usize,
}

/// One sequence's state for one linear-attention layer: the convolution's last inputs and S,
/// both f32.
#[derive(Clone)]
pub struct DeltaState {
    /// `[kernel − 1][channels]`, oldest first (zeros before the first token).
    pub(crate) conv: Vec<f32>,
    /// Per head, S as `[k_dim][v_dim]`.
    pub(crate) recurrent: Vec<f32>,
    shape: StateShape,
}

impl DeltaState {
    /// Zeros: no input yet.
    pub fn new(shape: StateShape) -> Self {
        DeltaState {
            conv: vec![0.0; (shape.kernel - 1) * shape.channels],
            recurrent: vec![0.0; shape.heads * shape.k_dim * shape.v_dim],
            shape,
        }
    }

    /// The state as a checkpoint holds it: the convolution tail `[1, 1, kernel − 1, channels]`
    /// and S `[1, heads, k_dim, v_dim]`.
    pub fn snapshot(&self) -> Result<(Tensor, Tensor)> {
        let s = self.shape;
        Ok((
            Tensor::from_vec(self.conv.clone(), (1, 1, s.kernel - 1, s.channels), &Device::Cpu)?,
            Tensor::from_vec(self.recurrent.clone(), (1, s.heads, s.k_dim, s.v_dim), &Device::Cpu)?,
        ))
    }

    /// Replaces the state with a snapshot of the same shape.
    pub fn restore(&mut self, conv: &Tensor, recurrent: &Tensor) -> Result<()> {
        let s = self.shape;
        if conv.dims() != [1, 1, s.kernel - 1, s.channels] || recurrent.dims() != [1, s.heads, s.k_dim, s.v_dim] {
            return Err(TensorError::Compute(candle_core::Error::Msg(format!(
                "a linear-attention state of shapes {:?} and {:?} does not fit this layer",
                conv.dims(),
                recurrent.dims()
            )))
            .into());
        }
        self.conv = conv.flatten_all()?.to_vec1()?;
        self.recurrent = recurrent.flatten_all()?.to_vec1()?;
        Ok(())
    }
}

/// The inputs of every head over a run of tokens, head-major: q, k and g `[heads][tokens][k_dim]`,
/// v `[heads][tokens][v_dim]`, β `[heads][tokens]`. q and k are normalized already.
pub struct Heads {
    pub q: Vec<f32>,
    pub k: Vec<f32>,
    pub v: Vec<f32>,
    pub g: Vec<f32>,
    pub beta: Vec<f32>,
    pub tokens: usize,
    pub k_dim: usize,
    pub v_dim: usize,
}

impl Heads {
    pub fn zeros(heads: usize, tokens: usize, k_dim: usize, v_dim: usize) -> Self {
        let (nk, nv) = (heads * tokens * k_dim, heads * tokens * v_dim);
        Heads {
            q: vec![0.0; nk],
            k: vec![0.0; nk],
            v: vec![0.0; nv],
            g: vec![0.0; nk],
            beta: vec![0.0; heads * tokens],
            tokens,
            k_dim,
            v_dim,
        }
    }

    /// Where head `h`'s token `i` starts in q, k, g (first) and v (second).
    pub fn at(&self, h: usize, i: usize) -> (usize, usize) {
        let row = h * self.tokens + i;
        (row * self.k_dim, row * self.v_dim)
    }

    /// Runs every head through its part of `state` (S, `[heads][k_dim][v_dim]`), heads in
    /// parallel: one token in the recurrent form, more in the chunked one. Returns the outputs
    /// `[heads][tokens][v_dim]`.
    pub fn run(&self, state: &mut [f32]) -> Vec<f32> {
        let (t, dk, dv) = (self.tokens, self.k_dim, self.v_dim);
        let mut out = vec![0f32; state.len() / (dk * dv) * t * dv];
        let run = |(head, (s, o)): (usize, (&mut [f32], &mut [f32]))| {
            let (kr, vr) = (head * t * dk..(head + 1) * t * dk, head * t * dv..(head + 1) * t * dv);
            let rows = HeadRows {
                q: &self.q[kr.clone()],
                k: &self.k[kr.clone()],
                v: &self.v[vr],
                g: &self.g[kr],
                beta: &self.beta[head * t..(head + 1) * t],
            };
            if t == 1 { recurrent(&rows, 1, dk, dv, s, o) } else { chunked(&rows, t, dk, dv, s, o) }
        };
        state.par_chunks_mut(dk * dv).zip(out.par_chunks_mut(t * dv)).enumerate().for_each(run);
        out
    }
}

/// One head's inputs over a run of tokens: q, k, g `[tokens][k_dim]`, v `[tokens][v_dim]`, β
/// `[tokens]`.
struct HeadRows<'a> {
    q: &'a [f32],
    k: &'a [f32],
    v: &'a [f32],
    g: &'a [f32],
    beta: &'a [f32],
}

/// The causal depthwise convolution of `x` (`[tokens][channels]`) after the inputs in `tail`,
/// then SiLU (transformers' `causal_conv1d_fn` / `causal_conv1d_update`); `tail` becomes the
/// last `kernel − 1` inputs. `taps` is `[channels][kernel]`, oldest input first (PyTorch's
/// `Conv1d` weight `[channels, 1, kernel]`).
pub fn convolve(taps: &[f32], kernel: usize, x: &[f32], t: usize, tail: &mut [f32]) -> Vec<f32> {
    let c = taps.len() / kernel;
    let before = kernel - 1;
    // Position p of the tail-then-tokens timeline.
    let input = |p: usize, ch: usize| if p < before { tail[p * c + ch] } else { x[(p - before) * c + ch] };
    let mut out = vec![0f32; t * c];
    for i in 0..t {
        for ch in 0..c {
            let taps = &taps[ch * kernel..(ch + 1) * kernel];
            let s: f32 = taps.iter().enumerate().map(|(j, w)| w * input(i + j, ch)).sum();
            out[i * c + ch] = s * sigmoid(s);
        }
    }
    let kept: Vec<f32> =
        (t..t + before).flat_map(|p| (0..c).map(move |ch| (p, ch))).map(|(p, ch)| input(p, ch)).collect();
    tail.copy_from_slice(&kept);
    out
}

/// Each head's output RMS-normed and gated, as transformers' `KimiLinearRMSNormGated` and
/// `Qwen3NextRMSNormGated` do: w · (x · rsqrt(mean(x²) + eps)) · gate. `out` is
/// `[heads][tokens][d]` (from [`Heads::run`]); `gate(i, c)` is token i's gate, its activation
/// applied, for channel c = head · d + j. Returns `[tokens][heads · d]`.
pub fn gated_norm(
    out: &[f32],
    (heads, t, d): (usize, usize, usize),
    weight: &[f32],
    eps: f32,
    gate: impl Fn(usize, usize) -> f32,
) -> Vec<f32> {
    let w = heads * d;
    let mut y = vec![0f32; t * w];
    for i in 0..t {
        for h in 0..heads {
            let o = &out[(h * t + i) * d..(h * t + i + 1) * d];
            let r = 1.0 / (o.iter().map(|x| x * x).sum::<f32>() / d as f32 + eps).sqrt();
            for (j, (x, n)) in o.iter().zip(weight).enumerate() {
                y[i * w + h * d + j] = n * (x * r) * gate(i, h * d + j);
            }
        }
    }
    y
}

/// exp(A_log) per head from a layer's `ssm_a` as its file stores it: llama.cpp's converters
/// write A = −exp(A_log), transformers keeps A_log.
pub fn decay_rates(a: &[f32], format: Format) -> Vec<f32> {
    match format {
        Format::Gguf => a.iter().map(|a| -a).collect(),
        Format::Safetensors => a.iter().map(|a| a.exp()).collect(),
    }
}

pub fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

/// torch's `softplus` (threshold 20).
pub fn softplus(x: f32) -> f32 {
    if x > SOFTPLUS_LINEAR_ABOVE { x } else { (1.0 + x.exp()).ln() }
}

/// `out = scale · x / sqrt(Σx² + eps)`.
pub fn l2_normalize(x: &[f32], scale: f32, out: &mut [f32]) {
    let inv = 1.0 / (x.iter().map(|v| v * v).sum::<f32>() + L2_EPS).sqrt();
    for (o, v) in out.iter_mut().zip(x) {
        *o = v * inv * scale;
    }
}

/// The delta rule token by token (transformers' `torch_recurrent_gated_delta_rule`,
/// `recurrent_kimi_delta_attention`): `s` is one head's S `[dk][dv]`, `out` its `[tokens][dv]`.
fn recurrent(r: &HeadRows<'_>, t: usize, dk: usize, dv: usize, s: &mut [f32], out: &mut [f32]) {
    let mut delta = vec![0f32; dv];
    for i in 0..t {
        let (kr, vr) = (i * dk..(i + 1) * dk, i * dv..(i + 1) * dv);
        let (q, k, v, g) = (&r.q[kr.clone()], &r.k[kr.clone()], &r.v[vr], &r.g[kr]);
        for (a, ga) in g.iter().enumerate() {
            let e = ga.exp();
            s[a * dv..(a + 1) * dv].iter_mut().for_each(|x| *x *= e);
        }
        // delta = β · (v − kᵀS)
        for (j, dj) in delta.iter_mut().enumerate() {
            let mem: f32 = (0..dk).map(|a| s[a * dv + j] * k[a]).sum();
            *dj = (v[j] - mem) * r.beta[i];
        }
        for a in 0..dk {
            for j in 0..dv {
                s[a * dv + j] += k[a] * delta[j];
            }
        }
        for j in 0..dv {
            out[i * dv + j] = (0..dk).map(|a| s[a * dv + j] * q[a]).sum();
        }
    }
}

/// The same recurrence in chunks of [`CHUNK`] tokens (transformers' `torch_chunk_gated_delta_rule`
/// and `chunk_kimi_delta_attention`): within a chunk, the delta rule's triangular system is
/// solved once (the WY representation, forward substitution) and the state is read and updated
/// once per chunk. A last, shorter chunk equals the reference's zero padding: padded tokens have
/// k = v = β = 0 and g = 0.
fn chunked(r: &HeadRows<'_>, t: usize, dk: usize, dv: usize, s: &mut [f32], out: &mut [f32]) {
    let mut start = 0;
    while start < t {
        let n = CHUNK.min(t - start);
        let at = |i: usize| (start + i) * dk..(start + i + 1) * dk;
        let q = |i: usize| &r.q[at(i)];
        let k = |i: usize| &r.k[at(i)];
        let v = |i: usize| &r.v[(start + i) * dv..(start + i + 1) * dv];
        let beta = |i: usize| r.beta[start + i];
        // G: the decay summed within the chunk, `[n][dk]`.
        let mut cum = vec![0f32; n * dk];
        for i in 0..n {
            for a in 0..dk {
                let prev = if i == 0 { 0.0 } else { cum[(i - 1) * dk + a] };
                cum[i * dk + a] = prev + r.g[(start + i) * dk + a];
            }
        }
        let gc = |i: usize| &cum[i * dk..(i + 1) * dk];
        // A[i][j] = −Σ_a β_i k_i[a] k_j[a] exp(G_i[a] − G_j[a]) below the diagonal.
        let mut m = vec![0f32; n * n];
        for i in 0..n {
            for j in 0..i {
                let (ki, kj, gi, gj) = (k(i), k(j), gc(i), gc(j));
                let dot: f32 = (0..dk).map(|a| ki[a] * beta(i) * kj[a] * (gi[a] - gj[a]).exp()).sum();
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
        // U = T · (β v) `[n][dv]`, W = T · (β k ⊙ exp(G)) `[n][dk]`.
        let mut u = vec![0f32; n * dv];
        let mut wk = vec![0f32; n * dk];
        for i in 0..n {
            for x in 0..=i {
                let tix = m[i * n + x];
                let (vx, kx, gx) = (v(x), k(x), gc(x));
                for j in 0..dv {
                    u[i * dv + j] += tix * vx[j] * beta(x);
                }
                for a in 0..dk {
                    wk[i * dk + a] += tix * (kx[a] * beta(x) * gx[a].exp());
                }
            }
        }
        // v_new = U − W · S.
        let mut v_new = u;
        for i in 0..n {
            for a in 0..dk {
                let wa = wk[i * dk + a];
                for j in 0..dv {
                    v_new[i * dv + j] -= wa * s[a * dv + j];
                }
            }
        }
        for i in 0..n {
            let (qi, gi) = (q(i), gc(i));
            let o = &mut out[(start + i) * dv..(start + i + 1) * dv];
            // (q ⊙ exp(G)) · S
            for a in 0..dk {
                let qa = qi[a] * gi[a].exp();
                for j in 0..dv {
                    o[j] += qa * s[a * dv + j];
                }
            }
            // + Σ_{j ≤ i} (Σ_a q_i[a] k_j[a] exp(G_i[a] − G_j[a])) v_new[j]
            for x in 0..=i {
                let (kx, gx) = (k(x), gc(x));
                let score: f32 = (0..dk).map(|a| qi[a] * kx[a] * (gi[a] - gx[a]).exp()).sum();
                for j in 0..dv {
                    o[j] += score * v_new[x * dv + j];
                }
            }
        }
        // S = diag(exp(G_last)) · S + Σ_i (k_i ⊙ exp(G_last − G_i)) ⊗ v_new_i.
        let last = gc(n - 1).to_vec();
        for a in 0..dk {
            let e = last[a].exp();
            s[a * dv..(a + 1) * dv].iter_mut().for_each(|x| *x *= e);
        }
        for i in 0..n {
            let (ki, gi) = (k(i), gc(i));
            for a in 0..dk {
                let ka = ki[a] * (last[a] - gi[a]).exp();
                for j in 0..dv {
                    s[a * dv + j] += ka * v_new[i * dv + j];
                }
            }
        }
        start += n;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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

    fn worst(a: &[f32], b: &[f32]) -> f32 {
        a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0f32, f32::max)
    }

    /// 150 tokens (two whole chunks and a short third) after a non-zero starting state, with the
    /// decay `g` given per channel (KDA) or one value per token on every channel (DeltaNet).
    fn chunked_against_recurrent(dk: usize, dv: usize, g: Vec<f32>) {
        let t = 150;
        let q = normalized(random(t * dk, 1), dk, (dk as f32).powf(-0.5));
        let k = normalized(random(t * dk, 2), dk, 1.0);
        let v: Vec<f32> = random(t * dv, 3).iter().map(|x| 2.0 * x).collect();
        let beta: Vec<f32> = random(t, 5).iter().map(|x| sigmoid(4.0 * x)).collect();
        let rows = HeadRows { q: &q, k: &k, v: &v, g: &g, beta: &beta };
        let start: Vec<f32> = random(dk * dv, 6);
        let (mut s1, mut s2) = (start.clone(), start);
        let (mut o1, mut o2) = (vec![0f32; t * dv], vec![0f32; t * dv]);
        recurrent(&rows, t, dk, dv, &mut s1, &mut o1);
        chunked(&rows, t, dk, dv, &mut s2, &mut o2);
        eprintln!(
            "chunked vs recurrent over {t} tokens ({dk}×{dv}): outputs {:e}, states {:e}",
            worst(&o1, &o2),
            worst(&s1, &s2)
        );
        assert!(worst(&o1, &o2) < 1e-5, "outputs differ by {:e}", worst(&o1, &o2));
        assert!(worst(&s1, &s2) < 1e-5, "final states differ by {:e}", worst(&s1, &s2));
        assert!(o1.iter().any(|x| x.abs() > 0.1), "the check is not vacuous");
    }

    #[test]
    fn the_chunked_form_equals_the_recurrent_one_over_more_than_two_chunks_per_channel_decay() {
        // Decays between exp(-0.5) and 1 per token, as a trained forget gate gives.
        let g: Vec<f32> = random(150 * 16, 4).iter().map(|x| -(x + 0.5) * 0.5).collect();
        chunked_against_recurrent(16, 16, g);
    }

    #[test]
    fn the_chunked_form_equals_the_recurrent_one_over_more_than_two_chunks_per_head_decay() {
        // Gated DeltaNet: one decay per token for the whole head, and values wider than keys.
        let (dk, dv) = (8, 12);
        let per_token: Vec<f32> = random(150, 4).iter().map(|x| -(x + 0.5) * 0.5).collect();
        let g = per_token.iter().flat_map(|g| std::iter::repeat_n(*g, dk)).collect();
        chunked_against_recurrent(dk, dv, g);
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
        chunked(&HeadRows { q: &q, k: &k, v: &v, g: &g, beta: &beta }, t, d, d, &mut whole, &mut o);
        let cut = 37;
        let mut o1 = vec![0f32; cut * d];
        let mut o2 = vec![0f32; (t - cut) * d];
        let (a, b) = (..cut * d, cut * d..);
        let first = HeadRows { q: &q[a], k: &k[a], v: &v[a], g: &g[a], beta: &beta[..cut] };
        chunked(&first, cut, d, d, &mut split, &mut o1);
        let rest = HeadRows { q: &q[b.clone()], k: &k[b.clone()], v: &v[b.clone()], g: &g[b], beta: &beta[cut..] };
        chunked(&rest, t - cut, d, d, &mut split, &mut o2);
        o1.extend(o2);
        assert!(worst(&o, &o1) < 1e-5, "{:e}", worst(&o, &o1));
    }
}
