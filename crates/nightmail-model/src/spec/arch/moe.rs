//! The router and expert keys, read as each format gives them (absent stays absent) so that an
//! architecture's file applies its own defaults once, for both formats.

use nightmail_formats::FormatError;
use serde_json::Value as Json;

use super::source::{Gguf, Hf};
use crate::error::Result;
use crate::spec::{Activation, MoeSpec, Routing};

/// How a router scores its logits: llama.cpp's `expert_gating_func`
/// (LLAMA_EXPERT_GATING_FUNC_TYPE_*), transformers' `scoring_func`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) enum Scoring {
    Softmax,
    Sigmoid,
    SqrtSoftplus,
    Other,
}

/// What a file says about its experts; None where it says nothing.
pub(super) struct MoeKeys {
    pub experts: usize,
    pub top_k: usize,
    pub expert_ffn: usize,
    pub normalize: Option<bool>,
    pub groups: Option<usize>,
    pub top_groups: Option<usize>,
    pub scale: Option<f32>,
    /// DeepSeek's count of shared experts, each as wide as a routed one.
    pub shared_experts: Option<usize>,
    /// Qwen-MoE's shared expert width.
    pub shared_ffn: Option<usize>,
    pub scoring: Option<Scoring>,
    /// The scoring as the file names it, for the refusal.
    pub scoring_named: String,
    /// What the file calls itself, for messages (`deepseek2`, `deepseek_v3`).
    pub origin: String,
}

impl Gguf<'_> {
    /// The expert keys, or None for a model without experts.
    pub fn moe_keys(&self) -> Result<Option<MoeKeys>> {
        let experts = self.uint("expert_count").unwrap_or(0);
        if experts == 0 {
            return Ok(None);
        }
        let top_k = self.need("expert_used_count")?;
        // One width, or one per layer with 0 for the dense ones (`n_ff_exp_arr`).
        let expert_ffn = match self.per_layer("expert_feed_forward_length", |v| v > 0.0)? {
            Some(f) => f as usize,
            None => self.need("feed_forward_length")?,
        };
        let gating = self.uint("expert_gating_func");
        let scoring = gating.map(|n| match n {
            1 => Scoring::Softmax,
            2 => Scoring::Sigmoid,
            4 => Scoring::SqrtSoftplus,
            _ => Scoring::Other,
        });
        Ok(Some(MoeKeys {
            experts,
            top_k,
            expert_ffn,
            normalize: self.boolean("expert_weights_norm"),
            groups: self.uint("expert_group_count"),
            top_groups: self.uint("expert_group_used_count"),
            scale: self.float("expert_weights_scale").map(|v| v as f32),
            shared_experts: self.uint("expert_shared_count"),
            shared_ffn: self.uint("expert_shared_feed_forward_length").filter(|v| *v > 0),
            scoring,
            scoring_named: gating.map(|n| format!("expert gating function {n}")).unwrap_or_default(),
            origin: self.arch.to_string(),
        }))
    }
}

impl Hf<'_> {
    /// The expert keys, or None for a model without experts.
    pub fn moe_keys(&self) -> Result<Option<MoeKeys>> {
        let experts = (self.uint("num_local_experts").or_else(|| self.uint("num_experts")))
            .or_else(|| self.uint("n_routed_experts"))
            .unwrap_or(0);
        if experts == 0 {
            return Ok(None);
        }
        let top_k = self.need("num_experts_per_tok")?;
        let expert_ffn = self.uint("moe_intermediate_size").map_or_else(|| self.need("intermediate_size"), Ok)?;
        // Kimi's checkpoints name the scoring `moe_router_activation_func`.
        let scoring = self.get("scoring_func").or_else(|| self.get("moe_router_activation_func"));
        let named = scoring.and_then(Json::as_str);
        let scoring = named.map(|s| match s {
            "softmax" => Scoring::Softmax,
            "sigmoid" => Scoring::Sigmoid,
            "sqrtsoftplus" => Scoring::SqrtSoftplus,
            _ => Scoring::Other,
        });
        Ok(Some(MoeKeys {
            experts,
            top_k,
            expert_ffn,
            normalize: self.boolean("norm_topk_prob"),
            groups: self.uint("n_group"),
            top_groups: self.uint("topk_group"),
            scale: self.float("routed_scaling_factor").map(|v| v as f32),
            shared_experts: self.uint("n_shared_experts"),
            shared_ffn: self.uint("shared_expert_intermediate_size").filter(|v| *v > 0),
            scoring,
            scoring_named: named.map(|s| format!("scoring function `{s}`")).unwrap_or_default(),
            origin: self.model_type.to_string(),
        }))
    }
}

impl MoeKeys {
    /// Refuses a router other than `want` (the file's, or `default` where it names none).
    pub fn expect_scoring(&self, want: Scoring, default: Scoring, hint: &str) -> Result<()> {
        if self.scoring.unwrap_or(default) == want {
            return Ok(());
        }
        let named = match self.scoring_named.as_str() {
            "" => format!("without a scoring function, which means {default:?} scoring"),
            given => given.to_string(),
        };
        Err(FormatError::Unsupported { what: format!("{} {named}", self.origin), hint: hint.into() }.into())
    }

    /// DeepSeek's shared experts, fused into one MLP of their count times a routed expert's
    /// width (transformers `DeepseekV3MoE`, llama.cpp's `n_ff_exp · n_expert_shared`).
    pub fn deepseek_shared(&self, default_count: usize) -> Option<usize> {
        Some(self.shared_experts.unwrap_or(default_count) * self.expert_ffn).filter(|s| *s > 0)
    }

    /// DeepSeek-V3's grouped sigmoid router with this architecture's defaults.
    pub fn grouped_sigmoid(&self, normalize: bool, scale: f32) -> Routing {
        Routing::GroupedSigmoid {
            top_k: self.top_k,
            groups: self.groups.unwrap_or(1).max(1),
            top_groups: self.top_groups.unwrap_or(1).max(1),
            normalize: self.normalize.unwrap_or(normalize),
            scale: self.scale.unwrap_or(scale),
        }
    }

    pub fn spec(&self, routing: Routing, shared_expert_ffn: Option<usize>, activation: Activation) -> MoeSpec {
        MoeSpec {
            experts: self.experts,
            routing,
            expert_ffn: self.expert_ffn,
            shared_expert_ffn,
            activation,
            latent: None,
        }
    }
}

/// The sigmoid routers' refusal hint.
pub(super) const SIGMOID_ONLY: &str =
    "nightmail runs DeepSeek-V3's sigmoid routing (expert_gating_func 2); DeepSeek-V2 is not supported";

/// An architecture's defaults for DeepSeek-V3's sigmoid router, where the file says nothing.
pub(super) struct SigmoidDefaults {
    pub normalize: bool,
    pub scale: f32,
    pub shared_experts: usize,
}

impl MoeKeys {
    /// DeepSeek-V3's router (arXiv 2412.19437 §2.1.2; transformers `DeepseekV3TopkRouter`) and
    /// its shared experts, with `d` where the file is silent; `scoring` is what a file naming no
    /// scoring means.
    pub fn sigmoid_moe(&self, d: SigmoidDefaults, scoring: Scoring, activation: Activation) -> Result<MoeSpec> {
        self.expect_scoring(Scoring::Sigmoid, scoring, SIGMOID_ONLY)?;
        Ok(self.spec(self.grouped_sigmoid(d.normalize, d.scale), self.deepseek_shared(d.shared_experts), activation))
    }
}
