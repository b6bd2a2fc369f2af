use std::path::PathBuf;

use crate::JobId;

/// What can go wrong in the store. Each message says what to do next where there is something to do.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("the store at {path} is in use by another process (is `nightmail serve` running?)")]
    Locked { path: PathBuf },
    #[error("{path}: {message}")]
    Io { path: PathBuf, message: String },
    #[error(
        "the disk holding {path} is nearly full ({free} bytes free; new mail needs {needed}): free some space, and senders will retry"
    )]
    Full { path: PathBuf, free: u64, needed: u64 },
    #[error("storage engine error: {0}")]
    Engine(String),
    #[error("the store holds a corrupt record in {tree}: {message}")]
    Corrupt { tree: &'static str, message: String },
    #[error(
        "the store was written by a newer nightmail (schema version {found}, this build knows up to {known}): upgrade nightmail"
    )]
    TooNew { found: u32, known: u32 },
    #[error("{path} is not empty: {what} must be empty or absent (choose a new directory, or move what is there away)")]
    NotEmpty { path: PathBuf, what: String },
    #[error("the backup in {path} cannot be restored: {message}")]
    BadBackup { path: PathBuf, message: String },
    #[error("job {0} does not exist")]
    NoSuchJob(JobId),
    #[error("the lease on job {0} was lost (it expired and the job was taken again, or it was cancelled)")]
    LeaseLost(JobId),
}

impl From<sled::Error> for StoreError {
    fn from(e: sled::Error) -> Self {
        StoreError::Engine(e.to_string())
    }
}

impl From<sled::transaction::TransactionError<StoreError>> for StoreError {
    fn from(e: sled::transaction::TransactionError<StoreError>) -> Self {
        match e {
            sled::transaction::TransactionError::Abort(e) => e,
            sled::transaction::TransactionError::Storage(e) => e.into(),
        }
    }
}
