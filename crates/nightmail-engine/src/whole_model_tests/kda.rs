//! Whole KDA models: missing and fused tensors.

#[test]
fn a_missing_a_log_is_named_with_the_directory() {
    // The fixture with layer 1's A_log renamed in the safetensors header (same length, so
    // the offsets hold).
    let src = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/kimi_linear");
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(src.join("config.json"), dir.path().join("config.json")).unwrap();
    let mut bytes = std::fs::read(src.join("model.safetensors")).unwrap();
    let (from, to) = (b"model.layers.1.self_attn.A_log", b"model.layers.1.self_attn.X_log");
    let at = bytes.windows(from.len()).position(|w| w == from).expect("the fixture has it");
    bytes[at..at + to.len()].copy_from_slice(to);
    std::fs::write(dir.path().join("model.safetensors"), bytes).unwrap();
    let err = crate::Model::load(dir.path()).err().expect("A_log is missing").to_string();
    let want = format!(
        "tensor `model.layers.1.self_attn.A_log` (GGUF `blk.1.ssm_a`) is missing from {}",
        dir.path().display()
    );
    assert!(err.starts_with(&want), "{err}");
}

#[test]
fn a_checkpoint_with_fused_qkv_projection_and_convolution_runs_as_the_split_one() {
    // The K3 fixture rewritten with each KDA layer's q/k/v projections and convolutions
    // fused as `qkv_proj` `[3·width, hidden]` and `qkv_conv1d` `[3·width, 1, kernel]`.
    let src = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/kimi_k3");
    let hf = nightmail_formats::HfDir::open(&src).unwrap();
    let mut tensors: Vec<(String, Vec<usize>, Vec<u8>)> = Vec::new();
    let mut fused = 0;
    for v in hf.all_tensors().unwrap() {
        let Some((layer, _)) = v.name.split_once(".self_attn.q_") else {
            if [".self_attn.k_proj.", ".self_attn.v_proj.", ".self_attn.k_conv1d.", ".self_attn.v_conv1d."]
                .iter()
                .all(|p| !v.name.contains(p))
            {
                tensors.push((v.name.clone(), v.shape.clone(), v.bytes.to_vec()));
            }
            continue;
        };
        let kind = if v.name.ends_with("q_proj.weight") {
            "proj"
        } else if v.name.ends_with("q_conv1d.weight") {
            "conv1d"
        } else {
            tensors.push((v.name.clone(), v.shape.clone(), v.bytes.to_vec()));
            continue;
        };
        let mut bytes = Vec::new();
        for part in ["q", "k", "v"] {
            bytes.extend(hf.float_tensor(&format!("{layer}.self_attn.{part}_{kind}.weight")).unwrap().unwrap().bytes);
        }
        let mut shape = v.shape.clone();
        shape[0] *= 3;
        tensors.push((format!("{layer}.self_attn.qkv_{kind}.weight"), shape, bytes));
        fused += 1;
    }
    assert_eq!(fused, 8, "four KDA layers, a projection and a convolution each");
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(src.join("config.json"), dir.path().join("config.json")).unwrap();
    nightmail_formats::hf::write_f32_safetensors(&dir.path().join("model.safetensors"), &tensors).unwrap();
    let (split, fused) = (crate::Model::load(&src).unwrap(), crate::Model::load(dir.path()).unwrap());
    let (mut a, mut b) = (split.new_cache(), fused.new_cache());
    for tokens in [&[5u32, 17, 99, 3, 200, 41][..], &[42], &[7]] {
        let (x, y) = (split.logits(tokens, &mut a).unwrap(), fused.logits(tokens, &mut b).unwrap());
        let worst = x.iter().zip(&y).map(|(p, q)| (p - q).abs()).fold(0f32, f32::max);
        // One matmul of three times the rows rounds differently from three, and this fixture
        // amplifies f32 rounding (its chunked and recurrent prefills differ by 5e-5 in the
        // logits): the bound is the reference's.
        assert!(worst < 1e-4, "fused and split KDA differ by {worst:e}");
    }
}
