//! The decoder stack: pre-norm layers of attention and feed-forward with residuals (the llama
//! layout, which all four architectures share), then a final norm and the output head.

use std::sync::Arc;

use candle_core::quantized::GgmlDType;
use candle_core::{Device, Tensor};

use super::attention::Attention;
use super::expert::{Expert, ExpertStore};
use super::layers::{Linear, RmsNorm};
use super::moe::{MoeBlock, SharedExpert};
use super::rope::Rope;
use super::router::Router;
use crate::error::{EngineError, Result};
use crate::format::{Checkpoint, TensorView};
use crate::spec::ModelSpec;

pub enum FeedForward {
    Dense(Expert),
    Moe(MoeBlock),
}

pub struct DecoderLayer {
    attn_norm: RmsNorm,
    attention: Attention,
    ffn_norm: RmsNorm,
    ffn: FeedForward,
}

impl DecoderLayer {
    fn forward(&self, x: &Tensor, start: usize, cache: &mut candle_nn::kv_cache::KvCache) -> Result<Tensor> {
        let h = (x + self.attention.forward(&self.attn_norm.forward(x)?, start, cache)?)?;
        let n = self.ffn_norm.forward(&h)?;
        let f = match &self.ffn {
            FeedForward::Dense(mlp) => mlp.forward(&n)?,
            FeedForward::Moe(moe) => moe.forward(&n)?,
        };
        Ok((h + f)?)
    }
}

/// Token embeddings, kept in their file encoding and dequantized a row at a time.
struct Embedding {
    bytes: Vec<u8>,
    dtype: GgmlDType,
    rows: usize,
    cols: usize,
}

impl Embedding {
    fn rows(&self, tokens: &[u32]) -> Result<Tensor> {
        let view = TensorView {
            name: "token_embd.weight".into(),
            dtype: self.dtype,
            shape: vec![self.rows, self.cols],
            bytes: &self.bytes,
        };
        let mut data = Vec::with_capacity(tokens.len() * self.cols);
        for &t in tokens {
            if t as usize >= self.rows {
                return Err(EngineError::TokenOutOfRange { id: t, vocab: self.rows });
            }
            data.extend(view.row(t as usize)?);
        }
        Ok(Tensor::from_vec(data, (tokens.len(), self.cols), &Device::Cpu)?)
    }
}

/// The attention keys and values of one sequence so far.
pub struct KvCache {
    layers: Vec<candle_nn::kv_cache::KvCache>,
    position: usize,
}

impl KvCache {
    /// Tokens already in the cache.
    pub fn position(&self) -> usize {
        self.position
    }
}

pub struct Transformer {
    embedding: Embedding,
    layers: Vec<DecoderLayer>,
    norm: RmsNorm,
    lm_head: Linear,
}

impl Transformer {
    pub(crate) fn load(ck: &Checkpoint, spec: &ModelSpec, experts: Arc<dyn ExpertStore>) -> Result<Self> {
        let (hidden, a) = (spec.hidden_size, &spec.attention);
        let embd = ck.require("token_embd.weight")?;
        embd.expect_shape(&[spec.vocab_size, hidden])?;
        let embedding =
            Embedding { bytes: embd.bytes.to_vec(), dtype: embd.dtype, rows: spec.vocab_size, cols: hidden };
        // Tied embeddings (SmolLM2, the llama fixture): no output.weight, reuse token_embd.
        let head = ck.tensor("output.weight")?.unwrap_or(embd);
        head.expect_shape(&[spec.vocab_size, hidden])?;
        let mut layers = Vec::with_capacity(spec.layers);
        for l in 0..spec.layers {
            let t = |name: &str| ck.require(&format!("blk.{l}.{name}"));
            let opt = |name: &str| ck.tensor(&format!("blk.{l}.{name}"));
            let linear = |name: &str, rows: usize, cols: usize| -> Result<Linear> {
                let w = t(&format!("{name}.weight"))?;
                w.expect_shape(&[rows, cols])?;
                Linear::new(&w, opt(&format!("{name}.bias"))?.as_ref())
            };
            let (q_dim, kv_dim) = (a.heads * a.head_dim, a.kv_heads * a.head_dim);
            let qk_norm = match (opt("attn_q_norm.weight")?, opt("attn_k_norm.weight")?) {
                (Some(q), Some(k)) => {
                    Some((RmsNorm::new(&q, spec.rms_norm_eps)?, RmsNorm::new(&k, spec.rms_norm_eps)?))
                }
                _ => None,
            };
            let attention = Attention {
                q: linear("attn_q", q_dim, hidden)?,
                k: linear("attn_k", kv_dim, hidden)?,
                v: linear("attn_v", kv_dim, hidden)?,
                o: linear("attn_output", hidden, q_dim)?,
                qk_norm,
                rope: Rope::new(a.head_dim, a.rope_theta, a.rope_style),
                heads: a.heads,
                kv_heads: a.kv_heads,
                head_dim: a.head_dim,
                window: a.sliding_window[l],
            };
            let ffn = match (&spec.moe, spec.moe_layers[l]) {
                (Some(moe), true) => {
                    let router = Router { gate: linear("ffn_gate_inp", moe.experts, hidden)?, routing: moe.routing };
                    let shared = match moe.shared_expert_ffn {
                        Some(f) => Some(SharedExpert {
                            expert: Expert::new(
                                linear("ffn_gate_shexp", f, hidden)?,
                                linear("ffn_up_shexp", f, hidden)?,
                                linear("ffn_down_shexp", hidden, f)?,
                            ),
                            gate: opt("ffn_gate_inp_shexp.weight")?.map(|g| Linear::new(&g, None)).transpose()?,
                        }),
                        None => None,
                    };
                    FeedForward::Moe(MoeBlock { layer: l, router, experts: experts.clone(), shared })
                }
                _ => FeedForward::Dense(Expert::new(
                    linear("ffn_gate", spec.ffn, hidden)?,
                    linear("ffn_up", spec.ffn, hidden)?,
                    linear("ffn_down", hidden, spec.ffn)?,
                )),
            };
            layers.push(DecoderLayer {
                attn_norm: RmsNorm::new(&t("attn_norm.weight")?, spec.rms_norm_eps)?,
                attention,
                ffn_norm: RmsNorm::new(&t("ffn_norm.weight")?, spec.rms_norm_eps)?,
                ffn,
            });
        }
        Ok(Transformer {
            embedding,
            layers,
            norm: RmsNorm::new(&ck.require("output_norm.weight")?, spec.rms_norm_eps)?,
            lm_head: Linear::new(&head, None)?,
        })
    }

    pub fn new_cache(&self) -> KvCache {
        KvCache { layers: self.layers.iter().map(|_| candle_nn::kv_cache::KvCache::new(2, 256)).collect(), position: 0 }
    }

    /// Run `tokens` after what `cache` holds; returns the logits `[vocab]` of the last one.
    pub fn forward(&self, tokens: &[u32], cache: &mut KvCache) -> Result<Tensor> {
        if tokens.is_empty() {
            return Err(EngineError::EmptyPrompt);
        }
        let mut x = self.embedding.rows(tokens)?;
        for (layer, c) in self.layers.iter().zip(cache.layers.iter_mut()) {
            x = layer.forward(&x, cache.position, c)?;
        }
        cache.position += tokens.len();
        let last = x.narrow(0, tokens.len() - 1, 1)?;
        Ok(self.lm_head.forward(&self.norm.forward(&last)?)?.squeeze(0)?)
    }
}
