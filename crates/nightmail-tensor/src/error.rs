//! What the math can refuse: a weight of the wrong shape or type, a row past the end.

/// A tensor that the kernels cannot use as it is.
#[derive(Debug, thiserror::Error)]
pub enum TensorError {
    #[error(
        "tensor `{name}` has shape {found:?} where the metadata implies {expected:?}: the file is corrupt or mislabelled"
    )]
    Shape { name: String, found: Vec<usize>, expected: Vec<usize> },
    #[error(
        "tensor `{name}` has type {dtype}, which nightmail cannot read: requantize it to one of F32, F16, BF16, Q4_0, Q4_1, Q8_0, Q4_K, Q5_K, Q6_K, MXFP4"
    )]
    UnsupportedDType { name: String, dtype: String },
    #[error("token id {id} is outside the vocabulary of {vocab}: check the prompt tokens")]
    TokenOutOfRange { id: u32, vocab: usize },
    #[error("tensor computation failed: {0}")]
    Compute(#[from] candle_core::Error),
}

pub type Result<T, E = TensorError> = std::result::Result<T, E>;
