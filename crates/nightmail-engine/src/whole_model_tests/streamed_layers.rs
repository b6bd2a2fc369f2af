//! Streamed dense layers checked from their headers at load.

use nightmail_formats::ModelFile;
use nightmail_model::ModelSpec;
use nightmail_tensor::TensorView;

/// The llama fixture (no experts) rewritten with `change` applied to blk.1.attn_v.weight
/// (`None`: left out) and cut `cut` bytes short, loaded with every layer streamed: the
/// load's error.
fn streamed_load_error(
    dir: &std::path::Path,
    change: impl Fn(TensorView<'_>) -> Option<(Vec<usize>, Vec<u8>)>,
    cut: u64,
) -> String {
    use nightmail_formats::GgufFile;
    use nightmail_formats::gguf_write::{TensorHeader, write_gguf};
    let src = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/llama/model.gguf");
    let g = GgufFile::open(&src).unwrap();
    let metadata: Vec<_> =
        g.metadata().iter().filter(|(k, _)| *k != "general.alignment").map(|(k, v)| (k.clone(), v.clone())).collect();
    let mut in_order = g.all_tensors().unwrap();
    in_order.sort_by_key(|t| g.locate(t.bytes).unwrap().1);
    let mut tensors = Vec::new();
    for t in in_order {
        let (dtype, name) = (t.dtype, t.name.clone());
        let (shape, bytes) = match name.as_str() {
            "blk.1.attn_v.weight" => match change(t) {
                Some(changed) => changed,
                None => continue,
            },
            _ => (t.shape.clone(), t.bytes.to_vec()),
        };
        tensors.push((TensorHeader::new(name, dtype, &shape), bytes));
    }
    let path = dir.join("broken.gguf");
    let headers: Vec<TensorHeader> = tensors.iter().map(|(h, _)| h.clone()).collect();
    write_gguf(&path, &metadata, &headers, 32, |i, w| w.write_all(&tensors[i].1)).unwrap();
    let file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    file.set_len(file.metadata().unwrap().len() - cut).unwrap();
    let layers = ModelSpec::read(&ModelFile::open(&src).unwrap()).unwrap().layers;
    let ask = |bytes| crate::MemoryBudget {
        bytes,
        kv_tokens: 64,
        batch: 1,
        verify_rows: 1,
        stream_layers: Some((0..layers).collect()),
    };
    let least = crate::memory_plan(&src, ask(usize::MAX / 2)).unwrap().minimum_bytes;
    let options = crate::LoadOptions { stream: None, memory: Some(ask(least)) };
    let intact = crate::Model::load_with(&src, &options).unwrap();
    assert_eq!(intact.dense_stream().map(|d| d.layers().len()), Some(layers), "every layer streams");
    match crate::Model::load_with(&path, &options) {
        Ok(_) => panic!("a broken streamed layer loaded"),
        Err(e) => e.to_string(),
    }
}

/// Checking a streamed layer from its headers still refuses what a resident build refuses:
/// a missing tensor and a cut file name the tensor and the file, a wrong shape the tensor.
#[test]
fn a_missing_misshapen_or_cut_streamed_tensor_fails_the_load_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let err = streamed_load_error(dir.path(), |_| None, 0);
    assert!(err.contains("blk.1.attn_v.weight") && err.contains("broken.gguf"), "{err}");
    let half = |t: TensorView<'_>| Some((vec![t.shape[0] / 2, t.shape[1]], t.bytes[..t.bytes.len() / 2].to_vec()));
    let err = streamed_load_error(dir.path(), half, 0);
    assert!(err.contains("blk.1.attn_v.weight") && err.contains("shape"), "{err}");
    // The file ends with blk.1.ffn_down.weight: cut inside it.
    let err = streamed_load_error(dir.path(), |t| Some((t.shape.clone(), t.bytes.to_vec())), 1024);
    assert!(err.contains("blk.1.ffn_down.weight") && err.contains("broken.gguf"), "{err}");
}
