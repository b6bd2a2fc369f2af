//! What the engine's test files share: the fixtures of `tests/fixtures` (generate.py) and their
//! transformers references.
// Each test binary compiles this and uses a part of it.
#![allow(dead_code)]

use std::path::PathBuf;

use nightmail_engine::Model;

pub fn fixture(arch: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures").join(arch)
}

#[derive(serde::Deserialize)]
pub struct Reference {
    pub prompt_tokens: Vec<u32>,
    pub greedy_tokens: Vec<u32>,
    /// transformers' logits after the prompt and after each greedy token but the last.
    pub logits: Vec<Vec<f32>>,
}

pub fn reference(arch: &str) -> Reference {
    serde_json::from_str(&std::fs::read_to_string(fixture(arch).join("reference.json")).unwrap()).unwrap()
}

/// Logits after `prompt` and after each of `then`, fed whatever the model would pick (so that
/// two models compare step by step on the same inputs).
pub fn fed_logit_rows(model: &Model, prompt: &[u32], then: &[u32]) -> Vec<Vec<f32>> {
    let mut cache = model.new_cache();
    let mut rows = vec![model.logits(prompt, &mut cache).unwrap()];
    for &t in then {
        rows.push(model.logits(&[t], &mut cache).unwrap());
    }
    rows
}
