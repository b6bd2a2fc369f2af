//! A multi-token-prediction layer (DeepSeek-V3 technical report §2.2, eqs. 21-25): past the last
//! decoder layer, it reads the model's hidden state at position i and the embedding of the token
//! at i + 1, and predicts the token at i + 2 through one more decoder block and the model's head.
//! Only drafting runs it (`draft = "mtp"`, `nightmail-engine/src/draft/mtp.rs`).
//!
//! The order of the concatenation and which hidden state it reads follow the engines that run
//! DeepSeek-V3's released weights, vLLM (`model_executor/models/deepseek_mtp.py`) and SGLang
//! (`srt/models/deepseek_nextn.py`), where the report differs: `eh_proj` over
//! `[enorm(Emb(t_{i+1})); hnorm(h_i)]` (the embedding first; the report writes h first), with h_i
//! the model's last hidden state after its final norm (what both hand the drafter). vLLM zeroes
//! the embedding at position 0; SGLang does not, nor does this. The block's output goes on
//! through `shared_head.norm` and the head, and, before that norm, is the hidden state a second
//! guess chains on (vLLM's `EagleProposer` feeds it back). Its tensors: the checkpoint's
//! `model.layers.{num_hidden_layers}.{eh_proj,enorm,hnorm,shared_head.norm,shared_head.head,
//! embed_tokens}` beside the block's, or gguf-py's `blk.N.nextn.*` (llama.cpp keeps them so for
//! glm4moe and DeepSeek-V3.2; its deepseek2 converter drops the layer). The embedding and head
//! are the model's where the checkpoint holds none or a copy of them (vLLM and SGLang share them).

use nightmail_formats::FormatError;
use std::sync::Arc;

use candle_core::Tensor;

use crate::error::Result;
use crate::layer::{CacheKind, DecoderLayer, FeedForward, attend_group};
use crate::parts::embedding::Embedding;
use crate::parts::expert::{ExpertStore, ResidentExperts};
use crate::parts::norm::norm;
use crate::spec::ModelSpec;
use crate::state::SequenceState;
use nightmail_formats::ModelFile;
use nightmail_tensor::TensorView;
use nightmail_tensor::ggml::Numerics;
use nightmail_tensor::{Linear, RmsNorm};

pub struct Mtp {
    enorm: RmsNorm,
    hnorm: RmsNorm,
    /// `[hidden, 2 · hidden]`.
    eh_proj: Linear,
    block: DecoderLayer,
    norm: RmsNorm,
    /// The layer's own head and embedding (read from the file as the model's is, never
    /// resident: `parts/embedding.rs`); `None`: the model's.
    head: Option<Linear>,
    embedding: Option<Embedding>,
    cache: CacheKind,
    numerics: Numerics,
    /// A chained guess reads the block's output after the final norm (Qwen3-Next's and
    /// Qwen3.5's layer: vLLM's qwen3_next_mtp.py returns it normed), else before it
    /// (DeepSeek-V3's, GLM-4.5's: deepseek_mtp.py returns it unnormed).
    chain_normed: bool,
}

/// The MTP layer's own `name` (`embed_tokens`, `shared_head_head`) where the checkpoint holds
/// one that is not a copy of the model's `model` (vLLM and SGLang share a copy; so does this).
pub fn own_copy<'a>(
    ck: &'a ModelFile,
    spec: &ModelSpec,
    name: &str,
    model: &TensorView<'_>,
) -> Result<Option<TensorView<'a>>> {
    let Some(w) = ck.tensor(&format!("blk.{}.nextn.{name}.weight", spec.layers))? else { return Ok(None) };
    w.expect_shape(&[spec.vocab_size, spec.hidden_size])?;
    Ok((w.dtype != model.dtype || w.bytes != model.bytes).then_some(w))
}

impl Mtp {
    /// The first MTP layer (`spec.layers`, counted from 0). Its routed experts come from
    /// `experts`, the model's store, where the model streams them (that store's index lists the
    /// layer: [`moe_layer`]); else they are loaded resident here. The model's embedding and head
    /// (`embd`, `head`) stand in for copies of them.
    pub fn load(
        ck: &ModelFile,
        spec: &ModelSpec,
        numerics: Numerics,
        (embd, head): (&TensorView<'_>, &TensorView<'_>),
        experts: Option<&Arc<dyn ExpertStore>>,
    ) -> Result<Self> {
        let l = spec.layers;
        let hidden = spec.hidden_size;
        if spec.attn_res_block.is_some() || spec.deepseek_v4.is_some() {
            return Err(FormatError::Unsupported {
                what: "an MTP layer with AttnRes or hyper-connections".into(),
                hint: "draft with \"lookup\"".into(),
            }
            .into());
        }
        // The layer's own parts first: a checkpoint without the layer is named by its first.
        let t = |name: &str| ck.require(&format!("blk.{l}.nextn.{name}.weight"));
        let rms = |name: &str| -> Result<RmsNorm> {
            let w = t(name)?;
            w.expect_shape(&[hidden])?;
            norm(&w, spec, numerics)
        };
        let eh = t("eh_proj")?;
        eh.expect_shape(&[hidden, 2 * hidden])?;
        let (enorm, hnorm, head_norm) = (rms("enorm")?, rms("hnorm")?, rms("shared_head_norm")?);
        // The spec of a model one layer deeper, the last layer the MTP block.
        let mut deeper = spec.clone();
        deeper.layers = l + 1;
        deeper.moe_layers.push(ck.tensor(&format!("blk.{l}.ffn_gate_inp.weight"))?.is_some());
        deeper.attention.sliding_window.push(None);
        let experts: Arc<dyn ExpertStore> = match experts {
            Some(store) => store.clone(),
            None => Arc::new(ResidentExperts::load_layers(ck, &deeper, [l].into_iter())?),
        };
        let own = |name: &str, model: &TensorView<'_>| own_copy(ck, spec, name, model);
        let block = DecoderLayer::load(ck, &deeper, numerics, ck.format(), &experts, l)?;
        Ok(Mtp {
            enorm,
            hnorm,
            eh_proj: Linear::new(&eh, None)?,
            cache: CacheKind::of(&block.attention, numerics),
            block,
            norm: head_norm,
            head: own("shared_head_head", head)?.map(|w| Linear::new(&w, None)).transpose()?,
            embedding: own("embed_tokens", embd)?
                .map(|w| Embedding::in_file(ck, &w, spec.vocab_size, hidden))
                .transpose()?,
            numerics,
            chain_normed: spec.architecture.is_qwen_hybrid(),
        })
    }

    /// An empty state for the layer's attention, one per stream.
    pub fn new_cache(&self) -> SequenceState {
        SequenceState::new(vec![self.cache.state()])
    }

    /// Runs `tokens` (t_{i+1}, one per row) with `hidden` (`[tokens, hidden]`: h_i) after what
    /// `state` holds; returns the logits of each row and the block's output before
    /// `shared_head.norm` (what a chained guess reads as its h).
    pub fn forward(
        &self,
        model_embedding: &Embedding,
        model_head: &Linear,
        tokens: &[u32],
        hidden: &Tensor,
        state: &mut SequenceState,
    ) -> Result<(Tensor, Tensor)> {
        let e = self.embedding.as_ref().unwrap_or(model_embedding).rows(tokens)?;
        let joined = Tensor::cat(&[&self.enorm.forward(&e)?, &self.hnorm.forward(hidden)?], 1)?;
        let x = self.eh_proj.forward(&joined)?;
        let b = &self.block;
        let rows = b.attention.project(&b.attn_norm.forward(&x)?)?;
        let attended = attend_group(&b.attention, &rows, state, 0)?;
        let x = x.add(&b.attention.output(&attended)?)?;
        let n = b.ffn_norm.forward(&x)?;
        let f = match &b.ffn {
            FeedForward::Dense(mlp) => mlp.forward(&n, self.numerics)?,
            FeedForward::Moe(moe) => moe.forward(&n)?,
        };
        let x = x.add(&f)?;
        state.position += tokens.len();
        let normed = self.norm.forward(&x)?;
        let logits = self.head.as_ref().unwrap_or(model_head).forward(&normed)?;
        Ok((logits, if self.chain_normed { normed } else { x }))
    }
}
