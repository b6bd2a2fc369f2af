//! The decoder stack: pre-norm layers of attention and feed-forward with residuals (the llama
//! layout, which every architecture here shares), then a final norm and the output head.

use crate::error::ModelError;
use nightmail_formats::FormatError;
use nightmail_tensor::TensorError;
use std::sync::{Arc, Mutex};

use candle_core::Tensor;

use crate::dense::{HeldLayer, LayerBuilder, LayerStore};
use crate::error::Result;
use crate::mtp::Mtp;
use crate::parts::attention::{Attention, F16Cache, F32Cache, LayerCache};
use crate::parts::attn_res::{LayerResidual, ResidualScore, ResidualStream};
use crate::parts::compressor::Compressor;
use crate::parts::delta_rule::{DeltaState, StateShape};
use crate::parts::embedding::Embedding;
use crate::parts::expert::{Expert, ExpertStore};
use crate::parts::gated_delta_net::GatedDeltaNet;
use crate::parts::hyper::{HyperHead, HyperMix};
use crate::parts::kda::Kda;
use crate::parts::latent_moe::LatentProjection;
use crate::parts::mla::{Mla, MlaQuery};
use crate::parts::moe::{MoeBlock, SharedExpert};
use crate::parts::rope::Rope;
use crate::parts::router::Router;
use crate::parts::sliding_mqa::{Compressed, Indexer, SlidingMqa, WindowShape, WindowState};
use crate::source::{Recorded, Recording, WeightSource};
use crate::spec::{DeepseekV4Spec, MlaSpec, ModelSpec, RopeStyle, V4AttentionKind};
use crate::state::{LayerState, SequenceState};
use crate::timeline;
use nightmail_formats::ExpertId;
use nightmail_formats::{Format, ModelFile};
use nightmail_tensor::TensorView;
use nightmail_tensor::ggml::Numerics;
use nightmail_tensor::{Linear, RmsNorm};

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
            SelfAttention::Latent(m) => {
                let (q, kv) = m.project(x)?;
                // A gated layer's gate logits ride along as a third row set.
                [q, kv].into_iter().chain(m.gate_logits(x)?).collect()
            }
            SelfAttention::Kda(k) => k.project(x)?,
            SelfAttention::DeltaNet(d) => d.project(x)?,
            SelfAttention::Window(w) => w.project(x)?,
        })
    }

    fn attend(&self, rows: &[Tensor], start: usize, state: &mut LayerState) -> Result<Tensor> {
        match (self, rows, state) {
            (SelfAttention::Grouped(a), [q, k, v, gate @ ..], LayerState::Attention(cache)) => {
                a.gated(a.attend(q, k, v, start, cache)?, gate.first())
            }
            (SelfAttention::Latent(m), [q, kv, gate @ ..], LayerState::Attention(LayerCache::F32(cache))) => {
                m.gated(m.attend(q, kv, start, cache)?, gate.first())
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

/// Transformers' DeepseekV3RMSNorm default: the latent norms (`q_a_layernorm`,
/// `kv_a_layernorm`) use 1e-6 whatever `rms_norm_eps` says, as DeepSeek-V3's reference does.
const LATENT_NORM_EPS: f64 = 1e-6;

pub struct DecoderLayer {
    pub(crate) attn_norm: RmsNorm,
    pub(crate) attention: SelfAttention,
    pub(crate) ffn_norm: RmsNorm,
    pub(crate) ffn: FeedForward,
    /// Kimi K3's AttnRes mixing weights (None for a plain residual).
    residual: Option<LayerResidual>,
}

/// gpt-oss's attention sinks `[heads]`, as f32.
fn sinks(view: &TensorView<'_>, heads: usize) -> Result<Tensor> {
    view.expect_shape(&[heads])?;
    Ok(view.to_f32()?)
}

pub struct Transformer {
    numerics: Numerics,
    /// The file format the layers are built from (a streamed layer is built again later).
    format: Format,
    embedding: Embedding,
    /// Resident layers; `None` where the layer streams from `streamed`.
    layers: Vec<Option<Arc<DecoderLayer>>>,
    streamed: Option<Arc<dyn LayerStore>>,
    /// Each layer's key/value cache, known without its weights in memory.
    caches: Vec<CacheKind>,
    norm: RmsNorm,
    /// Shared with the embedding where the two are tied.
    lm_head: Arc<Linear>,
    /// Kimi K3's AttnRes: the block size and the mix before the final norm.
    attn_res: Option<(usize, ResidualScore)>,
    /// DeepSeek-V4's hyper-connection streams: their count and the collapse before the norm.
    hyper: Option<(usize, HyperHead)>,
    /// DeepSeek-V4's hash-routed layers: per token id, its experts (`tid2eid`, `[vocab, top_k]`).
    hash_routes: Vec<Option<HashTable>>,
    experts: Arc<dyn ExpertStore>,
    prefetch: Prefetcher,
    /// The multi-token-prediction layer, once [`Transformer::attach_mtp`] loaded it.
    mtp: Option<Mtp>,
}

/// Guesses the next layer's experts while a layer computes, so their reads overlap its compute:
/// layer L+1's router applied to layer L's post-attention hidden state (deltafin's PILOT; the
/// residual stream changes little between layers), or, where that has guessed worse so far, the
/// previous token's routes at L+1. Recall is kept per layer for both.
struct Prefetcher {
    depth: usize,
    recall: Mutex<Vec<LayerRecall>>,
}

/// How well each guess matched a layer's true experts, over the decode steps so far.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct LayerRecall {
    pub layer: usize,
    pub steps: u64,
    /// Chosen experts (summed over steps).
    pub chosen: u64,
    /// Of those, guessed by the next-router lookahead / by the last token's routes / by the
    /// guess that was used for the prefetch.
    pub lookahead_hits: u64,
    pub last_token_hits: u64,
    pub used_hits: u64,
}

impl LayerRecall {
    fn prefers_last_token(&self) -> bool {
        self.steps >= 4 && self.last_token_hits > self.lookahead_hits
    }
}

impl Transformer {
    /// `prefetch_depth`: how many of the next layer's guessed experts to prefetch at each decode
    /// step (0 for resident experts, where there is nothing to fetch).
    pub fn load(
        ck: &ModelFile,
        spec: &ModelSpec,
        experts: Arc<dyn ExpertStore>,
        prefetch_depth: usize,
        streamed: &[bool],
    ) -> Result<(Self, Vec<Option<Vec<Recorded>>>)> {
        let (hidden, a) = (spec.hidden_size, &spec.attention);
        // ggml's numerics cover grouped attention with plain RoPE (its f16 cache and rope
        // angles); latent attention, YaRN and attention sinks compute the reference way.
        let numerics = match ck.tensor("blk.0.attn_q.weight")? {
            Some(q) if a.mla.is_none() && a.rope_scaling.is_none() && !a.sinks && !a.output_gate => {
                Numerics::for_weights(q.dtype)
            }
            _ => Numerics::Reference,
        };
        let embd = ck.require("token_embd.weight")?;
        embd.expect_shape(&[spec.vocab_size, hidden])?;
        // Tied embeddings (SmolLM2, the llama fixture): no output.weight, the head is token_embd
        // and serves the embedding's rows; else they are read from the file (`model/embedding.rs`).
        let (lm_head, embedding) = match ck.tensor("output.weight")? {
            Some(head) => {
                head.expect_shape(&[spec.vocab_size, hidden])?;
                (Arc::new(Linear::new(&head, None)?), Embedding::in_file(ck, &embd, spec.vocab_size, hidden)?)
            }
            None => {
                let head = Arc::new(Linear::new(&embd, None)?);
                (head.clone(), Embedding::tied(head, spec.vocab_size, hidden))
            }
        };
        ck.release_pages();
        let mut layers = Vec::with_capacity(spec.layers);
        let mut recorded = Vec::with_capacity(spec.layers);
        let mut caches = Vec::with_capacity(spec.layers);
        let blank = if streamed.contains(&true) { Some(Recording::blank(ck)?) } else { None };
        for l in 0..spec.layers {
            // A streamed layer is built once here too, from its tensor headers over zeros, so
            // that a bad tensor fails the load and the build notes the extents it will be read
            // from again, without reading them now.
            let layer = if let Some(blank) = blank.as_ref().filter(|_| streamed.get(l).copied().unwrap_or(false)) {
                let source = Recording::new(ck, blank.clone());
                let layer = Self::load_layer(&source, spec, numerics, ck.format(), &experts, l)?;
                recorded.push(Some(source.take()));
                layer
            } else {
                recorded.push(None);
                Self::load_layer(ck, spec, numerics, ck.format(), &experts, l)?
            };
            caches.push(CacheKind::of(&layer.attention, numerics));
            layers.push(recorded[l].is_none().then(|| Arc::new(layer)));
            // Each layer's weights were copied out of the map: drop its pages as we go.
            ck.release_pages();
        }
        let t = Transformer {
            numerics,
            format: ck.format(),
            embedding,
            layers,
            streamed: None,
            caches,
            norm: norm(&ck.require("output_norm.weight")?, spec, numerics)?,
            lm_head,
            attn_res: match spec.attn_res_block {
                Some(block) => Some((block, residual_score(ck, "output_res", hidden, spec.rms_norm_eps, numerics)?)),
                None => None,
            },
            hyper: match &spec.deepseek_v4 {
                Some(v4) => Some((v4.hc_mult, hyper_head(ck, spec, v4)?)),
                None => None,
            },
            hash_routes: hash_routes(ck, spec)?,
            experts,
            prefetch: Prefetcher { depth: prefetch_depth, recall: Mutex::new(Vec::new()) },
            mtp: None,
        };
        ck.release_pages();
        Ok((t, recorded))
    }

    /// The build of one layer from a source of its tensors, for a store that streams layers.
    pub fn layer_builder(&self, spec: &ModelSpec) -> LayerBuilder {
        let (spec, numerics, format, experts) = (spec.clone(), self.numerics, self.format, self.experts.clone());
        Arc::new(move |source, l| Self::load_layer(source, &spec, numerics, format, &experts, l))
    }

    /// Loads the model's first multi-token-prediction layer (`model/mtp.rs`) from `ck`, its
    /// routed experts from the model's own store where `streamed` (the store lists them).
    pub fn attach_mtp(&mut self, ck: &ModelFile, spec: &ModelSpec, streamed: bool) -> Result<()> {
        let embd = ck.require("token_embd.weight")?;
        let head = ck.tensor("output.weight")?.unwrap_or_else(|| embd.clone());
        let experts = streamed.then_some(&self.experts);
        self.mtp = Some(Mtp::load(ck, spec, self.numerics, (&embd, &head), experts)?);
        Ok(())
    }

    /// An empty state for the MTP layer, when one is loaded.
    pub fn new_mtp_cache(&self) -> Option<SequenceState> {
        self.mtp.as_ref().map(Mtp::new_cache)
    }

    /// The MTP layer over `tokens` (t_{i+1}) and the model's hidden rows `hidden` (h_i) after
    /// what `state` holds: each row's logits and its hidden state for a chained guess.
    pub fn forward_mtp(&self, tokens: &[u32], hidden: &Tensor, state: &mut SequenceState) -> Result<(Tensor, Tensor)> {
        let mtp = self
            .mtp
            .as_ref()
            .ok_or_else(|| TensorError::Compute(candle_core::Error::Msg("no MTP layer is loaded".into())))?;
        mtp.forward(&self.embedding, &self.lm_head, tokens, hidden, state)
    }

    /// Take the layers [`Transformer::load`] did not keep from `store`.
    pub fn stream_layers(&mut self, store: Arc<dyn LayerStore>) {
        self.streamed = Some(store);
    }

    /// Layer `l` for this step: resident, or from the store (waiting for its read).
    fn hold(&self, l: usize) -> Result<HeldLayer<'_>> {
        match (&self.layers[l], &self.streamed) {
            (Some(layer), _) => Ok(HeldLayer::new(layer.clone(), None)),
            (None, Some(store)) => Ok(HeldLayer::new(store.layer(l)?, Some((store.as_ref(), l)))),
            (None, None) => unreachable!("a layer that is not resident streams"),
        }
    }

    /// Layer `l` if it is in memory now (the prefetcher does not wait for a streamed one).
    fn peek(&self, l: usize) -> Option<Arc<DecoderLayer>> {
        match (self.layers.get(l)?, &self.streamed) {
            (Some(layer), _) => Some(layer.clone()),
            (None, Some(store)) => store.peek(l),
            (None, None) => None,
        }
    }

    /// Layer `l`'s dense weights (its routed experts come from `experts`), from a mapped file
    /// at load or from a streamed layer's read buffers: the same build either way, so the same
    /// kernels over the same bytes.
    pub fn load_layer(
        ck: &dyn WeightSource,
        spec: &ModelSpec,
        numerics: Numerics,
        format: Format,
        experts: &Arc<dyn ExpertStore>,
        l: usize,
    ) -> Result<DecoderLayer> {
        let (hidden, a) = (spec.hidden_size, &spec.attention);
        let t = |name: &str| ck.require(&format!("blk.{l}.{name}"));
        let opt = |name: &str| ck.tensor(&format!("blk.{l}.{name}"));
        let linear = |name: &str, rows: usize, cols: usize| -> Result<Linear> {
            let w = t(&format!("{name}.weight"))?;
            w.expect_shape(&[rows, cols])?;
            ck.linear(&w, opt(&format!("{name}.bias"))?.as_ref())
        };
        let attention = match (&spec.kda, &a.mla) {
            _ if spec.deepseek_v4.is_some() => {
                SelfAttention::Window(load_sliding_mqa(ck, spec, spec.deepseek_v4.as_ref().expect("checked"), l)?)
            }
            (Some(kda), _) if spec.is_kda(l) => SelfAttention::Kda(Kda::load(ck, format, spec, kda, l)?),
            _ if spec.is_delta_net(l) => {
                let d = spec.delta_net.as_ref().expect("a DeltaNet layer has its spec");
                SelfAttention::DeltaNet(GatedDeltaNet::load(ck, format, spec, d, l)?)
            }
            (_, Some(dims)) => SelfAttention::Latent(load_mla(ck, spec, l, dims)?),
            (_, None) => {
                let (q_dim, kv_dim) = (a.heads * a.head_dim, a.kv_heads * a.head_dim);
                // A pair or neither (MiniMax-M2 always has them); half a pair is a broken file.
                let required = spec.architecture == crate::spec::Architecture::MinimaxM2;
                let qk_norm = match (opt("attn_q_norm.weight")?, opt("attn_k_norm.weight")?) {
                    (None, None) if !required => None,
                    (q, k) => {
                        let q = q.map_or_else(|| t("attn_q_norm.weight"), Ok)?;
                        let k = k.map_or_else(|| t("attn_k_norm.weight"), Ok)?;
                        // One head wide, or (MiniMax-M2) as wide as all of them.
                        if q.shape != [q_dim] {
                            q.expect_shape(&[a.head_dim])?;
                        }
                        if k.shape != [kv_dim] {
                            k.expect_shape(&[a.head_dim])?;
                        }
                        Some((norm(&q, spec, numerics)?, norm(&k, spec, numerics)?))
                    }
                };
                // Qwen3-Next's q_proj gives each head's query and then its gate.
                let q_rows = if a.output_gate { 2 * q_dim } else { q_dim };
                SelfAttention::Grouped(Attention {
                    q: linear("attn_q", q_rows, hidden)?,
                    k: linear("attn_k", kv_dim, hidden)?,
                    v: linear("attn_v", kv_dim, hidden)?,
                    o: linear("attn_output", hidden, q_dim)?,
                    qk_norm,
                    rope: Rope::new(a.rope_dim, a.rope_theta, a.rope_style, a.rope_scaling.as_ref()),
                    output_gate: a.output_gate,
                    heads: a.heads,
                    kv_heads: a.kv_heads,
                    head_dim: a.head_dim,
                    window: a.sliding_window[l],
                    sinks: if a.sinks { Some(sinks(&t("attn_sinks.weight")?, a.heads)?) } else { None },
                })
            }
        };
        let ffn = match (&spec.moe, spec.moe_layers[l]) {
            (Some(moe), true) => {
                // GLM-4.5's and MiniMax-M2's routers always have one: without it the choice
                // would quietly differ from the reference, so its absence is a broken file.
                let bias = match spec.architecture.is_sigmoid_gqa() {
                    true => Some(t("exp_probs_b.bias")?),
                    false => opt("exp_probs_b.bias")?,
                };
                let choice_bias = match bias {
                    Some(b) => {
                        b.expect_shape(&[moe.experts])?;
                        Some(b.to_f32()?.to_vec1::<f32>()?)
                    }
                    None => None,
                };
                let router =
                    Router { gate: linear("ffn_gate_inp", moe.experts, hidden)?, routing: moe.routing, choice_bias };
                let shared = match moe.shared_expert_ffn {
                    Some(f) => Some(SharedExpert {
                        expert: Expert::new(
                            linear("ffn_gate_shexp", f, hidden)?,
                            linear("ffn_up_shexp", f, hidden)?,
                            linear("ffn_down_shexp", hidden, f)?,
                        )
                        .with_activation(spec.ffn_activation),
                        gate: opt("ffn_gate_inp_shexp.weight")?.map(|g| ck.linear(&g, None)).transpose()?,
                    }),
                    None => None,
                };
                // Stable LatentMoE (model/latent_moe.rs).
                let latent = match moe.latent {
                    Some(lat) => Some(Box::new(LatentProjection {
                        down: linear("ffn_routed_down", lat.width, hidden)?,
                        norm: match lat.norm {
                            true => Some(RmsNorm::new(&t("ffn_routed_norm.weight")?, spec.rms_norm_eps, numerics)?),
                            false => None,
                        },
                        up: linear("ffn_routed_up", hidden, lat.width)?,
                    })),
                    None => None,
                };
                FeedForward::Moe(MoeBlock { layer: l, router, experts: experts.clone(), shared, latent, numerics })
            }
            _ => FeedForward::Dense(
                Expert::new(
                    linear("ffn_gate", spec.ffn, hidden)?,
                    linear("ffn_up", spec.ffn, hidden)?,
                    linear("ffn_down", hidden, spec.ffn)?,
                )
                .with_activation(spec.ffn_activation),
            ),
        };
        let residual = match spec.attn_res_block {
            Some(_) => {
                let score =
                    |name: &str| residual_score(ck, &format!("blk.{l}.{name}"), hidden, spec.rms_norm_eps, numerics);
                Some(LayerResidual::AttnRes { attention: score("attn_res")?, ffn: score("ffn_res")? })
            }
            None => match &spec.deepseek_v4 {
                Some(v4) => Some(LayerResidual::Hyper {
                    attention: hyper_mix(ck, spec, v4, &format!("blk.{l}.hc_attn"))?,
                    ffn: hyper_mix(ck, spec, v4, &format!("blk.{l}.hc_ffn"))?,
                }),
                None => None,
            },
        };
        Ok(DecoderLayer {
            attn_norm: norm(&t("attn_norm.weight")?, spec, numerics)?,
            attention,
            // llama.cpp names gpt-oss's and Qwen3-Next's norm before the feed-forward
            // `post_attention_norm`.
            ffn_norm: match opt("ffn_norm.weight")? {
                Some(w) => norm(&w, spec, numerics)?,
                None => norm(&t("post_attention_norm.weight")?, spec, numerics)?,
            },
            ffn,
            residual,
        })
    }

    /// Per MoE layer, how well the prefetch guesses matched (decode steps only).
    pub fn prefetch_recall(&self) -> Vec<LayerRecall> {
        self.prefetch.recall.lock().expect("recall lock").iter().filter(|r| r.steps > 0).cloned().collect()
    }

    pub fn reset_prefetch_recall(&self) {
        self.prefetch.recall.lock().expect("recall lock").clear();
    }

    /// At a decode step, layer `l` (MoE) has routed; `h` is its post-attention hidden state.
    /// Score the guesses made for `l`, then guess layer l+1 and prefetch it.
    fn look_ahead(&self, l: usize, h: &Tensor, route: &[usize], cache: &mut SequenceState) -> Result<()> {
        let mut recall = self.prefetch.recall.lock().expect("recall lock");
        if recall.len() < self.layers.len() {
            *recall = (0..self.layers.len()).map(|layer| LayerRecall { layer, ..LayerRecall::default() }).collect();
        }
        if let Some((ahead, last)) = cache.guesses[l].take() {
            let r = &mut recall[l];
            let hits = |g: &[usize]| route.iter().filter(|e| g.contains(e)).count() as u64;
            let used = if r.prefers_last_token() { &last } else { &ahead };
            r.used_hits += hits(used);
            r.lookahead_hits += hits(&ahead);
            r.last_token_hits += hits(&last);
            r.chosen += route.len() as u64;
            r.steps += 1;
        }
        cache.last_routes[l] = route.to_vec();
        let next = l + 1;
        let Some(layer) = self.peek(next) else { return Ok(()) };
        let FeedForward::Moe(moe) = &layer.ffn else { return Ok(()) };
        let n = layer.ffn_norm.forward(h)?;
        let ahead: Vec<usize> = moe.router.route(&n)?[0].experts.iter().map(|(e, _)| *e).collect();
        let last = cache.last_routes[next].clone();
        let guess = if recall[next].prefers_last_token() && !last.is_empty() { &last } else { &ahead };
        let ids: Vec<ExpertId> =
            guess.iter().take(self.prefetch.depth).map(|&expert| ExpertId { layer: next, expert }).collect();
        drop(recall);
        self.experts.prefetch(&ids);
        cache.guesses[next] = Some((ahead, last));
        Ok(())
    }

    /// Verify passes' rows (`(first row, rows)` of `h`, the post-attention state at MoE layer
    /// `l`): guess layer l+1's experts for each row with its router, as [`Transformer::look_ahead`]
    /// does for a decode step, and prefetch the union, so that a verify pass's expert reads
    /// overlap its compute as a decode step's do. (Recall is scored on decode steps only.)
    fn look_ahead_rows(&self, l: usize, h: &Tensor, rows: &[(usize, usize)]) -> Result<()> {
        if rows.is_empty() {
            return Ok(());
        }
        let Some(layer) = self.peek(l + 1) else { return Ok(()) };
        let FeedForward::Moe(moe) = &layer.ffn else { return Ok(()) };
        let mut ids: Vec<ExpertId> = Vec::new();
        for &(first, n) in rows {
            for route in moe.router.route(&layer.ffn_norm.forward(&h.narrow(0, first, n)?)?)? {
                for &(expert, _) in route.experts.iter().take(self.prefetch.depth) {
                    let id = ExpertId { layer: l + 1, expert };
                    if !ids.contains(&id) {
                        ids.push(id);
                    }
                }
            }
        }
        self.experts.prefetch(&ids);
        Ok(())
    }

    /// A new sequence's state: an empty cache or a zero recurrent state per layer (known for a
    /// streamed layer without its weights in memory).
    pub fn new_cache(&self) -> SequenceState {
        SequenceState::new(self.caches.iter().map(CacheKind::state).collect())
    }

    /// Run `tokens` after what `cache` holds; returns the logits `[vocab]` of the last one.
    pub fn forward(&self, tokens: &[u32], cache: &mut SequenceState) -> Result<Tensor> {
        Ok(self.forward_groups(&mut [(cache, tokens)])?.squeeze(0)?)
    }

    /// One step for several sequences together: group `g` runs its tokens after what its cache
    /// holds (one token for a sequence that decodes, a chunk of the prompt for one that
    /// prefills). Each dense weight is read once for the step and each layer's experts once for
    /// the union of the groups' routes; each group gets the results it would get alone. Returns
    /// the logits of each group's last token, `[groups, vocab]`.
    pub fn forward_groups(&self, groups: &mut [(&mut SequenceState, &[u32])]) -> Result<Tensor> {
        let (x, ends) = self.run_groups(groups)?;
        let head = timeline::now();
        let last = ends.iter().map(|&end| x.narrow(0, end - 1, 1)).collect::<Result<Vec<_>, _>>()?;
        let logits = self.lm_head.forward(&self.norm.forward(&Tensor::cat(&last, 0)?)?)?;
        timeline::record("head", 0, None, 0, head);
        Ok(logits)
    }

    /// As [`Transformer::forward_groups`], but a group whose state is in a verify pass
    /// ([`SequenceState::begin_verify`]) gets the logits of each of its tokens `[tokens, vocab]`
    /// (the others of their last, `[1, vocab]`).
    pub fn forward_verify_groups(&self, groups: &mut [(&mut SequenceState, &[u32])]) -> Result<Vec<Tensor>> {
        Ok(self.forward_verify_groups_hidden(groups, &[])?.0)
    }

    /// As [`Transformer::forward_verify_groups`], and for each group `g` with `hidden[g]` the
    /// final hidden state after the final norm of each of its tokens, `[tokens, hidden]` (what
    /// an MTP layer reads, `model/mtp.rs`).
    pub fn forward_verify_groups_hidden(
        &self,
        groups: &mut [(&mut SequenceState, &[u32])],
        hidden: &[bool],
    ) -> Result<(Vec<Tensor>, Vec<Option<Tensor>>)> {
        let verifying: Vec<bool> = groups.iter().map(|(cache, _)| cache.verifying()).collect();
        let (x, ends) = self.run_groups(groups)?;
        let mut states = Vec::with_capacity(groups.len());
        for (g, ((_, t), &end)) in groups.iter().zip(&ends).enumerate() {
            states.push(match hidden.get(g) {
                Some(true) => Some(self.norm.forward(&x.narrow(0, end - t.len(), t.len())?)?),
                _ => None,
            });
        }
        let head = timeline::now();
        let mut rows = Vec::with_capacity(groups.len());
        for (((_, t), &end), verifying) in groups.iter().zip(&ends).zip(verifying) {
            let n = if verifying { t.len() } else { 1 };
            rows.push(x.narrow(0, end - n, n)?);
        }
        let logits = self.lm_head.forward(&self.norm.forward(&Tensor::cat(&rows, 0)?)?)?;
        timeline::record("head", 0, None, 0, head);
        let mut at = 0;
        let logits = rows
            .iter()
            .map(|r| {
                let n = r.dim(0)?;
                at += n;
                Ok(logits.narrow(0, at - n, n)?)
            })
            .collect::<Result<Vec<_>>>()?;
        Ok((logits, states))
    }

    /// The layers over every group's tokens: the final hidden rows `[tokens, hidden]` (groups
    /// one after another) and where each group's rows end.
    fn run_groups(&self, groups: &mut [(&mut SequenceState, &[u32])]) -> Result<(Tensor, Vec<usize>)> {
        if groups.is_empty() || groups.iter().any(|(_, t)| t.is_empty()) {
            return Err(ModelError::EmptyPrompt);
        }
        let tokens: Vec<u32> = groups.iter().flat_map(|(_, t)| t.iter().copied()).collect();
        let mut offsets = Vec::with_capacity(groups.len());
        let mut at = 0;
        for (_, t) in groups.iter() {
            offsets.push(at);
            at += t.len();
        }
        // A pass that is not a verify pass ends the last one's trail (it can no longer be rolled back to).
        for (cache, _) in groups.iter_mut() {
            if !cache.verifying() {
                cache.verify = None;
            }
        }
        let embedded = self.embedding.rows(&tokens)?;
        let mut stream = match &self.hyper {
            Some((n, _)) => ResidualStream::hyper(&embedded, *n)?,
            None => ResidualStream::new(embedded, self.attn_res.as_ref().map(|(b, _)| *b)),
        };
        let prefetching = self.prefetch.depth > 0;
        for l in 0..self.layers.len() {
            let attention = timeline::now();
            let held = self.hold(l)?;
            let layer = held.layer();
            let xn = layer.attn_norm.forward(&stream.before_attention(l, layer.residual.as_ref())?)?;
            let projected = layer.attention.project(&xn)?;
            let mut outs = Vec::with_capacity(groups.len());
            for ((cache, t), &off) in groups.iter_mut().zip(&offsets) {
                let rows = projected.iter().map(|m| m.narrow(0, off, t.len())).collect::<Result<Vec<_>, _>>()?;
                outs.push(attend_group(&layer.attention, &rows, cache, l)?);
            }
            stream.add_attention(&layer.attention.output(&Tensor::cat(&outs, 0)?)?)?;
            let h = stream.current()?;
            timeline::record("attention", l, None, 0, attention);
            let n = layer.ffn_norm.forward(&stream.before_ffn(layer.residual.as_ref())?)?;
            let f = match &layer.ffn {
                FeedForward::Dense(mlp) => mlp.forward(&n, self.numerics)?,
                FeedForward::Moe(moe) => {
                    let routing = timeline::now();
                    let routes = match &self.hash_routes[l] {
                        Some((table, k)) => {
                            let chosen: Vec<&[u32]> =
                                tokens.iter().map(|&t| &table[t as usize * k..(t as usize + 1) * k]).collect();
                            moe.router.route_hashed(&n, &chosen)?
                        }
                        None => moe.router.route(&n)?,
                    };
                    moe.announce(&routes);
                    // Decoding sequences and verify passes guess their next layer's experts
                    // (prefills do not).
                    let mut verify_rows = Vec::new();
                    for ((cache, t), &off) in groups.iter_mut().zip(&offsets) {
                        if prefetching && t.len() == 1 {
                            let route: Vec<usize> = routes[off].experts.iter().map(|(e, _)| *e).collect();
                            self.look_ahead(l, &h.narrow(0, off, 1)?, &route, cache)?;
                        } else if prefetching && cache.verifying() {
                            verify_rows.push((off, t.len()));
                        }
                    }
                    self.look_ahead_rows(l, &h, &verify_rows)?;
                    timeline::record("route", l, None, 0, routing);
                    let experts = timeline::now();
                    let f = moe.forward_routed(&n, &routes)?;
                    timeline::record("experts", l, None, 0, experts);
                    f
                }
            };
            stream.add_ffn(&f)?;
        }
        let x = stream.finish(self.attn_res.as_ref().map(|(_, s)| s), self.hyper.as_ref().map(|(_, h)| h))?;
        let mut ends = Vec::with_capacity(groups.len());
        for ((cache, t), &off) in groups.iter_mut().zip(&offsets) {
            cache.position += t.len();
            ends.push(off + t.len());
        }
        Ok((x, ends))
    }
}

/// One group's attention at layer `l` after what its state holds. A verify pass attends one
/// position at a time, as a decode step does (the same arithmetic, so greedy decoding with drafts
/// gives the tokens it gives without; the projections around it still read each weight once for
/// all positions), keeping each recurrent state it passes; any other pass, a prefill chunk or a
/// decode step, attends all its positions at once.
pub fn attend_group(attention: &SelfAttention, rows: &[Tensor], cache: &mut SequenceState, l: usize) -> Result<Tensor> {
    let start = cache.position;
    let Some(trail) = cache.verify.as_mut().filter(|t| t.start == start) else {
        return attention.attend(rows, start, &mut cache.layers[l]);
    };
    let mut outs = Vec::with_capacity(rows[0].dim(0)?);
    for i in 0..rows[0].dim(0)? {
        let one = rows.iter().map(|m| m.narrow(0, i, 1)).collect::<Result<Vec<_>, _>>()?;
        outs.push(attention.attend(&one, start + i, &mut cache.layers[l])?);
        if let LayerState::Recurrent(state) = &cache.layers[l] {
            trail.states[l].push(state.clone());
        }
    }
    Ok(Tensor::cat(&outs, 0)?)
}

/// Layer `l`'s latent attention. The key/value up-projection comes as transformers' one
/// `kv_b_proj` (`[heads · (nope + v), kv_lora_rank]`, GGUF `attn_kv_b` in older conversions) or
/// as llama.cpp's split `attn_k_b` (`[heads, kv_lora_rank, nope]`, transposed for the absorbed
/// query) and `attn_v_b` (`[heads, v, kv_lora_rank]`).
fn load_mla(ck: &dyn WeightSource, spec: &ModelSpec, l: usize, d: &MlaSpec) -> Result<Mla> {
    let (a, hidden, heads) = (&spec.attention, spec.hidden_size, spec.attention.heads);
    let t = |name: &str| ck.require(&format!("blk.{l}.{name}"));
    let linear = |name: &str, rows: usize, cols: usize| -> Result<Linear> {
        let w = t(&format!("{name}.weight"))?;
        w.expect_shape(&[rows, cols])?;
        ck.linear(&w, None)
    };
    let qk = d.qk_nope_head_dim + d.qk_rope_head_dim;
    let query = match d.q_lora_rank {
        Some(r) => MlaQuery::LowRank {
            a: linear("attn_q_a", r, hidden)?,
            norm: RmsNorm::new(&t("attn_q_a_norm.weight")?, LATENT_NORM_EPS, Numerics::Reference)?,
            b: linear("attn_q_b", heads * qk, r)?,
        },
        None => MlaQuery::Full(linear("attn_q", heads * qk, hidden)?),
    };
    let (k_up, v_up) = match ck.tensor(&format!("blk.{l}.attn_kv_b.weight"))? {
        Some(kv_b) => {
            kv_b.expect_shape(&[heads * (d.qk_nope_head_dim + d.v_head_dim), d.kv_lora_rank])?;
            let kv_b = kv_b.to_f32()?.reshape((heads, d.qk_nope_head_dim + d.v_head_dim, d.kv_lora_rank))?;
            (
                kv_b.narrow(1, 0, d.qk_nope_head_dim)?.contiguous()?,
                kv_b.narrow(1, d.qk_nope_head_dim, d.v_head_dim)?.contiguous()?,
            )
        }
        None => {
            let (k_b, v_b) = (t("attn_k_b.weight")?, t("attn_v_b.weight")?);
            k_b.expect_shape(&[heads, d.kv_lora_rank, d.qk_nope_head_dim])?;
            v_b.expect_shape(&[heads, d.v_head_dim, d.kv_lora_rank])?;
            (k_b.to_f32()?.transpose(1, 2)?.contiguous()?, v_b.to_f32()?)
        }
    };
    let yarn = a.rope_scaling.as_ref();
    Ok(Mla {
        query,
        kv_a: linear("attn_kv_a_mqa", d.kv_lora_rank + d.qk_rope_head_dim, hidden)?,
        kv_norm: RmsNorm::new(&t("attn_kv_a_norm.weight")?, LATENT_NORM_EPS, Numerics::Reference)?,
        k_up,
        v_up,
        o: linear("attn_output", hidden, heads * d.v_head_dim)?,
        gate: if d.output_gate { Some(linear("attn_gate", heads * d.v_head_dim, hidden)?) } else { None },
        rope: Rope::new(d.qk_rope_head_dim, a.rope_theta, a.rope_style, yarn),
        heads,
        dims: *d,
        // transformers' `yarn_apply_mscale`; llama.cpp's deepseek2 kq_scale.
        softmax_scale: (qk as f64).powf(-0.5) * yarn.map_or(1.0, |y| y.softmax_factor()),
    })
}

/// Layer `l`'s DeepSeek-V4 attention (model/sliding_mqa.rs, model/compressor.rs), under the
/// names spec's hf.rs maps from the checkpoint (`attn.wq_a`, `attn.compressor.wkv`, ...).
fn load_sliding_mqa(ck: &dyn WeightSource, spec: &ModelSpec, v4: &DeepseekV4Spec, l: usize) -> Result<SlidingMqa> {
    let (a, hidden) = (&spec.attention, spec.hidden_size);
    let (heads, hd) = (a.heads, a.head_dim);
    let t = |name: &str| ck.require(&format!("blk.{l}.{name}"));
    let linear = |name: &str, rows: usize, cols: usize| -> Result<Linear> {
        let w = t(&format!("{name}.weight"))?;
        w.expect_shape(&[rows, cols])?;
        ck.linear(&w, None)
    };
    let eps = spec.rms_norm_eps;
    let rms = |name: &str, width: usize| -> Result<RmsNorm> {
        let w = t(name)?;
        w.expect_shape(&[width])?;
        Ok(RmsNorm::new(&w, eps, Numerics::Reference)?)
    };
    // DeepSeek's inference/model.py (`Attention.__init__`): a layer with a compressor rotates its
    // queries, keys, compressed entries and indexer with `compress_rope_theta` and YaRN; a purely
    // sliding layer with `rope_theta` and no YaRN.
    let compress_rope =
        || Rope::new(v4.rope_dim, v4.compress_rope_theta, RopeStyle::Interleaved, v4.compress_rope_scaling.as_ref());
    let compressor = |prefix: &str, rate: usize, dim: usize, overlap: bool| -> Result<Compressor> {
        let width = if overlap { 2 * dim } else { dim };
        let ape = t(&format!("{prefix}_ape.weight"))?;
        ape.expect_shape(&[rate, width])?;
        if v4.rope_dim > dim {
            return Err(FormatError::Unsupported {
                what: format!("a compressor of {dim}-wide entries under a {}-wide rotation", v4.rope_dim),
                hint: "the rotation covers the end of each entry".into(),
            }
            .into());
        }
        Ok(Compressor {
            kv: linear(&format!("{prefix}_kv"), width, hidden)?,
            gate: linear(&format!("{prefix}_gate"), width, hidden)?,
            position_bias: ape.to_f32()?.flatten_all()?.to_vec1()?,
            norm: rms(&format!("{prefix}_norm.weight"), dim)?,
            rate,
            dim,
            overlap,
            rope: compress_rope(),
            rope_dim: v4.rope_dim,
        })
    };
    let (compressed, rope) = match v4.kinds[l] {
        V4AttentionKind::Sliding => {
            (Compressed::None, Rope::new(v4.rope_dim, a.rope_theta, RopeStyle::Interleaved, None))
        }
        V4AttentionKind::HeavilyCompressed { rate } => {
            (Compressed::All(compressor("attn_compressor", rate, hd, false)?), compress_rope())
        }
        V4AttentionKind::CompressedSparse { rate } => {
            let indexer = Indexer {
                compressor: compressor("indexer_compressor", rate, v4.index_head_dim, true)?,
                q_b: linear("indexer.attn_q_b", v4.index_heads * v4.index_head_dim, v4.q_lora_rank)?,
                weights: linear("indexer.proj", v4.index_heads, hidden)?,
                heads: v4.index_heads,
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
    let out_a = t("attn_output_a.weight")?;
    out_a.expect_shape(&[groups * rank, heads * hd / groups])?;
    Ok(SlidingMqa {
        q_a: linear("attn_q_a", v4.q_lora_rank, hidden)?,
        q_norm: rms("attn_q_a_norm.weight", v4.q_lora_rank)?,
        q_b: linear("attn_q_b", heads * hd, v4.q_lora_rank)?,
        kv: linear("attn_kv", hd, hidden)?,
        kv_norm: rms("attn_kv_a_norm.weight", hd)?,
        out_a: out_a.to_f32()?.reshape((groups, rank, heads * hd / groups))?,
        out_b: linear("attn_output_b", hidden, groups * rank)?,
        sinks: sinks(&t("attn_sinks.weight")?, heads)?.to_vec1()?,
        rope,
        rope_dim: v4.rope_dim,
        heads,
        head_dim: hd,
        window: v4.sliding_window,
        eps: eps as f32,
        compressed,
    })
}

/// One hyper-connection mixing point (`{prefix}_fn`, `_base`, `_scale`).
fn hyper_mix(ck: &dyn WeightSource, spec: &ModelSpec, v4: &DeepseekV4Spec, prefix: &str) -> Result<HyperMix> {
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

/// The hyper-connection head (`output_hc_fn`, `_base`, `_scale`).
fn hyper_head(ck: &ModelFile, spec: &ModelSpec, v4: &DeepseekV4Spec) -> Result<HyperHead> {
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

/// A hash-routed layer's `tid2eid` rows, flat, and the experts per token.
type HashTable = (Vec<u32>, usize);

/// Per layer, DeepSeek-V4's token-id → experts table where the layer is hash-routed: `[vocab,
/// top_k]` ids below the expert count, or an error naming the tensor and the file.
fn hash_routes(ck: &ModelFile, spec: &ModelSpec) -> Result<Vec<Option<HashTable>>> {
    let (Some(v4), Some(moe)) = (&spec.deepseek_v4, &spec.moe) else { return Ok(vec![None; spec.layers]) };
    let k = moe.routing.top_k();
    (0..spec.layers)
        .map(|l| {
            if !v4.hash_layers[l] {
                return Ok(None);
            }
            let name = format!("blk.{l}.ffn_gate_tid2eid.weight");
            let (table, shape) = match ck.index_table(&name)? {
                Some(t) => t,
                // Absent: `require`'s error names it as the file would.
                None => {
                    ck.require(&name)?;
                    return Err(FormatError::MissingTensor { name }.into());
                }
            };
            if shape != [spec.vocab_size, k] || table.iter().any(|&e| e as usize >= moe.experts) {
                return Err(FormatError::BadMetadata {
                    key: name,
                    reason: format!("shape {shape:?}: [{}, {k}] ids below {} expected", spec.vocab_size, moe.experts),
                }
                .into());
            }
            Ok(Some((table, k)))
        })
        .collect()
}

/// A layer's RMSNorm, its weight taken as 1 + w where the file stores Qwen3-Next's
/// zero-centred w.
pub fn norm(weight: &TensorView<'_>, spec: &ModelSpec, numerics: Numerics) -> Result<RmsNorm> {
    let n = RmsNorm::new(weight, spec.rms_norm_eps, numerics)?;
    if spec.zero_centered_norms { Ok(n.plus_one()?) } else { Ok(n) }
}

/// One AttnRes mixing point's weights: `{name}_norm.weight` `[hidden]` and the score row
/// `{name}_proj.weight` `[1, hidden]` (model/attn_res.rs).
fn residual_score(
    ck: &dyn WeightSource,
    name: &str,
    hidden: usize,
    eps: f64,
    numerics: Numerics,
) -> Result<ResidualScore> {
    // llama.cpp's kimi-k3 GGUF holds only the product of the norm's weight and the projection
    // (convert_hf_to_gguf.py KimiK3Model `_try_fuse_res`), which its `res_mix` multiplies into
    // the unweighted norm and sums: that order is the norm weighted by the product, then a
    // projection of ones.
    if let Some(score) = ck.tensor(&format!("{name}_score.weight"))? {
        score.expect_shape(&[hidden])?;
        let ones = candle_core::Tensor::ones(hidden, candle_core::DType::F32, &candle_core::Device::Cpu)?;
        return ResidualScore::new(RmsNorm::new(&score, eps, numerics)?, ones);
    }
    let proj = ck.require(&format!("{name}_proj.weight"))?;
    proj.expect_shape(&[1, hidden])?;
    ResidualScore::new(RmsNorm::new(&ck.require(&format!("{name}_norm.weight"))?, eps, numerics)?, proj.to_f32()?)
}
