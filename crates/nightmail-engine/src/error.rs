//! The engine's one error type. Every message says what to do next.

use std::path::PathBuf;

/// Everything that can go wrong loading a model or generating with it.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error("cannot read model {path}: {source}: check the path (a .gguf file or a Hugging Face model directory)")]
    Io { path: PathBuf, source: std::io::Error },
    #[error(
        "{path} is neither a GGUF file nor a directory with config.json: point at a .gguf file or a Hugging Face model directory"
    )]
    UnknownFormat { path: PathBuf },
    #[error("{path} is not a readable GGUF file ({reason}): re-download or re-convert it")]
    BadGguf { path: PathBuf, reason: String },
    #[error(
        "{model} is striped and its part {part} cannot be read ({source}): mount the disk that holds it, or pack the model again"
    )]
    MissingStripe { model: PathBuf, part: PathBuf, source: std::io::Error },
    #[error("{path} is not a readable safetensors file ({reason}): re-download it")]
    BadSafetensors { path: PathBuf, reason: String },
    #[error("{path}: {reason}: fix the file or re-download the model")]
    BadConfig { path: PathBuf, reason: String },
    #[error(
        "architecture `{0}` is not supported: nightmail runs llama, mixtral, qwen2_moe, qwen3_moe, gpt_oss, deepseek_v3 / kimi_k2, kimi_linear, kimi_k3, qwen3_next, qwen3_5_moe, glm4_moe, minimax_m2 and deepseek_v4 (GGUF: llama, qwen2moe, qwen3moe, gpt-oss, deepseek2, kimi-linear, kimi-k3, qwen3next, qwen35moe, glm4moe, minimax-m2, deepseek4)"
    )]
    UnsupportedArchitecture(String),
    #[error(
        "the model's metadata lacks `{key}`: convert the model with a current llama.cpp convert_hf_to_gguf.py or transformers"
    )]
    MissingMetadata { key: String },
    #[error("the model's metadata gives `{key}` {reason}: the file is corrupt or mislabelled")]
    BadMetadata { key: String, reason: String },
    #[error("{what} is not supported yet: {hint}")]
    Unsupported { what: String, hint: String },
    #[error("tensor `{name}` is missing: the model file is incomplete or not of the architecture its metadata names")]
    MissingTensor { name: String },
    #[error(
        "tensor {name} is missing from {path}: the model file is incomplete or not of the architecture its metadata names"
    )]
    MissingTensorIn {
        /// Quoted, with the other format's name where there is one.
        name: String,
        path: PathBuf,
    },
    #[error(
        "tensor `{name}` has type {dtype}, which nightmail cannot read: requantize it to one of F32, F16, BF16, Q4_0, Q4_1, Q8_0, Q4_K, Q5_K, Q6_K, MXFP4"
    )]
    UnsupportedDType { name: String, dtype: String },
    #[error(
        "tensor `{name}` has shape {found:?} where the metadata implies {expected:?}: the file is corrupt or mislabelled"
    )]
    Shape { name: String, found: Vec<usize>, expected: Vec<usize> },
    #[error(
        "tensor `{name}` ends at byte {end}, past the end of {path} ({len} bytes): the file is truncated, re-download it"
    )]
    Truncated { name: String, path: PathBuf, end: usize, len: usize },
    #[error(
        "the model has no tokenizer: pass token ids (--prompt-tokens), or use a GGUF with tokenizer metadata or a directory with tokenizer.json"
    )]
    NoTokenizer,
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    #[error(
        "the model has no chat template: drop --chat, or use a model that ships one (GGUF tokenizer.chat_template, tokenizer_config.json)"
    )]
    NoChatTemplate,
    #[error("chat template: {0}: the model's template uses a feature nightmail's Jinja does not have")]
    ChatTemplate(String),
    #[error("token id {id} is outside the vocabulary of {vocab}: check the prompt tokens")]
    TokenOutOfRange { id: u32, vocab: usize },
    #[error("the prompt has {len} tokens but the model's context holds {max}: shorten the prompt")]
    PromptTooLong { len: usize, max: usize },
    #[error("the prompt is empty: give at least one token")]
    EmptyPrompt,
    #[error("sampling: {0}")]
    Sampling(String),
    #[error(
        "cannot read expert {expert} of layer {layer} from {path}: {reason}: the model file is damaged or truncated, re-download or re-pack it"
    )]
    ExpertRead { path: PathBuf, layer: usize, expert: usize, reason: String },
    #[error(
        "cannot read the embedding row of token {token} from {path}: {reason}: the model file is damaged or truncated, re-download or re-pack it"
    )]
    EmbeddingRead { path: PathBuf, token: u32, reason: String },
    #[error(
        "cannot read layer {layer} from {path}: {reason}: the model file is damaged or truncated, re-download or re-pack it"
    )]
    LayerRead { path: PathBuf, layer: usize, reason: String },
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
    #[error("tensor computation failed: {0}")]
    Compute(#[from] candle_core::Error),
}

pub type Result<T, E = EngineError> = std::result::Result<T, E>;
