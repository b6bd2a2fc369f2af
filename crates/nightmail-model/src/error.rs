//! What reading or running a model can refuse beyond its file: an architecture we do not run, an
//! embedding row that cannot be read, an empty prompt.

use std::path::PathBuf;

use nightmail_formats::FormatError;
use nightmail_tensor::TensorError;

#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error(
        "architecture `{0}` is not supported: nightmail runs llama, mixtral, qwen2_moe, qwen3_moe, gpt_oss, deepseek_v3 / kimi_k2, kimi_linear, kimi_k3, qwen3_next, qwen3_5_moe, glm4_moe, minimax_m2 and deepseek_v4 (GGUF: llama, qwen2moe, qwen3moe, gpt-oss, deepseek2, kimi-linear, kimi-k3, qwen3next, qwen35moe, glm4moe, minimax-m2, deepseek4)"
    )]
    UnsupportedArchitecture(String),
    #[error(
        "cannot read the embedding row of token {token} from {path}: {reason}: the model file is damaged or truncated, re-download or re-pack it"
    )]
    EmbeddingRead { path: PathBuf, token: u32, reason: String },
    #[error("the prompt is empty: give at least one token")]
    EmptyPrompt,
    #[error(transparent)]
    Format(FormatError),
    #[error(transparent)]
    Tensor(#[from] TensorError),
}

/// A file error that is really a tensor's stays one, so a caller matches it in one place.
impl From<FormatError> for ModelError {
    fn from(e: FormatError) -> Self {
        match e {
            FormatError::Tensor(t) => ModelError::Tensor(t),
            other => ModelError::Format(other),
        }
    }
}

impl From<candle_core::Error> for ModelError {
    fn from(e: candle_core::Error) -> Self {
        ModelError::Tensor(TensorError::Compute(e))
    }
}

pub type Result<T, E = ModelError> = std::result::Result<T, E>;
