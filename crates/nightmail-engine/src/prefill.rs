//! How many prompt tokens one prefill pass runs. A pass reads every streamed weight once for all
//! its tokens (the MoE block groups the pass's tokens by expert: `MoeBlock::forward_routed`), so
//! a prompt in fewer, wider passes reads the expert bank fewer times: with 896 experts and 16 a
//! token, a 32-token pass already needs about half of each layer's. The width is bounded by
//! memory, not by a constant: the pass's activations and routing, and its experts alive at once
//! beside the cache.

use nightmail_model::{ModelSpec, SequenceState};

use crate::error::Result;

use crate::model::Model;
use crate::stream::MemoryPlan;

/// Activations a pass may take when the model was loaded without a budget (whole in RAM).
const UNBUDGETED_ACTIVATION_BYTES: usize = 1 << 30;

/// The widest pass: beyond it the attention scores (tokens × positions) outgrow the gain.
pub const MAX_PREFILL_TOKENS: usize = 4096;

/// Bytes one token takes in a pass, all f32: the residual stream and its projections, a dense
/// FFN's intermediate where a layer has one, per routed expert its intermediate and weighted output
/// kept until the token's sum (`MoeBlock::forward_routed` sums in route order after all experts
/// ran), and the attention scores over `span` positions.
pub fn activation_bytes_per_token(spec: &ModelSpec, span: usize) -> usize {
    let a = &spec.attention;
    let residual = 8 * spec.hidden_size + (2 * a.heads + 2 * a.kv_heads) * a.head_dim;
    let dense_ffn = if spec.moe_layers.iter().all(|&moe| moe) && spec.moe.is_some() { 0 } else { 3 * spec.ffn };
    let routed = spec.moe.as_ref().map_or(0, |m| {
        let width = m.latent.map_or(spec.hidden_size, |l| l.width);
        m.routing.top_k() * (width + 3 * m.expert_ffn) + 3 * m.shared_expert_ffn.unwrap_or(0) + m.experts
    });
    // Candle's temporaries (an op's output beside its input) about double what lives at once;
    // the scores (heads x tokens x span) live as the product, the scaled and masked copy and
    // the softmax (`parts/attention.rs`).
    4 * (2 * (residual + dense_ffn + routed) + 3 * a.heads * span)
}

/// Prompt tokens per pass for `spec` under `plan` (`None`: loaded whole, no budget), for a
/// prompt that ends at position `span`.
pub fn prefill_tokens_per_pass(spec: &ModelSpec, plan: Option<&MemoryPlan>, span: usize) -> usize {
    let span = span.clamp(1, spec.context_length.max(1));
    let per_token = activation_bytes_per_token(spec, span).max(1);
    let allowance = plan.map_or(UNBUDGETED_ACTIVATION_BYTES, |p| p.activation_bytes);
    let mut tokens = allowance / per_token;
    // A layer's experts for the pass are alive together, and the next layer's are read while it
    // computes: two layers' unions must fit the cache, or the pass would evict its own experts.
    if let Some(p) = plan.filter(|p| !p.experts_resident && p.sizes.top_k > 0) {
        let s = &p.sizes;
        let layer_bank = s.experts_per_layer * s.expert_max_bytes;
        if 2 * layer_bank > p.expert_cache_bytes {
            tokens = tokens.min(p.expert_cache_bytes / (2 * s.top_k * s.expert_max_bytes).max(1));
        }
    }
    tokens.clamp(1, MAX_PREFILL_TOKENS.min(span))
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
        for pass in tokens.chunks(chunk.max(1)) {
            logits = self.logits(pass, cache)?;
        }
        Ok(logits)
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

    #[test]
    fn a_pass_never_holds_more_experts_than_the_cache_has_room_for() {
        let (spec, sizes) = fixture("qwen3_moe");
        let minimum = MemoryPlan::new(sizes.clone(), MemoryBudget::mb(1 << 20)).unwrap().minimum_bytes;
        let plan = MemoryPlan::new(sizes.clone(), MemoryBudget { bytes: minimum, ..MemoryBudget::mb(0) }).unwrap();
        assert!(!plan.experts_resident);
        let tokens = prefill_tokens_per_pass(&spec, Some(&plan), 2048);
        let union = (tokens * sizes.top_k).min(sizes.experts_per_layer) * sizes.expert_max_bytes;
        assert!(tokens == 1 || 2 * union <= plan.expert_cache_bytes, "{tokens} tokens, {union} bytes of experts");
    }

    #[test]
    fn a_pass_s_activations_fit_the_room_the_plan_keeps_for_them() {
        let (spec, sizes) = fixture("qwen3_moe");
        let minimum = MemoryPlan::new(sizes.clone(), MemoryBudget::mb(1 << 20)).unwrap().minimum_bytes;
        for bytes in [minimum + (1 << 20), 2 * minimum, 8 * minimum] {
            let plan = MemoryPlan::new(sizes.clone(), MemoryBudget { bytes, ..MemoryBudget::mb(0) }).unwrap();
            for span in [64, 1024, 4096] {
                let tokens = prefill_tokens_per_pass(&spec, Some(&plan), span);
                let span = span.min(spec.context_length);
                let need = tokens * activation_bytes_per_token(&spec, span);
                assert!(tokens == 1 || need <= plan.activation_bytes, "{tokens} tokens take {need} bytes");
            }
            let weights = plan.fixed_bytes + plan.kv_bytes + plan.resident_layer_bytes + plan.window_bytes;
            assert!(weights + plan.expert_cache_bytes + plan.activation_bytes <= bytes, "{plan:?}");
        }
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
