//! Issue 17's Apple Silicon path: where our Q4_0, Q4_1, Q8_0 and F16 kernels have no SIMD for
//! the CPU, candle-core's mat-vecs compute the matrix. `NIGHTMAIL_MATVEC=candle` forces that
//! path on x86_64, and here every fixture runs through it: the transformers reference fixtures
//! (F32: within 1e-3 of transformers), the same with their non-expert weights requantized by
//! `pack --dense`, and synthetic models with F16 dense weights and Q4_0 or Q8_0 experts. For
//! those the reference is the same weights dequantized and multiplied in f32
//! (`NIGHTMAIL_MATVEC=f32`): both candle's kernels and ours round the activations to 8 bits
//! (each its own way), so candle's path is held to within 1e-3 plus twice our own kernels' error.

mod common;

use std::path::Path;
use std::sync::Mutex;

use candle_core::quantized::GgmlDType;
use common::{fed_logit_rows, fixture, reference};
use nightmail_engine::Model;
use nightmail_tensor::WeightDType;
use nightmail_tensor::{MATVEC_ENV, MatVecPath, matvec_path};
use nightmail_tools::{DenseQuant, PackOptions, SynthArch, SynthDtype, SynthSpec};

const TOLERANCE: f32 = 1e-3;

/// The switch is read from the environment when a model loads: every test here holds this
/// while it changes the environment and loads, so no other thread reads it meanwhile.
static ENV: Mutex<()> = Mutex::new(());

/// `path` loaded with the mat-vecs `NIGHTMAIL_MATVEC` names (`None`: this CPU's choice).
fn load(path: &Path, switch: Option<&str>) -> Model {
    let _env = ENV.lock().unwrap_or_else(|e| e.into_inner());
    // SAFETY: the lock above is held by every test of this binary around each change and each
    // load, the only places the environment is read here.
    unsafe {
        match switch {
            Some(v) => std::env::set_var(MATVEC_ENV, v),
            None => std::env::remove_var(MATVEC_ENV),
        }
    }
    let want = match switch {
        Some("candle") => Some(MatVecPath::Candle),
        Some("f32") => Some(MatVecPath::F32),
        _ => None,
    };
    for t in [GgmlDType::Q4_0, GgmlDType::Q4_1, GgmlDType::Q8_0, GgmlDType::F16, GgmlDType::BF16] {
        let path = matvec_path(WeightDType::Ggml(t));
        assert!(want.is_none_or(|w| w == path), "{t:?} takes {path:?} under {switch:?}");
    }
    let model = Model::load(path).unwrap_or_else(|e| panic!("loading {}: {e}", path.display()));
    unsafe { std::env::remove_var(MATVEC_ENV) };
    model
}

fn max_error(want: &[Vec<f32>], got: &[Vec<f32>]) -> f32 {
    assert_eq!(want.len(), got.len());
    let mut worst = 0f32;
    for (a, b) in want.iter().zip(got) {
        assert_eq!(a.len(), b.len());
        worst = a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(worst, f32::max);
    }
    worst
}

/// candle's path against the f32 reference, held to 1e-3 plus twice our kernels' error.
fn check_quantized(what: &str, path: &Path, prompt: &[u32], then: &[u32]) {
    let reference = fed_logit_rows(&load(path, Some("f32")), prompt, then);
    let ours = max_error(&reference, &fed_logit_rows(&load(path, None), prompt, then));
    let candle = max_error(&reference, &fed_logit_rows(&load(path, Some("candle")), prompt, then));
    println!("{what:<28} max |dlogit| against f32: candle {candle:.2e}, ours {ours:.2e}");
    assert!(candle <= TOLERANCE + 2.0 * ours, "{what}: candle's path is off by {candle:e} (ours {ours:e})");
}

fn check_fixture(arch: &str) {
    let r = reference(arch);
    // The reference's logits: the prompt's, then after each greedy token but the last.
    let then = &r.greedy_tokens[..r.logits.len() - 1];
    let gguf = fixture(arch).join("model.gguf");
    let worst = max_error(&r.logits, &fed_logit_rows(&load(&gguf, Some("candle")), &r.prompt_tokens, then));
    println!("{arch:<28} max |dlogit| against transformers through candle's path: {worst:.2e}");
    assert!(worst < TOLERANCE, "{arch}: {worst:e}");
    let dir = tempfile::tempdir().unwrap();
    for q in [DenseQuant::Q8_0, DenseQuant::Q4_0] {
        let packed = dir.path().join(format!("{}.gguf", q.name()));
        nightmail_tools::pack_with(&gguf, &packed, &PackOptions { dense: Some(q), ..PackOptions::default() }).unwrap();
        check_quantized(&format!("{arch} --dense {}", q.name()), &packed, &r.prompt_tokens, then);
    }
}

macro_rules! fallback_tests {
    ($($arch:ident),*) => {$(
        #[test]
        fn $arch() {
            check_fixture(stringify!($arch));
        }
    )*};
}

fallback_tests!(llama, mixtral, qwen2_moe, qwen3_moe, deepseek_v3, gpt_oss, kimi_linear);

/// BF16 weights (qwen3_moe as llama.cpp's converter writes it with `--outtype bf16`) computed
/// from their two bytes by our kernel give the logits of the same weights widened to f32 at load
/// (candle's path widens them so too).
#[test]
fn bf16_weights_computed_in_two_bytes_give_the_widened_weights_logits() {
    let path = fixture("qwen3_moe").join("llama_cpp_bf16.gguf");
    let r = reference("qwen3_moe");
    let then = &r.greedy_tokens[..r.logits.len() - 1];
    let widened = fed_logit_rows(&load(&path, Some("f32")), &r.prompt_tokens, then);
    let ours = max_error(&widened, &fed_logit_rows(&load(&path, None), &r.prompt_tokens, then));
    let candle = max_error(&widened, &fed_logit_rows(&load(&path, Some("candle")), &r.prompt_tokens, then));
    println!("qwen3_moe BF16 max |dlogit| against its weights widened to f32: ours {ours:.2e}, candle {candle:.2e}");
    assert!(ours < 1e-4 && candle < 1e-4, "ours {ours:e}, candle {candle:e}");
    // And the model is still the model: BF16's rounding of the weights moves transformers' logits
    // little.
    let rounding = max_error(&r.logits, &widened);
    assert!(rounding < 0.1, "BF16 rounding moved the logits by {rounding:e}");
}

#[test]
fn synthetic_f16_models_with_q4_0_and_q8_0_experts() {
    let dir = tempfile::tempdir().unwrap();
    for (arch, dtype) in [(SynthArch::Qwen3Moe, SynthDtype::Q4_0), (SynthArch::DeepseekV3, SynthDtype::Q8_0)] {
        let path = dir.path().join(format!("{arch:?}.gguf"));
        let spec = SynthSpec {
            arch,
            layers: 2,
            experts: 8,
            top_k: 2,
            hidden: 128,
            expert_ffn: 64,
            dtype,
            heads: 4,
            kv_heads: 2,
            head_dim: 32,
            vocab: 256,
            tokenizer_from: None,
            context_length: 128,
            seed: 11,
            dense: None,
        };
        nightmail_tools::synth(&spec, &path).unwrap();
        let prompt: Vec<u32> = (1..24).collect();
        check_quantized(&format!("{arch:?} F16 + {dtype:?} experts"), &path, &prompt, &[5, 9, 200, 31]);
    }
}
