//! The one mixture-of-experts block (Shazeer et al., arXiv 1701.06538; Mixtral, arXiv 2401.04088):
//! route each token, run its chosen experts, sum their outputs weighted by the router, then add
//! the shared expert if the architecture has one. Experts are fetched by id, so where their
//! weights live is the store's business.

use std::collections::BTreeMap;
use std::sync::Arc;

use candle_core::{Device, Tensor};

use super::expert::{Expert, ExpertId, ExpertStore};
use super::layers::Linear;
use super::router::Router;
use crate::error::Result;

/// An expert every token goes through; Qwen2-MoE scales it by `sigmoid(gate(x))`
/// (transformers `Qwen2MoeSparseMoeBlock`).
pub struct SharedExpert {
    pub(crate) expert: Expert,
    pub(crate) gate: Option<Linear>,
}

impl SharedExpert {
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let y = self.expert.forward(x)?;
        Ok(match &self.gate {
            Some(g) => y.broadcast_mul(&candle_nn::ops::sigmoid(&g.forward(x)?)?)?,
            None => y,
        })
    }
}

pub struct MoeBlock {
    pub(crate) layer: usize,
    pub(crate) router: Router,
    pub(crate) experts: Arc<dyn ExpertStore>,
    pub(crate) shared: Option<SharedExpert>,
}

impl MoeBlock {
    /// `x`: `[tokens, hidden]` → `[tokens, hidden]`.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let routes = self.router.route(x)?;
        let id = |expert| ExpertId { layer: self.layer, expert };
        let mut out = if let [route] = routes.as_slice() {
            // Decode: one token, k experts.
            let mut acc: Option<Tensor> = None;
            for &(e, w) in &route.experts {
                let y = (self.experts.expert(id(e))?.forward(x)? * w as f64)?;
                acc = Some(match acc {
                    Some(a) => (a + y)?,
                    None => y,
                });
            }
            acc.unwrap_or(x.zeros_like()?)
        } else {
            // Prefill: gather each expert's tokens, run them together, scatter-add back.
            let mut by_expert: BTreeMap<usize, (Vec<u32>, Vec<f32>)> = BTreeMap::new();
            for (t, route) in routes.iter().enumerate() {
                for &(e, w) in &route.experts {
                    let entry = by_expert.entry(e).or_default();
                    entry.0.push(t as u32);
                    entry.1.push(w);
                }
            }
            let mut out = x.zeros_like()?;
            for (e, (rows, weights)) in by_expert {
                let n = rows.len();
                let idx = Tensor::from_vec(rows, n, &Device::Cpu)?;
                let y = self.experts.expert(id(e))?.forward(&x.index_select(&idx, 0)?)?;
                let y = y.broadcast_mul(&Tensor::from_vec(weights, (n, 1), &Device::Cpu)?)?;
                out = out.index_add(&idx, &y, 0)?;
            }
            out
        };
        if let Some(shared) = &self.shared {
            out = (out + shared.forward(x)?)?;
        }
        Ok(out)
    }
}
