//! A layer's RMSNorm as the model's file stores it.

use nightmail_tensor::{Numerics, RmsNorm, TensorView};

use crate::error::Result;
use crate::spec::ModelSpec;

/// A layer's RMSNorm, its weight taken as 1 + w where the file stores Qwen3-Next's
/// zero-centred w.
pub fn norm(weight: &TensorView<'_>, spec: &ModelSpec, numerics: Numerics) -> Result<RmsNorm> {
    let n = RmsNorm::new(weight, spec.rms_norm_eps, numerics)?;
    if spec.zero_centered_norms { Ok(n.plus_one()?) } else { Ok(n) }
}
