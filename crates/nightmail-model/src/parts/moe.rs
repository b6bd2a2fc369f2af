//! The one mixture-of-experts block (Shazeer et al., arXiv 1701.06538; Mixtral, arXiv 2401.04088):
//! route each token, run its chosen experts, sum their outputs weighted by the router, then add
//! the shared expert if the architecture has one. Experts are fetched by id, so where their
//! weights live is the store's business.

use std::collections::HashMap;
use std::sync::Arc;

use candle_core::{Device, Tensor};

use crate::error::Result;
use crate::parts::expert::{Expert, ExpertStore};
use crate::parts::latent_moe::LatentProjection;
use crate::parts::router::{Route, Router};
use nightmail_formats::ExpertId;
use nightmail_tensor::Linear;
use nightmail_tensor::ggml::Numerics;

/// An expert every token goes through; Qwen2-MoE scales it by `sigmoid(gate(x))`
/// (transformers `Qwen2MoeSparseMoeBlock`).
pub struct SharedExpert {
    pub(crate) expert: Expert,
    pub(crate) gate: Option<Linear>,
}

impl SharedExpert {
    pub fn forward(&self, x: &Tensor, numerics: Numerics) -> Result<Tensor> {
        let y = self.expert.forward(x, numerics)?;
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
    /// Kimi K3's Stable LatentMoE: the routed experts run in this latent width.
    pub(crate) latent: Option<Box<LatentProjection>>,
    pub(crate) numerics: Numerics,
}

impl MoeBlock {
    /// `x`: `[tokens, hidden]` → `[tokens, hidden]`.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let routes = self.router.route(x)?;
        self.announce(&routes);
        self.forward_routed(x, &routes)
    }

    /// Tell the store which experts this layer's routes chose, before [`MoeBlock::forward_routed`]
    /// asks for them: its guesses for the layer are settled, and a prefetch for the next layer
    /// (issued after this) has the room the wrong ones took.
    pub fn announce(&self, routes: &[Route]) {
        let mut ids: Vec<ExpertId> = Vec::new();
        for route in routes {
            for &(e, _) in &route.experts {
                let id = ExpertId { layer: self.layer, expert: e };
                if !ids.contains(&id) {
                    ids.push(id);
                }
            }
        }
        self.experts.routed(self.layer, &ids);
    }

    /// The block with its routes already chosen and announced (the transformer routes first to
    /// prefetch).
    /// Each chosen expert is fetched once and run once on all the tokens routed to it: the
    /// union of the routes of a prefill's tokens, or of a batch of sequences decoding together.
    pub fn forward_routed(&self, full: &Tensor, routes: &[Route]) -> Result<Tensor> {
        // The routed experts' input: the token, or its latent projection (Stable LatentMoE).
        let x = &match &self.latent {
            Some(latent) => latent.down(full)?,
            None => full.clone(),
        };
        let (tokens, hidden) = x.dims2()?;
        // The experts in order of first use (token 0's route order first), each with the
        // (token, slot in that token's route) pairs routed to it.
        let mut ids: Vec<ExpertId> = Vec::new();
        let mut users: Vec<Vec<(usize, usize)>> = Vec::new();
        let mut slot_of: HashMap<usize, usize> = HashMap::new();
        for (t, route) in routes.iter().enumerate() {
            for (k, &(e, _)) in route.experts.iter().enumerate() {
                let i = *slot_of.entry(e).or_insert_with(|| {
                    ids.push(ExpertId { layer: self.layer, expert: e });
                    users.push(Vec::new());
                    ids.len() - 1
                });
                users[i].push((t, k));
            }
        }
        // terms[t][k]: token t's k-th expert output times its router weight.
        let mut terms: Vec<Vec<Option<Vec<f32>>>> = routes.iter().map(|r| vec![None; r.experts.len()]).collect();
        self.experts.with_experts(&ids, &mut |i, expert| {
            let rows: Vec<u32> = users[i].iter().map(|&(t, _)| t as u32).collect();
            let y = if rows.len() == tokens && rows.iter().enumerate().all(|(j, &t)| j == t as usize) {
                expert.forward(x, self.numerics)?
            } else {
                expert.forward(
                    &x.index_select(&Tensor::from_vec(rows.clone(), rows.len(), &Device::Cpu)?, 0)?,
                    self.numerics,
                )?
            };
            for (&(t, k), row) in users[i].iter().zip(y.to_vec2::<f32>()?) {
                let w = routes[t].experts[k].1;
                terms[t][k] = Some(row.into_iter().map(|v| v * w).collect());
            }
            Ok(())
        })?;
        // Each token's terms are summed in its route order, whatever order the store delivered
        // the experts in and whatever else is in the batch: streaming gives bit-identical results
        // to the resident path, and a sequence decoded in a batch the results it gets alone.
        let mut out = vec![0f32; tokens * hidden];
        for (t, token_terms) in terms.into_iter().enumerate() {
            let acc = &mut out[t * hidden..(t + 1) * hidden];
            for (k, term) in token_terms.into_iter().flatten().enumerate() {
                if k == 0 {
                    acc.copy_from_slice(&term);
                } else {
                    acc.iter_mut().zip(&term).for_each(|(a, v)| *a += v);
                }
            }
        }
        let mut out = Tensor::from_vec(out, (tokens, hidden), &Device::Cpu)?;
        if let Some(latent) = &self.latent {
            out = latent.up(&out)?;
        }
        if let Some(shared) = &self.shared {
            out = (out + shared.forward(full, self.numerics)?)?;
        }
        Ok(out)
    }
}
