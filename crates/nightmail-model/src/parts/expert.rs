//! Experts and where their weights come from. The MoE block asks an [`ExpertStore`] for experts
//! by [`ExpertId`]; whether they are resident or streamed from disk does not touch the math.

use std::collections::HashMap;

use nightmail_formats::ExpertId;
use std::sync::Arc;

use candle_core::Tensor;

use crate::error::Result;
use crate::expert_index::{expert_biases, expert_views};
use crate::spec::{Activation, ModelSpec};
use nightmail_formats::ModelFile;
use nightmail_tensor::Linear;
use nightmail_tensor::ggml::Numerics;

/// A gated feed-forward, `down(act(gate(x), up(x)))`: SwiGLU (Shazeer, arXiv 2002.05202) or
/// gpt-oss's clamped variant, each projection with its bias where the model has one. A routed
/// expert, a shared expert and a dense layer's MLP are all one of these.
pub struct Expert {
    gate: Linear,
    up: Linear,
    down: Linear,
    activation: Activation,
}

impl Expert {
    /// A SwiGLU expert.
    pub fn new(gate: Linear, up: Linear, down: Linear) -> Self {
        Expert { gate, up, down, activation: Activation::SwiGlu }
    }

    pub fn with_activation(self, activation: Activation) -> Self {
        Expert { activation, ..self }
    }

    pub fn forward(&self, x: &Tensor, numerics: Numerics) -> Result<Tensor> {
        let (g, u) = (self.gate.forward(x)?, self.up.forward(x)?);
        let h = match (self.activation, numerics) {
            (Activation::SwiGlu, Numerics::Reference) => (g.silu()? * u)?,
            (Activation::SwiGlu, Numerics::Ggml) => {
                let y = nightmail_tensor::ggml::swiglu(&g.flatten_all()?.to_vec1()?, &u.flatten_all()?.to_vec1()?);
                Tensor::from_vec(y, g.shape(), g.device())?
            }
            // transformers `GptOssExperts._apply_gate`, step for step in f32 (gpt-oss always
            // takes the reference numerics: see `Transformer::load`).
            (Activation::ClampedSwiGlu { alpha, limit }, _) => {
                let (alpha, limit) = (f64::from(alpha), f64::from(limit));
                let g = g.minimum(limit)?;
                let u = u.clamp(-limit, limit)?;
                let glu = (&g * candle_nn::ops::sigmoid(&(&g * alpha)?)?)?;
                ((u + 1.0)? * glu)?
            }
            (Activation::ClampedSilu { limit }, _) => {
                let limit = f64::from(limit);
                (g.minimum(limit)?.silu()? * u.clamp(-limit, limit)?)?
            }
            (Activation::Situ { beta, linear_beta }, _) => crate::parts::situ::situ(&g, &u, beta, linear_beta)?,
        };
        Ok(self.down.forward(&h)?)
    }
}

/// Where the MoE block gets expert weights: every expert in RAM ([`ResidentExperts`]), or
/// streamed from disk through a cache (the engine's `StreamingExperts`).
pub trait ExpertStore: Send + Sync {
    /// Call `use_expert(i, expert)` once for each `ids[i]`, in whatever order the experts become
    /// available (resident ones first). Stops at the first error.
    fn with_experts(&self, ids: &[ExpertId], use_expert: &mut dyn FnMut(usize, &Expert) -> Result<()>) -> Result<()>;

    /// A hint: these experts will probably be asked for soon (best first).
    fn prefetch(&self, _ids: &[ExpertId]) {}

    /// `layer`'s experts for this step were chosen: guesses for it that are not among them can go.
    fn routed(&self, _layer: usize, _chosen: &[ExpertId]) {}
}

/// Every expert resident, built once from the mapped file at load.
pub struct ResidentExperts {
    experts: HashMap<ExpertId, Arc<Expert>>,
}

impl ResidentExperts {
    pub fn load(ck: &ModelFile, spec: &ModelSpec) -> Result<Self> {
        Self::load_layers(ck, spec, (0..spec.layers).filter(|l| spec.moe_layers[*l]))
    }

    /// The routed experts of `layers` only (an MTP layer's, `mtp.rs`).
    pub fn load_layers(ck: &ModelFile, spec: &ModelSpec, layers: impl Iterator<Item = usize>) -> Result<Self> {
        let mut experts = HashMap::new();
        let Some(moe) = &spec.moe else { return Ok(ResidentExperts { experts }) };
        for layer in layers {
            for expert in 0..moe.experts {
                let id = ExpertId { layer, expert };
                let [gate, up, down] = expert_views(ck, spec, id)?;
                let [gb, ub, db] = expert_biases(ck, spec, id)?;
                let e = Expert::new(
                    Linear::new(&gate, gb.as_ref())?,
                    Linear::new(&up, ub.as_ref())?,
                    Linear::new(&down, db.as_ref())?,
                );
                experts.insert(id, Arc::new(e.with_activation(moe.activation)));
            }
        }
        Ok(ResidentExperts { experts })
    }
}

impl ExpertStore for ResidentExperts {
    fn with_experts(&self, ids: &[ExpertId], use_expert: &mut dyn FnMut(usize, &Expert) -> Result<()>) -> Result<()> {
        for (i, id) in ids.iter().enumerate() {
            let e = self.experts.get(id).ok_or_else(|| nightmail_formats::FormatError::MissingTensor {
                name: format!("expert {} of layer {}", id.expert, id.layer),
            })?;
            use_expert(i, e)?;
        }
        Ok(())
    }
}
