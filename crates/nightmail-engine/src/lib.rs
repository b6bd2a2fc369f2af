//! nightmail's inference runtime: a loaded [`Model`] (any architecture `nightmail-model` reads,
//! from a GGUF file or a Hugging Face directory), generation with sampling and drafting, the
//! generation journal that a crash resumes from, the cache of finished answers' states, and the
//! streaming of weights from the SSD (`stream/`: routed experts through a RAM cache, dense layers
//! a budget leaves on disk). It knows nothing of mail.
//!
//! A worker loads a [`Model`] once (share it in an `Arc`), then per job builds a
//! [`GenerateRequest`] and calls [`Model::generate`] with a per-token callback, or pulls a
//! [`TokenStream`], from a blocking thread (`tokio::task::spawn_blocking`).
//!
//! The `metal` feature switches on candle's Metal backend on macOS; this crate's CPU path is the
//! default and the only one built and tested on Linux.

pub mod draft;
mod error;
mod generate;
mod journal;
mod reasoning;
mod sampling;
mod state_cache;
pub mod stream;
#[cfg(test)]
mod whole_model_tests;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use candle_core::Tensor;

pub use draft::{CostLine, Draft, DraftLength, PassCosts, PromptLookup};
pub use error::{EngineError, Result};
pub use generate::{Completion, GenerateRequest, Progress, Prompt, StopReason, TokenEvent, TokenStream};
pub use nightmail_formats::FormatError;
pub use nightmail_formats::{ChatMessage, ChatTemplate, Format, TextTokenizer};
pub use nightmail_model::ModelError;
pub use nightmail_model::{
    Activation, Architecture, AttentionSpec, ExpertId, ExpertStore, LayerRecall, MlaSpec, ModelSpec, MoeSpec,
    RopeStyle, Routing, SequenceState, Yarn,
};
pub use nightmail_tensor::TensorError;
pub use reasoning::{Reply, split_reasoning};
pub use sampling::{Sampling, argmax};
pub use state_cache::{Reuse, StateCache};
pub use stream::{
    CachePolicy, DenseStats, FileStats, MemoryBudget, MemoryPlan, StreamConfig, StreamStats, StreamingExperts,
    StreamingLayers,
};

use nightmail_formats::ModelFile;
use nightmail_model::{ResidentExperts, Transformer};

/// A loaded model: the network, its tokenizer and chat template. Immutable and `Send + Sync`:
/// one instance serves any number of concurrent generations, each with its own [`SequenceState`].
pub struct Model {
    path: PathBuf,
    format: Format,
    spec: ModelSpec,
    net: Transformer,
    tokenizer: Option<TextTokenizer>,
    chat_template: Option<ChatTemplate>,
    streaming: Option<Arc<StreamingExperts>>,
    dense: Option<Arc<StreamingLayers>>,
    plan: Option<MemoryPlan>,
    /// The time of its decode and verify passes by width, which sets how much drafts guess.
    passes: PassCosts,
    /// The small model of the same vocabulary that guesses tokens for `Draft::Model`.
    drafter: Option<Box<Model>>,
    /// The time of the MTP layer's one-row passes (`Draft::Mtp`), once it is loaded.
    mtp_passes: Option<PassCosts>,
}

/// How to load a model.
#[derive(Debug, Clone, Default)]
pub struct LoadOptions {
    /// Stream routed experts from disk through a cache instead of loading them all.
    pub stream: Option<StreamConfig>,
    /// One budget for the whole model: the engine keeps what fits resident (dense layers first,
    /// then the expert cache, [`MemoryPlan`]) and streams the rest; `stream`, if given, sets the
    /// expert streaming's other knobs (its cache size comes from the plan).
    pub memory: Option<MemoryBudget>,
}

/// Reader threads of the dense layer stream: two layers in flight when the window holds two.
const LAYER_READERS: usize = 2;

impl Model {
    /// Load a `.gguf` file or a Hugging Face model directory.
    pub fn load(path: impl AsRef<Path>) -> Result<Self> {
        Self::load_with(path, &LoadOptions::default())
    }

    /// Load with options: with `stream`, dense weights are loaded and routed experts stay on
    /// disk, read on demand into a cache of `stream.cache_bytes`.
    pub fn load_with(path: impl AsRef<Path>, options: &LoadOptions) -> Result<Self> {
        let path = path.as_ref();
        let ck = ModelFile::open(path)?;
        let spec = ModelSpec::read(&ck)?;
        let plan = match &options.memory {
            Some(budget) => Some(MemoryPlan::new(stream::ModelSizes::read(&ck, &spec)?, budget.clone())?),
            None => None,
        };
        let stream = match &plan {
            Some(p) if p.experts_resident => None,
            Some(p) => Some(StreamConfig {
                cache_bytes: p.expert_cache_bytes,
                ..options.stream.clone().unwrap_or_else(|| StreamConfig::with_cache_mb(0))
            }),
            None => options.stream.clone(),
        };
        let (experts, streaming, prefetch_depth): (Arc<dyn ExpertStore>, _, _) = match &stream {
            Some(config) if spec.moe.is_some() => {
                let index = nightmail_model::ExpertIndex::build(&ck, &spec)?;
                let store = Arc::new(StreamingExperts::new(index, config.clone())?);
                (store.clone(), Some(store), config.prefetch_depth)
            }
            _ => (Arc::new(ResidentExperts::load(&ck, &spec)?), None, 0),
        };
        let streamed = plan.as_ref().map(MemoryPlan::streamed_mask).unwrap_or_default();
        let (mut net, recorded) = Transformer::load(&ck, &spec, experts, prefetch_depth, &streamed)?;
        let mut dense = None;
        if let Some(p) = &plan
            && !p.streamed_layers.is_empty()
        {
            let mut files = Vec::new();
            let extents = recorded
                .into_iter()
                .enumerate()
                .filter_map(|(l, r)| r.map(|r| stream::LayerExtent::new(l, r, &mut files)))
                .collect::<Result<Vec<_>, nightmail_model::ModelError>>()?;
            // The plan sized the window from tensor headers; the build's own extents decide.
            let largest = extents.iter().map(stream::LayerExtent::cost).max().unwrap_or(0);
            let window = p.window_bytes.max(largest);
            let store =
                Arc::new(StreamingLayers::new(extents, &files, window, LAYER_READERS, net.layer_builder(&spec))?);
            net.stream_layers(store.clone());
            dense = Some(store);
        }
        let (tokenizer, chat_template) = match &ck {
            ModelFile::Gguf(g) => (TextTokenizer::from_gguf(g)?, ChatTemplate::from_gguf(g)),
            ModelFile::Hf(h) => (TextTokenizer::from_hf_dir(h.dir())?, ChatTemplate::from_hf_dir(h.dir())),
        };
        Ok(Model {
            path: path.to_path_buf(),
            format: ck.format(),
            spec,
            net,
            tokenizer,
            chat_template,
            streaming,
            dense,
            plan,
            passes: PassCosts::default(),
            drafter: None,
            mtp_passes: None,
        })
    }

    /// Loads the model at `path`, resident, as this model's draft model (`Draft::Model`). It is
    /// refused unless its tokenizer spells every id as this model's does, and unless its state
    /// is keys and values (cut back to the accepted tokens after each verify pass).
    pub fn attach_draft_model(&mut self, path: impl AsRef<Path>) -> Result<()> {
        let drafter = Model::load(path)?;
        draft::check_draft_model(self, &drafter)?;
        self.drafter = Some(Box::new(drafter));
        Ok(())
    }

    /// Loads the model's own multi-token-prediction layer (`Draft::Mtp`, `nightmail-model/src/mtp.rs`): refused
    /// for a model whose configuration counts none, naming the key, or whose file lacks its
    /// tensors, naming the first missing one.
    pub fn attach_mtp(&mut self) -> Result<()> {
        if self.spec.mtp_layers == 0 {
            return Err(EngineError::NoMtp { path: self.path.clone(), key: self.spec.mtp_key.clone() });
        }
        let ck = ModelFile::open(&self.path)?;
        self.net.attach_mtp(&ck, &self.spec, self.streaming.is_some())?;
        ck.release_pages();
        self.mtp_passes = Some(PassCosts::default());
        Ok(())
    }

    /// The MTP layer's logits at each position of `tokens` but the last (`[len − 1][vocab]`):
    /// row i reads the model's hidden state at i and the token at i + 1, and predicts the token
    /// at i + 2. For checking it against a reference; drafting runs it a guess at a time.
    pub fn mtp_logits(&self, tokens: &[u32]) -> Result<Vec<Vec<f32>>> {
        let mut state = self.net.new_mtp_cache().ok_or(EngineError::NoMtpLayer)?;
        if tokens.len() < 2 {
            return Ok(Vec::new());
        }
        let mut cache = self.new_cache();
        let logits = rayon::scope(|_| -> Result<Tensor> {
            let (_, hidden) = self.net.forward_verify_groups_hidden(&mut [(&mut cache, tokens)], &[true])?;
            let hidden = hidden[0].as_ref().expect("asked for").narrow(0, 0, tokens.len() - 1)?;
            Ok(self.net.forward_mtp(&tokens[1..], &hidden, &mut state)?.0)
        })?;
        Ok(logits.to_vec2::<f32>()?)
    }

    /// The measured cost of the MTP layer's passes, when it is loaded.
    pub(crate) fn mtp_passes(&self) -> Option<&PassCosts> {
        self.mtp_passes.as_ref()
    }

    /// The draft model, when one is attached.
    pub fn draft_model(&self) -> Option<&Model> {
        self.drafter.as_deref()
    }

    /// The measured cost of this model's passes by their rows (drafting's cost model).
    pub fn pass_costs(&self) -> &PassCosts {
        &self.passes
    }

    /// The dense layer stream, when a memory budget left some layers on disk.
    pub fn dense_stream(&self) -> Option<&StreamingLayers> {
        self.dense.as_deref()
    }

    /// What the memory budget kept resident and what streams, when loaded with one.
    pub fn memory_plan(&self) -> Option<&MemoryPlan> {
        self.plan.as_ref()
    }

    /// The streaming store, when experts are streamed.
    pub fn streaming(&self) -> Option<&StreamingExperts> {
        self.streaming.as_deref()
    }

    /// Per MoE layer, how well prefetch guesses matched the chosen experts (decode steps).
    pub fn prefetch_recall(&self) -> Vec<LayerRecall> {
        self.net.prefetch_recall()
    }

    /// Zero the streaming and prefetch counters (e.g. after the prefill of a benchmark).
    pub fn reset_stats(&self) {
        if let Some(s) = &self.streaming {
            s.reset_stats();
        }
        if let Some(d) = &self.dense {
            d.reset_stats();
        }
        self.net.reset_prefetch_recall();
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn format(&self) -> Format {
        self.format
    }

    pub fn spec(&self) -> &ModelSpec {
        &self.spec
    }

    pub fn tokenizer(&self) -> Option<&TextTokenizer> {
        self.tokenizer.as_ref()
    }

    pub fn chat_template(&self) -> Option<&ChatTemplate> {
        self.chat_template.as_ref()
    }

    /// An empty key/value cache for one sequence.
    pub fn new_cache(&self) -> SequenceState {
        self.net.new_cache()
    }

    /// Run `tokens` after what `cache` holds and return the next-token logits of the last one.
    pub fn logits(&self, tokens: &[u32], cache: &mut SequenceState) -> Result<Vec<f32>> {
        // Run the step on a rayon worker, so that the kernels' parallel loops start from inside
        // the pool (the caller joins the work) instead of handing off and sleeping at each one.
        let logits = rayon::scope(|_| self.net.forward(tokens, cache))?;
        Ok(logits.to_vec1::<f32>()?)
    }
}

impl Model {
    /// A verify pass of `tokens` after what `cache` holds: a logits row per token, the state
    /// kept for a roll-back (`SequenceState::begin_verify` first). For benches of its cost.
    pub fn verify_pass(&self, cache: &mut SequenceState, tokens: &[u32]) -> Result<Vec<Tensor>> {
        let mut group = [(cache, tokens)];
        Ok(rayon::scope(|_| self.net.forward_verify_groups(&mut group))?)
    }

    /// One decode step of several sequences: `tokens[i]` runs after what `caches[i]` holds.
    /// Returns each sequence's next-token logits (those it would get alone).
    pub fn logits_batch(&self, tokens: &[u32], caches: &mut [&mut SequenceState]) -> Result<Vec<Vec<f32>>> {
        let mut groups: Vec<(&mut SequenceState, &[u32])> =
            caches.iter_mut().zip(tokens.chunks(1)).map(|(c, t)| (&mut **c, t)).collect();
        let logits = rayon::scope(|_| self.net.forward_groups(&mut groups))?;
        Ok(logits.to_vec2::<f32>()?)
    }
}

/// What a memory budget would keep resident and stream for the model at `path`, from its tensor
/// headers alone (nothing is loaded); an error names the least budget that runs it.
pub fn memory_plan(path: impl AsRef<Path>, budget: MemoryBudget) -> Result<MemoryPlan> {
    let ck = ModelFile::open(path.as_ref())?;
    let spec = ModelSpec::read(&ck)?;
    MemoryPlan::new(stream::ModelSizes::read(&ck, &spec)?, budget)
}

#[cfg(all(feature = "metal", target_os = "macos"))]
/// The Metal device, when this build has the `metal` feature on macOS.
pub fn metal_available() -> bool {
    candle_core::Device::new_metal(0).is_ok()
}

#[cfg(test)]
mod tests {
    #[test]
    fn model_is_send_and_sync() {
        fn check<T: Send + Sync>() {}
        check::<super::Model>();
    }
}
