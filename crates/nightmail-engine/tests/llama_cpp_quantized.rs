//! SmolLM2 requantized by llama.cpp's own quantizer (`llama_model_quantize`, as a user makes a
//! low-bit file): nightmail's greedy tokens equal llama.cpp's on the same file. SmolLM2's
//! 576-wide rows are no multiple of 256, so llama.cpp's `tensor_type_fallback` gives those
//! matrices a 32-block type (Q4_0 for the K types, IQ4_NL for the i-quants) and only the
//! 1536-wide `ffn_down` takes the 256-block type named.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use nightmail_engine::{ChatMessage, Model, Prompt};

fn script(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures").join(name)
}

/// SmolLM2 quantized to `ftype` (llama.cpp's `LLAMA_FTYPE_MOSTLY_` suffix) with the quantizer's
/// `flags` (tests/fixtures/llama_cpp_quantize.py: `--pure`, `--imatrix`).
fn quantize(dir: &Path, ftype: &str, flags: &[&str]) -> PathBuf {
    let dst = dir.join(format!("smollm2.{ftype}.gguf"));
    let mut cmd = Command::new("python3");
    cmd.arg(script("llama_cpp_quantize.py")).arg(common::smollm2()).arg(&dst).arg(ftype).args(flags);
    let out = cmd.output().expect("python3 is needed to run llama-cpp-python");
    assert!(
        out.status.success(),
        "llama.cpp's quantizer failed on {ftype} (llama-cpp-python and gguf are needed: see scripts/test.sh): {}",
        String::from_utf8_lossy(&out.stderr)
    );
    dst
}

/// llama.cpp's greedy tokens after `prompt` (tests/fixtures/llama_cpp_greedy.py).
fn llama_cpp_greedy(model: &Path, prompt: &[u32], n: usize) -> Vec<u32> {
    let request = serde_json::json!({ "model": model, "tokens": prompt, "new_tokens": n });
    let v = common::python_json(&script("llama_cpp_greedy.py"), &request, &format!("llama.cpp on {}", model.display()));
    serde_json::from_value(v["tokens"].clone()).unwrap()
}

fn greedy(model: &Model, prompt: &[u32], n: usize) -> Vec<u32> {
    let mut cache = model.new_cache();
    let mut row = model.logits(prompt, &mut cache).unwrap();
    let mut picked = Vec::new();
    for _ in 0..n {
        // llama.cpp's argmax (numpy's): the first of equal maxima.
        let t = row.iter().enumerate().fold(0, |best, (i, x)| if *x > row[best] { i } else { best }) as u32;
        picked.push(t);
        row = model.logits(&[t], &mut cache).unwrap();
    }
    picked
}

const NEW_TOKENS: usize = 16;

/// Questions as a user asks them (the chat template's prompt): on the Q4_0 a requantized file
/// mostly holds, "haiku" departed at the second token while llama.cpp's repacked order was not followed.
const QUESTIONS: [&str; 3] =
    ["Name three primary colors.", "Write a haiku about the sea.", "Explain photosynthesis in one sentence."];

fn same_greedy_tokens_as_llama_cpp(ftype: &str, flags: &[&str]) {
    let dir = tempfile::tempdir().unwrap();
    let path = quantize(dir.path(), ftype, flags);
    let model = Model::load(&path).unwrap();
    for q in QUESTIONS {
        let prompt = model.prompt_tokens(&Prompt::Chat(vec![ChatMessage::new("user", q)].into())).unwrap();
        let want = llama_cpp_greedy(&path, &prompt, NEW_TOKENS);
        let got = greedy(&model, &prompt, NEW_TOKENS);
        assert_eq!(got, want, "{ftype} {flags:?}, {q:?}: nightmail's greedy tokens, then llama.cpp's");
    }
}

macro_rules! greedy_tests {
    ($($name:ident: $ftype:literal $(, $flag:literal)*;)*) => {$(
        #[test]
        fn $name() {
            same_greedy_tokens_as_llama_cpp($ftype, &[$($flag),*]);
        }
    )*};
}

// llama.cpp's Q2_K mix, as a user quantizes (its `ffn_down`s are Q3_K, the rest Q4_0 by
// `tensor_type_fallback`: the file whose tokens departed at the second step); then files whose
// `ffn_down`s are the type named and whose other matrices are Q8_0 (`--pure --others`; the
// IQ2/IQ3 types need an importance matrix, `--imatrix`). These low-bit files leave close greedy
// choices, which departed while a prompt (8 tokens or more) was computed in the vec_dot order:
// llama.cpp computes it in its tiled mat-mul (ggml-cpu/tiled, `ggml_tiled_min_batch`), which
// `q8_k.rs` and `q2_k.rs` now follow.
greedy_tests! {
    q2_k_mix_smollm2_greedy_tokens_equal_llama_cpps: "Q2_K";
    iq4_nl_smollm2_greedy_tokens_equal_llama_cpps: "IQ4_NL", "--pure", "--others", "Q8_0";
    iq4_xs_smollm2_greedy_tokens_equal_llama_cpps: "IQ4_XS", "--pure", "--others", "Q8_0";
    iq3_xxs_smollm2_greedy_tokens_equal_llama_cpps: "IQ3_XXS", "--pure", "--others", "Q8_0", "--imatrix";
    iq2_xxs_smollm2_greedy_tokens_equal_llama_cpps: "IQ2_XXS", "--pure", "--others", "Q8_0", "--imatrix";
    iq2_xs_smollm2_greedy_tokens_equal_llama_cpps: "IQ2_XS", "--pure", "--others", "Q8_0", "--imatrix";
    q2_k_smollm2_greedy_tokens_equal_llama_cpps: "Q2_K", "--pure", "--others", "Q8_0";
}

// Files whose `ffn_down`s are Q3_K, Q4_K, Q5_K or Q6_K and whose other matrices are Q8_0:
// `k_quant.rs` in llama.cpp's orders.
greedy_tests! {
    q3_k_smollm2_greedy_tokens_equal_llama_cpps: "Q3_K_S", "--pure", "--others", "Q8_0";
    q4_k_smollm2_greedy_tokens_equal_llama_cpps: "Q4_K_S", "--pure", "--others", "Q8_0";
    q5_k_smollm2_greedy_tokens_equal_llama_cpps: "Q5_K_S", "--pure", "--others", "Q8_0";
    q6_k_smollm2_greedy_tokens_equal_llama_cpps: "Q6_K", "--pure", "--others", "Q8_0";
}

/// llama.cpp's logits after `tokens` (tests/fixtures/llama_cpp_logits.py, one batch): the last row.
fn llama_cpp_last_logits(model: &Path, tokens: &[u32]) -> Vec<f32> {
    let request = serde_json::json!({ "model": model, "tokens": tokens });
    let v = common::python_json(&script("llama_cpp_logits.py"), &request, &format!("llama.cpp on {}", model.display()));
    let rows: Vec<Vec<f32>> = serde_json::from_value(v["logits"].clone()).unwrap();
    rows.last().unwrap().clone()
}

/// The largest |Δlogit| between nightmail and llama.cpp on a question's prompt, computed as one
/// batch of 5 tokens (llama.cpp's vec_dot order) and of the whole prompt (its tiled mat-mul).
fn logit_gaps(ftype: &str) -> [f32; 2] {
    let dir = tempfile::tempdir().unwrap();
    let path = quantize(dir.path(), ftype, &["--pure", "--others", "Q8_0"]);
    let model = Model::load(&path).unwrap();
    let prompt = model.prompt_tokens(&Prompt::Chat(vec![ChatMessage::new("user", QUESTIONS[1])].into())).unwrap();
    assert!(prompt.len() >= 8, "{} tokens", prompt.len());
    [&prompt[..5], &prompt[..]].map(|tokens| {
        let want = llama_cpp_last_logits(&path, tokens);
        let got = model.logits(tokens, &mut model.new_cache()).unwrap();
        let gap = got.iter().zip(&want).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
        println!("{ftype}: {} tokens, max |dlogit| vs llama.cpp {gap:.3e}", tokens.len());
        gap
    })
}

/// Every other part of these files already computes as llama.cpp does, so the K-quant kernels'
/// orders (`k_quant.rs`: the vec_dot, the tiled mat-mul, Q4_K's repacked gemv and gemm) leave
/// no gap at all; candle's kernels left up to 1.5.
#[test]
fn k_quant_smollm2_logits_are_llama_cpps_exactly() {
    let gaps = ["Q3_K_S", "Q4_K_S", "Q5_K_S", "Q6_K"].map(|ftype| (ftype, logit_gaps(ftype)));
    for (ftype, gaps) in gaps {
        assert_eq!(gaps, [0.0; 2], "{ftype}: the largest |dlogit| after 5 tokens and after the whole prompt");
    }
}
