//! llama.cpp's tensor names for the parts every file format shares: which routed expert of which
//! layer (`ExpertId`), which of its matrices, and what a name says about its tensor.

/// One routed expert of one layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
pub struct ExpertId {
    pub layer: usize,
    pub expert: usize,
}

/// One of the three matrices of a SwiGLU expert.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExpertMatrix {
    Gate,
    Up,
    Down,
}

impl ExpertMatrix {
    pub const ALL: [ExpertMatrix; 3] = [ExpertMatrix::Gate, ExpertMatrix::Up, ExpertMatrix::Down];

    pub(crate) fn gguf_part(self) -> &'static str {
        match self {
            ExpertMatrix::Gate => "gate",
            ExpertMatrix::Up => "up",
            ExpertMatrix::Down => "down",
        }
    }
}

/// A routed expert's matrix in a file written by `model pack`: `blk.L.ffn_gate_exps.E.weight`.
pub fn packed_expert_name(id: ExpertId, which: ExpertMatrix) -> String {
    format!("blk.{}.ffn_{}_exps.{}.weight", id.layer, which.gguf_part(), id.expert)
}

/// A routed expert's bias in a file written by `model pack`: `blk.L.ffn_gate_exps.E.bias`.
pub fn packed_expert_bias_name(id: ExpertId, which: ExpertMatrix) -> String {
    format!("blk.{}.ffn_{}_exps.{}.bias", id.layer, which.gguf_part(), id.expert)
}

/// Whether a tensor holds routed-expert weights (GGUF `*_exps`, HF `.experts.N.`).
pub fn is_expert_tensor(name: &str) -> bool {
    name.contains("_exps.") || (name.contains(".experts.") && !name.contains("shared_expert"))
}

/// The layer index of a layer's tensor (`blk.N.` in GGUF, `model.layers.N.` in transformers).
pub fn layer_of(name: &str) -> Option<usize> {
    let mut parts = name.split('.');
    while let Some(p) = parts.next() {
        if p == "blk" || p == "layers" {
            return parts.next()?.parse().ok();
        }
    }
    None
}

/// Whether a tensor belongs to a multi-token-prediction layer past the model's `layers`
/// (`nightmail-model/src/mtp.rs`): `blk.N.` / `model.layers.N.` with N ≥ `layers`, or Qwen3-Next's `mtp.*`.
pub fn is_mtp_tensor(name: &str, layers: usize) -> bool {
    name.starts_with("mtp.") || layer_of(name).is_some_and(|l| l >= layers)
}
