//! The decoder stack: the embedding, the layers (resident, or streamed through a [`LayerStore`]),
//! a final norm and the output head; one pass over any number of sequences, with the next
//! layer's experts guessed and prefetched while a layer computes.

use std::sync::{Arc, Mutex};

use candle_core::Tensor;
use nightmail_formats::{ExpertId, Format, ModelFile};
use nightmail_tensor::{Linear, Numerics, RmsNorm, TensorError};

use crate::dense::{HeldLayer, LayerBuilder, LayerStore};
use crate::error::{ModelError, Result};
use crate::layer::{CacheKind, DecoderLayer, FeedForward, attend_group};
use crate::mtp::Mtp;
use crate::parts::attn_res::{ResidualScore, ResidualStream};
use crate::parts::embedding::Embedding;
use crate::parts::expert::ExpertStore;
use crate::parts::hyper::HyperHead;
use crate::parts::norm::norm;
use crate::parts::router::{HashTable, hash_routes};
use crate::source::{Recorded, Recording};
use crate::spec::ModelSpec;
use crate::state::SequenceState;
use crate::timeline;

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
        // and serves the embedding's rows; else they are read from the file (`parts/embedding.rs`).
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
                let layer = DecoderLayer::load(&source, spec, numerics, ck.format(), &experts, l)?;
                recorded.push(Some(source.take()));
                layer
            } else {
                recorded.push(None);
                DecoderLayer::load(ck, spec, numerics, ck.format(), &experts, l)?
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
                Some(block) => {
                    Some((block, ResidualScore::load(ck, "output_res", hidden, spec.rms_norm_eps, numerics)?))
                }
                None => None,
            },
            hyper: match &spec.deepseek_v4 {
                Some(v4) => Some((v4.hc_mult, HyperHead::load(ck, spec, v4)?)),
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
        Arc::new(move |source, l| DecoderLayer::load(source, &spec, numerics, format, &experts, l))
    }

    /// Loads the model's first multi-token-prediction layer (`mtp.rs`) from `ck`, its
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

    /// Verify passes' and prefills' rows (`(first row, rows)` of `h`, the post-attention state at
    /// MoE layer `l`): guess layer l+1's experts for each row with its router, as
    /// [`Transformer::look_ahead`] does for a decode step, and prefetch the union, so that a wide
    /// pass's expert reads overlap its compute as a decode step's do. (Recall is scored on decode
    /// steps only.)
    fn look_ahead_rows(&self, l: usize, h: &Tensor, rows: &[(usize, usize)]) -> Result<()> {
        if rows.is_empty() {
            return Ok(());
        }
        let Some(layer) = self.peek(l + 1) else { return Ok(()) };
        let FeedForward::Moe(moe) = &layer.ffn else { return Ok(()) };
        let experts = moe.routed_experts;
        // Rows that choose `depth` experts each, uniformly, leave a given expert out with
        // probability (1 - depth/E)^rows: below 1e-3 (a prefill pass's hundreds of rows), every
        // expert is guessed without running the next layer's router.
        let depth = self.prefetch.depth.min(moe.router.routing.top_k());
        let all_rows: usize = rows.iter().map(|r| r.1).sum();
        if experts > 0 && (1.0 - depth as f64 / experts as f64).powi(all_rows.min(1 << 20) as i32) < 1e-3 {
            let ids: Vec<ExpertId> = (0..experts).map(|expert| ExpertId { layer: l + 1, expert }).collect();
            self.experts.prefetch(&ids);
            return Ok(());
        }
        let (mut ids, mut guessed) = (Vec::new(), vec![false; experts]);
        for &(first, n) in rows {
            for route in moe.router.route(&layer.ffn_norm.forward(&h.narrow(0, first, n)?)?)? {
                for &(expert, _) in route.experts.iter().take(self.prefetch.depth) {
                    if !std::mem::replace(&mut guessed[expert], true) {
                        ids.push(ExpertId { layer: l + 1, expert });
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
    /// an MTP layer reads, `mtp.rs`).
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
                    // Every row guesses its next layer's experts: a decoding sequence's, and a
                    // verify pass's or a prefill's (whose union is read while this layer computes
                    // rather than after it routes).
                    let mut verify_rows = Vec::new();
                    for ((cache, t), &off) in groups.iter_mut().zip(&offsets) {
                        if prefetching && t.len() == 1 {
                            let route: Vec<usize> = routes[off].experts.iter().map(|(e, _)| *e).collect();
                            self.look_ahead(l, &h.narrow(0, off, 1)?, &route, cache)?;
                        } else if prefetching {
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
