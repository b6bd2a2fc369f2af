//! The one mixture-of-experts block (Shazeer et al., arXiv 1701.06538; Mixtral, arXiv 2401.04088):
//! route each token, run its chosen experts, sum their outputs weighted by the router, then add
//! the shared expert if the architecture has one. Experts are fetched by id, so where their
//! weights live is the store's business.

use std::collections::BTreeMap;
use std::sync::Arc;

use candle_core::{Device, Tensor};

use super::expert::{Expert, ExpertId, ExpertStore};
use super::layers::Linear;
use super::router::{Route, Router};
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

/// The tokens routed to one expert in a prefill, and their router weights.
type TokensAndWeights = (Vec<u32>, Vec<f32>);

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
        self.forward_routed(x, &routes)
    }

    /// The block with its routes already chosen (the transformer routes first to prefetch).
    pub fn forward_routed(&self, x: &Tensor, routes: &[Route]) -> Result<Tensor> {
        let id = |expert| ExpertId { layer: self.layer, expert };
        // The experts' outputs are summed in a fixed order (route order for one token, expert
        // order for many), whatever order the store delivers them in: streaming then gives
        // bit-identical results to the resident path.
        let mut out = if let [route] = routes {
            // Decode: one token, k experts.
            let ids: Vec<ExpertId> = route.experts.iter().map(|&(e, _)| id(e)).collect();
            self.experts.routed(self.layer, &ids);
            let mut ys: Vec<Option<Tensor>> = vec![None; ids.len()];
            self.experts.with_experts(&ids, &mut |i, expert| {
                ys[i] = Some((expert.forward(x)? * route.experts[i].1 as f64)?);
                Ok(())
            })?;
            let mut acc: Option<Tensor> = None;
            for y in ys.into_iter().flatten() {
                acc = Some(match acc {
                    Some(a) => (a + y)?,
                    None => y,
                });
            }
            acc.unwrap_or(x.zeros_like()?)
        } else {
            // Prefill: gather each expert's tokens, run them together, scatter-add back.
            let mut by_expert: BTreeMap<usize, TokensAndWeights> = BTreeMap::new();
            for (t, route) in routes.iter().enumerate() {
                for &(e, w) in &route.experts {
                    let entry = by_expert.entry(e).or_default();
                    entry.0.push(t as u32);
                    entry.1.push(w);
                }
            }
            let groups: Vec<(usize, TokensAndWeights)> = by_expert.into_iter().collect();
            let ids: Vec<ExpertId> = groups.iter().map(|(e, _)| id(*e)).collect();
            let mut ys: Vec<Option<(Tensor, Tensor)>> = vec![None; ids.len()];
            self.experts.with_experts(&ids, &mut |i, expert| {
                let (rows, weights) = &groups[i].1;
                let n = rows.len();
                let idx = Tensor::from_vec(rows.clone(), n, &Device::Cpu)?;
                let y = expert.forward(&x.index_select(&idx, 0)?)?;
                let y = y.broadcast_mul(&Tensor::from_vec(weights.clone(), (n, 1), &Device::Cpu)?)?;
                ys[i] = Some((idx, y));
                Ok(())
            })?;
            let mut out = x.zeros_like()?;
            for (idx, y) in ys.into_iter().flatten() {
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
