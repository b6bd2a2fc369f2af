//! The two leaf parts: a linear map and RMSNorm.

use candle_core::quantized::QMatMul;
use candle_core::{Module, Tensor};

use crate::error::Result;
use crate::format::TensorView;

/// `y = x · Wᵀ (+ b)`, with W in f32 or in ggml quantized blocks.
pub struct Linear {
    weight: QMatMul,
    bias: Option<Tensor>,
}

impl Linear {
    pub(crate) fn new(weight: &TensorView<'_>, bias: Option<&TensorView<'_>>) -> Result<Self> {
        let mut weight = weight.clone();
        // A 1-D weight is a single output row (e.g. Qwen2-MoE's shared-expert gate in GGUF).
        if weight.shape.len() == 1 {
            weight.shape.insert(0, 1);
        }
        Ok(Linear { weight: weight.to_matmul()?, bias: bias.map(|b| b.to_f32()).transpose()? })
    }

    /// A float weight `[out, in]` already in memory.
    #[cfg(test)]
    pub(crate) fn from_tensor(weight: Tensor) -> Self {
        Linear { weight: QMatMul::Tensor(weight), bias: None }
    }

    /// `x`: `[tokens, in]` → `[tokens, out]`.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let y = self.weight.forward(x)?;
        Ok(match &self.bias {
            Some(b) => y.broadcast_add(b)?,
            None => y,
        })
    }
}

/// Root-mean-square layer norm (Zhang & Sennrich 2019, arXiv 1910.07467), over the last axis.
pub struct RmsNorm {
    weight: Tensor,
    eps: f32,
}

impl RmsNorm {
    pub(crate) fn new(weight: &TensorView<'_>, eps: f64) -> Result<Self> {
        Ok(RmsNorm { weight: weight.to_f32()?, eps: eps as f32 })
    }

    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        Ok(candle_nn::ops::rms_norm(&x.contiguous()?, &self.weight, self.eps)?)
    }
}
