/// Why the relay cannot start.
#[derive(Debug, thiserror::Error)]
pub enum RelayError {
    #[error("{0}")]
    Config(String),
}
