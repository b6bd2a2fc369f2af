//! DeepSeek-V4's attention (paper §2.3; transformers 5.24 `DeepseekV4Attention`): multi-query
//! attention over one shared key/value head (the same rotated row is key and value) within a
//! sliding window, with a low-rank query (`q_a` → RMSNorm → `q_b`, then an unweighted RMSNorm per
//! head), rotary on the last `rope_dim` channels of each head, per-head attention sinks, the
//! output turned back by the query's angle and a grouped low-rank output projection. A
//! heavily-compressed layer also attends to every compressed entry closed so far; a
//! compressed-sparse layer to the `index_topk` entries its Lightning Indexer scores best
//! (`DeepseekV4Indexer`: Σ_h w_h · ReLU(q_h · k)).

use nightmail_tensor::TensorError;
use std::collections::VecDeque;

use candle_core::Tensor;

use crate::error::Result;
use crate::parts::compressor::{Compressor, CompressorState, count, put, take};
use crate::parts::dsa::{index_scores, top_keys};
use crate::parts::rope::Rope;
use crate::source::LayerTensors;
use crate::spec::{DeepseekV4Spec, ModelSpec, RopeStyle, V4AttentionKind};
use nightmail_formats::FormatError;
use nightmail_tensor::Numerics;
use nightmail_tensor::{Linear, RmsNorm, unweighted_rms};

/// The Lightning Indexer of a compressed-sparse layer.
pub struct Indexer {
    /// Its own compressor, of `index_head_dim` entries.
    pub(crate) compressor: Compressor,
    /// `wq_b`: the query latent to `heads · head_dim`.
    pub(crate) q_b: Linear,
    /// `weights_proj`: one weight per indexer head from the layer input.
    pub(crate) weights: Linear,
    pub(crate) head_dim: usize,
    pub(crate) top_k: usize,
}

/// What a layer attends to beside its window.
pub enum Compressed {
    None,
    /// HCA: every entry.
    All(Compressor),
    /// CSA: the entries the indexer chooses.
    Sparse(Compressor, Box<Indexer>),
}

pub struct SlidingMqa {
    pub(crate) q_a: Linear,
    pub(crate) q_norm: RmsNorm,
    pub(crate) q_b: Linear,
    pub(crate) kv: Linear,
    pub(crate) kv_norm: RmsNorm,
    /// `wo_a` as `[groups, o_lora_rank, heads · head_dim / groups]`.
    pub(crate) out_a: Tensor,
    pub(crate) out_b: Linear,
    pub(crate) sinks: Vec<f32>,
    /// Sliding layers rotate with `rope_theta`, compressed ones with `compress_rope_theta`.
    pub(crate) rope: Rope,
    pub(crate) rope_dim: usize,
    pub(crate) heads: usize,
    pub(crate) head_dim: usize,
    pub(crate) window: usize,
    pub(crate) eps: f32,
    pub(crate) compressed: Compressed,
}

/// One sequence's state at a DeepSeek-V4 layer (transformers' `DynamicSlidingWindowLayer`,
/// `DeepseekV4HCACache`, `DeepseekV4CSACache`): the rotated key rows of the last `window − 1`
/// positions and the compressors' states.
#[derive(Debug, Clone, PartialEq)]
pub struct WindowState {
    recent: VecDeque<Vec<f32>>,
    compressor: Option<CompressorState>,
    indexer: Option<CompressorState>,
}

/// Which compressors a layer's state holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WindowShape {
    pub compressor: bool,
    pub indexer: bool,
}

impl WindowState {
    pub fn new(shape: WindowShape) -> Self {
        WindowState {
            recent: VecDeque::new(),
            compressor: shape.compressor.then(CompressorState::default),
            indexer: shape.indexer.then(CompressorState::default),
        }
    }
}

impl WindowState {
    /// The whole state as one flat f32 row (a checkpoint record's snapshot of the layer).
    pub fn to_flat(&self) -> Vec<f32> {
        let mut out = vec![self.recent.len() as f32];
        self.recent.iter().for_each(|k| put(&mut out, k));
        for c in [&self.compressor, &self.indexer] {
            out.push(f32::from(u8::from(c.is_some())));
            if let Some(c) = c {
                c.to_flat(&mut out);
            }
        }
        out
    }

    /// The state [`WindowState::to_flat`] wrote; None for a record cut short or of another shape.
    pub fn from_flat(mut flat: &[f32], shape: WindowShape) -> Option<Self> {
        let flat = &mut flat;
        let recent = (0..count(flat)?).map(|_| take(flat)).collect::<Option<_>>()?;
        let mut part = |expected: bool| -> Option<Option<CompressorState>> {
            match (count(flat)?, expected) {
                (0, false) => Some(None),
                (1, true) => Some(Some(CompressorState::from_flat(flat)?)),
                _ => None,
            }
        };
        let (compressor, indexer) = (part(shape.compressor)?, part(shape.indexer)?);
        flat.is_empty().then_some(WindowState { recent, compressor, indexer })
    }

    /// Which compressors it holds.
    pub fn shape(&self) -> WindowShape {
        WindowShape { compressor: self.compressor.is_some(), indexer: self.indexer.is_some() }
    }
}

fn dot(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

impl SlidingMqa {
    pub fn shape(&self) -> WindowShape {
        WindowShape {
            compressor: !matches!(self.compressed, Compressed::None),
            indexer: matches!(self.compressed, Compressed::Sparse(..)),
        }
    }

    /// Per-token projections of the layer input `x`: the query (before its head norm), the
    /// key/value row, and each compressor's kv and gate rows; a sparse layer's indexer query and
    /// head weights last.
    pub fn project(&self, x: &Tensor) -> Result<Vec<Tensor>> {
        let latent = self.q_norm.forward(&self.q_a.forward(x)?)?;
        let mut rows = vec![self.q_b.forward(&latent)?, self.kv_norm.forward(&self.kv.forward(x)?)?];
        match &self.compressed {
            Compressed::None => {}
            Compressed::All(c) => rows.extend(c.project(x)?),
            Compressed::Sparse(c, indexer) => {
                rows.extend(c.project(x)?);
                rows.extend(indexer.compressor.project(x)?);
                rows.push(indexer.q_b.forward(&latent)?);
                rows.push(indexer.weights.forward(x)?);
            }
        }
        Ok(rows)
    }

    /// Attends the positions `start..` whose projections are `rows` after what `state` holds:
    /// `[tokens, heads · head_dim]`, each head turned back by its query's angle.
    pub fn attend(&self, rows: &[Tensor], start: usize, state: &mut WindowState) -> Result<Tensor> {
        let (hd, rd) = (self.head_dim, self.rope_dim);
        let tokens = rows[1].dim(0)?;
        // Each head's query normed on its own.
        let queries = unweighted_rms(&rows[0].reshape((tokens, self.heads, hd))?, self.eps)?;
        let mut queries = queries.reshape((tokens, self.heads * hd))?.to_vec2::<f32>()?;
        let mut keys = rows[1].to_vec2::<f32>()?;
        for (i, (q, k)) in queries.iter_mut().zip(keys.iter_mut()).enumerate() {
            for head in q.chunks_exact_mut(hd) {
                self.rope.rotate_pairs(&mut head[hd - rd..], start + i, false);
            }
            self.rope.rotate_pairs(&mut k[hd - rd..], start + i, false);
        }
        // Close the windows these positions complete; entry e is visible from position
        // (e + 1) · rate − 1 on (the reference's `entry < (position + 1) // rate`).
        let bad_state = || TensorError::Compute(candle_core::Error::Msg("a layer's state is not of its kind".into()));
        let (entries, rate, chosen) = match &self.compressed {
            Compressed::None => (&[][..], 1, None),
            Compressed::All(c) => {
                let st = state.compressor.as_mut().ok_or_else(bad_state)?;
                c.absorb(&rows[2], &rows[3], st)?;
                (&st.entries[..], c.rate, None)
            }
            Compressed::Sparse(c, indexer) => {
                let ist = state.indexer.as_mut().ok_or_else(bad_state)?;
                indexer.compressor.absorb(&rows[4], &rows[5], ist)?;
                let chosen = indexer.choose(&rows[6], &rows[7], start, &ist.entries, c.rate)?;
                let st = state.compressor.as_mut().ok_or_else(bad_state)?;
                c.absorb(&rows[2], &rows[3], st)?;
                (&st.entries[..], c.rate, Some(chosen))
            }
        };
        let scale = (hd as f32).powf(-0.5);
        let mut out = Vec::with_capacity(tokens * self.heads * hd);
        for (i, q) in queries.iter().enumerate() {
            let p = start + i;
            // The window's keys, oldest first: cached ones, then this pass's up to p.
            let first = (p + 1).saturating_sub(self.window);
            let cached = state.recent.len();
            let mut visible: Vec<&[f32]> = Vec::new();
            for (j, k) in state.recent.iter().enumerate() {
                if start - cached + j >= first {
                    visible.push(k);
                }
            }
            for (j, k) in keys.iter().enumerate().take(i + 1) {
                if start + j >= first {
                    visible.push(k);
                }
            }
            let closed = if self.shape().compressor { ((p + 1) / rate).min(entries.len()) } else { 0 };
            match &chosen {
                Some(chosen) => visible.extend(chosen[i].iter().map(|&e| &entries[e][..])),
                None => visible.extend(entries[..closed].iter().map(|e| &e[..])),
            }
            for (h, q) in q.chunks_exact(hd).enumerate() {
                let logits: Vec<f32> = visible.iter().map(|k| dot(q, k) * scale).collect();
                let max = logits.iter().copied().fold(self.sinks[h], f32::max);
                let e: Vec<f32> = logits.iter().map(|l| (l - max).exp()).collect();
                let sum = e.iter().sum::<f32>() + (self.sinks[h] - max).exp();
                let mut o = vec![0f32; hd];
                for (w, k) in e.iter().zip(&visible) {
                    let w = w / sum;
                    o.iter_mut().zip(k.iter()).for_each(|(o, k)| *o += w * k);
                }
                self.rope.rotate_pairs(&mut o[hd - rd..], p, true);
                out.extend(o);
            }
        }
        state.recent.extend(keys);
        while state.recent.len() > self.window.saturating_sub(1) {
            state.recent.pop_front();
        }
        Ok(Tensor::from_vec(out, (tokens, self.heads * hd), &candle_core::Device::Cpu)?)
    }

    /// The grouped output projection (`DeepseekV4GroupedLinear`): each group of heads through
    /// its own `o_lora_rank` map, the groups' results side by side through `wo_b`.
    pub fn output(&self, attended: &Tensor) -> Result<Tensor> {
        let (groups, rank, width) = self.out_a.dims3()?;
        let tokens = attended.dim(0)?;
        let x = attended.reshape((tokens, groups, width))?.transpose(0, 1)?.contiguous()?;
        let y = x.matmul(&self.out_a.transpose(1, 2)?)?; // [groups, tokens, rank]
        let y = y.transpose(0, 1)?.contiguous()?.reshape((tokens, groups * rank))?;
        Ok(self.out_b.forward(&y)?)
    }
}

impl Indexer {
    /// Per query position, the entries it attends: of those closed by its position, the
    /// `top_k` best by the lightning indexer's score (parts/dsa.rs).
    fn choose(
        &self,
        q: &Tensor,
        w: &Tensor,
        start: usize,
        entries: &[Vec<f32>],
        rate: usize,
    ) -> Result<Vec<Vec<usize>>> {
        let (hd, rd) = (self.head_dim, self.compressor.rope_dim);
        let (t, cpu) = (q.dim(0)?, &candle_core::Device::Cpu);
        let mut q = q.to_vec2::<f32>()?;
        for (i, q) in q.iter_mut().enumerate() {
            for head in q.chunks_exact_mut(hd) {
                self.compressor.rope.rotate_pairs(&mut head[hd - rd..], start + i, false);
            }
        }
        if entries.is_empty() {
            return Ok(vec![Vec::new(); t]);
        }
        let q = Tensor::from_vec(q.concat(), (t, q[0].len() / hd, hd), cpu)?;
        let keys = Tensor::from_vec(entries.concat(), (entries.len(), hd), cpu)?;
        let scores = index_scores(&q, w, &keys)?.to_vec2::<f32>()?;
        // Entry e is visible from position (e + 1) · rate − 1 on.
        let closed = |i: usize| ((start + i + 1) / rate).min(entries.len());
        Ok(scores.iter().enumerate().map(|(i, row)| top_keys(&row[..closed(i)], self.top_k)).collect())
    }
}

impl SlidingMqa {
    /// A layer's DeepSeek-V4 attention (parts/sliding_mqa.rs, parts/compressor.rs), under the
    /// names spec's hf.rs maps from the checkpoint (`attn.wq_a`, `attn.compressor.wkv`, ...).
    pub fn load(w: &LayerTensors<'_>, spec: &ModelSpec, v4: &DeepseekV4Spec) -> Result<SlidingMqa> {
        let (a, hidden) = (&spec.attention, spec.hidden_size);
        let (heads, hd) = (a.heads, a.head_dim);
        let eps = spec.rms_norm_eps;
        let rms = |name: &str, width: usize| -> Result<RmsNorm> {
            let w = w.require(name)?;
            w.expect_shape(&[width])?;
            Ok(RmsNorm::new(&w, eps, Numerics::Reference)?)
        };
        // DeepSeek's inference/model.py (`Attention.__init__`): a layer with a compressor rotates its
        // queries, keys, compressed entries and indexer with `compress_rope_theta` and YaRN; a purely
        // sliding layer with `rope_theta` and no YaRN.
        let compress_rope = || {
            Rope::new(v4.rope_dim, v4.compress_rope_theta, RopeStyle::Interleaved, v4.compress_rope_scaling.as_ref())
        };
        let compressor = |prefix: &str, rate: usize, dim: usize, overlap: bool| -> Result<Compressor> {
            let width = if overlap { 2 * dim } else { dim };
            let ape = w.require(&format!("{prefix}_ape.weight"))?;
            ape.expect_shape(&[rate, width])?;
            if v4.rope_dim > dim {
                return Err(FormatError::Unsupported {
                    what: format!("a compressor of {dim}-wide entries under a {}-wide rotation", v4.rope_dim),
                    hint: "the rotation covers the end of each entry".into(),
                }
                .into());
            }
            Ok(Compressor {
                kv: w.weight(&format!("{prefix}_kv"), width, hidden)?,
                gate: w.weight(&format!("{prefix}_gate"), width, hidden)?,
                position_bias: ape.to_f32()?.flatten_all()?.to_vec1()?,
                norm: rms(&format!("{prefix}_norm.weight"), dim)?,
                rate,
                dim,
                overlap,
                rope: compress_rope(),
                rope_dim: v4.rope_dim,
            })
        };
        let (compressed, rope) = match v4.kinds[w.layer] {
            V4AttentionKind::Sliding => {
                (Compressed::None, Rope::new(v4.rope_dim, a.rope_theta, RopeStyle::Interleaved, None))
            }
            V4AttentionKind::HeavilyCompressed { rate } => {
                (Compressed::All(compressor("attn_compressor", rate, hd, false)?), compress_rope())
            }
            V4AttentionKind::CompressedSparse { rate } => {
                let indexer = Indexer {
                    compressor: compressor("indexer_compressor", rate, v4.index_head_dim, true)?,
                    q_b: w.weight("indexer.attn_q_b", v4.index_heads * v4.index_head_dim, v4.q_lora_rank)?,
                    weights: w.weight("indexer.proj", v4.index_heads, hidden)?,
                    head_dim: v4.index_head_dim,
                    top_k: v4.index_topk,
                };
                (Compressed::Sparse(compressor("attn_compressor", rate, hd, true)?, Box::new(indexer)), compress_rope())
            }
        };
        let (groups, rank) = (v4.o_groups, v4.o_lora_rank);
        if (heads * hd) % groups != 0 {
            return Err(FormatError::BadMetadata {
                key: "o_groups".into(),
                reason: format!("as {groups}, which does not divide {heads} heads of {hd}"),
            }
            .into());
        }
        let out_a = w.require("attn_output_a.weight")?;
        out_a.expect_shape(&[groups * rank, heads * hd / groups])?;
        Ok(SlidingMqa {
            q_a: w.weight("attn_q_a", v4.q_lora_rank, hidden)?,
            q_norm: rms("attn_q_a_norm.weight", v4.q_lora_rank)?,
            q_b: w.weight("attn_q_b", heads * hd, v4.q_lora_rank)?,
            kv: w.weight("attn_kv", hd, hidden)?,
            kv_norm: rms("attn_kv_a_norm.weight", hd)?,
            out_a: out_a.to_f32()?.reshape((groups, rank, heads * hd / groups))?,
            out_b: w.weight("attn_output_b", hidden, groups * rank)?,
            sinks: super::attention::sinks(&w.require("attn_sinks.weight")?, heads)?.to_vec1()?,
            rope,
            rope_dim: v4.rope_dim,
            heads,
            head_dim: hd,
            window: v4.sliding_window,
            eps: eps as f32,
            compressed,
        })
    }
}
