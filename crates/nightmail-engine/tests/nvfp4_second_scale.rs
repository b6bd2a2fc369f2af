//! NVFP4 with second scales, as llama.cpp's converter writes a ModelOpt NVFP4 checkpoint: a
//! one-value `<base>.scale` beside each matrix, one value per expert beside each expert bank
//! (tests/fixtures/nvfp4_second_scale.py made `qwen3_moe/llama_cpp_nvfp4.gguf` from the
//! converter's float file). nightmail multiplies each product by its scale as llama.cpp does
//! (llama-graph.cpp `build_lora_mm`, `build_lora_mm_id`), resident and streamed.

mod common;

use std::path::{Path, PathBuf};

use common::fixture;
use nightmail_engine::{LoadOptions, MemoryBudget, Model};

fn nvfp4_file() -> PathBuf {
    fixture("qwen3_moe").join("llama_cpp_nvfp4.gguf")
}

const TOKENS: [u32; 8] = [1, 17, 200, 5, 99, 42, 250, 3];

/// The logits after each token, fed one at a time.
fn rows(model: &Model) -> Vec<Vec<f32>> {
    let mut cache = model.new_cache();
    TOKENS.iter().map(|&t| model.logits(&[t], &mut cache).unwrap()).collect()
}

/// llama.cpp's logits after each token (tests/fixtures/llama_cpp_logits.py).
fn llama_cpp_rows(model: &Path) -> Vec<Vec<f32>> {
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/llama_cpp_logits.py");
    let request = serde_json::json!({ "model": model, "tokens": TOKENS });
    let v = common::python_json(&script, &request, &format!("llama.cpp on {}", model.display()));
    serde_json::from_value(v["logits"].clone()).unwrap()
}

fn max_diff(a: &[Vec<f32>], b: &[Vec<f32>]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter().zip(b).flat_map(|(a, b)| a.iter().zip(b).map(|(x, y)| (x - y).abs())).fold(0.0, f32::max)
}

/// nightmail's NVFP4 kernel takes llama.cpp's order (`kernel/nvfp4.rs`: Q8_0 activations, exact
/// group sums, the build's float steps), so the logits agree to f32 rounding of the rest of the
/// graph (measured on x86: identical). Rounding the activations alone would move them by ~3e-2.
const TOLERANCE: f32 = 1e-5;

#[test]
fn nvfp4_second_scales_give_llama_cpps_logits() {
    let path = nvfp4_file();
    let want = llama_cpp_rows(&path);
    let got = rows(&Model::load(&path).unwrap());
    let diff = max_diff(&got, &want);
    println!("NVFP4 with second scales: max |dlogit| against llama.cpp {diff:.2e}");
    assert!(diff <= TOLERANCE, "max |dlogit| {diff} against llama.cpp");

    // The scales matter: the same blocks without them are far from llama.cpp's logits. Their
    // tensors renamed in place (`.scale` → `.scalx`, same length) leave the matrices scaled by 1.
    let dir = tempfile::tempdir().unwrap();
    let unscaled = dir.path().join("unscaled.gguf");
    let mut bytes = std::fs::read(&path).unwrap();
    let mut renamed = 0;
    for i in 0..bytes.len().saturating_sub(6) {
        if &bytes[i..i + 6] == b".scale" {
            bytes[i + 5] = b'x';
            renamed += 1;
        }
    }
    assert_eq!(renamed, 3 * 6 + 1, "each layer's four matrices and two banks, and the head");
    std::fs::write(&unscaled, bytes).unwrap();
    let off = max_diff(&rows(&Model::load(&unscaled).unwrap()), &want);
    println!("without the scales: {off:.2e}");
    assert!(off > 1.0, "without the scales: max |dlogit| {off}, with them {diff}");
}

#[test]
fn streamed_nvfp4_layers_and_experts_apply_their_scales_as_resident_ones_do() {
    let path = nvfp4_file();
    let want = rows(&Model::load(&path).unwrap());
    // Every layer streamed, and an expert cache smaller than one layer's experts: the scales
    // come from the extents the engine reads, not from the file's map.
    let ask =
        |bytes| MemoryBudget { bytes, kv_tokens: 64, batch: 1, verify_rows: 1, stream_layers: Some(vec![0, 1, 2]) };
    let least = nightmail_engine::memory_plan(&path, ask(usize::MAX / 2)).unwrap().minimum_bytes;
    let streamed = Model::load_with(&path, &LoadOptions { stream: None, memory: Some(ask(least)) }).unwrap();
    let plan = streamed.memory_plan().unwrap();
    assert_eq!(plan.streamed_layers.len(), 3, "{plan:?}");
    assert!(plan.expert_cache_bytes / plan.sizes.expert_max_bytes < plan.sizes.experts_per_layer, "{plan:?}");
    let got = rows(&streamed);
    for (t, (g, w)) in got.iter().zip(&want).enumerate() {
        assert!(g.iter().zip(w).all(|(a, b)| a.to_bits() == b.to_bits()), "token {t}: streamed differs from resident");
    }
    assert!(streamed.streaming().unwrap().stats().misses > 0);
}

#[test]
fn a_packed_nvfp4_file_keeps_each_experts_second_scale() {
    let path = nvfp4_file();
    let want = rows(&Model::load(&path).unwrap());
    let dir = tempfile::tempdir().unwrap();
    let packed = dir.path().join("packed.gguf");
    nightmail_tools::pack_with(&path, &packed, &nightmail_tools::PackOptions::default()).unwrap();
    let got = rows(&Model::load(&packed).unwrap());
    for (t, (g, w)) in got.iter().zip(&want).enumerate() {
        assert!(
            g.iter().zip(w).all(|(a, b)| a.to_bits() == b.to_bits()),
            "token {t}: packed differs from the original"
        );
    }
}
