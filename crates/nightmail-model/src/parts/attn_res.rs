//! AttnRes block residuals, Kimi K3's replacement of the plain residual (llama.cpp
//! src/models/kimi-k3.cpp, `graph::graph`, `res_mix`, `res_push`; the reference in
//! tests/fixtures/kimi_k3.py `KimiK3.forward`, `res_mix`). A layer whose index is a multiple of
//! `attn_res_block_size` banks its raw input and restarts the running sum from its attention
//! output; before attention, before the MLP and before the final norm, the running sum and the
//! banked inputs are mixed by a softmax over `res_proj(res_norm(candidate))`. The mix is over
//! layers at one position, so it needs no state across tokens. DeepSeek-V4's hyper-connection
//! streams (parts/hyper.rs) are the third kind of residual here.

use crate::error::ModelError;
use crate::source::WeightSource;
use candle_core::{D, Tensor};
use nightmail_tensor::Numerics;
use nightmail_tensor::TensorError;

use crate::error::Result;
use crate::parts::hyper::{HyperHead, HyperMix, Spread};
use nightmail_tensor::RmsNorm;

/// One mixing point's weights: `*_res_norm` and the `*_res_proj` row (`[hidden]`).
pub struct ResidualScore {
    norm: RmsNorm,
    proj: Tensor,
}

impl ResidualScore {
    pub fn new(norm: RmsNorm, proj: Tensor) -> Result<Self> {
        Ok(ResidualScore { norm, proj: proj.flatten_all()? })
    }

    /// `current` [tokens, hidden] mixed with `bank` (each [tokens, hidden]): the scores read the
    /// normed candidates, the sum the raw ones, all in f32. An empty bank returns `current`.
    pub fn mix(&self, current: &Tensor, bank: &[Tensor]) -> Result<Tensor> {
        if bank.is_empty() {
            return Ok(current.clone());
        }
        let mut all: Vec<&Tensor> = bank.iter().collect();
        all.push(current);
        let candidates = Tensor::stack(&all, 0)?; // [n, tokens, hidden]
        let scores = self.norm.forward(&candidates)?.broadcast_mul(&self.proj)?.sum(D::Minus1)?; // [n, tokens]
        let probs = candle_nn::ops::softmax(&scores, 0)?;
        Ok(candidates.broadcast_mul(&probs.unsqueeze(2)?)?.sum(0)?)
    }
}

/// The banked layer inputs of one forward pass.
pub struct ResidualBank {
    block_size: usize,
    inputs: Vec<Tensor>,
}

impl ResidualBank {
    pub fn new(block_size: usize) -> Self {
        ResidualBank { block_size, inputs: Vec::new() }
    }

    pub fn inputs(&self) -> &[Tensor] {
        &self.inputs
    }

    /// Banks `layer_input` if `layer` starts a block (after its pre-attention mix has read the
    /// bank); true when it did, and the running sum restarts from the attention output.
    pub fn bank(&mut self, layer: usize, layer_input: &Tensor) -> bool {
        let starts = layer.is_multiple_of(self.block_size);
        if starts {
            self.inputs.push(layer_input.clone());
        }
        starts
    }
}

/// A layer's two mixing points: before its attention (`self_attention_res_*`, `hc_attn_*`)
/// and before its MLP (`mlp_res_*`, `hc_ffn_*`).
pub enum LayerResidual {
    /// Kimi K3's AttnRes scores.
    AttnRes { attention: ResidualScore, ffn: ResidualScore },
    /// DeepSeek-V4's hyper-connection mixes (parts/hyper.rs).
    Hyper { attention: HyperMix, ffn: HyperMix },
}

/// The residual stream through the layers of one forward pass (every row a position): the plain
/// sum `x + attention + mlp`, AttnRes's running sum beside its bank, mixed at each point, or
/// DeepSeek-V4's hyper-connection streams.
pub enum ResidualStream {
    Plain(Tensor),
    Blocks {
        sum: Tensor,
        bank: ResidualBank,
        /// Whether the current layer banked its input (its attention output restarts the sum).
        restart: bool,
    },
    Hyper {
        /// `[tokens, hc_mult, hidden]`.
        streams: Tensor,
        /// The open block's spread (set by the collapse before it).
        open: Option<Spread>,
    },
}

fn no_scores() -> ModelError {
    ModelError::from(TensorError::Compute(candle_core::Error::Msg(
        "a layer has no weights for the model's residual kind".into(),
    )))
}

impl ResidualStream {
    /// The embeddings `x`, with AttnRes blocks of `block` layers where the model has them.
    pub fn new(x: Tensor, block: Option<usize>) -> Self {
        match block {
            Some(block) => ResidualStream::Blocks { sum: x, bank: ResidualBank::new(block), restart: false },
            None => ResidualStream::Plain(x),
        }
    }

    /// The embeddings `x` copied into `n` hyper-connection streams.
    pub fn hyper(x: &Tensor, n: usize) -> Result<Self> {
        let (tokens, hidden) = x.dims2()?;
        let streams = x.unsqueeze(1)?.broadcast_as((tokens, n, hidden))?.contiguous()?;
        Ok(ResidualStream::Hyper { streams, open: None })
    }

    /// What layer `l`'s attention norm reads: the stream, or its mix with the bank (which the
    /// layer then joins if it starts a block), or the streams collapsed.
    pub fn before_attention(&mut self, l: usize, scores: Option<&LayerResidual>) -> Result<Tensor> {
        match (self, scores) {
            (ResidualStream::Plain(x), _) => Ok(x.clone()),
            (ResidualStream::Blocks { sum, bank, restart }, Some(LayerResidual::AttnRes { attention, .. })) => {
                let mixed = attention.mix(sum, bank.inputs())?;
                *restart = bank.bank(l, sum);
                Ok(mixed)
            }
            (ResidualStream::Hyper { streams, open }, Some(LayerResidual::Hyper { attention, .. })) => {
                let (x, spread) = attention.collapse(streams)?;
                *open = Some(spread);
                Ok(x)
            }
            _ => Err(no_scores()),
        }
    }

    pub fn add_attention(&mut self, a: &Tensor) -> Result<()> {
        match self {
            ResidualStream::Plain(x) => *x = (&*x + a)?,
            ResidualStream::Blocks { sum, restart: true, .. } => *sum = a.clone(),
            ResidualStream::Blocks { sum, .. } => *sum = (&*sum + a)?,
            ResidualStream::Hyper { .. } => self.spread(a)?,
        }
        Ok(())
    }

    fn spread(&mut self, block: &Tensor) -> Result<()> {
        if let ResidualStream::Hyper { streams, open } = self {
            let spread = open.take().ok_or_else(no_scores)?;
            *streams = HyperMix::spread(&spread, block, streams)?;
        }
        Ok(())
    }

    /// What the MLP norm reads.
    pub fn before_ffn(&mut self, scores: Option<&LayerResidual>) -> Result<Tensor> {
        match (self, scores) {
            (ResidualStream::Plain(x), _) => Ok(x.clone()),
            (ResidualStream::Blocks { sum, bank, .. }, Some(LayerResidual::AttnRes { ffn, .. })) => {
                ffn.mix(sum, bank.inputs())
            }
            (ResidualStream::Hyper { streams, open }, Some(LayerResidual::Hyper { ffn, .. })) => {
                let (x, spread) = ffn.collapse(streams)?;
                *open = Some(spread);
                Ok(x)
            }
            _ => Err(no_scores()),
        }
    }

    pub fn add_ffn(&mut self, f: &Tensor) -> Result<()> {
        match self {
            ResidualStream::Plain(x) | ResidualStream::Blocks { sum: x, .. } => *x = (&*x + f)?,
            ResidualStream::Hyper { .. } => self.spread(f)?,
        }
        Ok(())
    }

    /// The running sum (the plain stream; the streams' mean for hyper-connections), which the
    /// prefetcher's lookahead reads.
    pub fn current(&self) -> Result<Tensor> {
        match self {
            ResidualStream::Plain(x) | ResidualStream::Blocks { sum: x, .. } => Ok(x.clone()),
            ResidualStream::Hyper { streams, .. } => Ok(streams.mean(1)?),
        }
    }

    /// What the final norm reads: the stream, or its last mix with the bank (`output_attn_res_*`),
    /// or the streams collapsed by the head.
    pub fn finish(self, scores: Option<&ResidualScore>, head: Option<&HyperHead>) -> Result<Tensor> {
        match (self, head) {
            (ResidualStream::Plain(x), _) => Ok(x),
            (ResidualStream::Blocks { sum, bank, .. }, _) => scores.ok_or_else(no_scores)?.mix(&sum, bank.inputs()),
            (ResidualStream::Hyper { streams, .. }, Some(head)) => head.collapse(&streams),
            (ResidualStream::Hyper { .. }, None) => Err(no_scores()),
        }
    }
}

impl ResidualScore {
    /// One AttnRes mixing point's weights: `{name}_norm.weight` `[hidden]` and the score row
    /// `{name}_proj.weight` `[1, hidden]` (parts/attn_res.rs).
    pub fn load(
        ck: &dyn WeightSource,
        name: &str,
        hidden: usize,
        eps: f64,
        numerics: Numerics,
    ) -> Result<ResidualScore> {
        // llama.cpp's kimi-k3 GGUF holds only the product of the norm's weight and the projection
        // (convert_hf_to_gguf.py KimiK3Model `_try_fuse_res`), which its `res_mix` multiplies into
        // the unweighted norm and sums: that order is the norm weighted by the product, then a
        // projection of ones.
        if let Some(score) = ck.tensor(&format!("{name}_score.weight"))? {
            score.expect_shape(&[hidden])?;
            let ones = candle_core::Tensor::ones(hidden, candle_core::DType::F32, &candle_core::Device::Cpu)?;
            return ResidualScore::new(RmsNorm::new(&score, eps, numerics)?, ones);
        }
        let proj = ck.require(&format!("{name}_proj.weight"))?;
        proj.expect_shape(&[1, hidden])?;
        ResidualScore::new(RmsNorm::new(&ck.require(&format!("{name}_norm.weight"))?, eps, numerics)?, proj.to_f32()?)
    }
}

#[cfg(test)]
mod tests {
    use candle_core::Device;

    use super::*;

    fn score(gain: [f32; 2], proj: [f32; 2]) -> ResidualScore {
        let t = |v: [f32; 2]| Tensor::new(&v, &Device::Cpu).unwrap();
        ResidualScore::new(RmsNorm::from_tensor(t(gain), 0.0), t(proj)).unwrap()
    }

    fn row(v: [f32; 2]) -> Tensor {
        Tensor::new(&[v], &Device::Cpu).unwrap()
    }

    fn close(got: &Tensor, want: [f32; 2]) {
        let got: Vec<f32> = got.flatten_all().unwrap().to_vec1().unwrap();
        for (g, w) in got.iter().zip(want) {
            assert!((g - w).abs() < 1e-6, "{got:?} vs {want:?}");
        }
    }

    /// By hand (as test_kimi_k3.py): bank a = [1, 1] (rms 1), current c = [3, −3] (rms 3) normalize
    /// to [1, 1] and [1, −1]; proj [ln2/2, ln2/2] scores them ln 2 and 0, softmax 2/3 and 1/3, and
    /// the raw sum is [5/3, −1/3].
    #[test]
    fn softmax_over_normed_scores_sums_raw() {
        let h = std::f32::consts::LN_2 / 2.0;
        let mixed = score([1.0, 1.0], [h, h]).mix(&row([3.0, -3.0]), &[row([1.0, 1.0])]).unwrap();
        close(&mixed, [5.0 / 3.0, -1.0 / 3.0]);
    }

    /// The norm's gain enters the scores: gain [2, 0] with proj [ln2/2, 0] scores both ln 2, so
    /// each weighs 1/2: [2, −1].
    #[test]
    fn norm_gain_scales_scores() {
        let h = std::f32::consts::LN_2 / 2.0;
        let mixed = score([2.0, 0.0], [h, 0.0]).mix(&row([3.0, -3.0]), &[row([1.0, 1.0])]).unwrap();
        close(&mixed, [2.0, -1.0]);
    }

    #[test]
    fn empty_bank_is_the_current_stream() {
        close(&score([1.0, 1.0], [1.0, 1.0]).mix(&row([3.0, -3.0]), &[]).unwrap(), [3.0, -3.0]);
    }

    /// With a block of 2, layers 0, 2, 4 bank their inputs and the others do not.
    #[test]
    fn banks_at_block_starts() {
        let mut bank = ResidualBank::new(2);
        let banked: Vec<bool> = (0..5).map(|l| bank.bank(l, &row([l as f32, 0.0]))).collect();
        assert_eq!(banked, [true, false, true, false, true]);
        assert_eq!(bank.inputs().len(), 3);
    }
}
