//! The runtime's error type: what generation, drafting, the journal and the memory plan can
//! refuse, and the model's, file's and tensor's errors carried as they are. Every message says
//! what to do next.

use std::path::PathBuf;

use nightmail_formats::FormatError;
use nightmail_model::ModelError;
use nightmail_tensor::TensorError;

/// Everything that can go wrong loading a model or generating with it.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error(
        "the model has no tokenizer: pass token ids (--prompt-tokens), or use a GGUF with tokenizer metadata or a directory with tokenizer.json"
    )]
    NoTokenizer,
    #[error(
        "the model has no chat template: drop --chat, or use a model that ships one (GGUF tokenizer.chat_template, tokenizer_config.json)"
    )]
    NoChatTemplate,
    #[error("the prompt has {len} tokens but the model's context holds {max}: shorten the prompt")]
    PromptTooLong { len: usize, max: usize },
    #[error("sampling: {0}")]
    Sampling(String),
    #[error("tool-call grammar: {0}")]
    Grammar(#[from] GrammarError),
    #[error(
        "no token of the vocabulary continues the tool call: the vocabulary lacks a piece the grammar needs; generate without a tool-call grammar"
    )]
    ConstraintDeadEnd,
    #[error(
        "a memory budget of {budget_mb:.1} MiB cannot run this model: it needs at least {minimum_mb} MiB ({detail}): raise memory_mb (--memory-mb), or shorten the reserved context"
    )]
    MemoryBudget { budget_mb: f64, minimum_mb: usize, detail: String },
    #[error("checkpoint {path}: {reason}: check that the data directory is writable and has space")]
    Checkpoint { path: PathBuf, reason: String },
    #[error(
        "checkpoint {path} is being written by another generation of the same job: wait for it to end (this attempt is retried later)"
    )]
    CheckpointBusy { path: PathBuf },
    #[error(
        "draft model {draft} does not share the tokenizer of {target} ({why}): a draft model's guesses are token ids, so it must read and write the target's vocabulary; pick a draft model of the same family (e.g. a small Qwen3 for a Qwen3-MoE), or use draft = \"lookup\""
    )]
    DraftTokenizer { draft: PathBuf, target: PathBuf, why: String },
    #[error("draft model {path} cannot draft: {why}")]
    DraftModel { path: PathBuf, why: String },
    #[error(
        "this generation drafts with a draft model, but none is loaded: load one with draft_model = PATH (--draft-model PATH), or draft with \"lookup\""
    )]
    NoDraftModel,
    #[error(
        "{path} has no multi-token-prediction layer (`{key}` is 0 or absent): draft with \"lookup\" or a draft model"
    )]
    NoMtp { path: PathBuf, key: String },
    #[error(
        "this generation drafts with the model's MTP layer, but it is not loaded: load it with draft = \"mtp\" (--draft mtp)"
    )]
    NoMtpLayer,
    #[error(transparent)]
    Model(ModelError),
    #[error(transparent)]
    Format(FormatError),
    #[error(transparent)]
    Tensor(TensorError),
}

/// A lower crate's error is carried in the variant of the crate that owns it, whichever layer it
/// passed through, so a caller matches `EngineError::Format(..)` for every file error.
impl From<ModelError> for EngineError {
    fn from(e: ModelError) -> Self {
        match e {
            ModelError::Format(f) => EngineError::Format(f),
            ModelError::Tensor(t) => EngineError::Tensor(t),
            other => EngineError::Model(other),
        }
    }
}

impl From<FormatError> for EngineError {
    fn from(e: FormatError) -> Self {
        EngineError::from(ModelError::from(e))
    }
}

impl From<TensorError> for EngineError {
    fn from(e: TensorError) -> Self {
        EngineError::Tensor(e)
    }
}

impl From<candle_core::Error> for EngineError {
    fn from(e: candle_core::Error) -> Self {
        EngineError::Tensor(TensorError::Compute(e))
    }
}

pub type Result<T, E = EngineError> = std::result::Result<T, E>;

/// Why a tool list cannot be made a grammar.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GrammarError {
    #[error(
        "the tools are not an OpenAI tools array: {0}; pass `[{{\"type\": \"function\", \"function\": {{\"name\": .., \"parameters\": ..}}}}]`"
    )]
    NotTools(String),
    #[error("the tool name `{0}` is not one a call can carry: use letters, digits, `_`, `-` and `.`")]
    BadName(String),
    #[error("more than {max} tools: constrain calls to fewer")]
    TooManyTools { max: usize },
    #[error("the arguments of `{function}` list more than {max} properties: constrain calls to fewer")]
    TooManyProperties { function: String, max: usize },
    #[error("`{function}` requires {key}, which its properties do not list: fix the tool's schema")]
    UnknownRequired { function: String, key: String },
}
