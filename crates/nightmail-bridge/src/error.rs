/// Why a bridge cannot start, or why its connection to the provider failed.
#[derive(Debug, thiserror::Error)]
pub enum BridgeError {
    /// A setting that cannot work (a password that cannot be read, a bad CA file).
    #[error("{0}")]
    Config(String),
    /// The upstream IMAP server: connecting, TLS, LOGIN, a command.
    #[error("{0}")]
    Imap(String),
    #[error(transparent)]
    Store(#[from] nightmail_store::StoreError),
}
