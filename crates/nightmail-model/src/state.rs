//! What one sequence carries from step to step: per layer, the attention cache (keys and
//! values, or latent attention's latents) or a linear-attention layer's recurrent state; its
//! position; and the routes of its last token (the fallback predictor of the next token's
//! experts). Batching gives each sequence its own; checkpoints save and restore it.

use crate::error::ModelError;
use candle_core::Tensor;
use nightmail_tensor::TensorError;

use crate::error::Result;
use crate::parts::attention::LayerCache;
use crate::parts::delta_rule::DeltaState;
use crate::parts::dsa::Choices;
use crate::parts::sliding_mqa::WindowState;

/// One layer's part of a sequence's state.
pub enum LayerState {
    Attention(LayerCache),
    /// A linear-attention layer's (KDA, Gated DeltaNet) recurrent state.
    Recurrent(DeltaState),
    /// A DeepSeek-V4 layer's window of keys and its compressors' state.
    Window(WindowState),
}

/// What a checkpoint record holds of one layer.
pub enum LayerSnapshot {
    /// Key and value rows `[1, heads, positions, dim]` of the positions the record adds:
    /// restoring appends them.
    Rows(Tensor, Tensor),
    /// A recurrent layer's whole state at the record's end (the convolution tail and S):
    /// restoring replaces the state.
    State(Tensor, Tensor),
}

pub struct SequenceState {
    pub(crate) layers: Vec<LayerState>,
    pub(crate) position: usize,
    pub(crate) last_routes: Vec<Vec<usize>>,
    /// Per layer, this step's guesses of its experts: (next-router lookahead, last token's).
    pub(crate) guesses: Vec<Option<(Vec<usize>, Vec<usize>)>>,
    /// Set by [`SequenceState::begin_verify`], until a pass that is not a verify pass: where
    /// the verify pass started and, per recurrent layer, its state after each of the pass's
    /// tokens (what [`SequenceState::roll_back`] returns to).
    pub(crate) verify: Option<VerifyTrail>,
    /// DSA: the indexer's choices in the pass under way, for the layers that share them.
    pub(crate) choices: Choices,
}

/// A verify pass's record of what rolling back needs. Keys and values are cut back by position;
/// a recurrent layer cannot subtract tokens from its state, so the pass keeps its state after
/// each position (the convolution tail and S, fixed in size): rolling back takes the one at
/// the accepted position. Replaying the accepted tokens from a snapshot instead would cost a
/// second pass over every weight whenever a draft is rejected, which is the pass drafting saves.
pub(crate) struct VerifyTrail {
    pub(crate) start: usize,
    /// `states[l][i]`: layer l's recurrent state after position `start + i` (empty for
    /// attention layers).
    pub(crate) states: Vec<Vec<DeltaState>>,
}

impl SequenceState {
    pub fn new(layers: Vec<LayerState>) -> Self {
        let n = layers.len();
        SequenceState {
            layers,
            position: 0,
            last_routes: vec![Vec::new(); n],
            guesses: vec![None; n],
            verify: None,
            choices: Choices::default(),
        }
    }

    /// The next pass is a verify pass: each of its positions computes what a decode step of that
    /// token alone computes, and the state can be rolled back to any of them after it.
    pub fn begin_verify(&mut self) {
        let layers = self.layers.len();
        self.verify = Some(VerifyTrail { start: self.position, states: vec![Vec::new(); layers] });
    }

    /// Whether the pass about to run is the verify pass [`SequenceState::begin_verify`] began
    /// (the trail starts where the state is).
    pub fn verifying(&self) -> bool {
        matches!(&self.verify, Some(t) if t.start == self.position)
    }

    /// Forgets the tokens after `position`: cuts the attention caches back and restores each
    /// recurrent layer's state at `position` from the last verify pass. `position` must lie
    /// within that pass (after its first token) or be the position now.
    pub fn roll_back(&mut self, position: usize) -> Result<()> {
        if position == self.position {
            return Ok(());
        }
        let trail = match &self.verify {
            Some(t) if position > t.start && position < self.position => t,
            _ => {
                return Err(mismatch(&format!(
                    "cannot roll a sequence at position {} back to {position}: only within the last verify pass",
                    self.position
                )));
            }
        };
        let at = position - trail.start - 1;
        for (layer, states) in self.layers.iter_mut().zip(&trail.states) {
            match layer {
                LayerState::Attention(cache) => cache.truncate(position)?,
                LayerState::Recurrent(state) => *state = states[at].clone(),
                LayerState::Window(_) => return Err(mismatch("a DeepSeek-V4 layer cannot roll back (no drafting)")),
            }
        }
        self.position = position;
        if let Some(t) = self.verify.as_mut() {
            t.states.iter_mut().for_each(|s| s.truncate(at + 1));
        }
        Ok(())
    }

    /// Forgets the tokens after `position` in a state of attention layers only (a draft model's,
    /// `nightmail-engine/src/draft/model.rs`): their keys and values are cut back, at any position. A recurrent
    /// state cannot be cut back outside a verify pass's trail.
    pub fn truncate(&mut self, position: usize) -> Result<()> {
        if position >= self.position {
            return Ok(());
        }
        for layer in &mut self.layers {
            match layer {
                LayerState::Attention(cache) => cache.truncate(position)?,
                LayerState::Recurrent(_) => return Err(mismatch("a recurrent state cannot be cut back")),
                LayerState::Window(_) => return Err(mismatch("a DeepSeek-V4 window state cannot be cut back")),
            }
        }
        self.position = position;
        self.verify = None;
        Ok(())
    }

    /// Whether a layer keeps a state that [`SequenceState::truncate`] cannot cut back: a recurrent
    /// one (KDA, Gated DeltaNet) or DeepSeek-V4's window and compressors.
    pub fn has_state_that_cannot_be_cut_back(&self) -> bool {
        self.layers.iter().any(|l| matches!(l, LayerState::Recurrent(_) | LayerState::Window(_)))
    }

    /// Tokens already run.
    pub fn position(&self) -> usize {
        self.position
    }

    pub fn layers(&self) -> usize {
        self.layers.len()
    }

    /// Layer `l`'s part of a checkpoint covering positions `from..to`: its key/value rows of
    /// those positions, or its recurrent state now.
    pub fn snapshot(&self, l: usize, from: usize, to: usize) -> Result<LayerSnapshot> {
        Ok(match &self.layers[l] {
            LayerState::Attention(cache) => {
                let (k, v) = cache.rows(from, to)?;
                LayerSnapshot::Rows(k, v)
            }
            LayerState::Recurrent(state) => {
                let (conv, recurrent) = state.snapshot()?;
                LayerSnapshot::State(conv, recurrent)
            }
            // The whole state as one row `[1, 1, n, 1]` beside an empty one: restoring replaces it.
            LayerState::Window(state) => {
                let flat = state.to_flat();
                let n = flat.len();
                let cpu = &candle_core::Device::Cpu;
                LayerSnapshot::State(
                    Tensor::from_vec(flat, (1, 1, n, 1), cpu)?,
                    Tensor::zeros((1, 1, 1, 1), candle_core::DType::F32, cpu)?,
                )
            }
        })
    }

    /// Restores a fresh state from a checkpoint's snapshots (rows of every position, the latest
    /// recurrent states), which end at `position`.
    pub fn restore(&mut self, snapshots: &[LayerSnapshot], position: usize) -> Result<()> {
        if snapshots.len() != self.layers.len() {
            return Err(mismatch("a checkpoint with another number of layers"));
        }
        for (layer, snap) in self.layers.iter_mut().zip(snapshots) {
            match (layer, snap) {
                (LayerState::Attention(cache), LayerSnapshot::Rows(k, v)) => cache.append(k, v)?,
                (LayerState::Recurrent(state), LayerSnapshot::State(conv, recurrent)) => {
                    state.restore(conv, recurrent)?
                }
                (LayerState::Window(state), LayerSnapshot::State(flat, _)) => {
                    let flat: Vec<f32> = flat.flatten_all()?.to_vec1()?;
                    *state = WindowState::from_flat(&flat, state.shape())
                        .ok_or_else(|| mismatch("a checkpoint whose DeepSeek-V4 layer state does not parse"))?;
                }
                _ => return Err(mismatch("a checkpoint whose layer kinds differ from the model's")),
            }
        }
        self.position = position;
        Ok(())
    }
}

fn mismatch(what: &str) -> ModelError {
    ModelError::from(TensorError::Compute(candle_core::Error::Msg(what.to_string())))
}
