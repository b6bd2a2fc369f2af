//! The engine against transformers on tiny random models of each architecture
//! (tests/fixtures/generate.py): every step's logits within 1e-4 and the same 16 greedy tokens,
//! from the Hugging Face safetensors and from the same weights as GGUF F32.

use std::ops::ControlFlow;
use std::path::PathBuf;

use nightmail_engine::{GenerateRequest, Model, Prompt};

const TOLERANCE: f32 = 1e-4;

#[derive(serde::Deserialize)]
struct Reference {
    prompt_tokens: Vec<u32>,
    greedy_tokens: Vec<u32>,
    logits: Vec<Vec<f32>>,
}

fn fixture(arch: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures").join(arch)
}

/// Greedy-generate from `model_path` and compare with the fixture's reference; returns the
/// largest logit difference seen.
fn check(arch: &str, model_path: PathBuf) -> f32 {
    let dir = fixture(arch);
    let reference: Reference =
        serde_json::from_str(&std::fs::read_to_string(dir.join("reference.json")).unwrap()).unwrap();
    let model = Model::load(&model_path).unwrap_or_else(|e| panic!("loading {}: {e}", model_path.display()));
    let mut request = GenerateRequest::new(Prompt::Tokens(reference.prompt_tokens.clone()));
    request.max_new_tokens = reference.greedy_tokens.len();
    request.record_logits = true;
    request.stop_at_eos = false;
    let mut rows = Vec::new();
    let completion = model
        .generate(request, |event| {
            rows.push(event.logits.clone().expect("logits were requested"));
            ControlFlow::Continue(())
        })
        .unwrap();
    assert_eq!(completion.tokens, reference.greedy_tokens, "{arch} greedy tokens from {}", model_path.display());
    assert_eq!(rows.len(), reference.logits.len());
    let mut worst = 0f32;
    for (step, (ours, theirs)) in rows.iter().zip(&reference.logits).enumerate() {
        assert_eq!(ours.len(), theirs.len(), "{arch} step {step}: vocabulary size");
        let err = ours.iter().zip(theirs).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
        assert!(err < TOLERANCE, "{arch} step {step} from {}: max |Δlogit| = {err:e}", model_path.display());
        worst = worst.max(err);
    }
    eprintln!("{arch} {}: max |Δlogit| over {} steps = {worst:.3e}", model_path.display(), rows.len());
    worst
}

macro_rules! reference_tests {
    ($($arch:ident),*) => {$(
        mod $arch {
            #[test]
            fn safetensors_logits_and_greedy_tokens_match_transformers() {
                super::check(stringify!($arch), super::fixture(stringify!($arch)));
            }

            #[test]
            fn gguf_logits_and_greedy_tokens_match_transformers() {
                super::check(stringify!($arch), super::fixture(stringify!($arch)).join("model.gguf"));
            }
        }
    )*};
}

reference_tests!(llama, mixtral, qwen2_moe, qwen3_moe, deepseek_v3);
