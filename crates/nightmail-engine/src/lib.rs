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

mod constraint;
pub mod draft;
mod error;
mod generate;
mod journal;
mod model;
mod pass_costs;
mod prefill;
mod reasoning;
mod request;
mod sampling;
mod state_cache;
pub mod stream;
#[cfg(test)]
mod whole_model_tests;

pub use constraint::ToolCallGrammar;
pub use draft::{DraftLength, Drafting, PromptLookup};
pub use error::{EngineError, GrammarError, Result};
pub use generate::TokenStream;
pub use model::{LoadOptions, Model, TemplateSource, chat_template_of, memory_plan};
pub use nightmail_formats::FormatError;
pub use nightmail_formats::{
    ChatMessage, ChatTemplate, Format, MalformedCall, ParsedTurn, RenderOptions, TextTokenizer, ToolArguments,
    ToolCall, ToolSyntax,
};
pub use nightmail_model::ModelError;
pub use nightmail_model::{
    Activation, Architecture, AttentionSpec, ExpertId, ExpertStore, LayerRecall, MlaSpec, ModelSpec, MoeSpec,
    RopeStyle, Routing, SequenceState, Yarn,
};
pub use nightmail_tensor::TensorError;
pub use pass_costs::{CostLine, PassCosts};
pub use prefill::{
    MAX_PREFILL_TOKENS, activation_bytes_per_token, cache_bytes_for_pass, pass_activation_bytes, pass_cache_floor,
    prefill_tokens_per_pass,
};
pub use reasoning::{SplitReply, split_reasoning};
pub use request::{Completion, Conversation, GenerateRequest, GenerationProgress, Prompt, StopReason, TokenEvent};
pub use sampling::{Sampling, argmax};
pub use state_cache::{Reuse, StateCache};
pub use stream::{
    CachePolicy, DenseStats, FileStats, MemoryBudget, MemoryPlan, StreamConfig, StreamStats, StreamingExperts,
    StreamingLayers,
};
