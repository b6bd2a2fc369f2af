//! The Kimi K3 GGUFs nightmail reads and writes are in llama.cpp's `kimi-k3` layout: llama.cpp
//! itself (llama-cpp-python, as scripts/test.sh installs it) loads them, and its loader refuses a
//! file with a tensor missing, misshapen or left over. Checked on tests/fixtures/kimi_k3/model.gguf
//! (kimi_k3.py `write_gguf`) and on a `model synth --arch kimi_k3` file with MXFP4 experts.
//!
//! Their logits are not compared here: llama.cpp L2-normalizes KDA's q and k with the model's
//! rms_norm_eps (1e-5, `build_gdn_l2_norm`) where fla and transformers use 1e-6, which on this
//! tiny random fixture's small activations moves logits by up to 1.8 (a router choice flips);
//! with the reference's eps set to 1e-5 the two agree within 6e-4. On K3's real weights the eps
//! is negligible beside q and k's norms.

mod common;

use std::path::{Path, PathBuf};

use nightmail_engine::Model;
use nightmail_tools::{SynthArch, SynthDtype, SynthSpec, synth};

/// tests/fixtures/llama_cpp_logits.py on `model`: llama.cpp's vocabulary size and logits rows.
fn llama_cpp_logits(model: &Path, tokens: &[u32]) -> (usize, Vec<Vec<f32>>) {
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/llama_cpp_logits.py");
    let request = serde_json::json!({ "model": model, "tokens": tokens });
    let v = common::python_json(&script, &request, &format!("llama.cpp on {}", model.display()));
    (v["n_vocab"].as_u64().unwrap() as usize, serde_json::from_value(v["logits"].clone()).unwrap())
}

fn runs_in_llama_cpp_and_here(path: &Path) {
    let ours = Model::load(path).unwrap();
    let tokens = [5u32, 17, 42, 3, 11];
    let (n_vocab, rows) = llama_cpp_logits(path, &tokens);
    assert_eq!(n_vocab, ours.spec().vocab_size);
    assert_eq!(rows.len(), tokens.len());
    assert!(rows.iter().flatten().all(|x| x.is_finite()), "llama.cpp's logits are finite");
    let mut cache = ours.new_cache();
    assert!(ours.logits(&tokens, &mut cache).unwrap().iter().all(|x| x.is_finite()));
}

#[test]
fn the_kimi_k3_fixture_gguf_loads_and_runs_in_llama_cpp() {
    runs_in_llama_cpp_and_here(
        &PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/kimi_k3/model.gguf"),
    );
}

#[test]
fn a_synthesized_kimi_k3_with_mxfp4_experts_loads_and_runs_in_llama_cpp() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("k3.gguf");
    let (heads, kv_heads, head_dim) = SynthSpec::default_heads(64);
    let spec = SynthSpec {
        arch: SynthArch::KimiK3,
        layers: 5,
        experts: 8,
        top_k: 2,
        hidden: 64,
        expert_ffn: 64,
        dtype: SynthDtype::Mxfp4,
        heads,
        kv_heads,
        head_dim,
        vocab: 64,
        tokenizer_from: None,
        context_length: 256,
        seed: 1,
        dense: None,
    };
    synth(&spec, &path).unwrap();
    runs_in_llama_cpp_and_here(&path);
}
