//! The qwen3_moe fixture with its routed experts quantized to MXFP4 agrees with its own
//! dequantized F32 twin, resident and streamed.

use std::path::{Path, PathBuf};

use nightmail_formats::gguf_write::{TensorHeader, write_gguf};
use nightmail_formats::{GgufFile, is_expert_tensor};
use nightmail_tensor::WeightDType;
use nightmail_tensor::kernel::mxfp4::{dequantize, quantize};

use crate::{LoadOptions, Model, StreamConfig};

fn fixture() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/qwen3_moe")
}

/// The F32 fixture rewritten with its experts in MXFP4 (`mxfp4.gguf`) and the same experts
/// dequantized back to F32 (`twin.gguf`); every other tensor as it was.
fn write_pair(dir: &Path) -> (PathBuf, PathBuf) {
    let g = GgufFile::open(&fixture().join("model.gguf")).unwrap();
    let mut metadata: Vec<_> =
        g.metadata().iter().filter(|(k, _)| *k != "general.alignment").map(|(k, v)| (k.clone(), v.clone())).collect();
    metadata.sort_by(|a, b| a.0.cmp(&b.0));
    let tensors = g.all_tensors().unwrap();
    let mut quantized: Vec<(TensorHeader, Vec<u8>)> = Vec::new();
    let mut twin: Vec<(TensorHeader, Vec<u8>)> = Vec::new();
    let mut experts = 0;
    for t in &tensors {
        assert_eq!(t.dtype, WeightDType::F32, "{}", t.name);
        if is_expert_tensor(&t.name) {
            experts += 1;
            let w: Vec<f32> = t.bytes.chunks_exact(4).map(|b| f32::from_le_bytes(b.try_into().unwrap())).collect();
            let q = quantize(&w);
            let mut back = vec![0f32; w.len()];
            dequantize(&q, &mut back);
            quantized.push((TensorHeader::new(&t.name, WeightDType::Mxfp4, &t.shape), q));
            let bytes = back.iter().flat_map(|v| v.to_le_bytes()).collect();
            twin.push((TensorHeader::new(&t.name, WeightDType::F32, &t.shape), bytes));
        } else {
            for out in [&mut quantized, &mut twin] {
                out.push((TensorHeader::new(&t.name, t.dtype, &t.shape), t.bytes.to_vec()));
            }
        }
    }
    assert_eq!(experts, 9, "three layers of stacked gate, up and down experts");
    let mut paths = Vec::new();
    for (name, tensors) in [("mxfp4.gguf", &quantized), ("twin.gguf", &twin)] {
        let path = dir.join(name);
        let headers: Vec<TensorHeader> = tensors.iter().map(|(h, _)| h.clone()).collect();
        write_gguf(&path, &metadata, &headers, 32, |i, w| w.write_all(&tensors[i].1)).unwrap();
        paths.push(path);
    }
    (paths[0].clone(), paths[1].clone())
}

/// Greedy from the fixture's prompt: the logits of each step and the tokens chosen.
fn greedy(model: &Model, steps: usize) -> (Vec<Vec<f32>>, Vec<u32>) {
    let reference: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(fixture().join("reference.json")).unwrap()).unwrap();
    let prompt: Vec<u32> = serde_json::from_value(reference["prompt_tokens"].clone()).unwrap();
    let mut cache = model.new_cache();
    let (mut rows, mut tokens) = (vec![model.logits(&prompt, &mut cache).unwrap()], Vec::new());
    for _ in 0..steps {
        let last = rows.last().unwrap();
        let next = last.iter().enumerate().max_by(|a, b| a.1.total_cmp(b.1).then(b.0.cmp(&a.0))).unwrap().0;
        tokens.push(next as u32);
        rows.push(model.logits(&[next as u32], &mut cache).unwrap());
    }
    (rows, tokens)
}

#[test]
fn an_mxfp4_expert_model_agrees_with_its_dequantized_f32_twin_within_1e_4_and_streams_bit_identically() {
    let dir = tempfile::tempdir().unwrap();
    let (mxfp4, twin) = write_pair(dir.path());
    let (rows, tokens) = greedy(&Model::load(&mxfp4).unwrap(), 16);
    let (twin_rows, twin_tokens) = greedy(&Model::load(&twin).unwrap(), 16);
    assert_eq!(tokens, twin_tokens, "greedy tokens");
    let mut worst = 0f32;
    for (step, (a, b)) in rows.iter().zip(&twin_rows).enumerate() {
        let err = a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0f32, f32::max);
        assert!(err < 1e-4, "step {step}: max |Δlogit| = {err:e}");
        worst = worst.max(err);
    }
    eprintln!("MXFP4 vs its F32 twin: max |Δlogit| over {} steps = {worst:.3e}", rows.len());

    let mut config = StreamConfig::with_cache_mb(0);
    config.cache_bytes = 2 * 4096;
    let streamed = Model::load_with(&mxfp4, &LoadOptions { stream: Some(config), memory: None }).unwrap();
    let (streamed_rows, _) = greedy(&streamed, 16);
    for (step, (a, b)) in rows.iter().zip(&streamed_rows).enumerate() {
        assert!(a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits()), "step {step}: streamed differs");
    }
    let stats = streamed.streaming().expect("experts are streamed").stats();
    assert!(stats.evictions > 0 && stats.disk_bytes > 0, "{stats:?}");
}
