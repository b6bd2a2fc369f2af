//! Experts and where their weights come from. The MoE block asks an [`ExpertStore`] for an expert
//! by [`ExpertId`]; this store holds every expert from the mapped file, and a streaming
//! store (SSD + cache) can replace it without touching the math.

use std::collections::HashMap;
use std::sync::Arc;

use candle_core::Tensor;

use super::layers::Linear;
use crate::error::Result;
use crate::format::{Checkpoint, ExpertMatrix};
use crate::spec::ModelSpec;

/// One routed expert of one layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
pub struct ExpertId {
    pub layer: usize,
    pub expert: usize,
}

/// A SwiGLU feed-forward, `down(silu(gate(x)) ⊙ up(x))` (Shazeer, arXiv 2002.05202). A routed
/// expert, a shared expert and a dense layer's MLP are all one of these.
pub struct Expert {
    gate: Linear,
    up: Linear,
    down: Linear,
}

impl Expert {
    pub fn new(gate: Linear, up: Linear, down: Linear) -> Self {
        Expert { gate, up, down }
    }

    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let g = self.gate.forward(x)?.silu()?;
        let u = self.up.forward(x)?;
        self.down.forward(&(g * u)?)
    }
}

/// Where the MoE block gets expert weights. Implementations must be cheap to call per token
/// (the block calls it for every chosen expert of every token).
pub trait ExpertStore: Send + Sync {
    fn expert(&self, id: ExpertId) -> Result<Arc<Expert>>;
}

/// Every expert resident, built once from the mapped file at load.
pub struct ResidentExperts {
    experts: HashMap<ExpertId, Arc<Expert>>,
}

impl ResidentExperts {
    pub(crate) fn load(ck: &Checkpoint, spec: &ModelSpec) -> Result<Self> {
        let mut experts = HashMap::new();
        let Some(moe) = &spec.moe else { return Ok(ResidentExperts { experts }) };
        for layer in (0..spec.layers).filter(|l| spec.moe_layers[*l]) {
            for expert in 0..moe.experts {
                let id = ExpertId { layer, expert };
                let [gate, up, down] = ExpertMatrix::ALL.map(|m| ck.expert_matrix(id, m));
                let (gate, up, down) = (gate?, up?, down?);
                gate.expect_shape(&[moe.expert_ffn, spec.hidden_size])?;
                up.expect_shape(&[moe.expert_ffn, spec.hidden_size])?;
                down.expect_shape(&[spec.hidden_size, moe.expert_ffn])?;
                let e = Expert::new(Linear::new(&gate, None)?, Linear::new(&up, None)?, Linear::new(&down, None)?);
                experts.insert(id, Arc::new(e));
            }
        }
        Ok(ResidentExperts { experts })
    }
}

impl ExpertStore for ResidentExperts {
    fn expert(&self, id: ExpertId) -> Result<Arc<Expert>> {
        self.experts.get(&id).cloned().ok_or_else(|| crate::EngineError::MissingTensor {
            name: format!("expert {} of layer {}", id.expert, id.layer),
        })
    }
}
