//! `model pack --dense q8_0|q4_0` (the int8 spine): the logits of every GGUF fixture
//! requantized against the unrequantized model's on its reference prompt and greedy
//! continuation (that the experts are copied byte for byte is a unit test of `pack`). Each run
//! prints its figures (`cargo test -p nightmail-engine --test requantize -- --nocapture`).

mod common;

use common::{fed_logit_rows, fixture, reference};
use nightmail_engine::Model;
use nightmail_tools::{DenseQuant, PackOptions};

fn argmax(row: &[f32]) -> usize {
    row.iter().enumerate().max_by(|a, b| a.1.total_cmp(b.1).then(b.0.cmp(&a.0))).unwrap().0
}

struct Error {
    /// Largest |Δlogit| over every step, and that over the largest |logit|.
    max_abs: f32,
    relative: f32,
    /// Steps whose greedy token is the same, of `steps`.
    agree: usize,
    steps: usize,
}

fn error(arch: &str, q: DenseQuant) -> Error {
    let src = fixture(arch).join("model.gguf");
    let dir = tempfile::tempdir().unwrap();
    let packed = dir.path().join("dense.gguf");
    let report =
        nightmail_tools::pack_with(&src, &packed, &PackOptions { dense: Some(q), ..PackOptions::default() }).unwrap();
    assert!(report.requantized > 0 && report.requantized_to_bytes < report.requantized_from_bytes, "{arch}");
    let r = reference(arch);
    // The same inputs for both models: the prompt, then the reference's greedy tokens.
    let want = fed_logit_rows(&Model::load(&src).unwrap(), &r.prompt_tokens, &r.greedy_tokens);
    let got = fed_logit_rows(&Model::load(&packed).unwrap(), &r.prompt_tokens, &r.greedy_tokens);
    let (mut max_abs, mut scale, mut agree) = (0f32, 0f32, 0);
    for (a, b) in want.iter().zip(&got) {
        max_abs = a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(max_abs, f32::max);
        scale = a.iter().map(|x| x.abs()).fold(scale, f32::max);
        agree += usize::from(argmax(a) == argmax(b));
    }
    let e = Error { max_abs, relative: max_abs / scale, agree, steps: want.len() };
    println!(
        "{arch:<12} {:<5} {:>3} tensors {:>8} -> {:>8} bytes  max |dlogit| {:.2e} ({:.2e} of the largest)  same \
         greedy token at {}/{} steps",
        q.name(),
        report.requantized,
        report.requantized_from_bytes,
        report.requantized_to_bytes,
        e.max_abs,
        e.relative,
        e.agree,
        e.steps
    );
    e
}

/// On these tiny random models (hidden 32, logits of a few units, near ties between tokens)
/// both the weights' and the activations' 8-bit rounding show; q8_0 must keep the greedy tokens
/// of all but two steps and stay well under q4_0's error.
fn check(arch: &str) {
    let (q8, q4) = (error(arch, DenseQuant::Q8_0), error(arch, DenseQuant::Q4_0));
    assert!(q8.agree + 2 >= q8.steps, "{arch}: q8_0 kept {} of {} greedy tokens", q8.agree, q8.steps);
    assert!(q8.relative < 0.25, "{arch}: q8_0 logits off by {:.2e} of the largest", q8.relative);
    assert!(q8.max_abs < q4.max_abs, "{arch}: q8_0 {:.2e} is not closer than q4_0 {:.2e}", q8.max_abs, q4.max_abs);
    assert!(q4.relative < 1.5, "{arch}: q4_0 logits off by {:.2e} of the largest", q4.relative);
}

macro_rules! requantize_tests {
    ($($arch:ident),*) => {$(
        #[test]
        fn $arch() {
            check(stringify!($arch));
        }
    )*};
}

// minimax_m2 quantized takes ggml's numerics: partial rotary and q/k norms across heads in its row loops.
requantize_tests!(llama, mixtral, qwen2_moe, qwen3_moe, deepseek_v3, gpt_oss, kimi_linear, minimax_m2);

#[test]
fn an_unknown_dense_type_is_refused_naming_the_choices() {
    let err = "q5_k".parse::<DenseQuant>().unwrap_err();
    assert!(err.contains("q5_k") && err.contains("q8_0 or q4_0"), "{err}");
}
