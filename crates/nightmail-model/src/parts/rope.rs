//! Rotary position embeddings (Su et al., RoFormer, arXiv 2104.09864), optionally with YaRN's
//! frequency blend and attention factor (Peng et al., arXiv 2309.00071).

use candle_core::{Device, Tensor};

use crate::error::Result;
use crate::spec::{RopeStyle, Yarn};

pub struct Rope {
    inv_freq: Vec<f32>,
    style: RopeStyle,
    /// YaRN's attention factor, multiplying cos and sin (1 without scaling).
    attention_factor: f32,
    theta: f32,
}

impl Rope {
    /// Rotation of `dim` dimensions per head.
    pub fn new(dim: usize, theta: f64, style: RopeStyle, scaling: Option<&Yarn>) -> Self {
        // transformers' `_compute_default_rope_parameters`: 1 / theta^(2i/d), computed in f32.
        let pos_freqs: Vec<f32> = (0..dim / 2).map(|i| (theta as f32).powf((2 * i) as f32 / dim as f32)).collect();
        let Some(yarn) = scaling else {
            return Rope {
                inv_freq: pos_freqs.iter().map(|p| 1.0 / p).collect(),
                style,
                attention_factor: 1.0,
                theta: theta as f32,
            };
        };
        let ramp = yarn.ramp(dim, theta);
        let inv_freq = pos_freqs
            .iter()
            .zip(ramp)
            .map(|(p, r)| {
                // transformers' `_compute_yarn_parameters`: interpolated (1/(factor·p)) where the
                // ramp is 1 (long wavelengths), extrapolated (1/p) where it is 0, in f32.
                let (extrapolation, interpolation) = (1.0 / p, 1.0 / (yarn.factor as f32 * p));
                let keep = 1.0 - r;
                interpolation * (1.0 - keep) + extrapolation * keep
            })
            .collect();
        Rope { inv_freq, style, attention_factor: yarn.attention_factor as f32, theta: theta as f32 }
    }

    /// ggml's (cos, sin) per pair at `position` (see [`nightmail_tensor::ggml::rope_angles`]).
    pub fn ggml_angles(&self, position: usize) -> Vec<(f32, f32)> {
        nightmail_tensor::ggml::rope_angles(position, self.inv_freq.len(), self.theta)
    }

    /// Rotate one head's row as `ggml_rope` does: GGUF llama files use NORMAL mode (adjacent
    /// pairs), the others NEOX (halves).
    pub fn ggml_rotate(&self, row: &mut [f32], angles: &[(f32, f32)]) {
        nightmail_tensor::ggml::rotate(row, angles, self.style == RopeStyle::Interleaved)
    }

    /// Rotate one head's rotated part `x` (adjacent pairs, as many as the rope's frequencies) to
    /// `position` in place, or back from it (`inverse`: DeepSeek-V4 turns its attention output
    /// back by the query's angle, transformers' `apply_rotary_pos_emb(…, cos, -sin)`).
    pub fn rotate_pairs(&self, x: &mut [f32], position: usize, inverse: bool) {
        for (pair, f) in x.chunks_exact_mut(2).zip(&self.inv_freq) {
            let angle = position as f32 * f;
            let (cos, mut sin) = (angle.cos() * self.attention_factor, angle.sin() * self.attention_factor);
            if inverse {
                sin = -sin;
            }
            let (a, b) = (pair[0], pair[1]);
            pair[0] = a * cos + -b * sin;
            pair[1] = b * cos + a * sin;
        }
    }

    /// Rotate `x`: `[1, heads, tokens, head_dim]` for positions `start..start + tokens`. A head
    /// wider than the rotation keeps its last dimensions as they are (partial rotary,
    /// transformers' `apply_rotary_pos_emb` with a `rotary_dim` below head_dim; ggml_rope's
    /// `n_dims`).
    pub fn apply(&self, x: &Tensor, start: usize) -> Result<Tensor> {
        let (head_dim, rotated) = (x.dim(3)?, 2 * self.inv_freq.len());
        if head_dim > rotated {
            let turned = self.apply(&x.narrow(3, 0, rotated)?, start)?;
            let kept = x.narrow(3, rotated, head_dim - rotated)?.contiguous()?;
            return Ok(Tensor::cat(&[&turned, &kept], 3)?.contiguous()?);
        }
        let tokens = x.dim(2)?;
        let half = self.inv_freq.len();
        let mut cos = Vec::with_capacity(tokens * half);
        let mut sin = Vec::with_capacity(tokens * half);
        for p in start..start + tokens {
            for f in &self.inv_freq {
                let angle = p as f32 * f;
                cos.push(angle.cos() * self.attention_factor);
                sin.push(angle.sin() * self.attention_factor);
            }
        }
        let cos = Tensor::from_vec(cos, (tokens, half), &Device::Cpu)?;
        let sin = Tensor::from_vec(sin, (tokens, half), &Device::Cpu)?;
        let x = x.contiguous()?;
        Ok(match self.style {
            RopeStyle::HalfSplit => candle_nn::rotary_emb::rope(&x, &cos, &sin)?,
            RopeStyle::Interleaved => candle_nn::rotary_emb::rope_i(&x, &cos, &sin)?,
        })
    }
}

impl Yarn {
    /// Per frequency pair of a `dim`-wide rotation: 0 where it keeps its trained frequency
    /// (short wavelengths, more than `beta_fast` turns over the original context), 1 where it is
    /// interpolated by `factor` (fewer than `beta_slow` turns), linear between (YaRN §3.2,
    /// transformers' `find_correction_range` and `linear_ramp_factor`).
    fn ramp(&self, dim: usize, theta: f64) -> Vec<f32> {
        let correction_dim = |rotations: f64| {
            (dim as f64 * (self.original_context as f64 / (rotations * 2.0 * std::f64::consts::PI)).ln())
                / (2.0 * theta.ln())
        };
        let (mut low, mut high) = (correction_dim(self.beta_fast), correction_dim(self.beta_slow));
        if self.truncate {
            (low, high) = (low.floor(), high.ceil());
        }
        // transformers clamps to dim − 1 (not dim/2 − 1), as the reference does.
        let (low, mut high) = (low.max(0.0), high.min(dim as f64 - 1.0));
        if low == high {
            high += 0.001;
        }
        let span = (high - low) as f32;
        (0..dim / 2).map(|i| ((i as f32 - low as f32) / span).clamp(0.0, 1.0)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn yarn(truncate: bool) -> Yarn {
        Yarn {
            factor: 4.0,
            original_context: 64,
            beta_fast: 32.0,
            beta_slow: 1.0,
            truncate,
            attention_factor: 1.0,
            mscale_all_dim: 0.0,
        }
    }

    /// transformers 5.25 `ROPE_INIT_FUNCTIONS["yarn"]` for rope dim 16, theta 10000, factor 4,
    /// original context 64, beta 32/1, with `truncate` true and false.
    #[test]
    fn yarn_frequencies_match_transformers() {
        let truncated = [
            1.0,
            0.23717081546783447,
            0.04999999701976776,
            0.007905694656074047,
            0.0024999999441206455,
            0.0007905694656074047,
            0.0002500000118743628,
            7.905694656074047e-05,
        ];
        let untruncated = [
            1.0,
            0.19858352839946747,
            0.025595249608159065,
            0.007905694656074047,
            0.0024999999441206455,
            0.0007905694656074047,
            0.0002500000118743628,
            7.905694656074047e-05,
        ];
        for (truncate, want) in [(true, truncated), (false, untruncated)] {
            let rope = Rope::new(16, 10000.0, RopeStyle::HalfSplit, Some(&yarn(truncate)));
            for (i, (got, want)) in rope.inv_freq.iter().zip(want).enumerate() {
                assert!(
                    (got - want as f32).abs() <= f32::EPSILON * want as f32,
                    "truncate {truncate}, {i}: {got} vs {want}"
                );
            }
        }
    }

    #[test]
    fn the_attention_factor_scales_cos_and_sin() {
        let x = Tensor::ones((1, 1, 1, 4), candle_core::DType::F32, &Device::Cpu).unwrap();
        let plain = Rope::new(4, 10000.0, RopeStyle::HalfSplit, None).apply(&x, 3).unwrap();
        let scaled = Yarn { factor: 1.0, attention_factor: 1.5, ..yarn(true) };
        let scaled = Rope::new(4, 10000.0, RopeStyle::HalfSplit, Some(&scaled)).apply(&x, 3).unwrap();
        let (p, s) = (
            plain.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
            scaled.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
        );
        for (p, s) in p.iter().zip(&s) {
            assert!((p * 1.5 - s).abs() < 1e-6);
        }
    }
}
