//! Kimi K3 checkpoints that are wrong in the ways a download or a conversion goes wrong: a config
//! naming a layer kind the engine does not run, a missing KDA `A_log`, a routed expert cut short.
//! Each load fails with an error that names the setting or tensor and the file.

use std::path::{Path, PathBuf};

use nightmail_engine::Model;

fn fixture() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/kimi_k3")
}

/// The fixture's safetensors as (header entries, data): name → (dtype, shape, bytes).
fn tensors() -> Vec<(String, serde_json::Value, Vec<u8>)> {
    let bytes = std::fs::read(fixture().join("model.safetensors")).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header: serde_json::Map<String, serde_json::Value> = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    let data = &bytes[8 + n..];
    header
        .into_iter()
        .filter(|(name, _)| name != "__metadata__")
        .map(|(name, e)| {
            let [a, b] = [0, 1].map(|i| e["data_offsets"][i].as_u64().unwrap() as usize);
            (name, e, data[a..b].to_vec())
        })
        .collect()
}

/// Writes `tensors` in this order (data too) with config.json beside them; returns the file.
fn write_model(dir: &Path, tensors: &[(String, serde_json::Value, Vec<u8>)], config: &str) -> PathBuf {
    let mut header = serde_json::Map::new();
    let mut at = 0;
    for (name, e, b) in tensors {
        let entry = serde_json::json!({"dtype": e["dtype"], "shape": e["shape"], "data_offsets": [at, at + b.len()]});
        header.insert(name.clone(), entry);
        at += b.len();
    }
    let header = serde_json::to_vec(&header).unwrap();
    let mut out = (header.len() as u64).to_le_bytes().to_vec();
    out.extend(header);
    tensors.iter().for_each(|(_, _, b)| out.extend(b));
    std::fs::write(dir.join("config.json"), config).unwrap();
    let path = dir.join("model.safetensors");
    std::fs::write(&path, out).unwrap();
    path
}

fn config() -> String {
    std::fs::read_to_string(fixture().join("config.json")).unwrap()
}

fn load_error(dir: &Path) -> String {
    match Model::load(dir) {
        Ok(_) => panic!("a bad K3 checkpoint loaded"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn a_config_naming_an_unknown_layer_kind_is_refused_naming_the_config() {
    let dir = tempfile::tempdir().unwrap();
    let mut c: serde_json::Value = serde_json::from_str(&config()).unwrap();
    let kinds =
        ["linear_attention", "linear_attention", "linear_attention", "full_attention", "mamba2", "full_attention"];
    c["text_config"]["layer_types"] = serde_json::json!(kinds);
    write_model(dir.path(), &tensors(), &c.to_string());
    let err = load_error(dir.path());
    assert!(err.contains("config.json") && err.contains("layer 4") && err.contains("\"mamba2\""), "{err}");
}

#[test]
fn a_missing_a_log_is_named_with_its_prefix_and_the_directory() {
    let dir = tempfile::tempdir().unwrap();
    let gone = "language_model.model.layers.2.self_attn.A_log";
    let kept: Vec<_> = tensors().into_iter().filter(|(n, _, _)| n != gone).collect();
    write_model(dir.path(), &kept, &config());
    let err = load_error(dir.path());
    let want = format!("tensor `{gone}` (GGUF `blk.2.ssm_a`) is missing from {}", dir.path().display());
    assert!(err.starts_with(&want), "{err}");
}

#[test]
fn a_truncated_expert_is_named_with_the_file() {
    // The last layer's last expert's down projection written last, and the file cut inside it.
    let dir = tempfile::tempdir().unwrap();
    let cut = "language_model.model.layers.5.block_sparse_moe.experts.7.w2.weight";
    let (mut all, last): (Vec<_>, Vec<_>) = tensors().into_iter().partition(|(n, _, _)| n != cut);
    all.extend(last);
    let path = write_model(dir.path(), &all, &config());
    let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    f.set_len(f.metadata().unwrap().len() - 16).unwrap();
    let err = load_error(dir.path());
    assert!(err.contains(&format!("tensor `{cut}` ends at byte")), "{err}");
    assert!(err.contains(&path.display().to_string()) && err.contains("truncated"), "{err}");
}
