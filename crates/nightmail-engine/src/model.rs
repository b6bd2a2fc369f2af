//! A loaded model: the network, its tokenizer and chat template, the streams a memory budget set
//! up for its weights, and the measured cost of its passes.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use candle_core::Tensor;
use nightmail_formats::{ChatTemplate, Format, ModelFile, TextTokenizer};
use nightmail_model::{ExpertStore, LayerRecall, ModelSpec, ResidentExperts, SequenceState, Transformer};

use crate::error::Result;
use crate::pass_costs::PassCosts;
use crate::stream::{self, MemoryBudget, MemoryPlan, StreamConfig, StreamingExperts, StreamingLayers};

/// A loaded model: the network, its tokenizer and chat template. Immutable and `Send + Sync`:
/// one instance serves any number of concurrent generations, each with its own [`SequenceState`].
pub struct Model {
    pub(crate) path: PathBuf,
    pub(crate) format: Format,
    pub(crate) spec: ModelSpec,
    pub(crate) net: Transformer,
    pub(crate) tokenizer: Option<TextTokenizer>,
    pub(crate) chat_template: Option<ChatTemplate>,
    pub(crate) streaming: Option<Arc<StreamingExperts>>,
    pub(crate) dense: Option<Arc<StreamingLayers>>,
    pub(crate) plan: Option<MemoryPlan>,
    /// The time of its decode and verify passes by width, which sets how much drafts guess.
    pub(crate) passes: PassCosts,
    /// The small model of the same vocabulary that guesses tokens for `Drafting::Model`.
    pub(crate) drafter: Option<Box<Model>>,
    /// The time of the MTP layer's one-row passes (`Drafting::Mtp`), once it is loaded.
    pub(crate) mtp_passes: Option<PassCosts>,
    /// Each token's bytes, for tool-call grammars: read from the tokenizer on first use.
    pub(crate) pieces: std::sync::OnceLock<Arc<crate::constraint::TokenPieces>>,
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

/// Where a model's chat template comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum TemplateSource {
    /// The file's own (GGUF `tokenizer.chat_template`, or the Hugging Face directory's).
    File,
    /// The family's prompt format, built in: Kimi K3's, for K3 files that carry none.
    BuiltIn,
}

/// The chat template a model is prompted with: the file's own, else its family's built in.
pub fn chat_template_of(ck: &ModelFile, spec: &ModelSpec) -> Option<(ChatTemplate, TemplateSource)> {
    let own = match ck {
        ModelFile::Gguf(g) => ChatTemplate::from_gguf(g),
        ModelFile::Hf(h) => ChatTemplate::from_hf_dir(h.dir()),
    };
    match own {
        Some(t) => Some((t, TemplateSource::File)),
        None => (spec.architecture == nightmail_model::Architecture::KimiK3)
            .then(|| (ChatTemplate::kimi_k3(), TemplateSource::BuiltIn)),
    }
}

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
        let tokenizer = match &ck {
            ModelFile::Gguf(g) => TextTokenizer::from_gguf(g)?,
            ModelFile::Hf(h) => TextTokenizer::from_hf_dir(h.dir())?,
        };
        let chat_template = chat_template_of(&ck, &spec).map(|(t, _)| t);
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
            pieces: Default::default(),
        })
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

    /// One step of several sequences, each running its own tokens after what its cache holds (a
    /// decoding sequence's one token, a prefilling one's pass), the expert cache sized for the
    /// step as [`Model::step`] sizes it. Returns each sequence's last-token logits. For benches.
    pub fn logits_groups(&self, groups: &mut [(&mut SequenceState, &[u32])]) -> Result<Vec<Vec<f32>>> {
        let rows = groups.iter().map(|(_, t)| t.len()).sum();
        let span = groups.iter().map(|(c, t)| c.position() + t.len()).max().unwrap_or(0);
        self.size_expert_cache(rows, span);
        let logits = rayon::scope(|_| self.net.forward_groups(groups))?;
        Ok(logits.to_vec2::<f32>()?)
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

#[cfg(test)]
mod tests {
    #[test]
    fn model_is_send_and_sync() {
        fn check<T: Send + Sync>() {}
        check::<super::Model>();
    }
}
