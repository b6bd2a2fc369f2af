//! What can go wrong with the mail index, each error saying what to do next.

use std::path::PathBuf;

use nightmail_types::Address;

#[derive(Debug, thiserror::Error)]
pub enum IndexError {
    #[error(
        "{address} is not a configured user, so has no mail index: add it under [[users]] in the configuration (MailIndex::with_users)"
    )]
    UnknownUser { address: Address },

    #[error("{address}'s mail has not been indexed yet: run catch_up for them first")]
    NotIndexed { address: Address },

    #[error("reading the store for the mail index: {0}")]
    Store(#[from] nightmail_store::StoreError),

    #[error(
        "another process is writing the mail index in {}: stop it (a running daemon?) and try again",
        path.display()
    )]
    Busy { path: PathBuf },

    #[error(
        "the mail index in {} failed: {message}; `nightmail check --reindex` rebuilds it from the store",
        path.display()
    )]
    Index { path: PathBuf, message: String },

    #[error("{} for the mail index: {source}; check that the data directory is writable", path.display())]
    Io { path: PathBuf, source: std::io::Error },

    #[error(
        "could not read the query `{query}`: {reason}; write plain words, a \"quoted phrase\", or subject:, from: or body: before a word"
    )]
    Query { query: String, reason: String },
}

impl IndexError {
    /// A tantivy failure on the index in `path`: a held lock is [`IndexError::Busy`], the rest
    /// are [`IndexError::Index`].
    pub(crate) fn tantivy(path: &std::path::Path, error: tantivy::TantivyError) -> IndexError {
        match error {
            tantivy::TantivyError::LockFailure(..) => IndexError::Busy { path: path.to_path_buf() },
            other => IndexError::Index { path: path.to_path_buf(), message: other.to_string() },
        }
    }
}
