//! One memory budget for a whole model: what stays resident and what streams. Tensors read for
//! every token come first, the most disk bytes saved per byte of RAM first (every dense layer
//! saves its whole size each token; a routed expert only when chosen, k/E of the tokens), so
//! dense layers go before the expert cache. The dense layers left over stream in layer order
//! through a window of two layers (one read while the other computes), or one where two do not
//! fit; the experts get the rest as their cache. The token embedding is not resident: a token
//! reads one row of it (`nightmail-model/src/parts/embedding.rs` reads rows from the file, or from the head where
//! the two are tied), the least benefit per byte of any tensor, so only the head is counted.

use crate::error::EngineError;
use std::collections::BTreeMap;

use serde::Serialize;

use super::dense::copied_bytes;
use crate::error::Result;
use nightmail_formats::{ModelFile, is_expert_tensor, is_mtp_tensor, layer_of};
use nightmail_model::aligned_span;
use nightmail_model::spec::ModelSpec;
use nightmail_tensor::Numerics;

/// The memory a model may take, and the context its key/value cache is kept for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemoryBudget {
    pub bytes: usize,
    /// Tokens of key/value cache reserved per sequence.
    pub kv_tokens: usize,
    /// Sequences decoded together: each has its cache, and a step reads the union of their
    /// routes' experts at once.
    pub batch: usize,
    /// Rows each sequence runs in the widest pass: 1, or for a model that verifies drafts,
    /// 1 + the most guesses a verify pass checks. Rows of one sequence share its cache (they are
    /// its next positions) but each routes, so a step's experts are the union of
    /// `batch × verify_rows` routes.
    pub verify_rows: usize,
    /// Stream exactly these dense layers (the others resident) instead of the plan's choice:
    /// to measure the stream itself, or test it on models small enough to keep whole.
    pub stream_layers: Option<Vec<usize>>,
}

impl MemoryBudget {
    /// `mb` MiB, with the cache reserved for 4096 tokens (or the model's context, if shorter).
    pub fn mb(mb: usize) -> Self {
        MemoryBudget { bytes: mb << 20, kv_tokens: DEFAULT_KV_TOKENS, batch: 1, verify_rows: 1, stream_layers: None }
    }
}

pub const DEFAULT_KV_TOKENS: usize = 4096;

/// Of a memory budget, the share kept for one pass's activations at most.
pub const ACTIVATION_SHARE: usize = 8;

impl MemoryBudget {
    /// Routes a step runs at most: every row of every sequence.
    pub fn rows_per_step(&self) -> usize {
        self.batch.max(1) * self.verify_rows.max(1)
    }
}

/// One dense layer's sizes.
#[derive(Debug, Clone, Serialize)]
pub struct LayerSize {
    pub layer: usize,
    /// Bytes in the file (what streaming it reads per token, widened to aligned blocks).
    pub disk_bytes: usize,
    /// Memory it takes resident (`Linear::new` copies, f32 conversions).
    pub resident_bytes: usize,
    /// Memory it takes while streamed: read buffers plus the copies its kernels make.
    pub stream_bytes: usize,
}

/// The multi-token-prediction layer a checkpoint ships (`nightmail-model/src/mtp.rs`), counted apart from the
/// model's layers: its dense weights stay resident beside the head, and its routed
/// experts share the model's cache. Counted whenever the checkpoint holds the layer, so that a
/// budget holds with `draft = "mtp"` (a model that never drafts with it reserves its dense bytes
/// for nothing: about 1% of DeepSeek-V3).
#[derive(Debug, Clone, Serialize)]
pub struct MtpSize {
    pub layer: usize,
    /// Memory its dense weights take resident (its embedding, read from the file as the model's
    /// is, and a copy of the model's head, which it shares, not counted).
    pub resident_bytes: usize,
    /// Its routed experts' bytes on disk (streamed with the model's).
    pub expert_bytes: usize,
}

/// A model's sizes, from its tensor headers alone.
#[derive(Debug, Clone, Serialize)]
pub struct ModelSizes {
    pub layers: Vec<LayerSize>,
    /// The output head (the embedding's table where the two are tied: one copy serves both),
    /// the final norm and the model's other tensors outside its layers: always resident.
    pub fixed_bytes: usize,
    /// The token embedding's bytes in the file: not resident (`nightmail-model/src/parts/embedding.rs`).
    pub embedding_bytes: usize,
    /// One row of it, what each token reads (from the file, or the tied head).
    pub embedding_row_bytes: usize,
    /// The output head is the embedding's table (counted once, in `fixed_bytes`).
    pub embedding_tied: bool,
    pub expert_bytes: usize,
    /// The largest expert's read buffers.
    pub expert_max_bytes: usize,
    /// Experts each MoE layer runs per token, and MoE layers.
    pub top_k: usize,
    pub experts_per_layer: usize,
    pub moe_layers: usize,
    /// Key/value bytes per token of one sequence (attention layers only).
    pub kv_bytes_per_token: usize,
    /// Bytes of one sequence's fixed-size state (KDA layers' recurrent state and convolution
    /// tail), whatever its length.
    pub state_bytes: usize,
    pub context_length: usize,
    /// The MTP layer, where the checkpoint ships one; `expert_bytes` above excludes its experts.
    pub mtp: Option<MtpSize>,
    /// One prompt token's activations in a pass ([`crate::prefill::activation_bytes_per_token`]),
    /// what each position adds to a query row's attention scores, and how many query rows' scores
    /// are alive at once ([`crate::prefill::pass_activation_bytes`]): the room a pass needs beside
    /// the weights; and what each position costs a pass of several rows whatever its width
    /// (latent attention's keys and values up-projected for the pass).
    pub activation_bytes_per_token: usize,
    pub activation_bytes_per_position: usize,
    pub attention_score_rows: usize,
    pub pass_bytes_per_position: usize,
}

impl ModelSizes {
    /// Routed-expert bytes the cache may hold: the model's and the MTP layer's.
    pub fn cached_expert_bytes(&self) -> usize {
        self.expert_bytes + self.mtp.as_ref().map_or(0, |m| m.expert_bytes)
    }

    pub fn read(ck: &ModelFile, spec: &ModelSpec) -> Result<Self> {
        let mut layers: BTreeMap<usize, LayerSize> = (0..spec.layers)
            .map(|l| (l, LayerSize { layer: l, disk_bytes: 0, resident_bytes: 0, stream_bytes: 0 }))
            .collect();
        let (mut fixed, mut experts) = (0, 0);
        let mut has_output = false;
        // The embedding's resident size (counted as the head where tied), bytes and one row.
        let (mut embedding, mut embedding_bytes, mut embedding_row_bytes) = (0, 0, 0);
        let mut mtp = nightmail_model::nextn::shipped_layer(ck, spec)?.map(|layer| MtpSize {
            layer,
            resident_bytes: 0,
            expert_bytes: 0,
        });
        // Only the first MTP layer is ever loaded: `blk.N.` / `model.layers.N.`, or Qwen3-Next's
        // own parts and `mtp.layers.0.`.
        let first_mtp = |name: &str| match name.strip_prefix("mtp.") {
            Some(rest) => layer_of(rest).is_none_or(|k| k == 0),
            None => layer_of(name) == Some(spec.layers),
        };
        for t in ck.all_tensors()? {
            let len = t.bytes.len();
            if is_mtp_tensor(&t.name, spec.layers) {
                if let Some(m) = mtp.as_mut().filter(|_| first_mtp(&t.name)) {
                    if is_expert_tensor(&t.name) {
                        m.expert_bytes += len;
                    } else {
                        m.resident_bytes += copied_bytes(t.dtype, &t.shape, len, false);
                    }
                }
                continue;
            }
            if is_expert_tensor(&t.name) {
                experts += len;
                continue;
            }
            let resident = copied_bytes(t.dtype, &t.shape, len, false);
            match layer_of(&t.name).and_then(|l| layers.get_mut(&l)) {
                Some(size) => {
                    let disk = aligned_span(0, len);
                    size.disk_bytes += disk;
                    size.resident_bytes += resident;
                    size.stream_bytes += disk + copied_bytes(t.dtype, &t.shape, len, true);
                }
                None if t.name == "token_embd.weight" || t.name.ends_with("embed_tokens.weight") => {
                    embedding = resident;
                    embedding_bytes = len;
                    embedding_row_bytes = len / t.shape.first().copied().unwrap_or(1).max(1);
                }
                None => {
                    fixed += resident;
                    has_output |= t.name == "output.weight" || t.name.ends_with("lm_head.weight");
                }
            }
        }
        // Tied embeddings: the head is the embedding's table, resident once.
        if !has_output {
            fixed += embedding;
        }
        // The MTP layer's embedding is never resident, and it shares copies of the model's head
        // (`mtp::own_copy`).
        if let Some(m) = &mut mtp {
            let embd = ck.require("token_embd.weight")?;
            let head = ck.tensor("output.weight")?.unwrap_or_else(|| embd.clone());
            for (name, model) in [("embed_tokens", &embd), ("shared_head_head", &head)] {
                if let Some(w) = ck.tensor(&format!("blk.{}.nextn.{name}.weight", m.layer))?
                    && (name == "embed_tokens" || nightmail_model::mtp::own_copy(ck, spec, name, model)?.is_none())
                {
                    m.resident_bytes =
                        m.resident_bytes.saturating_sub(copied_bytes(w.dtype, &w.shape, w.bytes.len(), false));
                }
            }
        }
        let a = &spec.attention;
        let numerics = match ck.tensor("blk.0.attn_q.weight")? {
            Some(q) if a.mla.is_none() && a.rope_scaling.is_none() && !a.sinks && !a.output_gate => {
                Numerics::for_weights(q.dtype)
            }
            _ => Numerics::Reference,
        };
        let kv_per_layer = match (&a.mla, numerics) {
            (Some(m), _) => {
                let index = spec.sparse_attention.as_ref().map_or(0, |d| d.head_dim);
                (m.kv_lora_rank + m.qk_rope_head_dim + index) * 4
            }
            (None, Numerics::Ggml) => 2 * a.kv_heads * a.head_dim * 2,
            (None, Numerics::Reference) => 2 * a.kv_heads * a.head_dim * 4,
        };
        // A KDA layer keeps f32 S per head and its convolution's last inputs instead of rows.
        let kda_layers = (0..spec.layers).filter(|&l| spec.is_kda(l)).count();
        let state_bytes = spec.kda.as_ref().map_or(0, |k| {
            let width = k.heads * k.head_dim;
            (k.heads * k.head_dim * k.head_dim + (k.conv_kernel - 1) * 3 * width) * 4 * kda_layers
        });
        // So does a Gated DeltaNet layer (value heads × k_dim × v_dim).
        let delta_layers = (0..spec.layers).filter(|&l| spec.is_delta_net(l)).count();
        let state_bytes = state_bytes
            + spec.delta_net.as_ref().map_or(0, |d| {
                (d.v_heads * d.k_head_dim * d.v_head_dim + (d.conv_kernel - 1) * d.conv_channels()) * 4 * delta_layers
            });
        let moe_layers = spec.moe_layers.iter().filter(|m| **m).count();
        let (top_k, experts_per_layer) = spec.moe.as_ref().map_or((0, 0), |m| (m.routing.top_k(), m.experts));
        let expert_count = moe_layers * experts_per_layer;
        // Each expert's matrices and biases (up to six reads) are widened to aligned blocks.
        let expert_max_bytes = experts.checked_div(expert_count).map_or(0, |b| b + 6 * 2 * nightmail_tensor::ALIGN);
        Ok(ModelSizes {
            layers: layers.into_values().collect(),
            fixed_bytes: fixed,
            embedding_bytes,
            embedding_row_bytes,
            embedding_tied: !has_output,
            expert_bytes: experts,
            expert_max_bytes,
            top_k,
            experts_per_layer,
            moe_layers,
            kv_bytes_per_token: kv_per_layer * (spec.layers - kda_layers - delta_layers),
            state_bytes,
            context_length: spec.context_length,
            mtp,
            activation_bytes_per_token: crate::prefill::activation_bytes_per_token(spec),
            activation_bytes_per_position: crate::prefill::score_bytes_per_position(spec),
            attention_score_rows: crate::prefill::score_rows(spec),
            pass_bytes_per_position: crate::prefill::pass_bytes_per_position(spec),
        })
    }
}

/// What stays in RAM and what streams, for one budget.
#[derive(Debug, Clone, Serialize)]
pub struct MemoryPlan {
    pub budget_bytes: usize,
    /// The least budget the model runs in: the head, the key/value cache, the largest
    /// layer streamed, and one layer's routed experts in flight.
    pub minimum_bytes: usize,
    /// The output head and final norm (`ModelSizes::fixed_bytes`; not the embedding).
    pub fixed_bytes: usize,
    /// The MTP layer's dense weights, resident (0 without one: `ModelSizes::mtp`).
    pub mtp_bytes: usize,
    pub kv_bytes: usize,
    pub resident_layers: Vec<usize>,
    pub resident_layer_bytes: usize,
    pub streamed_layers: Vec<usize>,
    /// The read-ahead window of streamed layers (0 when none streams).
    pub window_bytes: usize,
    /// The expert cache, or every expert (the MTP layer's too) when `experts_resident`.
    pub expert_cache_bytes: usize,
    /// Kept for a pass's activations, routing and scores (a prefill sizes its passes to it):
    /// out of the budget, so a pass does not take RAM beyond it.
    pub activation_bytes: usize,
    /// Of the expert cache, what a decode step keeps at least: its routes' union in two layers
    /// (the one computing and the next, read ahead). A long prefill lends the rest to its passes
    /// ([`crate::prefill::cache_bytes_for_pass`]).
    pub look_ahead_bytes: usize,
    pub experts_resident: bool,
    /// Dense bytes read from disk per step (the streamed layers).
    pub dense_disk_bytes_per_token: usize,
    /// Routed-expert bytes a token needs (top-k in every MoE layer), before the cache.
    pub expert_bytes_per_token: usize,
    pub sizes: ModelSizes,
}

impl MemoryPlan {
    pub fn new(sizes: ModelSizes, budget: MemoryBudget) -> Result<Self> {
        let batch = budget.batch.max(1);
        let kv =
            (budget.kv_tokens.min(sizes.context_length.max(1)) * sizes.kv_bytes_per_token + sizes.state_bytes) * batch;
        let rows = budget.rows_per_step();
        // A step's experts are all read and alive at once: the union of its rows' routes (every
        // sequence's, and every verify row's).
        let in_flight = (sizes.top_k * rows).min(sizes.experts_per_layer) * sizes.expert_max_bytes;
        let all_layers: usize = sizes.layers.iter().map(|l| l.resident_bytes).sum();
        let forced = budget.stream_layers.as_ref().map(|set| {
            let streams = |l: &&LayerSize| set.contains(&l.layer);
            let pinned: usize = sizes.layers.iter().filter(|l| !streams(l)).map(|l| l.resident_bytes).sum();
            let largest = sizes.layers.iter().filter(streams).map(|l| l.stream_bytes).max().unwrap_or(0);
            (pinned, largest)
        });
        let largest = match forced {
            Some((_, largest)) => largest,
            None => sizes.layers.iter().map(|l| l.stream_bytes).max().unwrap_or(0),
        };
        // The dense part at its smallest: one layer streamed, or every layer kept when that is
        // less (small models, whose read buffers' alignment outweighs them).
        let dense_minimum = match forced {
            Some((pinned, largest)) => pinned + largest,
            None => largest.min(all_layers),
        };
        let mtp = sizes.mtp.as_ref().map_or(0, |m| m.resident_bytes);
        let minimum = sizes.fixed_bytes + mtp + kv + dense_minimum + in_flight;
        if budget.bytes < minimum {
            return Err(EngineError::MemoryBudget {
                budget_mb: budget.bytes as f64 / MIB,
                minimum_mb: (minimum as f64 / MIB).ceil() as usize,
                detail: format!(
                    "output head and norm {:.1} MiB{}, key/value cache for {batch} x {} tokens {:.1} MiB, dense \
                     layers {:.1} MiB (the largest streamed), {} routed experts in flight {:.1} MiB",
                    sizes.fixed_bytes as f64 / MIB,
                    if mtp > 0 { format!(", MTP layer {:.1} MiB", mtp as f64 / MIB) } else { String::new() },
                    budget.kv_tokens.min(sizes.context_length.max(1)),
                    kv as f64 / MIB,
                    dense_minimum as f64 / MIB,
                    (sizes.top_k * rows).min(sizes.experts_per_layer),
                    in_flight as f64 / MIB
                ),
            });
        }
        // While a layer computes, the store reads the next layer's guessed experts (queued only
        // while the cache holds them beside the layer computing: `stream/expert_cache/`), so the
        // cache is given, before any dense layer goes resident, room for the expected union of
        // the step's routes in two layers, as far as the budget has it beyond its minimum.
        let union = uniform_union(sizes.top_k, sizes.experts_per_layer, rows).ceil() as usize;
        // A pass's activations come out of the budget too, before the cache and the dense layers:
        // an eighth of it at most, no more than the widest pass at the reserved context needs.
        let span = budget.kv_tokens.min(sizes.context_length.max(1));
        let widest = crate::prefill::pass_activation_bytes(&sizes, crate::prefill::MAX_PREFILL_TOKENS.min(span), span);
        let activations = (budget.bytes / ACTIVATION_SHARE).min(widest).min(budget.bytes - minimum);
        let look_ahead =
            (2 * union * sizes.expert_max_bytes).max(in_flight).min(budget.bytes - minimum - activations + in_flight);
        let mut left = budget.bytes - sizes.fixed_bytes - mtp - kv - look_ahead - activations;
        let (mut resident, mut streamed) = (Vec::new(), Vec::new());
        let window = if let (Some(set), Some((pinned, _))) = (&budget.stream_layers, forced) {
            left -= pinned;
            for s in &sizes.layers {
                (if set.contains(&s.layer) { &mut streamed } else { &mut resident }).push(s.layer);
            }
            let window = if streamed.is_empty() {
                0
            } else if left >= 2 * largest + largest / 2 {
                2 * largest
            } else {
                largest
            };
            left -= window;
            window
        } else if all_layers <= left {
            resident = sizes.layers.iter().map(|l| l.layer).collect();
            left -= all_layers;
            0
        } else {
            let window = if left >= 2 * largest + largest / 2 { 2 * largest } else { largest };
            left -= window;
            // Most disk bytes saved per resident byte first; then the smaller (more of them fit);
            // then spread over the stack (0, L/2, L/4, 3L/4...: bit-reversed order), so that the
            // resident layers computed between two streamed ones are few and the reader, at most
            // a window ahead, never idles through a long resident run.
            let mut order: Vec<&LayerSize> = sizes.layers.iter().collect();
            let bits = usize::BITS - sizes.layers.len().saturating_sub(1).leading_zeros();
            let spread = |l: usize| l.reverse_bits().checked_shr(usize::BITS - bits).unwrap_or(0);
            order.sort_by(|a, b| {
                let gain = |s: &LayerSize| s.disk_bytes as f64 / s.resident_bytes.max(1) as f64;
                gain(b)
                    .total_cmp(&gain(a))
                    .then(a.resident_bytes.cmp(&b.resident_bytes))
                    .then(spread(a.layer).cmp(&spread(b.layer)))
            });
            for s in order {
                if s.resident_bytes <= left {
                    left -= s.resident_bytes;
                    resident.push(s.layer);
                } else {
                    streamed.push(s.layer);
                }
            }
            resident.sort_unstable();
            streamed.sort_unstable();
            window
        };
        let expert_cache = left + look_ahead;
        let experts_resident = expert_cache >= sizes.cached_expert_bytes();
        let resident_layer_bytes = resident.iter().map(|&l| sizes.layers[l].resident_bytes).sum();
        let dense_disk = streamed.iter().map(|&l| sizes.layers[l].disk_bytes).sum();
        let expert_per_token = (sizes.expert_bytes * sizes.top_k).checked_div(sizes.experts_per_layer).unwrap_or(0);
        Ok(MemoryPlan {
            budget_bytes: budget.bytes,
            minimum_bytes: minimum,
            fixed_bytes: sizes.fixed_bytes,
            mtp_bytes: mtp,
            kv_bytes: kv,
            resident_layers: resident,
            resident_layer_bytes,
            streamed_layers: streamed,
            window_bytes: window,
            expert_cache_bytes: if experts_resident { sizes.cached_expert_bytes() } else { expert_cache },
            experts_resident,
            activation_bytes: activations,
            look_ahead_bytes: look_ahead,
            dense_disk_bytes_per_token: dense_disk,
            expert_bytes_per_token: expert_per_token,
            sizes,
        })
    }

    /// Per layer, whether it streams.
    /// The share of a token's routed experts expected in the cache (uniform routing).
    pub fn expert_hit_rate(&self) -> f64 {
        if self.experts_resident || self.sizes.expert_bytes == 0 {
            1.0
        } else {
            (self.expert_cache_bytes as f64 / self.sizes.cached_expert_bytes() as f64).min(1.0)
        }
    }

    /// One routed expert's bytes (the experts' total over their count).
    pub fn one_expert_bytes(&self) -> f64 {
        let s = &self.sizes;
        if s.experts_per_layer > 0 {
            s.expert_bytes as f64 / (s.experts_per_layer * s.moe_layers.max(1)) as f64
        } else {
            0.0
        }
    }

    /// Bytes read from disk per step of `batch` sequences: the streamed layers, and the experts
    /// of the union of `batch` independent uniform routes that miss the cache.
    pub fn disk_bytes_per_step(&self, batch: usize) -> f64 {
        self.dense_disk_bytes_per_token as f64 + self.expert_bytes_per_step(batch) * (1.0 - self.expert_hit_rate())
    }

    /// Routed-expert bytes a step of `batch` sequences runs: each MoE layer's distinct experts
    /// for `batch` independent uniform routes, `E·(1 − (1 − k/E)^batch)` of them.
    pub fn expert_bytes_per_step(&self, batch: usize) -> f64 {
        self.distinct_experts(batch) * self.one_expert_bytes() * self.sizes.moe_layers as f64
    }

    /// Distinct experts a MoE layer runs for `batch` independent uniform routes.
    pub fn distinct_experts(&self, batch: usize) -> f64 {
        uniform_union(self.sizes.top_k, self.sizes.experts_per_layer, batch)
    }

    pub fn streamed_mask(&self) -> Vec<bool> {
        let mut mask = vec![false; self.sizes.layers.len()];
        for &l in &self.streamed_layers {
            mask[l] = true;
        }
        mask
    }
}

const MIB: f64 = (1 << 20) as f64;

/// Distinct experts of a layer of `experts` that `routes` independent uniform top-`top_k`
/// routes choose, in expectation: `E·(1 − (1 − k/E)^routes)`.
fn uniform_union(top_k: usize, experts: usize, routes: usize) -> f64 {
    let (e, k) = (experts as f64, top_k as f64);
    if e > 0.0 { e * (1.0 - (1.0 - k / e).powi(routes as i32)) } else { 0.0 }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sizes(layers: usize, layer: usize) -> ModelSizes {
        ModelSizes {
            layers: (0..layers)
                .map(|l| LayerSize { layer: l, disk_bytes: layer, resident_bytes: layer, stream_bytes: 2 * layer })
                .collect(),
            fixed_bytes: 1000,
            embedding_bytes: 0,
            embedding_row_bytes: 0,
            embedding_tied: false,
            expert_bytes: 64_000,
            expert_max_bytes: 1000,
            top_k: 2,
            experts_per_layer: 8,
            moe_layers: layers,
            kv_bytes_per_token: 10,
            state_bytes: 0,
            context_length: 100,
            mtp: None,
            // No room for activations unless a test asks: the figures below are the weights'.
            activation_bytes_per_token: 0,
            activation_bytes_per_position: 0,
            attention_score_rows: 1,
            pass_bytes_per_position: 0,
        }
    }

    #[test]
    fn a_pass_s_activations_come_out_of_the_budget_before_the_cache() {
        let mut s = sizes(8, 10_000);
        s.activation_bytes_per_token = 100;
        let budget = |bytes| MemoryBudget { bytes, kv_tokens: 100, ..MemoryBudget::mb(0) };
        let plan = MemoryPlan::new(s.clone(), budget(120_000)).unwrap();
        // The widest pass (100 tokens × 100 bytes), less than an eighth of the budget.
        assert_eq!(plan.activation_bytes, 10_000);
        let held = plan.fixed_bytes + plan.kv_bytes + plan.resident_layer_bytes + plan.window_bytes;
        assert!(held + plan.expert_cache_bytes + plan.activation_bytes <= plan.budget_bytes, "{plan:?}");
        let without = MemoryPlan::new(sizes(8, 10_000), budget(120_000)).unwrap();
        assert!(!plan.experts_resident && !without.experts_resident);
        let without_held = without.fixed_bytes + without.kv_bytes + without.resident_layer_bytes + without.window_bytes;
        assert_eq!(held + plan.expert_cache_bytes + 10_000, without_held + without.expert_cache_bytes);
        // At the minimum nothing is left to keep.
        let minimum = plan.minimum_bytes;
        assert_eq!(MemoryPlan::new(s, budget(minimum)).unwrap().activation_bytes, 0);
    }

    #[test]
    fn dense_layers_go_resident_before_the_expert_cache_and_the_rest_stream() {
        // Eight layers that stream without copies (Q4_0): 10_000 bytes resident or in flight.
        let mut s = sizes(8, 10_000);
        s.layers.iter_mut().for_each(|l| l.stream_bytes = 10_000);
        // minimum: 1000 fixed + 1000 kv + 10_000 largest streamed + 2000 in flight.
        let plan = MemoryPlan::new(
            s.clone(),
            MemoryBudget { bytes: 14_000, kv_tokens: 100, batch: 1, verify_rows: 1, stream_layers: None },
        )
        .unwrap();
        assert_eq!(plan.minimum_bytes, 14_000);
        assert_eq!((plan.resident_layers.len(), plan.streamed_layers.len()), (0, 8));
        assert_eq!(plan.window_bytes, 10_000);
        let plan = MemoryPlan::new(
            s.clone(),
            MemoryBudget { bytes: 75_000, kv_tokens: 100, batch: 1, verify_rows: 1, stream_layers: None },
        )
        .unwrap();
        // 69_000 left after the fixed parts and two layers' routes (4000): a two-layer window
        // (20_000), four layers resident, spread over the stack.
        assert_eq!(plan.window_bytes, 20_000);
        assert_eq!(plan.resident_layers, vec![0, 2, 4, 6]);
        assert_eq!(plan.streamed_layers, vec![1, 3, 5, 7]);
        assert_eq!(plan.dense_disk_bytes_per_token, 40_000);
        assert_eq!(plan.expert_cache_bytes, 9000 + 4000);
        assert!(!plan.experts_resident);
        let plan = MemoryPlan::new(
            s,
            MemoryBudget { bytes: 200_000, kv_tokens: 100, batch: 1, verify_rows: 1, stream_layers: None },
        )
        .unwrap();
        assert_eq!(plan.resident_layers.len(), 8);
        assert!(plan.streamed_layers.is_empty() && plan.experts_resident && plan.window_bytes == 0);
    }

    #[test]
    fn small_layers_stay_resident_when_that_takes_less_than_streaming_one() {
        let mut s = sizes(2, 10_000);
        s.layers.iter_mut().for_each(|l| l.stream_bytes = 30_000);
        let plan = MemoryPlan::new(
            s.clone(),
            MemoryBudget { bytes: 24_000, kv_tokens: 100, batch: 1, verify_rows: 1, stream_layers: None },
        );
        let plan = plan.unwrap();
        assert_eq!((plan.minimum_bytes, plan.resident_layers.len(), plan.window_bytes), (24_000, 2, 0));
        // Unless told which to stream.
        let forced =
            MemoryBudget { bytes: 100_000, kv_tokens: 100, batch: 1, verify_rows: 1, stream_layers: Some(vec![1]) };
        let plan = MemoryPlan::new(s, forced).unwrap();
        assert_eq!((plan.resident_layers, plan.streamed_layers), (vec![0], vec![1]));
        assert_eq!(plan.minimum_bytes, 4000 + 10_000 + 30_000);
    }

    #[test]
    fn a_budget_below_one_layer_and_the_cache_is_refused_with_the_minimum() {
        let err = MemoryPlan::new(
            sizes(4, 10_000),
            MemoryBudget { bytes: 23_999, kv_tokens: 100, batch: 1, verify_rows: 1, stream_layers: None },
        )
        .unwrap_err();
        let EngineError::MemoryBudget { minimum_mb, .. } = &err else { panic!("{err}") };
        assert_eq!(*minimum_mb, 1, "{err}");
        assert!(err.to_string().contains("at least 1 MiB"), "{err}");
        // Four sequences: four caches (4 x 1000) and all eight experts of a layer in flight.
        let four = MemoryBudget { bytes: 0, kv_tokens: 100, batch: 4, verify_rows: 1, stream_layers: None };
        let EngineError::MemoryBudget { detail, .. } = MemoryPlan::new(sizes(4, 10_000), four).unwrap_err() else {
            panic!("a budget of nothing was taken")
        };
        assert!(detail.contains("4 x 100 tokens") && detail.contains("8 routed experts"), "{detail}");
        let four = MemoryBudget { bytes: 33_000, kv_tokens: 100, batch: 4, verify_rows: 1, stream_layers: None };
        assert_eq!(MemoryPlan::new(sizes(4, 10_000), four).unwrap().minimum_bytes, 1000 + 4000 + 20_000 + 8000);
    }

    #[test]
    fn verify_rows_reserve_their_routes_union_for_two_layers_but_share_one_cache() {
        let mut s = sizes(8, 10_000);
        s.layers.iter_mut().for_each(|l| l.stream_bytes = 10_000);
        let plan = |budget| MemoryPlan::new(s.clone(), budget);
        let one = MemoryBudget { bytes: 72_000, kv_tokens: 100, batch: 1, verify_rows: 1, stream_layers: None };
        // One row: two layers' routes (2 x 2 experts); the rest goes to four resident layers.
        let p = plan(one.clone()).unwrap();
        assert_eq!((p.resident_layers.len(), p.expert_cache_bytes), (4, 10_000));
        // Four rows: one sequence's cache, all eight experts in flight, and two layers' expected
        // union of four routes (8 x (1 - (6/8)^4) = 5.5, so 6 experts each) before dense layers.
        let four = MemoryBudget { verify_rows: 4, ..one.clone() };
        let p = plan(four.clone()).unwrap();
        assert_eq!((p.kv_bytes, p.minimum_bytes), (1000, 1000 + 1000 + 10_000 + 8000));
        assert_eq!((p.resident_layers.len(), p.expert_cache_bytes), (3, 8000 + 12_000));
        // As a batch of four does, less its three other caches.
        let batch = MemoryBudget { batch: 4, ..one };
        assert_eq!(plan(batch).unwrap().minimum_bytes, p.minimum_bytes + 3000);
        // At the minimum the cache holds one layer's experts in flight, and no dense layer.
        let p = plan(MemoryBudget { bytes: 20_000, ..four.clone() }).unwrap();
        assert_eq!((p.resident_layers.len(), p.expert_cache_bytes), (0, 8000));
        // Below it, refused with the minimum and what it is made of.
        let err = plan(MemoryBudget { bytes: 19_999, ..four }).unwrap_err();
        let EngineError::MemoryBudget { detail, .. } = &err else { panic!("{err}") };
        assert!(detail.contains("1 x 100 tokens") && detail.contains("8 routed experts"), "{detail}");
    }

    #[test]
    fn kimi_linears_kda_layers_reserve_a_fixed_state_and_only_its_latent_attention_layer_rows() {
        let path = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/kimi_linear");
        for file in [path.join("model.gguf"), path.clone()] {
            let ck = ModelFile::open(&file).unwrap();
            let spec = ModelSpec::read(&ck).unwrap();
            let sizes = ModelSizes::read(&ck, &spec).unwrap();
            // One MLA layer: a latent of 16 and a rotary key of 8, f32. Three KDA layers of
            // 4 heads x 8: S (4 x 8 x 8) and the convolution's last 3 inputs of q, k and v (3 x 96).
            assert_eq!(sizes.kv_bytes_per_token, (16 + 8) * 4, "{}", file.display());
            assert_eq!(sizes.state_bytes, 3 * (4 * 8 * 8 + 3 * 96) * 4, "{}", file.display());
            let two =
                MemoryBudget { bytes: usize::MAX / 2, kv_tokens: 10, batch: 2, verify_rows: 1, stream_layers: None };
            assert_eq!(MemoryPlan::new(sizes.clone(), two).unwrap().kv_bytes, 2 * (10 * 96 + sizes.state_bytes));
        }
    }

    /// The plan charges the output head (once, where the embedding is tied to it) and the final
    /// norm, never the embedding: a token reads one row of it from the file.
    #[test]
    fn the_plan_charges_the_head_and_not_the_embedding() {
        let root = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures");
        for (arch, tied) in [("llama", true), ("qwen3_moe", false)] {
            for file in [root.join(arch).join("model.gguf"), root.join(arch)] {
                let ck = ModelFile::open(&file).unwrap();
                let spec = ModelSpec::read(&ck).unwrap();
                let sizes = ModelSizes::read(&ck, &spec).unwrap();
                let resident = |name: &str| {
                    let t = ck.require(name).unwrap();
                    copied_bytes(t.dtype, &t.shape, t.bytes.len(), false)
                };
                let embd = ck.require("token_embd.weight").unwrap();
                assert_eq!(ck.tensor("output.weight").unwrap().is_none(), tied, "{}", file.display());
                assert_eq!(sizes.embedding_tied, tied, "{}", file.display());
                let head = resident(if tied { "token_embd.weight" } else { "output.weight" });
                assert_eq!(sizes.fixed_bytes, head + resident("output_norm.weight"), "{}", file.display());
                assert_eq!(
                    (sizes.embedding_bytes, sizes.embedding_row_bytes),
                    (embd.bytes.len(), embd.bytes.len() / spec.vocab_size),
                    "{}",
                    file.display()
                );
                // The least budget names what it is made of: the head, no embedding.
                let none = MemoryBudget { bytes: 0, kv_tokens: 8, batch: 1, verify_rows: 1, stream_layers: None };
                let EngineError::MemoryBudget { detail, .. } = MemoryPlan::new(sizes, none).unwrap_err() else {
                    panic!("a budget of nothing was taken")
                };
                assert!(detail.starts_with("output head and norm ") && !detail.contains("embedding"), "{detail}");
            }
        }
    }

    #[test]
    fn layer_indices_come_from_gguf_and_transformers_names() {
        use nightmail_formats::layer_of;
        assert_eq!(layer_of("blk.12.attn_q.weight"), Some(12));
        assert_eq!(layer_of("model.layers.3.self_attn.q_proj.weight"), Some(3));
        assert_eq!(layer_of("token_embd.weight"), None);
    }
}
