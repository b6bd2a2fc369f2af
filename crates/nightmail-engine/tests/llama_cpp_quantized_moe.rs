//! A mixture-of-experts model's routed experts requantized by llama.cpp's own quantizer into
//! each low-bit type a giant model is streamed in, the rest Q8_0 (tests/fixtures/
//! llama_cpp_quantize.py `--pure --spine Q8_0`, an importance matrix of ones where the type
//! needs one): nightmail's logits against llama.cpp's on the same file, within a bound stated
//! per type. A random-weight model has no close calls to hide behind: every logit is compared.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use nightmail_engine::Model;
use nightmail_tools::{SynthArch, SynthDtype, SynthSpec, synth};

fn script(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures").join(name)
}

/// Two layers of eight experts of 256 × 256 (every super-block type's rows), Q8_0 experts for
/// the quantizer to requantize.
fn float_model(dir: &Path) -> PathBuf {
    let path = dir.join("moe.gguf");
    let (heads, kv_heads, head_dim) = SynthSpec::default_heads(256);
    let spec = SynthSpec {
        arch: SynthArch::Qwen3Moe,
        layers: 2,
        experts: 8,
        top_k: 2,
        hidden: 256,
        expert_ffn: 256,
        dtype: SynthDtype::Q8_0,
        heads,
        kv_heads,
        head_dim,
        vocab: 512,
        tokenizer_from: None,
        context_length: 256,
        seed: 11,
        dense: None,
    };
    synth(&spec, &path).unwrap();
    path
}

fn quantize(src: &Path, ftype: &str) -> PathBuf {
    let dst = src.with_file_name(format!("moe.{ftype}.gguf"));
    let out = Command::new("python3")
        .arg(script("llama_cpp_quantize.py"))
        .arg(src)
        .arg(&dst)
        .args([ftype, "--pure", "--spine", "Q8_0", "--imatrix"])
        .output()
        .expect("python3 is needed to run llama-cpp-python");
    assert!(
        out.status.success(),
        "llama.cpp's quantizer failed on {ftype} (llama-cpp-python and gguf are needed: see scripts/test.sh): {}",
        String::from_utf8_lossy(&out.stderr)
    );
    dst
}

/// A prompt of 12 tokens: llama.cpp computes it as one batch (its tiled mat-mul from 8 tokens on
/// x86), and so does nightmail (one pass).
const PROMPT: [u32; 12] = [1, 17, 200, 5, 99, 42, 250, 3, 77, 310, 8, 451];

fn max_diff(model: &Path) -> f32 {
    let request = serde_json::json!({ "model": model, "tokens": PROMPT });
    let v = common::python_json(&script("llama_cpp_logits.py"), &request, &format!("llama.cpp on {}", model.display()));
    let want: Vec<Vec<f32>> = serde_json::from_value(v["logits"].clone()).unwrap();
    let m = Model::load(model).unwrap();
    let mut cache = m.new_cache();
    let got = m.logits(&PROMPT, &mut cache).unwrap();
    let last = want.last().unwrap();
    assert_eq!(got.len(), last.len());
    got.iter().zip(last).map(|(a, b)| (a - b).abs()).fold(0.0, f32::max)
}

fn check(ftype: &str, bound: f32) {
    let dir = tempfile::tempdir().unwrap();
    let path = quantize(&float_model(dir.path()), ftype);
    let diff = max_diff(&path);
    println!("{ftype} experts: max |dlogit| against llama.cpp {diff:.2e} (bound {bound:.0e})");
    assert!(diff <= bound, "{ftype}: max |dlogit| {diff} against llama.cpp, bound {bound}");
}

macro_rules! moe_tests {
    ($($name:ident: $ftype:literal, $bound:expr;)*) => {$(
        #[test]
        fn $name() {
            check($ftype, $bound);
        }
    )*};
}

moe_tests! {
    q2_k_experts_give_llama_cpps_logits: "Q2_K", 1e-5;
    q3_k_experts_give_llama_cpps_logits: "Q3_K_S", 1e-5;
    q4_k_experts_give_llama_cpps_logits: "Q4_K_S", 1e-5;
    q5_k_experts_give_llama_cpps_logits: "Q5_K_S", 1e-5;
    q6_k_experts_give_llama_cpps_logits: "Q6_K", 1e-5;
    iq2_xxs_experts_give_llama_cpps_logits: "IQ2_XXS", 1e-5;
    iq2_xs_experts_give_llama_cpps_logits: "IQ2_XS", 1e-5;
    iq3_xxs_experts_give_llama_cpps_logits: "IQ3_XXS", 1e-5;
    iq4_xs_experts_give_llama_cpps_logits: "IQ4_XS", 1e-5;
    iq4_nl_experts_give_llama_cpps_logits: "IQ4_NL", 1e-5;
}
