//! DeepSeek-V4's key/value compressor (paper §2.3.1 eqs. 9–12 and §2.3.2 eqs. 20–23;
//! transformers 5.24 `DeepseekV4HCACompressor`, `DeepseekV4CSACompressor` and the indexer's own
//! compressor in `DeepseekV4Indexer`): every `rate` positions close a window, whose projected
//! rows are pooled channel by channel with softmax weights (the gate plus a learned bias per slot
//! in the window), RMS-normed and rotated to the window's first position. Heavily-compressed
//! attention pools one window; compressed-sparse attention pools two overlapping series, the
//! previous window's first half beside this window's second half. Positions that have not yet
//! closed a window wait in the state.

use candle_core::{Device, Tensor};

use crate::error::Result;
use crate::parts::rope::Rope;
use nightmail_tensor::{Linear, RmsNorm};

pub struct Compressor {
    pub(crate) kv: Linear,
    pub(crate) gate: Linear,
    /// `position_bias` (the checkpoint's `ape`), `[rate, width]`.
    pub(crate) position_bias: Vec<f32>,
    /// Over one entry (`dim`).
    pub(crate) norm: RmsNorm,
    pub(crate) rate: usize,
    /// The width of an entry.
    pub(crate) dim: usize,
    /// CSA's two series per position (projections `2 · dim` wide); HCA has one.
    pub(crate) overlap: bool,
    /// The rotation of an entry's last `rope.dims()` channels (`compress_rope_theta`).
    pub(crate) rope: Rope,
    pub(crate) rope_dim: usize,
}

/// One sequence's compressor state.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CompressorState {
    /// Projected kv and gate rows of the positions since the last closed window.
    pending: Vec<(Vec<f32>, Vec<f32>)>,
    /// CSA: the last closed window's first series, kv and gate (bias added), `rate · dim` each
    /// (the cache's `overlap_kv` / `overlap_gate`).
    previous: Option<(Vec<f32>, Vec<f32>)>,
    /// Every entry so far, rotated; entry e pools positions up to `(e + 1) · rate − 1`.
    pub(crate) entries: Vec<Vec<f32>>,
}

impl CompressorState {
    /// The state as flat f32 for a checkpoint record: each vector after its length.
    pub fn to_flat(&self, out: &mut Vec<f32>) {
        out.push(self.pending.len() as f32);
        for (kv, gate) in &self.pending {
            put(out, kv);
            put(out, gate);
        }
        out.push(f32::from(u8::from(self.previous.is_some())));
        if let Some((kv, gate)) = &self.previous {
            put(out, kv);
            put(out, gate);
        }
        out.push(self.entries.len() as f32);
        self.entries.iter().for_each(|e| put(out, e));
    }

    /// The inverse of [`CompressorState::to_flat`]; None where the record is cut short.
    pub fn from_flat(flat: &mut &[f32]) -> Option<Self> {
        let pending = (0..count(flat)?).map(|_| Some((take(flat)?, take(flat)?))).collect::<Option<_>>()?;
        let previous = match count(flat)? {
            0 => None,
            _ => Some((take(flat)?, take(flat)?)),
        };
        let entries = (0..count(flat)?).map(|_| take(flat)).collect::<Option<_>>()?;
        Some(CompressorState { pending, previous, entries })
    }
}

/// Appends `v` after its length.
pub fn put(out: &mut Vec<f32>, v: &[f32]) {
    out.push(v.len() as f32);
    out.extend(v);
}

/// The next count of a flat record.
pub fn count(flat: &mut &[f32]) -> Option<usize> {
    let (&n, rest) = flat.split_first()?;
    *flat = rest;
    Some(n as usize)
}

/// The next vector [`put`] wrote.
pub fn take(flat: &mut &[f32]) -> Option<Vec<f32>> {
    let n = count(flat)?;
    let (head, rest) = (flat.get(..n)?.to_vec(), flat.get(n..)?);
    *flat = rest;
    Some(head)
}

impl Compressor {
    /// The projection width per position.
    pub fn width(&self) -> usize {
        if self.overlap { 2 * self.dim } else { self.dim }
    }

    /// `x` `[tokens, hidden]` → kv and gate rows `[tokens, width]`.
    pub fn project(&self, x: &Tensor) -> Result<[Tensor; 2]> {
        Ok([self.kv.forward(x)?, self.gate.forward(x)?])
    }

    /// Takes the projected rows of the next positions and closes every window they complete.
    pub fn absorb(&self, kv: &Tensor, gate: &Tensor, state: &mut CompressorState) -> Result<()> {
        for (k, g) in kv.to_vec2::<f32>()?.into_iter().zip(gate.to_vec2::<f32>()?) {
            state.pending.push((k, g));
        }
        let mut pooled = Vec::new();
        while state.pending.len() >= self.rate {
            let window: Vec<(Vec<f32>, Vec<f32>)> = state.pending.drain(..self.rate).collect();
            pooled.push(self.pool(&window, state));
        }
        if pooled.is_empty() {
            return Ok(());
        }
        let n = pooled.len();
        let raw = Tensor::from_vec(pooled.concat(), (n, self.dim), &Device::Cpu)?;
        for mut entry in self.norm.forward(&raw)?.to_vec2::<f32>()? {
            let position = state.entries.len() * self.rate;
            self.rope.rotate_pairs(&mut entry[self.dim - self.rope_dim..], position, false);
            state.entries.push(entry);
        }
        Ok(())
    }

    /// One closed window's entry before its norm: per channel, the softmax over the window's
    /// slots (gate + position bias) of the kv values. CSA's slots are the previous window's
    /// first series (none before the first window: weight 0) and this window's second.
    fn pool(&self, window: &[(Vec<f32>, Vec<f32>)], state: &mut CompressorState) -> Vec<f32> {
        let (rate, dim, width) = (self.rate, self.dim, self.width());
        let bias = |r: usize, c: usize| self.position_bias[r * width + c];
        let mut slots: Vec<(Vec<f32>, Vec<f32>)> = Vec::with_capacity(2 * rate);
        if self.overlap {
            let (kv, gate) =
                state.previous.take().unwrap_or_else(|| (vec![0.0; rate * dim], vec![f32::NEG_INFINITY; rate * dim]));
            for r in 0..rate {
                slots.push((kv[r * dim..(r + 1) * dim].to_vec(), gate[r * dim..(r + 1) * dim].to_vec()));
            }
            let mut next = (Vec::with_capacity(rate * dim), Vec::with_capacity(rate * dim));
            for (r, (k, g)) in window.iter().enumerate() {
                next.0.extend_from_slice(&k[..dim]);
                next.1.extend((0..dim).map(|c| g[c] + bias(r, c)));
                slots.push((k[dim..].to_vec(), (0..dim).map(|c| g[dim + c] + bias(r, dim + c)).collect()));
            }
            state.previous = Some(next);
        } else {
            for (r, (k, g)) in window.iter().enumerate() {
                slots.push((k.clone(), (0..dim).map(|c| g[c] + bias(r, c)).collect()));
            }
        }
        (0..dim)
            .map(|c| {
                let max = slots.iter().map(|(_, g)| g[c]).fold(f32::NEG_INFINITY, f32::max);
                let e: Vec<f32> = slots.iter().map(|(_, g)| (g[c] - max).exp()).collect();
                let sum: f32 = e.iter().sum();
                slots.iter().zip(&e).map(|((k, _), e)| k[c] * (e / sum)).sum()
            })
            .collect()
    }
}
