//! The one mixture-of-experts block (Shazeer et al., arXiv 1701.06538; Mixtral, arXiv 2401.04088):
//! route each token, run its chosen experts, sum their outputs weighted by the router, then add
//! the shared expert if the architecture has one. Experts are fetched by id, so where their
//! weights live is the store's business.

use std::collections::HashMap;
use std::sync::{Arc, OnceLock};

use candle_core::{Device, Tensor};
use rayon::prelude::*;

use crate::error::Result;
use crate::parts::expert::{Expert, ExpertStore, ExpertWork};
use crate::parts::latent_moe::LatentProjection;
use crate::parts::router::{ExpertRoute, Router};
use crate::source::LayerTensors;
use crate::spec::{ModelSpec, MoeSpec};
use nightmail_formats::ExpertId;
use nightmail_tensor::Linear;
use nightmail_tensor::RmsNorm;
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
    /// Routed experts in the layer.
    pub(crate) routed_experts: usize,
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
    pub fn announce(&self, routes: &[ExpertRoute]) {
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
    pub fn forward_routed(&self, full: &Tensor, routes: &[ExpertRoute]) -> Result<Tensor> {
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
        // outputs[i]: expert i's rows, in `users[i]`'s order. The experts run several at once,
        // with no more rows in flight than the pass has tokens: the pass's activation room
        // counts one expert's row for each of its tokens (`nightmail_engine::prefill`).
        let outputs: Vec<OnceLock<Vec<f32>>> = ids.iter().map(|_| OnceLock::new()).collect();
        let rows = users.iter().map(Vec::len).collect();
        let work = ExpertWork { ids: &ids, rows, limit: tokens.max(rayon::current_num_threads()) };
        self.experts.with_experts(&work, &|i, expert| {
            let rows: Vec<u32> = users[i].iter().map(|&(t, _)| t as u32).collect();
            let y = if rows.len() == tokens && rows.iter().enumerate().all(|(j, &t)| j == t as usize) {
                expert.forward(x, self.numerics)?
            } else {
                let picked = x.index_select(&Tensor::from_vec(rows, users[i].len(), &Device::Cpu)?, 0)?;
                expert.forward(&picked, self.numerics)?
            };
            outputs[i].set(y.flatten_all()?.to_vec1::<f32>()?).expect("each expert is delivered once");
            Ok(())
        })?;
        // Where token t's k-th expert output lies: (expert, row of its output).
        let mut at: Vec<Vec<(usize, usize)>> = routes.iter().map(|r| vec![(0, 0); r.experts.len()]).collect();
        for (i, users) in users.iter().enumerate() {
            for (j, &(t, k)) in users.iter().enumerate() {
                at[t][k] = (i, j);
            }
        }
        let outputs: Vec<Vec<f32>> = outputs.into_iter().map(|o| o.into_inner().expect("every expert ran")).collect();
        // Each token's terms (output times router weight) are summed in its route order,
        // whatever order the store delivered the experts in and whatever else is in the batch:
        // streaming gives bit-identical results to the resident path, and a sequence decoded in
        // a batch the results it gets alone.
        let mut out = vec![0f32; tokens * hidden];
        out.par_chunks_mut(hidden).enumerate().for_each(|(t, acc)| {
            for (k, &(i, j)) in at[t].iter().enumerate() {
                let w = routes[t].experts[k].1;
                let row = &outputs[i][j * hidden..(j + 1) * hidden];
                if k == 0 {
                    acc.iter_mut().zip(row).for_each(|(a, v)| *a = v * w);
                } else {
                    acc.iter_mut().zip(row).for_each(|(a, v)| *a += v * w);
                }
            }
        });
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

impl MoeBlock {
    /// A layer's mixture of experts: the router (with the choice bias where the model has one),
    /// the shared expert and its gate, Stable LatentMoE's projections; the routed experts come
    /// from `experts`.
    pub fn load(
        w: &LayerTensors<'_>,
        spec: &ModelSpec,
        moe: &MoeSpec,
        numerics: Numerics,
        experts: &Arc<dyn ExpertStore>,
    ) -> Result<MoeBlock> {
        let hidden = spec.hidden_size;
        // GLM-4.5's and MiniMax-M2's routers always have one: without it the choice would
        // quietly differ from the reference, so its absence is a broken file.
        let bias = match spec.architecture.is_sigmoid_gqa() {
            true => Some(w.require("exp_probs_b.bias")?),
            false => w.opt("exp_probs_b.bias")?,
        };
        let choice_bias = match bias {
            Some(b) => {
                b.expect_shape(&[moe.experts])?;
                Some(b.to_f32()?.to_vec1::<f32>()?)
            }
            None => None,
        };
        let router = Router { gate: w.linear("ffn_gate_inp", moe.experts, hidden)?, routing: moe.routing, choice_bias };
        let shared = match moe.shared_expert_ffn {
            Some(f) => Some(SharedExpert {
                expert: Expert::new(
                    w.linear("ffn_gate_shexp", f, hidden)?,
                    w.linear("ffn_up_shexp", f, hidden)?,
                    w.linear("ffn_down_shexp", hidden, f)?,
                )
                .with_activation(spec.ffn_activation),
                gate: w.opt("ffn_gate_inp_shexp.weight")?.map(|g| w.source.linear(&g, None)).transpose()?,
            }),
            None => None,
        };
        // Stable LatentMoE (latent_moe.rs).
        let latent = match moe.latent {
            Some(lat) => Some(Box::new(LatentProjection {
                down: w.linear("ffn_routed_down", lat.width, hidden)?,
                norm: match lat.norm {
                    true => Some(RmsNorm::new(&w.require("ffn_routed_norm.weight")?, spec.rms_norm_eps, numerics)?),
                    false => None,
                },
                up: w.linear("ffn_routed_up", hidden, lat.width)?,
            })),
            None => None,
        };
        Ok(MoeBlock {
            layer: w.layer,
            router,
            routed_experts: moe.experts,
            experts: experts.clone(),
            shared,
            latent,
            numerics,
        })
    }
}
