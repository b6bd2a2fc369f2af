//! What one sequence carries from step to step: per layer, the attention cache (keys and
//! values, or latent attention's latents) or a linear-attention layer's recurrent state; its
//! position; and the routes of its last token (the fallback predictor of the next token's
//! experts). Batching gives each sequence its own; checkpoints save and restore it.

use candle_core::Tensor;

use super::attention::LayerCache;
use super::kda::KdaState;
use crate::error::{EngineError, Result};

/// One layer's part of a sequence's state.
pub(crate) enum LayerState {
    Attention(LayerCache),
    Kda(KdaState),
}

/// What a checkpoint record holds of one layer.
pub(crate) enum LayerSnapshot {
    /// Key and value rows `[1, heads, positions, dim]` of the positions the record adds:
    /// restoring appends them.
    Rows(Tensor, Tensor),
    /// A recurrent layer's whole state at the record's end (KDA: the convolution tail and S):
    /// restoring replaces the state.
    State(Tensor, Tensor),
}

pub struct SequenceState {
    pub(super) layers: Vec<LayerState>,
    pub(super) position: usize,
    pub(super) last_routes: Vec<Vec<usize>>,
    /// Per layer, this step's guesses of its experts: (next-router lookahead, last token's).
    pub(super) guesses: Vec<Option<(Vec<usize>, Vec<usize>)>>,
}

impl SequenceState {
    pub(super) fn new(layers: Vec<LayerState>) -> Self {
        let n = layers.len();
        SequenceState { layers, position: 0, last_routes: vec![Vec::new(); n], guesses: vec![None; n] }
    }

    /// Tokens already run.
    pub fn position(&self) -> usize {
        self.position
    }

    pub(crate) fn layers(&self) -> usize {
        self.layers.len()
    }

    /// Layer `l`'s part of a checkpoint covering positions `from..to`: its key/value rows of
    /// those positions, or its recurrent state now.
    pub(crate) fn snapshot(&self, l: usize, from: usize, to: usize) -> Result<LayerSnapshot> {
        Ok(match &self.layers[l] {
            LayerState::Attention(cache) => {
                let (k, v) = cache.rows(from, to)?;
                LayerSnapshot::Rows(k, v)
            }
            LayerState::Kda(state) => {
                let (conv, recurrent) = state.snapshot()?;
                LayerSnapshot::State(conv, recurrent)
            }
        })
    }

    /// Restores a fresh state from a checkpoint's snapshots (rows of every position, the latest
    /// recurrent states), which end at `position`.
    pub(crate) fn restore(&mut self, snapshots: &[LayerSnapshot], position: usize) -> Result<()> {
        if snapshots.len() != self.layers.len() {
            return Err(mismatch("a checkpoint with another number of layers"));
        }
        for (layer, snap) in self.layers.iter_mut().zip(snapshots) {
            match (layer, snap) {
                (LayerState::Attention(cache), LayerSnapshot::Rows(k, v)) => cache.append(k, v)?,
                (LayerState::Kda(state), LayerSnapshot::State(conv, recurrent)) => state.restore(conv, recurrent)?,
                _ => return Err(mismatch("a checkpoint whose layer kinds differ from the model's")),
            }
        }
        self.position = position;
        Ok(())
    }
}

fn mismatch(what: &str) -> EngineError {
    EngineError::Compute(candle_core::Error::Msg(what.to_string()))
}
