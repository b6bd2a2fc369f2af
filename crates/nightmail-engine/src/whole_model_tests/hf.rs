//! A Hugging Face directory in Qwen3.5's multimodal layout.

use std::path::PathBuf;

use nightmail_formats::HfDir;
use nightmail_formats::hf::write_f32_safetensors;

use crate::{Architecture, Model};

#[test]
fn qwen3_5s_multimodal_layout_runs_as_its_text_model_alone() {
    // The qwen3_5_moe fixture (`Qwen3_5MoeForCausalLM`) rewritten as
    // `Qwen3_5MoeForConditionalGeneration` saves it: text weights under
    // `model.language_model.`, a vision tower beside them, the text config in `text_config`.
    let src = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/qwen3_5_moe");
    let hf = HfDir::open(&src).unwrap();
    let mut tensors: Vec<(String, Vec<usize>, Vec<u8>)> = hf
        .all_tensors()
        .unwrap()
        .iter()
        .map(|v| {
            (
                v.name.strip_prefix("model.").map_or(v.name.clone(), |rest| format!("model.language_model.{rest}")),
                v.shape.clone(),
                v.bytes.to_vec(),
            )
        })
        .collect();
    tensors.push(("model.visual.patch_embed.proj.weight".into(), vec![2], vec![0; 8]));
    let dir = tempfile::tempdir().unwrap();
    write_f32_safetensors(&dir.path().join("model.safetensors"), &tensors).unwrap();
    let config = serde_json::json!({
        "architectures": ["Qwen3_5MoeForConditionalGeneration"],
        "model_type": "qwen3_5_moe",
        "text_config": hf.config(),
        "vision_config": {"depth": 1},
    });
    std::fs::write(dir.path().join("config.json"), config.to_string()).unwrap();
    let (text, multimodal) = (Model::load(&src).unwrap(), Model::load(dir.path()).unwrap());
    assert_eq!(multimodal.spec().architecture, Architecture::Qwen35Moe);
    let (mut a, mut b) = (text.new_cache(), multimodal.new_cache());
    for tokens in [&[5u32, 17, 99, 3][..], &[42]] {
        let (x, y) = (text.logits(tokens, &mut a).unwrap(), multimodal.logits(tokens, &mut b).unwrap());
        assert!(x.iter().zip(&y).all(|(p, q)| p.to_bits() == q.to_bits()), "the same weights give other logits");
    }
}
