//! How many prompt tokens one prefill pass runs. A pass reads every streamed weight once for all
//! its tokens (the MoE block groups the pass's tokens by expert: `MoeBlock::forward_routed`), so
//! a prompt in fewer, wider passes reads the expert bank fewer times: with 896 experts and 16 a
//! token, a 32-token pass already needs about half of each layer's. The width is bounded by
//! memory, not by a constant: the pass's activations and routing, and its experts alive at once
//! beside the cache; a prompt of several passes over a bank the cache cannot hold borrows the
//! cache's room for its activations ([`prefill_tokens_per_pass`]).

use nightmail_model::{ModelSpec, SequenceState};

use crate::error::Result;

use crate::model::Model;
use crate::stream::{MemoryPlan, ModelSizes};
use nightmail_model::parts::attention::QUERY_BLOCK;

/// Activations a pass may take when the model was loaded without a budget (whole in RAM).
const UNBUDGETED_ACTIVATION_BYTES: usize = 1 << 30;

/// The widest pass. Memory bounds a pass first (grouped attention scores its queries in
/// blocks, so width costs activations, not scores); this bounds the work a killed job redoes,
/// since a job checkpoints between passes. It is well past llama.cpp's largest useful batch
/// (2,048), the point of the width: a prompt longer than a batch rereads a streamed model.
pub const MAX_PREFILL_TOKENS: usize = 16384;

/// Bytes one token takes in a pass beside its attention scores, all f32: the residual stream and
/// its projections, a dense FFN's intermediate where a layer has one, and for the routed experts
/// its weighted output per route kept until the token's sum (`MoeBlock::forward_routed` sums in
/// route order after all experts ran), its router logits, and its row of the one expert computing
/// at a time (input, gate, up and output: at worst every token routes to it).
pub fn activation_bytes_per_token(spec: &ModelSpec) -> usize {
    let a = &spec.attention;
    let residual = 8 * spec.hidden_size + (2 * a.heads + 2 * a.kv_heads) * a.head_dim;
    let dense_ffn = if spec.moe_layers.iter().all(|&moe| moe) && spec.moe.is_some() { 0 } else { 3 * spec.ffn };
    let routed = spec.moe.as_ref().map_or(0, |m| {
        let width = m.latent.map_or(spec.hidden_size, |l| l.width);
        m.routing.top_k() * width + 3 * width + 3 * m.expert_ffn + 3 * m.shared_expert_ffn.unwrap_or(0) + m.experts
    });
    // Candle's temporaries (an op's output beside its input) about double what lives at once.
    4 * 2 * (residual + dense_ffn + routed)
}

/// Bytes of attention scores per query row and key position: the product, the scaled and
/// masked copy and the softmax, one per head, as latent attention holds them (`parts/mla.rs`).
/// Grouped attention holds one block of keys per thread (`nightmail_tensor::kernel::attention`)
/// and is counted the same, a bound above it.
pub fn score_bytes_per_position(spec: &ModelSpec) -> usize {
    4 * 3 * spec.attention.heads
}

/// Query rows whose scores are alive at once: latent (MLA) attention takes its queries in blocks
/// (`nightmail_model::parts::attention::QUERY_BLOCK`), grouped attention is counted the same (see
/// [`score_bytes_per_position`]); DeepSeek-V4's windowed attention scores every row of the pass
/// together.
pub fn score_rows(spec: &ModelSpec) -> usize {
    if spec.deepseek_v4.is_none() { QUERY_BLOCK } else { usize::MAX }
}

/// Bytes per cached position a pass of several rows holds whatever its width: latent attention's
/// plain form up-projects every cached latent to per-head keys (nope + rope) and values once
/// for the pass (`nightmail_model::parts::mla`), f32.
pub fn pass_bytes_per_position(spec: &ModelSpec) -> usize {
    spec.attention
        .mla
        .as_ref()
        .map_or(0, |m| 4 * spec.attention.heads * (m.qk_nope_head_dim + m.qk_rope_head_dim + m.v_head_dim))
}

/// Bytes a pass of `tokens` prompt tokens ending at position `span` takes for activations.
pub fn pass_activation_bytes(sizes: &ModelSizes, tokens: usize, span: usize) -> usize {
    let keys = if tokens > 1 { span * sizes.pass_bytes_per_position } else { 0 };
    tokens * sizes.activation_bytes_per_token
        + tokens.min(sizes.attention_score_rows) * span * sizes.activation_bytes_per_position
        + keys
}

/// The least expert cache a pass of `rows` routed rows runs in: their union in one layer (the
/// layer computing holds its experts while the next layer's guesses are read beside them), and
/// what the plan keeps for a decode step's look-ahead. A cache smaller than that still runs the
/// pass: the layer streams through it (`stream/expert_cache`: a read begins as room frees).
pub fn pass_cache_floor(plan: &MemoryPlan, rows: usize) -> usize {
    let union = plan.distinct_experts(rows).ceil() as usize;
    union * plan.sizes.expert_max_bytes + plan.look_ahead_bytes
}

/// Prompt tokens per pass for `spec` under `plan` (`None`: loaded whole, no budget), for a
/// prompt that ends at position `span`.
///
/// A prompt longer than one pass whose experts do not fit the cache borrows cache room for its
/// activations ([`cache_bytes_for_pass`] gives it back after): each pass streams nearly every
/// expert, and an LRU cache smaller than the bank keeps none of them from one pass to the next (a
/// cyclic sweep over more than it holds evicts each before its reuse), so bytes read are about
/// passes × bank. Cache room above [`pass_cache_floor`] saves no read; as activation room it
/// saves whole bank reads. So passes are as wide as activations plus cache less that floor allow,
/// when that makes fewer of them, and evened out (n / passes each) to keep the rest as cache.
pub fn prefill_tokens_per_pass(spec: &ModelSpec, plan: Option<&MemoryPlan>, span: usize) -> usize {
    let span = span.clamp(1, spec.context_length.max(1));
    let cap = MAX_PREFILL_TOKENS.min(span);
    let Some(p) = plan else {
        let per_token = activation_bytes_per_token(spec) + span.min(score_rows(spec)) * score_bytes_per_position(spec);
        let room = UNBUDGETED_ACTIVATION_BYTES.saturating_sub(span * pass_bytes_per_position(spec));
        return (room / per_token.max(1)).clamp(1, cap);
    };
    let fits = |tokens: usize, room: usize| pass_activation_bytes(&p.sizes, tokens, span) <= room;
    let widest = |room: usize, most: usize| -> usize {
        // The largest width in 1..=most whose activations fit `room` (they grow with the width).
        let (mut lo, mut hi) = (1, most.max(1));
        while lo < hi {
            let mid = (lo + hi).div_ceil(2);
            if fits(mid, room) { lo = mid } else { hi = mid - 1 }
        }
        lo
    };
    let mut tokens = widest(p.activation_bytes, cap);
    // A layer's union larger than the cache streams through it (a read begins as room frees),
    // so the width costs activations, not cache.
    if !p.experts_resident && p.sizes.top_k > 0 {
        let floor = pass_cache_floor(p, cap);
        if span > tokens && p.expert_cache_bytes > floor {
            // Borrow the cache down to the floor of the widest pass (the floor only grows with
            // the width, so a width that fits with the widest floor fits with its own).
            let room = p.activation_bytes + p.expert_cache_bytes - floor;
            let wide = widest(room, cap);
            if span.div_ceil(wide) < span.div_ceil(tokens) {
                tokens = span.div_ceil(span.div_ceil(wide));
            }
        }
    }
    tokens.clamp(1, cap)
}

/// The expert cache a pass of `rows` rows at position `span` runs with under `plan`: the plan's,
/// less what its activations take beyond the plan's activation room, down to
/// [`pass_cache_floor`] (never above the plan's). A decode step (or a pass within the activation room) gets the plan's.
pub fn cache_bytes_for_pass(plan: &MemoryPlan, rows: usize, span: usize) -> usize {
    let over = pass_activation_bytes(&plan.sizes, rows, span).saturating_sub(plan.activation_bytes);
    plan.expert_cache_bytes.saturating_sub(over).max(pass_cache_floor(plan, rows).min(plan.expert_cache_bytes))
}

impl Model {
    /// Prompt tokens one prefill pass runs ([`Model::step`]'s `prefill_chunk`) for a prompt of
    /// `prompt_tokens`, sized from the memory budget this model was loaded with.
    pub fn prefill_chunk(&self, prompt_tokens: usize) -> usize {
        prefill_tokens_per_pass(&self.spec, self.plan.as_ref(), prompt_tokens)
    }

    /// Runs `tokens` after what `cache` holds in passes of `chunk` tokens (the last may be
    /// shorter) and returns the next-token logits of the last one: what [`Model::step`] does to
    /// a prompt, without a stream (for benches).
    pub fn prefill(&self, tokens: &[u32], cache: &mut SequenceState, chunk: usize) -> Result<Vec<f32>> {
        let mut logits = Vec::new();
        let mut run = || {
            for pass in tokens.chunks(chunk.max(1)) {
                self.size_expert_cache(pass.len(), cache.position() + pass.len());
                logits = self.logits(pass, cache)?;
            }
            Ok(())
        };
        let ran = run();
        self.size_expert_cache(1, cache.position());
        ran.map(|()| logits)
    }

    /// Sets the expert cache for a pass of `rows` rows ending at position `span`: the plan's
    /// cache less what the pass's activations borrow of it ([`cache_bytes_for_pass`]); a decode
    /// step gives the borrowed room back.
    pub(crate) fn size_expert_cache(&self, rows: usize, span: usize) {
        if let (Some(store), Some(plan)) = (&self.streaming, &self.plan) {
            store.set_capacity(cache_bytes_for_pass(plan, rows, span));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stream::{MemoryBudget, ModelSizes};
    use nightmail_formats::ModelFile;

    fn fixture(name: &str) -> (ModelSpec, ModelSizes) {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures").join(name);
        let path = if path.join("model.gguf").exists() { path.join("model.gguf") } else { path };
        let ck = ModelFile::open(&path).unwrap();
        let spec = ModelSpec::read(&ck).unwrap();
        let sizes = ModelSizes::read(&ck, &spec).unwrap();
        (spec, sizes)
    }

    /// Latent attention takes its queries in blocks as grouped attention does: past a block, a
    /// row more costs its own activations only; the keys a pass up-projects are held once, by
    /// any pass of more than one row.
    #[test]
    fn a_latent_attention_pass_holds_one_block_of_scores_and_its_keys_once() {
        let (spec, sizes) = fixture("deepseek_v3");
        let span = 4096;
        let at = |tokens: usize| pass_activation_bytes(&sizes, tokens, span);
        assert!(spec.attention.mla.is_some() && sizes.pass_bytes_per_position > 0);
        assert_eq!(at(2 * QUERY_BLOCK + 1) - at(2 * QUERY_BLOCK), sizes.activation_bytes_per_token);
        let row = sizes.activation_bytes_per_token + span * sizes.activation_bytes_per_position;
        assert_eq!(at(2) - at(1), row + span * sizes.pass_bytes_per_position);
        assert_eq!(at(3) - at(2), row);
    }

    #[test]
    fn a_larger_budget_runs_wider_passes_up_to_the_cap() {
        let (spec, sizes) = fixture("qwen3_moe");
        let minimum = MemoryPlan::new(sizes.clone(), MemoryBudget::mb(1 << 20)).unwrap().minimum_bytes;
        let at = |bytes: usize| {
            let budget = MemoryBudget { bytes, ..MemoryBudget::mb(0) };
            prefill_tokens_per_pass(&spec, Some(&MemoryPlan::new(sizes.clone(), budget).unwrap()), 2048)
        };
        let (small, large) = (at(minimum), at(minimum * 64));
        assert!(small >= 1 && small <= large, "{small} {large}");
        assert!(large <= MAX_PREFILL_TOKENS.min(spec.context_length));
    }

    /// The budget's weights: everything but the expert cache and the activations.
    fn weights(plan: &MemoryPlan) -> usize {
        plan.fixed_bytes + plan.mtp_bytes + plan.kv_bytes + plan.resident_layer_bytes + plan.window_bytes
    }

    /// The fixture's sizes with a bank of 8 layers x 64 experts of 4 KiB (top 2), and a budget
    /// whose cache holds three quarters of it: a bank that streams, larger than two layers.
    fn streamed_bank(sizes: &ModelSizes) -> (ModelSizes, usize) {
        let mut s = sizes.clone();
        (s.experts_per_layer, s.moe_layers, s.top_k, s.expert_max_bytes) = (64, 8, 2, 4096);
        s.expert_bytes = 64 * 8 * 4096;
        s.activation_bytes_per_position = 0;
        let minimum = MemoryPlan::new(s.clone(), MemoryBudget::mb(1 << 20)).unwrap().minimum_bytes;
        (s, minimum + (3 << 20))
    }

    /// A cache smaller than a pass's union does not narrow the pass: the store streams the union
    /// through it. The width is what the activations (with the cache's room lent above what a
    /// pass streams at once) allow, and the pass's cache still holds that much.
    #[test]
    fn a_cache_smaller_than_the_union_does_not_narrow_a_pass() {
        let (spec, sizes) = fixture("qwen3_moe");
        // The streamed bank's experts at 64 KiB: a layer's 4 MiB, two of them beyond the cache.
        let (mut bank, _) = streamed_bank(&sizes);
        (bank.expert_max_bytes, bank.expert_bytes) = (64 << 10, 64 * 8 * (64 << 10));
        let bytes = MemoryPlan::new(bank.clone(), MemoryBudget::mb(1 << 20)).unwrap().minimum_bytes + (6 << 20);
        let plan = MemoryPlan::new(bank.clone(), MemoryBudget { bytes, ..MemoryBudget::mb(0) }).unwrap();
        let layer = bank.experts_per_layer * bank.expert_max_bytes;
        assert!(!plan.experts_resident && plan.expert_cache_bytes < 2 * layer, "{plan:?}");
        let span = 2048.min(spec.context_length);
        let tokens = prefill_tokens_per_pass(&spec, Some(&plan), span);
        // The width two layers' unions in the cache would have allowed.
        let cached = plan.expert_cache_bytes / (2 * bank.top_k * bank.expert_max_bytes);
        assert!(tokens > cached, "{tokens} tokens, no wider than {cached}");
        let cache = cache_bytes_for_pass(&plan, tokens, span);
        assert!(cache >= pass_cache_floor(&plan, tokens).min(plan.expert_cache_bytes), "{cache} {plan:?}");
    }

    #[test]
    fn a_pass_s_activations_and_the_cache_it_runs_with_fit_the_budget() {
        let (spec, sizes) = fixture("qwen3_moe");
        let minimum = MemoryPlan::new(sizes.clone(), MemoryBudget::mb(1 << 20)).unwrap().minimum_bytes;
        for bytes in [minimum + (1 << 20), 2 * minimum, 8 * minimum] {
            let plan = MemoryPlan::new(sizes.clone(), MemoryBudget { bytes, ..MemoryBudget::mb(0) }).unwrap();
            assert!(weights(&plan) + plan.expert_cache_bytes + plan.activation_bytes <= bytes, "{plan:?}");
            for span in [64, 1024, 4096] {
                let tokens = prefill_tokens_per_pass(&spec, Some(&plan), span);
                let span = span.min(spec.context_length);
                let need = pass_activation_bytes(&plan.sizes, tokens, span);
                let cache = cache_bytes_for_pass(&plan, tokens, span);
                assert!(
                    tokens == 1 || weights(&plan) + cache + need <= bytes,
                    "{tokens} tokens take {need} bytes beside a cache of {cache}: {plan:?}"
                );
            }
        }
    }

    #[test]
    fn a_long_prompt_over_a_streamed_bank_borrows_the_cache_and_a_decode_step_gives_it_back() {
        let (spec, sizes) = fixture("qwen3_moe");
        let (sizes, bytes) = streamed_bank(&sizes);
        let plan = MemoryPlan::new(sizes, MemoryBudget { bytes, ..MemoryBudget::mb(0) }).unwrap();
        assert!(!plan.experts_resident && plan.expert_cache_bytes > pass_cache_floor(&plan, 4096), "{plan:?}");
        let span = 1024;
        // Within the activation room alone.
        let alone =
            (1..=span).take_while(|&t| pass_activation_bytes(&plan.sizes, t, span) <= plan.activation_bytes).count();
        let wide = prefill_tokens_per_pass(&spec, Some(&plan), span);
        assert!(span.div_ceil(wide) < span.div_ceil(alone.max(1)), "{wide} vs {alone}");
        let lent = cache_bytes_for_pass(&plan, wide, span);
        assert!(lent < plan.expert_cache_bytes && lent >= pass_cache_floor(&plan, wide), "{lent} {plan:?}");
        assert!(weights(&plan) + lent + pass_activation_bytes(&plan.sizes, wide, span) <= bytes);
        assert_eq!(cache_bytes_for_pass(&plan, 1, span), plan.expert_cache_bytes);
        // A prompt of one pass borrows nothing.
        let short = prefill_tokens_per_pass(&spec, Some(&plan), alone);
        assert_eq!(cache_bytes_for_pass(&plan, short, alone), plan.expert_cache_bytes);
    }

    #[test]
    fn a_model_without_a_budget_prefills_wide() {
        let (spec, _) = fixture("qwen3_moe");
        assert!(prefill_tokens_per_pass(&spec, None, 2048) > 32);
    }

    #[test]
    fn a_pass_is_never_wider_than_the_prompt() {
        let (spec, _) = fixture("qwen3_moe");
        assert_eq!(prefill_tokens_per_pass(&spec, None, 5), 5);
    }
}
