//! Stable LatentMoE, Kimi K3's routed-expert block (llama.cpp src/models/kimi-k3.cpp
//! `build_latent_moe`; the reference in tests/fixtures/kimi_k3.py `LatentMoE`): the router reads
//! the full width, but each token's routed experts run in a narrower latent: the token is
//! projected down (`routed_expert_down_proj`, 7168 → 3584 in K3), its experts' weighted sum is
//! RMS-normed there (`routed_expert_norm`) and projected back up (`routed_expert_up_proj`). The
//! shared experts read the full width. [`MoeBlock`](super::MoeBlock) routes and runs the experts
//! as for any MoE; this part is the two projections and the norm around them.

use candle_core::Tensor;

use crate::error::Result;
use nightmail_tensor::{Linear, RmsNorm};

pub struct LatentProjection {
    pub(crate) down: Linear,
    /// None where the config turns the norm off (`latent_moe_use_norm: false`).
    pub(crate) norm: Option<RmsNorm>,
    pub(crate) up: Linear,
}

impl LatentProjection {
    /// `[tokens, hidden]` → `[tokens, latent]`: what the routed experts read.
    pub fn down(&self, x: &Tensor) -> Result<Tensor> {
        Ok(self.down.forward(x)?)
    }

    /// The routed experts' weighted sum `[tokens, latent]` → `[tokens, hidden]`: normed in the
    /// latent width, then projected up (before the shared experts are added).
    pub fn up(&self, routed: &Tensor) -> Result<Tensor> {
        match &self.norm {
            Some(norm) => Ok(self.up.forward(&norm.forward(routed)?)?),
            None => Ok(self.up.forward(routed)?),
        }
    }
}
