//! The floor of the engine: weights as bytes and the math over them. Aligned buffers for direct
//! reads ([`AlignedBuf`], [`WeightBytes`]), the dtypes of GGUF and safetensors ([`WeightDType`]),
//! typed views into a file's bytes ([`TensorView`]), [`Linear`] and [`RmsNorm`], and the mat-vec
//! kernels of `kernel/`, one file per weight type. It knows no model and no file format: a view is
//! a name, a dtype, a shape and bytes, wherever they came from.

mod bytes;
mod dtype;
mod error;
pub mod ggml;
pub mod kernel;
mod linear;
mod view;

pub use bytes::{ALIGN, AlignedBuf, WeightBytes, reserve_pool, unreserve_pool};
pub use dtype::{LowBit, WeightDType};
pub use error::{Result, TensorError};
pub use ggml::Numerics;
pub use linear::{Linear, MATVEC_ENV, MatVecPath, RmsNorm, matvec_path, unweighted_rms};
pub use view::{TensorView, row_values};
