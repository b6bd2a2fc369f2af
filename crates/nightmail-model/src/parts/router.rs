//! The router: which experts each token goes to, and with what weight.

use candle_core::Tensor;
use rayon::prelude::*;

use crate::error::Result;
use crate::spec::ModelSpec;
use crate::spec::Routing;
use nightmail_formats::{FormatError, ModelFile};
use nightmail_tensor::Linear;

/// One token's chosen experts and their weights, best first.
#[derive(Debug, Clone, PartialEq)]
pub struct ExpertRoute {
    pub experts: Vec<(usize, f32)>,
}

pub struct Router {
    pub(crate) gate: Linear,
    pub(crate) routing: Routing,
    /// DeepSeek-V3's `e_score_correction_bias` (GGUF `exp_probs_b`): shifts the choice, not the
    /// weights.
    pub(crate) choice_bias: Option<Vec<f32>>,
}

impl Router {
    /// `x`: `[tokens, hidden]` → one route per token.
    pub fn route(&self, x: &Tensor) -> Result<Vec<ExpertRoute>> {
        let logits = self.gate.forward(x)?.to_vec2::<f32>()?;
        // Each token is chosen alone: a prefill pass's thousand tokens over the threads.
        Ok(logits.par_iter().map(|row| self.choose(row)).collect())
    }

    /// DeepSeek-V4's hash-routed layers (transformers `DeepseekV4HashRouter`): the experts are
    /// `experts[t]`, fixed by token t's id (`tid2eid`); the gate still weighs them, as
    /// [`Routing::SqrtSoftplus`] weighs its own choice.
    pub fn route_hashed(&self, x: &Tensor, experts: &[&[u32]]) -> Result<Vec<ExpertRoute>> {
        let logits = self.gate.forward(x)?.to_vec2::<f32>()?;
        let scale = match self.routing {
            Routing::SqrtSoftplus { scale, .. } => scale,
            _ => 1.0,
        };
        Ok(logits
            .par_iter()
            .zip(experts)
            .map(|(row, chosen)| {
                let scores = sqrt_softplus(row);
                weighed(chosen.iter().map(|&e| (e as usize, scores[e as usize])).collect(), scale)
            })
            .collect())
    }

    fn choose(&self, logits: &[f32]) -> ExpertRoute {
        match self.routing {
            // transformers `MixtralTopKRouter` / `Qwen2MoeTopKRouter`: softmax in f32, top-k of the
            // probabilities, optional renormalization over the chosen k.
            Routing::SoftmaxTopK { top_k, normalize } => {
                let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                let exp: Vec<f32> = logits.iter().map(|l| (l - max).exp()).collect();
                let sum: f32 = exp.iter().sum();
                let mut experts: Vec<(usize, f32)> =
                    best_first(&exp, (0..exp.len()).collect(), top_k).into_iter().map(|e| (e, exp[e] / sum)).collect();
                if normalize {
                    let chosen: f32 = experts.iter().map(|(_, w)| w).sum();
                    experts.iter_mut().for_each(|(_, w)| *w /= chosen);
                }
                ExpertRoute { experts }
            }
            // transformers `GptOssTopKRouter`: `torch.topk` of the logits, then a softmax over the
            // k values alone.
            Routing::TopKSoftmax { top_k } => {
                let chosen = &best_first(logits, (0..logits.len()).collect(), top_k);
                let max = logits[chosen[0]];
                let exp: Vec<f32> = chosen.iter().map(|&e| (logits[e] - max).exp()).collect();
                let sum: f32 = exp.iter().sum();
                ExpertRoute { experts: chosen.iter().zip(&exp).map(|(&e, x)| (e, x / sum)).collect() }
            }
            Routing::GroupedSigmoid { top_k, groups, top_groups, normalize, scale } => {
                let scores: Vec<f32> = logits.iter().map(|l| 1.0 / (1.0 + (-l).exp())).collect();
                let choice: Vec<f32> = match &self.choice_bias {
                    Some(b) => scores.iter().zip(b).map(|(s, b)| s + b).collect(),
                    None => scores.clone(),
                };
                let experts = grouped_top_k(&choice, groups, top_groups, top_k);
                let mut experts: Vec<(usize, f32)> = experts.into_iter().map(|e| (e, scores[e])).collect();
                if normalize {
                    // The reference's 1e-20 keeps an all-zero choice finite.
                    let chosen: f32 = experts.iter().map(|(_, w)| w).sum::<f32>() + 1e-20;
                    experts.iter_mut().for_each(|(_, w)| *w /= chosen);
                }
                experts.iter_mut().for_each(|(_, w)| *w *= scale);
                ExpertRoute { experts }
            }
            // transformers `DeepseekV4TopKRouter`: topk of the biased scores; the weights are the
            // unbiased scores, renormalized (+1e-20), times the scaling factor.
            Routing::SqrtSoftplus { top_k, scale } => {
                let scores = sqrt_softplus(logits);
                let choice: Vec<f32> = match &self.choice_bias {
                    Some(b) => scores.iter().zip(b).map(|(s, b)| s + b).collect(),
                    None => scores.clone(),
                };
                let chosen = best_first(&choice, (0..choice.len()).collect(), top_k);
                weighed(chosen.into_iter().map(|e| (e, scores[e])).collect(), scale)
            }
        }
    }
}

/// `sqrt(softplus(x))` (transformers `SqrtSoftplusActivation`; torch's softplus is x itself
/// past 20).
fn sqrt_softplus(logits: &[f32]) -> Vec<f32> {
    logits.iter().map(|&l| if l > 20.0 { l } else { l.exp().ln_1p() }.sqrt()).collect()
}

/// Chosen experts' scores renormalized to sum to one (the reference's 1e-20 keeps an all-zero
/// choice finite), times `scale`.
fn weighed(mut experts: Vec<(usize, f32)>, scale: f32) -> ExpertRoute {
    let sum: f32 = experts.iter().map(|(_, w)| w).sum::<f32>() + 1e-20;
    experts.iter_mut().for_each(|(_, w)| *w = *w / sum * scale);
    ExpertRoute { experts }
}

/// DeepSeek-V3's node-limited choice (`Gate.forward` in DeepSeek-V3's `inference/model.py`,
/// transformers' `DeepseekV3TopkRouter`): each of `groups` contiguous groups of experts is scored
/// by the sum of its two best `choice` values, the best `top_groups` groups stay eligible, and
/// the `top_k` best eligible experts are chosen, best first (ties to the lower index).
fn grouped_top_k(choice: &[f32], groups: usize, top_groups: usize, top_k: usize) -> Vec<usize> {
    let per = choice.len() / groups;
    let group_score: Vec<f32> = (0..groups)
        .map(|g| {
            let members = &choice[g * per..(g + 1) * per];
            best_first(members, (0..per).collect(), 2).iter().map(|&i| members[i]).sum()
        })
        .collect();
    let order = best_first(&group_score, (0..groups).collect(), top_groups);
    let eligible: Vec<usize> = order.iter().flat_map(|g| g * per..(g + 1) * per).collect();
    best_first(choice, eligible, top_k)
}

/// The `k` of `candidates` with the largest `values`, best first, ties to the lower index: a full
/// sort's first k (the order is total), found by selection (a prefill routes every token of a
/// pass over hundreds of experts).
fn best_first(values: &[f32], mut candidates: Vec<usize>, k: usize) -> Vec<usize> {
    let better = |a: &usize, b: &usize| values[*b].total_cmp(&values[*a]).then(a.cmp(b));
    let k = k.min(candidates.len());
    if k < candidates.len() && k > 0 {
        candidates.select_nth_unstable_by(k - 1, better);
    }
    candidates.truncate(k);
    candidates.sort_by(better);
    candidates
}

/// A hash-routed layer's `tid2eid` rows, flat, and the experts per token.
pub type HashTable = (Vec<u32>, usize);

/// Per layer, DeepSeek-V4's token-id → experts table where the layer is hash-routed: `[vocab,
/// top_k]` ids below the expert count, or an error naming the tensor and the file.
pub fn hash_routes(ck: &ModelFile, spec: &ModelSpec) -> Result<Vec<Option<HashTable>>> {
    let (Some(v4), Some(moe)) = (&spec.deepseek_v4, &spec.moe) else { return Ok(vec![None; spec.layers]) };
    let k = moe.routing.top_k();
    (0..spec.layers)
        .map(|l| {
            if !v4.hash_layers[l] {
                return Ok(None);
            }
            let name = format!("blk.{l}.ffn_gate_tid2eid.weight");
            let (table, shape) = match ck.index_table(&name)? {
                Some(t) => t,
                // Absent: `require`'s error names it as the file would.
                None => {
                    ck.require(&name)?;
                    return Err(FormatError::MissingTensor { name }.into());
                }
            };
            if shape != [spec.vocab_size, k] || table.iter().any(|&e| e as usize >= moe.experts) {
                return Err(FormatError::BadMetadata {
                    key: name,
                    reason: format!("shape {shape:?}: [{}, {k}] ids below {} expected", spec.vocab_size, moe.experts),
                }
                .into());
            }
            Ok(Some((table, k)))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn router(top_k: usize, normalize: bool) -> Router {
        with_routing(Routing::SoftmaxTopK { top_k, normalize })
    }

    fn with_routing(routing: Routing) -> Router {
        let w = Tensor::zeros((3, 2), candle_core::DType::F32, &candle_core::Device::Cpu).unwrap();
        Router { gate: Linear::from_tensor(w), routing, choice_bias: None }
    }

    #[test]
    fn top_k_then_softmax_weighs_the_chosen_logits_among_themselves() {
        let r = with_routing(Routing::TopKSoftmax { top_k: 2 }).choose(&[0.5, -1.0, 3.0]);
        assert_eq!(r.experts.iter().map(|e| e.0).collect::<Vec<_>>(), vec![2, 0]);
        let z = 3f32.exp() + 0.5f32.exp();
        assert!((r.experts[0].1 - 3f32.exp() / z).abs() < 1e-6);
        assert!((r.experts[1].1 - 0.5f32.exp() / z).abs() < 1e-6);
    }

    fn grouped(bias: Vec<f32>, normalize: bool) -> Router {
        let w = Tensor::zeros((8, 2), candle_core::DType::F32, &candle_core::Device::Cpu).unwrap();
        let routing = Routing::GroupedSigmoid { top_k: 2, groups: 4, top_groups: 2, normalize, scale: 2.5 };
        Router { gate: Linear::from_tensor(w), routing, choice_bias: Some(bias) }
    }

    fn sigmoid(x: f32) -> f32 {
        1.0 / (1.0 + (-x).exp())
    }

    #[test]
    fn grouped_sigmoid_chooses_within_the_best_groups_by_biased_score_and_weights_unbiased() {
        // Groups of two: {0,1} {2,3} {4,5} {6,7}. Expert 0 alone has the best logit, but its
        // group's sum loses to {2,3} and {6,7}; the bias lifts expert 7 above expert 6.
        let logits = [3.0, -3.0, 1.0, 1.0, -1.0, -1.0, 0.9, 0.8];
        let bias = vec![0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.2];
        let r = grouped(bias.clone(), false).choose(&logits);
        let ids: Vec<usize> = r.experts.iter().map(|e| e.0).collect();
        // Biased: 7 = σ(0.8)+0.2 ≈ 0.890 leads 2 and 3 (σ(1) ≈ 0.731) and 6 (≈ 0.711).
        assert_eq!(ids, vec![7, 2]);
        assert!((r.experts[0].1 - 2.5 * sigmoid(0.8)).abs() < 1e-6, "weights are unbiased scores");
        assert!((r.experts[1].1 - 2.5 * sigmoid(1.0)).abs() < 1e-6);
        let n = grouped(bias, true).choose(&logits);
        let sum = sigmoid(0.8) + sigmoid(1.0);
        assert!((n.experts[0].1 - 2.5 * sigmoid(0.8) / sum).abs() < 1e-6);
        assert!((n.experts.iter().map(|e| e.1).sum::<f32>() - 2.5).abs() < 1e-5);
    }

    #[test]
    fn softmax_top_k_picks_the_largest_and_keeps_softmax_weights() {
        let r = router(2, false).choose(&[0.0, 2.0, 1.0]);
        let z = 1.0 + 2f32.exp() + 1f32.exp();
        assert_eq!(r.experts.iter().map(|e| e.0).collect::<Vec<_>>(), vec![1, 2]);
        assert!((r.experts[0].1 - 2f32.exp() / z).abs() < 1e-6);
        assert!((r.experts[1].1 - 1f32.exp() / z).abs() < 1e-6);
    }

    #[test]
    fn normalized_top_k_weights_sum_to_one() {
        let r = router(2, true).choose(&[0.0, 2.0, 1.0]);
        let sum: f32 = r.experts.iter().map(|e| e.1).sum();
        assert!((sum - 1.0).abs() < 1e-6);
        assert!((r.experts[0].1 - 2f32.exp() / (2f32.exp() + 1f32.exp())).abs() < 1e-6);
    }
}
