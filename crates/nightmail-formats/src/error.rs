//! What a model file can be refused for. Every message says what to do next.

use std::path::PathBuf;

use nightmail_tensor::TensorError;

/// A model file, tokenizer or chat template that cannot be read as it is.
#[derive(Debug, thiserror::Error)]
pub enum FormatError {
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
        "tensor `{name}` ends at byte {end}, past the end of {path} ({len} bytes): the file is truncated, re-download it"
    )]
    Truncated { name: String, path: PathBuf, end: usize, len: usize },
    #[error(
        "cannot read expert {expert} of layer {layer} from {path}: {reason}: the model file is damaged or truncated, re-download or re-pack it"
    )]
    ExpertRead { path: PathBuf, layer: usize, expert: usize, reason: String },
    #[error(
        "cannot read layer {layer} from {path}: {reason}: the model file is damaged or truncated, re-download or re-pack it"
    )]
    LayerRead { path: PathBuf, layer: usize, reason: String },
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    #[error("chat template: {0}")]
    ChatTemplate(String),
    #[error(transparent)]
    Tensor(#[from] TensorError),
}

impl From<candle_core::Error> for FormatError {
    fn from(e: candle_core::Error) -> Self {
        FormatError::Tensor(TensorError::Compute(e))
    }
}

pub type Result<T, E = FormatError> = std::result::Result<T, E>;
