//! The decoder layer: a pre-norm attention of one of the kinds below and a feed-forward, dense
//! or mixture-of-experts, with residuals (the llama layout every architecture here shares), and
//! the state each kind keeps per sequence.

use std::sync::Arc;

use candle_core::Tensor;
use nightmail_formats::Format;
use nightmail_tensor::{Numerics, RmsNorm, TensorError};

use crate::error::Result;
use crate::parts::attention::{Attention, F16Cache, F32Cache, LayerCache};
use crate::parts::attn_res::{LayerResidual, ResidualScore};
use crate::parts::delta_rule::{DeltaState, StateShape};
use crate::parts::dsa::Choices;
use crate::parts::expert::{Expert, ExpertStore};
use crate::parts::gated_delta_net::GatedDeltaNet;
use crate::parts::hyper::HyperMix;
use crate::parts::kda::Kda;
use crate::parts::mla::Mla;
use crate::parts::moe::MoeBlock;
use crate::parts::norm::norm;
use crate::parts::sliding_mqa::{SlidingMqa, WindowShape, WindowState};
use crate::source::{LayerTensors, WeightSource};
use crate::spec::ModelSpec;
use crate::state::{LayerState, SequenceState};

pub enum FeedForward {
    Dense(Expert),
    Moe(MoeBlock),
}

/// How a layer mixes tokens: grouped-query heads with their own keys and values, DeepSeek's
/// latent attention with one compressed latent per token, or a linear attention with a
/// fixed-size recurrent state (Kimi Linear's KDA, Qwen3-Next's Gated DeltaNet).
pub enum SelfAttention {
    Grouped(Attention),
    Latent(Mla),
    Kda(Kda),
    DeltaNet(GatedDeltaNet),
    /// DeepSeek-V4's sliding-window MQA, with compressed entries on HCA and CSA layers.
    Window(SlidingMqa),
}

impl SelfAttention {
    /// The per-token projections of `x` (rows `[tokens, _]`) that [`SelfAttention::attend`] takes.
    pub fn project(&self, x: &Tensor) -> Result<Vec<Tensor>> {
        Ok(match self {
            SelfAttention::Grouped(a) => {
                let (q, k, v, gate) = a.project(x)?;
                // Qwen3-Next's output gate rides along as a fourth row set.
                [q, k, v].into_iter().chain(gate).collect()
            }
            // A gated layer's gate logits and a sparse layer's indexer rows ride along.
            SelfAttention::Latent(m) => m.project(x)?,
            SelfAttention::Kda(k) => k.project(x)?,
            SelfAttention::DeltaNet(d) => d.project(x)?,
            SelfAttention::Window(w) => w.project(x)?,
        })
    }

    fn attend(&self, rows: &[Tensor], start: usize, state: &mut LayerState, choices: &mut Choices) -> Result<Tensor> {
        match (self, rows, state) {
            (SelfAttention::Grouped(a), [q, k, v, gate @ ..], LayerState::Attention(cache)) => {
                a.gated(a.attend(q, k, v, start, cache)?, gate.first())
            }
            (SelfAttention::Latent(m), rows, LayerState::Attention(LayerCache::F32(cache))) => {
                m.attend_rows(rows, start, cache, choices)
            }
            (SelfAttention::Kda(k), rows, LayerState::Recurrent(state)) => k.attend(rows, state),
            (SelfAttention::DeltaNet(d), rows, LayerState::Recurrent(state)) => d.attend(rows, state),
            (SelfAttention::Window(w), rows, LayerState::Window(state)) => w.attend(rows, start, state),
            // The transformer gives latent attention an f32 cache (it never takes ggml numerics)
            // and each layer the state of its kind.
            _ => Err(TensorError::Compute(candle_core::Error::Msg("a layer's state is not of its kind".into())).into()),
        }
    }

    pub fn output(&self, attended: &Tensor) -> Result<Tensor> {
        match self {
            SelfAttention::Grouped(a) => a.output(attended),
            SelfAttention::Latent(m) => m.output(attended),
            SelfAttention::Kda(k) => k.output(attended),
            SelfAttention::DeltaNet(d) => d.output(attended),
            SelfAttention::Window(w) => w.output(attended),
        }
    }
}

/// The state a layer keeps per sequence: ggml's f16 key/value rows for grouped attention under
/// ggml numerics, f32 rows otherwise, or a linear attention's recurrent state of this shape.
#[derive(Debug, Clone, Copy)]
pub(crate) enum CacheKind {
    F16 { kv_heads: usize, head_dim: usize },
    F32,
    Recurrent(StateShape),
    Window(WindowShape),
}

impl CacheKind {
    /// A new sequence's state for a layer of this kind: an empty cache or a zero recurrent state.
    pub fn state(&self) -> LayerState {
        match *self {
            CacheKind::F16 { kv_heads, head_dim } => {
                LayerState::Attention(LayerCache::F16(F16Cache::new(kv_heads, head_dim)))
            }
            CacheKind::F32 => LayerState::Attention(LayerCache::F32(F32Cache::new())),
            CacheKind::Recurrent(shape) => LayerState::Recurrent(DeltaState::new(shape)),
            CacheKind::Window(shape) => LayerState::Window(WindowState::new(shape)),
        }
    }

    pub fn of(attention: &SelfAttention, numerics: Numerics) -> Self {
        match (attention, numerics) {
            (SelfAttention::Grouped(a), Numerics::Ggml) => {
                CacheKind::F16 { kv_heads: a.kv_heads, head_dim: a.head_dim }
            }
            (SelfAttention::Kda(k), _) => CacheKind::Recurrent(k.state_shape()),
            (SelfAttention::DeltaNet(d), _) => CacheKind::Recurrent(d.state_shape()),
            (SelfAttention::Window(w), _) => CacheKind::Window(w.shape()),
            _ => CacheKind::F32,
        }
    }
}

pub struct DecoderLayer {
    pub(crate) attn_norm: RmsNorm,
    pub(crate) attention: SelfAttention,
    pub(crate) ffn_norm: RmsNorm,
    pub(crate) ffn: FeedForward,
    /// Kimi K3's AttnRes mixing weights (None for a plain residual).
    pub(crate) residual: Option<LayerResidual>,
}

impl DecoderLayer {
    /// Layer `l`'s dense weights (its routed experts come from `experts`), from a mapped file
    /// at load or from a streamed layer's read buffers: the same build either way, so the same
    /// kernels over the same bytes.
    pub fn load(
        source: &dyn WeightSource,
        spec: &ModelSpec,
        numerics: Numerics,
        format: Format,
        experts: &Arc<dyn ExpertStore>,
        l: usize,
    ) -> Result<DecoderLayer> {
        let w = LayerTensors::new(source, l);
        let hidden = spec.hidden_size;
        let attention = match (&spec.kda, &spec.attention.mla) {
            _ if spec.deepseek_v4.is_some() => {
                SelfAttention::Window(SlidingMqa::load(&w, spec, spec.deepseek_v4.as_ref().expect("checked"))?)
            }
            (Some(kda), _) if spec.is_kda(l) => SelfAttention::Kda(Kda::load(source, format, spec, kda, l)?),
            _ if spec.is_delta_net(l) => {
                let d = spec.delta_net.as_ref().expect("a DeltaNet layer has its spec");
                SelfAttention::DeltaNet(GatedDeltaNet::load(source, format, spec, d, l)?)
            }
            (_, Some(dims)) => SelfAttention::Latent(Mla::load(&w, spec, dims)?),
            (_, None) => SelfAttention::Grouped(Attention::load(&w, spec, numerics)?),
        };
        let ffn = match (&spec.moe, spec.moe_layers[l]) {
            (Some(moe), true) => FeedForward::Moe(MoeBlock::load(&w, spec, moe, numerics, experts)?),
            _ => FeedForward::Dense(
                Expert::new(
                    w.linear("ffn_gate", spec.ffn, hidden)?,
                    w.linear("ffn_up", spec.ffn, hidden)?,
                    w.linear("ffn_down", hidden, spec.ffn)?,
                )
                .with_activation(spec.ffn_activation),
            ),
        };
        let residual = match spec.attn_res_block {
            Some(_) => {
                let score = |name: &str| {
                    ResidualScore::load(source, &format!("blk.{l}.{name}"), hidden, spec.rms_norm_eps, numerics)
                };
                Some(LayerResidual::AttnRes { attention: score("attn_res")?, ffn: score("ffn_res")? })
            }
            None => match &spec.deepseek_v4 {
                Some(v4) => Some(LayerResidual::Hyper {
                    attention: HyperMix::load(source, spec, v4, &format!("blk.{l}.hc_attn"))?,
                    ffn: HyperMix::load(source, spec, v4, &format!("blk.{l}.hc_ffn"))?,
                }),
                None => None,
            },
        };
        Ok(DecoderLayer {
            attn_norm: norm(&w.require("attn_norm.weight")?, spec, numerics)?,
            attention,
            // llama.cpp names gpt-oss's and Qwen3-Next's norm before the feed-forward
            // `post_attention_norm`.
            ffn_norm: match w.opt("ffn_norm.weight")? {
                Some(n) => norm(&n, spec, numerics)?,
                None => norm(&w.require("post_attention_norm.weight")?, spec, numerics)?,
            },
            ffn,
            residual,
        })
    }
}

/// One group's attention at layer `l` after what its state holds. A verify pass attends one
/// position at a time, as a decode step does (the same arithmetic, so greedy decoding with drafts
/// gives the tokens it gives without; the projections around it still read each weight once for
/// all positions), keeping each recurrent state it passes; any other pass, a prefill chunk or a
/// decode step, attends all its positions at once.
pub fn attend_group(attention: &SelfAttention, rows: &[Tensor], cache: &mut SequenceState, l: usize) -> Result<Tensor> {
    let start = cache.position;
    cache.choices.forget_before(start);
    let Some(trail) = cache.verify.as_mut().filter(|t| t.start == start) else {
        return attention.attend(rows, start, &mut cache.layers[l], &mut cache.choices);
    };
    let mut outs = Vec::with_capacity(rows[0].dim(0)?);
    for i in 0..rows[0].dim(0)? {
        let one = rows.iter().map(|m| m.narrow(0, i, 1)).collect::<Result<Vec<_>, _>>()?;
        outs.push(attention.attend(&one, start + i, &mut cache.layers[l], &mut cache.choices)?);
        if let LayerState::Recurrent(state) = &cache.layers[l] {
            trail.states[l].push(state.clone());
        }
    }
    Ok(Tensor::cat(&outs, 0)?)
}
