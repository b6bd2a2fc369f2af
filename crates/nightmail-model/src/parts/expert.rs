//! Experts and where their weights come from. The MoE block asks an [`ExpertStore`] for experts
//! by [`ExpertId`]; whether they are resident or streamed from disk does not touch the math.

use std::collections::HashMap;

use nightmail_formats::ExpertId;
use std::sync::{Arc, Condvar, Mutex};

use candle_core::Tensor;

use crate::error::{ModelError, Result};
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

/// What [`ExpertStore::with_experts`] calls for each expert: from several threads at once.
pub type UseExpert<'a> = dyn Fn(usize, &Expert) -> Result<()> + Sync + 'a;

/// The experts one MoE block asks for: `ids[i]` computes `rows[i]` rows, and experts computing
/// at once hold at most `limit` rows between them (one wider than that runs alone).
pub struct ExpertWork<'a> {
    pub ids: &'a [ExpertId],
    pub rows: Vec<usize>,
    pub limit: usize,
}

impl<'a> ExpertWork<'a> {
    /// `ids`, a row each, all at once.
    pub fn one_row_each(ids: &'a [ExpertId]) -> Self {
        ExpertWork { ids, rows: vec![1; ids.len()], limit: usize::MAX }
    }

    /// Runs `use_expert` on each expert `experts` yields (its index in `ids` and the expert, as
    /// the store has them ready), several at once on rayon's pool within `limit`. Only the
    /// caller waits for room, and a caller on a pool thread runs waiting experts meanwhile:
    /// an expert never waits for rows, so one that splits its matrices over the pool cannot
    /// wait on room its own thread holds. With one thread the experts run here one by one.
    pub fn run<E, T>(
        &self,
        experts: impl Iterator<Item = Result<(usize, E)>>,
        use_expert: &(dyn Fn(usize, &T) -> Result<()> + Sync),
    ) -> Result<()>
    where
        E: std::ops::Deref<Target = T> + Send,
        T: ?Sized,
    {
        if rayon::current_num_threads() == 1 {
            for item in experts {
                let (i, e) = item?;
                use_expert(i, &e)?;
            }
            return Ok(());
        }
        let busy = Mutex::new(0usize);
        let freed = Condvar::new();
        let failed: Mutex<Option<ModelError>> = Mutex::new(None);
        let fail = |e: ModelError| {
            failed.lock().expect("expert failure lock").get_or_insert(e);
        };
        let room = |rows: usize, held: &usize| *held == 0 || held.saturating_add(rows) <= self.limit;
        rayon::in_place_scope(|s| {
            for item in experts {
                if failed.lock().expect("expert failure lock").is_some() {
                    break;
                }
                let (i, e) = match item {
                    Ok(x) => x,
                    Err(e) => {
                        fail(e);
                        break;
                    }
                };
                let rows = self.rows[i];
                // A pool thread runs the experts it handed out while there is no room; with
                // nothing left to run, it sleeps until one finishes.
                loop {
                    let roomy = room(rows, &busy.lock().expect("expert rows lock"));
                    if roomy || rayon::yield_now() != Some(rayon::Yield::Executed) {
                        break;
                    }
                }
                let mut held = busy.lock().expect("expert rows lock");
                while !room(rows, &held) {
                    held = freed.wait(held).expect("expert rows lock");
                }
                *held += rows;
                drop(held);
                let (busy, freed, fail) = (&busy, &freed, &fail);
                s.spawn(move |_| {
                    if let Err(err) = use_expert(i, &e) {
                        fail(err);
                    }
                    drop(e);
                    *busy.lock().expect("expert rows lock") -= rows;
                    freed.notify_all();
                });
            }
        });
        failed.into_inner().expect("expert failure lock").map_or(Ok(()), Err)
    }
}

/// Where the MoE block gets expert weights: every expert in RAM ([`ResidentExperts`]), or
/// streamed from disk through a cache (the engine's `StreamingExperts`).
pub trait ExpertStore: Send + Sync {
    /// Call `use_expert(i, expert)` once for each `ids[i]`, in whatever order the experts become
    /// available (resident ones first), several at once on rayon's threads: a prefill pass's
    /// layer runs hundreds of small experts, and one at a time each split over the threads
    /// spent half its time handing work over. Returns when every call has; starts no call after
    /// the first error, and returns one.
    fn with_experts(&self, work: &ExpertWork<'_>, use_expert: &UseExpert<'_>) -> Result<()>;

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
    fn with_experts(&self, work: &ExpertWork<'_>, use_expert: &UseExpert<'_>) -> Result<()> {
        let experts = work.ids.iter().enumerate().map(|(i, id)| {
            let e = self.experts.get(id).ok_or_else(|| nightmail_formats::FormatError::MissingTensor {
                name: format!("expert {} of layer {}", id.expert, id.layer),
            })?;
            Ok((i, e.as_ref()))
        });
        work.run(experts, use_expert)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rayon::prelude::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// Runs `rows.len()` items of `rows[i]` rows each within `limit`, from a thread of a pool of
    /// `threads` when `on_pool` (else from the test's thread, on the global pool); gives the most rows seen computing at once and
    /// how many times each item ran.
    fn run_items(threads: usize, on_pool: bool, rows: Vec<usize>, limit: usize) -> (usize, Vec<usize>) {
        let ids: Vec<ExpertId> = (0..rows.len()).map(|expert| ExpertId { layer: 0, expert }).collect();
        let work = ExpertWork { ids: &ids, rows, limit };
        let (busy, most) = (AtomicUsize::new(0), AtomicUsize::new(0));
        let ran: Vec<AtomicUsize> = ids.iter().map(|_| AtomicUsize::new(0)).collect();
        let go = || {
            let items = (0..ids.len()).map(|i| Ok((i, Box::new(i))));
            work.run(items, &|i, item: &usize| {
                assert_eq!(i, *item);
                let now = busy.fetch_add(work.rows[i], Ordering::SeqCst) + work.rows[i];
                most.fetch_max(now, Ordering::SeqCst);
                // Some work that splits over the pool, as an expert's matrices do.
                let sum: u64 = (0..20_000u64).into_par_iter().map(|v| v ^ i as u64).sum();
                assert!(sum > 0);
                busy.fetch_sub(work.rows[i], Ordering::SeqCst);
                ran[i].fetch_add(1, Ordering::SeqCst);
                Ok(())
            })
        };
        match on_pool {
            true => rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap().install(go).unwrap(),
            // From outside any pool: the global one computes.
            false => go().unwrap(),
        }
        (most.into_inner(), ran.into_iter().map(AtomicUsize::into_inner).collect())
    }

    #[test]
    fn each_expert_runs_once_and_rows_in_flight_stay_within_the_limit() {
        let rows: Vec<usize> = (0..64).map(|i| 1 + i % 7).collect();
        for (threads, on_pool) in [(1, true), (2, true), (4, true), (0, false)] {
            let (most, ran) = run_items(threads, on_pool, rows.clone(), 9);
            assert_eq!(ran, vec![1; rows.len()], "{threads} threads, on the pool: {on_pool}");
            assert!(most <= 9, "{most} rows at once on {threads} threads");
        }
    }

    #[test]
    fn an_item_wider_than_the_limit_runs_alone() {
        let (most, ran) = run_items(4, true, vec![3, 20, 3, 3], 8);
        assert_eq!(ran, vec![1; 4]);
        assert_eq!(most, 20, "the wide one ran with others");
    }

    #[test]
    fn the_first_error_is_returned_and_no_item_starts_after_it() {
        let ids: Vec<ExpertId> = (0..4).map(|expert| ExpertId { layer: 0, expert }).collect();
        let work = ExpertWork::one_row_each(&ids);
        let items = (0..4).map(|i| match i {
            2 => Err(ModelError::from(nightmail_formats::FormatError::MissingTensor { name: "cut".into() })),
            _ => Ok((i, Box::new(i))),
        });
        let ran = AtomicUsize::new(0);
        let pool = rayon::ThreadPoolBuilder::new().num_threads(2).build().unwrap();
        let err = pool
            .install(|| {
                work.run(items, &|_, _: &usize| {
                    ran.fetch_add(1, Ordering::SeqCst);
                    Ok(())
                })
            })
            .expect_err("the store's error comes back");
        assert!(err.to_string().contains("cut"), "{err}");
        assert_eq!(ran.into_inner(), 2, "the two before the error ran, none after");
    }
}
