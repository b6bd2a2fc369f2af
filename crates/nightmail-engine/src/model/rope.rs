//! Rotary position embeddings (Su et al., RoFormer, arXiv 2104.09864).

use candle_core::{Device, Tensor};

use crate::error::Result;
use crate::spec::RopeStyle;

pub struct Rope {
    inv_freq: Vec<f32>,
    style: RopeStyle,
    theta: f32,
}

impl Rope {
    pub fn new(head_dim: usize, theta: f64, style: RopeStyle) -> Self {
        // transformers' `_compute_default_rope_parameters`: 1 / theta^(2i/d), computed in f32.
        let inv_freq = (0..head_dim / 2).map(|i| 1.0 / (theta as f32).powf((2 * i) as f32 / head_dim as f32)).collect();
        Rope { inv_freq, style, theta: theta as f32 }
    }

    /// ggml's (cos, sin) per pair at `position` (see [`super::ggml::rope_angles`]).
    pub(super) fn ggml_angles(&self, position: usize) -> Vec<(f32, f32)> {
        super::ggml::rope_angles(position, self.inv_freq.len(), self.theta)
    }

    /// Rotate one head's row as `ggml_rope` does: GGUF llama files use NORMAL mode (adjacent
    /// pairs), the others NEOX (halves).
    pub(super) fn ggml_rotate(&self, row: &mut [f32], angles: &[(f32, f32)]) {
        super::ggml::rotate(row, angles, self.style == RopeStyle::Interleaved)
    }

    /// Rotate `x`: `[1, heads, tokens, head_dim]` for positions `start..start + tokens`.
    pub fn apply(&self, x: &Tensor, start: usize) -> Result<Tensor> {
        let tokens = x.dim(2)?;
        let half = self.inv_freq.len();
        let mut cos = Vec::with_capacity(tokens * half);
        let mut sin = Vec::with_capacity(tokens * half);
        for p in start..start + tokens {
            for f in &self.inv_freq {
                let angle = p as f32 * f;
                cos.push(angle.cos());
                sin.push(angle.sin());
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
