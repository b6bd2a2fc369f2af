//! The router: which experts each token goes to, and with what weight.

use candle_core::Tensor;

use super::layers::Linear;
use crate::error::Result;
use crate::spec::Routing;

/// One token's chosen experts and their weights, best first.
#[derive(Debug, Clone, PartialEq)]
pub struct Route {
    pub experts: Vec<(usize, f32)>,
}

pub struct Router {
    pub(crate) gate: Linear,
    pub(crate) routing: Routing,
}

impl Router {
    /// `x`: `[tokens, hidden]` → one route per token.
    pub fn route(&self, x: &Tensor) -> Result<Vec<Route>> {
        let logits = self.gate.forward(x)?.to_vec2::<f32>()?;
        Ok(logits.iter().map(|row| self.choose(row)).collect())
    }

    fn choose(&self, logits: &[f32]) -> Route {
        match self.routing {
            // transformers `MixtralTopKRouter` / `Qwen2MoeTopKRouter`: softmax in f32, top-k of the
            // probabilities, optional renormalization over the chosen k.
            Routing::SoftmaxTopK { top_k, normalize } => {
                let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                let exp: Vec<f32> = logits.iter().map(|l| (l - max).exp()).collect();
                let sum: f32 = exp.iter().sum();
                let mut order: Vec<usize> = (0..logits.len()).collect();
                order.sort_by(|a, b| exp[*b].total_cmp(&exp[*a]).then(a.cmp(b)));
                let mut experts: Vec<(usize, f32)> = order[..top_k].iter().map(|&e| (e, exp[e] / sum)).collect();
                if normalize {
                    let chosen: f32 = experts.iter().map(|(_, w)| w).sum();
                    experts.iter_mut().for_each(|(_, w)| *w /= chosen);
                }
                Route { experts }
            }
            // transformers `GptOssTopKRouter`: `torch.topk` of the logits, then a softmax over the
            // k values alone.
            Routing::TopKSoftmax { top_k } => {
                let mut order: Vec<usize> = (0..logits.len()).collect();
                order.sort_by(|a, b| logits[*b].total_cmp(&logits[*a]).then(a.cmp(b)));
                let chosen = &order[..top_k];
                let max = logits[chosen[0]];
                let exp: Vec<f32> = chosen.iter().map(|&e| (logits[e] - max).exp()).collect();
                let sum: f32 = exp.iter().sum();
                Route { experts: chosen.iter().zip(&exp).map(|(&e, x)| (e, x / sum)).collect() }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn router(top_k: usize, normalize: bool) -> Router {
        with_routing(Routing::SoftmaxTopK { top_k, normalize })
    }

    fn with_routing(routing: Routing) -> Router {
        let w = Tensor::zeros((3, 2), candle_core::DType::F32, &candle_core::Device::Cpu).unwrap();
        Router { gate: Linear::from_tensor(w), routing }
    }

    #[test]
    fn top_k_then_softmax_weighs_the_chosen_logits_among_themselves() {
        let r = with_routing(Routing::TopKSoftmax { top_k: 2 }).choose(&[0.5, -1.0, 3.0]);
        assert_eq!(r.experts.iter().map(|e| e.0).collect::<Vec<_>>(), vec![2, 0]);
        let z = 3f32.exp() + 0.5f32.exp();
        assert!((r.experts[0].1 - 3f32.exp() / z).abs() < 1e-6);
        assert!((r.experts[1].1 - 0.5f32.exp() / z).abs() < 1e-6);
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
