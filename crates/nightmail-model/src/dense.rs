//! Where the transformer gets a layer's dense weights (attention, norms, router, shared and
//! dense feed-forwards) when they do not all stay in RAM: a [`LayerStore`] hands out each
//! streamed layer in turn. The math does not see whether a layer was resident or read just now.

use std::sync::Arc;

use crate::error::Result;
use crate::layer::DecoderLayer;
use crate::source::WeightSource;

/// Builds layer `l` from a source of its tensors: the one build the transformer uses at load.
pub type LayerBuilder = Arc<dyn Fn(&dyn WeightSource, usize) -> Result<DecoderLayer> + Send + Sync>;

/// Streamed layers, asked for in layer order once per step.
pub trait LayerStore: Send + Sync {
    /// Layer `l`, waiting for its bytes if they are not in yet.
    fn layer(&self, l: usize) -> Result<Arc<DecoderLayer>>;

    /// Layer `l` if it is in memory now (read ahead), without waiting.
    fn peek(&self, l: usize) -> Option<Arc<DecoderLayer>>;

    /// The step is done with layer `l`: its memory can take the next read-ahead.
    fn done(&self, l: usize);
}

/// A layer held by a step: streamed ones are handed back to their store when the step is done
/// with them (or fails), so the read-ahead window never waits on a step that went away.
pub struct HeldLayer<'a> {
    layer: Option<Arc<DecoderLayer>>,
    release: Option<(&'a dyn LayerStore, usize)>,
}

impl<'a> HeldLayer<'a> {
    pub fn new(layer: Arc<DecoderLayer>, release: Option<(&'a dyn LayerStore, usize)>) -> Self {
        HeldLayer { layer: Some(layer), release }
    }

    pub fn layer(&self) -> &DecoderLayer {
        self.layer.as_deref().expect("a held layer is held until dropped")
    }
}

impl Drop for HeldLayer<'_> {
    fn drop(&mut self) {
        // The step's reference goes first, so that the store's removal drops the last one and
        // the read buffers are free for the next read-ahead at once (nightmail-tensor/src/bytes.rs's pool).
        self.layer = None;
        if let Some((store, l)) = self.release {
            store.done(l);
        }
    }
}
