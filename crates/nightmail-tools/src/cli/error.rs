//! What a `model` command can fail with: a wrong combination of arguments, or the engine's,
//! disk's or JSON's error with what the command was doing.

use nightmail_engine::EngineError;

#[derive(Debug, thiserror::Error)]
pub enum CommandError {
    /// Arguments that do not go together; the message says which to give.
    #[error("{0}")]
    Usage(String),
    #[error("{doing}: {source}")]
    While { doing: String, source: EngineError },
    #[error(transparent)]
    Engine(#[from] EngineError),
    #[error(transparent)]
    Io(#[from] std::io::Error),
    #[error(transparent)]
    Json(#[from] serde_json::Error),
}

pub type Result<T, E = CommandError> = std::result::Result<T, E>;

/// Names what a command was doing when the engine refused, as `anyhow`'s `with_context` would.
pub(super) trait Doing<T> {
    fn doing(self, what: impl FnOnce() -> String) -> Result<T>;
}

impl<T> Doing<T> for std::result::Result<T, EngineError> {
    fn doing(self, what: impl FnOnce() -> String) -> Result<T> {
        self.map_err(|source| CommandError::While { doing: what(), source })
    }
}
