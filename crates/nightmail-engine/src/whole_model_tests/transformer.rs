use candle_core::quantized::gguf_file::Value;

use nightmail_formats::GgufFile;
use nightmail_formats::gguf_write::{TensorHeader, write_gguf};
use nightmail_tensor::WeightDType;

/// The deepseek_v3 fixture's GGUF rewritten as converters before the MLA-as-MQA change wrote
/// it: one `attn_kv_b` per layer, per-head widths in `key_length`/`value_length`, no `_mla`
/// keys, as many kv heads as heads.
fn older_layout(src: &std::path::Path, dst: &std::path::Path) {
    let g = GgufFile::open(src).unwrap();
    let u = |k: &str| g.uint(&format!("deepseek2.{k}")).unwrap() as u32;
    let (heads, k_len, v_len) =
        (u("attention.head_count"), u("attention.key_length_mla"), u("attention.value_length_mla"));
    let mut metadata: Vec<(String, Value)> = g
        .metadata()
        .iter()
        .filter(|(k, _)| !k.ends_with("_mla") && *k != "general.alignment")
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    for (key, value) in [("key_length", k_len), ("value_length", v_len), ("head_count_kv", heads)] {
        let key = format!("deepseek2.attention.{key}");
        metadata.retain(|(k, _)| *k != key);
        metadata.push((key, Value::U32(value)));
    }
    let mut tensors: Vec<(TensorHeader, Vec<u8>)> = Vec::new();
    for t in g.all_tensors().unwrap() {
        if t.name.contains("attn_v_b") {
            continue;
        }
        if let Some(layer) = t.name.strip_suffix(".attn_k_b.weight") {
            // [heads, kv_lora, nope]ᵀ and [heads, v, kv_lora], stacked per head.
            let k_b = t.to_f32().unwrap().transpose(1, 2).unwrap();
            let v_b = g.tensor(&format!("{layer}.attn_v_b.weight")).unwrap().unwrap().to_f32().unwrap();
            let kv_b = candle_core::Tensor::cat(&[&k_b, &v_b], 1).unwrap();
            let (h, rows, cols) = kv_b.dims3().unwrap();
            let kv_b = kv_b.reshape((h * rows, cols)).unwrap().flatten_all().unwrap().to_vec1::<f32>().unwrap();
            let header = TensorHeader::new(format!("{layer}.attn_kv_b.weight"), WeightDType::F32, &[h * rows, cols]);
            tensors.push((header, kv_b.iter().flat_map(|v| v.to_le_bytes()).collect()));
            continue;
        }
        tensors.push((TensorHeader::new(t.name.clone(), t.dtype, &t.shape), t.bytes.to_vec()));
    }
    let headers: Vec<TensorHeader> = tensors.iter().map(|(h, _)| h.clone()).collect();
    write_gguf(dst, &metadata, &headers, 32, |i, w| w.write_all(&tensors[i].1)).unwrap();
}

#[test]
fn an_older_deepseek2_gguf_with_attn_kv_b_runs_as_the_split_layout_does() {
    let fixture =
        std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/deepseek_v3/model.gguf");
    let dir = tempfile::tempdir().unwrap();
    let older = dir.path().join("older.gguf");
    older_layout(&fixture, &older);
    let (new, old) = (crate::Model::load(&fixture).unwrap(), crate::Model::load(&older).unwrap());
    assert_eq!(new.spec().attention.mla, old.spec().attention.mla);
    let (mut a, mut b) = (new.new_cache(), old.new_cache());
    for tokens in [&[5u32, 17, 99, 3][..], &[42], &[7]] {
        let (x, y) = (new.logits(tokens, &mut a).unwrap(), old.logits(tokens, &mut b).unwrap());
        let worst = x.iter().zip(&y).map(|(p, q)| (p - q).abs()).fold(0f32, f32::max);
        assert!(worst < 1e-5, "logits differ by {worst:e}");
    }
}

/// tests/fixtures/kimi_k3/model.gguf is the fixture as llama.cpp's kimi-k3 converter writes
/// it (kimi_k3.py `write_gguf`): the same model description and, to float rounding (the fused
/// AttnRes scores, the split kv_b's absorbed query), the same logits as the safetensors it
/// came from.
#[test]
fn kimi_k3_in_llama_cpps_gguf_layout_runs_as_its_safetensors() {
    let src = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/kimi_k3");
    let gguf = src.join("model.gguf");
    let (hf, gg) = (crate::Model::load(&src).unwrap(), crate::Model::load(&gguf).unwrap());
    let (x, y) = (hf.spec(), gg.spec());
    assert_eq!((x.architecture, &x.kda, x.attention.mla), (y.architecture, &y.kda, y.attention.mla));
    assert_eq!(
        (x.attn_res_block, x.ffn_activation, &x.moe_layers),
        (y.attn_res_block, y.ffn_activation, &y.moe_layers)
    );
    let (m, n) = (x.moe.as_ref().unwrap(), y.moe.as_ref().unwrap());
    assert_eq!(
        (m.latent, m.activation, m.routing, m.shared_expert_ffn),
        (n.latent, n.activation, n.routing, n.shared_expert_ffn)
    );
    let (mut a, mut b) = (hf.new_cache(), gg.new_cache());
    for tokens in [&[5u32, 17, 99, 3, 200, 41][..], &[42], &[7]] {
        let (x, y) = (hf.logits(tokens, &mut a).unwrap(), gg.logits(tokens, &mut b).unwrap());
        let worst = x.iter().zip(&y).map(|(p, q)| (p - q).abs()).fold(0f32, f32::max);
        assert!(worst < 1e-5, "GGUF and safetensors differ by {worst:e}");
    }
}
