//! Whole Qwen3-Next and Qwen3.5 models: missing tensors, an MTP block, unknown layer kinds.

use std::path::{Path, PathBuf};

fn fixture() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/qwen3_next")
}

/// `file` of the fixture copied into `dir` with the bytes `from` (once) replaced by `to`, of
/// the same length, so every offset holds.
fn renamed(dir: &Path, file: &str, from: &[u8], to: &[u8]) {
    let mut bytes = std::fs::read(fixture().join(file)).unwrap();
    let at = bytes.windows(from.len()).position(|w| w == from).expect("the fixture has it");
    bytes[at..at + to.len()].copy_from_slice(to);
    std::fs::write(dir.join(file), bytes).unwrap();
}

#[test]
fn a_missing_a_log_is_named_with_the_file() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(fixture().join("config.json"), dir.path().join("config.json")).unwrap();
    renamed(dir.path(), "model.safetensors", b"model.layers.1.linear_attn.A_log", b"model.layers.1.linear_attn.X_log");
    let err = crate::Model::load(dir.path()).err().expect("A_log is missing").to_string();
    let want = format!(
        "tensor `model.layers.1.linear_attn.A_log` (GGUF `blk.1.ssm_a`) is missing from {}",
        dir.path().display()
    );
    assert!(err.starts_with(&want), "{err}");
    renamed(dir.path(), "model.gguf", b"blk.1.ssm_a", b"blk.1.ssm_x");
    let path = dir.path().join("model.gguf");
    let err = crate::Model::load(&path).err().expect("ssm_a is missing").to_string();
    assert!(err.starts_with(&format!("tensor `blk.1.ssm_a` is missing from {}", path.display())), "{err}");
}

#[test]
fn a_qwen35moe_gguf_with_a_multi_token_prediction_block_runs_its_main_layers_only() {
    use candle_core::quantized::gguf_file::Value;

    use nightmail_formats::GgufFile;
    use nightmail_formats::gguf_write::{TensorHeader, write_gguf};
    // As conversion/qwen.py writes Qwen3.5 with its MTP block: block_count one more, the
    // block's count in nextn_predict_layers, its tensors after the main ones (here a copy of
    // the last layer's norm).
    let src = nightmail_formats::GgufFile::open(&fixture().join("../qwen3_5_moe/model.gguf")).unwrap();
    let mut metadata: Vec<(String, Value)> =
        src.metadata().iter().filter(|(k, _)| *k != "general.alignment").map(|(k, v)| (k.clone(), v.clone())).collect();
    metadata.retain(|(k, _)| k != "qwen35moe.block_count");
    metadata.push(("qwen35moe.block_count".into(), Value::U32(5)));
    metadata.push(("qwen35moe.nextn_predict_layers".into(), Value::U32(1)));
    let mut tensors = src.all_tensors().unwrap();
    let norm = tensors.iter().find(|t| t.name == "blk.3.attn_norm.weight").unwrap().clone();
    tensors.push(nightmail_tensor::TensorView { name: "blk.4.attn_norm.weight".into(), ..norm });
    let headers: Vec<TensorHeader> = tensors.iter().map(|t| TensorHeader::new(&t.name, t.dtype, &t.shape)).collect();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("mtp.gguf");
    write_gguf(&path, &metadata, &headers, 32, |i, w| w.write_all(tensors[i].bytes)).unwrap();
    assert_eq!(GgufFile::open(&path).unwrap().uint("qwen35moe.block_count"), Some(5));
    let (plain, mtp) =
        (crate::Model::load(fixture().join("../qwen3_5_moe/model.gguf")).unwrap(), crate::Model::load(&path).unwrap());
    assert_eq!(mtp.spec().layers, 4);
    let (mut a, mut b) = (plain.new_cache(), mtp.new_cache());
    let (x, y) = (plain.logits(&[5, 17, 99], &mut a).unwrap(), mtp.logits(&[5, 17, 99], &mut b).unwrap());
    assert!(x.iter().zip(&y).all(|(p, q)| p.to_bits() == q.to_bits()));
}

#[test]
fn an_unknown_layer_kind_is_refused_naming_it_and_the_config() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(fixture().join("model.safetensors"), dir.path().join("model.safetensors")).unwrap();
    let config = std::fs::read_to_string(fixture().join("config.json")).unwrap();
    let config = config.replacen("\"linear_attention\"", "\"mamba2\"", 1);
    std::fs::write(dir.path().join("config.json"), config).unwrap();
    let err = crate::Model::load(dir.path()).err().expect("an unknown layer kind").to_string();
    let config = dir.path().join("config.json");
    assert!(err.contains(&config.display().to_string()) && err.contains("layer 0's kind \"mamba2\""), "{err}");
}
