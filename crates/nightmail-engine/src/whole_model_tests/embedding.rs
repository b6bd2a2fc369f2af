//! Whole models read through the embedding part.

use std::path::PathBuf;

use nightmail_tensor::TensorError;

use crate::{EngineError, Model};

/// A loaded model still refuses an id past its vocabulary, tied (llama) or not (qwen3_moe).
#[test]
fn a_model_refuses_a_token_past_its_vocabulary() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures");
    for arch in ["llama", "qwen3_moe"] {
        let model = Model::load(root.join(arch).join("model.gguf")).unwrap();
        let vocab = model.spec().vocab_size;
        let err = model.logits(&[1, vocab as u32 + 3], &mut model.new_cache()).unwrap_err();
        assert!(
            matches!(err, EngineError::Tensor(TensorError::TokenOutOfRange { id, vocab: v }) if id as usize == vocab + 3 && v == vocab),
            "{arch}: {err}"
        );
    }
}
