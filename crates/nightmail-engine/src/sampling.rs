//! Choosing the next token from a row of logits.

use crate::error::EngineError;
use rand::SeedableRng;
use rand_chacha::ChaCha12Rng;

use crate::error::Result;

/// How to pick tokens. `temperature` 0 means greedy (argmax); otherwise the logits are divided by
/// it, cut to the `top_k` best and to the smallest set whose probability reaches `top_p` (nucleus
/// sampling, Holtzman et al., arXiv 1904.09751), and drawn with a generator seeded by `seed`.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Sampling {
    pub temperature: f32,
    pub top_k: Option<usize>,
    pub top_p: Option<f32>,
    pub seed: u64,
}

impl Sampling {
    pub fn greedy() -> Self {
        Sampling { temperature: 0.0, top_k: None, top_p: None, seed: 0 }
    }
}

impl Default for Sampling {
    fn default() -> Self {
        Sampling::greedy()
    }
}

/// A sampler: the parameters and its random generator. The generator is ChaCha12 (what rand's
/// `StdRng` is), named so that its position in the stream can be saved in a checkpoint and set
/// again on resume: the draws after a resume are the draws an uninterrupted run would make.
pub(crate) struct Sampler {
    params: Sampling,
    rng: ChaCha12Rng,
}

impl Sampler {
    pub fn new(params: Sampling) -> Result<Self> {
        if !params.temperature.is_finite() || params.temperature < 0.0 {
            return Err(EngineError::Sampling(format!(
                "temperature {} must be 0 (greedy) or positive",
                params.temperature
            )));
        }
        if let Some(p) = params.top_p.filter(|p| !(*p > 0.0 && *p <= 1.0)) {
            return Err(EngineError::Sampling(format!("top_p {p} must be in (0, 1]")));
        }
        if params.top_k == Some(0) {
            return Err(EngineError::Sampling("top_k must be at least 1".into()));
        }
        Ok(Sampler { params, rng: ChaCha12Rng::seed_from_u64(params.seed) })
    }

    pub fn is_greedy(&self) -> bool {
        self.params.temperature == 0.0
    }

    /// The generator's position: 32-bit words drawn since seeding.
    pub fn position(&self) -> u128 {
        self.rng.get_word_pos()
    }

    pub fn set_position(&mut self, words: u128) {
        self.rng.set_word_pos(words);
    }

    pub fn sample(&mut self, logits: &[f32]) -> u32 {
        if self.params.temperature == 0.0 {
            return argmax(logits);
        }
        let t = self.params.temperature;
        let mut cand: Vec<(u32, f32)> = logits.iter().enumerate().map(|(i, l)| (i as u32, l / t)).collect();
        cand.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        if let Some(k) = self.params.top_k {
            cand.truncate(k);
        }
        let max = cand[0].1;
        let mut probs: Vec<f32> = cand.iter().map(|(_, l)| (l - max).exp()).collect();
        let sum: f32 = probs.iter().sum();
        probs.iter_mut().for_each(|p| *p /= sum);
        if let Some(top_p) = self.params.top_p {
            let mut acc = 0.0;
            let keep = probs.iter().position(|p| {
                acc += p;
                acc >= top_p
            });
            let keep = keep.map_or(probs.len(), |i| i + 1);
            probs.truncate(keep);
            let sum: f32 = probs.iter().sum();
            probs.iter_mut().for_each(|p| *p /= sum);
        }
        let r: f32 = rand::Rng::r#gen(&mut self.rng);
        let mut acc = 0.0;
        for (i, p) in probs.iter().enumerate() {
            acc += p;
            if r < acc {
                return cand[i].0;
            }
        }
        cand[probs.len() - 1].0
    }
}

/// Index of the largest logit; the first one on ties, as `torch.argmax`.
pub fn argmax(logits: &[f32]) -> u32 {
    let mut best = 0;
    for (i, l) in logits.iter().enumerate() {
        if *l > logits[best] {
            best = i;
        }
    }
    best as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn greedy_takes_the_first_largest_logit() {
        let mut s = Sampler::new(Sampling::greedy()).unwrap();
        assert_eq!(s.sample(&[0.1, 3.0, 3.0, -1.0]), 1);
    }

    #[test]
    fn top_k_one_is_greedy_at_any_temperature() {
        let mut s = Sampler::new(Sampling { temperature: 5.0, top_k: Some(1), top_p: None, seed: 7 }).unwrap();
        for _ in 0..20 {
            assert_eq!(s.sample(&[0.0, 1.0, 0.5]), 1);
        }
    }

    #[test]
    fn top_p_keeps_only_the_nucleus() {
        // Probabilities ≈ [0.87, 0.12, 0.01]: top_p 0.8 keeps only the first.
        let mut s = Sampler::new(Sampling { temperature: 1.0, top_k: None, top_p: Some(0.8), seed: 1 }).unwrap();
        for _ in 0..50 {
            assert_eq!(s.sample(&[4.0, 2.0, 0.0]), 0);
        }
    }

    #[test]
    fn the_same_seed_draws_the_same_tokens() {
        let params = Sampling { temperature: 1.0, top_k: None, top_p: None, seed: 42 };
        let logits = [0.0f32, 0.1, 0.2, 0.3, 0.4, 0.5];
        let draw = || {
            let mut s = Sampler::new(params).unwrap();
            (0..32).map(|_| s.sample(&logits)).collect::<Vec<_>>()
        };
        let a = draw();
        assert_eq!(a, draw());
        assert!(a.iter().collect::<std::collections::HashSet<_>>().len() > 1);
    }

    #[test]
    fn a_sampler_set_to_a_saved_position_draws_what_the_original_draws_next() {
        let params = Sampling { temperature: 1.0, top_k: None, top_p: None, seed: 9 };
        let logits = [0.0f32, 0.3, 0.1, 0.5, 0.2];
        let mut a = Sampler::new(params).unwrap();
        for _ in 0..7 {
            a.sample(&logits);
        }
        let mut b = Sampler::new(params).unwrap();
        b.set_position(a.position());
        let rest_a: Vec<u32> = (0..32).map(|_| a.sample(&logits)).collect();
        let rest_b: Vec<u32> = (0..32).map(|_| b.sample(&logits)).collect();
        assert_eq!(rest_a, rest_b);
    }

    /// The speculative sampling rule for a point-mass draft d, as generation applies it (draw as
    /// usual, accept d when the draw is d): over many draws, d is accepted with probability
    /// p(d), and a rejection's token follows the residual norm(max(0, p − q)), which is p
    /// without d renormalized (Leviathan et al., arXiv 2211.17192, Theorem 1). Chi-square of
    /// the rejected tokens against the residual, and the acceptance count within 4σ.
    #[test]
    fn drafts_are_accepted_with_the_target_probability_and_rejections_follow_the_residual() {
        let logits = [2.0f32, 1.0, 0.5, 0.0, -1.0, -3.0];
        let params = Sampling { temperature: 0.9, top_k: Some(5), top_p: None, seed: 2024 };
        // The target p: temperature, then the 5 best.
        let scaled: Vec<f64> = logits[..5].iter().map(|l| ((l / 0.9) as f64).exp()).collect();
        let total: f64 = scaled.iter().sum();
        let p: Vec<f64> = scaled.iter().map(|x| x / total).collect();
        for draft in [0u32, 2] {
            let mut s = Sampler::new(Sampling { seed: params.seed + draft as u64, ..params }).unwrap();
            let n = 40_000;
            let mut accepted = 0usize;
            let mut rejected = [0usize; 6];
            for _ in 0..n {
                let y = s.sample(&logits);
                if y == draft {
                    accepted += 1;
                } else {
                    rejected[y as usize] += 1;
                }
            }
            let pd = p[draft as usize];
            let sd = (n as f64 * pd * (1.0 - pd)).sqrt();
            assert!((accepted as f64 - n as f64 * pd).abs() < 4.0 * sd, "draft {draft}: {accepted} of {n}, p {pd}");
            assert_eq!(rejected[5], 0, "outside top_k");
            let rejections = (n - accepted) as f64;
            let chi2: f64 = (0..5)
                .filter(|&x| x != draft as usize)
                .map(|x| {
                    let want = rejections * p[x] / (1.0 - pd);
                    (rejected[x] as f64 - want).powi(2) / want
                })
                .sum();
            // 3 degrees of freedom: P(χ² > 21.1) ≈ 1e-4.
            assert!(chi2 < 21.1, "draft {draft}: rejections {rejected:?} against the residual, χ² = {chi2}");
        }
    }

    #[test]
    fn negative_temperature_is_rejected() {
        assert!(Sampler::new(Sampling { temperature: -1.0, ..Sampling::greedy() }).is_err());
    }
}
